//! Offset generators: which block each job touches next, and whether it reads or writes.
//!
//! Random patterns visit every block of the job's region exactly once per pass, in a seeded
//! pseudo-random order (fio's default `randommap` behaviour), using a bijective hash over the next
//! power of two with cycle walking, so no per-block map is needed.

use crate::spec::RwMode;
use snapblk_core::rng::{Rng, mix};

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    Read,
    Write,
}

/// A seeded permutation of `0..n` computed on the fly.
#[derive(Debug, Clone)]
pub(crate) struct Permutation {
    n: u64,
    bits: u32,
    mask: u64,
    k: [u64; 4],
    i: u64,
}

impl Permutation {
    pub(crate) fn new(n: u64, seed: u64) -> Permutation {
        let bits = if n <= 1 {
            0
        } else {
            64 - (n - 1).leading_zeros()
        };
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let k = [
            mix(seed) | 1,
            mix(seed ^ 1),
            mix(seed ^ 2) | 1,
            mix(seed ^ 3),
        ];
        Permutation {
            n,
            bits,
            mask,
            k,
            i: 0,
        }
    }

    /// A bijection on `bits`-bit integers: odd multiplies and xor-shifts are each invertible.
    fn h(&self, mut x: u64) -> u64 {
        let s = (self.bits / 2).max(1);
        x = (x.wrapping_mul(self.k[0]).wrapping_add(self.k[1])) & self.mask;
        x ^= x >> s;
        x = x.wrapping_mul(self.k[2]) & self.mask;
        x ^= x >> s;
        x = (x.wrapping_add(self.k[3])) & self.mask;
        x = x.wrapping_mul(self.k[0]) & self.mask;
        x ^ (x >> s)
    }

    /// Next element, `None` after all `n` were produced.
    pub(crate) fn next_index(&mut self) -> Option<u64> {
        while self.i <= self.mask {
            let y = self.h(self.i);
            self.i += 1;
            if y < self.n {
                return Some(y);
            }
            if self.mask == u64::MAX && self.i == 0 {
                break;
            }
        }
        None
    }
}

/// Generates `(direction, offset)` pairs for one job over its region.
#[derive(Debug, Clone)]
pub(crate) struct OffsetGen {
    start: u64,
    blocks: u64,
    bs: u64,
    random: bool,
    read_pct: u32,
    seed: u64,
    mix_rng: Rng,
    seq: u64,
    perm: Permutation,
    /// Completed passes over the region.
    pub pass: u64,
}

impl OffsetGen {
    /// `region` = (start, len) with len a multiple of `bs`; `job` differentiates seeds.
    pub(crate) fn new(
        mode: RwMode,
        rwmixread: u32,
        region: (u64, u64),
        bs: u64,
        seed: u64,
        job: u32,
    ) -> OffsetGen {
        let blocks = region.1 / bs;
        let seed = mix(seed ^ (u64::from(job) << 32));
        OffsetGen {
            start: region.0,
            blocks,
            bs,
            random: mode.is_random(),
            read_pct: mode.read_pct(rwmixread),
            seed,
            mix_rng: Rng::new(seed ^ 0xD1CE),
            seq: 0,
            perm: Permutation::new(blocks, seed),
            pass: 0,
        }
    }

    pub(crate) fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The next block index in this pass, or `None` when the pass is complete.
    fn next_block(&mut self) -> Option<u64> {
        if self.random {
            self.perm.next_index()
        } else if self.seq < self.blocks {
            self.seq += 1;
            Some(self.seq - 1)
        } else {
            None
        }
    }

    /// Next I/O; `None` when a pass is over and `wrap` is false. With `wrap` a new pass starts
    /// (a fresh random order, or sequential from the start again).
    pub(crate) fn next(&mut self, wrap: bool) -> Option<(Dir, u64)> {
        let b = match self.next_block() {
            Some(b) => b,
            None => {
                self.pass += 1;
                if !wrap || self.blocks == 0 {
                    return None;
                }
                self.seq = 0;
                self.perm = Permutation::new(self.blocks, self.seed.wrapping_add(self.pass));
                self.next_block()?
            }
        };
        let dir = match self.read_pct {
            100 => Dir::Read,
            0 => Dir::Write,
            p => {
                if self.mix_rng.below(100) < u64::from(p) {
                    Dir::Read
                } else {
                    Dir::Write
                }
            }
        };
        Some((dir, self.start + b * self.bs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn permutation_is_a_permutation(n in 0u64..3000, seed: u64) {
            let mut p = Permutation::new(n, seed);
            let mut seen = vec![false; n as usize];
            let mut count = 0;
            while let Some(i) = p.next_index() {
                prop_assert!(i < n);
                prop_assert!(!seen[i as usize]);
                seen[i as usize] = true;
                count += 1;
            }
            prop_assert_eq!(count, n);
        }
    }

    #[test]
    fn random_order_is_not_sequential() {
        let mut g = OffsetGen::new(RwMode::RandRead, 0, (0, 4096 * 1000), 4096, 1, 0);
        let v: Vec<u64> = std::iter::from_fn(|| g.next(false).map(|x| x.1)).collect();
        let ascending = v.windows(2).filter(|w| w[1] == w[0] + 4096).count();
        assert!(ascending < 50, "{ascending} sequential steps");
    }

    #[test]
    fn wrap_starts_new_pass() {
        let mut g = OffsetGen::new(RwMode::Read, 0, (8192, 3 * 512), 512, 1, 0);
        let v: Vec<u64> = (0..7).map(|_| g.next(true).unwrap().1).collect();
        assert_eq!(v, vec![8192, 8704, 9216, 8192, 8704, 9216, 8192]);
        assert_eq!(g.pass, 2);
    }
}
