#![no_main]
//! Fuzz the payload header and manifest parser, the signature blobs and their check, the
//! extraction plan and extraction itself.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    snapblk_ota::fuzzing::fuzz_payload(data);
});
