#!/usr/bin/env bash
# No Rust source file over MAX lines (default 1500). Test files do not count: anything under a
# `tests/` directory and sibling test modules named `tests.rs`.
set -uo pipefail
cd "$(dirname "$0")/.."
MAX=${MAX:-1500}
bad=0
while IFS= read -r f; do
  n=$(wc -l < "$f")
  if [ "$n" -gt "$MAX" ]; then echo "$f: $n lines (limit $MAX): split it along its seams"; bad=1; fi
done < <(git ls-files '*.rs' | grep -vE '(^|/)tests/|(^|/)tests\.rs$')
[ $bad -eq 0 ] && echo "no source file over $MAX lines"
exit $bad
