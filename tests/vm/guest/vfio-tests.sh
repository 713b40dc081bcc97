#!/bin/sh
# Guest stage of tests/suites/vfio-vm.sh (runs as /test/run.sh in the VM): q35 with an
# intel-iommu and four virtio-blk-pci devices:
#   00:10.0  A: modern, iommu_platform=on, num-queues=2, 64 MiB  (snapblk: conformance + C test)
#   00:11.0  B: the same                                          (real libblkio 1.5: C test)
#   00:12.0  C: legacy only (disable-modern=on)                   (bad input)
#   00:13.0  D: modern without iommu_platform                     (bad input)
#   00:14.0  E: as A, with packed=on (packed rings)               (snapblk: conformance + C test)
#   00:15.0  F: as A, with one MSI-X vector (vectors=1), 1 MiB    (a shared vector; removed)
#   00:16.0  G: as E                                              (real libblkio: C test)
#   00:17.0  H: modern, iommu_platform=on, read-only drive, 1 MiB (read-only rules; unbound)
#   00:19.0  K: modern, iommu_platform=on, no MSI-X (vectors=0)   (poll queues only)
#   I and J: modern, iommu_platform=on, behind a pcie-pci-bridge at 00:18.0, so in one IOMMU
#            group; only I is bound to vfio-pci                  (group not viable)
# Binds them to vfio-pci, runs the conformance suite and the C differential program
# (tests/c/vfio_test.c) and the bad-input connects. Prints PASS:/FAIL:/INFO: lines; exit status
# non-zero if anything failed. The host checks the images after the VM exits.
rc=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; rc=1; }
. "$(dirname "$0")/kernel-reports.sh"
kernel_reports_begin
S=/sys/bus/pci/devices
A=0000:00:10.0 B=0000:00:11.0 C=0000:00:12.0 D=0000:00:13.0 E=0000:00:14.0 F=0000:00:15.0
G=0000:00:16.0 H=0000:00:17.0 K=0000:00:19.0
for d in $A $B $C $D $E $F $G $H $K; do
    if [ -d $S/$d ]; then
        echo "INFO: $d $(cat $S/$d/vendor):$(cat $S/$d/device) group $(basename "$(readlink $S/$d/iommu_group)")"
    else
        fail "no PCI device $d (devices: $(ls $S | tr '\n' ' '))"
    fi
done
for d in $A $B $E $F $G $H $K; do [ -d $S/$d ] || exit 1; done

# Bad input that needs no binding: a directory that is no PCI device, a PCI device that is no
# virtio-blk (the host bridge), a virtio-blk device still bound to virtio-pci.
bad() { # $1 = label, $2 = path, $3 = errno (negative), $4 = text the message must contain,
        # $5 = "fix" when the real library connects (a documented difference)
    out=$(LD_LIBRARY_PATH=/test/snap /test/bin/vfio_test bad "$2" 2>&1)
    real=$(LD_LIBRARY_PATH=/test/real /test/bin/vfio_test bad "$2" 2>&1)
    echo "INFO: bad input $1: snapblk: $out"
    echo "INFO: bad input $1: real libblkio: $real"
    case "$out" in
        "connect rc=$3 msg="*"$4"*) pass "bad input $1: connect fails with $3 naming it" ;;
        *) fail "bad input $1: want rc=$3 and '$4', got: $out" ;;
    esac
    case "${5:-}:$real" in
        ":connect rc=-"*) pass "bad input $1: real libblkio fails too" ;;
        "fix:connect rc=0 "*) pass "bad input $1: real libblkio connects (a documented [fix])" ;;
        *) fail "bad input $1: real libblkio: $real" ;;
    esac
}
bad "not a PCI device" /tmp -2 "is not a PCI device"
bad "not virtio-blk" $S/0000:00:00.0 -95 "is not a virtio-blk device (vendor:device 8086:"
g=$(basename "$(readlink $S/$A/iommu_group)")
bad "not bound to vfio-pci" $S/$A -2 "opening /dev/vfio/$g"

echo Y > /sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts
for d in $A $B $C $D $E $F $G $H $K; do
    [ -d $S/$d ] || continue
    echo vfio-pci > $S/$d/driver_override
    [ -e $S/$d/driver ] && echo $d > $S/$d/driver/unbind
    echo $d > /sys/bus/pci/drivers_probe
    drv=$(basename "$(readlink $S/$d/driver)" 2>/dev/null)
    [ "$drv" = vfio-pci ] && pass "$d bound to vfio-pci" || fail "$d bound to '$drv', not vfio-pci"
done
ls -l /dev/vfio | sed 's/^/INFO: /'

# A group with a device still bound to another driver is not viable.
I=$(ls -d $S/0000:01:01.0 2>/dev/null) J=$(ls -d $S/0000:01:02.0 2>/dev/null)
if [ -n "$I" ] && [ -n "$J" ]; then
    echo "INFO: bridged devices: $(basename "$(readlink $I/iommu_group)") and $(basename "$(readlink $J/iommu_group)") groups, drivers $(basename "$(readlink $I/driver)") $(basename "$(readlink $J/driver)")"
    echo vfio-pci > $I/driver_override
    [ -e $I/driver ] && basename $I > $I/driver/unbind
    basename $I > /sys/bus/pci/drivers_probe
    gi=$(basename "$(readlink $I/iommu_group)")
    bad "group not viable" $I -5 "IOMMU group $gi is not viable"
else
    fail "no devices behind the PCI bridge (devices: $(ls $S | tr '\n' ' '))"
fi

[ -d $S/$C ] && bad "legacy-only device" $S/$C -5 "no virtio-pci common configuration capability (is this a legacy device?)"
[ -d $S/$D ] && bad "no ACCESS_PLATFORM" $S/$D -22 "does not offer VIRTIO_F_ACCESS_PLATFORM" fix

# 1. The conformance suite on A (split rings) and E (packed rings).
for d in $A $E; do
    t0=$(cut -d' ' -f1 /proc/uptime)
    /test/bin/snapblk-conformance "virtio-blk-vfio-pci:path=$S/$d" --allow-destructive > /tmp/conf.txt 2>&1
    crc=$?
    echo "INFO: conformance on $d took $(awk "BEGIN{print $(cut -d' ' -f1 /proc/uptime) - $t0}") s"
    sed "s/^/INFO: conformance $d: /" /tmp/conf.txt
    [ $crc -eq 0 ] && pass "conformance suite on $d (exit 0)" || fail "conformance suite on $d exited $crc"
    grep -q '^PASS' /tmp/conf.txt && pass "conformance ran checks on $d" || fail "conformance ran no check on $d"
done
# Small rings: 128 entries (a 64-iovec request needs 66) for the suite's 200 requests in flight,
# so requests wait for descriptors and both ring layouts wrap many times.
for d in $A $E; do
    /test/bin/snapblk-conformance "virtio-blk-vfio-pci:path=$S/$d,queue-size=128" --allow-destructive > /tmp/conf.txt 2>&1
    crc=$?
    grep -E '^(FAIL|[0-9]+ passed)' /tmp/conf.txt | sed "s/^/INFO: conformance $d queue-size=128: /"
    [ $crc -eq 0 ] && pass "conformance suite on $d with queue-size=128" ||
        fail "conformance suite on $d with queue-size=128 exited $crc"
done
# A queue larger than the device's (QEMU: 256) is refused at start, not written to the device.
out=$(/test/bin/snapblk-conformance "virtio-blk-vfio-pci:path=$S/$A,queue-size=512,num-queues=1" --allow-destructive 2>&1)
echo "INFO: queue-size 512: $out"
case "$out" in
    *"queue-size 512 is larger than the device's maximum of 256"*) pass "queue-size 512 refused at start" ;;
    *) fail "queue-size 512: $out" ;;
esac
# One MSI-X vector, shared: two regular queues (the suite reads on queue 1 from another thread
# while queue 0 runs the rest), and one queue + one poll queue (which needs no vector).
/test/bin/snapblk-conformance "virtio-blk-vfio-pci:path=$S/$F,num-queues=2" --allow-destructive > /tmp/conf.txt 2>&1 &&
    pass "conformance on the one-vector device with 2 queues sharing the vector" ||
    { fail "conformance on the one-vector device with 2 queues sharing the vector"; sed 's/^/INFO: /' /tmp/conf.txt; }
grep -E '^(FAIL|[0-9]+ passed)|queue' /tmp/conf.txt | sed 's/^/INFO: one vector, 2 queues: /'
/test/bin/snapblk-conformance "virtio-blk-vfio-pci:path=$S/$F,num-queues=1,num-poll-queues=1" --allow-destructive > /tmp/conf.txt 2>&1 &&
    pass "conformance on the one-vector device with 1 queue + 1 poll queue" ||
    { fail "conformance on the one-vector device with 1 queue + 1 poll queue"; sed 's/^/INFO: /' /tmp/conf.txt; }
# The C program's shared-vector checks, snapblk then the real libblkio (which needs one vector
# per queue: its failures must be documented [fix] checks, and both run the same checks).
LD_LIBRARY_PATH=/test/snap timeout 120 /test/bin/vfio_test shared $S/$F > /tmp/shs.txt 2>&1
shs=$?
LD_LIBRARY_PATH=/test/real timeout 120 /test/bin/vfio_test shared $S/$F > /tmp/shr.txt 2>&1
echo "INFO: real libblkio shared-vector run exited $?"
sed 's/^/INFO: snapblk shared: /' /tmp/shs.txt
sed 's/^/INFO: real shared: /' /tmp/shr.txt
if [ $shs -eq 0 ] && ! grep -q '^FAIL' /tmp/shs.txt && grep -q '^PASS' /tmp/shs.txt; then
    pass "snapblk passes the shared-vector checks of vfio_test ($(grep -c '^PASS' /tmp/shs.txt))"
else
    fail "snapblk: shared-vector vfio_test exited $shs"
fi
grep '^FAIL' /tmp/shr.txt | while IFS= read -r line; do
    case "$line" in
        "FAIL [fix] "*) echo "PASS: real libblkio (one vector) fails a documented [fix]: ${line#FAIL }" ;;
        *) echo "FAIL: undocumented difference: real libblkio (one vector): $line" ;;
    esac
done
# No MSI-X at all: a regular queue is refused at start, naming why; poll queues work.
out=$(/test/bin/snapblk-conformance "virtio-blk-vfio-pci:path=$S/$K,num-queues=1" --allow-destructive 2>&1)
echo "INFO: no MSI-X, 1 queue: $out"
case "$out" in
    *"the device has no MSI-X vector: only poll queues (num-queues=0) are possible"*)
        pass "a regular queue on a device without MSI-X is refused at start" ;;
    *) fail "no MSI-X, 1 queue: $out" ;;
esac
out=$(LD_LIBRARY_PATH=/test/snap timeout 60 /test/bin/vfio_test pollonly $S/$K 2>&1)
echo "INFO: no MSI-X, 1 poll queue: $out"
case "$out" in
    "pollonly: write ret=0 read ret=0 data same") pass "a poll queue on the device without MSI-X writes and reads back" ;;
    *) fail "no MSI-X, 1 poll queue: $out" ;;
esac
# A read-only device (VIRTIO_BLK_F_RO): read-only=false is refused at start with EROFS, a
# read-only instance passes the read checks and has its writes refused.
out=$(/test/bin/snapblk-conformance "virtio-blk-vfio-pci:path=$S/$H,num-queues=1" --allow-destructive 2>&1)
echo "INFO: read-only device, read-only=false: $out"
case "$out" in
    *"cannot start"*"Device is read-only"*) pass "a read-only device with read-only=false is refused at start" ;;
    *) fail "read-only device with read-only=false: $out" ;;
esac
/test/bin/snapblk-conformance "virtio-blk-vfio-pci:path=$S/$H" > /tmp/conf.txt 2>&1 &&
    pass "read-only conformance run on the read-only device" ||
    { fail "read-only conformance run on the read-only device"; sed 's/^/INFO: /' /tmp/conf.txt; }
# snapblk's C test on the packed-ring device (the differential run below uses A and B).
LD_LIBRARY_PATH=/test/snap timeout 300 /test/bin/vfio_test $S/$E > /tmp/packed.txt 2>&1
prc=$?
sed 's/^/INFO: snapblk packed: /' /tmp/packed.txt
if [ $prc -eq 0 ] && ! grep -q '^FAIL' /tmp/packed.txt && grep -q '^PASS' /tmp/packed.txt; then
    pass "snapblk passes vfio_test on $E (packed rings)"
else
    fail "snapblk: vfio_test on $E (packed rings) exited $prc"
    grep '^FAIL' /tmp/packed.txt | sed 's/^/FAIL: snapblk packed: /'
fi

# 2. The C differential program: snapblk on A, the real libblkio on B.
LD_LIBRARY_PATH=/test/snap timeout 300 /test/bin/vfio_test $S/$A > /tmp/snap.txt 2>&1
src=$?
LD_LIBRARY_PATH=/test/real timeout 300 /test/bin/vfio_test $S/$B > /tmp/real.txt 2>&1
rrc=$?
sed 's/^/INFO: snapblk: /' /tmp/snap.txt
sed 's/^/INFO: real: /' /tmp/real.txt
ns_fail=$(grep -c '^FAIL' /tmp/snap.txt)
ns_pass=$(grep -c '^PASS' /tmp/snap.txt)
if [ "$src" -eq 0 ] && [ "$ns_fail" -eq 0 ] && [ "$ns_pass" -gt 0 ]; then
    pass "snapblk passes all $ns_pass checks of vfio_test"
else
    fail "snapblk: vfio_test exited $src with $ns_fail failed checks"
    grep '^FAIL' /tmp/snap.txt | sed 's/^/FAIL: snapblk: /'
fi
echo "INFO: real libblkio exited $rrc and passes $(grep -c '^PASS' /tmp/real.txt) checks"
grep '^FAIL' /tmp/real.txt | while IFS= read -r line; do
    case "$line" in
        "FAIL [fix] "*) echo "PASS: real libblkio fails a documented [fix]: ${line#FAIL }" ;;
        *) echo "FAIL: undocumented difference: real libblkio: $line" ;;
    esac
done
# The real library on the packed-ring device G, compared with snapblk's run on E.
LD_LIBRARY_PATH=/test/real timeout 300 /test/bin/vfio_test $S/$G > /tmp/realp.txt 2>&1
echo "INFO: real libblkio on $G (packed rings) exited $? and passes $(grep -c '^PASS' /tmp/realp.txt) checks"
grep '^FAIL' /tmp/realp.txt | while IFS= read -r line; do
    case "$line" in
        "FAIL [fix] "*) echo "PASS: real libblkio (packed) fails a documented [fix]: ${line#FAIL }" ;;
        *) echo "FAIL: undocumented difference: real libblkio (packed): $line" ;;
    esac
done
norm() { grep -E '^(PASS|FAIL)' "$1" | sed -E 's/^(PASS|FAIL) //; s/ \(line [0-9]+\).*//'; }
norm /tmp/realp.txt > /tmp/realp.n
norm /tmp/packed.txt > /tmp/packed.n
if [ -s /tmp/packed.n ] && cmp -s /tmp/realp.n /tmp/packed.n; then
    pass "both libraries executed the same $(wc -l < /tmp/packed.n) checks on packed rings"
else
    fail "the packed-ring runs executed different checks"
    diff /tmp/realp.n /tmp/packed.n | sed 's/^/INFO: diff: /'
fi
norm /tmp/shr.txt > /tmp/shr.n
norm /tmp/shs.txt > /tmp/shs.n
if [ -s /tmp/shs.n ] && cmp -s /tmp/shr.n /tmp/shs.n; then
    pass "both libraries executed the same $(wc -l < /tmp/shs.n) shared-vector checks"
else
    fail "the shared-vector runs executed different checks"
    diff /tmp/shr.n /tmp/shs.n | sed 's/^/INFO: diff: /'
fi
norm /tmp/real.txt > /tmp/real.n
norm /tmp/snap.txt > /tmp/snap.n
if [ -s /tmp/snap.n ] && cmp -s /tmp/real.n /tmp/snap.n; then
    pass "both libraries executed the same $(wc -l < /tmp/snap.n) checks"
else
    fail "the runs executed different checks"
    diff /tmp/real.n /tmp/snap.n | sed 's/^/INFO: diff: /'
fi

# 3. A device that disappears while an instance has it open with reads in flight on its queues
# (F, two queues on one shared vector: removed; H, one queue: unbound from vfio-pci). The kernel asks the driver to
# release the device (VFIO's request interrupt) and waits for it: the removal must complete,
# the reads fail with EIO or ENODEV (new ones too) and destroy returns.
unplug() { # $1 = label, $2 = BDF, $3 = "remove" or "unbind", $4 = "poll": a poll queue too
    rm -f /tmp/ready
    LD_LIBRARY_PATH=/test/snap timeout 300 /test/bin/vfio_test unplug $S/$2 /tmp/ready ${4:-} > /tmp/unplug.txt 2>&1 &
    upid=$!
    n=0
    while [ ! -e /tmp/ready ] && [ $n -lt 600 ] && kill -0 $upid 2>/dev/null; do sleep 0.2; n=$((n + 1)); done
    [ -e /tmp/ready ] || fail "$1: the reads never ran"
    if [ "$3" = remove ]; then
        timeout 120 sh -c "echo 1 > $S/$2/remove"
    else
        timeout 120 sh -c "echo $2 > /sys/bus/pci/drivers/vfio-pci/unbind"
    fi
    rrc=$?
    wait $upid
    prc=$?
    sed "s/^/INFO: $1: /" /tmp/unplug.txt
    [ $rrc -eq 0 ] && pass "$1: the $3 completed while the device was open" ||
        fail "$1: the $3 did not complete (exit $rrc)"
    if [ "$3" = remove ]; then
        [ ! -e $S/$2 ] && pass "$1: the device is gone" || fail "$1: $S/$2 is still there"
    else
        [ ! -e $S/$2/driver ] && pass "$1: the device has no driver" || fail "$1: still bound"
    fi
    grep -Eq '^unplug: [0-9]+ rounds; first error ret=-(5|19) ' /tmp/unplug.txt &&
        pass "$1: requests in flight failed with EIO or ENODEV" ||
        fail "$1: requests in flight did not fail with EIO/ENODEV"
    grep -Eq '^unplug: a new read on queue [01]: ret=-(5|19) msg=the device was removed$' /tmp/unplug.txt &&
        ! grep '^unplug: a new read' /tmp/unplug.txt | grep -vq 'msg=the device was removed$' &&
        pass "$1: new requests fail saying the device was removed" ||
        fail "$1: new requests do not say the device was removed"
    nnew=$(grep -c '^unplug: a new read on queue' /tmp/unplug.txt)
    [ "$nnew" -ge 1 ] && [ "$(grep -Ec '^unplug: a new read on queue [01]: ret=-(5|19) ' /tmp/unplug.txt)" -eq "$nnew" ] &&
        pass "$1: new requests on each of its $nnew queue(s) fail with EIO or ENODEV" ||
        fail "$1: new requests after the removal did not fail with EIO/ENODEV"
    [ $prc -eq 0 ] && grep -q '^unplug: destroyed' /tmp/unplug.txt &&
        pass "$1: destroy returned" || fail "$1: the program exited $prc without returning from destroy"
}
unplug "hot removal of $F" $F remove
unplug "unbind of $H" $H unbind
echo 1 > /sys/bus/pci/rescan
[ -d $S/$F ] && pass "$F is back after a rescan" || fail "$F did not come back after a rescan"
# Again, with a regular queue and a poll queue (which notices the removal while spinning).
if [ -d $S/$F ]; then
    echo vfio-pci > $S/$F/driver_override
    [ -e $S/$F/driver ] && echo $F > $S/$F/driver/unbind
    echo $F > /sys/bus/pci/drivers_probe
    unplug "hot removal of $F (queue + poll queue)" $F remove poll
    echo 1 > /sys/bus/pci/rescan
fi

kernel_reports_check
# The real library's device faults in the IOMMU on purpose (the unmapped buffer): DMAR fault
# reports are not kernel bugs and are not counted by kernel_reports_check.
dmesg | grep -iE 'DMAR|vfio' | tail -5 | sed 's/^/INFO: dmesg: /'
[ "$KERNEL_REPORTS" -eq 0 ] && pass "no kernel bug, warning or sanitizer report during the tests" ||
    fail "$KERNEL_REPORTS kernel report(s) during the tests (DMESG: lines)"
echo "guest vfio stage done rc=$rc"
sync
exit $rc
