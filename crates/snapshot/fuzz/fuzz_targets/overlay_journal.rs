//! Fuzzes overlay-journal replay (open, read, write, reopen, merge) on hostile journal bytes.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    snapblk_snapshot::fuzzing::fuzz_overlay(data);
});
