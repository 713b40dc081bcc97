# Shared by the fuzz smoke suites (tests/suites/*-fuzz.sh); source it from the crate's fuzz/ dir.
# fuzz_build builds the libFuzzer targets with the nightly toolchain and the coverage
# instrumentation cargo-fuzz would use; fuzz_run TARGET ARGS... runs one for FUZZ_SECS seconds
# (default 20) on corpus/TARGET and counts a crash (panic, abort, timeout, OOM) as a failure.
SECS=${FUZZ_SECS:-20}
passed=0; failed=0
ok() { echo "PASS $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
fuzz_summary() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; }

fuzz_build() {
  TRIPLE=$(rustc +nightly -vV 2>/dev/null | awk '/^host:/{print $2}')
  if [ -z "$TRIPLE" ]; then
    bad "nightly toolchain missing (rustup toolchain install nightly)"; fuzz_summary; exit 1
  fi
  export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
  # --target keeps the instrumentation away from build scripts and proc macros.
  # Its own target dir: the instrumented build must not share the main one (CARGO_TARGET_DIR).
  if CARGO_TARGET_DIR="$PWD/target" cargo +nightly build --release --target "$TRIPLE" -q; then ok "build fuzz targets"; else
    bad "build fuzz targets"; fuzz_summary; exit 1; fi
}

fuzz_run() {
  local t=$1; shift
  mkdir -p "artifacts/$t" "corpus/$t"
  if "target/$TRIPLE/release/$t" "corpus/$t" -max_total_time="$SECS" "$@" \
      -artifact_prefix="artifacts/$t/" -print_final_stats=1 > "artifacts/$t.log" 2>&1; then
    ok "fuzz $t for ${SECS}s ($(grep -o 'stat::number_of_executed_units: *[0-9]*' "artifacts/$t.log" | awk '{print $2}') execs)"
  else
    bad "fuzz $t: crash, see $PWD/artifacts/$t.log"; tail -20 "artifacts/$t.log"
  fi
}
