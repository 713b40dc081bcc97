#![no_main]
//! Fuzz the bsdiff applier (BSDIFF40 and BSDF2 patches) behind SOURCE_BSDIFF and BROTLI_BSDIFF.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = snapblk_ota::fuzzing::fuzz_bspatch(data);
});
