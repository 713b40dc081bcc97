#!/usr/bin/env bash
# Fuzz smoke for the snapshot layer's parsers of COW bytes (crates/snapshot/fuzz): the overlay
# journal and the merge state (num_merge_ops, scratch state byte, staged window). Builds the
# libFuzzer targets with the nightly toolchain and coverage instrumentation (what cargo-fuzz does),
# then runs each for FUZZ_SECS seconds (default 20). Fails if the toolchain is missing or a target
# crashes (panic, abort, timeout, out-of-memory).
# Longer campaigns: FUZZ_SECS=3600 tests/suites/snapshot-fuzz.sh
set -uo pipefail
cd "$(dirname "$0")/../../crates/snapshot/fuzz"
. ../../../tests/lib/fuzz.sh
fuzz_build

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
  fuzz_run "$t" -max_len=65536 -timeout=10 -rss_limit_mb=2048
done
fuzz_summary
