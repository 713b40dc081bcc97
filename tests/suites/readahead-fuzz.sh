#!/usr/bin/env bash
# Fuzz smoke for the readahead list parsers (crates/readahead/fuzz): builds the libFuzzer targets
# with the nightly toolchain and coverage instrumentation (what cargo-fuzz does), then runs each
# for FUZZ_SECS seconds (default 20). Fails if the toolchain is missing or a target crashes.
# Longer campaigns: FUZZ_SECS=3600 tests/suites/readahead-fuzz.sh
set -uo pipefail
cd "$(dirname "$0")/../../crates/readahead/fuzz"
. ../../../tests/lib/fuzz.sh
fuzz_build

mkdir -p corpus/parse_list corpus/parse_block_list
printf '# snapblk-readahead-list v1\n/usr/lib/a.so\tdev=254:0 ino=12 size=4096 mtime=1.5\t0:4096\n' > corpus/parse_list/text
printf '{"path":"/a\\\\x01b","identity":null,"ranges":[[0,1],[4096,8192]]}\n' > corpus/parse_list/jsonl
printf '/usr/lib/libc.so.6 0:65536,131072:4096\n/plain file\n' > corpus/parse_list/classic
printf '/my lib.so 0:4096 \n/Track 1:Intro\n/usr/lib/x.so 0:4096,40g96:8192\n' > corpus/parse_list/classic-typo
printf '# snapblk-block-list v1\n0:4096\n1048576:65536\n' > corpus/parse_block_list/seed

for t in parse_list parse_block_list; do fuzz_run "$t" -max_len=4096; done
fuzz_summary
