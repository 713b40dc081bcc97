#!/usr/bin/env bash
# Fuzz smoke for the snapshot layer's parsers of COW bytes (crates/snapshot/fuzz): the overlay
# journal and the merge state (num_merge_ops, scratch state byte, staged window). Builds the
# libFuzzer targets with the nightly toolchain and coverage instrumentation (what cargo-fuzz does),
# then runs each for FUZZ_SECS seconds (default 20). Fails if the toolchain is missing or a target
# crashes (panic, abort, timeout, out-of-memory).
# Longer campaigns: FUZZ_SECS=3600 tests/suites/snapshot-fuzz.sh
set -uo pipefail
cd "$(dirname "$0")/../../crates/snapshot/fuzz"
SECS=${FUZZ_SECS:-20}
passed=0; failed=0
ok() { echo "PASS $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }

TRIPLE=$(rustc +nightly -vV 2>/dev/null | awk '/^host:/{print $2}')
if [ -z "$TRIPLE" ]; then
  bad "nightly toolchain missing (rustup toolchain install nightly)"
  echo "$passed passed, $failed failed"; exit 1
fi
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
# --target keeps the instrumentation away from build scripts and proc macros.
if cargo +nightly build --release --target "$TRIPLE" -q; then ok "build fuzz targets"; else
  bad "build fuzz targets"; echo "$passed passed, $failed failed"; exit 1; fi

# Seeds (the harness repairs structure when flag bit 0/1 is set, see src/fuzzing.rs):
# overlay_journal: flags, then a record header + data blocks; merge_state: flags, num_merge_ops,
# state byte, scratch bytes.
mkdir -p corpus/overlay_journal corpus/merge_state
{ printf '\001'; head -c 12288 /dev/zero; } > corpus/overlay_journal/one-record
{ printf '\001SNAPBLKO\001'; head -c 20479 /dev/zero | tr '\0' '\003'; } > corpus/overlay_journal/two-records
{ printf '\000'; head -c 4096 /dev/zero; } > corpus/overlay_journal/raw
{ printf '\003'; head -c 8 /dev/zero; printf '\002'; head -c 64 /dev/zero | tr '\0' '\253'; } > corpus/merge_state/staged
{ printf '\001\013'; head -c 7 /dev/zero; printf '\001'; head -c 300 /dev/zero; } > corpus/merge_state/committed
{ printf '\000'; head -c 8 /dev/zero; printf '\002\020'; head -c 40 /dev/zero; } > corpus/merge_state/raw

for t in overlay_journal merge_state; do
  mkdir -p "artifacts/$t"
  if "target/$TRIPLE/release/$t" "corpus/$t" -max_total_time="$SECS" -max_len=65536 \
      -timeout=10 -rss_limit_mb=2048 -artifact_prefix="artifacts/$t/" -print_final_stats=1 \
      > "artifacts/$t.log" 2>&1; then
    ok "fuzz $t for ${SECS}s ($(grep -o 'stat::number_of_executed_units: *[0-9]*' "artifacts/$t.log" | awk '{print $2}') execs)"
  else
    bad "fuzz $t: crash, see crates/snapshot/fuzz/artifacts/$t.log"; tail -20 "artifacts/$t.log"
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
