#!/usr/bin/env bash
# Documents speak of the product (dates, versions, commits), never of rounds of work a reader
# cannot resolve ("the seventh session", "this round"), nor of files or trackers that do not exist
# ("design.md", "issue #4"). Checks the Markdown documents, scripts and Rust sources in git.
set -uo pipefail
cd "$(dirname "$0")/.."
ORD='first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth'
PAT="\b($ORD|previous|last|earlier|later|next|this|that|every|one|same)[- ]sessions?\b|\bsession[- ](end|start)\b|\b($ORD|previous|last|earlier|this|next)[- ]rounds? of work\b|\b($ORD)[- ]rounds?\b|\bthis round\b|\bearlier rounds\b|\bissue #[0-9]+|\bdesign\.md\b|/[0-9-]+-s[0-9]+/"
out=$(git ls-files '*.md' '*.sh' '*.py' '*.rs' | grep -v '^scripts/check-docs.sh$' | xargs grep -nHiE "$PAT" 2>/dev/null)
if [ -n "$out" ]; then
  echo "$out"
  echo "documents must name dates, versions or commits, not rounds of work or missing references ($(echo "$out" | wc -l) lines)"
  exit 1
fi
echo "no document counts rounds of work or points at missing references"
