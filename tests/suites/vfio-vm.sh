#!/usr/bin/env bash
# The virtio-blk-vfio-pci driver in a VM (tests/vm/vm.sh, Debian's newest kernel, TCG): q35 with
# an intel-iommu (intremap=off, the guest boots with intel_iommu=on) and emulated
# virtio-blk-pci devices bound to vfio-pci in the guest (tests/vm/guest/vfio-tests.sh):
#  1. the conformance suite (snapblk-conformance --allow-destructive) on device A, and on
#     device E, which offers packed rings (packed=on), with snapblk's C test after it (and the
#     real library's on G, packed too); a device with one MSI-X vector shared by two queues
#     (F, also the C program's shared-vector checks on both libraries); a device without MSI-X
#     (K: poll queues only); a read-only device (H);
#     two devices behind a PCI bridge, so in one IOMMU group (I, J); at the end F is removed
#     and H unbound while an instance reads on them (requests fail, destroy returns);
#  2. tests/c/vfio_test.c against snapblk's libblkio.so.1 (device A) and the real libblkio 1.5
#     (device B, bench/real-libblkio.sh) in the same boot: snapblk passes everything, every
#     check the real library fails is a documented [fix], both run the same checks;
#  3. bad input: a path that is no PCI device, a PCI device that is no virtio-blk, a device not
#     bound to vfio-pci, a legacy-only device, a device without ACCESS_PLATFORM, a device whose
#     IOMMU group has a device bound to another driver;
#  4. after the VM exits, this host checks images A, B, E and G for the data the C program wrote.
# Fails (never skips) if gcc, the build, the real library, the VM or a device is missing.
# Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

summary() { echo "$1 passed, $2 failed"; }
die() { echo "FAIL: vfio-vm: $*"; summary 0 1; exit 1; }

command -v gcc > /dev/null || die "gcc not found (scripts/install-deps.sh installs build-essential)"
TGT=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${VFIO_VM_NO_BUILD:-}" ]; then
    cargo build --release -q -p snapblk-capi -p snapblk-conformance || die "cargo build failed"
fi
[ -f "$TGT/release/libblkio.so" ] || die "$TGT/release/libblkio.so missing"
[ -f "$TGT/release/snapblk-conformance" ] || die "$TGT/release/snapblk-conformance missing"
REAL=$(bash bench/real-libblkio.sh) || die "could not fetch the real libblkio (needs deb.debian.org)"

P=$(mktemp -d "${TMPDIR:-/tmp}/snapblk-vfio-vm.XXXXXX")
IMG=$(mktemp -d /dev/shm/snapblk-vfio.XXXXXX)
cleanup() { rm -rf "$P" "$IMG"; }
trap cleanup EXIT
mkdir -p "$P/bin" "$P/snap" "$P/real"
# Stripped copies named by their SONAME; the program finds one or the other via
# LD_LIBRARY_PATH. Executable, so that vm.sh copies the libraries they need into the guest.
strip -o "$P/snap/libblkio.so.1" "$TGT/release/libblkio.so" || die "strip libblkio.so"
ln -s libblkio.so.1 "$P/snap/libblkio.so"
cp "$REAL/libblkio.so.1" "$P/real/libblkio.so.1" || die "copy of the real libblkio"
chmod +x "$P/snap/libblkio.so.1" "$P/real/libblkio.so.1"
strip -o "$P/bin/snapblk-conformance" "$TGT/release/snapblk-conformance" || die "strip conformance"
gcc -std=gnu11 -Wall -Wextra -Werror -O2 -I include tests/c/vfio_test.c -L "$P/snap" -lblkio \
    -o "$P/bin/vfio_test" || die "gcc tests/c/vfio_test.c"
cp tests/vm/guest/vfio-tests.sh "$P/run.sh"
cp tests/vm/guest/kernel-reports.sh "$P/"
chmod +x "$P/run.sh"
for i in A B E G; do truncate -s 64M "$IMG/$i.img"; done
for i in C D F H I J K; do truncate -s 1M "$IMG/$i.img"; done

export VM_MODULES="vfio_pci vfio_iommu_type1"
bash tests/vm/vm.sh setup || die "VM setup failed (kernel download or initramfs)"
LOG=${VM_CACHE:-$ROOT/tests/vm/cache}/vfio-vm.log
blk() { # $1 = image letter, $2 = PCI slot, $3 = extra virtio-blk-pci options, $4 = drive options
    echo "-drive file=$IMG/$1.img,if=none,id=vb$1,format=raw${4:-}" \
        "-device virtio-blk-pci,drive=vb$1,addr=$2$3"
}
ARGS="-machine q35 -device intel-iommu,intremap=off \
 $(blk A 0x10 ,iommu_platform=on,disable-legacy=on,num-queues=2) \
 $(blk B 0x11 ,iommu_platform=on,disable-legacy=on,num-queues=2) \
 $(blk C 0x12 ,disable-modern=on,disable-legacy=off) \
 $(blk D 0x13 ,disable-legacy=on) \
 $(blk E 0x14 ,iommu_platform=on,disable-legacy=on,num-queues=2,packed=on) \
 $(blk F 0x15 ,iommu_platform=on,disable-legacy=on,num-queues=2,vectors=1) \
 $(blk G 0x16 ,iommu_platform=on,disable-legacy=on,num-queues=2,packed=on) \
 $(blk H 0x17 ,iommu_platform=on,disable-legacy=on ,readonly=on) \
 $(blk K 0x19 ,iommu_platform=on,disable-legacy=on,vectors=0) \
 -device pcie-pci-bridge,id=br0,bus=pcie.0,addr=0x18 \
 $(blk I 0x1 ,iommu_platform=on,disable-legacy=on,bus=br0) \
 $(blk J 0x2 ,iommu_platform=on,disable-legacy=on,bus=br0)"
t0=$(date +%s)
VM_LOG=$LOG VM_SMP=1 VM_MEM=1G VM_APPEND="intel_iommu=on" VM_TIMEOUT=${VM_TIMEOUT:-600} \
    VM_QEMU_ARGS="$ARGS" bash tests/vm/vm.sh run "$P"
rc=$?
echo "VM stage: $(( $(date +%s) - t0 )) s"
p=$(grep -ac '^PASS:' "$LOG" 2>/dev/null); p=${p:-0}
f=$(grep -ac '^FAIL:' "$LOG" 2>/dev/null); f=${f:-0}
echo
grep -a -E '^(FAIL:|DMESG:|KNOWN:)' "$LOG" || true
case $rc in
    0) [ "$p" -gt 0 ] || { echo "guest reported success but ran no test"; f=$((f + 1)); } ;;
    124) echo "VM timed out"; f=$((f + 1)) ;;
    125) echo "VM did not boot or the guest crashed (no result marker)"; f=$((f + 1)) ;;
    *) [ "$f" -gt 0 ] || f=$((f + 1)) ;;
esac

# The data the C program left on each device, read here from the raw images: 64 KiB of 0xab at
# 0 and 64 KiB of 0x5c at 1 MiB.
for i in A B E G; do
    case $i in
        A) who=snapblk ;; B) who="real libblkio" ;;
        E) who="snapblk (packed rings)" ;; G) who="real libblkio (packed rings)" ;;
    esac
    if cmp -s <(head -c 65536 "$IMG/$i.img") <(head -c 65536 /dev/zero | tr '\0' '\253') &&
        cmp -s <(tail -c +1048577 "$IMG/$i.img" | head -c 65536) <(head -c 65536 /dev/zero | tr '\0' '\134'); then
        echo "PASS: host: image $i holds the data $who wrote"; p=$((p + 1))
    else
        echo "FAIL: host: image $i does not hold the data $who wrote"; f=$((f + 1))
    fi
done
summary "$p" "$f"
[ "$f" -eq 0 ]
