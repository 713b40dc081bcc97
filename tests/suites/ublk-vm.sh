#!/usr/bin/env bash
# ublk export tests, run inside a qemu VM booting Debian's newest kernel (the host kernel has no
# ublk): golden cases, ext4 mount + e2fsck, kill -9 + user recovery, for the copy and zero-copy
# data paths. Fails if the VM cannot be set up or booted. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

summary() { echo "$1 passed, $2 failed"; }
die() { echo "ublk-vm: $*"; summary 0 1; exit 1; }

cargo build --release -q -p snapblk-cli || die "build of snapblk failed"
bash tests/vm/vm.sh setup || die "VM setup failed (kernel download or initramfs)"

P=$(mktemp -d "${TMPDIR:-/tmp}/snapblk-ublk-vm.XXXXXX")
trap 'rm -rf "$P"' EXIT
mkdir -p "$P/bin" "$P/data"
cp target/release/snapblk "$P/bin/"
for c in tests/data/aosp-cow/*/; do
    c=${c%/}
    [ -f "$c/target.img" ] || continue
    mkdir -p "$P/data/${c##*/}"
    cp "$c/base.img" "$c/snapshot.cow" "$c/target.img" "$P/data/${c##*/}/"
done
cp tests/vm/guest/ublk-tests.sh "$P/run.sh"
chmod +x "$P/run.sh"

VM_TIMEOUT=${VM_TIMEOUT:-900} bash tests/vm/vm.sh run "$P"
rc=$?
LOG=tests/vm/cache/last-run.log
p=$(grep -ac '^PASS:' "$LOG" 2>/dev/null || echo 0)
f=$(grep -ac '^FAIL:' "$LOG" 2>/dev/null || echo 0)
echo
grep -a -E '^(FAIL:|NOTRUN:|DMESG:)' "$LOG" || true
case $rc in
    0) [ "$p" -gt 0 ] || { echo "guest reported success but ran no test"; f=$((f + 1)); } ;;
    124) echo "VM timed out"; f=$((f + 1)) ;;
    125) echo "VM did not boot or the guest crashed (no result marker)"; f=$((f + 1)) ;;
    *) [ "$f" -gt 0 ] || f=$((f + 1)) ;;
esac
summary "$p" "$f"
[ "$f" -eq 0 ]
