#![no_main]
//! Fuzz the device-spec parser (and applying a `null` spec).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    snapblk::fuzzing::fuzz_spec(data);
});
