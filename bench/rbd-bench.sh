#!/usr/bin/env bash
# The rbd driver against fio's own rbd engine, on the test cluster of scripts/ceph-cluster.sh
# (one monitor, one memstore OSD, loopback). 4 KiB random reads and writes at QD1 and QD32, one
# job, each side running the same time on the same image, interleaved (snapblk, C ABI, fio, ...)
# for ROUNDS rounds; prints every run, the medians and each side's ratio to the fio run with the
# same librbd cache setting.
#
#   snapblk   `snapblk bench rbd:...` (the Rust API, the driver's queue directly; cache=false,
#             the driver's default: a write completes when the OSD has it)
#   capi      `snapblk bench --libblkio libblkio.so.1 --driver rbd` (through the C ABI; cache=false)
#   fio-nc    `fio --ioengine=rbd` with `rbd cache = false` in its ceph.conf: the same librbd
#             settings as snapblk and capi, their reference
#   fio-nc2   the same fio run as fio-nc once more: its ratio to fio-nc is how far two runs of
#             one command differ here, the noise floor of every other ratio
#   snap-c    `snapblk bench rbd:...,cache=true` (librbd's cache on, as fio runs by default)
#   fio       `fio --ioengine=rbd` as it runs by default: librbd's defaults, `rbd_cache=true` with
#             the write-around policy, which completes a write before the OSD has it (up to
#             `rbd_cache_max_dirty` in flight); snap-c's reference
#   fio2      the same fio run as fio once more: the noise floor of the cached cells (not run
#             unless named in SIDES)
#
# Every run starts with a RAMP-second ramp (-R, default 1 s; fio's and `snapblk bench`'s
# ramp_time) that is not measured: the first write of an open image waits for librbd's exclusive
# lock, which fio, flushing at open, takes before its clock starts. The sides' order rotates from
# round to round and runs backwards in every other round, so each side runs right after each of
# its two neighbours in turn (a rotation alone has it always follow the same one; the neighbours
# themselves stay the same, and a side may run twice in a row where two rounds meet). The
# ratios are paired: each round's run against the same round's reference run, the median and
# range of those (with an even number of rounds, "median" is the lower middle value: use an
# odd -r).
#
# SIDES="..." runs some of the sides (each with its reference), CELLS="randwrite:32 ..." some of
# the four workload:depth cells (default all).
#
# Usage: bench/rbd-bench.sh [-r ROUNDS] [-t SECONDS] [-R RAMP_SECONDS] [-o OUT.txt]
# Needs: ceph-mon ceph-osd ceph-common (scripts/install-deps.sh), fio with the rbd engine, a
# release build of snapblk and libblkio.so.1 (built here if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 SECS=5 RAMP=1 OUT=""
while getopts "r:t:R:o:" o; do
  case $o in
    r) ROUNDS=$OPTARG ;; t) SECS=$OPTARG ;; R) RAMP=$OPTARG ;; o) OUT=$OPTARG ;;
    *) echo "usage: $0 [-r ROUNDS] [-t SECONDS] [-R RAMP_SECONDS] [-o OUT.txt]" >&2; exit 2 ;;
  esac
done
read -ra SIDES <<<"${SIDES:-snapblk capi fio-nc fio-nc2 snap-c fio}"
read -ra CELLS <<<"${CELLS:-randread:1 randread:32 randwrite:1 randwrite:32}"
# ref SIDE: the fio run a side is compared with.
ref() { case $1 in snap-c|fio|fio2) echo fio ;; *) echo fio-nc ;; esac; }
for side in "${SIDES[@]}"; do
  case $side in snapblk|capi|fio-nc|fio-nc2|snap-c|fio|fio2) ;; *) echo "SIDES: unknown side $side" >&2; exit 2 ;; esac
  case " ${SIDES[*]} " in *" $(ref "$side") "*) ;; *) echo "SIDES: $side needs $(ref "$side")" >&2; exit 2 ;; esac
done
for cell in "${CELLS[@]}"; do
  [[ $cell =~ ^(randread|randwrite):[0-9]+$ ]] || { echo "CELLS: $cell is not randread:QD or randwrite:QD" >&2; exit 2; }
done
. bench/lib/rbd-setup.sh
rbd_setup rbd-bench

run() { # run SIDE RW QD -> IOPS
  local side=$1 rw=$2 qd=$3
  case $side in
    snapblk|snap-c)
      local cache=false; [ "$side" = snap-c ] && cache=true
      "$SNAPBLK" bench "rbd:pool=rbd,image=bench,conf=$CEPH_CONF,lock=none,cache=$cache" --rw "$rw" --bs 4k \
        --iodepth "$qd" --runtime "$SECS" --ramp_time "$RAMP" --time_based --json | snapblk_iops ;;
    capi)
      "$SNAPBLK" bench --libblkio "$LIB" --driver rbd --prop pool=rbd --prop image=bench \
        --prop "conf=$CEPH_CONF" --prop lock=none --rw "$rw" --bs 4k --iodepth "$qd" --runtime "$SECS" \
        --ramp_time "$RAMP" --time_based \
        --json | snapblk_iops ;;
    fio|fio2|fio-nc|fio-nc2)
      local conf=$NOCACHE_CONF; [[ $side == fio || $side == fio2 ]] && conf=$CEPH_CONF
      CEPH_CONF=$conf fio --name=r --ioengine=rbd --pool=rbd --rbdname=bench --clientname=admin --rw="$rw" --bs=4k \
        --iodepth="$qd" --time_based --runtime="$SECS" --ramp_time="$RAMP" --output-format=json 2>/dev/null | fio_iops ;;
  esac
}

# stats "A B C": median [min-max] of the numbers.
stats() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {printf "%.2f [%.2f-%.2f]", a[int((NR+1)/2)], a[1], a[NR]}'; }
{
  echo "rbd bench: 4 KiB, ${SECS}s per run after a ${RAMP}s ramp, $ROUNDS rounds (order rotated, reversed every other round), $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit $(git describe --always --dirty 2>/dev/null || echo '?')"
  printf '%-10s %-4s %-8s %s\n' workload qd side "IOPS per round, median; paired ratio to the reference: median [range]"
  for cell in "${CELLS[@]}"; do
    rw=${cell%%:*} qd=${cell##*:}
    {
      declare -A res=()
      for r in $(seq 0 $((ROUNDS - 1))); do
        for k in $(seq 0 $((${#SIDES[@]} - 1))); do
          i=$(((r + k) % ${#SIDES[@]}))
          [ $((r % 2)) = 1 ] && i=$((${#SIDES[@]} - 1 - i))
          side=${SIDES[$i]}
          res[$side]+="$(run "$side" $rw $qd) "
        done
      done
      for side in "${SIDES[@]}"; do
        ref_=$(ref "$side")
        read -r -a mine <<<"${res[$side]}"; read -r -a theirs <<<"${res[$ref_]}"
        ratios=""
        for i in "${!mine[@]}"; do
          ratios+="$(awk -v a="${mine[$i]}" -v b="${theirs[$i]}" 'BEGIN {print (b > 0 ? a / b : 0)}') "
        done
        med=$(tr ' ' '\n' <<<"${res[$side]}" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
        printf '%-10s %-4s %-8s %s median %s  (%s x %s)\n' "$rw" "qd$qd" "$side" "${res[$side]}" "$med" \
          "$(stats "$ratios")" "$ref_"
      done
      unset res
    }
  done
} | tee "${OUT:-/dev/null}"
