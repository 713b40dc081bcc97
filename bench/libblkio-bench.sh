#!/usr/bin/env bash
# 4 KiB random read, QD1 and QD32, on zram (O_DIRECT) and tmpfs (buffered). Engines:
#   fio io_uring     fio's own io_uring engine (defaults: no hipri, no sqthread_poll; all fio
#                    runs use --invalidate=0 so that fio, like the C client, reads a cached file
#                    from the cache: fio's default drops the file's page cache before each run)
#   fio psync        fio's pread engine, QD1 only: the plain synchronous reference (a pread per
#                    I/O in the calling thread); at QD32 it would still be QD1, so not run
#   real libblkio    libblkio 1.5 (Debian trixie), io_uring driver
#   snapblk          snapblk's libblkio.so.1, io_uring driver, defaults (inline-qd1=true: on a
#                    target without RWF_NOWAIT, a do_io that waits for every pending request
#                    runs them with preadv2 in the calling thread instead of the ring)
#   snapblk (ring only)  the same with inline-qd1=false: every request through the ring
# Neither tmpfs nor zram supports NOWAIT, so io_uring (fio's, real libblkio's, snapblk's ring)
# hands every request to an io-wq kernel worker thread; at QD1 that hand-off dominates.
# libblkio is driven by one C client (bench/c/blkio_bench.c; this fio 3.33 has no libblkio engine).
# Sanity lines after the tables: the nowait probe's verdict per target, and the io-wq worker
# threads (iou-wrk-*) in each library's QD1 process at the end of its run with the CPU time
# they used (the punt made visible: ~0 ms for snapblk's inline path); no engine polls (no poll
# queues, no hipri/sqthread_poll).
# Runs are interleaved and repeated (ROUNDS, default 5; SECS per run, default 3); prints medians,
# the min-max spread and ratios. Then (unless CALLGRIND=0) user-space instructions per I/O spent
# inside the libblkio calls (blkioq_read + blkioq_do_io, callgrind --toggle-collect) for both
# libraries at QD1 and QD32 on tmpfs: a figure that a busy machine does not disturb.
# Needs root for zram (uses /dev/zram0; configures it only if its disksize is 0 and
# resets it at the end in that case).
# TARGETS (comma list, default zram,tmpfs) may also name ext4loop: a 1 GiB file on ext4 on a
# loop device over a tmpfs file, read buffered and cached — a target WITH NOWAIT support, where
# io_uring completes reads inline in the kernel and snapblk stays on the ring (needs root,
# losetup, mkfs.ext4). The callgrind part runs when tmpfs is among the targets.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ROUNDS=${ROUNDS:-5}; SECS=${SECS:-3}
command -v fio >/dev/null || { echo "fio missing (scripts/install-deps.sh)"; exit 1; }
real=$(bash bench/real-libblkio.sh)
realinc=$(cd "$real/../../include" && pwd)
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -p snapblk-capi >&2
TARGETS=${TARGETS:-zram,tmpfs}
want() { [[ ",$TARGETS," == *",$1,"* ]]; }
work=$(mktemp -d /tmp/snapblk-loadgen.XXXXXX)
zram_set=0
loopdev=""
cleanup() {
  if [ -n "$loopdev" ]; then
    umount "$work/mnt" 2>/dev/null || true
    losetup -d "$loopdev" || true
  fi
  rm -rf "$work" /dev/shm/snapblk-loadgen.img /dev/shm/snapblk-loadgen-ext4.img
  if [ "$zram_set" = 1 ]; then echo 1 > /sys/block/zram0/reset; fi
}
trap cleanup EXIT
mkdir -p "$work/snap"
# A private copy: a concurrent `cargo build` may replace target/release/libblkio.so mid-run.
cp "$root/target/release/libblkio.so" "$work/snap/libblkio.so.1"
gcc -O2 -Wall -I "$realinc" bench/c/blkio_bench.c -L "$real" -l:libblkio.so.1 -o "$work/bench"

targets=()
if ! want zram; then
  :
elif [ -b /dev/zram0 ] && [ "$(id -u)" = 0 ]; then
  if [ "$(cat /sys/block/zram0/disksize)" = 0 ]; then
    echo 1G > /sys/block/zram0/disksize; zram_set=1
  fi
  if [ "$zram_set" = 1 ]; then
    dd if=/dev/urandom of=/dev/zram0 bs=1M count=1024 oflag=direct status=none 2>/dev/null || true
    targets+=("zram:/dev/zram0:1")
  else
    echo "zram0 is in use by someone else (disksize set): skipping zram" >&2
  fi
else
  echo "SKIPPED zram: needs root and /dev/zram0" >&2
fi
if want tmpfs; then
  dd if=/dev/urandom of=/dev/shm/snapblk-loadgen.img bs=1M count=1024 status=none
  targets+=("tmpfs:/dev/shm/snapblk-loadgen.img:0")
fi
if want ext4loop; then
  truncate -s 1200M /dev/shm/snapblk-loadgen-ext4.img
  loopdev=$(losetup -f --show /dev/shm/snapblk-loadgen-ext4.img)
  mkfs.ext4 -q "$loopdev"
  mkdir -p "$work/mnt"
  mount "$loopdev" "$work/mnt"
  dd if=/dev/urandom of="$work/mnt/img" bs=1M count=1024 status=none
  cat "$work/mnt/img" > /dev/null   # cached: buffered reads never wait for the device
  targets+=("ext4loop:$work/mnt/img:0")
fi
[ ${#targets[@]} -gt 0 ] || { echo "no targets"; exit 1; }

declare -A res sanity
blk() { # libdir path qd direct [inline] -> IOPS; keeps "nowait=.. iowq=.." in $work/last
  local out
  out=$(LD_LIBRARY_PATH="$1" "$work/bench" "$2" "$3" "$SECS" "$4" ${5:+"$5"})
  echo "${out#* ios=* }" > "$work/last"
  echo "$out" | sed 's/iops=\([0-9]*\).*/\1/'
}
fiorun() { # ioengine path qd direct
  fio --name=r --filename="$2" --ioengine="$1" --rw=randread --bs=4k --iodepth="$3" \
    --direct="$4" --time_based --runtime="$SECS" --norandommap --randrepeat=0 --invalidate=0 \
    --output-format=json 2>/dev/null | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))'
}
run() { # engine path qd direct
  case $1 in
    real) blk "$real" "$2" "$3" "$4" ;;
    snapblk) blk "$work/snap" "$2" "$3" "$4" ;;
    ring) blk "$work/snap" "$2" "$3" "$4" 0 ;;
    fio) fiorun io_uring "$2" "$3" "$4" ;;
    psync) fiorun psync "$2" 1 "$4" ;;
  esac
}
for ((r = 1; r <= ROUNDS; r++)); do
  for t in "${targets[@]}"; do
    IFS=: read -r name path direct <<< "$t"
    for qd in 1 32; do
      engines="fio real snapblk ring"
      [ "$qd" = 1 ] && engines="fio psync real snapblk ring"
      for e in $engines; do
        rm -f "$work/last"
        v=$(run "$e" "$path" "$qd" "$direct")
        res["$name/$qd/$e"]+="$v "
        [ -f "$work/last" ] && sanity["$name/$qd/$e"]=$(cat "$work/last")
        echo "round $r $name QD$qd $e: $v IOPS" >&2
      done
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
spread() { tr ' ' '\n' | grep -v '^$' | sort -n | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.0fk-%.0fk", lo/1000, hi/1000}'; }
echo
ratio() { echo "$1 / $2" | bc -l | xargs printf "%.2f"; }
echo "| target | QD | fio io_uring | fio psync | real libblkio 1.5 | snapblk | snapblk (ring only) | real / fio | snapblk / fio | snapblk / real | ring only / fio | snapblk / psync |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for t in "${targets[@]}"; do
  name=${t%%:*}
  for qd in 1 32; do
    f=$(echo "${res[$name/$qd/fio]}" | median); rl=$(echo "${res[$name/$qd/real]}" | median)
    s=$(echo "${res[$name/$qd/snapblk]}" | median); g=$(echo "${res[$name/$qd/ring]}" | median)
    if [ "$qd" = 1 ]; then
      p=$(echo "${res[$name/$qd/psync]}" | median); pc=$(printf "%.0f" "$p"); sp=$(ratio "$s" "$p")
    else
      pc="-"; sp="-"
    fi
    printf "| %s | %s | %.0f | %s | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s |\n" "$name" "$qd" "$f" "$pc" "$rl" "$s" "$g" \
      "$(ratio "$rl" "$f")" "$(ratio "$s" "$f")" "$(ratio "$s" "$rl")" "$(ratio "$g" "$f")" "$sp"
  done
done
echo "(medians of $ROUNDS interleaved rounds, $SECS s each, 4 KiB random read; fio psync at QD1 only)"
echo
echo "spread (min-max IOPS over the rounds):"
echo
echo "| target | QD | fio io_uring | fio psync | real libblkio 1.5 | snapblk | snapblk (ring only) |"
echo "|---|---|---|---|---|---|---|"
for t in "${targets[@]}"; do
  name=${t%%:*}
  for qd in 1 32; do
    p="-"; [ "$qd" = 1 ] && p=$(echo "${res[$name/$qd/psync]}" | spread)
    echo "| $name | $qd | $(echo "${res[$name/$qd/fio]}" | spread) | $p | $(echo "${res[$name/$qd/real]}" | spread) | $(echo "${res[$name/$qd/snapblk]}" | spread) | $(echo "${res[$name/$qd/ring]}" | spread) |"
  done
done
echo
echo "sanity (last round, QD1, $SECS s): snapblk's nowait probe; io-wq worker threads in the process"
echo "at the end and their CPU time (no engine polls: no poll queues, fio without hipri/sqthread_poll):"
echo
echo "| target | real libblkio 1.5 | snapblk | snapblk (ring only) |"
echo "|---|---|---|---|"
for t in "${targets[@]}"; do
  name=${t%%:*}
  echo "| $name | ${sanity[$name/1/real]} | ${sanity[$name/1/snapblk]} | ${sanity[$name/1/ring]} |"
done

if [ "${CALLGRIND:-1}" = 1 ] && want tmpfs; then
  command -v valgrind >/dev/null || { echo "valgrind missing (apt-get install valgrind), or CALLGRIND=0" >&2; exit 1; }
  echo
  echo "user instructions per I/O inside blkioq_read + blkioq_do_io (callgrind, tmpfs, 2 s):"
  echo
  echo "| QD | real libblkio 1.5 | snapblk libblkio |"
  echo "|---|---|---|"
  for qd in 1 32; do
    row="| $qd |"
    for lib in "$real" "$work/snap"; do
      out=$(LD_LIBRARY_PATH="$lib" valgrind --tool=callgrind --toggle-collect=blkioq_do_io \
              --toggle-collect=blkioq_read --callgrind-out-file="$work/cg.out" \
              "$work/bench" /dev/shm/snapblk-loadgen.img "$qd" 2 0 2>/dev/null)
      ios=${out#*ios=}; ios=${ios%% *}
      ir=$(callgrind_annotate "$work/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
      row+=" $((ir / ios)) |"
    done
    echo "$row"
  done
fi
