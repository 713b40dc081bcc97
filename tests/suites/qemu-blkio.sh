#!/usr/bin/env bash
# QEMU 10 end to end: Debian trixie's qemu-io and qemu-img (bench/trixie-qemu.sh fetches them
# without installing anything) run through trixie's own loader with snapblk's libblkio.so.1 as
# the only libblkio on the library path, so QEMU's blkio block driver runs on snapblk unchanged.
# Drivers: io_uring on a file, and virtio-blk-vhost-user on a qemu-storage-daemon export (the
# host's, one daemon per case, stopped by pid); QEMU's `fd` probe runs on every open. Data is
# checked in the files with cmp after the daemons exit. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
die() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }
qsd=/usr/bin/qemu-storage-daemon
[ -x "$qsd" ] || die "$qsd not found (scripts/install-deps.sh installs qemu-system-common)"
cargo build --release -p snapblk-capi || die "cargo build -p snapblk-capi"
tgt=${CARGO_TARGET_DIR:-$root/target}
q10=$(bash bench/trixie-qemu.sh) || die "could not fetch trixie's QEMU (needs deb.debian.org)"
L=$q10/usr/lib/x86_64-linux-gnu
[ ! -e "$L/libblkio.so.1" ] || die "the trixie tree has its own libblkio.so.1"
work=$(mktemp -d /tmp/snapblk-qemu.XXXXXX)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/lib"
ln -sf "$tgt/release/libblkio.so" "$work/lib/libblkio.so.1"
qemu() {  # qemu TOOL ARGS...
  local t=$1; shift
  timeout 120 env QEMU_MODULE_DIR="$L/qemu" "$L/ld-linux-x86-64.so.2" --library-path "$work/lib:$L" \
    "$q10/usr/bin/$t" "$@"
}
passed=0; failed=0
ok() { echo "PASS $*"; passed=$((passed+1)); }
bad() { echo "FAIL $*"; failed=$((failed+1)); }
run() {  # run NAME CMD...: passes when the command exits 0 and reports no failure
  local name=$1; shift
  if out=$("$@" 2>&1) && ! echo "$out" | grep -qiE 'fail|error'; then ok "$name"
  else echo "$out" | sed 's/^/  /' | tail -20; bad "$name"; fi
}
start_daemon() {  # start_daemon DIR
  truncate -s 64M "$1/disk.img"
  "$qsd" --blockdev "driver=file,node-name=file0,filename=$1/disk.img" \
    --export "type=vhost-user-blk,id=exp0,addr.type=unix,addr.path=$1/vhost.sock,node-name=file0,writable=on,num-queues=2" \
    > "$1/qsd.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do [ -S "$1/vhost.sock" ] && return 0; sleep 0.05; done
  return 1
}
stop_daemon() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=""; }
pat() { head -c "$2" /dev/zero | tr '\0' "\\$(printf '%03o' "$1")"; }  # pat BYTE LEN

# A 4 MiB source image with data (for convert / compare).
head -c 4194304 /dev/urandom > "$work/src.img"

# --- io_uring on a file (QEMU's own io_uring code is not involved: driver=io_uring is blkio's).
truncate -s 16M "$work/u.img"
for direct in off on; do
  run "io_uring cache.direct=$direct: qemu-io write/read/discard/write-zeroes/flush" \
    qemu qemu-io --image-opts "driver=io_uring,filename=$work/u.img,cache.direct=$direct" \
      -c 'write -P 0xab 0 64k' -c 'read -P 0xab 0 64k' -c 'write -z 64k 64k' -c 'read -P 0 64k 64k' \
      -c 'write -P 0x5c 1M 128k' -c flush -c 'discard 2M 64k'
done
if cmp -s <(head -c 65536 "$work/u.img") <(pat 171 65536) \
   && cmp -s <(tail -c +1048577 "$work/u.img" | head -c 131072) <(pat 92 131072); then
  ok "io_uring: the data is in the file"; else bad "io_uring: the file does not hold the data"; fi
run "io_uring: qemu-img convert into the file" \
  qemu qemu-img convert -n -f raw --target-image-opts "$work/src.img" "driver=io_uring,filename=$work/u.img"
if cmp -s "$work/src.img" <(head -c 4194304 "$work/u.img"); then ok "io_uring: convert wrote the source"
else bad "io_uring: convert result differs"; fi

# --- virtio-blk-vhost-user on qemu-storage-daemon.
vu=$work/vu; mkdir -p "$vu"
start_daemon "$vu" || die "qemu-storage-daemon did not start"
opts="driver=virtio-blk-vhost-user,path=$vu/vhost.sock,cache.direct=on"
run "vhost-user: qemu-io write/read/discard/write-zeroes/flush" \
  qemu qemu-io --image-opts "$opts" \
    -c 'write -P 0xcd 0 64k' -c 'read -P 0xcd 0 64k' -c 'discard 0 64k' -c 'write -z 64k 64k' \
    -c 'read -P 0 64k 64k' -c flush -c 'write -P 0x11 1M 128k' -c 'read -P 0x11 1M 128k' \
    -c 'writev -P 0x22 2M 4k 8k 4k' -c 'readv -P 0x22 2M 4k 8k 4k' -c 'write -f -P 0x33 3M 4k' \
    -c 'write -P 0x44 4M 64k' -c 'write -z -f 4M 64k' -c 'read -P 0 4M 64k'
if out=$(qemu qemu-img info --image-opts "$opts" 2>&1) && echo "$out" | grep -q 'virtual size: 64 MiB'; then
  ok "vhost-user: qemu-img info sees 64 MiB"; else echo "$out" | sed 's/^/  /'; bad "vhost-user: qemu-img info"; fi
if out=$(qemu qemu-io --image-opts "driver=virtio-blk-vhost-user,path=$vu/vhost.sock" -c 'read 0 4k' 2>&1); then
  bad "vhost-user without cache.direct=on must be refused"
elif echo "$out" | grep -q 'cache.direct=off is not supported'; then
  ok "vhost-user: cache.direct=off refused as with the real libblkio"
else echo "$out" | sed 's/^/  /'; bad "vhost-user: unexpected error without cache.direct"; fi
stop_daemon
expect() {  # expect FILE OFFSET BYTE LEN
  cmp -s <(tail -c +$(($2 + 1)) "$1" | head -c "$4") <(pat "$3" "$4")
}
if expect "$vu/disk.img" 1048576 17 131072 && expect "$vu/disk.img" 65536 0 65536 \
   && expect "$vu/disk.img" 2097152 34 16384 && expect "$vu/disk.img" 3145728 51 4096 \
   && expect "$vu/disk.img" 4194304 0 65536; then
  ok "vhost-user: the data is in the file after the daemon exited"
else bad "vhost-user: the file does not hold the data"; fi

vc=$work/vc; mkdir -p "$vc"
start_daemon "$vc" || die "qemu-storage-daemon did not start"
opts="driver=virtio-blk-vhost-user,path=$vc/vhost.sock,cache.direct=on"
run "vhost-user: qemu-img convert into the export" \
  qemu qemu-img convert -n -f raw --target-image-opts "$work/src.img" "$opts"
run "vhost-user: qemu-img compare with the source" \
  qemu qemu-img compare --image-opts "$opts" "driver=file,filename=$work/src.img"
stop_daemon
if cmp -s "$work/src.img" <(head -c 4194304 "$vc/disk.img"); then
  ok "vhost-user: convert wrote the source into the file"
else bad "vhost-user: the converted file differs"; fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
