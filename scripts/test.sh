#!/usr/bin/env bash
# The whole test suite: installs what the tests need, then runs the Rust tests and every suite
# script in tests/suites/ (C ABI tests, interop with real clients, fuzz smoke, the ublk VM).
# Exit status is non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# One build from a clean clone gains nothing from incremental caches, which would double the
# size of target/ (CI disks can be nearly full).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

t_install=$SECONDS
bash scripts/install-deps.sh || { echo "dependency installation failed"; exit 1; }
times=("install-deps $((SECONDS - t_install))")

fail=0
failed_steps=()
# Each step's wall time, printed at the end: where CI's minutes go.
t_step=$SECONDS; cur_step=""
step() {
  [ -n "$cur_step" ] && times+=("$cur_step $((SECONDS - t_step))")
  cur_step=$*; t_step=$SECONDS
  echo; echo "=== $*"
}
# A failed step is named again at the very end, where a CI log's tail shows it.
failed_step() { fail=1; failed_steps+=("$1"); }
# Free space where target/ lives: a build that dies with a linker bus error usually means a full disk.
free_space() { df -h --output=avail . | tail -1 | tr -d ' '; }
build_failed() {
  echo "build failed (free disk space here: $(free_space))"
  times+=("$cur_step $((SECONDS - t_step))")
  echo "wall time per step (s):"; printf '  %s\n' "${times[@]}"
  exit 1
}
echo "free disk space before the build: $(free_space)"

step "cargo fmt --check"
cargo fmt --all -- --check || failed_step "cargo fmt"

step "source checks: file length, architecture guide, dated documents"
bash scripts/check-file-length.sh || failed_step "file length check"
bash scripts/check-architecture.sh || failed_step "architecture check"
bash scripts/check-docs.sh || failed_step "docs check"

step "cargo build (debug and release binaries used by the suites)"
cargo build --workspace --all-targets || build_failed
cargo build --release -p snapblk-cli -p snapblk-capi || build_failed

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings || failed_step "cargo clippy"

step "cargo doc (warnings denied: broken intra-doc links fail)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q || failed_step "cargo doc"

step "cargo test"
cargo test --workspace --no-fail-fast 2>&1 | tee target/cargo-test.log
[ "${PIPESTATUS[0]}" -eq 0 ] || failed_step "cargo test"

passed=0; failed=0
# Each suite's output is kept in target/suite-logs/: a CI log shows only its head and tail, so
# the failing checks of a failed suite are printed again at the end.
mkdir -p target/suite-logs
suite_logs=()
for s in tests/suites/*.sh; do
  [ -e "$s" ] || continue
  step "suite $s"
  log=target/suite-logs/$(basename "$s" .sh).log
  # The suite writes its log; tail shows it as it grows and stops when the suite's process
  # ends. Not a pipe to tee: a daemon a suite left behind holding its stdout would keep the
  # pipe open and the run waiting for it.
  : > "$log"
  bash "$s" > "$log" 2>&1 &
  spid=$!
  tail -n +1 -f -s 0.2 --pid="$spid" "$log"
  if wait "$spid"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); echo "SUITE FAILED: $s"; failed_steps+=("suite $s"); suite_logs+=("$log")
  fi
done
times+=("$cur_step $((SECONDS - t_step))")
echo
echo "wall time per step (s):"
printf '  %s\n' "${times[@]}"
echo "suites: $passed passed, $failed failed"
echo "target/ size: $(du -sh target | cut -f1), free disk space: $(free_space)"
[ "$failed" -eq 0 ] || fail=1
if [ "$fail" -ne 0 ]; then
  echo "FAILED: ${failed_steps[*]}"
  # The failing tests and test binaries by name, from cargo test's own output.
  grep -E '^---- .* stdout ----$|^error: [0-9]+ targets? failed|^    `-p ' target/cargo-test.log 2>/dev/null |
    head -40
  # What each failed suite reported as failing (checks, kernel reports, VM outcome), and its end.
  for log in "${suite_logs[@]}"; do
    echo "--- $log: failing lines, then its last lines"
    grep -a -E '^(FAIL|DMESG:|not ok|VM timed out|VM did not boot|guest reported)|^\[vm [0-9:]+\] (TIMEOUT|no VM_RC|the guest kernel died)' "$log" | head -30
    tail -n 5 "$log"
  done
fi
exit $fail
