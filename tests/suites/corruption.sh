#!/usr/bin/env bash
# Corruption campaign, bounded slice (tests/corruption/campaign.py): random single-bit flips and
# truncations of COWs made by `snapblk cow create` (v2/v3, every codec, with and without
# scratch) and of the AOSP golden COWs, and of their records, through cow verify, cow apply,
# merge and serve (NBD, read by nbdcopy). Fails on any panic, hang, output larger than the
# image, base changed by a failed merge, silent wrong output with a record, or an unmodified
# control that does not pass. Ends with "N passed, N failed".
# Full run: FLIPS=5000 TRUNCATIONS=500 tests/suites/corruption.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p snapblk-cli || { echo "FAIL: build"; echo "0 passed, 1 failed"; exit 1; }
exec python3 tests/corruption/campaign.py --bin "${CARGO_TARGET_DIR:-target}/release/snapblk" \
    --flips "${FLIPS:-300}" --truncations "${TRUNCATIONS:-30}" --seed "${SEED:-$(date +%j)}" \
    ${CAMPAIGN_JSON:+--json "$CAMPAIGN_JSON"}
