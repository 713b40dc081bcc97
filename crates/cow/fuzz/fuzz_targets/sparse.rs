#![no_main]
//! Fuzz the Android sparse image parser.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    snapblk_cow::fuzzing::fuzz_sparse(data);
});
