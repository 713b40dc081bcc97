#!/usr/bin/env bash
# Poll queues: the C test tests/c/poll_test.c against snapblk's libblkio.so.1.
# Host: O_DIRECT tmpfs file, ext4 file and loop device have no polling -> supports-poll-queues
# false and blkio_start with num-poll-queues=1 fails with EINVAL "Poll queues not supported".
# VM (tests/vm/vm.sh, Debian's newest kernel): an emulated NVMe disk with nvme.poll_queues=1,
# where the poll queue's I/O must really be polled (no NVMe interrupts), plus a loop device.
# Fails (never skips) if gcc, the build, the VM or its NVMe disk is missing.
# Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
tgt=${CARGO_TARGET_DIR:-target}
ROOT=$PWD

summary() { echo "$1 passed, $2 failed"; }
die() { echo "FAIL: poll-vm: $*"; summary 0 1; exit 1; }

command -v gcc > /dev/null || die "gcc not found (scripts/install-deps.sh installs build-essential)"
command -v losetup > /dev/null || die "losetup not found"
[ -n "${POLL_VM_NO_BUILD:-}" ] || cargo build --release -q -p snapblk-capi || die "cargo build -p snapblk-capi failed"
[ -f "$tgt/release/libblkio.so" ] || die "$tgt/release/libblkio.so missing"

P=$(mktemp -d "${TMPDIR:-/tmp}/snapblk-poll-vm.XXXXXX")
SHM=$(mktemp -d /dev/shm/snapblk-poll.XXXXXX)
DISK=$(mktemp -d /var/tmp/snapblk-poll.XXXXXX)
LOOP=""
cleanup() {
    [ -z "$LOOP" ] || losetup -d "$LOOP"
    rm -rf "$P" "$SHM" "$DISK"
}
trap cleanup EXIT
mkdir -p "$P/bin" "$P/lib"
# The guest gets a stripped copy named by its SONAME; the test finds it via LD_LIBRARY_PATH.
strip -o "$P/lib/libblkio.so.1" "$tgt/release/libblkio.so" || die "strip libblkio.so"
ln -s libblkio.so.1 "$P/lib/libblkio.so"
gcc -std=gnu11 -Wall -Wextra -Werror -O2 -I include tests/c/poll_test.c -L "$P/lib" -lblkio \
    -o "$P/bin/poll_test" || die "gcc tests/c/poll_test.c"

passed=0; failed=0
count() { # $1 = output of a run: add its PASS/FAIL lines
    local p f
    p=$(printf '%s\n' "$1" | grep -ac '^PASS:'); f=$(printf '%s\n' "$1" | grep -ac '^FAIL:')
    passed=$((passed + p)); failed=$((failed + f))
}

# ------------------------------------------------------------------ host
head -c 8M /dev/zero > "$SHM/f"
head -c 8M /dev/zero > "$DISK/f"
LOOP=$(losetup -f --show "$DISK/f") || { LOOP=""; echo "FAIL: host: losetup"; failed=$((failed + 1)); }
for t in "$SHM/f" "$DISK/f" $LOOP; do
    out=$(LD_LIBRARY_PATH="$P/lib" "$P/bin/poll_test" nopoll "$t" 2>&1); rc=$?
    out=$(printf '%s\n' "$out" | sed 's/^\(PASS\|FAIL\): /\1: host: /')
    echo "$out"
    count "$out"
    if [ $rc -ne 0 ] && ! printf '%s\n' "$out" | grep -q '^FAIL:'; then
        echo "FAIL: host: poll_test nopoll $t exited $rc"; failed=$((failed + 1))
    fi
done


# -------------------------------------------------------------------- VM
export VM_MODULES=nvme   # built into Debian's cloud kernel; a module in other flavours
bash tests/vm/vm.sh setup || die "VM setup failed (kernel download or initramfs)"
IMG=$SHM/nvme.img
truncate -s 128M "$IMG"
cp tests/vm/guest/poll-tests.sh "$P/run.sh"
cp tests/vm/guest/kernel-reports.sh "$P/"
chmod +x "$P/run.sh"
LOG=${VM_CACHE:-$ROOT/tests/vm/cache}/poll-vm.log
t0=$(date +%s)
VM_LOG=$LOG VM_APPEND="nvme.poll_queues=1" VM_TIMEOUT=${VM_TIMEOUT:-300} \
    VM_QEMU_ARGS="-drive file=$IMG,if=none,id=nv0,format=raw -device nvme,serial=snapblk,drive=nv0" \
    bash tests/vm/vm.sh run "$P"
rc=$?
echo "VM stage: $(( $(date +%s) - t0 )) s"
p=$(grep -ac '^PASS:' "$LOG" 2>/dev/null); p=${p:-0}
f=$(grep -ac '^FAIL:' "$LOG" 2>/dev/null); f=${f:-0}
echo
grep -a -E '^(FAIL:|INFO:|DMESG:|KNOWN:)' "$LOG" || true
case $rc in
    0) [ "$p" -gt 0 ] || { echo "guest reported success but ran no test"; f=$((f + 1)); } ;;
    124) echo "VM timed out"; f=$((f + 1)) ;;
    125) echo "VM did not boot or the guest crashed (no result marker)"; f=$((f + 1)) ;;
    *) [ "$f" -gt 0 ] || f=$((f + 1)) ;;
esac
passed=$((passed + p)); failed=$((failed + f))
summary "$passed" "$failed"
[ "$failed" -eq 0 ]
