//! The manifest's protobuf messages (package `chromeos_update_engine`, proto2), written by hand
//! from the field numbers of update_engine's `update_metadata.proto` as of Android 15, plus the
//! Android 17 additions (`REPLACE_ZSTD`, `disable_ublk`). Decoded with `prost`; no code
//! generator. Fields of the retired major version 1 (manifest fields 1, 2, 6–11) are not
//! declared: prost skips them like any unknown field.
//!
//! Optional proto2 scalars are `Option<T>`; prost's derive adds an accessor of the same name
//! that gives the proto default for an absent value (`block_size()` is 4096 when unset).

/// An `Extent`: `num_blocks` blocks starting at `start_block`, in units of the manifest's
/// block size. `start_block == u64::MAX` was the historical marker of a sparse hole.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Extent {
    /// First block (field 1).
    #[prost(uint64, optional, tag = "1")]
    pub start_block: Option<u64>,
    /// Number of blocks (field 2).
    #[prost(uint64, optional, tag = "2")]
    pub num_blocks: Option<u64>,
}

/// One signature (`Signatures.Signature`).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Signature {
    /// Deprecated signature version (field 1).
    #[prost(uint32, optional, tag = "1")]
    pub version: Option<u32>,
    /// The signature bytes, possibly zero-padded (field 2).
    #[prost(bytes = "vec", optional, tag = "2")]
    pub data: Option<Vec<u8>>,
    /// Length of `data` before padding; EC signatures are padded to a fixed size so that the
    /// message's size is known before signing (field 3, `fixed32`).
    #[prost(fixed32, optional, tag = "3")]
    pub unpadded_signature_size: Option<u32>,
}

/// `Signatures`: the metadata signature and the payload signature blobs are each one of these.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Signatures {
    /// One entry per signing key (field 1).
    #[prost(message, repeated, tag = "1")]
    pub signatures: Vec<Signature>,
}

/// `PartitionInfo`: size in bytes and SHA-256 of a whole partition image.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PartitionInfo {
    /// Size in bytes (field 1).
    #[prost(uint64, optional, tag = "1")]
    pub size: Option<u64>,
    /// SHA-256 of the image (field 2).
    #[prost(bytes = "vec", optional, tag = "2")]
    pub hash: Option<Vec<u8>>,
}

/// Operation types of `InstallOperation.type`, with update_engine's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum OpType {
    /// Raw new data, zero-padded to whole blocks.
    Replace = 0,
    /// bzip2-compressed new data.
    ReplaceBz = 1,
    /// Move blocks inside the partition (major version 1 only; never generated now).
    Move = 2,
    /// In-place bsdiff (major version 1 only; never generated now).
    Bsdiff = 3,
    /// Copy source blocks of the old partition (minor ≥ 2).
    SourceCopy = 4,
    /// BSDIFF40 patch over source blocks (minor ≥ 2).
    SourceBsdiff = 5,
    /// Write zeros (minor ≥ 4).
    Zero = 6,
    /// Contents undefined; discarded (minor ≥ 4).
    Discard = 7,
    /// xz-compressed new data (minor ≥ 3, and full payloads).
    ReplaceXz = 8,
    /// puffin patch over deflate streams (minor ≥ 5).
    Puffdiff = 9,
    /// BSDF2 patch (bz2, brotli or uncompressed streams) over source blocks (minor ≥ 4).
    BrotliBsdiff = 10,
    /// brotli-compressed Zucchini patch (minor ≥ 8).
    Zucchini = 11,
    /// bsdiff over EROFS lz4-decompressed data (minor ≥ 9).
    Lz4diffBsdiff = 12,
    /// puffdiff over EROFS lz4-decompressed data (minor ≥ 9).
    Lz4diffPuffdiff = 13,
    /// zstd-compressed new data (Android 17, minor ≥ 10).
    ReplaceZstd = 14,
}

impl OpType {
    /// update_engine's name of the type (`REPLACE_XZ`, `SOURCE_COPY`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OpType::Replace => "REPLACE",
            OpType::ReplaceBz => "REPLACE_BZ",
            OpType::Move => "MOVE",
            OpType::Bsdiff => "BSDIFF",
            OpType::SourceCopy => "SOURCE_COPY",
            OpType::SourceBsdiff => "SOURCE_BSDIFF",
            OpType::Zero => "ZERO",
            OpType::Discard => "DISCARD",
            OpType::ReplaceXz => "REPLACE_XZ",
            OpType::Puffdiff => "PUFFDIFF",
            OpType::BrotliBsdiff => "BROTLI_BSDIFF",
            OpType::Zucchini => "ZUCCHINI",
            OpType::Lz4diffBsdiff => "LZ4DIFF_BSDIFF",
            OpType::Lz4diffPuffdiff => "LZ4DIFF_PUFFDIFF",
            OpType::ReplaceZstd => "REPLACE_ZSTD",
        }
    }
}

impl std::fmt::Display for OpType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `InstallOperation`: one step that writes `dst_extents` of the new partition.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct InstallOperation {
    /// The operation type, an [`OpType`] number; unknown numbers are kept (field 1, required).
    #[prost(enumeration = "OpType", required, tag = "1")]
    pub r#type: i32,
    /// Offset of the data blob, relative to the start of the payload's data area (field 2).
    #[prost(uint64, optional, tag = "2")]
    pub data_offset: Option<u64>,
    /// Length of the data blob in bytes (field 3).
    #[prost(uint64, optional, tag = "3")]
    pub data_length: Option<u64>,
    /// Blocks of the old partition the operation reads (field 4).
    #[prost(message, repeated, tag = "4")]
    pub src_extents: Vec<Extent>,
    /// Legacy byte length of the source (field 5).
    #[prost(uint64, optional, tag = "5")]
    pub src_length: Option<u64>,
    /// Blocks of the new partition the operation writes (field 6).
    #[prost(message, repeated, tag = "6")]
    pub dst_extents: Vec<Extent>,
    /// Legacy byte length of the destination (field 7).
    #[prost(uint64, optional, tag = "7")]
    pub dst_length: Option<u64>,
    /// SHA-256 of the data blob (field 8).
    #[prost(bytes = "vec", optional, tag = "8")]
    pub data_sha256_hash: Option<Vec<u8>>,
    /// SHA-256 of the source blocks, read in `src_extents` order (field 9).
    #[prost(bytes = "vec", optional, tag = "9")]
    pub src_sha256_hash: Option<Vec<u8>>,
}

impl InstallOperation {
    /// The operation type, or the unknown number.
    pub fn op_type(&self) -> Result<OpType, i32> {
        OpType::try_from(self.r#type).map_err(|_| self.r#type)
    }
}

/// Types of [`CowMergeOperation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum CowMergeOpType {
    /// Copy a block of the old partition.
    CowCopy = 0,
    /// XOR stored data with source bytes.
    CowXor = 1,
    /// Raw data (never emitted by the generator).
    CowReplace = 2,
}

/// `CowMergeOperation`: one entry of a partition's ordered Virtual A/B merge sequence.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct CowMergeOperation {
    /// A [`CowMergeOpType`] number (field 1).
    #[prost(enumeration = "CowMergeOpType", optional, tag = "1")]
    pub r#type: Option<i32>,
    /// Source blocks (field 2).
    #[prost(message, optional, tag = "2")]
    pub src_extent: Option<Extent>,
    /// Destination blocks (field 3).
    #[prost(message, optional, tag = "3")]
    pub dst_extent: Option<Extent>,
    /// Byte offset into the source for XOR (field 4).
    #[prost(uint32, optional, tag = "4")]
    pub src_offset: Option<u32>,
}

/// `PartitionUpdate`: everything the payload says about one partition.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PartitionUpdate {
    /// The partition's name, without slot suffix (field 1, required). Untrusted: it becomes a
    /// file name only after the checks of extraction.
    #[prost(string, required, tag = "1")]
    pub partition_name: String,
    /// Run the postinstall program (field 2).
    #[prost(bool, optional, tag = "2")]
    pub run_postinstall: Option<bool>,
    /// Path of the postinstall program inside the partition (field 3).
    #[prost(string, optional, tag = "3")]
    pub postinstall_path: Option<String>,
    /// File-system type for postinstall (field 4).
    #[prost(string, optional, tag = "4")]
    pub filesystem_type: Option<String>,
    /// Signatures of the new partition (field 5).
    #[prost(message, repeated, tag = "5")]
    pub new_partition_signature: Vec<Signature>,
    /// Size and hash of the old partition an incremental applies to (field 6).
    #[prost(message, optional, tag = "6")]
    pub old_partition_info: Option<PartitionInfo>,
    /// Size and hash of the new partition (field 7).
    #[prost(message, optional, tag = "7")]
    pub new_partition_info: Option<PartitionInfo>,
    /// The operations, in apply order (field 8).
    #[prost(message, repeated, tag = "8")]
    pub operations: Vec<InstallOperation>,
    /// A failing postinstall does not fail the update (field 9).
    #[prost(bool, optional, tag = "9")]
    pub postinstall_optional: Option<bool>,
    /// Blocks the dm-verity hash tree covers (field 10).
    #[prost(message, optional, tag = "10")]
    pub hash_tree_data_extent: Option<Extent>,
    /// Where the hash tree goes (field 11).
    #[prost(message, optional, tag = "11")]
    pub hash_tree_extent: Option<Extent>,
    /// Hash algorithm of the tree, e.g. `sha256` (field 12).
    #[prost(string, optional, tag = "12")]
    pub hash_tree_algorithm: Option<String>,
    /// Salt of the tree (field 13).
    #[prost(bytes = "vec", optional, tag = "13")]
    pub hash_tree_salt: Option<Vec<u8>>,
    /// Blocks the FEC covers (field 14).
    #[prost(message, optional, tag = "14")]
    pub fec_data_extent: Option<Extent>,
    /// Where the FEC goes (field 15).
    #[prost(message, optional, tag = "15")]
    pub fec_extent: Option<Extent>,
    /// Reed–Solomon parity bytes per codeword (field 16, default 2).
    #[prost(uint32, optional, tag = "16", default = "2")]
    pub fec_roots: Option<u32>,
    /// Partition version string (field 17).
    #[prost(string, optional, tag = "17")]
    pub version: Option<String>,
    /// The ordered Virtual A/B merge sequence (field 18).
    #[prost(message, repeated, tag = "18")]
    pub merge_operations: Vec<CowMergeOperation>,
    /// Estimated COW size in bytes for Virtual A/B (field 19).
    #[prost(uint64, optional, tag = "19")]
    pub estimate_cow_size: Option<u64>,
    /// Estimated maximum COW op count (v3 op area, field 20).
    #[prost(uint64, optional, tag = "20")]
    pub estimate_op_count_max: Option<u64>,
}

/// `DynamicPartitionGroup`: a group of the `super` partition.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct DynamicPartitionGroup {
    /// Group name (field 1, required).
    #[prost(string, required, tag = "1")]
    pub name: String,
    /// Maximum size of the group in bytes (field 2).
    #[prost(uint64, optional, tag = "2")]
    pub size: Option<u64>,
    /// Partitions in the group (field 3).
    #[prost(string, repeated, tag = "3")]
    pub partition_names: Vec<String>,
}

/// `VABCFeatureSet`: optional features of the Virtual A/B compression writer.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct VabcFeatureSet {
    /// Compress with several threads (field 1).
    #[prost(bool, optional, tag = "1")]
    pub threaded: Option<bool>,
    /// Batch COW writes (field 2).
    #[prost(bool, optional, tag = "2")]
    pub batch_writes: Option<bool>,
}

/// `DynamicPartitionMetadata`: `super` groups and the Virtual A/B settings.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct DynamicPartitionMetadata {
    /// Groups (field 1).
    #[prost(message, repeated, tag = "1")]
    pub groups: Vec<DynamicPartitionGroup>,
    /// Virtual A/B snapshots (field 2).
    #[prost(bool, optional, tag = "2")]
    pub snapshot_enabled: Option<bool>,
    /// Virtual A/B compression (field 3).
    #[prost(bool, optional, tag = "3")]
    pub vabc_enabled: Option<bool>,
    /// COW compression, e.g. `lz4`, `gz`, `zstd,3`, `none` (field 4).
    #[prost(string, optional, tag = "4")]
    pub vabc_compression_param: Option<String>,
    /// COW format major version, 2 or 3 (field 5).
    #[prost(uint32, optional, tag = "5")]
    pub cow_version: Option<u32>,
    /// Writer features (field 6).
    #[prost(message, optional, tag = "6")]
    pub vabc_feature_set: Option<VabcFeatureSet>,
    /// COW v3 compression unit in bytes (field 7).
    #[prost(uint64, optional, tag = "7")]
    pub compression_factor: Option<u64>,
    /// Serve the snapshot with dm-user instead of ublk (field 8, Android 17).
    #[prost(bool, optional, tag = "8")]
    pub disable_ublk: Option<bool>,
}

/// `ApexInfo`: an APEX package the update carries.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ApexInfo {
    /// Package name (field 1).
    #[prost(string, optional, tag = "1")]
    pub package_name: Option<String>,
    /// Package version (field 2).
    #[prost(int64, optional, tag = "2")]
    pub version: Option<i64>,
    /// Whether the APEX is compressed (field 3).
    #[prost(bool, optional, tag = "3")]
    pub is_compressed: Option<bool>,
    /// Decompressed size in bytes (field 4).
    #[prost(int64, optional, tag = "4")]
    pub decompressed_size: Option<i64>,
}

/// `DeltaArchiveManifest`: the payload's manifest.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaArchiveManifest {
    /// Block size in bytes (field 3, default 4096).
    #[prost(uint32, optional, tag = "3", default = "4096")]
    pub block_size: Option<u32>,
    /// Offset of the payload signature blob in the data area (field 4).
    #[prost(uint64, optional, tag = "4")]
    pub signatures_offset: Option<u64>,
    /// Size of the payload signature blob (field 5).
    #[prost(uint64, optional, tag = "5")]
    pub signatures_size: Option<u64>,
    /// Minor version: 0 for a full payload, else the delta format (field 12).
    #[prost(uint32, optional, tag = "12", default = "0")]
    pub minor_version: Option<u32>,
    /// Partitions, in apply order (field 13).
    #[prost(message, repeated, tag = "13")]
    pub partitions: Vec<PartitionUpdate>,
    /// Build timestamp the device must not be newer than (field 14).
    #[prost(int64, optional, tag = "14")]
    pub max_timestamp: Option<i64>,
    /// `super` layout and Virtual A/B settings (field 15).
    #[prost(message, optional, tag = "15")]
    pub dynamic_partition_metadata: Option<DynamicPartitionMetadata>,
    /// Only some partitions are updated (field 16).
    #[prost(bool, optional, tag = "16")]
    pub partial_update: Option<bool>,
    /// APEX packages (field 17).
    #[prost(message, repeated, tag = "17")]
    pub apex_info: Vec<ApexInfo>,
    /// Security patch level of the new build (field 18).
    #[prost(string, optional, tag = "18")]
    pub security_patch_level: Option<String>,
}
