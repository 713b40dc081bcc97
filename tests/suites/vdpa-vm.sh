#!/usr/bin/env bash
# The virtio-blk-vhost-vdpa driver in the VM (tests/vm/vm.sh, Debian's newest kernel): two
# virtio disks, each exported inside the guest by qemu-storage-daemon as a VDUSE block device
# bound to vhost-vdpa (modules vduse, vhost_vdpa; the host's qsd and vdpa binaries are copied
# into the guest). The guest (tests/vm/guest/vdpa-tests.sh) runs snapblk-conformance, the C
# program tests/c/vdpa_test.c against snapblk's libblkio.so.1 and the real libblkio 1.5 (each on
# its own disk), trixie's qemu-io (QEMU 10, which passes the device by fd) on both libraries,
# and tests/c/vdpa_gone.c (`vdpa dev del` and the daemon killed under snapblk).
# Here, after the VM has exited: snapblk must pass every check, every check the real library
# fails must be a documented [fix] (docs/blkio.md), both runs must execute the same checks and
# show the same property values in every state, and both disk images must hold the data the
# program wrote.
# Fails (never skips) if gcc, the build, the real library, qsd, vdpa, the VM or a device is
# missing. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

summary() { echo "$1 passed, $2 failed"; }
die() { echo "FAIL: vdpa-vm: $*"; summary 0 1; exit 1; }

command -v gcc > /dev/null || die "gcc not found (scripts/install-deps.sh installs build-essential)"
QSD=/usr/bin/qemu-storage-daemon
VDPA=$(command -v vdpa || echo /sbin/vdpa)
[ -x "$QSD" ] || die "$QSD not found (scripts/install-deps.sh installs qemu-system-common)"
[ -x "$VDPA" ] || die "vdpa not found (scripts/install-deps.sh installs iproute2)"
[ -n "${VDPA_VM_NO_BUILD:-}" ] || cargo build --release -q -p snapblk-capi -p snapblk-conformance ||
    die "cargo build -p snapblk-capi -p snapblk-conformance failed"
TGT=${CARGO_TARGET_DIR:-$ROOT/target}
[ -f "$TGT/release/libblkio.so" ] || die "$TGT/release/libblkio.so missing"
REAL=$(bash bench/real-libblkio.sh) || die "could not fetch the real libblkio (needs deb.debian.org)"
Q10=$(bash bench/trixie-qemu.sh) || die "could not fetch trixie's qemu-io (needs deb.debian.org)"

P=$(mktemp -d "${TMPDIR:-/tmp}/snapblk-vdpa-vm.XXXXXX")
SHM=$(mktemp -d /dev/shm/snapblk-vdpa.XXXXXX)
cleanup() { rm -rf "$P" "$SHM"; }
trap cleanup EXIT
mkdir -p "$P/bin" "$P/lib" "$P/real"
strip -o "$P/lib/libblkio.so.1" "$TGT/release/libblkio.so" || die "strip libblkio.so"
ln -s libblkio.so.1 "$P/lib/libblkio.so"
cp -L "$REAL/libblkio.so.1" "$P/real/libblkio.so.1" || die "copy the real libblkio"
for t in vdpa_test vdpa_gone; do
    gcc -std=gnu11 -Wall -Wextra -Werror -O2 -I include "tests/c/$t.c" -L "$P/lib" -lblkio \
        -o "$P/bin/$t" || die "gcc tests/c/$t.c"
done
strip -o "$P/bin/snapblk-conformance" "$TGT/release/snapblk-conformance" ||
    die "$TGT/release/snapblk-conformance missing"
# qemu-io with trixie's libraries and loader (not the host's): the libraries, not their
# directories, and of QEMU's modules only the blkio one. Packed in a tar file that the guest
# unpacks, because vm.sh would give every ELF file in the payload the host's libraries (ldd).
mkdir -p "$SHM/trixie/lib" "$SHM/trixie/qemu"
cp "$Q10/usr/bin/qemu-io" "$SHM/trixie/" || die "copy qemu-io"
find "$Q10/usr/lib/x86_64-linux-gnu" -maxdepth 1 \( -type f -o -type l \) -name '*.so*' \
    -exec cp -a {} "$SHM/trixie/lib/" \;
cp "$Q10/usr/lib/x86_64-linux-gnu/qemu/block-blkio.so" "$SHM/trixie/qemu/" || die "copy block-blkio.so"
tar -C "$SHM" -cf "$P/trixie.tar" trixie || die "tar trixie"
rm -rf "$SHM/trixie"
cp "$QSD" "$P/bin/qemu-storage-daemon"
cp "$VDPA" "$P/bin/vdpa"
cp tests/vm/guest/vdpa-tests.sh "$P/run.sh"
cp tests/vm/guest/kernel-reports.sh "$P/"
chmod +x "$P/run.sh"

passed=0; failed=0
ok() { echo "PASS: $*"; passed=$((passed + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

# -------------------------------------------------------------------- VM
export VM_MODULES="virtio_blk vduse vhost_vdpa"
bash tests/vm/vm.sh setup || die "VM setup failed (kernel download or initramfs)"
truncate -s 64M "$SHM/a.img" "$SHM/b.img"
LOG=${VM_CACHE:-$ROOT/tests/vm/cache}/vdpa-vm.log
rm -f "$LOG"   # never read an older run's results
t0=$(date +%s)
VM_LOG=$LOG VM_SMP=${VM_SMP:-2} VM_TIMEOUT=${VM_TIMEOUT:-600} \
    VM_QEMU_ARGS="-drive file=$SHM/a.img,if=none,id=da,format=raw,cache=none,aio=threads
      -device virtio-blk-pci,drive=da,serial=vdpa-a
      -drive file=$SHM/b.img,if=none,id=db,format=raw,cache=none,aio=threads
      -device virtio-blk-pci,drive=db,serial=vdpa-b" \
    bash tests/vm/vm.sh run "$P"
rc=$?
echo "VM stage: $(( $(date +%s) - t0 )) s"
tr -d '\r' < "$LOG" > "$SHM/log"
section() { sed -n "/^BEGIN-$1\$/,/^END-$1\$/p" "$SHM/log"; }
p=$(grep -ac '^PASS:' "$SHM/log"); f=$(grep -ac '^FAIL:' "$SHM/log")
grep -a -E '^(FAIL:|INFO:|DMESG:|KNOWN:)' "$SHM/log" || true
case $rc in
    0) [ "$p" -gt 0 ] || bad "the guest reported success but ran no test" ;;
    124) bad "VM timed out" ;;
    125) bad "VM did not boot or the guest crashed (no result marker)" ;;
    *) [ "$f" -gt 0 ] || bad "the guest failed (rc $rc) without a FAIL line" ;;
esac
passed=$((passed + p)); failed=$((failed + f))

# ------------------------------------------- the C program: snapblk, real, same checks
section SNAPBLK > "$SHM/snap.txt"; section REAL > "$SHM/real.txt"; section GONE > "$SHM/gone.txt"
sed 's/^/  snapblk: /' "$SHM/snap.txt"
np=$(grep -c '^PASS ' "$SHM/snap.txt"); nf=$(grep -c '^FAIL ' "$SHM/snap.txt")
if [ "$nf" -eq 0 ] && [ "$np" -gt 0 ] && grep -q '^EXIT-SNAPBLK 0$' "$SHM/snap.txt"; then
    ok "snapblk passes all $np checks of vdpa_test"
else
    bad "snapblk fails $nf checks of vdpa_test ($np passed)"
fi
echo "== checks the real libblkio 1.5 fails (each must be a documented [fix]):"
while read -r line; do
    echo "  real: $line"
    case "$line" in
        "FAIL [fix] "*) passed=$((passed + 1)) ;;
        *) bad "undocumented difference: $line" ;;
    esac
done < <(grep '^FAIL ' "$SHM/real.txt")
rp=$(grep -c '^PASS ' "$SHM/real.txt")
[ "$rp" -gt 0 ] || bad "the real libblkio ran no check"
names() { grep -E '^(PASS|FAIL) ' "$1" | sed -E 's/^(PASS|FAIL) //; s/ \(line [0-9]+\).*//'; }
if diff <(names "$SHM/real.txt") <(names "$SHM/snap.txt") > "$SHM/names.diff"; then
    ok "both runs executed the same $rp + $(grep -c '^FAIL ' "$SHM/real.txt") checks"
else
    bad "the runs executed different checks:"; sed 's/^/  /' "$SHM/names.diff"
fi
# Every property in every state, compared value by value.
if diff <(grep '^PROP ' "$SHM/real.txt") <(grep '^PROP ' "$SHM/snap.txt") > "$SHM/props.diff"; then
    ok "the same $(grep -c '^PROP ' "$SHM/snap.txt") property values as the real libblkio in every state"
else
    bad "property values differ from the real libblkio (< real, > snapblk):"
    sed 's/^/  /' "$SHM/props.diff"
fi
[ "$(grep -c '^PROP ' "$SHM/snap.txt")" -ge 100 ] || bad "too few PROP lines from snapblk"

# ------------------------------------------------------------ the device going away
sed 's/^/  gone: /' "$SHM/gone.txt"
gp=$(grep -c '^PASS ' "$SHM/gone.txt"); gf=$(grep -c '^FAIL ' "$SHM/gone.txt")
passed=$((passed + gp)); failed=$((failed + gf))
grep -q '^EXIT-GONE 0$' "$SHM/gone.txt" || bad "vdpa_gone did not finish cleanly"

# ---------------------------------------------------- the images, read by the host
check_data() { # $1 image, $2 who wrote it
    if cmp -s <(head -c 65536 "$1") <(head -c 65536 /dev/zero | tr '\0' '\253') &&
       cmp -s <(tail -c +1048577 "$1" | head -c 65536) <(head -c 65536 /dev/zero | tr '\0' '\134'); then
        ok "host: $2's data (0xab at 0, 0x5c at 1 MiB) is in the image"
    else
        bad "host: the image does not hold $2's data"
    fi
}
check_data "$SHM/a.img" snapblk
check_data "$SHM/b.img" "the real libblkio"
check_qemu() { # $1 image, $2 library: what qemu-io wrote at 32, 33 and 35 MiB
    if cmp -s <(tail -c +$((32 * 1048576 + 1)) "$1" | head -c 65536) <(head -c 65536 /dev/zero | tr '\0' '\315') &&
       cmp -s <(tail -c +$((33 * 1048576 + 1)) "$1" | head -c 65536) <(head -c 65536 /dev/zero) &&
       cmp -s <(tail -c +$((35 * 1048576 + 1)) "$1" | head -c 8192) <(head -c 8192 /dev/zero | tr '\0' '\316'); then
        ok "host: qemu-io's data on $2 (0xcd at 32 MiB, zeros at 33 MiB, 0xce at 35 MiB) is in the image"
    else
        bad "host: the image does not hold qemu-io's data on $2"
    fi
}
check_qemu "$SHM/a.img" snapblk
check_qemu "$SHM/b.img" "the real libblkio"
summary "$passed" "$failed"
[ "$failed" -eq 0 ]
