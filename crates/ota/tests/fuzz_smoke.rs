//! A bounded, deterministic fuzz smoke through the cargo-fuzz targets' entry points
//! (`snapblk_ota::fuzzing::{fuzz_payload, fuzz_bspatch}`): mutated payloads, raw and as wrapped
//! manifests, and mutated bsdiff patches must never panic. Long runs: `crates/ota/fuzz`
//! (tests/suites/parsers-fuzz.sh).

use snapblk_ota::fuzzing::{bspatch_seed, fuzz_bspatch, fuzz_keys, fuzz_payload, manifest_seed};
use snapblk_ota::testing::{Encoding, PayloadBuilder, bsdf2_from_bsdiff40};
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

/// xorshift64*, seeded: the same mutations every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(r: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + r.below(4) {
        match r.below(4) {
            0 if !b.is_empty() => {
                let i = r.below(b.len());
                b[i] ^= 1 << r.below(8);
            }
            1 if !b.is_empty() => {
                let i = r.below(b.len());
                b[i] = r.next() as u8;
            }
            2 => b.truncate(r.below(b.len() + 1)),
            _ => {
                let i = r.below(b.len() + 1);
                b.insert(i, r.next() as u8);
            }
        }
    }
    b
}

#[test]
fn mutated_payloads_never_panic() {
    let payload = PayloadBuilder::new()
        .partition(
            "system",
            &pattern(6 * 4096, 1),
            2,
            &[
                Encoding::Xz,
                Encoding::Bz,
                Encoding::Zstd,
                Encoding::Replace,
            ],
        )
        .partition("zeros", &[0u8; 3 * 4096], 1, &[Encoding::Replace])
        .bytes();
    let mut seeds = vec![[&[0u8][..], &payload].concat()];
    seeds.push(manifest_seed(&payload).unwrap());
    // Signed by openssl, the key appended (flag bits 1 and 2): the harness checks the
    // signatures with it, so mutations start from the verified path.
    let d = TempDir::new("ota-payload-smoke");
    let k = snapblk_testsupport::openssl::key(d.path(), "ec", "ec:P-256");
    let u = PayloadBuilder::new()
        .partition("system", &pattern(2 * 4096, 3), 1, &[Encoding::Xz])
        .build()
        .unsigned(&[72, 72], true);
    let signed = u.sign(&|_, m| snapblk_testsupport::openssl::sign(d.path(), &k.private, m));
    let key = std::fs::read(&k.public_der).unwrap();
    let mut seed = [&[6u8][..], &signed, &key].concat();
    seed.extend((key.len() as u16).to_be_bytes());
    let keys = snapblk_ota::VerifyKey::parse_all(&key).unwrap();
    let p = snapblk_ota::Payload::from_bytes(signed).unwrap();
    let digests = p.signature_digests(false, &mut |_| {}).unwrap();
    let report = p.verify_signatures(&keys, Some(&digests)).unwrap();
    report.require_verified().unwrap();
    seeds.push(seed);
    let mut r = Rng(0x5eed_f07a);
    for s in &seeds {
        fuzz_payload(s);
    }
    for i in 0..3000 {
        let s = &seeds[i % seeds.len()];
        fuzz_payload(&mutate(&mut r, s));
    }
}

#[test]
fn mutated_bsdiff_patches_never_panic() {
    // Seeds: Debian bsdiff's patch between two related files, and its BSDF2 repackings.
    let d = TempDir::new("ota-bspatch-smoke");
    let old = pattern(3000, 1);
    let mut new = old[200..].to_vec();
    new.splice(900..900, pattern(300, 2));
    for i in (0..new.len()).step_by(131) {
        new[i] ^= 0x5a;
    }
    std::fs::write(d.join("old"), &old).unwrap();
    std::fs::write(d.join("new"), &new).unwrap();
    let (o, n, p) = (d.join("old"), d.join("new"), d.join("patch"));
    tool_ok("bsdiff", &[path_str(&o), path_str(&n), path_str(&p)]);
    let patch = std::fs::read(&p).unwrap();
    let mut seeds = vec![bspatch_seed(&old, &patch)];
    for codecs in [[0, 0, 0], [2, 2, 2], [1, 0, 2]] {
        seeds.push(bspatch_seed(&old, &bsdf2_from_bsdiff40(&patch, codecs)));
    }
    for s in &seeds {
        assert!(fuzz_bspatch(s), "a seed does not apply");
    }
    let mut r = Rng(0xb5d1_ff40);
    for i in 0..3000 {
        let s = &seeds[i % seeds.len()];
        fuzz_bspatch(&mutate(&mut r, s));
    }
}

#[test]
fn mutated_key_files_never_panic() {
    let d = TempDir::new("ota-keys-smoke");
    let mut seeds = Vec::new();
    for (name, spec) in [("rsa", "rsa:2048"), ("ec", "ec:P-256"), ("ed", "ed25519")] {
        let k = snapblk_testsupport::openssl::key(d.path(), name, spec);
        for f in [&k.cert_pem, &k.cert_der, &k.public_pem, &k.public_der] {
            seeds.push(std::fs::read(f).unwrap());
        }
    }
    let zip = d.join("otacerts.zip");
    let certs = [d.join("rsa.crt.pem"), d.join("ec.crt.pem")];
    tool_ok(
        "zip",
        &[
            "-j",
            "-q",
            path_str(&zip),
            path_str(&certs[0]),
            path_str(&certs[1]),
        ],
    );
    seeds.push(std::fs::read(&zip).unwrap());
    let mut r = Rng(0x6e75_0c27);
    for s in &seeds {
        fuzz_keys(s);
    }
    for i in 0..3000 {
        let s = &seeds[i % seeds.len()];
        fuzz_keys(&mutate(&mut r, s));
    }
}
