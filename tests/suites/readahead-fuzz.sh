#!/usr/bin/env bash
# Fuzz smoke for the readahead list parsers (crates/readahead/fuzz): builds the libFuzzer targets
# with the nightly toolchain and coverage instrumentation (what cargo-fuzz does), then runs each
# for FUZZ_SECS seconds (default 20). Fails if the toolchain is missing or a target crashes.
# Longer campaigns: FUZZ_SECS=3600 tests/suites/readahead-fuzz.sh
set -uo pipefail
cd "$(dirname "$0")/../../crates/readahead/fuzz"
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

mkdir -p corpus/parse_list corpus/parse_block_list
printf '# snapblk-readahead-list v1\n/usr/lib/a.so\tdev=254:0 ino=12 size=4096 mtime=1.5\t0:4096\n' > corpus/parse_list/text
printf '{"path":"/a\\\\x01b","identity":null,"ranges":[[0,1],[4096,8192]]}\n' > corpus/parse_list/jsonl
printf '/usr/lib/libc.so.6 0:65536,131072:4096\n/plain file\n' > corpus/parse_list/classic
printf '# snapblk-block-list v1\n0:4096\n1048576:65536\n' > corpus/parse_block_list/seed

for t in parse_list parse_block_list; do
  mkdir -p "artifacts/$t"
  if "target/$TRIPLE/release/$t" "corpus/$t" -max_total_time="$SECS" -max_len=4096 \
      -artifact_prefix="artifacts/$t/" -print_final_stats=1 > "artifacts/$t.log" 2>&1; then
    ok "fuzz $t for ${SECS}s ($(grep -o 'stat::number_of_executed_units: *[0-9]*' "artifacts/$t.log" | awk '{print $2}') execs)"
  else
    bad "fuzz $t: crash, see crates/readahead/fuzz/artifacts/$t.log"; tail -20 "artifacts/$t.log"
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
