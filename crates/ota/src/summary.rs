//! What `snapblk ota info` shows: the header, the manifest's settings, and per partition its
//! sizes, hashes, operation histogram, Virtual A/B estimates and whether this build can write it.

use std::collections::{BTreeMap, BTreeSet};

use crate::apply::Blocker;
use crate::ops::{apply_supports, extract_supports};
use crate::payload::{Header, Payload};
use crate::proto::{CowMergeOpType, PartitionUpdate};

/// Summary of a payload.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Payload size in bytes.
    pub payload_size: u64,
    /// The fixed header.
    pub header: Header,
    /// Header + manifest bytes.
    pub metadata_size: u64,
    /// Offset of the data area.
    pub data_start: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Minor version (0: full payload).
    pub minor_version: u32,
    /// `full` or `incremental`.
    pub kind: &'static str,
    /// `max_timestamp`, if set.
    pub max_timestamp: Option<i64>,
    /// `security_patch_level`, if set.
    pub security_patch_level: Option<String>,
    /// `partial_update`.
    pub partial_update: bool,
    /// Where the signatures are ([`Payload::verify_signatures`] checks them).
    pub signatures: SignatureSummary,
    /// Dynamic partitions and Virtual A/B settings, if the manifest has them.
    pub dynamic_partitions: Option<DynamicSummary>,
    /// APEX packages: name and version.
    pub apex: Vec<(String, i64)>,
    /// Partitions in apply order.
    pub partitions: Vec<PartitionSummary>,
}

/// Which signatures the payload carries.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SignatureSummary {
    /// Bytes of the metadata signature (0: none).
    pub metadata_signature_size: u32,
    /// (payload offset, size) of the payload signature blob, if any.
    pub payload_signature: Option<(u64, u64)>,
}

/// `DynamicPartitionMetadata`, flattened.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DynamicSummary {
    /// Groups: name, maximum size, partitions.
    pub groups: Vec<(String, Option<u64>, Vec<String>)>,
    /// Virtual A/B snapshots.
    pub snapshot_enabled: bool,
    /// Virtual A/B compression.
    pub vabc_enabled: bool,
    /// COW compression parameter (empty: update_engine's default, gz).
    pub vabc_compression_param: Option<String>,
    /// COW format major version.
    pub cow_version: Option<u32>,
    /// `vabc_feature_set.threaded`.
    pub threaded: Option<bool>,
    /// `vabc_feature_set.batch_writes`.
    pub batch_writes: Option<bool>,
    /// COW v3 compression unit in bytes.
    pub compression_factor: Option<u64>,
    /// Serve snapshots with dm-user instead of ublk.
    pub disable_ublk: Option<bool>,
}

/// One partition.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PartitionSummary {
    /// Name, as the manifest has it (untrusted; see `check_partition_name`).
    pub name: String,
    /// `new_partition_info.size`.
    pub size: Option<u64>,
    /// `new_partition_info.hash`, hex.
    pub sha256: Option<String>,
    /// `old_partition_info.size` (incremental payloads).
    pub old_size: Option<u64>,
    /// `old_partition_info.hash`, hex.
    pub old_sha256: Option<String>,
    /// Number of operations.
    pub ops: usize,
    /// Operations by type name (`UNKNOWN(n)` for numbers update_engine does not define).
    pub op_counts: BTreeMap<String, usize>,
    /// Bytes of data blobs.
    pub data_bytes: u64,
    /// Bytes the operations write.
    pub dst_bytes: u64,
    /// `filesystem_type`.
    pub filesystem_type: Option<String>,
    /// `version`.
    pub version: Option<String>,
    /// `estimate_cow_size` (Virtual A/B).
    pub estimate_cow_size: Option<u64>,
    /// `estimate_op_count_max`.
    pub estimate_op_count_max: Option<u64>,
    /// Merge operations: COW_COPY, COW_XOR, others.
    pub merge_ops: (usize, usize, usize),
    /// The dm-verity hash tree and FEC the payload leaves to the device (and `extract` and
    /// `apply` compute), if it names any.
    pub verity: Option<VeritySummary>,
    /// `run_postinstall`.
    pub run_postinstall: bool,
    /// Why the name cannot be a file name (see `check_partition_name`), if it cannot.
    pub name_problem: Option<&'static str>,
    /// Whether `ota extract` can write this partition: a usable name, a size and hash in
    /// `new_partition_info`, only operation types it applies, and verity fields it accepts.
    pub extractable: bool,
    /// The op types that stop `ota extract`, if any.
    pub blocked_by: Vec<String>,
    /// Whether `ota apply` can build this partition (from its old image, if it has one): as
    /// `extractable`, with the types `apply` applies instead of those `extract` applies.
    pub applicable: bool,
    /// The op types that stop `ota apply`, if any.
    pub apply_blocked_by: Vec<String>,
    /// What `ota apply` reports for this partition, or skips it for with
    /// `--skip-unsupported`: its first unsupported operation.
    pub apply_blocker: Option<Blocker>,
}

/// An extent of blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExtentSummary {
    /// First block.
    pub start_block: u64,
    /// Number of blocks.
    pub num_blocks: u64,
}

/// A partition's dm-verity fields, as the manifest has them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VeritySummary {
    /// `hash_tree_data_extent`: the blocks the tree covers.
    pub hash_tree_data_extent: Option<ExtentSummary>,
    /// `hash_tree_extent`: where the tree goes.
    pub hash_tree_extent: Option<ExtentSummary>,
    /// `hash_tree_algorithm`.
    pub hash_tree_algorithm: Option<String>,
    /// `hash_tree_salt`, hex.
    pub hash_tree_salt: Option<String>,
    /// `fec_data_extent`: the blocks the FEC covers.
    pub fec_data_extent: Option<ExtentSummary>,
    /// `fec_extent`: where the FEC goes.
    pub fec_extent: Option<ExtentSummary>,
    /// `fec_roots` (2 when absent).
    pub fec_roots: u32,
    /// Why `extract` and `apply` refuse these fields, if they do (one line).
    pub problem: Option<String>,
}

fn extent(e: Option<&crate::proto::Extent>) -> Option<ExtentSummary> {
    e.map(|e| ExtentSummary {
        start_block: e.start_block(),
        num_blocks: e.num_blocks(),
    })
}

/// The verity fields of `p`, if it has any, and whether `extract` and `apply` accept them.
fn verity(p: &PartitionUpdate, block_size: u32) -> Option<VeritySummary> {
    let named = p.hash_tree_data_extent.is_some()
        || p.hash_tree_extent.is_some()
        || p.hash_tree_algorithm.is_some()
        || p.hash_tree_salt.is_some()
        || p.fec_data_extent.is_some()
        || p.fec_extent.is_some()
        || p.fec_roots.is_some();
    if !named {
        return None;
    }
    let size = p.new_partition_info.as_ref().and_then(|i| i.size);
    let problem = size.and_then(|size| {
        crate::verity::Verity::from_partition(p, block_size, size)
            .err()
            .map(|e| e.to_string())
    });
    Some(VeritySummary {
        hash_tree_data_extent: extent(p.hash_tree_data_extent.as_ref()),
        hash_tree_extent: extent(p.hash_tree_extent.as_ref()),
        hash_tree_algorithm: p.hash_tree_algorithm.clone(),
        hash_tree_salt: p.hash_tree_salt.as_deref().map(crate::hex),
        fec_data_extent: extent(p.fec_data_extent.as_ref()),
        fec_extent: extent(p.fec_extent.as_ref()),
        fec_roots: p.fec_roots(),
        problem,
    })
}

fn type_name(t: i32) -> String {
    match crate::proto::OpType::try_from(t) {
        Ok(t) => t.name().to_string(),
        Err(_) => format!("UNKNOWN({t})"),
    }
}

fn partition(p: &PartitionUpdate, block_size: u32) -> PartitionSummary {
    let bs = u64::from(block_size);
    let mut op_counts = BTreeMap::new();
    let mut blocked = BTreeSet::new();
    let mut apply_blocked = BTreeSet::new();
    let (mut data_bytes, mut dst_bytes) = (0u64, 0u64);
    for op in &p.operations {
        *op_counts.entry(type_name(op.r#type)).or_insert(0) += 1;
        if !op.op_type().is_ok_and(extract_supports) {
            blocked.insert(type_name(op.r#type));
        }
        if !op.op_type().is_ok_and(apply_supports) {
            apply_blocked.insert(type_name(op.r#type));
        }
        data_bytes = data_bytes.saturating_add(op.data_length());
        for e in &op.dst_extents {
            dst_bytes = dst_bytes.saturating_add(e.num_blocks().saturating_mul(bs));
        }
    }
    let mut merge = (0, 0, 0);
    for m in &p.merge_operations {
        match m.r#type.map(CowMergeOpType::try_from) {
            Some(Ok(CowMergeOpType::CowCopy)) | None => merge.0 += 1,
            Some(Ok(CowMergeOpType::CowXor)) => merge.1 += 1,
            _ => merge.2 += 1,
        }
    }
    let info = |i: Option<&crate::proto::PartitionInfo>| {
        (
            i.and_then(|i| i.size),
            i.and_then(|i| i.hash.as_deref()).map(crate::hex),
        )
    };
    let (size, sha256) = info(p.new_partition_info.as_ref());
    let name_problem = crate::plan::check_partition_name(&p.partition_name).err();
    let verity = verity(p, block_size);
    let info_ok = name_problem.is_none()
        && size.is_some()
        && sha256.as_ref().is_some_and(|h| h.len() == 64)
        && verity.as_ref().is_none_or(|v| v.problem.is_none());
    let extractable = blocked.is_empty() && info_ok;
    let apply_blocker = crate::apply::blocker(p).map(|(b, _)| b);
    let applicable = apply_blocker.is_none() && info_ok;
    let (old_size, old_sha256) = info(p.old_partition_info.as_ref());
    PartitionSummary {
        name: p.partition_name.clone(),
        size,
        sha256,
        old_size,
        old_sha256,
        ops: p.operations.len(),
        op_counts,
        data_bytes,
        dst_bytes,
        filesystem_type: p.filesystem_type.clone(),
        version: p.version.clone(),
        estimate_cow_size: p.estimate_cow_size,
        estimate_op_count_max: p.estimate_op_count_max,
        merge_ops: merge,
        verity,
        run_postinstall: p.run_postinstall(),
        name_problem,
        extractable,
        blocked_by: blocked.into_iter().collect(),
        applicable,
        apply_blocked_by: apply_blocked.into_iter().collect(),
        apply_blocker,
    }
}

impl Payload {
    /// The summary `snapblk ota info` prints.
    pub fn summary(&self) -> Summary {
        let m = self.manifest();
        let dynamic_partitions = m
            .dynamic_partition_metadata
            .as_ref()
            .map(|d| DynamicSummary {
                groups: d
                    .groups
                    .iter()
                    .map(|g| (g.name.clone(), g.size, g.partition_names.clone()))
                    .collect(),
                snapshot_enabled: d.snapshot_enabled(),
                vabc_enabled: d.vabc_enabled(),
                vabc_compression_param: d.vabc_compression_param.clone(),
                cow_version: d.cow_version,
                threaded: d.vabc_feature_set.and_then(|f| f.threaded),
                batch_writes: d.vabc_feature_set.and_then(|f| f.batch_writes),
                compression_factor: d.compression_factor,
                disable_ublk: d.disable_ublk,
            });
        Summary {
            payload_size: self.len(),
            header: *self.header(),
            metadata_size: self.metadata_size(),
            data_start: self.data_start(),
            block_size: self.block_size(),
            minor_version: self.minor_version(),
            kind: if self.is_full() {
                "full"
            } else {
                "incremental"
            },
            max_timestamp: m.max_timestamp,
            security_patch_level: m.security_patch_level.clone(),
            partial_update: m.partial_update(),
            signatures: SignatureSummary {
                metadata_signature_size: self.header().metadata_signature_size,
                payload_signature: self.signatures_range(),
            },
            dynamic_partitions,
            apex: m
                .apex_info
                .iter()
                .map(|a| (a.package_name().to_string(), a.version()))
                .collect(),
            partitions: m
                .partitions
                .iter()
                .map(|p| partition(p, self.block_size()))
                .collect(),
        }
    }
}
