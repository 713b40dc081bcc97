#!/usr/bin/env bash
# Long fuzzing campaign over every cargo-fuzz target of the workspace (not part of the test
# suite, which runs 20-second smokes): each target runs until RUNS executions (default 10
# million) or MAX_SECS seconds (default 3600, one CPU-hour), whichever comes first, one target at
# a time on one core. MAX_SECS is wall time (libFuzzer's -max_total_time); the CPU seconds the
# fuzzer got are recorded too, since on a shared machine they fall short of the wall time.
# Records per target: executions, wall and CPU seconds, exec/s, edge coverage and features at
# the end, corpus files before and after, crashes. Crash inputs stay in
# crates/*/fuzz/artifacts/TARGET/ (add each as a regression test).
# usage: scripts/fuzz-campaign.sh [TARGET...]   (default: all; names as crate/target, e.g. cow/record)
# env:   RUNS, MAX_SECS, OUT (default bench/results/scratch/fuzz-<time>.tsv)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-10000000}
MAX_SECS=${MAX_SECS:-3600}
OUT=${OUT:-$ROOT/bench/results/scratch/fuzz-$(date -u +%Y%m%dT%H%M%SZ).tsv}
mkdir -p "$(dirname "$OUT")"
OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")  # the loop below changes directory
ALL=(cow/record cow/sparse cow/cow_reader nbd/proto nbd/session snapshot/overlay_journal
     snapshot/merge_state readahead/parse_list readahead/parse_block_list snapblk/spec
     ota/payload ota/keys ota/bspatch ota/puffin)
[ $# -gt 0 ] && ALL=("$@")
TRIPLE=$(rustc +nightly -vV 2>/dev/null | awk '/^host:/{print $2}')
[ -n "$TRIPLE" ] || { echo "a nightly toolchain is needed (rustup toolchain install nightly)"; exit 1; }
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"

seed() {  # seed CRATE TARGET DIR: a few valid inputs for targets whose smoke suite has none
  local c=$1 t=$2 d=$3
  case $c/$t in
    cow/cow_reader)
      for f in "$ROOT"/tests/data/aosp-cow/*/snapshot.cow; do
        python3 - "$f" "$d/$(basename "$(dirname "$f")")" <<'PY'
import sys, struct
b = bytearray(open(sys.argv[1], 'rb').read())
hs = struct.unpack_from('<H', b, 12)[0]
bufsz = struct.unpack_from('<I', b, 34)[0]
if bufsz and len(b) > hs + bufsz:
    del b[hs:hs + bufsz]
    struct.pack_into('<I', b, 34, 0)
open(sys.argv[2], 'wb').write(b)
PY
      done ;;
    cow/record)
      local bin=${CARGO_TARGET_DIR:-$ROOT/target}/release/snapblk
      [ -x "$bin" ] || (cd "$ROOT" && cargo build --release -q -p snapblk-cli)
      for g in v2_xor_seq_lz4 v3_copy_chain_seq v2_basic_none; do
        local G=$ROOT/tests/data/aosp-cow/$g
        cp "$G/snapshot.cow" "$d/../$g.cow"
        "$bin" cow record "$d/../$g.cow" --old "$G/base.img" --new "$G/target.img" -o "$d/../$g.rec" > /dev/null
        # The harness's flag byte (bit 0: repair the checksum), then the record.
        { printf '\001'; cat "$d/../$g.rec"; } > "$d/$g"
        rm -f "$d/../$g.cow" "$d/../$g.rec"
      done ;;
    cow/sparse)
      head -c 65536 /dev/urandom > "$d/../seed.img"
      command -v img2simg > /dev/null && img2simg "$d/../seed.img" "$d/seed.simg"
      rm -f "$d/../seed.img" ;;
    ota/payload)
      bash "$ROOT/tests/lib/ota-seeds.sh" "$d" ;;
    ota/keys)
      bash "$ROOT/tests/lib/key-seeds.sh" "$d" ;;
    ota/bspatch)
      bash "$ROOT/tests/lib/bspatch-seeds.sh" "$d" ;;
    ota/puffin)
      bash "$ROOT/tests/lib/puffin-seeds.sh" "$d" ;;
    snapblk/spec)
      printf 'null:size=1G' > "$d/null"
      printf 'io_uring:path=/dev/null,read-only=true,direct=false' > "$d/uring"
      printf 'snapshot:base=a.img,cow=b.cow,verify=false,merge=true' > "$d/snapshot"
      printf './a:b' > "$d/path" ;;
  esac
}

printf 'target\texecs\tseconds\tcpu_seconds\texec_per_s\tcov\tft\tcorpus_before\tcorpus_after\tcrashes\n' > "$OUT"
built=""
for ct in "${ALL[@]}"; do
  c=${ct%%/*}; t=${ct#*/}
  dir=$ROOT/crates/$c/fuzz
  [ -d "$dir" ] || { echo "no fuzz crate for $c"; continue; }
  cd "$dir"
  case " $built " in *" $c "*) ;; *)
    CARGO_TARGET_DIR="$dir/target" cargo +nightly build --release --target "$TRIPLE" -q || { echo "build of $c fuzz targets failed"; exit 1; }
    built="$built $c" ;;
  esac
  mkdir -p "corpus/$t" "artifacts/$t"
  [ -n "$(ls -A "corpus/$t")" ] || seed "$c" "$t" "corpus/$t"
  before=$(ls "corpus/$t" | wc -l)
  log="artifacts/$t.campaign.log"
  t0=$(date +%s)
  /usr/bin/time -f "%U %S" -o "artifacts/$t.cpu" "target/$TRIPLE/release/$t" "corpus/$t" -runs="$RUNS" -max_total_time="$MAX_SECS" \
      -max_len=65536 -timeout=10 -rss_limit_mb=2048 -artifact_prefix="artifacts/$t/" \
      -print_final_stats=1 > "$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  cpu=$(awk '{printf "%d", $1 + $2}' "artifacts/$t.cpu" 2>/dev/null)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{print $2}')
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}')
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}')
  after=$(ls "corpus/$t" | wc -l)
  crashes=$(ls "artifacts/$t" | wc -l)
  [ $rc -eq 0 ] || echo "$ct: libFuzzer exit $rc, see $dir/$log"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$ct" "${execs:-0}" "$secs" "${cpu:-?}" \
      "$(( ${execs:-0} / (secs > 0 ? secs : 1) ))" "${cov:-?}" "${ft:-?}" "$before" "$after" "$crashes" >> "$OUT"
  tail -1 "$OUT"
done
echo "results: $OUT"
