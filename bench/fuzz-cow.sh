#!/usr/bin/env bash
# Run the real cargo-fuzz targets of snapblk-cow for a bounded time (not part of the test suite;
# the suite runs a deterministic mutation smoke test of the same entry points instead:
# crates/cow/tests/hostile.rs::fuzz_smoke_mutated_golden_files).
#
# Usage: bench/fuzz-cow.sh [SECONDS_PER_TARGET (default 60)] [TARGET...]
# Needs: a nightly toolchain and cargo-fuzz (`rustup toolchain install nightly`,
#        `cargo +nightly install cargo-fuzz`). Seeds: the golden COW files.
set -euo pipefail
SECS=${1:-60}; shift || true
TARGETS=("$@"); [[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(cow_reader sparse)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT/crates/cow/fuzz"
mkdir -p corpus/cow_reader corpus/sparse
for f in "$ROOT"/tests/data/aosp-cow/*/snapshot.cow; do
  # Seeds without the all-zero 2 MiB scratch area keep the corpus small.
  n=$(basename "$(dirname "$f")")
  python3 - "$f" "corpus/cow_reader/$n" <<'PY'
import sys, struct
b = bytearray(open(sys.argv[1], 'rb').read())
hs = struct.unpack_from('<H', b, 12)[0]
bufsz = struct.unpack_from('<I', b, 34)[0]
if bufsz and len(b) > hs + bufsz:
    del b[hs:hs + bufsz]
    struct.pack_into('<I', b, 34, 0)
open(sys.argv[2], 'wb').write(b)
PY
done
if command -v img2simg >/dev/null; then
  head -c 65536 /dev/urandom > /tmp/fuzz-sparse-seed.img
  img2simg /tmp/fuzz-sparse-seed.img corpus/sparse/seed.simg
fi
for t in "${TARGETS[@]}"; do
  echo "== cargo fuzz run $t for ${SECS}s" >&2
  cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=65536
done
