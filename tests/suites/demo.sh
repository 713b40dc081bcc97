#!/usr/bin/env bash
# The README's first command, `bash scripts/demo.sh`, run as a user runs it: every step must
# succeed and print what the README shows (the applied and merged images equal the new one,
# the post-update file system served by `ota serve --fuse` mounts and reads version 2).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(bash scripts/demo.sh 2>&1); rc=$?
passed=0; failed=0
check() { # check WHAT PATTERN
  if grep -qF -- "$2" <<<"$out"; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1: no '$2'"; failed=$((failed + 1)); fi
}
if [ $rc -ne 0 ]; then echo "$out" | tail -30; echo "FAIL scripts/demo.sh exited $rc"; failed=$((failed + 1)); fi
check "cow apply gives the new image" "applied image == new image"
check "merge gives the new image" "merged device == new image"
check "ota apply gives the new image" "applied system.img == new image"
if [ "$(id -u)" = 0 ]; then
  check "ota serve --fuse: the post-update file system mounts and reads version 2" \
    "post-update /etc/release (mounted): version=2"
else
  check "ota serve --fuse: the post-update file system reads version 2" "post-update /etc/release (debugfs): version=2"
fi
check "the demo ends" "demo: OK"
echo "demo: $passed passed, $failed failed"
[ $failed -eq 0 ]
