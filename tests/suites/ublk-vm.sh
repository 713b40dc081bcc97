#!/usr/bin/env bash
# ublk export tests, run inside a qemu VM booting Debian's newest kernel (the host kernel has no
# ublk): golden cases, ext4 mount + e2fsck, kill -9 + user recovery, --metrics counts, for the
# copy and zero-copy data paths; `ota serve --ublk` of an OTA made by `ota generate`. Fails if the VM cannot be set up or booted. Ends with "N passed,
# N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
tgt=${CARGO_TARGET_DIR:-target}
ROOT=$PWD

summary() { echo "$1 passed, $2 failed"; }
die() { echo "ublk-vm: $*"; summary 0 1; exit 1; }

# Two builds: the fault-injection one (the ublk server reads SNAPBLK_UBLK_FAULT only there; kept
# as target/release/snapblk-ublk-faults) for the failure and stop tests, then the normal one.
# Both leave their binary at target/release/snapblk.
if [ -z "${UBLK_VM_NO_BUILD:-}" ]; then
    cargo build --release -q -p snapblk-cli --features ublk-fault-injection ||
        die "build of snapblk with ublk-fault-injection failed"
    cp "$tgt/release/snapblk" "$tgt/release/snapblk-ublk-faults" || die "copy of the fault build failed"
    cargo build --release -q -p snapblk-cli || die "build of snapblk failed"
fi
[ -x "$tgt/release/snapblk" ] || die "$tgt/release/snapblk missing"
[ -x "$tgt/release/snapblk-ublk-faults" ] || die "$tgt/release/snapblk-ublk-faults missing"
bash tests/vm/vm.sh setup || die "VM setup failed (kernel download or initramfs)"

P=$(mktemp -d "${TMPDIR:-/tmp}/snapblk-ublk-vm.XXXXXX")
trap 'rm -rf "$P"' EXIT
mkdir -p "$P/bin" "$P/data"
strip -o "$P/bin/snapblk" "$tgt/release/snapblk" || die "strip failed"
strip -o "$P/bin/snapblk-faults" "$tgt/release/snapblk-ublk-faults" || die "strip failed"
for c in tests/data/aosp-cow/*/; do
    c=${c%/}
    [ -f "$c/target.img" ] || continue
    mkdir -p "$P/data/${c##*/}"
    cp "$c/base.img" "$c/snapshot.cow" "$c/target.img" "$P/data/${c##*/}/"
done
# ext4 snapshot: base = ext4 image of tree A, COW = diff to the ext4 image of tree B (changed,
# added and removed files); the guest mounts the snapshot and compares it with tree B.
mkdir -p "$P/ext4/a/d" "$P/ext4/tree"
for i in $(seq 0 39); do printf 'file %d of tree A\n%0512d\n' "$i" "$i" > "$P/ext4/a/d/f$i"; done
head -c 3000000 /dev/urandom > "$P/ext4/a/blob"
cp -a "$P/ext4/a/." "$P/ext4/tree/"
for i in $(seq 0 39 | awk '$1 % 3 == 0'); do printf 'changed %d\n' "$i" >> "$P/ext4/tree/d/f$i"; done
rm -f "$P/ext4/tree/d/f1" "$P/ext4/tree/d/f2"
head -c 1000000 /dev/urandom > "$P/ext4/tree/new-blob"
mke2fs -q -F -t ext4 -b 4096 -d "$P/ext4/a" "$P/ext4/A.img" 32M || die "mke2fs A"
mke2fs -q -F -t ext4 -b 4096 -d "$P/ext4/tree" "$P/ext4/B.img" 32M || die "mke2fs B"
"$tgt/release/snapblk" cow create --old "$P/ext4/A.img" --new "$P/ext4/B.img" -o "$P/ext4/AB.cow" > /dev/null ||
    die "snapblk cow create (ext4 snapshot) failed"
# The same COW with one REPLACE payload byte flipped (its record beside it): the guest checks
# that the corrupt block is an I/O error through ublk, in copy and zero-copy modes.
python3 - "$P/ext4" "$tgt" <<'PY' || die "corrupt COW for the record test"
import json, shutil, subprocess, sys
d = sys.argv[1]
j = json.loads(subprocess.check_output(
    [sys.argv[2] + "/release/snapblk", "cow", "inspect", "--json", "--ops", f"{d}/AB.cow"]))
op = [o for o in j["ops"] if o["kind"]["type"] == "replace"][0]
data = bytearray(open(f"{d}/AB.cow", "rb").read())
data[op["kind"]["payload"]["offset"] + 5] ^= 0x20
open(f"{d}/bad.cow", "wb").write(data)
shutil.copy(f"{d}/AB.cow.snapblk", f"{d}/bad.cow.snapblk")
open(f"{d}/bad_block", "w").write(str(op["new_block"]))
PY
# An OTA for `ota serve --ublk` (one block device per partition): an incremental payload by
# `snapblk ota generate` from 16 MiB ext4 images of the two trees (system) and a random image with a changed
# quarter (vendor); the guest serves it and compares each device with the new image.
mkdir -p "$P/ota/old" "$P/ota/new"
mke2fs -q -F -t ext4 -b 4096 -d "$P/ext4/a" "$P/ota/old/system.img" 16M || die "mke2fs OTA old"
mke2fs -q -F -t ext4 -b 4096 -d "$P/ext4/tree" "$P/ota/new/system.img" 16M || die "mke2fs OTA new"
head -c 4194304 /dev/urandom > "$P/ota/old/vendor.img"
cp "$P/ota/old/vendor.img" "$P/ota/new/vendor.img"
head -c 1048576 /dev/urandom | dd of="$P/ota/new/vendor.img" bs=1M seek=2 conv=notrunc status=none
"$tgt/release/snapblk" --quiet ota generate --source "$P/ota/old" --target "$P/ota/new" \
    -o "$P/ota/payload.bin" > /dev/null || die "snapblk ota generate failed"
# The same pair as an uncompressed COW without XOR, its record beside it: once a block has passed
# the record check, zero copy reads it straight from the COW file (the guest counts the device
# segments of the plans); B.sha256 is what the device must read.
"$tgt/release/snapblk" cow create --old "$P/ext4/A.img" --new "$P/ext4/B.img" -o "$P/ext4/raw.cow" \
    --no-xor --compression none > /dev/null || die "snapblk cow create (uncompressed ext4 COW) failed"
[ -f "$P/ext4/raw.cow.snapblk" ] || die "cow create wrote no record beside raw.cow"
sha256sum < "$P/ext4/B.img" | cut -d' ' -f1 > "$P/ext4/B.sha256"
rm -rf "$P/ext4/a" "$P/ext4/B.img"
# Fragmented snapshot: every other 4 KiB block of an 8 MiB base zeroed, so a zero-copy read plan
# alternates base and zero segments (128 kernel reads per 512 KiB request). No COW record: the
# planner leaves unverified blocks to the device, and these must be planned.
mkdir -p "$P/frag"
head -c 8388608 /dev/urandom > "$P/frag/base.img"
python3 - "$P/frag" <<'PY' || die "fragmented image"
import sys
d = sys.argv[1]
b = bytearray(open(f"{d}/base.img", "rb").read())
for i in range(1, len(b) // 4096, 2):
    b[i * 4096:(i + 1) * 4096] = bytes(4096)
open(f"{d}/new.img", "wb").write(b)
PY
"$tgt/release/snapblk" cow create --no-record --old "$P/frag/base.img" --new "$P/frag/new.img" \
    -o "$P/frag/frag.cow" > /dev/null || die "snapblk cow create (fragmented snapshot) failed"
cp tests/vm/guest/ublk-tests.sh "$P/run.sh"
cp tests/vm/guest/kernel-reports.sh "$P/"
chmod +x "$P/run.sh"

LOG=${VM_CACHE:-$ROOT/tests/vm/cache}/ublk-vm.log
VM_LOG=$LOG VM_TIMEOUT=${VM_TIMEOUT:-900} bash tests/vm/vm.sh run "$P"
rc=$?
p=$(grep -ac '^PASS:' "$LOG" 2>/dev/null); p=${p:-0}
f=$(grep -ac '^FAIL:' "$LOG" 2>/dev/null); f=${f:-0}
echo
grep -a -E '^(FAIL:|NOTRUN:|DMESG:|KNOWN:)' "$LOG" || true
case $rc in
    0) [ "$p" -gt 0 ] || { echo "guest reported success but ran no test"; f=$((f + 1)); } ;;
    124) echo "VM timed out"; f=$((f + 1)) ;;
    125) echo "VM did not boot or the guest crashed (no result marker)"; f=$((f + 1)) ;;
    *) [ "$f" -gt 0 ] || f=$((f + 1)) ;;
esac
summary "$p" "$f"
[ "$f" -eq 0 ]
