#!/usr/bin/env bash
# 4 KiB random read, QD1 and QD32, on zram (O_DIRECT) and tmpfs (buffered):
#   real libblkio 1.5 (Debian trixie)  vs  snapblk's libblkio.so.1  vs  fio's own io_uring engine.
# libblkio is driven by one C client (bench/c/blkio_bench.c; this fio 3.33 has no libblkio engine).
# Runs are interleaved and repeated (ROUNDS, default 5; SECS per run, default 3); prints medians,
# the min-max spread and ratios. Then (unless CALLGRIND=0) user-space instructions per I/O spent
# inside the libblkio calls (blkioq_read + blkioq_do_io, callgrind --toggle-collect) for both
# libraries at QD1 and QD32 on tmpfs: a figure that a busy machine does not disturb.
# Needs root for zram (uses /dev/zram0; configures it only if its disksize is 0 and
# resets it at the end in that case).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ROUNDS=${ROUNDS:-5}; SECS=${SECS:-3}
command -v fio >/dev/null || { echo "fio missing (scripts/install-deps.sh)"; exit 1; }
real=$(bash bench/real-libblkio.sh)
realinc=$(cd "$real/../../include" && pwd)
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -p snapblk-capi >&2
work=$(mktemp -d /tmp/snapblk-bench.XXXXXX)
zram_set=0
cleanup() {
  rm -rf "$work" /dev/shm/snapblk-bench.img
  if [ "$zram_set" = 1 ]; then echo 1 > /sys/block/zram0/reset; fi
}
trap cleanup EXIT
mkdir -p "$work/snap"
# A private copy: a concurrent `cargo build` may replace target/release/libblkio.so mid-run.
cp "$root/target/release/libblkio.so" "$work/snap/libblkio.so.1"
gcc -O2 -Wall -I "$realinc" bench/c/blkio_bench.c -L "$real" -l:libblkio.so.1 -o "$work/bench"

targets=()
if [ -b /dev/zram0 ] && [ "$(id -u)" = 0 ]; then
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
dd if=/dev/urandom of=/dev/shm/snapblk-bench.img bs=1M count=1024 status=none
targets+=("tmpfs:/dev/shm/snapblk-bench.img:0")

run() { # engine path qd direct
  case $1 in
    real) LD_LIBRARY_PATH="$real" "$work/bench" "$2" "$3" "$SECS" "$4" | sed 's/iops=\([0-9]*\).*/\1/' ;;
    snapblk) LD_LIBRARY_PATH="$work/snap" "$work/bench" "$2" "$3" "$SECS" "$4" | sed 's/iops=\([0-9]*\).*/\1/' ;;
    fio) fio --name=r --filename="$2" --ioengine=io_uring --rw=randread --bs=4k --iodepth="$3" \
           --direct="$4" --time_based --runtime="$SECS" --norandommap --randrepeat=0 \
           --output-format=json 2>/dev/null | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))' ;;
  esac
}
declare -A res
for ((r = 1; r <= ROUNDS; r++)); do
  for t in "${targets[@]}"; do
    IFS=: read -r name path direct <<< "$t"
    for qd in 1 32; do
      for e in fio real snapblk; do
        v=$(run "$e" "$path" "$qd" "$direct")
        res["$name/$qd/$e"]+="$v "
        echo "round $r $name QD$qd $e: $v IOPS" >&2
      done
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
spread() { tr ' ' '\n' | grep -v '^$' | sort -n | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.0fk-%.0fk", lo/1000, hi/1000}'; }
echo
echo "| target | QD | fio io_uring | real libblkio 1.5 | snapblk libblkio | real / fio | snapblk / fio | snapblk / real |"
echo "|---|---|---|---|---|---|---|---|"
for t in "${targets[@]}"; do
  name=${t%%:*}
  for qd in 1 32; do
    f=$(echo "${res[$name/$qd/fio]}" | median); rl=$(echo "${res[$name/$qd/real]}" | median); s=$(echo "${res[$name/$qd/snapblk]}" | median)
    printf "| %s | %s | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f |\n" "$name" "$qd" "$f" "$rl" "$s" \
      "$(echo "$rl / $f" | bc -l)" "$(echo "$s / $f" | bc -l)" "$(echo "$s / $rl" | bc -l)"
  done
done
echo "(medians of $ROUNDS interleaved rounds, $SECS s each, 4 KiB random read)"
echo
echo "spread (min-max IOPS over the rounds):"
echo
echo "| target | QD | fio io_uring | real libblkio 1.5 | snapblk libblkio |"
echo "|---|---|---|---|---|"
for t in "${targets[@]}"; do
  name=${t%%:*}
  for qd in 1 32; do
    echo "| $name | $qd | $(echo "${res[$name/$qd/fio]}" | spread) | $(echo "${res[$name/$qd/real]}" | spread) | $(echo "${res[$name/$qd/snapblk]}" | spread) |"
  done
done

if [ "${CALLGRIND:-1}" = 1 ]; then
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
              "$work/bench" /dev/shm/snapblk-bench.img "$qd" 2 0 2>/dev/null)
      ios=${out##*ios=}
      ir=$(callgrind_annotate "$work/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
      row+=" $((ir / ios)) |"
    done
    echo "$row"
  done
fi
