#!/usr/bin/env bash
# 4 KiB random read, QD1 and QD32, through a qemu-storage-daemon vhost-user-blk export of a
# 1 GiB file on tmpfs: snapblk's libblkio.so.1 vs the real libblkio 1.5 (Debian trixie, fetched
# by bench/real-libblkio.sh), both with driver virtio-blk-vhost-user, driven by the same C client
# (bench/c/blkio_bench.c, BLKIO_DRIVER=virtio-blk-vhost-user) on the same daemon. Runs are
# interleaved and repeated (ROUNDS, default 5; SECS per run, default 3); prints the median IOPS,
# the client's CPU time per I/O (user + system, getrusage) and the ratios snapblk / real.
# The daemon's own CPU is the same backend for both and is not counted.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ROUNDS=${ROUNDS:-5}; SECS=${SECS:-3}
qsd=/usr/bin/qemu-storage-daemon
[ -x "$qsd" ] || { echo "$qsd missing (scripts/install-deps.sh)"; exit 1; }
real=$(bash bench/real-libblkio.sh)
realinc=$(cd "$real/../../include" && pwd)
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -p snapblk-capi >&2
tgt=${CARGO_TARGET_DIR:-$root/target}
work=$(mktemp -d /tmp/snapblk-vu-bench.XXXXXX)
shm=$(mktemp -d /dev/shm/snapblk-vu-bench.XXXXXX)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work" "$shm"; }
trap cleanup EXIT
mkdir -p "$work/snap"
ln -sf "$tgt/release/libblkio.so" "$work/snap/libblkio.so.1"
gcc -O2 -Wall -I "$realinc" bench/c/blkio_bench.c -L "$real" -l:libblkio.so.1 -o "$work/bench"
head -c 1G /dev/urandom > "$shm/disk.img"
"$qsd" --blockdev "driver=file,node-name=file0,filename=$shm/disk.img" \
  --export "type=vhost-user-blk,id=exp0,addr.type=unix,addr.path=$work/vhost.sock,node-name=file0,writable=on,num-queues=1" \
  > "$work/qsd.log" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -S "$work/vhost.sock" ] && break; sleep 0.05; done
[ -S "$work/vhost.sock" ] || { cat "$work/qsd.log"; echo "qemu-storage-daemon did not start"; exit 1; }
declare -A iops cpu
for r in $(seq "$ROUNDS"); do
  for qd in 1 32; do
    for lib in real snap; do
      dir=$real; [ "$lib" = snap ] && dir=$work/snap
      out=$(BLKIO_DRIVER=virtio-blk-vhost-user LD_LIBRARY_PATH="$dir" "$work/bench" "$work/vhost.sock" "$qd" "$SECS" 0)
      iops[$lib,$qd]+="$(echo "$out" | sed 's/.*iops=\([0-9]*\).*/\1/') "
      cpu[$lib,$qd]+="$(echo "$out" | sed 's/.*cpu_ns_per_io=\([0-9]*\).*/\1/') "
    done
  done
  echo "round $r/$ROUNDS done" >&2
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
echo "4 KiB random read, vhost-user-blk (qemu-storage-daemon $("$qsd" --version | head -1 | awk '{print $3}'), 1 GiB on tmpfs), ${ROUNDS}x${SECS}s, medians"
printf '%-4s %14s %14s %7s %16s %16s %7s\n' QD "real IOPS" "snapblk IOPS" ratio "real ns/IO cpu" "snapblk ns/IO" ratio
for qd in 1 32; do
  ri=$(echo "${iops[real,$qd]}" | median); si=$(echo "${iops[snap,$qd]}" | median)
  rc=$(echo "${cpu[real,$qd]}" | median); sc=$(echo "${cpu[snap,$qd]}" | median)
  printf '%-4s %14.0f %14.0f %7.2f %16.0f %16.0f %7.2f\n' "$qd" "$ri" "$si" "$(echo "$si / $ri" | bc -l)" \
    "$rc" "$sc" "$(echo "$sc / $rc" | bc -l)"
done
