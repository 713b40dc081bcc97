#!/usr/bin/env bash
# Benchmark `snapblk ota generate` on a large ext4 image pair, with references in the same run
# (not a test, not in CI).
#
# 1. Makes the change-heavy old/new ext4 pair of bench/cow/make-pair.py (a subset of /usr/lib:
#    files deleted, relinked, edited, replaced and added; SIZE_MiB each, default 384).
# 2. ROUNDS times, in a rotated order: `snapblk ota generate` of an incremental payload
#    (BSDF2, and BSDIFF40), `snapblk ota generate` of a full payload, and the references
#    `snapblk cow create` (the COW of the same pair, lz4, v3: block-level matching and XOR
#    without bsdiff) and `xz -6 -T1` of the new image (a full payload's ceiling); and `snapblk
#    ota cow` of an incremental BSDF2 payload made before the rounds (the Virtual A/B COW a
#    device would write: apply into unnamed files, then the COW writer and its record, both
#    streaming from the image files), against `cow create` of the same pair. Each run: wall
#    and CPU time and peak RSS (/usr/bin/time); output sizes. The `ota cow` input asks for
#    v3 lz4 COWs in 4 KiB units (`--compression-factor 4096`), as `cow create` writes them.
#    Then the writers alone, on one thread (like for like with Android's writer, timed alone
#    from an op list) and on all cores: the writer part of `ota cow` runs (its --json
#    `seconds.cow_write`, timed inside the library; ROUNDS runs with --threads 1, and the timed
#    runs above) and ROUNDS runs each of `cow create --time-writer` with --threads 1 and with
#    all cores (`seconds_writer_only`: the COW written again from the computed op list), as
#    MiB of image and MiB handed to the compressor per second, printed beside the figures of
#    Android's writer from the project's notes (anchor-figures.md, a 512 MiB pair; reference
#    rows, not measured by this script).
# 3. Checks the last payloads: `snapblk ota apply` of each incremental and `ota extract` of the
#    full one give exactly the new image, and `ota cow --verify` of the BSDF2 one fits its
#    estimate. Prints medians and ratios (generate time / cow create time, payload size / xz
#    size, writer throughputs) and writes them as JSON to
#    bench/results/scratch/ota-generate-<UTC time>.json.
#
# Usage: bench/ota-generate.sh [WORKDIR] [SIZE_MiB] [ROUNDS]
#   WORKDIR default /dev/shm/snapblk-ota-generate (or /var/tmp/... when memory is short)
# Env: SNAPBLK (release binary; built if unset), THREADS (generate --threads; default 2).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SIZE=${2:-384}
ROUNDS=${3:-3}
THREADS=${THREADS:-2}
avail_mib=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
if [[ -n "${1:-}" ]]; then
  WORK=$1
elif (( avail_mib > 8 * SIZE + 2048 )); then
  WORK=/dev/shm/snapblk-ota-generate
else
  WORK=/var/tmp/snapblk-ota-generate
fi
for t in mke2fs xz python3 cmp jq bc; do
  command -v "$t" > /dev/null || { echo "$t missing (bash scripts/install-deps.sh)" >&2; exit 1; }
done
[[ -x /usr/bin/time ]] || { echo "/usr/bin/time missing (apt-get install time)" >&2; exit 1; }
if [[ -z "${SNAPBLK:-}" ]]; then
  (cd "$ROOT" && cargo build --release -q -p snapblk-cli)
  SNAPBLK=${CARGO_TARGET_DIR:-$ROOT/target}/release/snapblk
fi

mkdir -p "$WORK"
trap 'rm -rf "$WORK"/run "$WORK"/old "$WORK"/new "$WORK"/cow-input.bin' EXIT
if [[ ! -f "$WORK/pair/new.img" ]]; then
  python3 "$ROOT/bench/cow/make-pair.py" "$WORK/pair" "$SIZE" 2>&1 | grep -v '^Creating' >&2
fi
mkdir -p "$WORK/old" "$WORK/new" "$WORK/run"
ln -f "$WORK/pair/old.img" "$WORK/old/system.img" 2>/dev/null || cp "$WORK/pair/old.img" "$WORK/old/system.img"
ln -f "$WORK/pair/new.img" "$WORK/new/system.img" 2>/dev/null || cp "$WORK/pair/new.img" "$WORK/new/system.img"

# The input of the timed `ota cow` runs.
"$SNAPBLK" --quiet ota generate --source "$WORK/old" --target "$WORK/new" -o "$WORK/cow-input.bin" \
  --threads "$THREADS" --compression-factor 4096 > /dev/null
declare -A CMD=(
  [gen-bsdf2]="$SNAPBLK ota generate --source $WORK/old --target $WORK/new -o $WORK/run/bsdf2.bin --threads $THREADS"
  [gen-bsdiff40]="$SNAPBLK ota generate --source $WORK/old --target $WORK/new -o $WORK/run/bsdiff40.bin --threads $THREADS --bsdiff-format bsdiff40"
  [gen-full]="$SNAPBLK ota generate --target $WORK/new -o $WORK/run/full.bin --threads $THREADS"
  [cow-create]="$SNAPBLK cow create --old $WORK/pair/old.img --new $WORK/pair/new.img -o $WORK/run/pair.cow --format v3 --compression lz4 --no-record"
  [xz]="sh -c 'xz -6 -T1 -c $WORK/pair/new.img > $WORK/run/new.img.xz'"
  [ota-cow]="sh -c 'rm -rf $WORK/run/cowout && $SNAPBLK --quiet ota cow $WORK/cow-input.bin --source $WORK/old -o $WORK/run/cowout --json > $WORK/run/ota-cow.json'"
)
declare -A OUTFILE=(
  [gen-bsdf2]=bsdf2.bin [gen-bsdiff40]=bsdiff40.bin [gen-full]=full.bin
  [cow-create]=pair.cow [xz]=new.img.xz [ota-cow]=cowout/system.cow
)
names=(gen-bsdf2 gen-bsdiff40 gen-full cow-create xz ota-cow)
declare -A WALL CPU RSS SIZE_OUT
OTA_WN="" OTA_W1="" CC_WN="" CC_W1="" OTA_C=0 CC_C=0 OTA_PHASES="{}"
for ((r = 0; r < ROUNDS; r++)); do
  for ((i = 0; i < ${#names[@]}; i++)); do
    n=${names[$(((i + r) % ${#names[@]}))]}
    rm -f "$WORK/run/${OUTFILE[$n]}"
    /usr/bin/time -f '%e %U %S %M' -o "$WORK/time.txt" bash -c "${CMD[$n]}" > /dev/null
    read -r e u s m < "$WORK/time.txt"
    WALL[$n]+="$e "; CPU[$n]+="$(echo "$u + $s" | bc) "; RSS[$n]+="$((m / 1024)) "
    SIZE_OUT[$n]=$(stat -c %s "$WORK/run/${OUTFILE[$n]}")
    echo "round $((r + 1)) $n: ${e}s wall, $((m / 1024)) MiB peak RSS" >&2
    if [[ $n == ota-cow ]]; then
      # The writer's share (the library's timing) and what it handed the compressor.
      OTA_WN+="$(jq '.seconds.cow_write' "$WORK/run/ota-cow.json") "
      OTA_C=$(jq '[.partitions[].ops | (.replace_blocks + .xor_blocks + .verity_blocks) * 4096] | add' \
        "$WORK/run/ota-cow.json")
      OTA_PHASES=$(jq -c '.seconds' "$WORK/run/ota-cow.json")
    fi
  done
done
# The writers alone, on one thread (like for like with Android's writer figures) and on all
# cores: the writer part of `ota cow --threads 1` runs (the timed runs above give the all-core
# figure) and `cow create --time-writer` from its computed op list (same pair, v3 lz4, 4 KiB
# units), with --threads 1 and with its default, all cores.
for ((r = 0; r < ROUNDS; r++)); do
  rm -rf "$WORK/run/cowout1"
  "$SNAPBLK" --quiet ota cow "$WORK/cow-input.bin" --source "$WORK/old" -o "$WORK/run/cowout1" \
    --threads 1 --json > "$WORK/run/ota-cow-1.json"
  OTA_W1+="$(jq '.seconds.cow_write' "$WORK/run/ota-cow-1.json") "
  for t in 1 all; do
    targs=()
    [[ $t == 1 ]] && targs=(--threads 1)
    "$SNAPBLK" --quiet cow create --old "$WORK/pair/old.img" --new "$WORK/pair/new.img" \
      -o "$WORK/run/pair-w.cow" --format v3 --compression lz4 --no-record --time-writer --json \
      "${targs[@]}" > "$WORK/run/cow-create-w.json"
    if [[ $t == 1 ]]; then
      CC_W1+="$(jq '.seconds_writer_only' "$WORK/run/cow-create-w.json") "
    else
      CC_WN+="$(jq '.seconds_writer_only' "$WORK/run/cow-create-w.json") "
    fi
  done
  CC_C=$(jq '.compressed_input_bytes' "$WORK/run/cow-create-w.json")
done

# The payloads build the new image.
for p in bsdf2 bsdiff40; do
  rm -rf "$WORK/run/applied"
  "$SNAPBLK" ota apply "$WORK/run/$p.bin" --source "$WORK/old" -o "$WORK/run/applied" > /dev/null
  cmp "$WORK/run/applied/system.img" "$WORK/pair/new.img" || { echo "$p: apply differs" >&2; exit 1; }
done
rm -rf "$WORK/run/applied"
"$SNAPBLK" ota extract "$WORK/run/full.bin" -o "$WORK/run/applied" > /dev/null
cmp "$WORK/run/applied/system.img" "$WORK/pair/new.img" || { echo "full: extract differs" >&2; exit 1; }
rm -rf "$WORK/run/applied"
"$SNAPBLK" ota cow "$WORK/run/bsdf2.bin" --source "$WORK/old" -o "$WORK/run/cow" --verify --json > "$WORK/run/cow.json"

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mkdir -p "$ROOT/bench/results/scratch"
json=$ROOT/bench/results/scratch/ota-generate-$(date -u +%Y%m%dT%H%M%SZ).json
{
  echo "{\"size_mib\": $SIZE, \"rounds\": $ROUNDS, \"threads\": $THREADS, \"runs\": {"
  sep=""
  for n in "${names[@]}"; do
    printf '%s"%s": {"wall_s": %s, "cpu_s": %s, "rss_mib": %s, "bytes": %s}' "$sep" "$n" \
      "$(echo "${WALL[$n]}" | median)" "$(echo "${CPU[$n]}" | median)" \
      "$(echo "${RSS[$n]}" | median)" "${SIZE_OUT[$n]}"
    sep=", "
  done
  printf '}, "writer_only": {"ota_cow_s": %s, "ota_cow_all_cores_s": %s, "ota_cow_compressed_bytes": %s, "ota_cow_phases": %s, "cow_create_s": %s, "cow_create_all_cores_s": %s, "cow_create_compressed_bytes": %s}' \
    "$(echo "$OTA_W1" | median)" "$(echo "$OTA_WN" | median)" "$OTA_C" "$OTA_PHASES" \
    "$(echo "$CC_W1" | median)" "$(echo "$CC_WN" | median)" "$CC_C"
  echo ", \"ota_cow\": $(cat "$WORK/run/cow.json")}"
} > "$json"
printf '%-14s %10s %10s %10s %14s\n' run "wall s" "cpu s" "RSS MiB" bytes
for n in "${names[@]}"; do
  printf '%-14s %10s %10s %10s %14s\n' "$n" "$(echo "${WALL[$n]}" | median)" \
    "$(echo "${CPU[$n]}" | median)" "$(echo "${RSS[$n]}" | median)" "${SIZE_OUT[$n]}"
done
w_gen=$(echo "${WALL[gen-bsdf2]}" | median); w_cow=$(echo "${WALL[cow-create]}" | median)
echo "generate (BSDF2) / cow create wall: $(echo "scale=2; $w_gen / $w_cow" | bc)"
w_ota=$(echo "${WALL[ota-cow]}" | median)
echo "ota cow / cow create wall: $(echo "scale=2; $w_ota / $w_cow" | bc); ota cow: $(echo "scale=0; $SIZE / $w_ota" | bc) MiB of image per second"
echo "ota cow peak RSS: $(echo "${RSS[ota-cow]}" | median) MiB for a $SIZE MiB partition (cow create: $(echo "${RSS[cow-create]}" | median) MiB)"
# Writer only, like for like with Android's writer figures.
w_ota_w=$(echo "$OTA_W1" | median); w_cc_w=$(echo "$CC_W1" | median)
w_ota_wn=$(echo "$OTA_WN" | median); w_cc_wn=$(echo "$CC_WN" | median)
mibs() { echo "scale=0; $1 / 1048576 / $2" | bc; }
echo
echo "COW writer alone, v3 lz4 4 KiB units (medians of $ROUNDS):"
printf '  %-58s %12s %16s\n' writer "image MiB/s" "compressed MiB/s"
printf '  %-58s %12s %16s\n' "snapblk ota cow --threads 1, its writer part (seconds.cow_write)" \
  "$(mibs $((SIZE << 20)) "$w_ota_w")" "$(mibs "$OTA_C" "$w_ota_w")"
printf '  %-58s %12s %16s\n' "snapblk cow create --threads 1 --time-writer" \
  "$(mibs $((SIZE << 20)) "$w_cc_w")" "$(mibs "$CC_C" "$w_cc_w")"
printf '  %-58s %12s %16s\n' "snapblk ota cow, all cores, its writer part" \
  "$(mibs $((SIZE << 20)) "$w_ota_wn")" "$(mibs "$OTA_C" "$w_ota_wn")"
printf '  %-58s %12s %16s\n' "snapblk cow create --time-writer, all cores" \
  "$(mibs $((SIZE << 20)) "$w_cc_wn")" "$(mibs "$CC_C" "$w_cc_wn")"
echo "  reference rows, NOT measured here (anchor-figures.md: Android's writer, same op list, 1 thread,"
echo "  a 512 MiB ext4 pair, 70.5 MiB to compress; MB/s as the notes give them):"
printf '  %-58s %12s %16s\n' "  Android v3 lz4 (4 KiB units)" 7366 1014 "  Android v2 lz4" 5516 760 \
  "  Android v3 zstd (64 KiB units)" 4106 565 "  Android v2 zstd" 2483 342 "  Android v2 gz (level 9)" 310 43
echo "ota cow's writer / cow create's writer per compressed MiB, 1 thread: $(echo "scale=2; $w_cc_w * $OTA_C / ($w_ota_w * $CC_C)" | bc); all cores: $(echo "scale=2; $w_cc_wn * $OTA_C / ($w_ota_wn * $CC_C)" | bc)"
echo "  (cow create's writer measured 0.99x Android's on v3 lz4 side by side, 2026-11-25, anchor-figures.md)"
echo "ota cow phases (last run, s): $OTA_PHASES"
echo "incremental payload / xz of the new image: $(echo "scale=3; ${SIZE_OUT[gen-bsdf2]} / ${SIZE_OUT[xz]}" | bc)"
echo "full payload / xz of the new image: $(echo "scale=3; ${SIZE_OUT[gen-full]} / ${SIZE_OUT[xz]}" | bc)"
echo "results: $json"
