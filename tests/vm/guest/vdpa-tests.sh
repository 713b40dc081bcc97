#!/bin/sh
# Guest stage of tests/suites/vdpa-vm.sh (runs as /test/run.sh in the VM). The VM has two
# virtio disks of 64 MiB, /dev/vda and /dev/vdb, whose images the host checks afterwards.
# Each is exported by qemu-storage-daemon as a VDUSE block device (vduse0 on vda, vduse1 on
# vdb, num-queues=2) and bound to vhost-vdpa with `vdpa dev add`. Then:
#  1. snapblk-conformance on vduse0's /dev/vhost-vdpa-N (snapblk's driver);
#  2. tests/c/vdpa_test.c against snapblk's libblkio.so.1 on vduse0 and the real libblkio 1.5
#     on vduse1 (the data they leave is checked by the host in both images);
#  3. trixie's qemu-io (QEMU 10) on each library, the same way (data checked by the host too);
#  4. the device going away: qemu-storage-daemon killed with requests in flight, and
#     `vdpa dev del` while the device is open;
#  5. a read-only export (VIRTIO_BLK_F_RO) of vdb: start with read-only=false fails, reads work.
# Prints PASS:/FAIL:/INFO: lines, and the C program's output between markers for the host.
export LD_LIBRARY_PATH=/test/lib
rc=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; rc=1; }
. "$(dirname "$0")/kernel-reports.sh"
kernel_reports_begin

QSD=/test/bin/qemu-storage-daemon
# Export /dev/$1 as VDUSE device $2 (writable unless $3 is "off") and bind it to vhost-vdpa;
# prints the /dev/vhost-vdpa-N.
export_disk() {
    $QSD --blockdev "driver=host_device,node-name=f0,filename=/dev/$1,cache.direct=on" \
        --export "type=vduse-blk,id=v0,node-name=f0,name=$2,writable=${3:-on},num-queues=2" \
        > "/tmp/qsd-$2.log" 2>&1 &
    echo $! > "/tmp/qsd-$2.pid"
    i=0
    while [ ! -e "/dev/vduse/$2" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    /test/bin/vdpa dev add name "$2" mgmtdev vduse >&2 || return 1
    i=0
    while [ $i -lt 100 ]; do
        for v in /sys/bus/vdpa/devices/$2/vhost-vdpa-*; do
            [ -e "/dev/${v##*/}" ] && { echo "/dev/${v##*/}"; return 0; }
        done
        sleep 0.1; i=$((i + 1))
    done
    return 1
}

for d in vda vdb; do
    [ -b /dev/$d ] || { fail "no /dev/$d (block devices: $(ls /sys/block | tr '\n' ' '))"; exit 1; }
done
A=$(export_disk vda vduse0) && pass "vduse0 on vda bound to vhost-vdpa: $A" ||
    { fail "vduse0: $(cat /tmp/qsd-vduse0.log)"; exit 1; }
B=$(export_disk vdb vduse1) && pass "vduse1 on vdb bound to vhost-vdpa: $B" ||
    { fail "vduse1: $(cat /tmp/qsd-vduse1.log)"; exit 1; }

# 1. conformance: two queues, one queue and a poll queue, then read-only.
if /test/bin/snapblk-conformance "virtio-blk-vhost-vdpa:path=$A" --allow-destructive \
    > /tmp/conf1.txt 2>&1; then
    pass "conformance on $A ($(tail -1 /tmp/conf1.txt))"
else
    fail "conformance on $A"; sed 's/^/INFO: conf: /' /tmp/conf1.txt
fi
if /test/bin/snapblk-conformance \
    "virtio-blk-vhost-vdpa:path=$A,num-queues=1,num-poll-queues=1" --allow-destructive \
    > /tmp/conf2.txt 2>&1; then
    pass "conformance with a poll queue on $A ($(tail -1 /tmp/conf2.txt))"
else
    fail "conformance with a poll queue on $A"; sed 's/^/INFO: conf: /' /tmp/conf2.txt
fi

# Read-only: reads work, writes, discards and write-zeroes are refused.
if /test/bin/snapblk-conformance "virtio-blk-vhost-vdpa:path=$A,read-only=true" \
    > /tmp/conf3.txt 2>&1; then
    pass "read-only conformance on $A ($(tail -1 /tmp/conf3.txt))"
else
    fail "read-only conformance on $A"; sed 's/^/INFO: conf: /' /tmp/conf3.txt
fi

# 2. the C program, snapblk then the real library (each on its own device).
echo "BEGIN-SNAPBLK"
timeout 120 /test/bin/vdpa_test "$A"; echo "EXIT-SNAPBLK $?"
echo "END-SNAPBLK"
echo "BEGIN-REAL"
LD_LIBRARY_PATH=/test/real timeout 120 /test/bin/vdpa_test "$B"; echo "EXIT-REAL $?"
echo "END-REAL"

# 3. QEMU 10 (Debian trixie's qemu-io, run through trixie's loader) on each library: QEMU opens
# the path itself and hands the descriptor over in the `fd` property, as with libvirt.
T=/tmp/trixie
tar -C /tmp -xf /test/trixie.tar || fail "unpacking /test/trixie.tar"
qio() { # LIBDIR DEV
    QEMU_MODULE_DIR=$T/qemu timeout 120 "$T/lib/ld-linux-x86-64.so.2" --library-path "$1:$T/lib" \
        "$T/qemu-io" --image-opts "driver=virtio-blk-vhost-vdpa,path=$2,cache.direct=on" \
        -c 'write -P 0xcd 32M 64k' -c 'read -P 0xcd 32M 64k' -c 'write -z 33M 64k' \
        -c 'read -P 0 33M 64k' -c 'discard 34M 64k' -c 'writev -P 0xce 35M 4k 4k' \
        -c 'readv -P 0xce 35M 4k 4k' -c flush 2>&1
}
for run in "snapblk /test/lib $A" "real /test/real $B"; do
    set -- $run
    if out=$(qio "$2" "$3") && ! echo "$out" | grep -qiE 'fail|error|not supported'; then
        pass "qemu-io on $1's libblkio.so.1 ($3): write, read, write -z, discard, writev, readv, flush"
    else
        fail "qemu-io on $1's libblkio.so.1 ($3)"
    fi
    echo "$out" | sed "s/^/INFO: qemu-io $1: /"
done

# 4. the device going away (snapblk only): `vdpa dev del` while open, then qsd killed with
# requests in flight. VDUSE waits msg_timeout (30 s by default) for a daemon to answer before it
# declares the device broken; 3 s keeps the VM run short.
t=/sys/class/vduse/vduse0/msg_timeout
[ -w $t ] && echo 3 > $t && echo "INFO: $t = $(cat $t)"
echo "BEGIN-GONE"
timeout 180 /test/bin/vdpa_gone "$A" "$(cat /tmp/qsd-vduse0.pid)" vduse0; echo "EXIT-GONE $?"
echo "END-GONE"

# 5. a read-only device (VIRTIO_BLK_F_RO): vdb exported again with writable=off.
/test/bin/vdpa dev del vduse1 || fail "vdpa dev del vduse1"
kill "$(cat /tmp/qsd-vduse1.pid)"; wait "$(cat /tmp/qsd-vduse1.pid)"
if C=$(export_disk vdb vduse2 off); then
    out=$(/test/bin/snapblk-conformance "virtio-blk-vhost-vdpa:path=$C" --allow-destructive 2>&1)
    st=$?
    case "$st $out" in
        "1 "*"start with num-queues=2: Device is read-only"*) pass "a read-only device refuses start with read-only=false (EROFS)" ;;
        *) fail "read-only device with read-only=false: exit $st: $out" ;;
    esac
    if /test/bin/snapblk-conformance "virtio-blk-vhost-vdpa:path=$C,read-only=true" \
        > /tmp/conf4.txt 2>&1; then
        pass "read-only conformance on the read-only device $C ($(tail -1 /tmp/conf4.txt))"
    else
        fail "read-only conformance on the read-only device $C"; sed 's/^/INFO: conf: /' /tmp/conf4.txt
    fi
else
    fail "vduse2 (read-only): $(cat /tmp/qsd-vduse2.log)"
fi

sync
kernel_reports_check
[ "$KERNEL_REPORTS" -eq 0 ] && pass "no kernel bug, warning or sanitizer report during the tests" ||
    fail "$KERNEL_REPORTS kernel report(s) during the tests (DMESG: lines)"
echo "guest vdpa stage done rc=$rc"
exit $rc
