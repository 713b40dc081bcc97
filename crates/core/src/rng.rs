//! A tiny deterministic PRNG (SplitMix64): reproducible workloads, fault schedules, offsets and
//! verify patterns from a seed, cheap enough to fill buffers at memory speed, without pulling a
//! RNG crate into the libraries. Every seed is valid (0 included); the same seed gives the same
//! sequence on every platform (a unit test pins the reference outputs).

/// SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `0..n` (0 for `n` = 0), by multiply-shift (bias below 2^-32 for n < 2^32).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability 1/2.
    #[inline]
    pub fn coin(&mut self) -> bool {
        self.next_u64() & (1 << 40) != 0
    }

    /// Fill a buffer with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// The SplitMix64 finaliser: a good 64-bit hash for combining seeds.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published SplitMix64 sequence for seed 1234567 (the reference implementation's
    /// test vector): changing the algorithm changes every seeded workload, so it must show here.
    #[test]
    fn pinned_outputs() {
        let mut r = Rng::new(1234567);
        let want = [
            6457827717110365317u64,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for w in want {
            assert_eq!(r.next_u64(), w);
        }
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = Rng::new(0);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let v = r.below(7);
            assert!(v < 7);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn fill_is_the_sequence_in_little_endian() {
        let mut a = Rng::new(9);
        let mut buf = [0u8; 11];
        a.fill(&mut buf);
        let mut b = Rng::new(9);
        let x = b.next_u64().to_le_bytes();
        let y = b.next_u64().to_le_bytes();
        assert_eq!(&buf[..8], &x);
        assert_eq!(&buf[8..], &y[..3]);
        let heads = (0..1000).filter(|_| a.coin()).count();
        assert!((400..600).contains(&heads), "{heads}");
    }
}
