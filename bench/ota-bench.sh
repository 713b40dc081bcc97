#!/usr/bin/env bash
# Benchmark `snapblk ota extract` and `snapblk ota apply` against other payload tools on the
# same payloads, side by side in one run (not a test).
#
# 1. Makes two ext4 images of real files (`mke2fs -d`): "system", the new image of the
#    change-heavy pair bench/cow/make-pair.py makes from /usr/lib (3/4 of SIZE_MiB), and
#    "vendor", a deterministic subset of /usr/share (bench/ota/make-fs.py, the rest); then a
#    full payload of both, written as delta_generator writes one (2 MiB operations, each the
#    smallest of REPLACE, REPLACE_BZ and REPLACE_XZ; xz level 6, dictionary cut to the chunk,
#    no check), and an incremental payload from the pair's old image to the new one, file by
#    file (bench/ota/plan-delta.py: SOURCE_COPY of unchanged files and blocks, SOURCE_BSDIFF
#    with Debian's `bsdiff` for changed files and metadata or REPLACE_* when smaller, REPLACE_*
#    for new files, ZERO) plus vendor unchanged (all SOURCE_COPY). The payloads are written by
#    crates/ota/examples/ota_bench_payload.rs (the crate's test writer for header and manifest).
# 2. ROUNDS times, in a rotated order, on tmpfs when memory allows: extraction of the full
#    payload by `snapblk ota extract` (release build), PyPI payload-dumper 0.3.0 (in a venv)
#    the crates.io payload_dumper 0.8.4 binary (if built, see below) and payload-dumper-go
#    (if its binary is in BENCH_TOOLS, see below), plus the
#    decompression ceiling (the payload's xz and bzip2 streams split in two halves, each half
#    decoded by `xz -dc` and `bzip2 -dc` to /dev/null, both halves at once) and the issue's
#    ceiling (all the xz streams through one `xz -dc -T2`, then the two bzip2 halves at once),
#    each with snapblk's paired ratio to it (goal >= 0.9); then apply of the
#    incremental by `snapblk ota apply`, `payload_dumper --diff` (PyPI), payload_dumper
#    0.8.4 `--source-dir` and `payload-dumper-go -old`, and `snapblk ota apply` again with glibc's mmap threshold fixed at
#    128 KiB (MALLOC_MMAP_THRESHOLD_): a diagnostic row, see docs/ota.md "Performance". Each run: wall time, CPU time and peak RSS (/usr/bin/time), and every
#    output image's SHA-256 against the image it must equal.
# 3. Prints a table of medians (throughput = MiB of partition images written per second of
#    wall time; peak RSS in MiB) and ratios, and writes everything as JSON to
#    bench/results/scratch/ota-<UTC time>.json.
#
# Usage: bench/ota-bench.sh [WORKDIR] [SIZE_MiB] [ROUNDS]
#   WORKDIR   default /dev/shm/snapblk-ota-bench when MemAvailable exceeds about
#             4 x SIZE + 4 GiB, else /var/tmp/snapblk-ota-bench
#   SIZE_MiB  total size of the two images (default 2560); ROUNDS (default 3)
# Env: SNAPBLK (release binary; built if unset), BENCH_TOOLS (default: ../bench-tools beside the
#      repository) holding the PyPI venv (made if missing) and the payload_dumper crate's
#      binary; BUILD_PAYLOAD_DUMPER_RS=1 builds that binary when missing (opt-in and heavy:
#      `cargo install --locked payload_dumper@0.8.4` with fat LTO, several minutes on 2 cores,
#      refused when CI is set); payload-dumper-go is BENCH_TOOLS/payload-dumper-go when present
#      (the Go module proxy refuses it, so build it from its source: `git clone
#      https://github.com/ssut/payload-dumper-go && GOTOOLCHAIN=go1.27.3 go build` — commit
#      05fe59e measured, liblzma-dev needed for its cgo xz); CODECS (xz,bz; add zstd for Android 17's REPLACE_ZSTD);
#      KEEP=1 keeps the images and payloads in WORKDIR/data-SIZE for the next run.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SIZE=${2:-2560}
ROUNDS=${3:-3}
CODECS=${CODECS:-xz,bz}
TOOLS=${BENCH_TOOLS:-$(dirname "$ROOT")/bench-tools}
avail_mib=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
if [[ -n "${1:-}" ]]; then
  WORK=$1
elif (( avail_mib > 4 * SIZE + 4096 )); then
  WORK=/dev/shm/snapblk-ota-bench
else
  WORK=/var/tmp/snapblk-ota-bench
fi
for t in mke2fs debugfs dumpe2fs bsdiff xz bzip2 python3 sha256sum; do
  command -v "$t" > /dev/null || { echo "$t missing (bash scripts/install-deps.sh)" >&2; exit 1; }
done
[[ -x /usr/bin/time ]] || { echo "/usr/bin/time missing (apt-get install time)" >&2; exit 1; }

T=${CARGO_TARGET_DIR:-$ROOT/target}
if [[ -z "${SNAPBLK:-}" ]]; then
  (cd "$ROOT" && cargo build --release -q -p snapblk-cli)
  SNAPBLK=$T/release/snapblk
fi
(cd "$ROOT" && cargo build --release -q -p snapblk-ota --example ota_bench_payload --features test-utils)
GEN=$T/release/examples/ota_bench_payload

# Third-party tools, outside the repository.
mkdir -p "$TOOLS"
PY=$TOOLS/pyvenv
if [[ ! -x $PY/bin/payload_dumper ]]; then
  echo "== installing PyPI payload-dumper 0.3.0 into $PY" >&2
  python3 -m venv "$PY" && "$PY/bin/pip" install -q payload-dumper==0.3.0
fi
PDRS_ROOT=$TOOLS/payload_dumper-0.8.4
PDRS=$PDRS_ROOT/bin/payload_dumper
if [[ ! -x $PDRS && "${BUILD_PAYLOAD_DUMPER_RS:-0}" == 1 ]]; then
  if [[ -n "${CI:-}" ]]; then
    echo "not building payload_dumper 0.8.4 under CI" >&2
  else
    echo "== building crates.io payload_dumper 0.8.4 into $PDRS_ROOT (heavy: fat LTO)" >&2
    # Local payloads only: no HTTP client (remote_zip, prefetch), the same extraction code.
    CARGO_TARGET_DIR=$TOOLS/build-payload_dumper cargo install --locked --root "$PDRS_ROOT" \
      --no-default-features --features local_zip,diff_ota payload_dumper@0.8.4
    rm -rf "$TOOLS/build-payload_dumper"
  fi
fi
[[ -x $PDRS ]] || { echo "note: no $PDRS (BUILD_PAYLOAD_DUMPER_RS=1 builds it); running without it" >&2; PDRS=; }
PDGO=$TOOLS/payload-dumper-go
[[ -x $PDGO ]] || { echo "note: no $PDGO (see this script's header); running without it" >&2; PDGO=; }

# 1. Images and payloads.
sys_mb=$((SIZE * 3 / 4))
ven_mb=$((SIZE - sys_mb))
D=$WORK/data-$SIZE
mkdir -p "$D"
export TMPDIR=$D
if [[ ! -e $D/done ]]; then
  rm -rf "${D:?}"/*
  echo "== making the images (system $sys_mb MiB, vendor $ven_mb MiB) in $D" >&2
  python3 "$ROOT/bench/cow/make-pair.py" "$D" "$sys_mb" 2>&1 | grep -v '^Creating' >&2
  python3 "$ROOT/bench/ota/make-fs.py" /usr/share "$D/vendor.img" "$ven_mb"
  mkdir -p "$D/new" "$D/old"
  mv "$D/new.img" "$D/new/system.img"; mv "$D/old.img" "$D/old/system.img"
  mv "$D/vendor.img" "$D/new/vendor.img"; ln "$D/new/vendor.img" "$D/old/vendor.img"
  echo "== writing the full payload" >&2
  "$GEN" full "$D/full.bin" --codecs "$CODECS" system="$D/new/system.img" vendor="$D/new/vendor.img" 2> "$D/full.log"
  cat "$D/full.log" >&2
  echo "== planning and writing the incremental payload" >&2
  python3 "$ROOT/bench/ota/plan-delta.py" system "$D/old/system.img" "$D/new/system.img" > "$D/plan.txt"
  python3 "$ROOT/bench/ota/plan-delta.py" vendor "$D/old/vendor.img" "$D/new/vendor.img" >> "$D/plan.txt"
  "$GEN" delta "$D/delta.bin" "$D/plan.txt" --codecs "$CODECS" 2> "$D/delta.log"
  cat "$D/delta.log" >&2
  # The decompression ceiling's input: the compressed streams, alternately in two halves.
  "$PY/bin/python" - "$D/full.bin" "$D" <<'PY'
import struct, sys
import payload_dumper.update_metadata_pb2 as um
f = open(sys.argv[1], "rb")
_, _, msize, sig = struct.unpack(">4sQQI", f.read(24))
m = um.DeltaArchiveManifest()
m.ParseFromString(f.read(msize))
base = 24 + msize + sig
outs = {(k, h): open(f"{sys.argv[2]}/streams{h}.{k}", "wb") for k in ("xz", "bz2", "zst") for h in (0, 1)}
kinds = {um.InstallOperation.REPLACE_XZ: "xz", um.InstallOperation.REPLACE_BZ: "bz2"}
kinds[getattr(um.InstallOperation, "REPLACE_ZSTD", 14)] = "zst"
i = 0
for p in m.partitions:
    for op in p.operations:
        k = kinds.get(op.type)
        if k:
            f.seek(base + op.data_offset)
            outs[(k, i % 2)].write(f.read(op.data_length))
            i += 1
PY
  sha256sum "$D"/new/*.img > "$D/sha256"
  touch "$D/done"
fi
cleanup() { rm -rf "$WORK/out" "$WORK/time" "$WORK/log"; [[ "${KEEP:-0}" == 1 ]] || rm -rf "$D"; }
trap cleanup EXIT
parts=$(cd "$D/new" && ls -- *.img | sed 's/\.img$//')
img_bytes=$(cat "$D"/new/*.img | wc -c)

# 2. Runs.
OUT=$WORK/out
RUNS=$WORK/runs.txt
: > "$RUNS"
ceiling() {
  local h
  for h in 0 1; do
    { xz -dc "$D/streams$h.xz" > /dev/null; bzip2 -dc "$D/streams$h.bz2" > /dev/null
      if [[ -s $D/streams$h.zst ]]; then zstd -qdc "$D/streams$h.zst" > /dev/null; fi; } &
  done
  wait
}
ceiling_t2() {  # the issue's ceiling: `xz -dc -T2` of the xz streams, then both bzip2 halves at once
  local h
  cat "$D/streams0.xz" "$D/streams1.xz" | xz -dc -T2 > /dev/null
  for h in 0 1; do
    { bzip2 -dc "$D/streams$h.bz2" > /dev/null
      if [[ -s $D/streams$h.zst ]]; then zstd -qdc "$D/streams$h.zst" > /dev/null; fi; } &
  done
  wait
}
run() {  # run PHASE TOOL ROUND CMD...: time CMD, check DIR/<partition>.img
  local phase=$1 tool=$2 round=$3 rc=0 ok=1 p
  shift 3
  rm -rf "$OUT"; mkdir -p "$OUT"
  /usr/bin/time -f '%e %U %S %M' -o "$WORK/time" "$@" > "$WORK/log" 2>&1 || rc=$?
  if [[ $tool == ceiling* ]]; then
    ok=-
  else
    for p in $parts; do
      [[ "$(sha256sum < "$OUT/$p.img" 2> /dev/null | cut -d' ' -f1)" == \
         "$(grep "/new/$p.img\$" "$D/sha256" | cut -d' ' -f1)" ]] || ok=0
    done
  fi
  if [[ $rc != 0 || $ok == 0 ]]; then
    echo "  $phase $tool round $round: exit $rc, outputs match: $ok; last lines:" >&2; tail -3 "$WORK/log" >&2
  fi
  echo "$phase $tool $round $rc $ok $(tail -1 "$WORK/time")" >> "$RUNS"
  rm -rf "$OUT"
}
export -f ceiling ceiling_t2
export D
load0=$(cut -d' ' -f1-3 /proc/loadavg)
t1=$( { /usr/bin/time -f %e sha256sum "$D/new/system.img" > /dev/null; } 2>&1 )
t2=$( { /usr/bin/time -f %e bash -c "sha256sum $D/new/system.img > /dev/null & sha256sum $D/new/system.img > /dev/null; wait"; } 2>&1 )
cores=$(python3 -c "print(f'{2 * $t1 / $t2:.2f}')")
echo "== $ROUNDS rounds in $WORK; effective cores $cores; load $load0" >&2
for ((r = 0; r < ROUNDS; r++)); do
  ext=(snapblk pypi ceiling ceiling-t2); app=(snapblk pypi snapblk-mmap)
  [[ -n $PDRS ]] && ext+=(crate) && app+=(crate)
  [[ -n $PDGO ]] && ext+=(go) && app+=(go)
  for ((i = 0; i < ${#ext[@]}; i++)); do
    tool=${ext[$(((i + r) % ${#ext[@]}))]}
    case $tool in
      snapblk) run extract snapblk "$r" "$SNAPBLK" ota extract "$D/full.bin" -o "$OUT" ;;
      pypi) run extract pypi "$r" "$PY/bin/payload_dumper" --out "$OUT" "$D/full.bin" ;;
      crate) run extract crate "$r" "$PDRS" "$D/full.bin" -o "$OUT" -q ;;
      go) run extract go "$r" "$PDGO" -c "$(nproc)" -q -o "$OUT" "$D/full.bin" ;;
      ceiling) run extract ceiling "$r" bash -c ceiling ;;
      ceiling-t2) run extract ceiling-t2 "$r" bash -c ceiling_t2 ;;
    esac
  done
  for ((i = 0; i < ${#app[@]}; i++)); do
    tool=${app[$(((i + r) % ${#app[@]}))]}
    case $tool in
      snapblk) run apply snapblk "$r" "$SNAPBLK" ota apply "$D/delta.bin" --source "$D/old" -o "$OUT" ;;
      snapblk-mmap) run apply snapblk-mmap "$r" env MALLOC_MMAP_THRESHOLD_=131072 \
                      "$SNAPBLK" ota apply "$D/delta.bin" --source "$D/old" -o "$OUT" ;;
      pypi) run apply pypi "$r" "$PY/bin/payload_dumper" --diff --old "$D/old" --out "$OUT" "$D/delta.bin" ;;
      crate) run apply crate "$r" "$PDRS" "$D/delta.bin" --source-dir "$D/old" -o "$OUT" -q ;;
      go) run apply go "$r" "$PDGO" -c "$(nproc)" -q -old "$D/old" -o "$OUT" "$D/delta.bin" ;;
    esac
  done
  echo "   round $((r + 1))/$ROUNDS done" >&2
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

# 3. Summary.
mkdir -p "$ROOT/bench/results/scratch"
json=$ROOT/bench/results/scratch/ota-$(date -u +%Y-%m-%dT%H%M).json
commit=$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates || echo "+dirty")
python3 - "$RUNS" "$json" <<PY
import json, statistics as st, sys, os
runs = []
for line in open(sys.argv[1]):
    ph, tool, rnd, rc, ok, wall, usr, sy, rss = line.split()
    runs.append(dict(phase=ph, tool=tool, round=int(rnd), exit=int(rc), outputs_match=None if ok == "-" else ok == "1",
                     wall_s=float(wall), cpu_s=float(usr) + float(sy), user_s=float(usr), sys_s=float(sy),
                     peak_rss_mib=int(rss) / 1024))
mib = $img_bytes / 2**20
names = dict(snapblk="snapblk ota", pypi="PyPI payload-dumper 0.3.0", crate="payload_dumper 0.8.4 (crates.io)",
             go="payload-dumper-go (05fe59e)",
             ceiling="xz -dc + bzip2 -dc, 2 processes",
             **{"ceiling-t2": "xz -dc -T2, then bzip2 -dc ×2"},
             **{"snapblk-mmap": "snapblk ota, MALLOC_MMAP_THRESHOLD_=128K"})
summary = {}
print()
for ph in ("extract", "apply"):
    rows = [t for t in ("snapblk", "snapblk-mmap", "go", "crate", "pypi", "ceiling", "ceiling-t2") if any(r["phase"] == ph and r["tool"] == t for r in runs)]
    print(f"### {ph}: {mib:.0f} MiB of images ({'full' if ph == 'extract' else 'incremental'} payload, "
          f"{os.path.getsize('$D/' + ('full' if ph == 'extract' else 'delta') + '.bin') / 2**20:.0f} MiB)\n")
    print("| tool | runs ok | wall s | MiB/s | CPU s | MiB/s per CPU-s | peak RSS MiB | snapblk's throughput × (paired) |")
    print("|---|---|---|---|---|---|---|---|")
    ours = {r["round"]: r["wall_s"] for r in runs if r["phase"] == ph and r["tool"] == "snapblk"}
    for t in rows:
        rs = [r for r in runs if r["phase"] == ph and r["tool"] == t]
        good = [r for r in rs if r["exit"] == 0 and r["outputs_match"] is not False]
        w = st.median(r["wall_s"] for r in rs); c = st.median(r["cpu_s"] for r in rs)
        rss = max(r["peak_rss_mib"] for r in rs)
        paired = st.median(r["wall_s"] / ours[r["round"]] for r in rs if r["round"] in ours)
        summary[f"{ph}/{t}"] = dict(tool=names[t], runs=len(rs), runs_ok=len(good), median_wall_s=w,
                                    median_cpu_s=c, mib_per_s=mib / w, mib_per_cpu_s=mib / c,
                                    max_peak_rss_mib=rss, snapblk_speedup_paired=paired)
        print(f"| {names[t]} | {len(good)}/{len(rs)} | {w:.2f} | {mib / w:.0f} | {c:.2f} | {mib / c:.0f} | {rss:.0f} | "
              + ("—" if t == "snapblk" else f"{paired:.2f}×") + " |")
    print()
    for t in ("ceiling", "ceiling-t2"):
        if f"{ph}/{t}" in summary and f"{ph}/snapblk" in summary:
            print(f"snapblk's throughput / the ceiling '{names[t]}': "
                  f"{summary[ph + '/' + t]['snapblk_speedup_paired']:.2f} (paired wall time; goal >= 0.9)")
    if ph == "extract":
        print()
doc = dict(schema="snapblk.bench.ota.v1", date="$(date -u +%Y-%m-%dT%H:%M:%SZ)", commit="$commit",
           machine=dict(nproc=os.cpu_count(), effective_cores=$cores, load_before="$load0", load_after="$load1",
                        mem_total_mib=int(open("/proc/meminfo").readline().split()[1]) // 1024,
                        kernel=os.uname().release, workdir="$WORK"),
           size_mib=$SIZE, rounds=$ROUNDS, codecs="$CODECS", image_bytes=$img_bytes,
           full_payload_bytes=os.path.getsize("$D/full.bin"), delta_payload_bytes=os.path.getsize("$D/delta.bin"),
           full_ops=open("$D/full.log").read().splitlines(), delta_ops=open("$D/delta.log").read().splitlines(),
           summary=summary, runs=runs)
json.dump(doc, open(sys.argv[2], "w"), indent=1)
print(f"effective cores {$cores}, load {'$load0'} -> {'$load1'}; commit $commit; JSON: {sys.argv[2]}")
PY
