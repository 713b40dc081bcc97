#!/bin/sh
# Guest stage of tests/suites/poll-vm.sh (runs as /test/run.sh in the VM): the VM has an
# emulated NVMe disk and the kernel was booted with nvme.poll_queues=1. Checks that the disk
# really has a poll queue, runs the C poll-queue test on it, then the "no polling" checks on a
# loop device. Prints PASS:/FAIL: lines; exit status non-zero if anything failed.
export LD_LIBRARY_PATH=/test/lib
rc=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; rc=1; }
. "$(dirname "$0")/kernel-reports.sh"
kernel_reports_begin

d=/dev/nvme0n1
# The NVMe driver probes asynchronously: init may run before the namespace exists, or while
# the kernel's partition scan still reads it (its interrupts would count against the polled
# I/O below). Wait for the disk, then for its I/O counters to stand still.
t0=$(cut -d' ' -f1 /proc/uptime)
i=0
while [ ! -b "$d" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
i=0; last=""
while [ -b "$d" ] && [ $i -lt 100 ]; do
    now=$(cat /sys/block/nvme0n1/stat 2>/dev/null)
    # shellcheck disable=SC2046 # two numbers: reads and writes in flight
    set -- $(cat /sys/block/nvme0n1/inflight 2>/dev/null)
    [ "$now" = "$last" ] && [ "${1:-}" = 0 ] && [ "${2:-}" = 0 ] && break
    last=$now; sleep 0.2; i=$((i + 1))
done
echo "INFO: waited $(awk "BEGIN{print $(cut -d' ' -f1 /proc/uptime) - $t0}") s for $d and its I/O to settle"
if [ ! -b "$d" ]; then
    fail "no $d: the VM has no NVMe disk (block devices: $(ls /sys/block | tr '\n' ' '))"
    exit 1
fi
pass "NVMe disk $d present ($(cat /sys/block/nvme0n1/size) sectors)"
p=$(cat /sys/block/nvme0n1/queue/io_poll 2>/dev/null)
[ "$p" = 1 ] && pass "$d queue/io_poll = 1" || fail "$d queue/io_poll = '$p' (want 1: nvme.poll_queues not applied?)"
echo "INFO: nvme.poll_queues=$(cat /sys/module/nvme/parameters/poll_queues 2>/dev/null)"
# The blk-mq hardware queues and their types: one must be the poll queue.
if mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || [ -d /sys/kernel/debug/block ]; then
    types=""
    for h in /sys/kernel/debug/block/nvme0n1/hctx*; do
        [ -f "$h/type" ] && types="$types ${h##*/}=$(cat "$h/type")"
    done
    echo "INFO: hctx types:$types"
    case $types in
        *=poll*) pass "debugfs: nvme0n1 has a poll hctx" ;;
        *) fail "debugfs: no poll hctx among:$types" ;;
    esac
else
    echo "INFO: debugfs not mountable, hctx types not checked"
fi
grep nvme /proc/interrupts | sed 's/^/INFO: irq /'

t0=$(cut -d' ' -f1 /proc/uptime)
/test/bin/poll_test nvme "$d" || fail "poll_test nvme $d exited $?"
echo "INFO: poll_test nvme took $(awk "BEGIN{print $(cut -d' ' -f1 /proc/uptime) - $t0}") s"
grep nvme /proc/interrupts | sed 's/^/INFO: irq /'

# A device without polling in the same VM: a loop device over a tmpfs file.
dd if=/dev/zero of=/tmp/loop.img bs=1M count=16 2>/dev/null
[ -b /dev/loop0 ] || mknod /dev/loop0 b 7 0
if losetup /dev/loop0 /tmp/loop.img; then
    lp=$(cat /sys/block/loop0/queue/io_poll 2>/dev/null)
    [ "$lp" = 0 ] && pass "loop0 queue/io_poll = 0" || fail "loop0 queue/io_poll = '$lp' (want 0)"
    /test/bin/poll_test nopoll /dev/loop0 || fail "poll_test nopoll /dev/loop0 exited $?"
    losetup -d /dev/loop0
else
    fail "losetup /dev/loop0 failed"
fi
kernel_reports_check
[ "$KERNEL_REPORTS" -eq 0 ] && pass "no kernel bug, warning or sanitizer report during the tests" ||
    fail "$KERNEL_REPORTS kernel report(s) during the tests (DMESG: lines)"
echo "guest poll stage done rc=$rc"
exit $rc
