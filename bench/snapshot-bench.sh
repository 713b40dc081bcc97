#!/usr/bin/env bash
# Snapshot driver benchmarks (see crates/snapshot/examples/snapshot_perf.rs for what each one does):
#  * 4 KiB QD1 random reads of a COPY-only COW through the snapshot driver vs raw pread of the
#    base — the goal (<= 1.1x) — and vs the same queue API on the raw base (`sync` and
#    `io_uring` drivers), which shows what the queue API alone costs;
#  * REPLACE-lz4 sequential 1 MiB reads vs in-memory lz4 decoding of the same units (goal >= 0.8x);
#  * merge vs a sequential in-place copy (goal >= 0.8x), worst case (every block moves by one) and
#    extent moves;
#  * foreground 4 KiB p99 during a merge vs idle, with and without the scheduler (goal <= 2x);
#  * on request (SECTIONS=precheck): the pre-merge check's seconds next to the merge's own seconds
#    for OTA-like none/lz4/gz COWs (goal: pre-check <= 0.5x the merge for none/lz4);
#  * on request (SECTIONS=verify): 4 KiB QD1 reads with the COW record's checks on vs off, steady
#    state and first touch (goal: steady state <= 1.05x unchecked).
# Variants run interleaved, ROUNDS rounds, medians and paired per-round ratios reported. Then
# user-space instructions per read under callgrind (bench/snapshot/ir-per-read.sh), which is
# free of the timing noise of a shared machine.
# Files live on tmpfs (/dev/shm) unless DIR is given.
# usage: bench/snapshot-bench.sh [DIR] [IMAGE_MiB] [ROUNDS] [SECTIONS]
#        (SECTIONS: comma list of copy,lz4,merge,fg,ir,precheck,verify; default all but
#        precheck and verify)
# results: bench/results/scratch/snapshot-<time>.json (timed) and snapshot-ir-<time>.json (callgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/dev/shm/snapblk-snapshot-perf}
mib=${2:-256}
rounds=${3:-7}
sections=${4:-copy,lz4,merge,fg,ir}
case "$(stat -f -c %T "$(dirname "$dir")" 2>/dev/null || echo unknown)" in
  tmpfs|ramfs) ;;
  *) echo "warning: $dir is not on tmpfs; figures will include the disk" >&2 ;;
esac
cargo build --release -p snapblk-snapshot --example snapshot_perf >&2
mkdir -p bench/results/scratch
stamp=$(date +%Y%m%d-%H%M%S)
timed=${sections//,ir/}
timed=${timed//ir,/}
if [ "$timed" != "ir" ] && [ -n "$timed" ]; then
  out=bench/results/scratch/snapshot-$stamp.json
  ./target/release/examples/snapshot_perf "$dir" "$mib" "$rounds" "$timed" | tee "$out"
  rm -rf "$dir"
  echo "wrote $out" >&2
fi
if [[ ",$sections," == *",ir,"* ]]; then
  out=bench/results/scratch/snapshot-ir-$stamp.json
  bench/snapshot/ir-per-read.sh "$dir-ir" 16 | tee "$out"
  echo "wrote $out" >&2
fi
