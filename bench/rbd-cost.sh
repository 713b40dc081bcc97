#!/usr/bin/env bash
# What one 4 KiB I/O costs through the rbd driver and through fio's rbd engine, on the test
# cluster of scripts/ceph-cluster.sh: measures that a loaded machine disturbs less than IOPS.
# Each round runs every side once, in an order rotated per round (no side always first), with
# the same librbd settings (`rbd cache = false`, lock none; with -c, librbd's cache on for all:
# `cache=true` for snapblk and capi, fio with librbd's defaults). Per run it prints:
#
#   iops      I/Os per second (what bench/rbd-bench.sh compares)
#   cpu/io    the client process's user + system CPU per I/O, in µs (/usr/bin/time), its
#             librbd threads included
#   cs/io     the client's context switches (voluntary + involuntary) per I/O
#   osd/io    the OSD's CPU per I/O, in µs (/proc/PID/stat): how much work the client's
#             request pattern makes the OSD do
#   osdlat    the OSD's own mean read latency during the run, in µs (`perf dump`, op_r_latency),
#             including the time a read waits for a CPU inside the OSD
#
# Sides: snapblk (`snapblk bench rbd:...`), capi (`snapblk bench --libblkio`, the C ABI), fio and
# fio2 (`fio --ioengine=rbd` twice: fio2's ratio to fio is the noise floor of a ratio here);
# SIDES="..." picks some (fio must stay: the ratios are to it).
#
# Usage: bench/rbd-cost.sh [-r ROUNDS] [-t SECONDS] [-w RW] [-q QD] [-c] [-o OUT.txt]
# Needs what bench/rbd-bench.sh needs, and /usr/bin/time.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=4 SECS=4 RW=randread QD=32 OUT="" CACHE=false
while getopts "r:t:w:q:co:" o; do
  case $o in
    r) ROUNDS=$OPTARG ;; t) SECS=$OPTARG ;; w) RW=$OPTARG ;; q) QD=$OPTARG ;; o) OUT=$OPTARG ;;
    c) CACHE=true ;;
    *) echo "usage: $0 [-r ROUNDS] [-t SECONDS] [-w RW] [-q QD] [-c] [-o OUT.txt]" >&2; exit 2 ;;
  esac
done
. bench/lib/rbd-setup.sh
rbd_setup rbd-cost
OSDPID=$(cat "$WORK/cluster/run/osd.0.pid")

osd_cpu() { awk '{print $14 + $15}' "/proc/$OSDPID/stat"; } # clock ticks
osd_lat() { # "sum_seconds count" of the OSD's read latency
  timeout 20 ceph daemon osd.0 perf dump | python3 -c 'import json,sys
l=json.load(sys.stdin)["osd"]["op_r_latency"]; print(l["sum"], l["avgcount"])'
}
ios_of() { # SIDE JSON -> total I/Os of the run
  case $1 in
    fio*) python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(j["read"]["total_ios"] + j["write"]["total_ios"])' ;;
    *) python3 -c 'import json,sys; d=json.load(sys.stdin)
print(sum(r["read"]["ios"] + r["write"]["ios"] for x in d["results"] for r in x["runs"]))' ;;
  esac
}
iops_of() { case $1 in fio*) fio_iops ;; *) snapblk_iops ;; esac; }
run() { # run SIDE -> "iops cpu/io cs/io osd/io osdlat"
  local side=$1 t=/usr/bin/time
  local c0 l0 c1 l1
  c0=$(osd_cpu) l0=$(osd_lat)
  case $side in
    snapblk) $t -f '%U %S %c %w' -o "$WORK/time" "$SNAPBLK" bench \
      "rbd:pool=rbd,image=bench,conf=$CEPH_CONF,lock=none,cache=$CACHE" --rw "$RW" --bs 4k \
      --iodepth "$QD" --runtime "$SECS" --time_based --json >"$WORK/out" 2>/dev/null ;;
    capi) $t -f '%U %S %c %w' -o "$WORK/time" "$SNAPBLK" bench --libblkio "$LIB" --driver rbd \
      --prop pool=rbd --prop image=bench --prop "conf=$CEPH_CONF" --prop lock=none --prop "cache=$CACHE" \
      --rw "$RW" --bs 4k --iodepth "$QD" --runtime "$SECS" --time_based --json >"$WORK/out" 2>/dev/null ;;
    fio*) CEPH_CONF=$FIO_CONF $t -f '%U %S %c %w' -o "$WORK/time" fio --name=r \
      --ioengine=rbd --pool=rbd --rbdname=bench --clientname=admin --rw="$RW" --bs=4k \
      --iodepth="$QD" --time_based --runtime="$SECS" --output-format=json >"$WORK/out" 2>/dev/null ;;
  esac
  c1=$(osd_cpu) l1=$(osd_lat)
  local ios iops
  ios=$(ios_of "$side" <"$WORK/out") iops=$(iops_of "$side" <"$WORK/out")
  read -r u s ci cv <"$WORK/time"
  awk -v ios="$ios" -v iops="$iops" -v u="$u" -v s="$s" -v ci="$ci" -v cv="$cv" -v c="$((c1 - c0))" \
    -v hz="$(getconf CLK_TCK)" -v l0="$l0" -v l1="$l1" 'BEGIN {
      split(l0, a, " "); split(l1, b, " "); n = b[2] - a[2]
      printf "%d %.1f %.2f %.1f %.0f\n", iops, (u + s) * 1e6 / ios, (ci + cv) / ios,
        c * 1e6 / hz / ios, (n > 0 ? (b[1] - a[1]) * 1e6 / n : 0) }'
}

FIO_CONF=$NOCACHE_CONF; [ "$CACHE" = true ] && FIO_CONF=$CEPH_CONF
read -ra SIDES <<<"${SIDES:-snapblk capi fio fio2}"
declare -A res=()
{
  echo "rbd cost: $RW 4 KiB QD$QD, librbd cache=$CACHE, ${SECS}s per run, $ROUNDS rounds, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit $(git describe --always --dirty 2>/dev/null || echo '?')"
  printf '%-5s %-8s %7s %7s %6s %7s %7s\n' round side iops cpu/io cs/io osd/io osdlat
  for r in $(seq "$ROUNDS"); do
    n=${#SIDES[@]}
    for i in $(seq 0 $((n - 1))); do
      side=${SIDES[$(((i + r - 1) % n))]}
      line=$(run "$side")
      res[$side]+="$line;"
      printf '%-5s %-8s %7s %7s %6s %7s %7s\n' "$r" "$side" $line
    done
  done
  echo "medians (ratio of iops to fio's median):"
  fio_iops=""
  for side in fio "${SIDES[@]}"; do
    m=$(tr ";" "\n" <<<"${res[$side]:-}" | grep . | python3 -c 'import sys, statistics
rows = [list(map(float, l.split())) for l in sys.stdin]
print(" ".join(f"{statistics.median(c):.1f}" for c in zip(*rows)))')
    [ -z "$fio_iops" ] && { fio_iops=${m%% *}; continue; }
    read -r a b c d e <<<"$m"
    printf '%-5s %-8s %7.0f %7s %6s %7s %7.0f  (%.2fx fio)\n' median "$side" "$a" "$b" "$c" "$d" "$e" \
      "$(awk -v a="$a" -v f="$fio_iops" 'BEGIN {print a / f}')"
  done
} | tee "${OUT:-/dev/null}"
