#!/usr/bin/env bash
# Block-level record/replay of the snapshot device (docs/readahead.md, "Block-level record and
# replay in the snapshot device"):
#   1. hot-path cost of recording: `snapblk bench` 4 KiB random reads QD1 on a snapshot on tmpfs,
#      without and with `record=` (window open for the whole run), interleaved, RUNS times (IOPS);
#   2. what a replay buys a cold start: on the disk (ext4), evict base and COW, then read a
#      "start-up set" (N random 64 KiB ranges) through `snapblk serve --nbd` with qemu-io, cold vs
#      after `--readahead` of the same list; also the replay's own time.
# Prints per-run figures and medians. The machine is shared: note the load averages printed.
#
# Usage: bench/snapshot-readahead.sh [-s SIZE_MIB] [-r RUNS] [-n RANGES] [-t SECS]
# Needs: qemu-io (qemu-utils), jq, python3, a release build of snapblk (built here if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_MIB=128 RUNS=5 RANGES=256 SECS=3
while getopts "s:r:n:t:" o; do
  case $o in
    s) SIZE_MIB=$OPTARG ;; r) RUNS=$OPTARG ;; n) RANGES=$OPTARG ;; t) SECS=$OPTARG ;;
    *) echo "usage: $0 [-s SIZE_MIB] [-r RUNS] [-n RANGES] [-t SECS]" >&2; exit 2 ;;
  esac
done
for t in qemu-io jq python3; do
  command -v "$t" >/dev/null || { echo "missing $t (scripts/install-deps.sh)" >&2; exit 1; }
done
[ -x target/release/snapblk ] || cargo build --release -p snapblk-cli
SNAPBLK=$PWD/target/release/snapblk

SHM=$(mktemp -d /dev/shm/snapra.XXXXXX)
DISK=$(mktemp -d /var/tmp/snapra.XXXXXX)
SPID=""
cleanup() { [ -n "$SPID" ] && kill "$SPID" 2>/dev/null; rm -rf "$SHM" "$DISK"; }
trap cleanup EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# The new image is the old one rotated by a quarter (COPY ops) with 1/16 of the blocks rewritten
# (REPLACE, lz4) — the shape of an OTA that moves files and changes a few.
head -c $((SIZE_MIB << 20)) /dev/urandom >"$SHM/old.img"
python3 - "$SHM/old.img" "$SHM/new.img" <<'EOF'
import os, random, sys
old = open(sys.argv[1], 'rb').read()
q = len(old) // 4
new = bytearray(old[q:] + old[:q])
rng = random.Random(1)
for b in rng.sample(range(len(new) // 4096), len(new) // 4096 // 16):
    new[b * 4096:(b + 1) * 4096] = bytes([rng.randrange(256)]) * 2048 + os.urandom(2048)
open(sys.argv[2], 'wb').write(new)
EOF
"$SNAPBLK" cow create --old "$SHM/old.img" --new "$SHM/new.img" -o "$SHM/snap.cow" --json \
  >/dev/null
rm "$SHM/new.img"
echo "load before: $(cat /proc/loadavg)"

echo "== 1. hot path: 4 KiB random reads QD1, ${SECS}s, tmpfs (IOPS)"
bench() {
  "$SNAPBLK" bench "$1" --rw randread --bs 4k --runtime "$SECS" --time_based --json 2>/dev/null \
    | jq '.results[0].runs[0].iops'
}
BASE_SPEC="snapshot:base=$SHM/old.img,cow=$SHM/snap.cow"
: >"$SHM/plain" ; : >"$SHM/rec"
for i in $(seq "$RUNS"); do
  a=$(bench "$BASE_SPEC")
  b=$(bench "$BASE_SPEC,record=$SHM/rec.blocks,record-secs=0")
  echo "run $i: plain $a  recording $b"
  echo "$a" >>"$SHM/plain"; echo "$b" >>"$SHM/rec"
done
pm=$(median <"$SHM/plain"); rm_=$(median <"$SHM/rec")
echo "median IOPS: plain $pm  recording $rm_  ratio $(echo "$rm_ / $pm" | bc -l | cut -c1-5)"
echo "load: $(cat /proc/loadavg)"

echo "== 2. cold start set: $RANGES random 64 KiB ranges over NBD (ext4 disk)"
cp "$SHM/old.img" "$SHM/snap.cow" "$DISK/"
rm -f "$SHM/old.img"
CAP=$(stat -c %s "$DISK/old.img")
python3 - "$CAP" "$RANGES" "$DISK/list.blocks" "$DISK/cmds" <<'EOF'
import random, sys
cap, n = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(7)
offs = sorted(rng.sample(range(cap // 65536), n))
with open(sys.argv[3], 'w') as f:
    f.write("# snapblk-block-list v1\n")
    for o in offs:
        f.write(f"{o * 65536}:65536\n")
rng.shuffle(offs)  # clients read in their own order
with open(sys.argv[4], 'w') as f:
    for o in offs:
        f.write(f"read {o * 65536} 65536\n")
EOF
QARGS=()
while read -r c; do QARGS+=(-c "$c"); done <"$DISK/cmds"

# serve [extra args]: start serve over a unix socket, wait for "ready"; sets SPID and OUT.
serve() {
  OUT=$DISK/out.$RANDOM
  "$SNAPBLK" serve --base "$DISK/old.img" --cow "$DISK/snap.cow" --nbd "unix:$DISK/s.sock" \
    --json "$@" >"$OUT" 2>"$OUT.err" &
  SPID=$!
  for _ in $(seq 500); do grep -q '"ready"' "$OUT" 2>/dev/null && return 0; sleep 0.02; done
  echo "server did not start: $(cat "$OUT.err")" >&2; exit 1
}
stop() { kill -TERM "$SPID"; wait "$SPID" || true; SPID=""; }
evict() { "$SNAPBLK" readahead evict "$DISK/old.img" "$DISK/snap.cow" >/dev/null; }
readset() {
  local t0 t1
  t0=$(date +%s.%N)
  qemu-io -f raw -r "${QARGS[@]}" "nbd+unix:///?socket=$DISK/s.sock" >/dev/null
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l | cut -c1-6
}
: >"$SHM/cold"; : >"$SHM/warm"; : >"$SHM/replay"
for i in $(seq "$RUNS"); do
  evict; serve; c=$(readset); stop
  evict; serve --readahead "$DISK/list.blocks"
  for _ in $(seq 3000); do grep -q '"event":"readahead"' "$OUT" && break; sleep 0.01; done
  r=$(grep '"event":"readahead"' "$OUT" | jq -r '"\(.readahead.elapsed_us / 1e6) \(.readahead.bytes) \(.readahead.state)"')
  w=$(readset); stop
  echo "run $i: cold read ${c}s  replay (s, bytes, state) $r  read after replay ${w}s"
  echo "$c" >>"$SHM/cold"; echo "$w" >>"$SHM/warm"; echo "${r%% *}" >>"$SHM/replay"
done
echo "median: cold read $(median <"$SHM/cold") s  replay $(median <"$SHM/replay") s  read after replay $(median <"$SHM/warm") s"
echo "load after: $(cat /proc/loadavg)"
