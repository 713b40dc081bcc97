#![no_main]
//! Fuzz the COW reader: parse, map, merge order, payload decoding, block reads.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    snapblk_cow::fuzzing::fuzz_cow(data);
});
