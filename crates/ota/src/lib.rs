//! Android OTA payloads: update_engine's `payload.bin` ("CrAU", major version 2), bare or
//! inside an OTA zip.
//!
//! * [`Ota::open`] finds the payload (a bare file, or the stored `payload.bin` entry of a zip,
//!   read in place) and `payload_properties.txt`; [`Payload`] holds the checked header and the
//!   decoded [`DeltaArchiveManifest`], and reads data blobs by position, never the whole file.
//! * [`Payload::summary`] is what `snapblk ota info` shows.
//! * [`Payload::plan_extract`] checks everything a full-payload extraction needs before the
//!   first write; [`ExtractPlan::run`] writes the partitions to caller-provided [`Output`]s in
//!   parallel and verifies every blob's and every partition's SHA-256.
//! * [`Payload::plan_apply`] does the same for an incremental payload, whose partitions are
//!   built from their old images (SOURCE_COPY, SOURCE_BSDIFF and BROTLI_BSDIFF, with the crate's
//!   own BSDIFF40/BSDF2 applier, and PUFFDIFF); [`ApplyPlan::check_sources`] checks the old
//!   images against `old_partition_info` before anything is written, and [`ApplyPlan::run`]
//!   builds the partitions, every operation's source bytes checked against `src_sha256_hash`
//!   before use.
//! * [`Verity`] recomputes a partition's dm-verity hash tree and Reed–Solomon FEC where the
//!   manifest leaves them to the device (`hash_tree_*`, `fec_*`), byte for byte as
//!   update_engine writes them; extraction and apply do it before a partition's hash check.
//! * [`apply_puffdiff`] applies a PUFFDIFF patch (puffin's format: deflate blocks puffed,
//!   patched and re-encoded bit for bit) to an operation's source bytes, with the caller's
//!   bsdiff applier; `apply` calls it with the crate's.
//!
//! * [`Payload::signature_digests`] and [`Payload::verify_signatures`] check the metadata and
//!   payload signatures with [`VerifyKey`]s (X.509 certificates or public keys; RSA PKCS#1 v1.5
//!   and ECDSA P-256 over SHA-256) and say for each whether it is absent, not checked,
//!   verified (by which signature and key) or not matching ([`SignatureReport`]).
//!
//! The manifest's messages are written by hand from update_engine's field numbers
//! (`prost` derive, no code generator). ZUCCHINI and LZ4DIFF_* are not implemented yet: the
//! apply planner reports partitions that need them ([`Blocker`]), and the op dispatch answers
//! [`OpError::Unsupported`].

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod apply;
mod bspatch;
mod container;
mod delta;
mod error;
mod extract;
mod finish;
#[cfg(feature = "test-utils")]
pub mod fuzzing;
mod generate;
mod keys;
mod ops;
mod payload;
mod plan;
mod properties;
mod proto;
mod puffin;
mod signature;
mod source;
mod summary;
#[cfg(feature = "test-utils")]
pub mod testing;
mod vabc;
mod verity;

pub use apply::{ApplyPlan, Blocker, CheckedSources, SkippedPartition};
pub use bspatch::PatchError;
pub use container::{Container, Ota, PAYLOAD_ENTRY, PROPERTIES_NAME, PropertiesOrigin};
pub use delta::MAX_PATCH_INPUT;
pub use error::{OpError, OtaError, Result, VerityError};
pub use extract::{
    ExtractOptions, ExtractProgress, ExtractReport, ExtractTiming, MAX_THREADS, Output,
    PartitionReport,
};
pub use generate::{
    BsdiffFormat, DELTA_MINOR_VERSION, DIFF_CHUNK_BLOCKS, FULL_CHUNK_BLOCKS, GEN_BLOCK_SIZE,
    GenerateError, GenerateOptions, Generated, PartitionImages, PartitionStats, SignError,
    SigningKey, VabcOptions, generate,
};
pub use keys::{KeyAlgorithm, KeyError, MAX_RSA_BITS, MIN_RSA_BITS, VerifyKey};
pub use ops::{apply_supports, extract_supports};
pub use payload::{HEADER_LEN, Header, MAGIC, MAJOR_VERSION, MAX_MANIFEST, Payload};
pub use plan::{
    ExtractPlan, MAX_NAME, MAX_PARTITION, PlannedPartition, PlannedSource, check_partition_name,
};
pub use properties::{Check, Properties, PropertiesReport};
pub use proto::{
    ApexInfo, CowMergeOpType, CowMergeOperation, DeltaArchiveManifest, DynamicPartitionGroup,
    DynamicPartitionMetadata, Extent, InstallOperation, OpType, PartitionInfo, PartitionUpdate,
    Signature, Signatures, VabcFeatureSet,
};
/// Test scaffolding for PUFFDIFF (feature `test-utils`): deflate locating, puff and huff of
/// whole buffers, a patch maker and the fuzz entry point.
#[cfg(feature = "test-utils")]
pub use puffin::testing as puffin_testing;
pub use puffin::{
    DeflateError, HuffmanAlphabet, MAX_PUFF_RATIO, PuffError, PuffSide, apply_puffdiff,
};
pub use signature::{Digests, MAX_SIGNATURE_BLOB, SignatureReport, SignatureStatus};
pub use summary::{
    DynamicSummary, ExtentSummary, PartitionSummary, SignatureSummary, Summary, VeritySummary,
};
pub use vabc::{
    ByteCounter, CowEstimate, DeviceProfile, END_OF_INSTALL_LABEL, MergeOp, VabcError, VabcParams,
    VabcReport, VabcTiming, WRITE_CHUNK, estimate_vabc_cow, parse_compression, vabc_merge_sequence,
    write_vabc_cow,
};
pub use verity::{
    FEC_BLOCK_SIZE, FEC_MAX_ROOTS, FEC_MIN_ROOTS, HashAlgorithm, Verity, VerityReport, fec_size,
    hash_tree_levels,
};

/// Lower-case hex of `b` (hashes in messages and reports).
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}
