#!/usr/bin/env bash
# Snapshot driver benchmarks: COPY-only 4 KiB QD1 reads vs the raw base, REPLACE-lz4 sequential
# reads vs raw lz4 decoding, merge throughput vs a sequential copy, foreground p99 during a merge
# (with and without the scheduler). Files live on tmpfs (/dev/shm) unless DIR is given.
# usage: bench/snapshot-bench.sh [DIR] [IMAGE_MiB]   (results: bench/results/snapshot-*.json)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/dev/shm/snapblk-snapbench}
mib=${2:-256}
case "$(stat -f -c %T "$(dirname "$dir")" 2>/dev/null || echo unknown)" in
  tmpfs|ramfs) ;;
  *) echo "warning: $dir is not on tmpfs; figures will include the disk" >&2 ;;
esac
cargo build --release -p snapblk-snapshot --example snapbench >&2
mkdir -p bench/results
out=bench/results/snapshot-$(date +%Y%m%d-%H%M%S).json
./target/release/examples/snapbench "$dir" "$mib" | tee "$out"
rmdir "$dir" 2>/dev/null || true
echo "wrote $out" >&2
