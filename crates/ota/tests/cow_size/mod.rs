//! The size a COW must have, derived from a payload's manifest and the COW format alone
//! (../shared/spec/android-cow-format.md §3, §4, §5, §7; notes §2.2, §2.3), never from the
//! writer: shared by `vabc_estimate.rs` and `vabc.rs`.

#![allow(dead_code)]

use snapblk_ota::{CowMergeOpType, DeviceProfile, Extent, OpType, PartitionUpdate};

pub const B: u64 = 4096;

// The format's sizes (spec §3, §4.1, §4.2, §5, §7).
pub const V2_HEADER: u64 = 38;
pub const V3_HEADER: u64 = 78;
pub const SCRATCH: u64 = 2 * 1024 * 1024;
pub const V2_OP: u64 = 20;
pub const V3_OP: u64 = 16;
pub const V2_FOOTER: u64 = 84;
pub const V3_RESUME_SLOTS: u64 = 4;
pub const V3_RESUME_SLOT: u64 = 16;
pub const V3_MIN_OP_SLOTS: u64 = 25;
/// AOSP's default `cluster_ops`.
pub const CLUSTER_OPS: u64 = 1024;
/// Entries per v2 SEQUENCE record (two blocks of u32).
pub const SEQ_PER_RECORD: u64 = 2 * B / 4;

pub fn ext(e: &Extent) -> (u64, u64) {
    (e.start_block.unwrap(), e.num_blocks.unwrap())
}

pub fn blocks_of(es: &[Extent]) -> Vec<u64> {
    es.iter()
        .flat_map(|e| {
            let (s, n) = ext(e);
            s..s + n
        })
        .collect()
}

/// What the payload says the COW holds on a device with `profile`, counted from the manifest.
/// With XOR (and merge sequences): the sequence first, COPY ops at their SOURCE_COPY. Without:
/// no sequence, every COW_COPY's blocks as COPY ops before label 0, diff ops all REPLACE.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub copy: u64,
    pub xor: u64,
    pub replace: u64,
    pub zero: u64,
    pub verity: u64,
    pub sequence: u64,
    pub labels: u64,
    /// v2's op stream in file order: per record, whether it has a payload (`None`), or the
    /// payload bytes of a SEQUENCE record.
    pub stream: Vec<Rec>,
}

/// A merge operation: (XOR, source (start, blocks), destination (start, blocks)).
pub type MergeRange = (bool, (u64, u64), (u64, u64));

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rec {
    /// COPY, ZERO, LABEL.
    Bare,
    /// REPLACE or XOR: one block.
    Block,
    /// SEQUENCE with this many payload bytes.
    Seq(u64),
}

impl Counts {
    pub fn from_payload(p: &PartitionUpdate, profile: DeviceProfile) -> Counts {
        let mut c = Counts::default();
        let merge: Vec<MergeRange> = p
            .merge_operations
            .iter()
            .map(|m| {
                (
                    m.r#type == Some(CowMergeOpType::CowXor as i32),
                    ext(m.src_extent.as_ref().unwrap()),
                    ext(m.dst_extent.as_ref().unwrap()),
                )
            })
            .collect();
        let identity = |&(x, s, d): &MergeRange| !x && s == d;
        let mut copy_dst = std::collections::HashSet::new();
        let mut xor_dst = std::collections::HashSet::new();
        for m in &merge {
            let set = if m.0 { &mut xor_dst } else { &mut copy_dst };
            set.extend(m.2.0..m.2.0 + m.2.1);
        }
        // Init: the sequence (SEQUENCE records in v2) or the COPY ops, label 0.
        if profile.xor {
            c.sequence = merge.iter().filter(|m| !identity(m)).map(|m| m.2.1).sum();
        } else {
            for m in merge.iter().filter(|m| !m.0 && !identity(m)) {
                c.copy += m.2.1;
                c.stream.extend((0..m.2.1).map(|_| Rec::Bare));
            }
            xor_dst.clear();
        }
        let mut left = c.sequence;
        while left > 0 {
            let k = left.min(SEQ_PER_RECORD);
            c.stream.push(Rec::Seq(4 * k));
            left -= k;
        }
        let label = |c: &mut Counts| {
            c.labels += 1;
            c.stream.push(Rec::Bare);
        };
        label(&mut c);
        let xor_on = !xor_dst.is_empty();
        for op in &p.operations {
            let dst = blocks_of(&op.dst_extents);
            match op.op_type().unwrap() {
                OpType::Zero | OpType::Discard => {
                    c.zero += dst.len() as u64;
                    c.stream.extend(dst.iter().map(|_| Rec::Bare));
                }
                OpType::SourceCopy => {
                    for (s, d) in blocks_of(&op.src_extents).into_iter().zip(dst) {
                        if s == d {
                            continue;
                        } else if copy_dst.contains(&d) {
                            if profile.xor {
                                c.copy += 1;
                                c.stream.push(Rec::Bare);
                            }
                        } else {
                            c.replace += 1;
                            c.stream.push(Rec::Block);
                        }
                    }
                }
                OpType::Replace | OpType::ReplaceBz | OpType::ReplaceXz | OpType::ReplaceZstd => {
                    c.replace += dst.len() as u64;
                    c.stream.extend(dst.iter().map(|_| Rec::Block));
                }
                _ => {
                    for d in dst {
                        if xor_on && xor_dst.contains(&d) {
                            c.xor += 1;
                        } else {
                            c.replace += 1;
                        }
                        c.stream.push(Rec::Block);
                    }
                }
            }
            label(&mut c);
        }
        label(&mut c); // end of install
        for e in [&p.hash_tree_extent, &p.fec_extent].into_iter().flatten() {
            c.verity += ext(e).1;
            c.stream.extend((0..ext(e).1).map(|_| Rec::Block));
        }
        c
    }
    pub fn op_records(&self) -> u64 {
        self.copy + self.xor + self.replace + self.zero + self.verity
    }
    pub fn data_blocks(&self) -> u64 {
        self.xor + self.replace + self.verity
    }
    /// v3: the file with `slots` op slots and every payload `per_block` bytes.
    pub fn v3_size(&self, slots: u64, per_block: u64) -> u64 {
        V3_HEADER
            + SCRATCH
            + 4 * self.sequence
            + V3_RESUME_SLOTS * V3_RESUME_SLOT
            + V3_OP * slots
            + per_block * self.data_blocks()
    }
    /// v2: the op stream laid into clusters of [`CLUSTER_OPS`] slots, each closed by a
    /// CLUSTER record in its last slot and followed by its payloads; at the end, a cluster
    /// holding payloads is closed by a CLUSTER record skipping its unused slots, and the
    /// footer follows in the next slot.
    pub fn v2_size(&self, per_block: u64) -> u64 {
        let mut size = V2_HEADER + SCRATCH;
        // Whether the open cluster holds a payload (per_block may be 0: the bare layout).
        let (mut used, mut payload, mut has) = (0u64, 0u64, false);
        for r in &self.stream {
            used += 1;
            payload += match *r {
                Rec::Bare => 0,
                Rec::Block => per_block,
                Rec::Seq(n) => n,
            };
            has |= *r != Rec::Bare;
            if used == CLUSTER_OPS - 1 {
                size += V2_OP * CLUSTER_OPS + payload;
                (used, payload, has) = (0, 0, false);
            }
        }
        if has {
            size += V2_OP * CLUSTER_OPS + payload;
        } else {
            size += V2_OP * used;
        }
        size + V2_FOOTER
    }
}

/// zlib's `compressBound`.
pub fn zlib_bound(n: u64) -> u64 {
    n + (n >> 12) + (n >> 14) + (n >> 25) + 13
}
