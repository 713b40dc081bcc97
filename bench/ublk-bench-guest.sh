#!/bin/sh
# Runs INSIDE the VM (see bench/ublk-bench.sh): 4 KiB random reads at QD1 and QD32 through the
# kernel loop device and through /dev/ublkbN in each data path, printing one "BENCH name {json}"
# line per run. Images are in /test/img; SECS (default 3) per run.
SECS=${SECS:-2}
ROUNDS=${ROUNDS:-3}
ROWS=${ROWS:-all}                  # realistic: only the realistic pair's rows
cd /test/img || exit 1
cp base.img /tmp/base.img          # tmpfs: every device reads the same page-cached bytes
# Each COW with its record (COW.snapblk, made by `cow create`): the snapshots are served as by
# default, checking blocks against the record (the warm-up pass checks every block once).
for f in *.cow *.cow.snapblk realistic-*.img; do [ -f "$f" ] && cp "$f" /tmp/; done
fail=0
run() { # NAME DEV
    # warm-up pass over the device so every run sees a hot page cache of its backing files
    dd if="$2" of=/dev/null bs=1M 2>/dev/null
    for qd in 1 32; do
        res=$(ublk-loadgen "$2" $qd "$SECS") || { echo "loadgen failed on $1"; fail=$((fail + 1)); }
        echo "BENCH $1 $res"
    done
}
k=0
serve_run() { # NAME ARGS...
    name=$1; shift
    k=$((k + 1)); out=/tmp/srv.$k.out; err=/tmp/srv.$k.err
    snapblk serve "$@" --ublk --json > $out 2> $err &
    pid=$!
    i=0
    while ! grep -q '"ready"' $out 2>/dev/null; do
        if ! kill -0 $pid 2>/dev/null || [ $i -ge 600 ]; then echo "server $name failed: $(cat $err)"; fail=$((fail + 1)); return; fi
        sleep 0.1; i=$((i + 1))
    done
    dev=$(sed -n 's/.*"dev":"\([^"]*\)".*/\1/p' $out)
    echo "READY $name $(cat $out)"
    run "$name" "$dev"
    kill -TERM $pid; wait $pid
}
echo "kernel $(uname -r) cpus $(nproc)"
# Rounds interleave all devices so that drifting host load (TCG shares the host) hits them alike.
r=0
while [ $r -lt "$ROUNDS" ]; do
    r=$((r + 1)); echo "ROUND $r"
    if [ "$ROWS" = all ]; then
    loopdev=$(losetup -f)
    losetup "$loopdev" /tmp/base.img && run loop "$loopdev"
    losetup -d "$loopdev"
    serve_run file-copy /tmp/base.img --read-only --ublk-mode copy
    serve_run file-zc /tmp/base.img --read-only --ublk-mode zero-copy
    serve_run file-zc-noplan /tmp/base.img --read-only --ublk-mode zero-copy --ublk-no-plan
    for c in copy zero replace-lz4 replace-none; do
        [ -f /tmp/$c.cow ] || continue
        serve_run snap-$c-copy --base /tmp/base.img --cow /tmp/$c.cow --ublk-mode copy
        serve_run snap-$c-zc --base /tmp/base.img --cow /tmp/$c.cow --ublk-mode zero-copy
        serve_run snap-$c-zc-noplan --base /tmp/base.img --cow /tmp/$c.cow --ublk-mode zero-copy --ublk-no-plan
    done
    fi
    if [ -f /tmp/realistic.cow ]; then  # bench/ublk-bench.sh REALISTIC_MB
        loopdev=$(losetup -f)
        losetup "$loopdev" /tmp/realistic-new.img && run loop-new "$loopdev"
        losetup -d "$loopdev"
        serve_run new-copy /tmp/realistic-new.img --read-only --ublk-mode copy
        serve_run new-zc /tmp/realistic-new.img --read-only --ublk-mode zero-copy
        serve_run snap-realistic-copy --base /tmp/realistic-old.img --cow /tmp/realistic.cow --ublk-mode copy
        serve_run snap-realistic-zc --base /tmp/realistic-old.img --cow /tmp/realistic.cow --ublk-mode zero-copy
        serve_run snap-realistic-zc-norec --base /tmp/realistic-old.img --cow /tmp/realistic.cow --ublk-mode zero-copy --no-record
    fi
done
exit $fail
