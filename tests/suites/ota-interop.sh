#!/usr/bin/env bash
# Interop of snapblk's OTA payloads with an independent reader: installs PyPI payload-dumper
# 0.3.0 (and with it PyPI bsdiff4) into a venv (pip from PyPI) and runs the ignored cargo tests
# that have it extract full payloads and apply incremental ones (SOURCE_COPY, SOURCE_BSDIFF with
# patches made by bsdiff4 and Debian's bsdiff) written by snapblk-ota's writer
# (crates/ota/tests/interop.rs) and by the generator (`ota generate --bsdiff-format bsdiff40`
# of an ext4 image pair: SOURCE_COPY, SOURCE_BSDIFF from snapblk's own bsdiff, REPLACE_XZ, ZERO),
# and checks that it extracts the AOSP sample full payload to the
# same images as `snapblk ota extract`. Also installs PyPI reedsolo 1.7.0 (a pure-Python
# Reed-Solomon codec) and compares the FEC encoder's parity with it (the ignored unit test
# verity::rs::tests::reedsolo_agrees_on_random_messages). Fails if pip or a package is missing
# (never skips). Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
passed=0; failed=0
ok() { echo "PASS $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
work=$(mktemp -d /tmp/snapblk-ota-interop.XXXXXX)
trap 'rm -rf "$work"' EXIT
if python3 -m venv "$work/venv" > "$work/venv.log" 2>&1 \
   && "$work/venv/bin/pip" install -q payload-dumper==0.3.0 reedsolo==1.7.0 >> "$work/venv.log" 2>&1; then
  ok "pip install payload-dumper==0.3.0 reedsolo==1.7.0"
else
  tail -20 "$work/venv.log"; bad "pip install payload-dumper==0.3.0 reedsolo==1.7.0"
  echo "$passed passed, $failed failed"; exit 1
fi
if REEDSOLO_PYTHON=$work/venv/bin/python cargo test -q -p snapblk-ota --lib -- --ignored --exact \
     verity::rs::tests::reedsolo_agrees_on_random_messages > "$work/rs.txt" 2>&1 \
   && grep -q '^test result: ok. 1 passed' "$work/rs.txt"; then
  ok "the FEC's Reed-Solomon parity equals reedsolo's (roots 2..=24)"
else
  tail -30 "$work/rs.txt"; bad "the FEC's Reed-Solomon parity against reedsolo"
fi
dumper=$work/venv/bin/payload_dumper
interop() {  # interop TEST WHAT: run one ignored test of crates/ota/tests/interop.rs
  if PAYLOAD_DUMPER=$dumper BSDIFF4_PYTHON=$work/venv/bin/python \
       cargo test -q -p snapblk-ota --test interop -- --ignored --exact "$1" > "$work/test.txt" 2>&1 \
     && grep -q '^test result: ok. 1 passed' "$work/test.txt"; then
    ok "$2"
  else
    tail -30 "$work/test.txt"; bad "$2"
  fi
}
interop payload_dumper_reads_our_payloads_to_the_same_images \
  "payload-dumper reads full payloads written by snapblk-ota to the same images"
interop payload_dumper_reads_our_incremental_payloads_to_the_same_images \
  "payload-dumper applies incremental payloads written by snapblk-ota (bsdiff4 and bsdiff patches) to the same images as snapblk"
interop payload_dumper_applies_generated_bsdiff40_payloads \
  "payload-dumper applies an ota generate --bsdiff-format bsdiff40 payload of an ext4 pair to the new image"
# Both read the AOSP sample full payload to the same images.
cargo build -q -p snapblk-cli || { bad "cargo build -p snapblk-cli"; echo "$passed passed, $failed failed"; exit 1; }
tar -xf tests/data/ota/sample_payloads.tar.xz -C "$work"
"$dumper" --out "$work/theirs" "$work/full_payload.bin" > "$work/dumper.log" 2>&1 || bad "payload_dumper on the AOSP sample"
"${CARGO_TARGET_DIR:-$root/target}/debug/snapblk" ota extract "$work/full_payload.bin" -o "$work/ours" > /dev/null || bad "snapblk ota extract on the AOSP sample"
if cmp "$work/theirs/kernel.img" "$work/ours/kernel.img" && cmp "$work/theirs/root.img" "$work/ours/root.img"; then
  ok "payload-dumper and snapblk extract the AOSP sample to the same images"
else
  bad "payload-dumper and snapblk differ on the AOSP sample"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
