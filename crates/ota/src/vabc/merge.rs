//! A partition's `merge_operations` as the VABC writer uses them: the checked list, the
//! XOR map (new block → COW_XOR merge op), the COW_COPY destination blocks, and the merge
//! sequence written to the COW (notes §1.5, §2.2).

use crate::proto::{CowMergeOpType, CowMergeOperation, Extent};
use crate::vabc::error::VabcError;

/// One checked merge operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeOp {
    /// COW_COPY, COW_XOR or COW_REPLACE.
    pub kind: CowMergeOpType,
    /// First source block (old image).
    pub src_start: u64,
    /// Source blocks (COW_XOR with `src_offset > 0`: one more than `dst_blocks`).
    pub src_blocks: u64,
    /// First destination block (new image).
    pub dst_start: u64,
    /// Destination blocks.
    pub dst_blocks: u64,
    /// Byte offset into the source (COW_XOR only).
    pub src_offset: u32,
}

impl MergeOp {
    /// A COW_COPY whose source is its destination: nothing to write or merge.
    pub fn is_identity_copy(&self) -> bool {
        self.kind == CowMergeOpType::CowCopy
            && self.src_start == self.dst_start
            && self.src_blocks == self.dst_blocks
    }

    /// Whether the source and destination ranges share a block.
    pub fn overlaps(&self) -> bool {
        self.src_start < self.dst_start + self.dst_blocks
            && self.dst_start < self.src_start + self.src_blocks
    }

    /// The destination blocks in the order the merge sequence lists them: ascending when the
    /// ranges overlap and the destination does not lie after the source (a forward copy reads
    /// ahead of its writes), descending when they overlap the other way; a non-overlapping op
    /// ascends with userspace snapshots and descends without.
    pub fn sequence_blocks(&self, userspace_snapshots: bool) -> impl Iterator<Item = u64> {
        let ascending = if self.overlaps() {
            self.dst_start <= self.src_start
        } else {
            userspace_snapshots
        };
        let (s, n) = (self.dst_start, self.dst_blocks);
        let up = ascending.then(|| s..s + n);
        let down = (!ascending).then(|| (s..s + n).rev());
        up.into_iter().flatten().chain(down.into_iter().flatten())
    }
}

fn extent(e: Option<&Extent>) -> Option<(u64, u64)> {
    let e = e?;
    Some((e.start_block?, e.num_blocks?))
}

/// Check the merge operations against the partition sizes (in blocks): every extent present,
/// inside its image, `src_offset` below the block size and only on COW_XOR, source length
/// equal to the destination's (plus the extra block an offset XOR reads, except at the old
/// image's end).
pub(crate) fn check(
    ops: &[CowMergeOperation],
    block_size: u32,
    old_blocks: u64,
    new_blocks: u64,
) -> Result<Vec<MergeOp>, VabcError> {
    let mut out = Vec::with_capacity(ops.len());
    for (index, m) in ops.iter().enumerate() {
        let bad = |reason: String| VabcError::MergeOp { index, reason };
        let kind = m
            .r#type
            .map_or(Ok(CowMergeOpType::CowCopy), CowMergeOpType::try_from)
            .map_err(|_| bad(format!("unknown type {:?}", m.r#type)))?;
        let (src_start, src_blocks) =
            extent(m.src_extent.as_ref()).ok_or_else(|| bad("no source extent".into()))?;
        let (dst_start, dst_blocks) =
            extent(m.dst_extent.as_ref()).ok_or_else(|| bad("no destination extent".into()))?;
        let src_offset = m.src_offset.unwrap_or(0);
        if dst_blocks == 0 {
            return Err(bad("empty destination extent".into()));
        }
        if dst_start
            .checked_add(dst_blocks)
            .is_none_or(|e| e > new_blocks)
        {
            return Err(bad(format!(
                "destination {dst_start}+{dst_blocks} outside the new image ({new_blocks} blocks)"
            )));
        }
        if src_start
            .checked_add(src_blocks)
            .is_none_or(|e| e > old_blocks)
        {
            return Err(bad(format!(
                "source {src_start}+{src_blocks} outside the old image ({old_blocks} blocks)"
            )));
        }
        if src_offset >= block_size {
            return Err(bad(format!(
                "src_offset {src_offset} not below the block size"
            )));
        }
        let want = match kind {
            CowMergeOpType::CowXor if src_offset > 0 => dst_blocks + 1,
            CowMergeOpType::CowXor | CowMergeOpType::CowCopy => dst_blocks,
            CowMergeOpType::CowReplace => src_blocks,
        };
        if src_offset > 0 && kind != CowMergeOpType::CowXor {
            return Err(bad("src_offset on a non-XOR operation".into()));
        }
        // An offset XOR at the old image's end has no block after its source to add.
        let at_end = kind == CowMergeOpType::CowXor && src_offset > 0 && src_blocks == dst_blocks;
        if src_blocks != want && !at_end {
            return Err(bad(format!(
                "{src_blocks} source blocks for {dst_blocks} destination blocks (want {want})"
            )));
        }
        out.push(MergeOp {
            kind,
            src_start,
            src_blocks,
            dst_start,
            dst_blocks,
            src_offset,
        });
    }
    Ok(out)
}

/// Sorted, disjoint block ranges `(start, blocks)` with a containment test.
#[derive(Clone, Debug, Default)]
pub(crate) struct BlockRanges(Vec<(u64, u64)>);

impl BlockRanges {
    /// The union of `ranges`.
    pub(crate) fn new(mut ranges: Vec<(u64, u64)>) -> Self {
        ranges.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (s, n) in ranges {
            match out.last_mut() {
                Some((ls, ln)) if *ls + *ln >= s => *ln = (*ln).max(s + n - *ls),
                _ => out.push((s, n)),
            }
        }
        BlockRanges(out)
    }
    /// Whether `block` is in one of the ranges.
    pub(crate) fn contains(&self, block: u64) -> bool {
        let i = self.0.partition_point(|&(s, _)| s <= block);
        i > 0 && block < self.0[i - 1].0 + self.0[i - 1].1
    }
}

/// The COW_XOR merge ops by destination (disjoint, sorted).
#[derive(Clone, Debug, Default)]
pub(crate) struct XorMap(Vec<MergeOp>);

impl XorMap {
    /// The map of the COW_XOR ops of `ops`; overlapping destinations are an error.
    pub(crate) fn new(ops: &[MergeOp]) -> Result<Self, VabcError> {
        let mut v: Vec<(usize, MergeOp)> = ops
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, m)| m.kind == CowMergeOpType::CowXor)
            .collect();
        v.sort_unstable_by_key(|(_, m)| m.dst_start);
        for w in v.windows(2) {
            if w[0].1.dst_start + w[0].1.dst_blocks > w[1].1.dst_start {
                return Err(VabcError::MergeOp {
                    index: w[1].0,
                    reason: "XOR destination overlaps another XOR operation's".into(),
                });
            }
        }
        Ok(XorMap(v.into_iter().map(|(_, m)| m).collect()))
    }
    /// Whether the map is empty (XOR is then off for the partition).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The parts of blocks `[start, start + n)` the map covers, in ascending order:
    /// `(first block, blocks, merge op)`.
    pub(crate) fn intersect(&self, start: u64, n: u64) -> Vec<(u64, u64, MergeOp)> {
        let end = start + n;
        let first = self
            .0
            .partition_point(|m| m.dst_start + m.dst_blocks <= start);
        self.0[first..]
            .iter()
            .take_while(|m| m.dst_start < end)
            .map(|m| {
                let s = m.dst_start.max(start);
                let e = (m.dst_start + m.dst_blocks).min(end);
                (s, e - s, *m)
            })
            .collect()
    }
}

/// The merge sequence (notes §2.2): the destination blocks of every merge op in payload order,
/// identity copies left out, each op's blocks in [`MergeOp::sequence_blocks`] order.
pub(crate) fn sequence(ops: &[MergeOp], userspace_snapshots: bool) -> Result<Vec<u32>, VabcError> {
    let mut out = Vec::new();
    for (index, m) in ops.iter().enumerate() {
        if m.is_identity_copy() || m.kind == CowMergeOpType::CowReplace {
            continue;
        }
        for b in m.sequence_blocks(userspace_snapshots) {
            out.push(u32::try_from(b).map_err(|_| VabcError::MergeOp {
                index,
                reason: format!("destination block {b} does not fit the sequence's 32 bits"),
            })?);
        }
    }
    Ok(out)
}
