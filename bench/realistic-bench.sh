#!/usr/bin/env bash
# Realistic-COW goals (the snapuserd comparison): builds the change-heavy ext4 pair with
# bench/cow/make-pair.py, the COWs with `snapblk cow create` (v3 lz4, v2 lz4, v3 zstd with 64 KiB
# units, each with its COW record, as `cow create` writes by default), and prints side by side in
# one run:
#  * 4 KiB QD1 reads of the whole device through the snapshot (in process), sequential and
#    random, vs `pread` of the new image (goal >= 0.8x for lz4, >= 0.6x for zstd 64 KiB);
#  * `snapblk merge` (record check, pre-merge check, merge, fsyncs) vs `cp --sparse=never` of
#    the image + sync (goal >= 0.95x);
#  * with SECTIONS containing `ir`: user-space instructions per read under callgrind (free of
#    the timing noise of a shared machine);
#  * with SECTIONS containing `nbd`: the same reads through the NBD export (`snapblk serve
#    --nbd`, fio's nbd engine, 4 KiB QD1, sequential and random, 5 s each) of the v3 lz4 snapshot
#    (record checks on, as served by default) vs the same export of the raw new image.
# The COPY-only read and worst-case merge goals are bench/snapshot-bench.sh's copy and merge
# sections. Android's own figures (snapuserd, same pair) are reference figures in
# ../shared/notes/anchor-figures.md and README.md, not run here.
# usage: bench/realistic-bench.sh [DIR] [IMAGE_MiB] [ROUNDS] [SECTIONS]
#        (defaults: /dev/shm/snapblk-realistic 256 7 reads,merge; SECTIONS also takes ir, nbd)
# results: bench/results/scratch/realistic-<time>.json (JSON), then the table of medians of the
#          paired per-round ratios with their range [min-max], as the docs quote them
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/dev/shm/snapblk-realistic}
mib=${2:-256}
rounds=${3:-7}
sections=${4:-reads,merge}
cargo build --release -p snapblk-cli --bin snapblk -p snapblk-snapshot --example realistic_perf >&2
mkdir -p "$dir" bench/results/scratch
if [ ! -s "$dir/new.img" ] || [ "$(stat -c %s "$dir/new.img")" != $((mib << 20)) ]; then
  python3 bench/cow/make-pair.py "$dir" "$mib" >&2
fi
s=./target/release/snapblk
cows=(v3-lz4.cow v2-lz4.cow v3-zstd64k.cow)
$s cow create --old "$dir/old.img" --new "$dir/new.img" -o "$dir/v3-lz4.cow" >&2
$s cow create --old "$dir/old.img" --new "$dir/new.img" -o "$dir/v2-lz4.cow" --format v2 >&2
$s cow create --old "$dir/old.img" --new "$dir/new.img" -o "$dir/v3-zstd64k.cow" \
  --compression zstd --unit 65536 >&2
out=bench/results/scratch/realistic-$(date +%Y%m%d-%H%M%S).json
timed=$(echo "$sections" | tr ',' '\n' | grep -vE '^(ir|nbd)$' | paste -sd, || true)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
nbd_run() {  # nbd_run raw|snap RW: MiB/s of 4 KiB QD1 reads through a fresh server
  local port=10809 pid
  while (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; do port=$((port + 1)); done
  if [ "$1" = raw ]; then
    $s serve "$dir/new.img" --read-only --nbd "127.0.0.1:$port" >/dev/null 2>"$dir/nbd.err" &
  else
    $s serve --base "$dir/old.img" --cow "$dir/v3-lz4.cow" --read-only --nbd "127.0.0.1:$port" \
      >/dev/null 2>"$dir/nbd.err" &
  fi
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 200); do nbdinfo --size "nbd://127.0.0.1:$port" >/dev/null 2>&1 && break; sleep 0.05; done
  fio --name=r --ioengine=nbd --uri="nbd://127.0.0.1:$port" --rw="$2" --bs=4k --iodepth=1 \
    --size="${mib}M" --time_based --runtime=5 --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); print("%.1f" % (json.loads(t[t.index("{"):])["jobs"][0]["read"]["bw"] / 1024))'
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
}
{
  if [ -n "$timed" ]; then
    ./target/release/examples/realistic_perf "$dir" "$rounds" "$timed" "${cows[@]}"
  fi
  if [[ ",$sections," == *",nbd,"* ]]; then
    echo '{"nbd_qd1_mib_s": {'
    for rw in read randread; do
      raw=() snap=()
      for _ in $(seq "$rounds"); do raw+=("$(nbd_run raw $rw)"); snap+=("$(nbd_run snap $rw)"); done
      python3 - "$rw" "${raw[*]}" "${snap[*]}" <<'PY'
import statistics, sys
rw, raw, snap = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
r = [s / w for s, w in zip(snap, raw)]
print('"%s": {"raw": %.1f, "snapshot_v3_lz4": %.1f, "ratio": %.3f, "ratio_min": %.3f, "ratio_max": %.3f}%s'
      % (rw, statistics.median(raw), statistics.median(snap), statistics.median(r), min(r), max(r),
         "," if rw == "read" else ""))
PY
    done
    echo '}}'
  fi
  if [[ ",$sections," == *",ir,"* ]]; then
    # Instructions per read: two runs (one and two passes over the device, each pass on a
    # fresh open) differ by one pass; divided by the blocks of a pass.
    blocks=$(( mib * 256 ))
    echo '{"ir_per_read": {'
    first=1
    for c in "${cows[@]}"; do
      for p in sequential random; do
        ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null \
          ./target/release/examples/realistic_perf --ir "$dir" "$c" "$p" "$1" 2>&1 |
          awk '/refs:/{gsub(",","",$4); print $4}'; }
        a=$(ir "$blocks"); b=$(ir $((2 * blocks)))
        [ $first = 1 ] || echo ','
        first=0
        printf '"%s %s": %d' "$c" "$p" $(( (b - a) / blocks ))
      done
    done
    echo '}}'
  fi
} | tee "$out"
echo "wrote $out" >&2
# The issue's table: every row as the median of the paired per-round ratios [min-max].
python3 - "$out" <<'PY'
import json, sys
text, objs, dec, i = open(sys.argv[1]).read(), {}, json.JSONDecoder(), 0
while i < len(text):
    if text[i].isspace():
        i += 1
        continue
    o, i = dec.raw_decode(text, i)
    objs.update(o)
def cell(d, key):
    if not d:
        return "-"
    return "%.2fx [%.2f-%.2f]" % (d[key], d[key + "_min"], d[key + "_max"])
reads, merge = objs.get("reads", {}), objs.get("merge", {})
cows = sorted({c for p in reads.values() for c in p if c.endswith(".cow")} | {c for c in merge if c.endswith(".cow")})
print("\n| COW | 4 KiB QD1 sequential vs pread | random vs pread | merge vs cp --sparse=never + sync |")
print("|---|---|---|---|")
for c in cows:
    print("| %s | %s | %s | %s |" % (c[:-4], cell(reads.get("sequential", {}).get(c), "vs_pread"),
          cell(reads.get("random", {}).get(c), "vs_pread"), cell(merge.get(c), "vs_cp")))
for p in ("sequential", "random"):
    if p in reads:
        print("pread of the new image, %s: %.0f MiB/s (median)" % (p, reads[p]["pread_mib_s"]))
if "cp_s" in merge:
    print("cp: %.3f s (median)" % merge["cp_s"])
for rw, d in objs.get("nbd_qd1_mib_s", {}).items():
    print("NBD %s, v3 lz4 vs the raw image: %.2fx [%.2f-%.2f]" % (rw, d["ratio"], d["ratio_min"], d["ratio_max"]))
for k, v in objs.get("ir_per_read", {}).items():
    print("instructions per read, %s: %d" % (k, v))
PY
