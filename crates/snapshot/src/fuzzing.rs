//! Entry points shared by the cargo-fuzz targets (`crates/snapshot/fuzz`) and the mutation smoke
//! test (`tests/hostile.rs`), so CI runs the same code the fuzzer does.
//!
//! Bytes from the COW file reach this crate's own parsers in two places (the Android op format
//! itself is parsed, and fuzzed, in snapblk-cow):
//!
//! * the **overlay journal** after the COW data ([`fuzz_overlay`]);
//! * the **merge state**: `num_merge_ops`, the scratch state byte and the staged window (entries
//!   and data) in the scratch area ([`fuzz_merge_state`]).
//!
//! Each entry point puts the fuzzed bytes into a small valid synthetic snapshot (in memory),
//! opens it, reads every block, writes, reopens and merges. Errors are expected; panics, hangs and
//! unbounded allocations are bugs. Where a property holds whatever the bytes are, it is asserted
//! (a write acknowledged by a journal opened from hostile bytes reads back after a restart).

use crate::dev::BlockDev;
use crate::map::OpKind;
use crate::merge::{MergeOptions, merge};
use crate::snapshot::{Snapshot, SnapshotConfig, SnapshotParts};
use crate::synth::{RawOnly, SynthCase, SynthSpec, generate};
use snapblk_core::MemFile;
use std::sync::{Arc, OnceLock};

/// Record header size of the overlay journal (see [`crate::overlay`]).
const HDR: usize = 4096;

fn case() -> &'static SynthCase {
    static CASE: OnceLock<SynthCase> = OnceLock::new();
    CASE.get_or_init(|| {
        generate(
            &SynthSpec {
                blocks: 48,
                block_size: 4096,
                // 64 KiB: 256 bytes of entries (14 slots), so windows are small and several.
                scratch_size: 64 << 10,
                chain_len: 8,
                chains: 2,
                random_ordered: 6,
                replaces: 4,
                zeros: 2,
                unaligned_xor: true,
            },
            5,
        )
    })
}

fn open(base: &Arc<MemFile>, cow: &Arc<MemFile>, writable: bool) -> crate::Result<Snapshot> {
    let c = case();
    Snapshot::open(SnapshotParts {
        base: base.clone() as Arc<dyn BlockDev>,
        cow: cow.clone() as Arc<dyn BlockDev>,
        map: c.map(),
        layout: c.layout,
        decoder: Arc::new(RawOnly),
        config: SnapshotConfig {
            writable,
            cache_bytes: 64 << 10,
            ..SnapshotConfig::default()
        },
    })
}

/// Read the whole device in a few shapes (block reads, an unaligned span); results are ignored.
fn read_all(s: &Snapshot) {
    let cap = s.capacity();
    let mut buf = vec![0u8; 4096];
    let mut off = 0;
    while off < cap {
        let _ = s.read(off, &mut buf);
        off += 4096;
    }
    let mut big = vec![0u8; 3 * 4096 + 100];
    let _ = s.read(1000, &mut big);
}

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// Make records in `j` pass the journal's checks where possible (magic, sequence, chain, CRCs),
/// so the fuzzer gets past them to the bounds checks behind.
fn fix_journal(j: &mut [u8]) {
    let (mut pos, mut seq, mut prev) = (0usize, 1u64, 0u32);
    while pos + HDR <= j.len() {
        let avail = (j.len() - pos - HDR) / 4096;
        if avail == 0 {
            break;
        }
        let n = (le32(j, pos + 24) as usize % avail.min(1024)) + 1;
        let h = &mut j[pos..pos + HDR];
        h[..8].copy_from_slice(b"SNAPBLKO");
        h[8..16].copy_from_slice(&seq.to_le_bytes());
        // Keep the fuzzer's block number but fold it into the device most of the time.
        let first = u64::from_le_bytes(h[16..24].try_into().unwrap_or([0; 8]));
        if first & (1 << 63) == 0 {
            h[16..24].copy_from_slice(&(first % 48).to_le_bytes());
        }
        h[24..28].copy_from_slice(&(n as u32).to_le_bytes());
        h[32..36].copy_from_slice(&prev.to_le_bytes());
        let dcrc = crc32fast::hash(&j[pos + HDR..pos + HDR + n * 4096]);
        let h = &mut j[pos..pos + HDR];
        h[28..32].copy_from_slice(&dcrc.to_le_bytes());
        let hcrc = crate::overlay::header_crc(h);
        h[36..40].copy_from_slice(&hcrc.to_le_bytes());
        prev = hcrc;
        seq += 1;
        pos += HDR + n * 4096;
    }
}

/// Replace the per-open nonce of every record of a well-formed journal by a fixed one (and
/// re-chain), so seeds are the same bytes on every run.
fn pin_nonces(j: &mut [u8]) {
    let (mut pos, mut prev) = (0usize, 0u32);
    while pos + HDR <= j.len() && &j[pos..pos + 8] == b"SNAPBLKO" {
        let h = &mut j[pos..pos + HDR];
        h[32..36].copy_from_slice(&prev.to_le_bytes());
        h[40..48].copy_from_slice(&0x5eed_u64.to_le_bytes());
        prev = crate::overlay::header_crc(h);
        h[36..40].copy_from_slice(&prev.to_le_bytes());
        pos += HDR + le32(j, pos + 24) as usize * 4096;
    }
}

/// The overlay journal: `data[0]` bit 0 asks to fix up the records' magic, sequence, chain and
/// CRCs (so the fuzzer gets past those checks to the bounds checks behind); `data[1..]` is the
/// journal (appended at the 4 KiB-aligned end of the COW data). Opens it writable, reads
/// everything, writes a block, reopens (the write must read back), then merges.
pub fn fuzz_overlay(data: &[u8]) {
    let Some((&flags, journal)) = data.split_first() else {
        return;
    };
    let c = case();
    let start = c.layout.data_end.div_ceil(4096) * 4096;
    let mut cow = c.cow.clone();
    cow.resize(start as usize, 0);
    let at = cow.len();
    cow.extend_from_slice(journal);
    if flags & 1 != 0 {
        fix_journal(&mut cow[at..]);
    }
    let base = Arc::new(MemFile::new(c.base.clone()));
    let cow = Arc::new(MemFile::new(cow));
    let Ok(s) = open(&base, &cow, true) else {
        return;
    };
    read_all(&s);
    let block = u64::from(flags >> 2) % 48;
    let payload = vec![flags ^ 0x5a; 4096];
    let wrote = s.write(block * 4096, &payload, true).is_ok();
    drop(s);
    let Ok(s) = open(&base, &cow, true) else {
        assert!(!wrote, "journal with an acknowledged write does not reopen");
        return;
    };
    if wrote {
        let mut back = vec![0u8; 4096];
        s.read(block * 4096, &mut back)
            .unwrap_or_else(|e| panic!("reading back an acknowledged write: {e}"));
        assert!(back == payload, "acknowledged write lost after reopen");
    }
    read_all(&s);
    let _ = merge(&s, MergeOptions::default());
}

/// The merge state: `data[0]` flags, `data[1..9]` num_merge_ops, `data[9]` state byte, the rest
/// written into the scratch area. Flag bit 0 folds num_merge_ops into the merge order's length
/// (+1); bit 1 first writes entries that name the next ops of the merge order (so the window
/// loads and the fuzzed bytes land in its data and terminator). Opens, reads, merges, reopens.
pub fn fuzz_merge_state(data: &[u8]) {
    if data.len() < 10 {
        return;
    }
    let c = case();
    let Some(sc) = c.layout.scratch() else {
        return;
    };
    let nops = c.ops.len() as u64;
    let flags = data[0];
    let mut n = u64::from_le_bytes(data[1..9].try_into().unwrap_or([0; 8]));
    if flags & 1 != 0 {
        n %= nops + 2;
    }
    let mut cow = c.cow.clone();
    cow[26..34].copy_from_slice(&n.to_le_bytes());
    let base_at = sc.base as usize;
    cow[base_at] = data[9];
    let rest = &data[10..];
    let scratch_end = base_at + sc.len as usize;
    let mut at = base_at + 1;
    if flags & 2 != 0 {
        let ordered = c.ops.iter().take_while(|o| o.is_ordered()).count() as u64;
        let k = (u64::from(flags >> 2) % sc.slots as u64 + 1).min(ordered.saturating_sub(n));
        for i in 0..k {
            let op = &c.ops[(n + i) as usize];
            let e = base_at + 1 + i as usize * 16;
            cow[e..e + 8].copy_from_slice(&op.new_block.to_le_bytes());
            let off = sc.base + sc.meta_len + i * 4096;
            cow[e + 8..e + 16].copy_from_slice(&off.to_le_bytes());
        }
        // Terminator, then the fuzzed bytes go into the data area.
        let e = base_at + 1 + k as usize * 16;
        cow[e..e + 16].fill(0);
        at = base_at + sc.meta_len as usize;
    }
    let m = rest.len().min(scratch_end - at);
    cow[at..at + m].copy_from_slice(&rest[..m]);
    let base = Arc::new(MemFile::new(c.base.clone()));
    let cow = Arc::new(MemFile::new(cow));
    let Ok(s) = open(&base, &cow, false) else {
        return;
    };
    read_all(&s);
    let (done, total) = s.merge_progress();
    assert!(done <= total, "progress {done}/{total}");
    if merge(&s, MergeOptions::default()).is_ok() {
        drop(s);
        let s = open(&base, &cow, false).unwrap_or_else(|e| panic!("reopen after merge: {e}"));
        assert_eq!(s.merge_progress().0, s.merge_progress().1, "merge complete");
        read_all(&s);
    }
}

/// Seeds for both entry points, made by the real writers: journals written through a writable
/// snapshot, and merge states captured at every durable merge step.
pub fn seeds() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let c = case();
    let start = (c.layout.data_end.div_ceil(4096) * 4096) as usize;
    let mut overlay = Vec::new();
    let base = Arc::new(MemFile::new(c.base.clone()));
    let cow = Arc::new(MemFile::new(c.cow.clone()));
    if let Ok(s) = open(&base, &cow, true) {
        for (i, (b, n)) in [(3u64, 1usize), (10, 3), (3, 2), (40, 1)]
            .iter()
            .enumerate()
        {
            let _ = s.write(b * 4096 + 7, &vec![i as u8 + 1; n * 4096 - 7], false);
            let mut seed = vec![(i as u8) << 2];
            seed.extend_from_slice(cow.contents().get(start..).unwrap_or(&[]));
            pin_nonces(&mut seed[1..]);
            overlay.push(seed);
        }
    }
    let states = std::sync::Mutex::new(Vec::new());
    let base = Arc::new(MemFile::new(c.base.clone()));
    let cow = Arc::new(MemFile::new(c.cow.clone()));
    if let (Ok(s), Some(sc)) = (open(&base, &cow, false), c.layout.scratch()) {
        let grab = |_: crate::merge::MergeStep| {
            let b = cow.contents();
            let h = sc.base as usize;
            let mut seed = vec![0u8];
            seed.extend_from_slice(&b[26..34]);
            seed.push(b[h]);
            seed.extend_from_slice(&b[h + 1..h + sc.meta_len as usize + 2 * 4096]);
            if let Ok(mut v) = states.lock() {
                v.push(seed);
            }
        };
        let _ = merge(
            &s,
            MergeOptions {
                hook: Some(&grab),
                ..MergeOptions::default()
            },
        );
    }
    let mut states = states.into_inner().unwrap_or_default();
    // Also a state claiming a staged window with arbitrary data (flag bit 1).
    let ordered = c
        .ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Copy { .. }))
        .count();
    states.push(
        [
            &[2u8 | ((ordered as u8) << 2)][..],
            &[0; 8],
            &[2],
            &[0xab; 64],
        ]
        .concat(),
    );
    (overlay, states)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Journal seeds carry a fixed nonce (the same bytes every run) and still replay whole.
    #[test]
    fn overlay_seeds_are_deterministic_and_replay() {
        let (a, _) = seeds();
        assert_eq!(a, seeds().0);
        let c = case();
        let start = (c.layout.data_end.div_ceil(4096) * 4096) as usize;
        // Blocks written so far after each seed's write: {3}, +{10,11,12}, +{4}, +{40}.
        for (seed, want) in a.iter().zip([1usize, 4, 5, 6]) {
            let mut cow = c.cow.clone();
            cow.resize(start, 0);
            cow.extend_from_slice(&seed[1..]);
            let base = Arc::new(MemFile::new(c.base.clone()));
            let s = open(&base, &Arc::new(MemFile::new(cow)), false).unwrap();
            assert_eq!(s.overlay().map(|o| o.blocks().len()), Some(want));
        }
    }
}
