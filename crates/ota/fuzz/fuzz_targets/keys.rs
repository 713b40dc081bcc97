#![no_main]
//! Fuzz the `--key` file parser (PEM blocks, X.509 certificates, SubjectPublicKeyInfo, PKCS#1)
//! and signature checks with the keys it finds.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    snapblk_ota::fuzzing::fuzz_keys(data);
});
