#!/usr/bin/env bash
# Readahead benchmark: snapblk vs vmtouch, side by side in one run (needs root).
#   (each main run of 2 is followed by a reference O_DIRECT read of the same disk with fio)
#   1. residency report of /usr (warm metadata)             goal A1: <= 0.6 s
#   2. cold warm-up of /usr/lib, verified >= 99.5% resident goal A3: <= 4.5 s
#      in two cache states: "data" (file pages evicted, dentries/inodes kept) and "cold"
#      (sync; drop_caches=3, the anchors' definition), next to the anchors' methods run in
#      the same round: vmtouch -t, 4 parallel vmtouch -t (xargs -P4), and rachunk
#      (bench/c/rachunk.c: readahead(2) per 2 MiB chunk, 1 thread, the 3.9-4.3 s anchor)
#   3. warm-up of an already-resident /usr/lib              goal A4: <= 0.3 s
#   4. foreground cold start (python imports) while /usr/lib is warmed in the background
#                                                           goal A6: <= 1.5x the idle start
#   5. record -> replay round trip of that foreground start
# Evicting /usr/lib slows everything else on the machine for a few seconds: run it once.
# Usage: bench/readahead-bench.sh [REPEATS] [SECTION...]   (default: all sections 1-5)
#   e.g. bench/readahead-bench.sh 3 2 4   (cold warm-up and foreground impact only)
#   VARIANTS=0 skips the single-run variants of section 2; STATES="data cold" picks the
#   section-2 cache states.
# Results: target/readahead-bench/results.txt (overwritten; copy it first to keep it).
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${1:-3}
shift || true
SECTIONS=" ${*:-1 2 3 4 5} "
want() { [[ $SECTIONS == *" $1 "* ]]; }
VARIANTS=${VARIANTS:-1}
STATES=${STATES:-data cold}
TREE=${TREE:-/usr/lib}
RESTREE=${RESTREE:-/usr}
PYVER=${PYVER:-3.12.1}
PYROOT=/root/.pyenv/versions/$PYVER
PY=$PYROOT/bin/python${PYVER%.*}
OUT=target/readahead-bench
mkdir -p "$OUT"
RES=$OUT/results.txt
: > "$RES"

[ "$(id -u)" -eq 0 ] || { echo "run as root" >&2; exit 1; }
command -v vmtouch >/dev/null || { echo "vmtouch missing: scripts/install-deps.sh" >&2; exit 1; }
command -v fio >/dev/null || { echo "fio missing: scripts/install-deps.sh" >&2; exit 1; }
[ -x "$PY" ] || { echo "foreground program $PY missing (set PYVER)" >&2; exit 1; }
[ -n "${SB:-}" ] || cargo build --release -q -p snapblk-cli
SB=${SB:-$PWD/target/release/snapblk}  # SB=PATH compares another build
RACHUNK=$PWD/$OUT/rachunk
cc -O2 -o "$RACHUNK" bench/c/rachunk.c

log() { echo "$*" | tee -a "$RES"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", b-a}'; }
# Resident percentage of a tree according to vmtouch (independent mincore check, root).
vm_pct() { vmtouch "$1" 2>/dev/null | awk '/Resident Pages/{print $NF}'; }
evict_tree() { "$SB" readahead evict -r "$1" --json > "$OUT/evict.json" || true; }
jget() { python3 -c "import json,sys; d=json.load(open('$1')); print(d$2)"; }
# The resident percentage of a replay/warm report ("n/a" when nothing could be measured).
jpct() { python3 -c "import json; f=json.load(open('$1'))['resident_fraction']; print('n/a' if f is None else f*100)"; }

FG=(-c "import json, email.parser, http.client, decimal, asyncio, sqlite3, xml.dom.minidom, unittest")
log "# snapblk readahead bench $(date -Is) kernel $(uname -r), $(nproc) CPUs"
log "# device $(df --output=source "$TREE" | tail -1), scheduler $(cat /sys/block/vda/queue/scheduler 2>/dev/null), read_ahead_kb $(cat /sys/block/vda/queue/read_ahead_kb 2>/dev/null), loadavg $(cut -d' ' -f1-3 /proc/loadavg)"

if want 1; then
log ""
log "## 1. residency of $RESTREE (warm metadata), seconds"
vmtouch -q "$RESTREE" > /dev/null 2>&1; "$SB" residency -r -s "$RESTREE" > /dev/null
for i in $(seq "$REPEATS"); do
  t0=$(now); vmtouch "$RESTREE" > "$OUT/vm-res.txt" 2>/dev/null; t1=$(now)
  "$SB" residency -r -s "$RESTREE" > "$OUT/sb-res.txt"; t2=$(now)
  log "run $i: vmtouch $(secs "$t0" "$t1")  snapblk $(secs "$t1" "$t2")"
done
log "vmtouch: $(grep 'Resident Pages' "$OUT/vm-res.txt" | xargs)"
log "snapblk: $(grep 'Resident Pages' "$OUT/sb-res.txt" | xargs)"
fi

# cold_run LABEL CMD...: evict the tree (and with STATE=cold drop every clean cache, dentries
# and inodes included), run CMD, log its time; sets RUN_SECS and RUN_DISK (bytes the device
# holding the tree read while CMD ran).
STATE=data
cold_run() {
  local label=$1; shift
  evict_tree "$TREE"
  if [ "$STATE" = cold ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
  local left; left=$(jget "$OUT/evict.json" "['remaining_pages']")
  local b0 b1 t0 t1; b0=$(disk_read_bytes); t0=$(now); local rc=0; "$@" > "$OUT/run.out" 2> "$OUT/run.err" || rc=$?; t1=$(now); b1=$(disk_read_bytes)
  RUN_SECS=$(secs "$t0" "$t1"); RUN_DISK=$((b1 - b0))
  local tool=""
  if head -c1 "$OUT/run.out" | grep -q '{'; then
    tool="tool: $(jpct "$OUT/run.out")% resident, issue $(jget "$OUT/run.out" "['issue_secs']") s, settle $(jget "$OUT/run.out" "['settle_secs']") s, passes $(jget "$OUT/run.out" "['passes']"), checked inline $(jget "$OUT/run.out" "['verified_inline']") / at the end $(jget "$OUT/run.out" "['final_checked']") files, psi pauses $(jget "$OUT/run.out" "['psi_pauses']")"
  fi
  [ "$rc" = 0 ] || tool="$tool (exit $rc: $(head -c 300 "$OUT/run.err" | tr '\n' ' '))"
  [ "$label" != "${label#run }" ] && echo "$STATE	${label#run [0-9]* }	$RUN_SECS	$RUN_DISK" >> "$OUT/sec2.tsv"
  [ -s "$OUT/run.out" ] && ! head -c1 "$OUT/run.out" | grep -q '{' && tool="$tool $(head -c 300 "$OUT/run.out")"
  log "$label [$STATE]: $RUN_SECS s; vmtouch check after: $(vm_pct "$TREE") resident; (pages left after evict: $left) $tool"
}

# Is a cold warm-up device-bound? Each main run is followed by a reference read from the same
# disk: fio reads the largest files of the tree (>= 1 GiB together) with O_DIRECT, 1 MiB
# requests, 8 in flight, one file after the other (O_DIRECT leaves the page cache cold). The
# bench prints the rate at which the device delivered the run's reads (diskstats: file data and
# metadata) next to fio's rate. This disk's bandwidth drifts between ~0.65 and ~1.2 GB/s from
# minute to minute, so a fixed time goal says as much about the disk as about the tool.
ref_files() {
  find "$TREE" -xdev -type f -size +8M -printf '%s %p\n' | sort -rn |
    awk '{ s += $1; sub(/^[0-9]+ /, ""); print; if (s >= 1073741824) exit }'
}
ref_bw() { # MB/s (10^6 bytes) of a sequential O_DIRECT read of the reference files
  local list; list=$(ref_files | paste -sd:)
  [ -n "$list" ] || { echo "n/a"; return; }
  fio --name=reference --readonly --direct=1 --rw=read --bs=1M --iodepth=8 --ioengine=io_uring \
    --file_service_type=sequential --filename="$list" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["read"]; print("%.0f" % (j["io_bytes"]/j["runtime"]/1000))'
}
disk_read_bytes() { # bytes read so far by the device holding TREE (/proc/diskstats sectors)
  local dev; dev=$(basename "$(df --output=source "$TREE" | tail -1)")
  awk -v d="$dev" '$3 == d { printf "%.0f\n", $6 * 512 }' /proc/diskstats
}
# ref_run LABEL CMD...: a cold run, then fio's reference read.
ref_run() {
  cold_run "$@"
  local bw; bw=$(ref_bw)
  log "  device: $(awk -v b="$RUN_DISK" 'BEGIN{printf "%.2f GiB", b/2^30}') read in the run, $(awk -v b="$RUN_DISK" -v t="$RUN_SECS" 'BEGIN{printf "%.0f", b/t/1e6}') MB/s; fio O_DIRECT sequential read right after: $bw MB/s; run rate / fio rate $(awk -v b="$RUN_DISK" -v t="$RUN_SECS" -v w="$bw" 'BEGIN{if (w+0 > 0) printf "%.2f", b/t/1e6/w; else printf "n/a"}')"
}

if want 2; then
log ""
log "## 2. cold warm-up of $TREE ($(du -sh "$TREE" | cut -f1), $(find "$TREE" -xdev -type f | wc -l) files)"
log "reference: fio O_DIRECT sequential read (1M, qd8) of the $(ref_files | wc -l) largest files ($(ref_files | tr '\n' '\0' | du -ch --files0-from=- | tail -1 | cut -f1))"
: > "$OUT/sec2.tsv"
for i in $(seq "$REPEATS"); do
  for STATE in $STATES; do
    ref_run "run $i vmtouch -t" vmtouch -t -q "$TREE"
    ref_run "run $i vmtouch -t x4 (xargs -P4)" sh -c "find '$TREE' -xdev -type f -print0 | xargs -0 -n 500 -P 4 vmtouch -t -q"
    ref_run "run $i rachunk (readahead 2M, 1 thread)" "$RACHUNK" "$TREE"
    ref_run "run $i snapblk warm (readahead, 2M, qd4, idle)" "$SB" readahead warm -r "$TREE" --json
  done
done
STATE=data
log ""
log "section 2 medians (s) per cache state; ratio = snapblk / method"
python3 - "$OUT/sec2.tsv" <<'PY' | tee -a "$RES"
import sys, statistics as st
from collections import defaultdict
d = defaultdict(list)
for line in open(sys.argv[1]):
    state, method, secs, _ = line.rstrip("\n").split("\t")
    d[(state, method)].append(float(secs))
states = sorted({s for s, _ in d}, key=lambda s: s != "data")
methods = list(dict.fromkeys(m for _, m in d))
sb = next((m for m in methods if m.startswith("snapblk")), None)
for s in states:
    base = st.median(d[(s, sb)]) if (s, sb) in d else None
    for m in methods:
        if (s, m) in d:
            med = st.median(d[(s, m)])
            r = f"  ratio {base / med:.2f}" if base and m != sb else ""
            print(f"  [{s}] {m}: median {med:.2f} s [{min(d[(s, m)]):.2f}-{max(d[(s, m)]):.2f}]{r}")
PY
if [ "$VARIANTS" = 1 ]; then
cold_run "variant snapblk warm qd1" "$SB" readahead warm -r "$TREE" --json -q 1
cold_run "variant snapblk warm qd8" "$SB" readahead warm -r "$TREE" --json -q 8
cold_run "variant snapblk warm fadvise" "$SB" readahead warm -r "$TREE" --json --method fadvise
cold_run "variant snapblk warm uring qd16 x2 threads" "$SB" readahead warm -r "$TREE" --json --method uring -q 16
cold_run "variant snapblk warm pread qd4" "$SB" readahead warm -r "$TREE" --json --method pread
cold_run "variant snapblk warm chunk 512K" "$SB" readahead warm -r "$TREE" --json --chunk 512K
cold_run "variant snapblk warm ioprio be, nice none" "$SB" readahead warm -r "$TREE" --json --ioprio be --nice none
fi
fi

if want 3; then
log ""
log "## 3. warm-up of an already-resident $TREE, seconds"
vmtouch -t -q "$TREE" 2>/dev/null
for i in $(seq "$REPEATS"); do
  t0=$(now); vmtouch -t -q "$TREE" 2>/dev/null; t1=$(now)
  "$SB" readahead warm -r "$TREE" --json > "$OUT/hot.json"; t2=$(now)
  log "run $i: vmtouch -t $(secs "$t0" "$t1")  snapblk warm $(secs "$t1" "$t2") (issued $(jget "$OUT/hot.json" "['bytes_issued']") bytes, $(jpct "$OUT/hot.json")% resident)"
done
fi

if want 4; then
log ""
log "## 4. foreground cold start ($PY imports) with $TREE warmed in the background"
fg_cold() { # time of one cold foreground start
  "$SB" readahead evict -r "$PYROOT" > /dev/null
  local t0 t1; t0=$(now); "$PY" "${FG[@]}"; t1=$(now); secs "$t0" "$t1"
}
for i in $(seq "$REPEATS"); do
  evict_tree "$TREE"; idle=$(fg_cold)
  evict_tree "$TREE"
  "$SB" readahead warm -r "$TREE" --background --json --log "$OUT/bg.log" > /dev/null
  sleep 0.2; sb=$(fg_cold)
  while pgrep -f "readahead warm -r $TREE --background" > /dev/null; do sleep 0.1; done
  evict_tree "$TREE"
  vmtouch -t -q "$TREE" 2>/dev/null & vpid=$!
  sleep 0.2; vm=$(fg_cold)
  wait $vpid
  log "run $i: idle $idle s; under snapblk warm --background $sb s ($(awk -v a="$sb" -v b="$idle" 'BEGIN{printf "%.2fx", a/b}')); under vmtouch -t $vm s ($(awk -v a="$vm" -v b="$idle" 'BEGIN{printf "%.2fx", a/b}'))"
done
log "last background report: $(tail -1 "$OUT/bg.log" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); f=d["resident_fraction"]; print("%s resident, total %.2f s, pressure pauses %d (%.2f s)" % ("n/a" if f is None else "%.3f%%" % (f*100), d["total_secs"], d["psi_pauses"], d["psi_paused_secs"]))')"
fi

if want 5; then
log ""
log "## 5. record -> replay round trip of the foreground start (scope $PYROOT)"
"$SB" readahead record -o "$OUT/py.list" --scope "$PYROOT" --evict-first --json -- "$PY" "${FG[@]}" > "$OUT/rec.json"
log "recorded: $(cat "$OUT/rec.json")"
"$SB" readahead evict -r "$PYROOT" > /dev/null
"$SB" readahead replay "$OUT/py.list" --json > "$OUT/rep.json"
log "replay: $(jpct "$OUT/rep.json")% of $(jget "$OUT/rep.json" "['bytes_requested']") bytes resident, $(jget "$OUT/rep.json" "['total_secs']") s"
t0=$(now); "$PY" "${FG[@]}"; t1=$(now)
log "foreground start after replay: $(secs "$t0" "$t1") s (cold idle start above)"
fi
echo "results in $RES"
