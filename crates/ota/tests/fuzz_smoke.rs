//! A bounded, deterministic fuzz smoke through the cargo-fuzz target's entry point
//! (`snapblk_ota::fuzzing::fuzz_payload`): mutated payloads, raw and as wrapped manifests,
//! must never panic. Long runs: `crates/ota/fuzz` (tests/suites/parsers-fuzz.sh).

use snapblk_ota::fuzzing::{fuzz_payload, manifest_seed};
use snapblk_ota::testing::{Encoding, PayloadBuilder};
use snapblk_testsupport::pattern;

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
    let mut r = Rng(0x5eed_f07a);
    for s in &seeds {
        fuzz_payload(s);
    }
    for i in 0..3000 {
        let s = &seeds[i % seeds.len()];
        fuzz_payload(&mutate(&mut r, s));
    }
}
