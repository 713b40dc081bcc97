//! Verify patterns: every block carries a header (magic, its own offset, run stamp, generation)
//! and pseudo-random data derived from all three, so a corrupted, stale (lost write) or
//! misplaced block is detected and described. The stamp is the seed mixed with a nonce of the
//! run ([`run_stamp`]): a run whose writes are lost must not find an earlier run's identical
//! blocks and take them for its own.

use snapblk_core::rng::{Rng, mix};
use std::sync::atomic::{AtomicU64, Ordering};

/// The verify stamp of a new run with `seed`: differs from every other run's, in this process
/// (repetitions, sweep cells) and in others (the clock and the process id go in).
pub(crate) fn run_stamp(seed: u64) -> u64 {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    mix(seed ^ mix(now ^ (u64::from(std::process::id()) << 40) ^ mix(n)))
}

const MAGIC: u64 = 0x5642_4b4c_4250_414e; // "NAPBLKBV" little-endian: a snapblk verify block
const HDR: usize = 32;

fn data_seed(offset: u64, seed: u64, generation: u32) -> u64 {
    mix(seed ^ mix(offset) ^ (u64::from(generation) << 48))
}

/// Fill `buf` with the pattern of the block at `offset` for `generation`.
pub(crate) fn fill(buf: &mut [u8], offset: u64, seed: u64, generation: u32) {
    let mut hdr = [0u8; HDR];
    hdr[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    hdr[8..16].copy_from_slice(&offset.to_le_bytes());
    hdr[16..24].copy_from_slice(&seed.to_le_bytes());
    hdr[24..28].copy_from_slice(&generation.to_le_bytes());
    hdr[28..32].copy_from_slice(&(buf.len() as u32).to_le_bytes());
    let n = HDR.min(buf.len());
    buf[..n].copy_from_slice(&hdr[..n]);
    let mut rng = Rng::new(data_seed(offset, seed, generation));
    let mut chunks = buf[n..].chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let rem = chunks.into_remainder();
    let last = rng.next_u64().to_le_bytes();
    let rl = rem.len();
    rem.copy_from_slice(&last[..rl]);
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
}

/// Check `buf` (read from `offset`) against the pattern of `generation`. The error describes
/// what was found instead.
pub(crate) fn check(buf: &[u8], offset: u64, seed: u64, generation: u32) -> Result<(), String> {
    if buf.len() >= HDR {
        let magic = u64_at(buf, 0).unwrap_or(0);
        if magic != MAGIC {
            let zero = buf.iter().all(|&b| b == 0);
            return Err(format!(
                "block at offset {offset}: no verify header ({})",
                if zero {
                    "all zeroes: never written?"
                } else {
                    "foreign data"
                }
            ));
        }
        let at = u64_at(buf, 8).unwrap_or(0);
        if at != offset {
            return Err(format!(
                "block at offset {offset}: holds the block written for offset {at} (misplaced I/O)"
            ));
        }
        let s = u64_at(buf, 16).unwrap_or(0);
        if s != seed {
            return Err(format!(
                "block at offset {offset}: written by another run (stamp {s:#x}, expected {seed:#x}; a lost write?)"
            ));
        }
        let g = buf
            .get(24..28)
            .and_then(|s| s.try_into().ok())
            .map(u32::from_le_bytes)
            .unwrap_or(0);
        if g != generation {
            return Err(format!(
                "block at offset {offset}: stale data of write generation {g}, expected {generation} (lost write?)"
            ));
        }
    }
    let mut want = vec![0u8; buf.len()];
    fill(&mut want, offset, seed, generation);
    if let Some(i) = buf.iter().zip(&want).position(|(a, b)| a != b) {
        return Err(format!(
            "block at offset {offset}: data mismatch at byte {i} (read {:#04x}, expected {:#04x})",
            buf[i], want[i]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_detection() {
        for len in [1usize, 7, 32, 33, 512, 4096, 4099] {
            let mut b = vec![0u8; len];
            fill(&mut b, 8192, 42, 3);
            assert!(check(&b, 8192, 42, 3).is_ok(), "len {len}");
            let last = len - 1;
            b[last] ^= 1;
            assert!(check(&b, 8192, 42, 3).is_err(), "len {len}");
        }
        let mut b = vec![0u8; 4096];
        fill(&mut b, 4096, 42, 1);
        assert!(check(&b, 8192, 42, 1).unwrap_err().contains("misplaced"));
        assert!(check(&b, 4096, 42, 2).unwrap_err().contains("stale"));
        assert!(check(&b, 4096, 43, 1).unwrap_err().contains("another run"));
        assert_ne!(run_stamp(42), run_stamp(42));
        assert!(
            check(&[0u8; 4096], 0, 42, 1)
                .unwrap_err()
                .contains("zeroes")
        );
        b[100] ^= 0x10;
        assert!(check(&b, 4096, 42, 1).unwrap_err().contains("byte 100"));
    }
}
