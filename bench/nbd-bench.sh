#!/usr/bin/env bash
# NBD read throughput: `snapblk serve --nbd` vs `qemu-nbd`, both serving the same raw image on
# tmpfs, read-only, over loopback TCP. Runs are interleaved (snapblk, qemu, snapblk, qemu, ...)
# and repeated; prints per-run figures, medians and the snapblk/qemu-nbd ratio.
#
# Workloads (each a fresh server start):
#   seq   nbdcopy --connections=C --requests=R URI null:   (whole image, MiB/s)
#   rand  fio --ioengine=nbd, 4 KiB random reads, iodepth 32, one connection (IOPS)
#
# Usage: bench/nbd-bench.sh [-s SIZE_MIB] [-r RUNS] [-c CONNECTIONS] [-o OUT.json]
# Needs: qemu-utils (qemu-nbd), libnbd-bin (nbdcopy), fio with the nbd engine, a release build
# of snapblk (built here if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_MIB=1024 RUNS=5 CONNS=4 OUT=""
while getopts "s:r:c:o:" o; do
  case $o in
    s) SIZE_MIB=$OPTARG ;; r) RUNS=$OPTARG ;; c) CONNS=$OPTARG ;; o) OUT=$OPTARG ;;
    *) echo "usage: $0 [-s SIZE_MIB] [-r RUNS] [-c CONNECTIONS] [-o OUT.json]" >&2; exit 2 ;;
  esac
done
for t in qemu-nbd nbdcopy fio nbdinfo; do
  command -v "$t" >/dev/null || { echo "missing $t (scripts/install-deps.sh)" >&2; exit 1; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "fio lacks the nbd engine" >&2; exit 1; }
[ -x target/release/snapblk ] || cargo build --release -p snapblk-cli
SNAPBLK=$PWD/target/release/snapblk

WORK=$(mktemp -d /dev/shm/nbd-bench.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
IMG=$WORK/disk.img
head -c $((SIZE_MIB << 20)) /dev/urandom >"$IMG"
PORT=10809
while (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null; do PORT=$((PORT + 1)); done

# start_server NAME: starts a server on $PORT, sets SPID.
start_server() {
  case $1 in
    snapblk) "$SNAPBLK" serve "$IMG" --read-only --nbd "127.0.0.1:$PORT" --json >"$WORK/ready" 2>"$WORK/err" & SPID=$! ;;
    qemu) qemu-nbd -r -f raw -t -x "" -e 16 --cache=writeback --aio=threads -b 127.0.0.1 -p "$PORT" "$IMG" 2>"$WORK/err" & SPID=$! ;;
  esac
  PIDS+=("$SPID")
  for _ in $(seq 200); do nbdinfo --size "nbd://127.0.0.1:$PORT" >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "$1 did not start: $(cat "$WORK/err")" >&2; exit 1
}
stop_server() { kill -TERM "$SPID"; wait "$SPID" 2>/dev/null || true; }

run_seq() {
  local t0 t1
  t0=$(date +%s.%N)
  nbdcopy --connections="$CONNS" --requests=64 "nbd://127.0.0.1:$PORT" null:
  t1=$(date +%s.%N)
  echo "$SIZE_MIB $t0 $t1" | awk '{printf "%.1f", $1 / ($3 - $2)}'
}
run_rand() {
  fio --name=r --ioengine=nbd --uri="nbd://127.0.0.1:$PORT" --rw=randread --bs=4k --iodepth=32 \
    --size="${SIZE_MIB}M" --time_based --runtime=5 --output-format=json 2>/dev/null |
    # fio's nbd engine prints "fio: connected to NBD server" before the JSON.
    python3 -c 'import json,sys; t=sys.stdin.read(); print("%.0f" % json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"])'
}

declare -A R
for run in $(seq "$RUNS"); do
  for srv in snapblk qemu; do
    start_server $srv; s=$(run_seq); stop_server
    start_server $srv; r=$(run_rand); stop_server
    R[$srv.seq]+="$s "; R[$srv.rand]+="$r "
    printf 'run %d %-8s seq %8s MiB/s   rand4k-qd32 %8s IOPS\n' "$run" "$srv" "$s" "$r"
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
ss=$(echo "${R[snapblk.seq]}" | median); qs=$(echo "${R[qemu.seq]}" | median)
sr=$(echo "${R[snapblk.rand]}" | median); qr=$(echo "${R[qemu.rand]}" | median)
echo
echo "image ${SIZE_MIB} MiB on tmpfs, $RUNS interleaved runs, nbdcopy --connections=$CONNS"
printf '%-28s %12s %12s %8s\n' "median" "snapblk" "qemu-nbd" "ratio"
printf '%-28s %12s %12s %8s\n' "seq read (nbdcopy) MiB/s" "$ss" "$qs" "$(awk -v a="$ss" -v b="$qs" 'BEGIN{printf "%.2f", a/b}')"
printf '%-28s %12s %12s %8s\n' "4k rand read QD32 (fio) IOPS" "$sr" "$qr" "$(awk -v a="$sr" -v b="$qr" 'BEGIN{printf "%.2f", a/b}')"
arr() { echo "$1" | xargs | tr ' ' ','; }
if [ -n "$OUT" ]; then
  cat >"$OUT" <<JSON
{"size_mib": $SIZE_MIB, "runs": $RUNS, "connections": $CONNS,
 "seq_mib_s": {"snapblk": [$(arr "${R[snapblk.seq]}")], "qemu_nbd": [$(arr "${R[qemu.seq]}")], "median_snapblk": $ss, "median_qemu_nbd": $qs},
 "rand4k_qd32_iops": {"snapblk": [$(arr "${R[snapblk.rand]}")], "qemu_nbd": [$(arr "${R[qemu.rand]}")], "median_snapblk": $sr, "median_qemu_nbd": $qr}}
JSON
fi
