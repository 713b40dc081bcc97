#![no_main]
//! Fuzz the PUFFDIFF applier: deflate puff/huff round trips, huffing arbitrary puffs, and
//! whole patches (see `snapblk_ota::puffin_testing::fuzz_puffin`).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    snapblk_ota::fuzzing::fuzz_puffin(data);
});
