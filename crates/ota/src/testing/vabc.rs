//! Virtual A/B fields for test payloads: merge operations and the manifest's VABC
//! parameters, set on a [`Built`](super::Built) manifest.

use crate::proto::{
    CowMergeOpType, CowMergeOperation, DeltaArchiveManifest, DynamicPartitionGroup,
    DynamicPartitionMetadata, Extent, VabcFeatureSet,
};

fn extent(start: u64, n: u64) -> Option<Extent> {
    Some(Extent {
        start_block: Some(start),
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
