#!/usr/bin/env bash
# Run the cargo-fuzz targets of snapblk-cow for a bounded time (not part of the test suite; the
# suite runs a deterministic mutation smoke of the same entry points in
# crates/cow/tests/hostile.rs and tests/suites/parsers-fuzz.sh). A thin front end to
# scripts/fuzz-campaign.sh, which builds the targets, seeds them (golden COWs without their
# scratch area, a sparse image, records of golden COWs) and records the figures.
# Usage: scripts/fuzz-cow.sh [SECONDS_PER_TARGET (default 60)] [TARGET...]  (cow_reader sparse record)
set -euo pipefail
SECS=${1:-60}; shift || true
TARGETS=("$@"); [[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(cow_reader sparse record)
MAX_SECS=$SECS exec bash "$(dirname "$0")/fuzz-campaign.sh" "${TARGETS[@]/#/cow/}"
