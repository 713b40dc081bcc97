#!/usr/bin/env bash
# Realistic-COW goals (the snapuserd comparison): builds the change-heavy ext4 pair with
# bench/cow/make-pair.py, the COWs with `snapblk cow create` (v3 lz4, v2 lz4, v3 zstd with 64 KiB
# units, each with its COW record, as `cow create` writes by default), and prints side by side in
# one run:
#  * 4 KiB QD1 reads of the whole device through the snapshot (in process), sequential and
#    random, vs `pread` of the new image (goal >= 0.8x for lz4, >= 0.6x for zstd 64 KiB);
#  * `snapblk merge` (record check, pre-merge check, merge, fsyncs) vs `cp --sparse=never` of
#    the image + sync (goal >= 0.95x);
#  * with SECTIONS containing `ir`: user-space instructions per read under callgrind (free of
#    the timing noise of a shared machine).
# The COPY-only read and worst-case merge goals are bench/snapshot-bench.sh's copy and merge
# sections. Android's own figures (snapuserd, same pair) are reference figures in
# ../shared/notes/anchor-figures.md and README.md, not run here.
# usage: bench/realistic-bench.sh [DIR] [IMAGE_MiB] [ROUNDS] [SECTIONS]
#        (defaults: /dev/shm/snapblk-realistic 256 7 reads,merge; SECTIONS also takes ir)
# results: bench/results/scratch/realistic-<time>.json
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/dev/shm/snapblk-realistic}
mib=${2:-256}
rounds=${3:-7}
sections=${4:-reads,merge}
cargo build --release -p snapblk-cli -p snapblk-snapshot --example realistic_perf >&2
mkdir -p "$dir" bench/results/scratch
if [ ! -s "$dir/new.img" ] || [ "$(stat -c %s "$dir/new.img")" != $((mib << 20)) ]; then
  python3 bench/cow/make-pair.py "$dir" "$mib" >&2
fi
s=./target/release/snapblk
cows=(v3-lz4.cow v2-lz4.cow v3-zstd64k.cow)
$s cow create --old "$dir/old.img" --new "$dir/new.img" -o "$dir/v3-lz4.cow" >&2
$s cow create --old "$dir/old.img" --new "$dir/new.img" -o "$dir/v2-lz4.cow" --format v2 >&2
$s cow create --old "$dir/old.img" --new "$dir/new.img" -o "$dir/v3-zstd64k.cow" \
  --compression zstd --unit 65536 >&2
out=bench/results/scratch/realistic-$(date +%Y%m%d-%H%M%S).json
timed=$(echo "$sections" | tr ',' '\n' | grep -v '^ir$' | paste -sd, || true)
{
  if [ -n "$timed" ]; then
    ./target/release/examples/realistic_perf "$dir" "$rounds" "$timed" "${cows[@]}"
  fi
  if [[ ",$sections," == *",ir,"* ]]; then
    # Instructions per read: two runs (one and two passes over the device, each pass on a
    # fresh open) differ by one pass; divided by the blocks of a pass.
    blocks=$(( mib * 256 ))
    echo '{"ir_per_read": {'
    first=1
    for c in "${cows[@]}"; do
      for p in sequential random; do
        ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null \
          ./target/release/examples/realistic_perf --ir "$dir" "$c" "$p" "$1" 2>&1 |
          awk '/refs:/{gsub(",","",$4); print $4}'; }
        a=$(ir "$blocks"); b=$(ir $((2 * blocks)))
        [ $first = 1 ] || echo ','
        first=0
        printf '"%s %s": %d' "$c" "$p" $(( (b - a) / blocks ))
      done
    done
    echo '}}'
  fi
} | tee "$out"
echo "wrote $out" >&2
