//! Write-buffer contents outside verify mode, with fio's knobs and defaults.
//!
//! What a write carries changes what it costs on devices that look at the data: zram compresses
//! every page (lzo gives up on truly random data sooner than on data with a few short repeats),
//! dedupe/compressing SSDs and filesystems likewise. To measure the same thing fio measures,
//! the defaults follow fio's: buffers filled with random data once, then *scrambled* on every
//! write (each 512-byte sector gets its device offset and a time stamp, a few bytes that make
//! every write unique — and that leave short runs of zero bytes, as fio's do); `refill_buffers`
//! refills the whole buffer with fresh random data on every write instead;
//! `buffer_compress_percentage` makes that share of every 512-byte segment zeros.

use snapblk_core::rng::Rng;
use std::time::Duration;

/// Sector granularity of scrambling and of the compressible share (fio's
/// `buffer_compress_chunk` default).
pub(crate) const SEGMENT: usize = 512;

/// How write buffers are filled (verify mode has its own pattern). Serialized under fio's
/// option names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BufferOpts {
    /// Percentage (0..=100) of each 512-byte segment that is zeros (fio
    /// `buffer_compress_percentage`); 0: all random.
    #[serde(rename = "buffer_compress_percentage")]
    pub compress_percentage: u32,
    /// Refill the buffer with new random data before every write (fio `refill_buffers`).
    #[serde(rename = "refill_buffers")]
    pub refill: bool,
    /// Stamp offset and time into every sector of every write (fio `scramble_buffers`,
    /// default on). Ignored with `refill`.
    #[serde(rename = "scramble_buffers")]
    pub scramble: bool,
}

impl Default for BufferOpts {
    fn default() -> Self {
        BufferOpts {
            compress_percentage: 0,
            refill: false,
            scramble: true,
        }
    }
}

/// Fill `buf` with random bytes, `compress_percentage` percent of every segment zeros.
pub(crate) fn fill(buf: &mut [u8], rng: &mut Rng, compress_percentage: u32) {
    let pct = compress_percentage.min(100) as usize;
    let random = SEGMENT * (100 - pct) / 100;
    for seg in buf.chunks_mut(SEGMENT) {
        let r = random.min(seg.len());
        let (rnd, zero) = seg.split_at_mut(r);
        fill_random(rnd, rng);
        zero.fill(0);
    }
}

fn fill_random(buf: &mut [u8], rng: &mut Rng) {
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let rem = chunks.into_remainder();
    let last = rng.next_u64().to_le_bytes();
    let n = rem.len();
    rem.copy_from_slice(&last[..n]);
}

/// Make this write's copy of a reused buffer unique: in every whole 512-byte sector, the
/// sector's device byte offset goes into one of its eight 64-byte lines (chosen per write) and
/// the write's time stamp (seconds, nanoseconds since the job started) into the end of its
/// first line. Three 8-byte stores per sector, so it costs little even at 1 MiB.
pub(crate) fn scramble(buf: &mut [u8], offset: u64, stamp: Duration) {
    let secs = stamp.as_secs().to_le_bytes();
    let nanos = u64::from(stamp.subsec_nanos());
    let line = (((nanos ^ offset) & 7) as usize) * 64;
    let nanos = nanos.to_le_bytes();
    let mut off = offset;
    for sec in buf.chunks_exact_mut(SEGMENT) {
        // Line 0's stamp (bytes 48..64) and any line's offset word (line*64..+8) never overlap.
        sec[line..line + 8].copy_from_slice(&off.to_le_bytes());
        sec[48..56].copy_from_slice(&secs);
        sec[56..64].copy_from_slice(&nanos);
        off = off.wrapping_add(SEGMENT as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zeros(b: &[u8]) -> usize {
        b.iter().filter(|&&x| x == 0).count()
    }

    #[test]
    fn compress_percentage_is_the_zero_share() {
        let mut rng = Rng::new(1);
        let mut b = vec![0xffu8; 64 << 10];
        for pct in [0u32, 25, 50, 90, 100] {
            fill(&mut b, &mut rng, pct);
            let share = zeros(&b) as f64 / b.len() as f64 * 100.0;
            // Random bytes are zero 1/256 of the time.
            assert!(
                (share - pct as f64).abs() < 1.5,
                "pct {pct}: {share:.2}% zeros"
            );
        }
        // Odd lengths fill every byte.
        let mut odd = vec![0u8; 1001];
        fill(&mut odd, &mut rng, 0);
        assert!(zeros(&odd) < 20);
    }

    #[test]
    fn scramble_makes_every_write_unique_and_stays_small() {
        let mut rng = Rng::new(2);
        let mut a = vec![0u8; 4096];
        fill(&mut a, &mut rng, 0);
        let orig = a.clone();
        let mut b = a.clone();
        scramble(&mut a, 8192, Duration::from_nanos(1_000_001));
        scramble(&mut b, 8192, Duration::from_nanos(1_000_002));
        for (s, (x, y)) in a.chunks(512).zip(b.chunks(512)).enumerate() {
            assert_ne!(x, y, "sector {s} identical across writes");
        }
        // Every sector of one write differs from every other (the offset word).
        let secs: Vec<&[u8]> = a.chunks(512).collect();
        for i in 0..secs.len() {
            for j in i + 1..secs.len() {
                assert_ne!(secs[i], secs[j]);
            }
        }
        // Only 24 bytes per sector change.
        let changed = a.iter().zip(&orig).filter(|(x, y)| x != y).count();
        assert!(changed <= 24 * 8, "{changed} bytes changed");
        // The offset of sector k is stored in it.
        let line = ((1_000_001u64 ^ 8192) & 7) as usize * 64;
        for (k, s) in a.chunks(512).enumerate() {
            let v = u64::from_le_bytes(s[line..line + 8].try_into().unwrap());
            assert_eq!(v, 8192 + k as u64 * 512);
        }
    }
}
