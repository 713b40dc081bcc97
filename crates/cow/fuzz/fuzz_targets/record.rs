#![no_main]
//! Fuzz the COW record (sidecar) parser.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    snapblk_cow::fuzzing::fuzz_record(data);
});
