#!/usr/bin/env bash
# User-space instructions per 4 KiB random read, counted with callgrind (noise-free; kernel work
# in pread / io_uring_enter is not counted, and is the same for every variant).
# Each variant runs N1 and N2 reads; (Ir(N2) - Ir(N1)) / (N2 - N1) removes setup costs, and the
# `none` variant (the loop alone) is subtracted from the others.
# lz4_snapshot_driver: 4 KiB random reads of the REPLACE-lz4 COW (mostly decoded-unit cache hits
# once the small image is cached). Also Ir per MiB of sequential lz4 reads vs in-memory decode.
# usage: bench/snapshot/ir-per-read.sh [DIR] [IMAGE_MiB]   (prints JSON; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-/dev/shm/snapblk-irbench}
mib=${2:-16}
command -v valgrind >/dev/null || { echo "valgrind is required" >&2; exit 1; }
bin=./target/release/examples/snapshot_perf
[ -x "$bin" ] || cargo build --release -p snapblk-snapshot --example snapshot_perf >&2
"$bin" --prepare "$dir" "$mib"
n1=${N1:-5000}
n2=${N2:-15000}
ir() { # variant n
  local out
  out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --ir "$dir" "$1" "$2" >/dev/null 2>&1
  awk '/^summary:/ {print $2}' "$out"
  rm -f "$out"
}
declare -A per
for v in none pread sync_driver uring_driver snapshot_driver snapshot_api lz4_snapshot_driver; do
  a=$(ir "$v" "$n1")
  b=$(ir "$v" "$n2")
  per[$v]=$(( (b - a) / (n2 - n1) ))
done
# Sequential 1 MiB reads of the REPLACE-lz4 COW vs decoding the same units in memory: Ir per MiB.
for v in lz4seq_decode_1m lz4seq_snapshot_driver; do
  a=$(ir "$v" 8)
  b=$(ir "$v" 24)
  per[$v]=$(( (b - a) / 16 ))
done
{
  printf '{"image_mib": %s, "loop_ir_per_read": %s, "ir_per_4k_read": {' "$mib" "${per[none]}"
  sep=
  for v in pread sync_driver uring_driver snapshot_driver snapshot_api lz4_snapshot_driver; do
    printf '%s"%s": %s' "$sep" "$v" $(( ${per[$v]} - ${per[none]} ))
    sep=', '
  done
  printf '}, "ir_per_mib_lz4_sequential": {"decode_1m": %s, "snapshot_driver": %s}}\n' \
    "${per[lz4seq_decode_1m]}" "${per[lz4seq_snapshot_driver]}"
}
rm -rf "$dir"
