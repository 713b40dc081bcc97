#!/usr/bin/env bash
# The virtio-blk-vhost-user driver through the C ABI, and a differential run against the real
# libblkio 1.5 (Debian trixie, fetched by bench/real-libblkio.sh without installing it): one C
# program (tests/c/vhost_user_test.c), built once, run against snapblk's libblkio.so.1 and the
# real library, each on its own qemu-storage-daemon vhost-user-blk export of a fresh 64 MiB file.
# snapblk must pass every check; every check the real library fails must be tagged [fix] (a
# documented difference, docs/blkio.md). After each daemon exits, the data the program wrote is
# checked in the file. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
die() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }
command -v gcc >/dev/null || die "gcc not found (scripts/install-deps.sh)"
qsd=/usr/bin/qemu-storage-daemon
[ -x "$qsd" ] || die "$qsd not found (scripts/install-deps.sh installs qemu-system-common)"
cargo build --release -p snapblk-capi || die "cargo build -p snapblk-capi"
tgt=${CARGO_TARGET_DIR:-$root/target}
work=$(mktemp -d /tmp/snapblk-capi-vu.XXXXXX)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/snap"
ln -sf "$tgt/release/libblkio.so" "$work/snap/libblkio.so.1"
ln -sf "$tgt/release/libblkio.so" "$work/snap/libblkio.so"
gcc -std=gnu11 -Wall -Wextra -Werror -O2 -I include tests/c/vhost_user_test.c -L "$work/snap" -lblkio \
  -o "$work/t" || die "gcc tests/c/vhost_user_test.c"
passed=0; failed=0

# Start a daemon on a fresh file in $1; sets $pid, waits for the socket.
start_daemon() {
  truncate -s 64M "$1/disk.img"
  "$qsd" --blockdev "driver=file,node-name=file0,filename=$1/disk.img" \
    --export "type=vhost-user-blk,id=exp0,addr.type=unix,addr.path=$1/vhost.sock,node-name=file0,writable=on,num-queues=2" \
    > "$1/qsd.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do [ -S "$1/vhost.sock" ] && return 0; sleep 0.05; done
  return 1
}
stop_daemon() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=""; }

# Run the program against library dir $2 on a daemon in $1; output in $1/out.txt.
run_on() {
  mkdir -p "$1"
  start_daemon "$1" || { echo "FAIL qemu-storage-daemon did not start ($1)"; failed=$((failed+1)); return 1; }
  LD_LIBRARY_PATH="$2" timeout 120 "$work/t" "$1/vhost.sock" > "$1/out.txt" 2>&1
  stop_daemon
}

# The data the program left: 64 KiB of 0xab at 0, 64 KiB of 0x5c at 1 MiB (file checked with
# the daemon gone).
check_data() {
  if cmp -s <(head -c 65536 "$1/disk.img") <(head -c 65536 /dev/zero | tr '\0' '\253') \
     && cmp -s <(tail -c +1048577 "$1/disk.img" | head -c 65536) <(head -c 65536 /dev/zero | tr '\0' '\134'); then
    echo "PASS $2: the written data is in the file"; passed=$((passed+1))
  else
    echo "FAIL $2: the file does not hold the written data"; failed=$((failed+1))
  fi
}

run_on "$work/snapdir" "$work/snap"
sed 's/^/  /' "$work/snapdir/out.txt"
ns_fail=$(grep -c '^FAIL' "$work/snapdir/out.txt")
ns_pass=$(grep -c '^PASS' "$work/snapdir/out.txt")
if [ "$ns_fail" -eq 0 ] && [ "$ns_pass" -gt 0 ]; then
  echo "PASS snapblk passes all $ns_pass checks"; passed=$((passed+1))
else
  echo "FAIL snapblk fails $ns_fail checks"; failed=$((failed+1))
fi
check_data "$work/snapdir" snapblk

real=$(bash bench/real-libblkio.sh) || { echo "FAIL could not fetch the real libblkio (needs deb.debian.org)"; echo "$passed passed, $((failed+1)) failed"; exit 1; }
run_on "$work/realdir" "$real"
echo "== checks the real libblkio 1.5 fails (each must be a documented [fix]):"
while read -r line; do
  echo "  real: $line"
  case "$line" in
    "FAIL [fix] "*) passed=$((passed+1)) ;;
    *) echo "FAIL undocumented difference: $line"; failed=$((failed+1)) ;;
  esac
done < <(grep '^FAIL' "$work/realdir/out.txt")
echo "== real libblkio passes $(grep -c '^PASS' "$work/realdir/out.txt") checks"
if diff <(grep -E '^(PASS|FAIL)' "$work/realdir/out.txt" | sed -E 's/^(PASS|FAIL) //; s/ \(line [0-9]+\).*//') \
        <(grep -E '^(PASS|FAIL)' "$work/snapdir/out.txt" | sed -E 's/^(PASS|FAIL) //; s/ \(line [0-9]+\).*//') >/dev/null; then
  echo "PASS both runs executed the same checks"; passed=$((passed+1))
else
  echo "FAIL the runs executed different checks"; failed=$((failed+1))
fi
check_data "$work/realdir" "real libblkio"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
