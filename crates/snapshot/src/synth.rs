//! Synthetic workloads for tests and benchmarks of the engine: a base image, a COW image laid out
//! like a v3 file as far as merge state goes (header with `num_merge_ops` at offset 26, optional
//! scratch area at `header_size`, then raw payloads), ops in a valid merge order with long
//! overlapping COPY/XOR chains, and the expected target image.
//!
//! The op records themselves are not written: the ops are handed to [`SnapshotMap`] directly,
//! which is what the COW parser produces too. This keeps the merge engine's tests independent of
//! the format crate; golden files exercise the combination.

use crate::fault::FaultWorld;
use crate::map::{Codec, MapOp, OpKind, Payload, SnapshotMap};
use crate::snapshot::{CowLayout, Decoder, Snapshot, SnapshotConfig, SnapshotParts};
use snapblk_core::rng::Rng;
use std::collections::HashSet;
use std::sync::Arc;

/// Header size used by synthetic COWs (v3's).
pub const HEADER_SIZE: u32 = 78;

/// Knobs.
#[derive(Debug, Clone, Copy)]
pub struct SynthSpec {
    /// Size of the base and of the new image, in blocks.
    pub blocks: u64,
    /// Bytes per block (a power of two).
    pub block_size: u32,
    /// Scratch bytes (0 = none; Android uses 2 MiB).
    pub scratch_size: u32,
    /// Long chains (shift up / shift down by one block), each of this many ops.
    pub chain_len: u64,
    /// How many such chains.
    pub chains: u64,
    /// Extra random COPY/XOR ops (ordered by a topological sort, cycles broken into REPLACE).
    pub random_ordered: u64,
    /// REPLACE ops with a raw payload of random data.
    pub replaces: u64,
    /// ZERO ops.
    pub zeros: u64,
    /// Allow XOR sources at unaligned byte offsets (reads two blocks, may include its own
    /// destination: needs scratch for a crash-safe merge).
    pub unaligned_xor: bool,
}

impl Default for SynthSpec {
    fn default() -> Self {
        SynthSpec {
            blocks: 256,
            block_size: 4096,
            scratch_size: 64 << 10,
            chain_len: 24,
            chains: 3,
            random_ordered: 40,
            replaces: 20,
            zeros: 8,
            unaligned_xor: true,
        }
    }
}

/// A generated case.
pub struct SynthCase {
    /// The base image (`blocks * block_size` bytes of random data).
    pub base: Vec<u8>,
    /// The COW file image: header with `num_merge_ops`, scratch area, then raw payloads.
    pub cow: Vec<u8>,
    /// The new image the ops produce from `base`: what reads and a merge must yield.
    pub target: Vec<u8>,
    /// The ops in merge order (not encoded in `cow`; see the module docs).
    pub ops: Vec<MapOp>,
    /// Block size, header size, scratch size and data end of `cow`.
    pub layout: CowLayout,
}

impl SynthCase {
    /// The block map.
    pub fn map(&self) -> SnapshotMap {
        SnapshotMap::new(
            self.layout.block_size,
            self.base.len() as u64,
            self.ops.clone(),
        )
        .unwrap_or_else(|e| unreachable!("generated ops are valid: {e}"))
    }

    /// A snapshot of this case on `world`'s disks (0: base, 1: COW), raw payloads only: what the
    /// power-cut, overlay and hostile-input tests open again after every simulated crash.
    pub fn open_on(
        &self,
        world: &Arc<FaultWorld>,
        config: SnapshotConfig,
    ) -> crate::Result<Snapshot> {
        Snapshot::open(SnapshotParts {
            base: Arc::new(world.disk(0)),
            cow: Arc::new(world.disk(1)),
            map: self.map(),
            layout: self.layout,
            decoder: Arc::new(RawOnly),
            config,
        })
    }
}

/// Decoder for synthetic cases (raw payloads only).
pub struct RawOnly;

impl Decoder for RawOnly {
    fn decode(
        &self,
        codec: Codec,
        _src: &[u8],
        _out: &mut [u8],
    ) -> Result<(), snapblk_cow::DecodeError> {
        Err(snapblk_cow::DecodeError::Corrupt(
            format!("synthetic COWs hold raw payloads only, not {codec:?}").into(),
        ))
    }
}

enum Pending {
    Copy(u64),
    Xor(u64),
}

/// Generate a case from a seed.
pub fn generate(spec: &SynthSpec, seed: u64) -> SynthCase {
    let mut rng = Rng::new(seed);
    let bs = spec.block_size as u64;
    let nb = spec.blocks;
    let mut base = vec![0u8; (nb * bs) as usize];
    rng.fill(&mut base);
    let mut used: HashSet<u64> = HashSet::new();
    // (dst, source) of ordered ops, merge order for chains is fixed by construction.
    let mut ordered: Vec<(u64, Pending)> = Vec::new();
    let src_of = |rng: &mut Rng, from_block: u64| -> Pending {
        if rng.coin() {
            Pending::Copy(from_block)
        } else {
            let off = if spec.unaligned_xor && from_block + 1 < nb {
                rng.below(bs)
            } else {
                0
            };
            Pending::Xor(from_block * bs + off)
        }
    };
    for c in 0..spec.chains {
        let len = spec.chain_len.min(nb / 4);
        let start = rng.below(nb.saturating_sub(len + 2).max(1));
        if (start..start + len + 2).any(|b| used.contains(&b)) {
            continue;
        }
        if c % 2 == 0 {
            // Shift up: dst b+1 <- b, merge descending.
            for b in (start..start + len).rev() {
                used.insert(b + 1);
                let s = src_of(&mut rng, b);
                ordered.push((b + 1, s));
            }
            used.insert(start);
        } else {
            // Shift down: dst b <- b+1, merge ascending.
            for b in start..start + len {
                used.insert(b);
                let s = src_of(&mut rng, b + 1);
                ordered.push((b, s));
            }
            used.insert(start + len);
        }
    }
    // Random ordered ops on free destinations with random sources; order them topologically
    // (an op must merge before any op whose destination is one of its sources).
    let mut rand_ops: Vec<(u64, Pending)> = Vec::new();
    for _ in 0..spec.random_ordered {
        let d = rng.below(nb);
        if used.contains(&d) {
            continue;
        }
        used.insert(d);
        let mut s = rng.below(nb);
        if spec.scratch_size == 0 {
            // Without scratch an op that reads its own destination cannot be merged crash-safely
            // (the merge refuses it); don't generate one.
            while s == d || s + 1 == d {
                s = rng.below(nb);
            }
        }
        let p = src_of(&mut rng, s);
        rand_ops.push((d, p));
    }
    let srcs = |p: &Pending| -> (u64, u64) {
        match *p {
            Pending::Copy(s) => (s, 1),
            Pending::Xor(b) => (b / bs, 1 + (b % bs != 0) as u64),
        }
    };
    // Chains first (their sources lie in their own ranges), then the random ops in generation
    // order: an op may follow only if none of its sources is the destination of an op placed
    // before it (rule 2); its destination may well be a source of a later op, which is what makes
    // the dependencies overlap. An op that cannot be placed becomes a REPLACE with full data,
    // as update_engine does to break cycles.
    let mut written: HashSet<u64> = ordered.iter().map(|o| o.0).collect();
    let mut replaced: Vec<u64> = Vec::new();
    for (d, p) in rand_ops {
        let (s, c) = srcs(&p);
        if (s..s + c).any(|b| written.contains(&b)) {
            replaced.push(d);
        } else {
            written.insert(d);
            ordered.push((d, p));
        }
    }
    let mut cow = vec![0u8; (HEADER_SIZE + spec.scratch_size) as usize];
    let mut target = base.clone();
    let mut ops = Vec::new();
    let block = |img: &Vec<u8>, b: u64| img[(b * bs) as usize..((b + 1) * bs) as usize].to_vec();
    let mut rank = 0u32;
    for (d, p) in &ordered {
        let kind = match *p {
            Pending::Copy(s) => {
                target[(d * bs) as usize..((d + 1) * bs) as usize]
                    .copy_from_slice(&block(&base, s));
                OpKind::Copy { src: s }
            }
            Pending::Xor(sb) => {
                let mut pl = vec![0u8; bs as usize];
                rng.fill(&mut pl);
                let src = &base[sb as usize..(sb + bs) as usize];
                let out: Vec<u8> = src.iter().zip(&pl).map(|(a, b)| a ^ b).collect();
                target[(d * bs) as usize..((d + 1) * bs) as usize].copy_from_slice(&out);
                let payload = Payload {
                    offset: cow.len() as u64,
                    stored_len: bs as u32,
                    codec: Codec::None,
                    unit_len: bs as u32,
                };
                cow.extend_from_slice(&pl);
                OpKind::Xor {
                    src_byte: sb,
                    payload,
                }
            }
        };
        ops.push(MapOp {
            new_block: *d,
            file_rank: rank,
            kind,
        });
        rank += 1;
    }
    // Non-ordered ops, ascending by block as in AOSP's merge order.
    let mut rest: Vec<(u64, bool)> = replaced.into_iter().map(|d| (d, true)).collect();
    for i in 0..spec.replaces + spec.zeros {
        let d = rng.below(nb);
        if used.contains(&d) {
            continue;
        }
        used.insert(d);
        rest.push((d, i < spec.replaces));
    }
    rest.sort_unstable();
    for (d, is_replace) in rest {
        let kind = if is_replace {
            let mut data = vec![0u8; bs as usize];
            rng.fill(&mut data);
            target[(d * bs) as usize..((d + 1) * bs) as usize].copy_from_slice(&data);
            let payload = Payload {
                offset: cow.len() as u64,
                stored_len: bs as u32,
                codec: Codec::None,
                unit_len: bs as u32,
            };
            cow.extend_from_slice(&data);
            OpKind::Replace { payload, blocks: 1 }
        } else {
            target[(d * bs) as usize..((d + 1) * bs) as usize].fill(0);
            OpKind::Zero
        };
        ops.push(MapOp {
            new_block: d,
            file_rank: rank,
            kind,
        });
        rank += 1;
    }
    let layout = CowLayout {
        block_size: spec.block_size,
        header_size: HEADER_SIZE,
        scratch_size: spec.scratch_size,
        data_end: cow.len() as u64,
    };
    SynthCase {
        base,
        cow,
        target,
        ops,
        layout,
    }
}

/// Apply the ops op-by-op in merge order to a copy of the base (the reference in-place merge).
pub fn merge_reference(case: &SynthCase) -> Vec<u8> {
    let bs = case.layout.block_size as usize;
    let mut img = case.base.clone();
    for op in &case.ops {
        let d = op.new_block as usize * bs;
        let out: Vec<u8> = match op.kind {
            OpKind::Copy { src } => img[src as usize * bs..(src as usize + 1) * bs].to_vec(),
            OpKind::Xor { src_byte, payload } => {
                let s = &img[src_byte as usize..src_byte as usize + bs];
                let p = &case.cow[payload.offset as usize..payload.offset as usize + bs];
                s.iter().zip(p).map(|(a, b)| a ^ b).collect()
            }
            OpKind::Replace { payload, .. } => {
                case.cow[payload.offset as usize..payload.offset as usize + bs].to_vec()
            }
            OpKind::Zero => vec![0; bs],
        };
        img[d..d + bs].copy_from_slice(&out);
    }
    img
}

impl SynthCase {
    /// Write the case as `dir`/base.img and `dir`/snapshot.cow (the COW made by [`write_cow`]
    /// with `opts`), for tests that open, serve or merge real files. Returns the two paths.
    pub fn write_files(
        &self,
        dir: &std::path::Path,
        opts: snapblk_cow::WriterOptions,
    ) -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
        let (base, cow) = (dir.join("base.img"), dir.join("snapshot.cow"));
        std::fs::write(&base, &self.base).map_err(|e| format!("{}: {e}", base.display()))?;
        std::fs::write(&cow, write_cow(self, opts)?)
            .map_err(|e| format!("{}: {e}", cow.display()))?;
        Ok((base, cow))
    }
}

/// Write `case` as a real Android COW file with snapblk-cow's writer: sequence data listing the
/// ordered ops in merge order, then the ops. `opts.op_count_max` is raised to fit.
pub fn write_cow(
    case: &SynthCase,
    mut opts: snapblk_cow::WriterOptions,
) -> Result<Vec<u8>, String> {
    let bs = case.layout.block_size as usize;
    opts.block_size = case.layout.block_size;
    opts.op_count_max = opts.op_count_max.max(case.ops.len() as u64 + 1);
    let sink = snapblk_cow::MemFile::new(Vec::new());
    let mut w = snapblk_cow::CowWriter::new(&sink, opts).map_err(|e| e.to_string())?;
    let seq: Vec<u32> = case
        .ops
        .iter()
        .filter(|o| o.is_ordered())
        .map(|o| o.new_block as u32)
        .collect();
    if !seq.is_empty() {
        w.add_sequence_data(&seq).map_err(|e| e.to_string())?;
    }
    let payload = |p: &Payload| &case.cow[p.offset as usize..p.offset as usize + bs];
    for op in &case.ops {
        let r = match op.kind {
            OpKind::Copy { src } => w.add_copy(op.new_block, src, 1),
            OpKind::Xor {
                src_byte,
                payload: p,
            } => w.add_xor_blocks(
                op.new_block,
                payload(&p),
                src_byte / bs as u64,
                (src_byte % bs as u64) as u16,
            ),
            OpKind::Replace { payload: p, .. } => w.add_raw_blocks(op.new_block, payload(&p)),
            OpKind::Zero => w.add_zero_blocks(op.new_block, 1),
        };
        r.map_err(|e| e.to_string())?;
    }
    w.finalize().map_err(|e| e.to_string())?;
    Ok(sink.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_orders_are_valid_for_op_by_op_merge() {
        for seed in 0..50 {
            let c = generate(&SynthSpec::default(), seed);
            let ordered = c.ops.iter().filter(|o| o.is_ordered()).count();
            assert!(ordered >= 40, "seed {seed}: only {ordered} ordered ops");
            // The in-place op-by-op merge in this order reproduces the read view (rule 2 holds).
            assert!(merge_reference(&c) == c.target, "seed {seed}");
        }
    }
}
