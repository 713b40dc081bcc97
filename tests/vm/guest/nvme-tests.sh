#!/bin/sh
# Guest stage of tests/suites/nvme-vm.sh (runs as /test/run.sh in the VM). Three emulated NVMe
# controllers: serial nvconv (a 64 MiB conventional namespace), serial nvzns (a 64 MiB zoned
# namespace, 4 MiB zones) and serial nvmore (namespace 1 with 8 bytes of metadata per block,
# namespace 2 of 8 MiB in 4 KiB blocks). Runs the conformance suite on the conventional and the
# 4 KiB namespaces, then the C program tests/c/nvme_test.c against the real libblkio 1.5
# (/test/real) and snapblk's (/test/lib) on every namespace. Prints PASS:/FAIL: lines; each C run's output goes
# to /test/out/*.txt lines prefixed "OUT <run>: " for the host to compare.
rc=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; rc=1; }
. "$(dirname "$0")/kernel-reports.sh"
kernel_reports_begin

# The NVMe driver probes and scans asynchronously: init may run before all four namespaces
# exist. Wait for them (at most 30 s); the checks below name what is missing.
t0=$(cut -d' ' -f1 /proc/uptime)
i=0
# Namespaces only: nvme0n1, not a multipath path device (nvme0c0n1).
while [ "$(ls /sys/block | grep -c '^nvme[0-9]*n[0-9]*$')" -lt 4 ] && [ $i -lt 300 ]; do
    sleep 0.1; i=$((i + 1))
done
echo "INFO: waited $(awk "BEGIN{print $(cut -d' ' -f1 /proc/uptime) - $t0}") s for 4 NVMe namespaces"

conv=""; zns=""; more=""
for c in /sys/class/nvme/nvme*; do
    [ -e "$c/serial" ] || continue
    s=$(tr -d ' ' < "$c/serial"); n=${c##*/}
    case $s in
        nvconv) conv=$n ;;
        nvzns) zns=$n ;;
        nvmore) more=$n ;;
    esac
done
echo "INFO: conventional controller: ${conv:-none}, zoned controller: ${zns:-none}, third controller: ${more:-none}"
ls -l /dev/ng* /dev/nvme* 2>&1 | sed 's/^/INFO: /'
if [ -z "$conv" ] || [ ! -c "/dev/ng${conv#nvme}n1" ]; then
    fail "no conventional NVMe namespace character device"
    exit 1
fi
if [ -z "$zns" ] || [ ! -c "/dev/ng${zns#nvme}n1" ]; then
    fail "no zoned NVMe namespace character device"
    exit 1
fi
# The third controller's namespaces by NSID (1: metadata, 2: 4 KiB blocks): the kernel numbers
# its devices in the order it finds them, which need not be the NSID order.
find_more() {
    more=""; mng=""; k4ng=""
    for c in /sys/class/nvme/nvme*; do
        [ "$(tr -d ' ' < "$c/serial" 2>/dev/null)" = nvmore ] && more=${c##*/}
    done
    for d in /sys/block/${more:-none}n*; do
        [ -e "$d/nsid" ] || continue
        case $(cat "$d/nsid") in
            1) mng=/dev/ng${d##*/nvme} ;;
            2) k4ng=/dev/ng${d##*/nvme} ;;
        esac
    done
}
find_more
if [ ! -c "$mng" ] || [ ! -c "$k4ng" ]; then
    fail "no metadata / 4 KiB-block NVMe namespace character devices ('$mng', '$k4ng')"
    exit 1
fi
ng=/dev/ng${conv#nvme}n1; blk=/dev/${conv}n1; ctrl=/dev/$conv
zng=/dev/ng${zns#nvme}n1
pass "namespaces: $ng (conventional), $zng (zoned: $(cat /sys/block/${zns}n1/queue/zoned 2>/dev/null)), $mng (metadata), $k4ng (4 KiB blocks)"

# 1. The conformance suite (destroys the data; the C runs below write what the host checks).
LD_LIBRARY_PATH=/test/lib /test/bin/snapblk-conformance "nvme-io_uring:path=$ng" --allow-destructive \
    > /tmp/conf.txt 2>&1
crc=$?
sed 's/^/  conformance: /' /tmp/conf.txt
p=$(grep -c '^PASS' /tmp/conf.txt); f=$(grep -c '^FAIL' /tmp/conf.txt)
[ "$f" -eq 0 ] && [ "$p" -gt 0 ] && [ $crc -eq 0 ] && pass "snapblk-conformance nvme-io_uring: $p checks pass" ||
    fail "snapblk-conformance nvme-io_uring: $f checks fail (exit $crc)"
# ... and on the namespace of 4 KiB blocks (the C runs below write at 1 MiB and 2 MiB of it).
LD_LIBRARY_PATH=/test/lib /test/bin/snapblk-conformance "nvme-io_uring:path=$k4ng" --allow-destructive \
    > /tmp/conf4k.txt 2>&1
crc=$?
sed 's/^/  conformance 4k: /' /tmp/conf4k.txt
p=$(grep -c '^PASS' /tmp/conf4k.txt); f=$(grep -c '^FAIL' /tmp/conf4k.txt)
[ "$f" -eq 0 ] && [ "$p" -gt 0 ] && [ $crc -eq 0 ] && pass "snapblk-conformance nvme-io_uring, 4 KiB blocks: $p checks pass" ||
    fail "snapblk-conformance nvme-io_uring, 4 KiB blocks: $f checks fail (exit $crc)"

# 2. The C program, real libblkio then snapblk, in the same boot.
mkdir -p /test/out
run() { # $1 = name, $2 = library dir, rest = arguments
    name=$1; lib=$2; shift 2
    LD_LIBRARY_PATH=$lib /test/bin/nvme_test "$@" > "/test/out/$name.txt" 2>&1
    echo "rc=$?" >> "/test/out/$name.txt"
    sed "s/^/OUT $name: /" "/test/out/$name.txt"
}
run real-conv /test/real conv "$ng" "$blk" "$ctrl" 0
run snap-conv /test/lib conv "$ng" "$blk" "$ctrl" 1
run real-zns /test/real zns "$zng" 1
run snap-zns /test/lib zns "$zng" 2
run real-meta /test/real meta "$mng"
run snap-meta /test/lib meta "$mng"
run real-lba4k /test/real lba4k "$k4ng" 0
run snap-lba4k /test/lib lba4k "$k4ng" 1
# 3. A caller without CAP_SYS_ADMIN (since Linux 6.2 it may send Identify CNS 0, 1, 5, 6 and 8
# only): the namespaces made rw for everyone, tests/c/nvme_unpriv.c drops to uid 1000.
chmod 755 /test /test/bin /test/lib; chmod -R a+rX /test/bin /test/lib
chmod 666 "$zng" "$ng"
echo "INFO: kernel $(uname -r)"
for u in "$zng:2" "$ng:0"; do
    dev=${u%:*}; want=${u##*:}
    out=$(LD_LIBRARY_PATH=/test/lib /test/bin/nvme_unpriv "$dev" 1000 2>&1); urc=$?
    echo "$out" | sed 's/^/INFO: unprivileged: /'
    if [ $urc -eq 0 ] && echo "$out" | grep -qx "zoned=$want" && echo "$out" | grep -qx "uid=1000 euid=1000"; then
        pass "unprivileged caller (uid 1000): $dev connects with zoned=$want and reads"
    else
        fail "unprivileged caller (uid 1000) on $dev: want zoned=$want and a read (exit $urc)"
    fi
done
chmod 600 "$zng" "$ng"
# 4. The third controller disappears under each library (PCI remove), and comes back between
# the two runs (PCI rescan).
pci=$(readlink -f "/sys/class/nvme/$more/device")
run real-gone /test/real gone "$k4ng" "$pci" 0
echo 1 > /sys/bus/pci/rescan
i=0
while i=$((i + 1)) && [ $i -le 100 ]; do
    find_more
    [ -c "$k4ng" ] && break
    sleep 0.1
done
if [ -c "$k4ng" ]; then
    pass "the removed controller is back after a PCI rescan ($k4ng)"
else
    fail "the removed controller did not come back after a PCI rescan"
fi
pci=$(readlink -f "/sys/class/nvme/$more/device")
run snap-gone /test/lib gone "$k4ng" "$pci" 1
# (snapblk's poll queue is tested by the conv runs: the boot has nvme.poll_queues=1.)

kernel_reports_check
[ "$KERNEL_REPORTS" -eq 0 ] && pass "no kernel bug, warning or sanitizer report during the tests" ||
    fail "$KERNEL_REPORTS kernel report(s) during the tests (DMESG: lines)"
sync
echo "guest nvme stage done rc=$rc"
exit $rc
