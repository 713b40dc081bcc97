//! Virtual A/B fields for test payloads: merge operations and the manifest's VABC
//! parameters, set on a [`Built`](super::Built) manifest, and a ready case ([`vabc_case`]).

use snapblk_core::MemFile;

use super::{Blocks, Built, DeltaOp, Differ, Encoding, PayloadBuilder};
use crate::proto::{
    CowMergeOpType, CowMergeOperation, DeltaArchiveManifest, DynamicPartitionGroup,
    DynamicPartitionMetadata, Extent, OpType, PartitionUpdate, VabcFeatureSet,
};
use crate::verity::Verity;

fn extent(start: u64, n: u64) -> Option<Extent> {
    Some(Extent {
        start_block: Some(start),
        num_blocks: Some(n),
    })
}

const BS: usize = 4096;
const B: u64 = BS as u64;

/// Deterministic bytes (xorshift), different per seed.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn blk(img: &[u8], start: usize, n: usize) -> &[u8] {
    &img[start * BS..(start + n) * BS]
}

fn edit(b: &mut [u8], every: usize, seed: u8) {
    for i in (seed as usize..b.len()).step_by(every) {
        b[i] = b[i].wrapping_add(seed | 1);
    }
}

fn ext(s: u64, n: u64) -> Option<Extent> {
    Some(Extent {
        start_block: Some(s),
        num_blocks: Some(n),
    })
}

/// A COW_COPY of `n` blocks: old `src..` → new `dst..`.
pub fn cow_copy(src: u64, dst: u64, n: u64) -> CowMergeOperation {
    CowMergeOperation {
        r#type: Some(CowMergeOpType::CowCopy as i32),
        src_extent: extent(src, n),
        dst_extent: extent(dst, n),
        src_offset: None,
    }
}

/// A COW_XOR of `n` destination blocks from old block `src` at byte `offset`, reading
/// `src_blocks` source blocks (`n + 1` when `offset > 0`, as the generator writes it, or `n`
/// at the old image's end).
pub fn cow_xor(src: u64, src_blocks: u64, dst: u64, n: u64, offset: u32) -> CowMergeOperation {
    CowMergeOperation {
        r#type: Some(CowMergeOpType::CowXor as i32),
        src_extent: extent(src, src_blocks),
        dst_extent: extent(dst, n),
        src_offset: (offset > 0).then_some(offset),
    }
}

/// The manifest's VABC parameters.
#[derive(Clone, Debug)]
pub struct VabcFields {
    /// `cow_version`.
    pub cow_version: u32,
    /// `vabc_compression_param` (`algo[,level]`).
    pub compression: String,
    /// `compression_factor` (0 leaves it out).
    pub compression_factor: u64,
    /// `vabc_feature_set.batch_writes`.
    pub batch_writes: bool,
    /// `vabc_feature_set.threaded`.
    pub threaded: bool,
}

/// Make `partitions` dynamic partitions of one group with snapshots and VABC on, with `f`.
pub fn set_vabc(manifest: &mut DeltaArchiveManifest, partitions: &[&str], f: &VabcFields) {
    manifest.dynamic_partition_metadata = Some(DynamicPartitionMetadata {
        groups: vec![DynamicPartitionGroup {
            name: "group_a".into(),
            size: Some(1 << 30),
            partition_names: partitions.iter().map(|s| s.to_string()).collect(),
        }],
        snapshot_enabled: Some(true),
        vabc_enabled: Some(true),
        vabc_compression_param: Some(f.compression.clone()),
        cow_version: Some(f.cow_version),
        vabc_feature_set: Some(VabcFeatureSet {
            threaded: Some(f.threaded),
            batch_writes: Some(f.batch_writes),
        }),
        compression_factor: (f.compression_factor > 0).then_some(f.compression_factor),
        disable_ublk: None,
    });
}

/// What [`vabc_case`] builds.
pub struct VabcCase {
    /// The old image.
    pub old: Vec<u8>,
    /// The new image (data, hash tree, FEC).
    pub new: Vec<u8>,
    /// The payload, to mutate before `to_bytes`.
    pub built: Built,
}

/// An incremental partition `system` for VABC tests: the old image (48 blocks), the new one
/// (32 data blocks, a one-block hash tree at 32 and two FEC blocks at 33..35) and the payload
/// with merge operations of every kind and `vabc`'s parameters. `differ` makes the bsdiff
/// patches.
///
/// Install ops (new blocks ← what):
/// 0..4 SOURCE_COPY old 36..40 (COW_COPY) · 4..6 SOURCE_COPY old 4..6 (identity COW_COPY) ·
/// 6..8 SOURCE_COPY old 40..42 (no merge op: REPLACE) · 8..16 SOURCE_BSDIFF old 12..20
/// (COW_XOR 8..14 ← 12.., offset 0) · 16..20 BROTLI_BSDIFF old 42..46 with inserted bytes
/// (COW_XOR 16..20 ← 44.. at offset 100: its last block reads past the old image's end) ·
/// 20..22 REPLACE_XZ · 22..24 SOURCE_COPY old 21..23 (two COW_COPY: 23 ← 22, 22 ← 21) ·
/// 24..28 BROTLI_BSDIFF old 28..32 (COW_XOR 24..27 ← 28.. at offset 200, +1 block) ·
/// 28..30 ZERO · 30 DISCARD · 31 REPLACE.
pub fn vabc_case(vabc: &VabcFields, differ: &Differ) -> VabcCase {
    let old = pattern(48 * BS, 7);
    let mut new = Vec::new();
    new.extend_from_slice(blk(&old, 36, 4));
    new.extend_from_slice(blk(&old, 4, 2));
    new.extend_from_slice(blk(&old, 40, 2));
    let mut b = blk(&old, 12, 8).to_vec();
    edit(&mut b, 997, 3);
    new.extend_from_slice(&b);
    let mut b = blk(&old, 42, 4).to_vec();
    b.splice(100..100, pattern(300, 9));
    b.truncate(4 * BS);
    new.extend_from_slice(&b);
    new.extend_from_slice(&pattern(2 * BS, 11));
    new.extend_from_slice(blk(&old, 21, 2));
    let mut b = blk(&old, 28, 4).to_vec();
    b.splice(0..0, pattern(200, 13));
    b.truncate(4 * BS);
    edit(&mut b, 1999, 5);
    new.extend_from_slice(&b);
    new.extend_from_slice(&[0; 3 * BS]);
    new.extend_from_slice(&pattern(BS, 17));
    assert_eq!(new.len(), 32 * BS);
    new.resize(35 * BS, 0);
    // The dm-verity tree and FEC the device computes.
    let verity_fields = PartitionUpdate {
        hash_tree_data_extent: ext(0, 32),
        hash_tree_extent: ext(32, 1),
        hash_tree_algorithm: Some("sha256".into()),
        hash_tree_salt: Some(vec![0x5a; 32]),
        fec_data_extent: ext(0, 33),
        fec_extent: ext(33, 2),
        fec_roots: Some(2),
        ..Default::default()
    };
    let img = MemFile::new(new);
    Verity::from_partition(&verity_fields, BS as u32, 35 * B)
        .unwrap()
        .unwrap()
        .write(&img, 1)
        .unwrap();
    let new = img.into_inner();

    let v = |r: &[(u64, u64)]| -> Blocks { r.to_vec() };
    let ops = vec![
        DeltaOp::Copy {
            src: v(&[(36, 4)]),
            dst: v(&[(0, 4)]),
        },
        DeltaOp::Copy {
            src: v(&[(4, 2)]),
            dst: v(&[(4, 2)]),
        },
        DeltaOp::Copy {
            src: v(&[(40, 2)]),
            dst: v(&[(6, 2)]),
        },
        DeltaOp::Bsdiff {
            src: v(&[(12, 8)]),
            dst: v(&[(8, 8)]),
        },
        DeltaOp::Bsdf2 {
            src: v(&[(42, 4)]),
            dst: v(&[(16, 4)]),
            codecs: [2, 2, 2],
        },
        DeltaOp::Replace {
            dst: v(&[(20, 2)]),
            encoding: Encoding::Xz,
        },
        DeltaOp::Copy {
            src: v(&[(21, 2)]),
            dst: v(&[(22, 2)]),
        },
        DeltaOp::Bsdf2 {
            src: v(&[(28, 4)]),
            dst: v(&[(24, 4)]),
            codecs: [1, 0, 2],
        },
        DeltaOp::Zero { dst: v(&[(28, 2)]) },
        DeltaOp::Raw {
            op_type: OpType::Discard as i32,
            src: v(&[]),
            dst: v(&[(30, 1)]),
            blob: Vec::new(),
        },
        DeltaOp::Replace {
            dst: v(&[(31, 1)]),
            encoding: Encoding::Replace,
        },
    ];
    let mut built = PayloadBuilder::new()
        .delta("system", &old, &new, &ops, differ)
        .build();
    let p = &mut built.manifest.partitions[0];
    p.hash_tree_data_extent = verity_fields.hash_tree_data_extent;
    p.hash_tree_extent = verity_fields.hash_tree_extent;
    p.hash_tree_algorithm = verity_fields.hash_tree_algorithm;
    p.hash_tree_salt = verity_fields.hash_tree_salt;
    p.fec_data_extent = verity_fields.fec_data_extent;
    p.fec_extent = verity_fields.fec_extent;
    p.fec_roots = verity_fields.fec_roots;
    p.merge_operations = vec![
        cow_copy(36, 0, 4),
        cow_copy(4, 4, 2),
        cow_xor(12, 6, 8, 6, 0),
        cow_xor(44, 4, 16, 4, 100),
        // A self-overlapping copy, split as the generator splits it.
        cow_copy(22, 23, 1),
        cow_copy(21, 22, 1),
        cow_xor(28, 4, 24, 3, 200),
    ];
    set_vabc(&mut built.manifest, &["system"], vabc);
    VabcCase { old, new, built }
}

/// `merge_operations` as `ota generate` orders them (its cycle breaker, the code that fills
/// every generated payload's list): `ops` in an order in which merging them one after the
/// other never reads a block an earlier one overwrote, and the operations dropped to break
/// dependency cycles (their blocks go to the COW as raw data). Lets tests run the generator's
/// ordering on merge operations it did not make (update_engine's real sets).
pub fn order_merge_operations(
    ops: &[CowMergeOperation],
) -> (Vec<CowMergeOperation>, Vec<CowMergeOperation>) {
    use crate::generate::merge::{MergeOp, order};
    let range = |e: &Option<Extent>| {
        let e = e.as_ref().expect("a merge operation's extent");
        (e.start_block.unwrap_or(0), e.num_blocks.unwrap_or(0))
    };
    let ops = ops
        .iter()
        .map(|m| MergeOp {
            xor: m.r#type == Some(CowMergeOpType::CowXor as i32),
            src: range(&m.src_extent),
            dst: range(&m.dst_extent),
            offset: m.src_offset.unwrap_or(0),
        })
        .collect();
    let o = order(ops);
    let proto = |v: Vec<MergeOp>| v.into_iter().map(MergeOp::to_proto).collect();
    (proto(o.ops), proto(o.dropped))
}
