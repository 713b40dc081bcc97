//! The block map (new block → op) and read planning.
//!
//! Ops are held in *merge order* (format §9.2): the index of an op in [`SnapshotMap::ops`] is the
//! value `num_merge_ops` is compared with. The block index is a dense vector (one `u64` entry per
//! block: a lookup is one load; a COPY op's source is stored in the entry itself, so a random read
//! of a COPY block touches one 8-byte entry and not the 48-byte op as well) unless the device is
//! much larger than the blocks the COW touches, then a sorted vector of block runs (binary
//! search); duplicates are resolved first-wins in COW file order, as snapuserd does.

use crate::error::{Result, SnapError};

/// How a stored payload is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Stored raw.
    None,
    /// zlib stream.
    Gz,
    /// Raw brotli stream.
    Brotli,
    /// LZ4 block.
    Lz4,
    /// zstd frame.
    Zstd,
}

/// A payload stored in the COW file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Payload {
    /// Absolute file offset.
    pub offset: u64,
    /// Bytes stored.
    pub stored_len: u32,
    /// Encoding ([`Codec::None`] also when the writer stored an incompressible unit raw).
    pub codec: Codec,
    /// Bytes the payload decodes to (one unit).
    pub unit_len: u32,
}

/// What produces a new block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Base block `src`.
    Copy {
        /// The base block (block-size units) copied to the op's new block (COPY op's source).
        src: u64,
    },
    /// `block_size` base bytes at byte offset `src_byte`, XOR-ed with the decoded payload.
    Xor {
        /// Byte offset in the base of the source data; need not be block-aligned, so it may
        /// span two base blocks.
        src_byte: u64,
        /// The stored XOR delta (one block once decoded).
        payload: Payload,
    },
    /// The decoded payload; covers `blocks` blocks (v3 multi-block units).
    Replace {
        /// The stored new data.
        payload: Payload,
        /// New blocks the decoded unit covers, starting at the op's `new_block` (1 for v2 COWs;
        /// 0 is read as 1).
        blocks: u32,
    },
    /// Zeros.
    Zero,
}

/// One data op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapOp {
    /// First new block written.
    pub new_block: u64,
    /// Position in COW file order (duplicates: lowest wins).
    pub file_rank: u32,
    /// How the new data is produced (COPY, XOR, REPLACE or ZERO, as in the COW op's type).
    pub kind: OpKind,
}

impl MapOp {
    /// COPY and XOR depend on base content and must be merged in order.
    pub fn is_ordered(&self) -> bool {
        matches!(self.kind, OpKind::Copy { .. } | OpKind::Xor { .. })
    }
    /// New blocks covered.
    pub fn blocks(&self) -> u64 {
        match self.kind {
            OpKind::Replace { blocks, .. } => blocks.max(1) as u64,
            _ => 1,
        }
    }
    /// Base blocks read (ordered ops only): (first, count).
    pub fn source_blocks(&self, block_size: u64) -> Option<(u64, u64)> {
        match self.kind {
            OpKind::Copy { src } => Some((src, 1)),
            OpKind::Xor { src_byte, .. } => Some((
                src_byte / block_size,
                1 + (src_byte % block_size != 0) as u64,
            )),
            _ => None,
        }
    }
}

/// One piece of a read plan. Executing the segments in order fills the request buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// Read `len` bytes of the base at `base_offset` (unchanged blocks, COPY sources, merged
    /// blocks). An export with zero copy can have the kernel do this read into the request pages.
    Base {
        /// Byte offset in the base device.
        base_offset: u64,
        /// Bytes to read.
        len: u64,
    },
    /// Zero fill.
    Zero {
        /// Bytes of zeros.
        len: u64,
    },
    /// Raw bytes stored in the COW (uncompressed payloads, overlay writes).
    Cow {
        /// Byte offset in the COW device.
        cow_offset: u64,
        /// Bytes to read.
        len: u64,
    },
    /// `len` bytes from `skip` of a compressed unit (decode, cached).
    Decoded {
        /// The compressed payload; its decoded unit is looked up in the unit cache by offset.
        payload: Payload,
        /// Bytes of the decoded unit to skip before the first byte served.
        skip: u32,
        /// Bytes served.
        len: u32,
    },
    /// `len` bytes from `skip` of (the block-size base run at `base_offset`) XOR (payload).
    Xor {
        /// Byte offset in the base of the block-size run the payload is XOR-ed with (the XOR
        /// op's `src_byte`).
        base_offset: u64,
        /// The XOR delta.
        payload: Payload,
        /// Bytes of the XOR-ed block to skip before the first byte served.
        skip: u32,
        /// Bytes served.
        len: u32,
    },
    /// `len` bytes from `skip` of block `slot` of the merge window being written (held in memory).
    Staged {
        /// Block index in the window's data: op `start + slot` of the merge order.
        slot: u32,
        /// Bytes of that block to skip before the first byte served.
        skip: u32,
        /// Bytes served.
        len: u32,
    },
}

impl Segment {
    /// Bytes this segment produces.
    pub fn len(&self) -> u64 {
        match *self {
            Segment::Base { len, .. } | Segment::Zero { len } | Segment::Cow { len, .. } => len,
            Segment::Decoded { len, .. }
            | Segment::Xor { len, .. }
            | Segment::Staged { len, .. } => len as u64,
        }
    }
    /// Whether the segment is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Dense-index entry of a block no op writes.
const NO_OP: u64 = u64::MAX;
/// Dense-index entries with this bit set are a COPY op inline: op index in bits 32..63, source
/// block in bits 0..32. Other entries are an op index (< 2^32 - 1).
const COPY_BIT: u64 = 1 << 63;
/// Blocks of dense index allowed beyond 4 per covered block (1 Mi blocks = 8 MiB of index).
const DENSE_SLACK_BLOCKS: u64 = 1 << 20;

/// The dense-index entry of op `i`.
fn dense_entry(i: u32, op: &MapOp) -> u64 {
    match op.kind {
        // i < 2^31 - 1 keeps the entry distinct from NO_OP.
        OpKind::Copy { src } if src <= u32::MAX as u64 && i < (1 << 31) - 1 => {
            COPY_BIT | (i as u64) << 32 | src
        }
        _ => i as u64,
    }
}

/// An op index and, for inline COPY entries, the source block.
#[inline]
fn decode_entry(e: u64) -> (usize, Option<u64>) {
    if e & COPY_BIT != 0 {
        (((e >> 32) & 0x7fff_ffff) as usize, Some(e & 0xffff_ffff))
    } else {
        (e as usize, None)
    }
}

/// What a read of one block can be served as without the merge view's lock
/// ([`SnapshotMap::quick`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quick {
    /// No op writes the block, so neither does the merge: the base block itself, at any time.
    Unchanged,
    /// COPY op `op` writes the block from base block `src`: which of the two holds the new
    /// contents depends on the merge view.
    Copy { op: usize, src: u64 },
    /// Anything else (other ops, or a map without the dense index): the locked path.
    Other,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    start: u64,
    count: u64,
    op: u32,
}

/// Merge progress as the read path needs it: what a plan of [`Snapshot::with_plan`] was made
/// against (opaque outside the crate).
///
/// [`Snapshot::with_plan`]: crate::Snapshot::with_plan
#[derive(Debug, Default, Clone)]
pub struct MergeView {
    /// Ops `[0, merged)` of the merge order are durably in the base.
    pub(crate) merged: usize,
    /// The window being merged: ops `[start, end)` with their results in memory.
    pub(crate) staged: Option<StagedWindow>,
}

/// A merge window's results (one block per op, op `start + i` in slot `i`).
#[derive(Debug, Default, Clone)]
pub(crate) struct StagedWindow {
    /// Merge index of the window's first op.
    pub start: usize,
    /// Merge index one past the window's last op.
    pub end: usize,
    /// The new blocks the window's ops produce, `end - start` blocks of the block size,
    /// computed before any of them is written to the base.
    pub data: std::sync::Arc<Vec<u8>>,
}

/// The block map of a snapshot.
#[derive(Debug)]
pub struct SnapshotMap {
    block_size: u64,
    /// log2(block_size): block arithmetic on the read path uses shifts and masks, not divisions.
    block_shift: u32,
    capacity: u64,
    ops: Vec<MapOp>,
    runs: Vec<Run>,
    /// Entry per block ([`NO_OP`] = unchanged, see [`COPY_BIT`]), when affordable.
    dense: Option<Vec<u64>>,
    ordered_len: usize,
    order_error: Option<String>,
}

impl SnapshotMap {
    /// Build from ops in merge order. `capacity` is the device size in bytes (multiple of the block
    /// size); ops naming blocks outside it are rejected.
    pub fn new(block_size: u32, capacity: u64, ops: Vec<MapOp>) -> Result<Self> {
        let bs = block_size as u64;
        if bs == 0 || !bs.is_power_of_two() || bs > 1 << 20 {
            return Err(SnapError::Format(format!(
                "unsupported block size {block_size}"
            )));
        }
        if ops.len() >= u32::MAX as usize {
            return Err(SnapError::Format("too many ops".into()));
        }
        let nblocks = capacity / bs;
        // (block, rank, op index); sorted so the first-in-file op for a block comes first.
        let mut cover: Vec<(u64, u32, u32)> = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let end = op
                .new_block
                .checked_add(op.blocks())
                .filter(|&e| e <= nblocks);
            if end.is_none() {
                return Err(SnapError::Format(format!(
                    "op {i} writes block {} (+{}) beyond the device ({nblocks} blocks)",
                    op.new_block,
                    op.blocks()
                )));
            }
            if let Some((s, n)) = op.source_blocks(bs)
                && s.checked_add(n).is_none_or(|e| e > nblocks)
            {
                return Err(SnapError::Format(format!(
                    "op {i} reads base block {s} beyond the device"
                )));
            }
            // Raw payloads are served straight from the COW by offset: one shorter than its
            // unit would hand out whatever bytes follow it.
            let raw = match op.kind {
                OpKind::Replace { payload, .. } | OpKind::Xor { payload, .. } => {
                    Some(payload).filter(|p| p.codec == Codec::None)
                }
                _ => None,
            };
            if let Some(p) = raw
                && p.stored_len != p.unit_len
            {
                return Err(SnapError::Format(format!(
                    "op {i}: raw payload of {} bytes for a {}-byte unit",
                    p.stored_len, p.unit_len
                )));
            }
            for b in op.new_block..op.new_block + op.blocks() {
                cover.push((b, op.file_rank, i as u32));
            }
        }
        cover.sort_unstable();
        cover.dedup_by_key(|c| c.0);
        // 8 bytes per device block: worth it unless the COW touches a tiny part of a huge device.
        let dense =
            (nblocks <= (cover.len() as u64).saturating_mul(4) + DENSE_SLACK_BLOCKS).then(|| {
                let mut d = vec![NO_OP; nblocks as usize];
                for &(b, _, i) in &cover {
                    d[b as usize] = dense_entry(i, &ops[i as usize]);
                }
                d
            });
        let mut runs: Vec<Run> = Vec::new();
        for (b, _, i) in cover {
            if let Some(r) = runs.last_mut()
                && r.op == i
                && r.start + r.count == b
            {
                r.count += 1;
                continue;
            }
            runs.push(Run {
                start: b,
                count: 1,
                op: i,
            });
        }
        let ordered_len = ops.iter().take_while(|o| o.is_ordered()).count();
        let order_error = ops[ordered_len..].iter().position(|o| o.is_ordered()).map(|p| {
            format!(
                "merge order has an ordered op (COPY/XOR, new block {}) after a non-ordered op at position {}; \
                 without a sequence all COPY/XOR ops must come first (format §9.2 rule 1)",
                ops[ordered_len + p].new_block,
                ordered_len
            )
        });
        Ok(SnapshotMap {
            block_size: bs,
            block_shift: bs.trailing_zeros(),
            capacity,
            ops,
            runs,
            dense,
            ordered_len,
            order_error,
        })
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }
    /// log2 of the block size.
    #[inline]
    pub(crate) fn block_shift(&self) -> u32 {
        self.block_shift
    }
    /// Device size in bytes.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Ops in merge order.
    pub fn ops(&self) -> &[MapOp] {
        &self.ops
    }
    /// Length of the ordered (COPY/XOR) prefix of the merge order.
    pub fn ordered_len(&self) -> usize {
        self.ordered_len
    }
    /// Why the merge order is unusable, if it is.
    pub(crate) fn order_error(&self) -> Option<&str> {
        self.order_error.as_deref()
    }

    /// The op that defines `block` (after duplicate resolution), by merge index.
    #[inline]
    pub fn lookup(&self, block: u64) -> Option<usize> {
        if let Some(d) = &self.dense {
            return match d.get(block as usize) {
                Some(&e) if e != NO_OP => Some(decode_entry(e).0),
                _ => None,
            };
        }
        let i = self.runs.partition_point(|r| r.start <= block);
        let r = self.runs.get(i.checked_sub(1)?)?;
        (block < r.start + r.count).then_some(r.op as usize)
    }

    /// Whether op `i` is the one the map uses for its first block (false for shadowed duplicates).
    pub(crate) fn is_winner(&self, i: usize) -> bool {
        self.ops
            .get(i)
            .is_some_and(|op| self.lookup(op.new_block) == Some(i))
    }

    /// Plan a read of `len` bytes at `offset` without merge progress (nothing merged yet).
    pub fn plan(&self, offset: u64, len: u64) -> Result<Vec<Segment>> {
        let mut v = Vec::new();
        self.plan_into(&MergeView::default(), &|_| None, offset, len, &mut v)?;
        Ok(v)
    }

    /// Plan a read given merge progress and an overlay lookup (block → COW offset of its data).
    pub(crate) fn plan_into(
        &self,
        view: &MergeView,
        overlay: &dyn Fn(u64) -> Option<u64>,
        offset: u64,
        len: u64,
        out: &mut Vec<Segment>,
    ) -> Result<()> {
        let end = offset.checked_add(len).filter(|&e| e <= self.capacity);
        let Some(end) = end else {
            return Err(SnapError::Range {
                offset,
                len,
                capacity: self.capacity,
            });
        };
        let bs = self.block_size;
        let mut pos = offset;
        while pos < end {
            let block = pos >> self.block_shift;
            let skip = pos & (bs - 1);
            let n = (bs - skip).min(end - pos);
            let seg = self.block_segment(view, overlay, block, skip, n);
            push(out, seg);
            pos += n;
        }
        Ok(())
    }

    /// One load of the dense index: whether `block` (inside the device) is unchanged or an inline
    /// COPY, the two cases a read serves without the merge view's lock.
    #[inline]
    pub(crate) fn quick(&self, block: u64) -> Quick {
        let Some(d) = &self.dense else {
            return Quick::Other;
        };
        match d.get(block as usize) {
            Some(&NO_OP) => Quick::Unchanged,
            Some(&e) if e & COPY_BIT != 0 => match decode_entry(e) {
                (op, Some(src)) => Quick::Copy { op, src },
                _ => Quick::Other,
            },
            _ => Quick::Other,
        }
    }

    /// The segment for `n` bytes at `skip` within `block` (the caller keeps them in the block).
    #[inline]
    pub(crate) fn block_segment(
        &self,
        view: &MergeView,
        overlay: &dyn Fn(u64) -> Option<u64>,
        block: u64,
        skip: u64,
        n: u64,
    ) -> Segment {
        let bs = self.block_size;
        if let Some(off) = overlay(block) {
            return Segment::Cow {
                cow_offset: off + skip,
                len: n,
            };
        }
        let own = Segment::Base {
            base_offset: (block << self.block_shift) + skip,
            len: n,
        };
        let i = match &self.dense {
            Some(d) => match d.get(block as usize) {
                Some(&e) if e != NO_OP => match decode_entry(e) {
                    // COPY from the entry alone (the op itself is not touched).
                    (i, Some(src)) => return self.copy_segment(view, i, block, src, skip, n),
                    (i, None) => i,
                },
                _ => return own,
            },
            None => match self.lookup(block) {
                Some(i) => i,
                None => return own,
            },
        };
        let op = &self.ops[i];
        match op.kind {
            OpKind::Zero => Segment::Zero { len: n },
            OpKind::Replace { payload, .. } => {
                let within = (block - op.new_block) * bs + skip;
                if payload.codec == Codec::None {
                    Segment::Cow {
                        cow_offset: payload.offset + within,
                        len: n,
                    }
                } else {
                    Segment::Decoded {
                        payload,
                        skip: within as u32,
                        len: n as u32,
                    }
                }
            }
            OpKind::Copy { .. } | OpKind::Xor { .. } if i < view.merged => own,
            OpKind::Copy { src } => self.copy_segment(view, i, block, src, skip, n),
            OpKind::Xor { src_byte, payload } => match &view.staged {
                Some(w) if (w.start..w.end).contains(&i) => Segment::Staged {
                    slot: (i - w.start) as u32,
                    skip: skip as u32,
                    len: n as u32,
                },
                _ => Segment::Xor {
                    base_offset: src_byte,
                    payload,
                    skip: skip as u32,
                    len: n as u32,
                },
            },
        }
    }
}

impl SnapshotMap {
    /// The segment for `n` bytes at `skip` of `block`, which COPY op `i` writes from base block
    /// `src`: the block itself once merged, the staged copy while its window is being written,
    /// else the source.
    #[inline]
    fn copy_segment(
        &self,
        view: &MergeView,
        i: usize,
        block: u64,
        src: u64,
        skip: u64,
        n: u64,
    ) -> Segment {
        let from = if i < view.merged {
            block
        } else {
            match &view.staged {
                Some(w) if (w.start..w.end).contains(&i) => {
                    return Segment::Staged {
                        slot: (i - w.start) as u32,
                        skip: skip as u32,
                        len: n as u32,
                    };
                }
                _ => src,
            }
        };
        Segment::Base {
            base_offset: (from << self.block_shift) + skip,
            len: n,
        }
    }
}

/// Append a segment, coalescing with the previous one when contiguous.
fn push(out: &mut Vec<Segment>, seg: Segment) {
    if let Some(last) = out.last_mut() {
        match (last, seg) {
            (
                Segment::Base { base_offset, len },
                Segment::Base {
                    base_offset: o,
                    len: n,
                },
            ) if *base_offset + *len == o => {
                *len += n;
                return;
            }
            (
                Segment::Cow { cow_offset, len },
                Segment::Cow {
                    cow_offset: o,
                    len: n,
                },
            ) if *cow_offset + *len == o => {
                *len += n;
                return;
            }
            (Segment::Zero { len }, Segment::Zero { len: n }) => {
                *len += n;
                return;
            }
            _ => {}
        }
    }
    out.push(seg);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(offset: u64) -> Payload {
        Payload {
            offset,
            stored_len: 4096,
            codec: Codec::None,
            unit_len: 4096,
        }
    }

    #[test]
    fn raw_payload_must_fill_its_unit() {
        let replace = |stored_len, unit_len, blocks| MapOp {
            new_block: 2,
            file_rank: 0,
            kind: OpKind::Replace {
                payload: Payload {
                    offset: 100,
                    stored_len,
                    codec: Codec::None,
                    unit_len,
                },
                blocks,
            },
        };
        let new = |op| SnapshotMap::new(4096, 16 * 4096, vec![op]);
        assert!(new(replace(4096, 4096, 1)).is_ok());
        assert!(new(replace(8192, 8192, 2)).is_ok());
        assert!(matches!(
            new(replace(100, 4096, 1)),
            Err(SnapError::Format(_))
        ));
        let mut xor = replace(100, 4096, 1);
        xor.kind = OpKind::Xor {
            src_byte: 0,
            payload: raw(100),
        };
        assert!(new(xor).is_ok());
        xor.kind = OpKind::Xor {
            src_byte: 0,
            payload: Payload {
                stored_len: 100,
                ..raw(100)
            },
        };
        assert!(matches!(new(xor), Err(SnapError::Format(_))));
    }

    #[test]
    fn lookup_first_wins_and_multiblock() {
        let ops = vec![
            MapOp {
                new_block: 3,
                file_rank: 2,
                kind: OpKind::Copy { src: 9 },
            },
            MapOp {
                new_block: 3,
                file_rank: 1,
                kind: OpKind::Zero,
            },
            MapOp {
                new_block: 4,
                file_rank: 0,
                kind: OpKind::Replace {
                    payload: Payload {
                        offset: 100,
                        stored_len: 50,
                        codec: Codec::Lz4,
                        unit_len: 16384,
                    },
                    blocks: 4,
                },
            },
        ];
        let m = SnapshotMap::new(4096, 16 * 4096, ops).unwrap();
        assert_eq!(m.lookup(3), Some(1));
        assert!(!m.is_winner(0) && m.is_winner(1));
        assert_eq!(m.lookup(7), Some(2));
        assert_eq!(m.lookup(8), None);
        let p = m.plan(6 * 4096 + 100, 5000).unwrap();
        assert_eq!(
            p,
            vec![
                Segment::Decoded {
                    payload: m.ops()[2].kind_payload(),
                    skip: 2 * 4096 + 100,
                    len: 3996
                },
                Segment::Decoded {
                    payload: m.ops()[2].kind_payload(),
                    skip: 3 * 4096,
                    len: 1004
                },
            ]
        );
    }

    impl MapOp {
        fn kind_payload(&self) -> Payload {
            match self.kind {
                OpKind::Replace { payload, .. } | OpKind::Xor { payload, .. } => payload,
                _ => panic!("no payload"),
            }
        }
    }

    #[test]
    fn plans_coalesce_and_follow_merge_progress() {
        let ops = vec![
            MapOp {
                new_block: 1,
                file_rank: 0,
                kind: OpKind::Copy { src: 5 },
            },
            MapOp {
                new_block: 2,
                file_rank: 1,
                kind: OpKind::Copy { src: 6 },
            },
            MapOp {
                new_block: 3,
                file_rank: 2,
                kind: OpKind::Replace {
                    payload: raw(8192),
                    blocks: 1,
                },
            },
        ];
        let m = SnapshotMap::new(4096, 8 * 4096, ops).unwrap();
        assert_eq!(
            m.plan(0, 5 * 4096).unwrap(),
            vec![
                Segment::Base {
                    base_offset: 0,
                    len: 4096
                },
                Segment::Base {
                    base_offset: 5 * 4096,
                    len: 8192
                },
                Segment::Cow {
                    cow_offset: 8192,
                    len: 4096
                },
                Segment::Base {
                    base_offset: 4 * 4096,
                    len: 4096
                },
            ]
        );
        let view = MergeView {
            merged: 1,
            staged: Some(StagedWindow {
                start: 1,
                end: 2,
                data: std::sync::Arc::new(vec![0; 4096]),
            }),
        };
        let mut v = Vec::new();
        m.plan_into(
            &view,
            &|b| (b == 4).then_some(1 << 20),
            4096,
            4 * 4096 - 1,
            &mut v,
        )
        .unwrap();
        assert_eq!(
            v,
            vec![
                Segment::Base {
                    base_offset: 4096,
                    len: 4096
                },
                Segment::Staged {
                    slot: 0,
                    skip: 0,
                    len: 4096
                },
                Segment::Cow {
                    cow_offset: 8192,
                    len: 4096
                },
                Segment::Cow {
                    cow_offset: 1 << 20,
                    len: 4095
                },
            ]
        );
        assert!(m.plan(7 * 4096, 4097).is_err());
    }

    #[test]
    fn dense_and_run_indexes_agree() {
        let mut rng = snapblk_core::rng::Rng::new(7);
        let nb = 4096u64;
        let ops: Vec<MapOp> = (0..600u32)
            .map(|r| MapOp {
                new_block: rng.below(nb - 4),
                file_rank: rng.below(1000) as u32,
                kind: if r % 3 == 0 {
                    OpKind::Replace {
                        payload: raw(0),
                        blocks: 1 + rng.below(4) as u32,
                    }
                } else {
                    OpKind::Copy { src: rng.below(nb) }
                },
            })
            .collect();
        let m = SnapshotMap::new(4096, nb * 4096, ops.clone()).unwrap();
        assert!(m.dense.is_some(), "small device: dense index");
        let mut runs_only = SnapshotMap::new(4096, nb * 4096, ops).unwrap();
        runs_only.dense = None;
        for b in 0..nb + 2 {
            assert_eq!(m.lookup(b), runs_only.lookup(b), "block {b}");
        }
        // A huge device with a handful of ops keeps the run index only.
        let sparse = vec![MapOp {
            new_block: 5,
            file_rank: 0,
            kind: OpKind::Zero,
        }];
        let m = SnapshotMap::new(4096, (8u64 << 20) * 4096, sparse).unwrap();
        assert!(m.dense.is_none());
        assert_eq!(m.lookup(5), Some(0));
        assert_eq!(m.lookup(6), None);
    }

    #[test]
    fn rejects_out_of_range_and_flags_bad_order() {
        let bad = vec![MapOp {
            new_block: 8,
            file_rank: 0,
            kind: OpKind::Zero,
        }];
        assert!(SnapshotMap::new(4096, 8 * 4096, bad).is_err());
        let ops = vec![
            MapOp {
                new_block: 1,
                file_rank: 0,
                kind: OpKind::Zero,
            },
            MapOp {
                new_block: 2,
                file_rank: 1,
                kind: OpKind::Copy { src: 5 },
            },
        ];
        let m = SnapshotMap::new(4096, 8 * 4096, ops).unwrap();
        assert_eq!(m.ordered_len(), 0);
        assert!(m.order_error().is_some());
    }
}
