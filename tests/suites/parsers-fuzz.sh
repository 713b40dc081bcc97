#!/usr/bin/env bash
# Fuzz smoke for the COW record parser (crates/cow/fuzz, target `record`), the device-spec
# parser (crates/snapblk/fuzz, target `spec`), the OTA payload parser, extractor and signature
# check (crates/ota/fuzz, target `payload`, seeded with the AOSP sample payloads, one of them
# signed by openssl), the `--key` file parser (target `keys`, seeded with openssl's
# certificates and public keys), the bsdiff applier of OTA apply (target `bspatch`, seeded
# with Debian bsdiff's patches, also repacked as BSDF2) and the PUFFDIFF applier (target
# `puffin`: deflate puff/huff round trips, puffs, PUF1 patches; seeds by
# tests/lib/puffin-seeds.sh): builds the libFuzzer targets with the nightly toolchain and
# coverage instrumentation, runs each for FUZZ_SECS seconds (default 20) from a few valid
# seeds. Fails if the toolchain is missing or a target crashes. Ends with "N passed, N
# failed". Long campaigns: scripts/fuzz-campaign.sh.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cargo build --release -q -p snapblk-cli || { echo "FAIL: build"; echo "0 passed, 1 failed"; exit 1; }
cd "$ROOT/crates/cow/fuzz"
. "$ROOT/tests/lib/fuzz.sh"
fuzz_build
mkdir -p corpus/record
for g in v2_xor_seq_lz4 v3_copy_chain_seq v2_basic_none; do
  G=$ROOT/tests/data/aosp-cow/$g
  tmp=$(mktemp -d)
  cp "$G/snapshot.cow" "$tmp/s.cow"
  "${CARGO_TARGET_DIR:-$ROOT/target}/release/snapblk" cow record "$tmp/s.cow" --old "$G/base.img" --new "$G/target.img" \
      -o "$tmp/r" > /dev/null || bad "seed record for $g"
  # First byte: the harness's flag (bit 0: repair the checksum), then the record.
  { printf '\001'; cat "$tmp/r"; } > "corpus/record/$g"
  rm -rf "$tmp"
done
fuzz_run record -max_len=65536 -timeout=10 -rss_limit_mb=2048
cd "$ROOT/crates/snapblk/fuzz"
fuzz_build
mkdir -p corpus/spec
printf 'null:size=1G' > corpus/spec/null
printf 'io_uring:path=/dev/null,read-only=true' > corpus/spec/uring
printf 'snapshot:base=a.img,cow=b.cow,verify=false' > corpus/spec/snapshot
fuzz_run spec -max_len=256 -timeout=10
cd "$ROOT/crates/ota/fuzz"
fuzz_build
mkdir -p corpus/payload
bash "$ROOT/tests/lib/ota-seeds.sh" corpus/payload || bad "seed the payload corpus"
fuzz_run payload -max_len=65536 -timeout=10 -rss_limit_mb=2048
mkdir -p corpus/keys
bash "$ROOT/tests/lib/key-seeds.sh" corpus/keys || bad "seed the keys corpus"
fuzz_run keys -max_len=16384 -timeout=10 -rss_limit_mb=2048
mkdir -p corpus/bspatch
bash "$ROOT/tests/lib/bspatch-seeds.sh" corpus/bspatch || bad "seed the bspatch corpus"
fuzz_run bspatch -max_len=65536 -timeout=10 -rss_limit_mb=2048
mkdir -p corpus/puffin
bash "$ROOT/tests/lib/puffin-seeds.sh" corpus/puffin || bad "seed the puffin corpus"
fuzz_run puffin -max_len=65536 -timeout=10 -rss_limit_mb=2048
fuzz_summary
