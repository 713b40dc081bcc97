#!/bin/sh
# Guest stage of tests/suites/nvme-vm.sh (runs as /test/run.sh in the VM). Two emulated NVMe
# controllers: serial nvconv (a 64 MiB conventional namespace) and serial nvzns (a 64 MiB
# zoned namespace, 4 MiB zones). Runs the conformance suite on the conventional namespace,
# then the C program tests/c/nvme_test.c against the real libblkio 1.5 (/test/real) and
# snapblk's (/test/lib) on both namespaces. Prints PASS:/FAIL: lines; each C run's output goes
# to /test/out/*.txt lines prefixed "OUT <run>: " for the host to compare.
rc=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; rc=1; }
. "$(dirname "$0")/kernel-reports.sh"
kernel_reports_begin

conv=""; zns=""
for c in /sys/class/nvme/nvme*; do
    [ -e "$c/serial" ] || continue
    s=$(tr -d ' ' < "$c/serial"); n=${c##*/}
    case $s in
        nvconv) conv=$n ;;
        nvzns) zns=$n ;;
    esac
done
echo "INFO: conventional controller: ${conv:-none}, zoned controller: ${zns:-none}"
ls -l /dev/ng* /dev/nvme* 2>&1 | sed 's/^/INFO: /'
if [ -z "$conv" ] || [ ! -c "/dev/ng${conv#nvme}n1" ]; then
    fail "no conventional NVMe namespace character device"
    exit 1
fi
if [ -z "$zns" ] || [ ! -c "/dev/ng${zns#nvme}n1" ]; then
    fail "no zoned NVMe namespace character device"
    exit 1
fi
ng=/dev/ng${conv#nvme}n1; blk=/dev/${conv}n1; ctrl=/dev/$conv
zng=/dev/ng${zns#nvme}n1
pass "namespaces: $ng (conventional), $zng (zoned: $(cat /sys/block/${zns}n1/queue/zoned 2>/dev/null))"

# 1. The conformance suite (destroys the data; the C runs below write what the host checks).
LD_LIBRARY_PATH=/test/lib /test/bin/snapblk-conformance "nvme-io_uring:path=$ng" --allow-destructive \
    > /tmp/conf.txt 2>&1
crc=$?
sed 's/^/  conformance: /' /tmp/conf.txt
p=$(grep -c '^PASS' /tmp/conf.txt); f=$(grep -c '^FAIL' /tmp/conf.txt)
[ "$f" -eq 0 ] && [ "$p" -gt 0 ] && [ $crc -eq 0 ] && pass "snapblk-conformance nvme-io_uring: $p checks pass" ||
    fail "snapblk-conformance nvme-io_uring: $f checks fail (exit $crc)"

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
# (snapblk's poll queue is tested by the conv runs: the boot has nvme.poll_queues=1.)

kernel_reports_check
[ "$KERNEL_REPORTS" -eq 0 ] && pass "no kernel bug, warning or sanitizer report during the tests" ||
    fail "$KERNEL_REPORTS kernel report(s) during the tests (DMESG: lines)"
sync
echo "guest nvme stage done rc=$rc"
exit $rc
