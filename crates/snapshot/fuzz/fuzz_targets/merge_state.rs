//! Fuzzes loading merge progress and the staged scratch window (open, read, merge, reopen).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    snapblk_snapshot::fuzzing::fuzz_merge_state(data);
});
