#!/usr/bin/env bash
# Interop of snapblk's OTA payloads with an independent reader: installs PyPI payload-dumper
# 0.3.0 (and with it PyPI bsdiff4) into a venv (pip from PyPI) and runs the ignored cargo tests
# that have it extract full payloads and apply incremental ones (SOURCE_COPY, SOURCE_BSDIFF with
# patches made by bsdiff4 and Debian's bsdiff) written by snapblk-ota's writer
# (crates/ota/tests/interop.rs) and by the generator (its library with BSDIFF40 patches on an
# ext4 image pair: SOURCE_COPY, SOURCE_BSDIFF from snapblk's own bsdiff, REPLACE_XZ, ZERO; and
# the command `snapblk ota generate --bsdiff-format bsdiff40` on a second ext4 pair, applied with
# `payload_dumper --diff`), and checks that it extracts the AOSP sample full payload to the
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
snapblk=${CARGO_TARGET_DIR:-$root/target}/debug/snapblk
# The command line itself: `snapblk ota generate --bsdiff-format bsdiff40` of an ext4 pair (a
# file edited and moved, one with bytes inserted, a deleted, a copied and a new one), applied
# by payload-dumper to the new image.
mkdir -p "$work/t1/a" "$work/t1/b" "$work/gold" "$work/gnew"
seq 1 60000 > "$work/t1/a/text"; head -c 400000 /dev/urandom > "$work/t1/b/blob"
head -c 200000 /dev/urandom > "$work/t1/a/gone"
cp -a "$work/t1" "$work/t2"
sed -i 's/7/seven/g' "$work/t2/a/text"
{ head -c 1000 "$work/t1/b/blob"; echo inserted; tail -c +1001 "$work/t1/b/blob"; } > "$work/t2/b/blob"
rm "$work/t2/a/gone"; mv "$work/t2/a/text" "$work/t2/text"; cp "$work/t1/b/blob" "$work/t2/a/copy"
head -c 100000 /dev/urandom > "$work/t2/new"
mke2fs -q -t ext4 -b 4096 -E root_owner=0:0 -d "$work/t1" "$work/gold/system.img" 8M >/dev/null 2>&1
mke2fs -q -t ext4 -b 4096 -E root_owner=0:0 -d "$work/t2" "$work/gnew/system.img" 8M >/dev/null 2>&1
if "$snapblk" ota generate --source "$work/gold" --target "$work/gnew" --bsdiff-format bsdiff40 -o "$work/gen.bin" > "$work/gen.txt" 2>&1 \
   && grep -q SOURCE_BSDIFF "$work/gen.txt" \
   && "$dumper" --diff --old "$work/gold" --out "$work/gtheirs" "$work/gen.bin" > "$work/gdumper.log" 2>&1 \
   && cmp "$work/gtheirs/system.img" "$work/gnew/system.img"; then
  ok "payload-dumper applies a payload of \`snapblk ota generate --bsdiff-format bsdiff40\` (SOURCE_BSDIFF) to the new image"
else
  cat "$work/gen.txt"; tail -5 "$work/gdumper.log" 2>/dev/null; bad "payload-dumper on an \`ota generate --bsdiff-format bsdiff40\` payload"
fi
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
