#!/usr/bin/env bash
# fio agreement: six standard patterns run by `snapblk bench` and by fio (io_uring engine) on the
# same targets (a tmpfs file and /dev/zram0, both O_DIRECT), interleaved round by round with the
# tool order alternating; prints median IOPS and mean latency of both tools and their ratios.
# Then the tools' own overhead: snapblk's `null` driver vs fio's null engine.
#
# fio runs with the kernel data path snapblk's io_uring driver uses (registered file, registered
# buffers, non-vectored READ/WRITE: FIO_URING_OPTS), so the comparison is between the two
# measuring tools, not between two ways of driving io_uring.
#
# Both tools write the same kind of data, which matters on zram (it compresses every page, and
# lzo gives up on truly random pages ~2x sooner than on fio's random-but-stamped ones): random
# buffers filled once and scrambled per write (fio's defaults, snapblk bench's defaults since
# it has fio's buffer options). BUF_OPTS (e.g. "--refill_buffers" or
# "--buffer_compress_percentage=50") is passed to both tools to compare other data.
#
# Usage (root for zram): bash bench/fio-agreement.sh          (env: ROUNDS=3 RUNTIME=5 RAMP=1
#   SIZE=1G SNAPBLK=target/release/snapblk ZRAM_WAIT=600 OUT=fio-agreement.md BUF_OPTS=)
# Needs: fio (Debian package), python3. zram0 is configured only if its disksize is 0 (and reset
# afterwards); if another job holds it, the script waits up to ZRAM_WAIT seconds, then skips zram.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-5}
RAMP=${RAMP:-1}
SIZE=${SIZE:-1G}
SNAPBLK=${SNAPBLK:-target/release/snapblk}
ZRAM_WAIT=${ZRAM_WAIT:-600}
OUT=${OUT:-}
FIO_URING_OPTS=${FIO_URING_OPTS:---fixedbufs --registerfiles --nonvectored=1}
BUF_OPTS=${BUF_OPTS:-}
command -v fio >/dev/null || { echo "fio missing (apt-get install fio)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 missing" >&2; exit 1; }
[ -x "$SNAPBLK" ] || cargo build --release -p snapblk-cli >&2

work=$(mktemp -d)
shm=/dev/shm/snapblk-fio-agree.$$.img
zram_set=0
cleanup() {
  rm -rf "$work" "$shm"
  if [ "$zram_set" = 1 ]; then echo 1 > /sys/block/zram0/reset || true; fi
}
trap cleanup EXIT
# A private copy: a concurrent `cargo build` may replace target/release/snapblk mid-run.
cp "$SNAPBLK" "$work/snapblk"
SNAPBLK=$work/snapblk

# name rw bs iodepth
PATTERNS=(
  "seqread-1m-qd32 read 1M 32"
  "seqwrite-1m-qd32 write 1M 32"
  "randread-4k-qd1 randread 4k 1"
  "randread-4k-qd32 randread 4k 32"
  "randwrite-4k-qd1 randwrite 4k 1"
  "randwrite-4k-qd32 randwrite 4k 32"
)

targets=()
echo "preparing tmpfs target $shm ($SIZE)" >&2
dd if=/dev/urandom of="$shm" bs=1M count=$(( $(numfmt --from=iec "$SIZE") >> 20 )) status=none
targets+=("tmpfs:$shm")

if [ -b /dev/zram0 ] && [ "$(id -u)" = 0 ]; then
  waited=0
  while [ "$(cat /sys/block/zram0/disksize)" != 0 ] && [ "$waited" -lt "$ZRAM_WAIT" ]; do
    [ "$waited" = 0 ] && echo "zram0 is in use by another job; waiting up to ${ZRAM_WAIT}s" >&2
    sleep 5; waited=$((waited + 5))
  done
  if [ "$(cat /sys/block/zram0/disksize)" = 0 ]; then
    echo "$SIZE" > /sys/block/zram0/disksize; zram_set=1
    echo "preparing zram target /dev/zram0 ($SIZE)" >&2
    dd if=/dev/urandom of=/dev/zram0 bs=1M count=$(( $(numfmt --from=iec "$SIZE") >> 20 )) oflag=direct status=none
    targets+=("zram:/dev/zram0")
  else
    echo "SKIPPED zram: still in use after ${ZRAM_WAIT}s" >&2
  fi
else
  echo "SKIPPED zram: needs root and /dev/zram0" >&2
fi

results="$work/results.tsv"
: > "$results"

# run_fio TARGETNAME PATTERN FILE RW BS QD ENGINE ROUND
run_fio() {
  local tname=$1 pname=$2 file=$3 rw=$4 bs=$5 qd=$6 engine=$7 round=$8
  local extra=(--direct=1 --filename="$file")
  # shellcheck disable=SC2206 # word splitting of the option list is intended
  [ "$engine" = io_uring ] && extra+=($FIO_URING_OPTS)
  [ "$engine" = null ] && extra=()
  # shellcheck disable=SC2206 # word splitting of the option list is intended
  extra+=($BUF_OPTS)
  fio --name=agree --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=1 --ioengine="$engine" \
      --size="$SIZE" --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" --group_reporting \
      --randrepeat=0 --output-format=json "${extra[@]}" > "$work/fio.json"
  python3 - "$work/fio.json" "$tname" "$pname" "$round" >> "$results" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
j = d["jobs"][0]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
iops = j["read"]["iops"] + j["write"]["iops"]
lat = ((j["read"]["lat_ns"]["mean"] * j["read"]["total_ios"] + j["write"]["lat_ns"]["mean"] * j["write"]["total_ios"]) / ios) if ios else 0
print(f"{sys.argv[2]}\t{sys.argv[3]}\tfio\t{sys.argv[4]}\t{iops:.1f}\t{lat:.1f}")
PY
}

# run_snapblk TARGETNAME PATTERN SPEC RW BS QD DIRECT ROUND
run_snapblk() {
  local tname=$1 pname=$2 spec=$3 rw=$4 bs=$5 qd=$6 direct=$7 round=$8
  local extra=()
  [ "$direct" = 1 ] && extra=(--direct)
  # shellcheck disable=SC2206 # word splitting of the option list is intended
  extra+=($BUF_OPTS)
  "$SNAPBLK" bench "$spec" --rw "$rw" --bs "$bs" --iodepth "$qd" --numjobs 1 --size "$SIZE" \
      --runtime "$RUNTIME" --ramp_time "$RAMP" --json --output "$work/snap.json" "${extra[@]}" > /dev/null 2>"$work/snap.err" \
      || { cat "$work/snap.err" >&2; exit 1; }
  python3 - "$work/snap.json" "$tname" "$pname" "$round" >> "$results" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["results"][0]["summary"]
print(f"{sys.argv[2]}\t{sys.argv[3]}\tsnapblk\t{sys.argv[4]}\t{s['iops']['mean']:.1f}\t{s['lat_ns']['mean']:.1f}")
PY
}

for round in $(seq 1 "$ROUNDS"); do
  for t in "${targets[@]}"; do
    tname=${t%%:*}; file=${t#*:}
    for p in "${PATTERNS[@]}"; do
      read -r pname rw bs qd <<< "$p"
      echo "round $round/$ROUNDS $tname $pname" >&2
      # Alternate which tool goes first so neither always runs on a warmer/colder machine.
      if [ $((round % 2)) = 1 ]; then
        run_fio "$tname" "$pname" "$file" "$rw" "$bs" "$qd" io_uring "$round"
        run_snapblk "$tname" "$pname" "$file" "$rw" "$bs" "$qd" 1 "$round"
      else
        run_snapblk "$tname" "$pname" "$file" "$rw" "$bs" "$qd" 1 "$round"
        run_fio "$tname" "$pname" "$file" "$rw" "$bs" "$qd" io_uring "$round"
      fi
    done
  done
  # Tool overhead: no device at all.
  for p in "randread-4k-qd1 randread 4k 1" "randread-4k-qd32 randread 4k 32"; do
    read -r pname rw bs qd <<< "$p"
    echo "round $round/$ROUNDS null $pname" >&2
    run_fio null "$pname" none "$rw" "$bs" "$qd" null "$round"
    run_snapblk null "$pname" "null:size=$SIZE" "$rw" "$bs" "$qd" 0 "$round"
  done
done

report() {
python3 - "$results" "$ROUNDS" "$RUNTIME" "$(uname -r)" "$(cat /proc/loadavg)" <<'PY'
import sys, statistics as st
from collections import defaultdict
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
d = defaultdict(lambda: {"iops": [], "lat": []})
order = []
for t, p, tool, r, iops, lat in rows:
    if (t, p) not in order:
        order.append((t, p))
    d[(t, p, tool)]["iops"].append(float(iops))
    d[(t, p, tool)]["lat"].append(float(lat))
def cv(v):
    return (st.stdev(v) / st.mean(v) * 100) if len(v) > 1 and st.mean(v) else 0.0
print(f"fio agreement: {sys.argv[2]} interleaved rounds x {sys.argv[3]} s per run, kernel {sys.argv[4]}, loadavg at end {sys.argv[5].split()[0]}")
print("medians over rounds; CV = spread of the rounds; ratio = snapblk / fio")
print()
print("| target | pattern | fio IOPS (CV) | snapblk IOPS (CV) | IOPS ratio | fio mean lat | snapblk mean lat | lat ratio |")
print("|---|---|---|---|---|---|---|---|")
within = total = 0
for t, p in order:
    f, s = d[(t, p, "fio")], d[(t, p, "snapblk")]
    fi, si = st.median(f["iops"]), st.median(s["iops"])
    fl, sl = st.median(f["lat"]), st.median(s["lat"])
    ri, rl = si / fi if fi else 0, sl / fl if fl else 0
    if t != "null":
        total += 1
        within += abs(ri - 1) <= 0.05 and abs(rl - 1) <= 0.05
    print(f"| {t} | {p} | {fi:,.0f} ({cv(f['iops']):.0f}%) | {si:,.0f} ({cv(s['iops']):.0f}%) | {ri:.3f} | {fl/1000:.1f} µs | {sl/1000:.1f} µs | {rl:.3f} |")
print()
print(f"{within} of {total} device cells within ±5% on both IOPS and mean latency")
PY
}
if [ -n "$OUT" ]; then report | tee "$OUT"; else report; fi
