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

bash scripts/install-deps.sh || { echo "dependency installation failed"; exit 1; }

fail=0
step() { echo; echo "=== $*"; }
# Free space where target/ lives: a build that dies with a linker bus error usually means a full disk.
free_space() { df -h --output=avail . | tail -1 | tr -d ' '; }
build_failed() { echo "build failed (free disk space here: $(free_space))"; exit 1; }
echo "free disk space before the build: $(free_space)"

step "cargo fmt --check"
cargo fmt --all -- --check || fail=1

step "source checks: file length, architecture guide, dated documents"
bash scripts/check-file-length.sh || fail=1
bash scripts/check-architecture.sh || fail=1
bash scripts/check-docs.sh || fail=1

step "cargo build (debug and release binaries used by the suites)"
cargo build --workspace --all-targets || build_failed
cargo build --release -p snapblk-cli -p snapblk-capi || build_failed

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings || fail=1

step "cargo doc (warnings denied: broken intra-doc links fail)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q || fail=1

step "cargo test"
cargo test --workspace --no-fail-fast 2>&1 | tee target/cargo-test.log
[ "${PIPESTATUS[0]}" -eq 0 ] || fail=1

passed=0; failed=0
for s in tests/suites/*.sh; do
  [ -e "$s" ] || continue
  step "suite $s"
  if bash "$s"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "SUITE FAILED: $s"; fi
done
echo
echo "suites: $passed passed, $failed failed"
echo "target/ size: $(du -sh target | cut -f1), free disk space: $(free_space)"
[ "$failed" -eq 0 ] || fail=1
exit $fail
