#!/usr/bin/env bash
# fio agreement: six standard patterns run by `snapblk bench` and by fio (io_uring engine) on the
# same targets (a tmpfs file and /dev/zram0, both O_DIRECT), interleaved round by round with the
# tool order alternating; prints median IOPS and mean latency of both tools and their ratios,
# and where the mean latency goes in each (fio's slat and clat, which snapblk bench reports too).
# Then the tools' own overhead: snapblk's `null` driver vs fio's null engine (at QD32 both with
# iodepth_batch_submit=32 and iodepth_batch_complete_max=32: with fio's defaults its null engine
# refuses a second request until the first is reaped, i.e. runs at depth 1 whatever iodepth says).
#
# fio runs with the kernel data path snapblk's io_uring driver uses (registered file, registered
# buffers, non-vectored READ/WRITE: FIO_URING_OPTS), so the comparison is between the two
# measuring tools, not between two ways of driving io_uring. The other direction too: snapblk
# opens the target with `inline-qd1=false` (when its io_uring driver has that property), because
# on targets without NOWAIT (tmpfs, zram) the driver would otherwise run QD1 requests with
# preadv2/pwritev2 in the calling thread, a path fio's io_uring engine does not have. Both tools
# submit and reap the same way (fio's defaults iodepth_batch_submit=1 and
# iodepth_batch_complete_min/max=1 are snapblk bench's defaults too), and both report `lat`:
# from the moment an I/O is queued to the moment the tool sees its completion.
#
# A second table compares what each tool does by default at QD1 with synchronous I/O: snapblk's
# io_uring driver with its inline path (`--submit_with_wait`, so that the driver sees a caller
# waiting for its request) vs fio's psync engine (pread/pwrite). Set PSYNC=0 to skip it.
#
# A third part runs fio's own command lines and a fio job file (bench/jobs/fio-agreement.fio)
# through both tools unchanged — the same arguments, only the program differs — on the tmpfs
# file: psync, io_uring and libaio engines (snapblk runs libaio on io_uring), two jobs with
# group_reporting, and the job file's four stonewalled jobs. TARGETS without "cmdline" skips it.
#
# Both tools write the same kind of data, which matters on zram (it compresses every page, and
# lzo gives up on truly random pages ~2x sooner than on fio's random-but-stamped ones): random
# buffers filled once and scrambled per write (fio's defaults, snapblk bench's defaults since
# it has fio's buffer options). BUF_OPTS (e.g. "--refill_buffers" or
# "--buffer_compress_percentage=50") is passed to both tools to compare other data.
#
# Usage (root for zram): bash bench/fio-agreement.sh          (env: ROUNDS=3 RUNTIME=5 RAMP=1
#   SIZE=1G SNAPBLK=target/release/snapblk ZRAM_WAIT=600 OUT=fio-agreement.md BUF_OPTS= PSYNC=1
#   ONLY="tmpfs:randwrite-4k-qd32 ..." to rerun chosen cells; TARGETS="tmpfs zram null cmdline";
#   RAW=FILE keeps the per-run figures; WRAP="taskset -c 1" runs both tools under a prefix;
#   NOHALT=1 keeps idle CPUs from halting during the run; PLACE=split fixes the placement)
#
# Verdict per cell, from the paired ratios (snapblk / fio of the same round, the two runs back to
# back): the distribution-free ~90% confidence interval of their median (order statistics) for
# IOPS and for mean latency. "agree": both intervals inside [0.95, 1.05]; "differ": either lies
# wholly outside; "noisy": neither, i.e. run-to-run noise on this machine is wider than the ±5%
# being asked about, so more (shorter) rounds are needed before saying either. With 5 rounds the
# interval is [min, max] of the pairs; ROUNDS=10 RUNTIME=2 narrows it on a noisy host.
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
PSYNC=${PSYNC:-1}
# A command prefix for both tools, e.g. WRAP="taskset -c 1": with the submitter and the io-wq
# worker on one CPU, or free to spread over two, tmpfs QD32 runs differ by ~1.4x, and which
# case a run lands in is the scheduler's choice (for either tool).
WRAP=${WRAP:-}
# NOHALT=1 holds a CPU-latency QoS request of 0 µs (/dev/cpu_dma_latency) for the whole run, so
# idle CPUs poll instead of halting. On this VM a halted vCPU takes tens of µs to wake, and every
# QD1 request on tmpfs/zram is a wake-up of an io-wq worker and back: with halts both tools run
# at ~20 k IOPS free-placed, without them at ~100 k (measured). Applies to both tools alike.
NOHALT=${NOHALT:-0}
# PLACE=split runs every tool's own threads on CPU 0 and its io-wq workers (iou-wrk-*) on CPU 1
# (bench/pin-split.py, applied to both tools alike) instead of wherever the scheduler puts them:
# free placement lands a run on one CPU or on two by chance, a 1.4x difference at QD32.
PLACE=${PLACE:-free}
ONLY=${ONLY:-}
TARGETS=${TARGETS:-tmpfs zram null cmdline}
command -v fio >/dev/null || { echo "fio missing (apt-get install fio)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 missing" >&2; exit 1; }
[ -x "$SNAPBLK" ] || cargo build --release -p snapblk-cli >&2
case $PLACE in
  free) ;;
  split) [ "$(nproc)" -ge 2 ] || { echo "PLACE=split needs 2 CPUs" >&2; exit 1; } ;;
  *) echo "PLACE must be free or split, not $PLACE" >&2; exit 1 ;;
esac

if [ "$NOHALT" = 1 ]; then
  # The request lasts while the file stays open (fd 9, inherited by nothing that outlives us).
  exec 9>/dev/cpu_dma_latency || { echo "NOHALT=1: cannot open /dev/cpu_dma_latency" >&2; exit 1; }
  printf '0\n' >&9
  echo "NOHALT=1: CPU latency QoS held at 0 µs (idle CPUs poll instead of halting)" >&2
fi

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

want() { [[ " $TARGETS " == *" $1 "* ]]; }
# selected TARGET PATTERN: is this cell part of the run (ONLY empty: every cell)?
selected() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1:$2 "* ]]; }

targets=()
if want tmpfs || want cmdline; then
  echo "preparing tmpfs target $shm ($SIZE)" >&2
  dd if=/dev/urandom of="$shm" bs=1M count=$(( $(numfmt --from=iec "$SIZE") >> 20 )) status=none
fi
want tmpfs && targets+=("tmpfs:$shm")

if ! want zram; then
  :
elif [ -b /dev/zram0 ] && [ "$(id -u)" = 0 ]; then
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

# snapblk's device spec for FILE: its io_uring driver without the inline QD1 path, if it has one
# (the property appeared with the driver's inline path; older binaries run everything on the ring).
inline_prop=0
truncate -s 1M "$work/probe.img"
if "$SNAPBLK" info "io_uring:path=$work/probe.img" 2>/dev/null | grep -q '^inline-qd1 '; then
  inline_prop=1
  echo "snapblk io_uring driver has inline-qd1: opening targets with inline-qd1=false" >&2
else
  echo "snapblk io_uring driver has no inline-qd1 property: plain path specs, no psync table" >&2
fi
ring_spec() { if [ "$inline_prop" = 1 ]; then echo "io_uring:path=$1,inline-qd1=false"; else echo "$1"; fi; }

# tool CMD...: run one tool's command under WRAP, and with PLACE=split pin its threads while it runs.
tool() {
  if [ "$PLACE" = split ]; then
    # shellcheck disable=SC2086 # WRAP is a command prefix, split on purpose
    $WRAP "$@" &
    local pid=$!
    python3 bench/pin-split.py "$pid" 0 1 &
    local pinner=$!
    local rc=0
    wait "$pid" || rc=$?
    wait "$pinner" || true
    return "$rc"
  fi
  # shellcheck disable=SC2086 # WRAP is a command prefix, split on purpose
  $WRAP "$@"
}

# run_fio TARGETNAME PATTERN FILE RW BS QD ENGINE ROUND [fio options...]
run_fio() {
  local tname=$1 pname=$2 file=$3 rw=$4 bs=$5 qd=$6 engine=$7 round=$8
  shift 8
  local extra=(--direct=1 --filename="$file")
  # shellcheck disable=SC2206 # word splitting of the option list is intended
  [ "$engine" = io_uring ] && extra+=($FIO_URING_OPTS)
  [ "$engine" = null ] && extra=()
  # shellcheck disable=SC2206 # word splitting of the option list is intended
  extra+=($BUF_OPTS "$@")
  tool fio --name=agree --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=1 --ioengine="$engine" \
      --size="$SIZE" --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" --group_reporting \
      --randrepeat=0 --output-format=json "${extra[@]}" > "$work/fio.json"
  python3 - "$work/fio.json" "$tname" "$pname" "$round" >> "$results" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
j = d["jobs"][0]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
iops = j["read"]["iops"] + j["write"]["iops"]
def mean(k):
    # ios-weighted over both directions (fio's `lat`, `slat`, `clat`)
    return ((j["read"][k]["mean"] * j["read"]["total_ios"] + j["write"][k]["mean"] * j["write"]["total_ios"]) / ios) if ios else 0
print(f"{sys.argv[2]}\t{sys.argv[3]}\tfio\t{sys.argv[4]}\t{iops:.1f}\t{mean('lat_ns'):.1f}\t{mean('slat_ns'):.1f}\t{mean('clat_ns'):.1f}")
PY
}

# run_snapblk TARGETNAME PATTERN SPEC RW BS QD DIRECT ROUND [snapblk bench options...]
run_snapblk() {
  local tname=$1 pname=$2 spec=$3 rw=$4 bs=$5 qd=$6 direct=$7 round=$8
  shift 8
  local extra=()
  [ "$direct" = 1 ] && extra=(--direct)
  # shellcheck disable=SC2206 # word splitting of the option list is intended
  extra+=($BUF_OPTS "$@")
  tool "$SNAPBLK" bench "$spec" --rw "$rw" --bs "$bs" --iodepth "$qd" --numjobs 1 --size "$SIZE" \
      --runtime "$RUNTIME" --time_based --ramp_time "$RAMP" --json --output "$work/snap.json" "${extra[@]}" > /dev/null 2>"$work/snap.err" \
      || { cat "$work/snap.err" >&2; exit 1; }
  python3 - "$work/snap.json" "$tname" "$pname" "$round" >> "$results" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["results"][0]["summary"]
r, w = s["read"], s["write"]
ios = r["ios"] + w["ios"]
def mean(k):
    return ((r[k]["mean"] * r["ios"] + w[k]["mean"] * w["ios"]) / ios) if ios else 0
print(f"{sys.argv[2]}\t{sys.argv[3]}\tsnapblk\t{sys.argv[4]}\t{s['iops']['mean']:.1f}\t{s['lat_ns']['mean']:.1f}\t{mean('slat_ns'):.1f}\t{mean('clat_ns'):.1f}")
PY
}

# Fio's command lines, each run unchanged by both tools (NAME then the options; the common ones
# follow in run_line).
CMDLINES=(
  "psync-randread-4k --ioengine=psync --rw=randread --bs=4k --iodepth=1"
  "psync-randwrite-4k --ioengine=psync --rw=randwrite --bs=4k --iodepth=1"
  "io_uring-randread-4k-qd32 --ioengine=io_uring --rw=randread --bs=4k --iodepth=32"
  "libaio-randwrite-4k-qd32 --ioengine=libaio --rw=randwrite --bs=4k --iodepth=32"
  "psync-read-1m-2jobs --ioengine=psync --rw=read --bs=1M --numjobs=2 --group_reporting"
)
JOBFILE=bench/jobs/fio-agreement.fio

# rows TOOL TARGETNAME ROUND JSON: one results row per job (fio) or configuration (snapblk),
# named after it.
rows() {
  python3 - "$@" >> "$results" <<'PY'
import json, sys
tool, tname, rnd, path = sys.argv[1:5]
text = open(path).read()
d = json.loads(text[text.index("{"):])
def row(name, iops, dirs, key):
    ios = sum(x[key] for x in dirs)
    def mean(k):
        return sum(x[k]["mean"] * x[key] for x in dirs) / ios if ios else 0
    print(f"{tname}\t{name}\t{tool}\t{rnd}\t{iops:.1f}\t{mean('lat_ns'):.1f}\t{mean('slat_ns'):.1f}\t{mean('clat_ns'):.1f}")
if tool == "fio":
    for j in d["jobs"]:
        row(j["jobname"], j["read"]["iops"] + j["write"]["iops"], [j["read"], j["write"]], "total_ios")
else:
    for r in d["results"]:
        s = r["summary"]
        row(r["config"]["name"], s["iops"]["mean"], [s["read"], s["write"]], "ios")
PY
}

# run_line TOOL NAME ROUND OPTIONS...: one fio command line through TOOL (fio or snapblk bench).
run_line() {
  local t=$1 name=$2 round=$3
  shift 3
  local cmd=(fio)
  [ "$t" = snapblk ] && cmd=("$SNAPBLK" bench)
  # shellcheck disable=SC2206 # word splitting of the option list is intended
  tool "${cmd[@]}" --name="$name" --filename="$shm" --direct=1 --size="$SIZE" --time_based \
      --runtime="$RUNTIME" --ramp_time="$RAMP" --output-format=json $BUF_OPTS "$@" \
      > "$work/line.json" 2>"$work/line.err" || { cat "$work/line.err" >&2; exit 1; }
  rows "$t" cmdline "$round" "$work/line.json"
}

# run_jobfile TOOL ROUND: the fio job file through TOOL.
run_jobfile() {
  local cmd=(fio)
  [ "$1" = snapblk ] && cmd=("$SNAPBLK" bench)
  FIOFILE=$shm FIOSIZE=$SIZE FIORUNTIME=$RUNTIME FIORAMP=$RAMP \
    tool "${cmd[@]}" "$JOBFILE" --output-format=json > "$work/jobs.json" 2>"$work/jobs.err" \
    || { cat "$work/jobs.err" >&2; exit 1; }
  rows "$1" jobfile "$2" "$work/jobs.json"
}

# pair TARGETNAME PATTERN ROUND "fio args..." "snapblk args..." — both tools, order alternating
# by round so neither always runs on a warmer/colder machine.
pair() {
  local round=$3
  echo "round $round/$ROUNDS $1 $2" >&2
  if [ $((round % 2)) = 1 ]; then
    eval "run_fio $4"; eval "run_snapblk $5"
  else
    eval "run_snapblk $5"; eval "run_fio $4"
  fi
}

for round in $(seq 1 "$ROUNDS"); do
  for t in "${targets[@]}"; do
    tname=${t%%:*}; file=${t#*:}
    spec=$(ring_spec "$file")
    for p in "${PATTERNS[@]}"; do
      read -r pname rw bs qd <<< "$p"
      selected "$tname" "$pname" || continue
      pair "$tname" "$pname" "$round" \
        "$tname $pname $file $rw $bs $qd io_uring $round" \
        "$tname $pname $spec $rw $bs $qd 1 $round"
    done
    # Each tool's default synchronous QD1 path: snapblk's inline io_uring vs fio's psync.
    if [ "$PSYNC" = 1 ] && [ "$inline_prop" = 1 ]; then
      for p in "randread-4k-qd1 randread 4k 1" "randwrite-4k-qd1 randwrite 4k 1"; do
        read -r pname rw bs qd <<< "$p"
        selected "$tname-inline" "$pname" || continue
        pair "$tname-inline" "$pname" "$round" \
          "$tname-inline $pname $file $rw $bs $qd psync $round" \
          "$tname-inline $pname $file $rw $bs $qd 1 $round --submit_with_wait"
      done
    fi
  done
  # Tool overhead: no device at all. At QD32 both submit and reap in batches of 32, so both
  # really keep 32 requests in flight (fio's null engine otherwise runs at depth 1).
  if want null; then
    for p in "randread-4k-qd1 randread 4k 1" "randread-4k-qd32 randread 4k 32"; do
      read -r pname rw bs qd <<< "$p"
      selected null "$pname" || continue
      b=()
      [ "$qd" != 1 ] && b=(--iodepth_batch_submit="$qd" --iodepth_batch_complete_max="$qd")
      pair null "$pname" "$round" \
        "null $pname none $rw $bs $qd null $round ${b[*]}" \
        "null $pname null:size=$SIZE $rw $bs $qd 0 $round ${b[*]}"
    done
  fi
  if want cmdline; then
    for l in "${CMDLINES[@]}"; do
      read -r pname opts <<< "$l"
      selected cmdline "$pname" || continue
      echo "round $round/$ROUNDS cmdline $pname" >&2
      # shellcheck disable=SC2086 # word splitting of the option list is intended
      if [ $((round % 2)) = 1 ]; then
        run_line fio "$pname" "$round" $opts; run_line snapblk "$pname" "$round" $opts
      else
        run_line snapblk "$pname" "$round" $opts; run_line fio "$pname" "$round" $opts
      fi
    done
    if selected jobfile all; then
      echo "round $round/$ROUNDS jobfile $JOBFILE" >&2
      if [ $((round % 2)) = 1 ]; then
        run_jobfile fio "$round"; run_jobfile snapblk "$round"
      else
        run_jobfile snapblk "$round"; run_jobfile fio "$round"
      fi
    fi
  fi
done

report() {
python3 - "$results" "$ROUNDS" "$RUNTIME" "$(uname -r)" "$(cat /proc/loadavg)" "placement $PLACE${WRAP:+ under $WRAP}, NOHALT=$NOHALT" <<'PY'
import sys, statistics as st
from math import comb
from collections import defaultdict
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
d = defaultdict(lambda: {"iops": [], "lat": [], "slat": [], "clat": []})
byround = defaultdict(dict)
order = []
# Rows: target, pattern, tool, round, IOPS, mean lat, then (newer runs) mean slat and clat.
for t, p, tool, r, iops, lat, *parts in rows:
    if (t, p) not in order:
        order.append((t, p))
    d[(t, p, tool)]["iops"].append(float(iops))
    d[(t, p, tool)]["lat"].append(float(lat))
    if len(parts) == 2:
        d[(t, p, tool)]["slat"].append(float(parts[0]))
        d[(t, p, tool)]["clat"].append(float(parts[1]))
    byround[(t, p, r)][tool] = (float(iops), float(lat))
def pairs(t, p, k):
    # snapblk / fio of the same round (the two ran back to back): robust to load that drifts
    # between rounds, which the ratio of medians is not. k: 0 = IOPS, 1 = mean latency.
    return sorted(x["snapblk"][k] / x["fio"][k] for (tt, pp, _), x in byround.items()
                  if (tt, pp) == (t, p) and "fio" in x and "snapblk" in x and x["fio"][k])
def paired(t, p):
    v = pairs(t, p, 0)
    return f"{st.median(v):.3f} [{v[0]:.2f}–{v[-1]:.2f}]" if v else "-"
def median_ci(v, level=0.9):
    # Distribution-free interval for the median: [v(j), v(n-1-j)] holds it with probability
    # 1 - 2 P(Binomial(n, 1/2) <= j); the widest j keeping at least `level` (j = 0: min..max).
    n = len(v)
    def cover(j):
        return 1 - 2 * sum(comb(n, i) for i in range(j + 1)) / 2 ** n
    j = 0
    while j + 1 < n - 1 - (j + 1) and cover(j + 1) >= level:
        j += 1
    return v[j], v[n - 1 - j], cover(j)
def verdict(t, p):
    out = []
    for k in (0, 1):
        v = pairs(t, p, k)
        if len(v) < 2:
            return "-", ""
        lo, hi, _ = median_ci(v)
        if 0.95 <= lo and hi <= 1.05:
            out.append("agree")
        elif hi < 0.95 or lo > 1.05:
            out.append("differ")
        else:
            out.append("noisy")
        out.append(f"{lo:.2f}–{hi:.2f}")
    word = "differ" if "differ" in out[0::2] else "agree" if out[0::2] == ["agree", "agree"] else "noisy"
    return word, f"IOPS {out[1]}, lat {out[3]}"
def cv(v):
    return (st.stdev(v) / st.mean(v) * 100) if len(v) > 1 and st.mean(v) else 0.0
print(f"fio agreement: {sys.argv[2]} interleaved rounds x {sys.argv[3]} s per run, kernel {sys.argv[4]}, loadavg at end {sys.argv[5].split()[0]}, {sys.argv[6]}")
print("medians over rounds; CV = spread of the rounds; ratio = snapblk / fio")
print()
def table(cells, title):
    if not cells:
        return 0, 0
    print(title)
    print()
    print("| target | pattern | fio IOPS (CV) | snapblk IOPS (CV) | IOPS ratio | paired ratio median [min–max] | fio mean lat | snapblk mean lat | lat ratio | verdict (~90% CI of paired ratios) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    within = 0
    for t, p in cells:
        f, s = d[(t, p, "fio")], d[(t, p, "snapblk")]
        if not f["iops"] or not s["iops"]:
            continue
        fi, si = st.median(f["iops"]), st.median(s["iops"])
        fl, sl = st.median(f["lat"]), st.median(s["lat"])
        ri, rl = si / fi if fi else 0, sl / fl if fl else 0
        within += abs(ri - 1) <= 0.05 and abs(rl - 1) <= 0.05
        word, ci = verdict(t, p)
        verdicts[word] = verdicts.get(word, 0) + 1
        print(f"| {t} | {p} | {fi:,.0f} ({cv(f['iops']):.0f}%) | {si:,.0f} ({cv(s['iops']):.0f}%) | {ri:.3f} | {paired(t, p)} | {fl/1000:.1f} µs | {sl/1000:.1f} µs | {rl:.3f} | {word} ({ci}) |")
    print()
    return within, len(cells)
ring = [c for c in order if c[0] != "null" and not c[0].endswith("-inline")]
verdicts = {}
w, n = table(ring, "Same data path (io_uring, O_DIRECT; snapblk inline-qd1=false):")
if n:
    print(f"{w} of {n} device cells within ±5% on both IOPS and mean latency (medians)")
    print("paired verdicts: " + ", ".join(f"{verdicts.get(k, 0)} {k}" for k in ("agree", "noisy", "differ")))
    noise = st.median(cv(d[(t, p, tool)]["iops"]) for t, p in ring for tool in ("fio", "snapblk")
                      if d[(t, p, tool)]["iops"])
    if noise > 5:
        print(f"WARNING: noisy machine: median run-to-run CV of IOPS {noise:.0f}% (wider than the ±5% tested)")
    print()
def split(cells):
    # Where each tool's mean latency goes: submission (slat) and completion (clat), medians.
    cells = [c for c in cells if d[(*c, "fio")]["clat"] and d[(*c, "snapblk")]["clat"]]
    if not cells:
        return
    print("Mean latency split as fio defines it (lat = slat + clat), medians:")
    print()
    print("| target | pattern | fio slat | snapblk slat | fio clat | snapblk clat | clat ratio |")
    print("|---|---|---|---|---|---|---|")
    for t, p in cells:
        f, s = d[(t, p, "fio")], d[(t, p, "snapblk")]
        fs, ss, fc, sc = (st.median(x) / 1000 for x in (f["slat"], s["slat"], f["clat"], s["clat"]))
        print(f"| {t} | {p} | {fs:.2f} µs | {ss:.2f} µs | {fc:.1f} µs | {sc:.1f} µs | {sc / fc if fc else 0:.3f} |")
    print()
split(ring)
verdicts = {}
table([c for c in order if c[0].endswith("-inline")], "Default synchronous QD1 paths (snapblk io_uring inline, --submit_with_wait; fio psync), O_DIRECT:")
table([c for c in order if c[0] == "null"], "Tool overhead (snapblk null driver, fio null engine):")
verdicts = {}
table([c for c in order if c[0] in ("cmdline", "jobfile")], "fio's command lines and job file (bench/jobs/fio-agreement.fio) run unchanged by both tools, tmpfs, O_DIRECT:")
PY
}
if [ -n "$OUT" ]; then report | tee "$OUT"; else report; fi
# RAW=FILE keeps every run's figures (target, pattern, tool, round, IOPS, mean lat, slat and clat
# in ns).
if [ -n "${RAW:-}" ]; then cp "$results" "$RAW"; fi
