//! A bounded, deterministic fuzz smoke through the cargo-fuzz target's entry point
//! (`snapblk_ota::fuzzing::fuzz_puffin`): the seeds of tests/lib/puffin-seeds.sh (deflate
//! streams by Python's zlib, puffs, a PUF1 patch), mutated, must never panic; the harness
//! panics only when a round trip breaks. Long runs: `crates/ota/fuzz` (target `puffin`).

use snapblk_ota::fuzzing::fuzz_puffin;
use snapblk_testsupport::{TempDir, path_str, tool_ok};

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
        // Never the flag byte: each mode keeps its seeds.
        let at = |r: &mut Rng, len: usize| 1 + r.below(len.saturating_sub(1));
        match r.below(4) {
            0 if b.len() > 1 => {
                let i = at(r, b.len());
                b[i] ^= 1 << r.below(8);
            }
            1 if b.len() > 1 => {
                let i = at(r, b.len());
                b[i] = r.next() as u8;
            }
            2 => b.truncate(1 + r.below(b.len())),
            _ => {
                let i = at(r, b.len() + 1);
                b.insert(i.min(b.len()), r.next() as u8);
            }
        }
    }
    b
}

#[test]
fn mutated_puffin_inputs_never_panic() {
    let dir = TempDir::new("puffin-seeds");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/lib/puffin-seeds.sh"
    );
    tool_ok("bash", &[script, path_str(dir.path())]);
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    seeds.sort();
    assert_eq!(seeds.len(), 12);
    // Every mode has seeds, and the deflate seeds are also run shifted.
    for m in 0..3 {
        assert!(seeds.iter().any(|s| s[0] & 3 == m));
    }
    for s in &seeds {
        fuzz_puffin(s);
        for shift in 1..8u8 {
            if s[0] & 3 == 0 {
                fuzz_puffin(&[&[shift << 2][..], &s[1..]].concat());
            }
        }
    }
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..20_000 {
        let s = &seeds[i % seeds.len()];
        fuzz_puffin(&mutate(&mut r, s));
    }
}
