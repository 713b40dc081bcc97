#!/bin/sh
# ublk tests, run INSIDE the VM (busybox sh) by tests/suites/ublk-vm.sh through tests/vm/vm.sh.
# Layout of /test: bin/snapblk, data/<case>/{base.img,snapshot.cow,target.img}.
# MODES (env, default "copy zero-copy"): data paths to test. Prints PASS/FAIL lines and ends with
# "N passed, N failed"; exit status = number of failures.
MODES=${MODES:-"copy zero-copy"}
pass=0; fail=0; notrun=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
check() { d=$1; shift; if "$@"; then ok "$d"; else bad "$d"; fi; }
n=0
. "$(dirname "$0")/kernel-reports.sh"
kernel_reports_begin

# start_server LOGNAME ARGS... : snapblk serve ARGS --ublk --json in the background; sets PID, DEV
start_server() {
    name=$1; shift
    n=$((n + 1)); OUT=/tmp/srv.$n.out; ERR=/tmp/srv.$n.err
    snapblk serve "$@" --ublk --json > "$OUT" 2> "$ERR" &
    PID=$!
    i=0
    while ! grep -q '"ready"' "$OUT" 2>/dev/null; do
        if ! kill -0 $PID 2>/dev/null || [ $i -ge 600 ]; then
            echo "server for $name did not start: $(cat "$ERR")"; DEV=""; return 1
        fi
        sleep 0.1; i=$((i + 1))
    done
    DEV=$(sed -n 's/.*"dev":"\([^"]*\)".*/\1/p' "$OUT" | head -1)
    [ -b "$DEV" ] || { echo "no block device in: $(cat "$OUT")"; return 1; }
}
# stop_server: SIGTERM, the server must exit 0 and remove its device
stop_server() {
    kill -TERM $PID 2>/dev/null; wait $PID; rc=$?
    [ $rc -eq 0 ] || { echo "server exit status $rc: $(cat "$ERR")"; return 1; }
    [ ! -e "$DEV" ] || { sleep 1; [ ! -e "$DEV" ]; } || { echo "$DEV still exists after stop"; return 1; }
}
md5() { md5sum | cut -d' ' -f1; }
# tree_eq SRC DST: every file under SRC exists in DST with the same bytes
tree_eq() {
    (cd "$1" && find . -type f) > /tmp/tree.list
    [ -s /tmp/tree.list ] || return 1
    while read -r f; do cmp "$1/$f" "$2/$f" || return 1; done < /tmp/tree.list
}

echo "kernel $(uname -r)"
snapblk serve --help > /dev/null || { bad "snapblk runs in the guest"; echo "$pass passed, $fail failed"; exit 1; }

# ---------------------------------------------------------------- golden cases
snapshot_ok=1
for mode in $MODES; do
    for c in /test/data/*/; do
        c=${c%/}; name=${c##*/}
        [ -f "$c/target.img" ] || continue
        # plain-file device holding the expected image (a few cases: the path is the same for all)
        case $name in v2_basic_none|v3_multiblock_lz4_64k|v3_tiny_noscratch) plain=1 ;; *) plain=0 ;; esac
        if [ $plain = 0 ]; then :
        elif start_server "$name" "$c/target.img" --read-only --ublk-mode "$mode"; then
            check "$mode file $name: whole device equals target.img" cmp "$DEV" "$c/target.img"
            # unaligned-in-the-file, sector-aligned direct reads
            a=$(dd if="$DEV" bs=512 skip=7 count=13 iflag=direct 2>/dev/null | md5)
            b=$(dd if="$c/target.img" bs=512 skip=7 count=13 2>/dev/null | md5)
            check "$mode file $name: O_DIRECT partial read" [ "$a" = "$b" ]
            check "$mode file $name: clean stop removes the device" stop_server
        else
            bad "$mode file $name: server start"
        fi
        # snapshot device (base + COW) must read back as target.img
        case $name in *invalid*) continue ;; esac
        if [ $snapshot_ok = 1 ]; then
            if start_server "$name" --base "$c/base.img" --cow "$c/snapshot.cow" --ublk-mode "$mode"; then
                check "$mode snapshot $name: equals target.img" cmp "$DEV" "$c/target.img"
                if [ "$mode" = zero-copy ]; then
                    check "$mode snapshot $name: reads use the zero-copy planner" grep -q '"planned_reads":true' "$OUT"
                fi
                check "$mode snapshot $name: clean stop" stop_server
            elif grep -q 'Unknown driver name' "$ERR"; then
                echo "NOTRUN: snapshot golden cases (the snapshot driver is not registered in this build)"
                snapshot_ok=0; notrun=$((notrun + 1))
            else
                bad "$mode snapshot $name: server start"
            fi
        fi
    done
done

# ---------------------------------------------------------------- user copy, discard
for name in v2_basic_none v3_multiblock_lz4_64k v2_xor_seq_lz4; do
    c=/test/data/$name
    if start_server "$name" --base "$c/base.img" --cow "$c/snapshot.cow" --ublk-mode user-copy; then
        check "user-copy snapshot $name: equals target.img" cmp "$DEV" "$c/target.img"
        check "user-copy snapshot $name: clean stop" stop_server
    else
        bad "user-copy snapshot $name: server start"
    fi
done
# ---------------------------------------------------------------- ota serve --ublk
# One block device per partition of an incremental OTA (made on the host by `ota generate`):
# each equals the partition's new image; SIGTERM removes them all.
if [ -f /test/ota/payload.bin ]; then
    n=$((n + 1)); OUT=/tmp/srv.$n.out; ERR=/tmp/srv.$n.err
    snapblk ota serve /test/ota/payload.bin --source /test/ota/old --ublk --json > "$OUT" 2> "$ERR" &
    PID=$!
    i=0
    while ! grep -q '"ready"' "$OUT" 2>/dev/null && kill -0 $PID 2>/dev/null && [ $i -lt 600 ]; do
        sleep 0.1; i=$((i + 1))
    done
    if grep -q '"ready"' "$OUT"; then
        for part in system vendor; do
            DEV=$(tr '{' '\n' < "$OUT" | grep "\"name\":\"$part\"" | sed -n 's/.*"dev":"\([^"]*\)".*/\1/p' | head -1)
            check "ota serve --ublk: $part is a block device (${DEV:-none})" [ -b "${DEV:-/nonexistent}" ]
            check "ota serve --ublk: $part equals its new image" cmp "${DEV:-/nonexistent}" "/test/ota/new/$part.img"
        done
        devs=$(sed -n 's/.*"dev":"\([^"]*\)".*/\1/p' "$OUT" | tr ',' '\n' | grep -o '/dev/ublkb[0-9]*' | sort -u)
        kill -TERM $PID 2>/dev/null; wait $PID; rc=$?
        check "ota serve --ublk: SIGTERM stops it with status 0 ($(tail -1 "$ERR"))" [ $rc -eq 0 ]
        sleep 1
        left=0; for d in $devs; do [ -e "$d" ] && left=$((left + 1)); done
        check "ota serve --ublk: every device removed at stop ($left left)" [ $left -eq 0 ]
    else
        kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null
        bad "ota serve --ublk: never ready: $(cat "$ERR")"
    fi
else
    bad "ota serve --ublk: no /test/ota/payload.bin staged"
fi

# ---------------------------------------------------------------- --metrics
# The ublk queues count what they serve: once cmp has read the whole device, the Prometheus text
# (fetched with busybox wget) has at least its size in read bytes.
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up 2>/dev/null
c=/test/data/v3_multiblock_lz4_64k
if start_server metrics --base "$c/base.img" --cow "$c/snapshot.cow" --metrics 0; then
    addr=$(sed -n 's/.*"metrics":"\([^"]*\)".*/\1/p' "$OUT" | head -1)
    check "ublk metrics: device equals target.img" cmp "$DEV" "$c/target.img"
    rm -f /tmp/metrics.txt
    check "ublk metrics: GET /metrics" wget -q -O /tmp/metrics.txt "http://$addr/metrics"
    size=$(wc -c < "$c/target.img")
    got=$(sed -n 's/^snapblk_bytes_total{export="ublk",dir="read"} //p' /tmp/metrics.txt)
    check "ublk metrics: read bytes (${got:-none}) cover the device ($size)" [ "${got:-0}" -ge "$size" ]
    check "ublk metrics: read latency histogram" \
        grep -q '^snapblk_request_duration_seconds_count{export="ublk",dir="read"} [1-9]' /tmp/metrics.txt
    check "ublk metrics: clean stop" stop_server
else
    bad "ublk metrics: server start"
fi
# ---------------------------------------------------------------- merge while serving
# serve --merge: the device reads as the new image while its COW is merged into the base in
# place, and after; the zero-copy planner stays off (the block map moves under it).
for mode in $MODES; do
    name=v2_xor_seq_lz4; c=/test/data/$name; m=/tmp/merge.$mode
    rm -rf $m; mkdir -p $m; cp "$c/base.img" "$c/snapshot.cow" $m/
    if start_server "merge-$name" --base $m/base.img --cow $m/snapshot.cow --merge --ublk-mode "$mode"; then
        check "$mode merge $name: reads equal target.img while merging" cmp "$DEV" "$c/target.img"
        check "$mode merge $name: no zero-copy planner on a merging snapshot" grep -q '"planned_reads":false' "$OUT"
        i=0; while ! grep -q '"event":"merge"' "$OUT" && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
        check "$mode merge $name: merge done" grep -q '"event":"merge".*"state":"done"' "$OUT"
        a=$(dd if="$DEV" bs=4096 iflag=direct 2>/dev/null | md5); b=$(md5 < "$c/target.img")
        check "$mode merge $name: O_DIRECT reads equal target.img after the merge" [ "$a" = "$b" ]
        check "$mode merge $name: clean stop" stop_server
        check "$mode merge $name: the base is the new image" cmp $m/base.img "$c/target.img"
    else
        bad "$mode merge $name: server start"
    fi
done
dd if=/dev/urandom of=/tmp/disc.img bs=1M count=4 2>/dev/null
cp /tmp/disc.img /tmp/disc.orig
for mode in $MODES; do
    cp /tmp/disc.orig /tmp/disc.img
    if start_server discard /tmp/disc.img --ublk-mode "$mode"; then
        check "$mode discard: blkdiscard of 1 MiB succeeds" blkdiscard -o 1048576 -l 1048576 "$DEV"
        a=$(dd if="$DEV" bs=1M count=1 iflag=direct 2>/dev/null | md5); b=$(dd if=/tmp/disc.orig bs=1M count=1 2>/dev/null | md5)
        check "$mode discard: data before the range unchanged" [ "$a" = "$b" ]
        a=$(dd if="$DEV" bs=1M skip=2 count=2 iflag=direct 2>/dev/null | md5); b=$(dd if=/tmp/disc.orig bs=1M skip=2 count=2 2>/dev/null | md5)
        check "$mode discard: data after the range unchanged" [ "$a" = "$b" ]
        dd if=/dev/urandom of=/tmp/w bs=64k count=3 2>/dev/null
        dd if=/tmp/w of="$DEV" bs=64k seek=5 oflag=direct conv=fsync 2>/dev/null
        check "$mode write: O_DIRECT write reads back" [ "$(dd if="$DEV" bs=64k skip=5 count=3 iflag=direct 2>/dev/null | md5)" = "$(md5 < /tmp/w)" ]
        check "$mode discard: clean stop" stop_server
        check "$mode write: data landed in the file" [ "$(dd if=/tmp/disc.img bs=64k skip=5 count=3 2>/dev/null | md5)" = "$(md5 < /tmp/w)" ]
    else
        bad "$mode discard: server start"
    fi
done

# ---------------------------------------------------------------- ext4
echo "TIME ext4 start uptime=$(cut -d' ' -f1 /proc/uptime)"
mkdir -p /tmp/tree/sub /mnt/u
cp /bin/busybox /tmp/tree/busybox-copy
cp /bin/busybox /tmp/tree/sub/
i=0; while [ $i -lt 50 ]; do echo "file $i $(date)" > /tmp/tree/sub/f$i; i=$((i + 1)); done
dd if=/dev/urandom of=/tmp/tree/random bs=1k count=3000 2>/dev/null
for mode in $MODES; do
    img=/tmp/ext4-$mode.img
    rm -f $img
    /sbin/mke2fs -q -t ext4 -b 4096 -d /tmp/tree $img 64M || bad "mke2fs -d"
    if start_server ext4 $img --ublk-mode "$mode"; then
        check "$mode ext4: mount" mount -t ext4 "$DEV" /mnt/u
        check "$mode ext4: files equal the source tree" tree_eq /tmp/tree /mnt/u
        dd if=/dev/urandom of=/tmp/new bs=1k count=500 2>/dev/null
        check "$mode ext4: write a file" cp /tmp/new /mnt/u/new
        sync; echo 3 > /proc/sys/vm/drop_caches
        check "$mode ext4: written file reads back" cmp /tmp/new /mnt/u/new
        check "$mode ext4: umount" umount /mnt/u
        check "$mode ext4: e2fsck -fn clean on the ublk device" /sbin/e2fsck -fn "$DEV"
        check "$mode ext4: clean stop" stop_server
        check "$mode ext4: e2fsck -fn clean on the image" /sbin/e2fsck -fn $img
    else
        bad "$mode ext4: server start"
    fi
done

# ---------------------------------------------------------------- ext4 snapshot
# /test/ext4: A.img (ext4 of tree A) + AB.cow (to ext4 of tree B); tree = tree B's files.
E=/test/ext4
for mode in $MODES; do
    if start_server ext4-snapshot --base $E/A.img --cow $E/AB.cow --ublk-mode "$mode"; then
        check "$mode ext4 snapshot: mount read-only" mount -t ext4 -o ro,noload "$DEV" /mnt/u
        check "$mode ext4 snapshot: files equal tree B" tree_eq $E/tree /mnt/u
        check "$mode ext4 snapshot: removed file is gone" [ ! -e /mnt/u/d/f1 ]
        check "$mode ext4 snapshot: umount" umount /mnt/u
        check "$mode ext4 snapshot: e2fsck -fn clean" /sbin/e2fsck -fn "$DEV"
        check "$mode ext4 snapshot: clean stop" stop_server
    else
        bad "$mode ext4 snapshot: server start"
    fi
    # COW record (bad.cow.snapblk): the block whose payload is corrupt is an I/O error, never
    # wrong bytes, whether the read is copied or planned for zero copy; other blocks read.
    if start_server ext4-snapshot-corrupt --base $E/A.img --cow $E/bad.cow --ublk-mode "$mode"; then
        bb=$(cat $E/bad_block)
        check "$mode corrupt COW: the corrupt block is an I/O error" \
            sh -c "! dd if=$DEV of=/dev/null bs=4096 skip=$bb count=1 iflag=direct 2>/dev/null"
        check "$mode corrupt COW: block 0 reads" dd if="$DEV" of=/dev/null bs=4096 count=1 iflag=direct
        check "$mode corrupt COW: clean stop" stop_server
    else
        bad "$mode corrupt COW: server start"
    fi
    # The corrupt block fails every time (it never passes the check, so zero copy never plans it).
    if start_server ext4-snapshot-corrupt2 --base $E/A.img --cow $E/bad.cow --ublk-mode "$mode"; then
        bb=$(cat $E/bad_block)
        for pass in 1 2; do
            check "$mode corrupt COW: the corrupt block is an I/O error (read $pass)" \
                sh -c "! dd if=$DEV of=/dev/null bs=4096 skip=$bb count=1 iflag=direct 2>/dev/null"
        done
        check "$mode corrupt COW: clean stop (2)" stop_server
    else
        bad "$mode corrupt COW: server start (2)"
    fi
    # writable snapshot: writes go to the COW overlay, the base stays untouched
    cp $E/A.img /tmp/A.img; cp $E/AB.cow /tmp/AB.cow
    if start_server ext4-snapshot-rw --base /tmp/A.img --cow /tmp/AB.cow --writable --ublk-mode "$mode"; then
        check "$mode writable ext4 snapshot: mount" mount -t ext4 "$DEV" /mnt/u
        check "$mode writable ext4 snapshot: write a file" cp /tmp/tree/random /mnt/u/written
        check "$mode writable ext4 snapshot: umount" umount /mnt/u
        check "$mode writable ext4 snapshot: e2fsck -fn clean" /sbin/e2fsck -fn "$DEV"
        check "$mode writable ext4 snapshot: clean stop" stop_server
        check "$mode writable ext4 snapshot: base untouched" cmp /tmp/A.img $E/A.img
    else
        bad "$mode writable ext4 snapshot: server start"
    fi
    if start_server ext4-snapshot-rw2 --base /tmp/A.img --cow /tmp/AB.cow --writable --ublk-mode "$mode"; then
        mount -t ext4 -o ro,noload "$DEV" /mnt/u
        check "$mode writable ext4 snapshot: write persists across restart" cmp /tmp/tree/random /mnt/u/written
        umount /mnt/u
        stop_server
    else
        bad "$mode writable ext4 snapshot: restart"
    fi
done

# ---------------------------------------------------------------- zero copy with a COW record
# /test/ext4/raw.cow: uncompressed, no XOR, record beside it. Every pass over the device reads
# tree B's image; a range with a block not yet checked against the record goes through the
# device (which checks it), a checked one is planned from the files: a second pass adds no
# device segment. The server logs its plans' segment counts at stop (RUST_LOG info).
dev_bytes() { sed -n 's/.*(\([0-9]*\) bytes through the device).*/\1/p' "$ERR" | awk '{ s += $1 } END { print s + 0 }'; }
read_sha() { dd if="$DEV" bs=1M iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1; }
want=$(cat $E/B.sha256)
export RUST_LOG=snapblk_ublk=info
d1=""; d2=""
if start_server zc-record-1 --base $E/A.img --cow $E/raw.cow --ublk-mode zero-copy; then
    check "zero-copy record: reads use the planner" grep -q '"planned_reads":true' "$OUT"
    check "zero-copy record: the device reads tree B's image" [ "$(read_sha)" = "$want" ]
    check "zero-copy record: clean stop (1)" stop_server
    d1=$(dev_bytes)
else
    bad "zero-copy record: server start (1)"
fi
if start_server zc-record-2 --base $E/A.img --cow $E/raw.cow --ublk-mode zero-copy; then
    check "zero-copy record: first pass reads tree B's image" [ "$(read_sha)" = "$want" ]
    check "zero-copy record: second pass reads tree B's image" [ "$(read_sha)" = "$want" ]
    check "zero-copy record: clean stop (2)" stop_server
    d2=$(dev_bytes)
else
    bad "zero-copy record: server start (2)"
fi
check "zero-copy record: unchecked blocks go through the device (${d1:-none} bytes)" [ "${d1:-0}" -gt 0 ]
check "zero-copy record: a second pass is planned from the files (${d2:-none} = ${d1:-none} device bytes)" \
    [ "${d2:-x}" = "${d1:-y}" ]
if start_server zc-norecord --base $E/A.img --cow $E/raw.cow --ublk-mode zero-copy --no-record; then
    check "zero-copy --no-record: the device reads tree B's image" [ "$(read_sha)" = "$want" ]
    check "zero-copy --no-record: clean stop" stop_server
    check "zero-copy --no-record: no device segment ($(dev_bytes) bytes)" [ "$(dev_bytes)" = 0 ]
else
    bad "zero-copy --no-record: server start"
fi
unset RUST_LOG

# ---------------------------------------------------------------- recovery
echo "TIME recovery start uptime=$(cut -d' ' -f1 /proc/uptime)"
# Kill -9 the server while a reader loops over the device; restart it with the same --ublk-id:
# it must reattach (recovered), and every read (before, across and after the kill) must be right.
dd if=/dev/urandom of=/tmp/rec.img bs=1M count=8 2>/dev/null
want=$(md5 < /tmp/rec.img)
for mode in $MODES; do
    id=7
    if ! start_server recovery /tmp/rec.img --ublk-mode "$mode" --ublk-id $id; then
        bad "$mode recovery: server start"; continue
    fi
    first=$PID
    : > /tmp/reads
    ( j=0; while [ $j -lt 8 ]; do
          got=$(dd if="$DEV" bs=64k iflag=direct 2>/dev/null | md5)
          echo "$got" >> /tmp/reads; j=$((j + 1))
      done ) &
    reader=$!
    sleep 1
    kill -KILL $first; wait $first 2>/dev/null
    check "$mode recovery: block device survives the server's death" [ -b "$DEV" ]
    old=$DEV
    if start_server recovery /tmp/rec.img --ublk-mode "$mode" --ublk-id $id; then
        check "$mode recovery: restarted server reattached" grep -q '"recovered":true' "$OUT"
        check "$mode recovery: same device" [ "$DEV" = "$old" ]
        wait $reader
        check "$mode recovery: reader finished 8 passes" [ "$(wc -l < /tmp/reads)" -eq 8 ]
        check "$mode recovery: every pass read correct data" [ "$(grep -c -v "^$want\$" /tmp/reads)" -eq 0 ]
        check "$mode recovery: reads after recovery" [ "$(dd if="$DEV" bs=1M 2>/dev/null | md5)" = "$want" ]
        check "$mode recovery: clean stop" stop_server
    else
        kill $reader 2>/dev/null
        bad "$mode recovery: restart"
    fi
    # A mounted filesystem keeps working across a server crash.
    img=/tmp/ext4-$mode.img
    if [ -f $img ] && start_server recovery-ext4 $img --ublk-mode "$mode" --ublk-id $id; then
        mount -t ext4 "$DEV" /mnt/u || bad "$mode recovery-ext4: mount"
        kill -KILL $PID; wait $PID 2>/dev/null
        # I/O issued while no server runs waits for the next one
        ( cat /mnt/u/random > /tmp/random.copy; echo done > /tmp/catdone ) &
        cat=$!
        if start_server recovery-ext4 $img --ublk-mode "$mode" --ublk-id $id; then
            check "$mode recovery-ext4: reattached" grep -q '"recovered":true' "$OUT"
            wait $cat
            check "$mode recovery-ext4: file read across the crash is intact" cmp /tmp/random.copy /tmp/tree/random
            echo 3 > /proc/sys/vm/drop_caches
            check "$mode recovery-ext4: tree still equal" tree_eq /tmp/tree /mnt/u
            check "$mode recovery-ext4: write after recovery" cp /tmp/tree/random /mnt/u/again
            check "$mode recovery-ext4: umount" umount /mnt/u
            check "$mode recovery-ext4: e2fsck -fn clean" /sbin/e2fsck -fn "$DEV"
            check "$mode recovery-ext4: clean stop" stop_server
        else
            bad "$mode recovery-ext4: restart"
        fi
    else
        bad "$mode recovery-ext4: server start"
    fi
done

# ---------------------------------------------------------------- sizes
# A device whose size is not a multiple of the logical block size: the ready line's capacity is
# the block device's size (rounded down), and a warning names the unreachable tail.
head -c 1049576 /dev/urandom > /tmp/odd.img
for mode in $MODES; do
    if start_server odd-size /tmp/odd.img --ublk-mode "$mode"; then
        cap=$(sed -n 's/.*"capacity":\([0-9]*\).*/\1/p' "$OUT")
        check "$mode odd size: capacity is whole 512-byte blocks" [ $((cap % 512)) -eq 0 ]
        check "$mode odd size: capacity rounded down by less than a block" \
            [ "$cap" -le 1049576 -a $((1049576 - cap)) -lt 4096 ]
        check "$mode odd size: capacity equals the block device's size" [ "$(blockdev --getsize64 "$DEV")" = "$cap" ]
        check "$mode odd size: a warning names the unreachable tail" \
            grep -q "its last $((1049576 - cap)) bytes (from offset $cap) cannot be read" "$ERR"
        check "$mode odd size: clean stop" stop_server
    else
        bad "$mode odd size: server start"
    fi
done

# A fragmented zero-copy read (base block, zero block, ...: 128 kernel reads per 512 KiB request)
# from 8 readers at once: the data is right and the queue's completion queue never overflows.
FR=/test/frag
if start_server frag --base $FR/base.img --cow $FR/frag.cow --ublk-mode zero-copy; then
    check "zero-copy fragmented: reads use the planner" grep -q '"planned_reads":true' "$OUT"
    want=$(md5 < $FR/new.img)
    pids=""
    j=0; while [ $j -lt 8 ]; do
        ( dd if="$DEV" bs=512k iflag=direct 2>/dev/null | md5 > /tmp/frag.$j ) &
        pids="$pids $!"; j=$((j + 1))
    done
    for p in $pids; do wait $p; done
    check "zero-copy fragmented: 8 parallel readers read the new image" \
        [ "$(cat /tmp/frag.* | sort -u)" = "$want" ]
    check "zero-copy fragmented: clean stop" stop_server
    check "zero-copy fragmented: the completion queue never overflowed" sh -c "! grep overflowed $ERR"
else
    bad "zero-copy fragmented: server start"
fi

# A snapshot whose base is cut while it is served: its base blocks are I/O errors through the
# generic path (the snapshot's reads must be whole), and through zero copy too, never zeros.
c=/test/data/v2_copy_chain_stream_order
for mode in $MODES; do
    cp "$c/base.img" /tmp/cut-base.img
    if start_server cut-base --base /tmp/cut-base.img --cow "$c/snapshot.cow" --ublk-mode "$mode"; then
        : > /tmp/cut-base.img
        check "$mode cut base: reading the device is an I/O error, not zeros" \
            sh -c "! dd if=$DEV of=/dev/null bs=4k iflag=direct 2>/dev/null"
        check "$mode cut base: clean stop" stop_server
    else
        bad "$mode cut base: server start"
    fi
done

# ---------------------------------------------------------------- failures and stops
# /test/bin/snapblk-faults is the fault-injection build: SNAPBLK_UBLK_FAULT makes its ublk server
# fail on purpose (crates/ublk/src/server.rs, `Faults`). Every case ends with the server gone by
# itself (no SIGKILL), a non-zero exit with the error on stderr, and no ublk device left.
echo "TIME failures start uptime=$(cut -d' ' -f1 /proc/uptime)"
FB=/test/bin/snapblk-faults
dd if=/dev/urandom of=/tmp/rob.img bs=1M count=8 2>/dev/null
# faulty FAULT ARGS...: the fault build serving ARGS with SNAPBLK_UBLK_FAULT=FAULT; sets PID OUT ERR
faulty() {
    fault=$1; shift
    n=$((n + 1)); OUT=/tmp/srv.$n.out; ERR=/tmp/srv.$n.err
    SNAPBLK_UBLK_FAULT=$fault $FB serve "$@" --ublk --json > "$OUT" 2> "$ERR" &
    PID=$!
}
# wait_ready: wait for the ready line of $PID (10 s); sets DEV
wait_ready() {
    i=0
    while ! grep -q '"ready"' "$OUT" 2>/dev/null; do
        kill -0 $PID 2>/dev/null && [ $i -lt 100 ] || { echo "no ready line: $(cat "$ERR")"; return 1; }
        sleep 0.1; i=$((i + 1))
    done
    DEV=$(sed -n 's/.*"dev":"\([^"]*\)".*/\1/p' "$OUT" | head -1)
}
# wait_exit SECONDS: wait for $PID to end by itself; RC = its status, 255 if it had to be killed
wait_exit() {
    i=0
    while kill -0 $PID 2>/dev/null; do
        if [ $i -ge $(($1 * 10)) ]; then
            echo "server $PID still running after $1 s: $(cat "$ERR")"; kill -KILL $PID; wait $PID; RC=255; return 1
        fi
        sleep 0.1; i=$((i + 1))
    done
    wait $PID; RC=$?
}
no_ublk_devices() { sleep 0.5; [ -z "$(ls /dev | grep '^ublk[bc][0-9]')" ] || { ls /dev | grep '^ublk'; return 1; }; }
for mode in $MODES; do
    # A queue thread whose setup fails: the start-up must end with the error, not hang.
    faulty setup-fail=1 /tmp/rob.img --ublk-mode "$mode" --ublk-queues 2
    wait_exit 30
    check "$mode queue setup failure: the server exits by itself" [ $RC -ne 255 ]
    check "$mode queue setup failure: exit status 1" [ $RC -eq 1 ]
    check "$mode queue setup failure: the error names the queue" grep -q 'ublk queue 1: set up the queue' "$ERR"
    check "$mode queue setup failure: no ready line" sh -c "! grep -q ready $OUT"
    check "$mode queue setup failure: no ublk device left" no_ublk_devices

    # A COMMIT_AND_FETCH the kernel rejects (it names a tag past the queue depth): the server
    # stops with the error instead of serving the old request again for ever.
    faulty reject-commit=20 /tmp/rob.img --ublk-mode "$mode"
    if wait_ready; then
        ( timeout 60 dd if="$DEV" of=/dev/null bs=4k count=400 iflag=direct 2>/dev/null; echo $? > /tmp/rc.dd ) &
        rd=$!
        wait_exit 30
        check "$mode rejected commit: the server exits by itself" [ $RC -ne 255 ]
        check "$mode rejected commit: exit status 1" [ $RC -eq 1 ]
        check "$mode rejected commit: the error names the command" \
            grep -q 'ublk queue 0: COMMIT_AND_FETCH of tag [0-9]*: Invalid argument' "$ERR"
        wait $rd
        check "$mode rejected commit: the reader gets an I/O error, not a hang" [ "$(cat /tmp/rc.dd)" = 1 ]
        check "$mode rejected commit: no ublk device left" no_ublk_devices
    else
        bad "$mode rejected commit: server start"; kill -KILL $PID 2>/dev/null
    fi

    # A read the device never completes (hang-read=64: the READ at sector 64): the first SIGTERM
    # sends STOP_DEV, which waits for it; the second forces the stop: exit 1 within the bound.
    faulty hang-read=64 /tmp/rob.img --ublk-mode "$mode"
    if wait_ready; then
        ( timeout 60 dd if="$DEV" of=/dev/null bs=4k skip=8 count=1 iflag=direct 2>/dev/null; echo $? > /tmp/rc.dd ) &
        rd=$!
        sleep 1
        kill -TERM $PID; sleep 3
        check "$mode stuck read: the first SIGTERM waits for the stuck read" kill -0 $PID
        kill -TERM $PID
        wait_exit 15
        check "$mode stuck read: the second SIGTERM ends the server" [ $RC -ne 255 ]
        check "$mode stuck read: a forced stop exits 1" [ $RC -eq 1 ]
        check "$mode stuck read: the forced stop is reported" grep -q 'stop was forced by a second stop request' "$ERR"
        wait $rd
        check "$mode stuck read: the stuck reader gets an I/O error" [ "$(cat /tmp/rc.dd)" = 1 ]
        check "$mode stuck read: no ublk device left" no_ublk_devices
    else
        bad "$mode stuck read: server start"; kill -KILL $PID 2>/dev/null
    fi

    # A signal storm on a busy server: it ends by itself, and leaves no device.
    faulty "" /tmp/rob.img --ublk-mode "$mode"
    if wait_ready; then
        ( timeout 60 dd if="$DEV" of=/dev/null bs=64k iflag=direct 2>/dev/null ) &
        rd=$!
        j=0; while [ $j -lt 20 ]; do kill -TERM $PID 2>/dev/null; j=$((j + 1)); done
        wait_exit 15
        check "$mode signal storm: the server ends by itself" [ $RC -ne 255 ]
        check "$mode signal storm: exit 0 (stopped) or 1 (forced)" [ $RC -le 1 ]
        check "$mode signal storm: no panic" sh -c "! grep -q panicked $ERR"
        wait $rd
        check "$mode signal storm: no ublk device left" no_ublk_devices
    else
        bad "$mode signal storm: server start"; kill -KILL $PID 2>/dev/null
    fi

    # A failed STOP_DEV is reported, the exit is 1, and the device is still removed.
    faulty stop-dev-fail /tmp/rob.img --ublk-mode "$mode"
    if wait_ready; then
        kill -TERM $PID
        wait_exit 15
        check "$mode failed STOP_DEV: the server ends by itself" [ $RC -ne 255 ]
        check "$mode failed STOP_DEV: exit status 1" [ $RC -eq 1 ]
        check "$mode failed STOP_DEV: the error is reported" grep -q 'ublk: STOP_DEV' "$ERR"
        check "$mode failed STOP_DEV: no ublk device left" no_ublk_devices
    else
        bad "$mode failed STOP_DEV: server start"; kill -KILL $PID 2>/dev/null
    fi
done

# User recovery refuses a device that does not match the server's (other size, data path, queue
# count, access): the device stays waiting, and the matching server then recovers it.
dd if=/dev/urandom of=/tmp/rec16.img bs=1M count=16 2>/dev/null
if start_server recovery-mismatch /tmp/rob.img --ublk-id 9; then
    old=$DEV
    kill -KILL $PID; wait $PID 2>/dev/null
    for args in "/tmp/rec16.img" "/tmp/rob.img --ublk-mode zero-copy" "/tmp/rob.img --ublk-queues 2" \
        "/tmp/rob.img --read-only"; do
        n=$((n + 1)); OUT=/tmp/srv.$n.out; ERR=/tmp/srv.$n.err
        # shellcheck disable=SC2086 # $args is a word list
        timeout 60 snapblk serve $args --ublk --json --ublk-id 9 > "$OUT" 2> "$ERR"
        rc=$?
        check "recovery by another device ($args): refused with exit status 1" [ $rc -eq 1 ]
        check "recovery by another device ($args): the error says what differs" \
            grep -q 'ublk device 9 cannot be recovered by this server: its' "$ERR"
        check "recovery by another device ($args): the device still waits" [ -b "$old" ]
    done
    if start_server recovery-match /tmp/rob.img --ublk-id 9; then
        check "recovery by the same device: reattached" grep -q '"recovered":true' "$OUT"
        check "recovery by the same device: reads the file" \
            [ "$(dd if="$DEV" bs=1M iflag=direct 2>/dev/null | md5)" = "$(md5 < /tmp/rob.img)" ]
        check "recovery by the same device: clean stop" stop_server
    else
        bad "recovery by the same device: restart"
    fi
else
    bad "recovery mismatch: server start"
fi

# A ublk server can trip the driver's WARN_ONs: any kernel report during the tests fails the run.
kernel_reports_check
check "no kernel bug, warning or sanitizer report during the tests ($KERNEL_REPORTS)" [ "$KERNEL_REPORTS" -eq 0 ]
echo "not run: $notrun"
echo "$pass passed, $fail failed"
exit $fail
