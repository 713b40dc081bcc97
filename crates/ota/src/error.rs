//! The crate's errors. Every message is one line that names what was being read or checked;
//! a wrapped cause is a `#[source]`, never repeated in the message.

use std::io;

use crate::proto::OpType;

/// Result with [`OtaError`].
pub type Result<T, E = OtaError> = std::result::Result<T, E>;

/// An error reading, checking or extracting an OTA.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtaError {
    /// An I/O error on the OTA file.
    #[error("reading the OTA at offset {offset}")]
    Read {
        /// Offset in the payload.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Opening or sizing the OTA file failed.
    #[error("opening the OTA")]
    Open(#[source] io::Error),
    /// The file starts neither with the payload magic `CrAU` nor with a zip header.
    #[error("not an OTA: neither a payload.bin (magic CrAU) nor a zip")]
    NotOta,
    /// The zip's directory could not be read.
    #[error("reading the OTA zip's directory")]
    Zip(#[source] zip::result::ZipError),
    /// The zip has no `payload.bin`.
    #[error("the zip has no payload.bin (not an A/B OTA package)")]
    NoPayloadInZip,
    /// `payload.bin` in the zip is compressed (update_engine reads it in place, stored).
    #[error(
        "payload.bin in the zip is compressed ({method}); A/B OTAs store it uncompressed so it can be read in place"
    )]
    CompressedPayload {
        /// The zip compression method.
        method: String,
    },
    /// `payload.bin` in the zip is encrypted.
    #[error("payload.bin in the zip is encrypted")]
    EncryptedPayload,
    /// A small zip entry (`payload_properties.txt`) could not be read.
    #[error("reading {name} from the zip")]
    ZipEntry {
        /// Entry name.
        name: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than the payload header.
    #[error("payload truncated: {len} bytes, the header alone is {need}")]
    ShortHeader {
        /// Payload length.
        len: u64,
        /// Header length.
        need: u64,
    },
    /// Wrong magic.
    #[error("not a payload: magic {found:02x?}, expected \"CrAU\"")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// Unsupported major version.
    #[error("payload major version {major} is not supported (only 2, Android's)")]
    BadVersion {
        /// The version found.
        major: u64,
    },
    /// A region the header or manifest names lies past the end of the payload.
    #[error("payload truncated: the {what} ends at byte {end}, the payload has {len}")]
    PastEnd {
        /// What the region is (`manifest`, `metadata signature`, `payload signature`).
        what: &'static str,
        /// Where it ends (saturated at `u64::MAX`).
        end: u64,
        /// Payload length.
        len: u64,
    },
    /// The manifest is larger than this reader accepts.
    #[error("manifest of {size} bytes is larger than the limit of {limit}")]
    ManifestTooLarge {
        /// Declared size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The manifest is not a valid `DeltaArchiveManifest`.
    #[error("decoding the manifest")]
    Manifest(#[source] prost::DecodeError),
    /// A signature that `--key` asked to check does not verify (or is absent).
    #[error("the {which} signature does not verify: {why}")]
    NotAuthentic {
        /// `payload` or `metadata`.
        which: &'static str,
        /// Why, in words (absent, no key, no signature matches, malformed blob).
        why: String,
    },
    /// The manifest's block size is unusable.
    #[error("block size {0} is not a power of two between 512 and 1 MiB")]
    BadBlockSize(u32),
    /// `payload_properties.txt` is malformed.
    #[error("payload_properties.txt line {line}: {problem}")]
    PropertiesSyntax {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// `payload_properties.txt` disagrees with the payload.
    #[error("payload_properties.txt: {key} is {expected}, the payload's is {found}")]
    PropertiesMismatch {
        /// The key (`FILE_SIZE`, `FILE_HASH`, `METADATA_SIZE`, `METADATA_HASH`).
        key: &'static str,
        /// The file's value.
        expected: String,
        /// The payload's value.
        found: String,
    },
    /// Reading `payload_properties.txt` beside a bare payload failed.
    #[error("reading {path}")]
    PropertiesFile {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A partition name cannot be used as a file name.
    #[error("partition {name:?} (index {index}): {problem}; refusing to use it as a file name")]
    BadPartitionName {
        /// The name, as the manifest has it.
        name: String,
        /// Index in the manifest.
        index: usize,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// Two partitions share a name.
    #[error("partition {name:?} appears twice in the manifest (indexes {first} and {second})")]
    DuplicatePartition {
        /// The name.
        name: String,
        /// First index.
        first: usize,
        /// Second index.
        second: usize,
    },
    /// A partition asked for is not in the payload.
    #[error("no partition {name:?} in the payload (it has: {available})")]
    UnknownPartition {
        /// The name asked for.
        name: String,
        /// The payload's partitions, comma-separated.
        available: String,
    },
    /// A partition lacks what extraction needs from `new_partition_info`.
    #[error("partition {partition}: new_partition_info has no {missing}")]
    NoPartitionInfo {
        /// Partition name.
        partition: String,
        /// `size` or `hash`.
        missing: &'static str,
    },
    /// `old_partition_info` is unusable.
    #[error("partition {partition}: old_partition_info {problem}")]
    OldPartitionInfo {
        /// Partition name.
        partition: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A partition is larger than this reader accepts.
    #[error("partition {partition}: size {size} is larger than the limit of {limit} bytes")]
    PartitionTooLarge {
        /// Partition name.
        partition: String,
        /// `new_partition_info.size`.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Something is wrong with one operation.
    #[error("partition {partition}, op {index}")]
    Op {
        /// Partition name.
        partition: String,
        /// Index of the operation in the partition.
        index: usize,
        /// What is wrong.
        #[source]
        source: OpError,
    },
    /// The extracted partition does not have the manifest's hash.
    #[error(
        "partition {partition}: SHA-256 {found} does not match new_partition_info's {expected}"
    )]
    PartitionHash {
        /// Partition name.
        partition: String,
        /// Hex SHA-256 from the manifest.
        expected: String,
        /// Hex SHA-256 of the result.
        found: String,
    },
    /// Writing or reading back an output failed.
    #[error("partition {partition}: {doing} the output")]
    Output {
        /// Partition name.
        partition: String,
        /// `sizing`, `writing`, `reading back`.
        doing: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The caller passed a number of outputs other than the number of planned partitions.
    #[error("{given} outputs for {planned} partitions")]
    OutputCount {
        /// Outputs given.
        given: usize,
        /// Partitions planned.
        planned: usize,
    },
    /// The partition's dm-verity hash tree or FEC cannot be computed as its manifest entry
    /// says, or computing it failed.
    #[error("partition {partition}, verity")]
    Verity {
        /// Partition name.
        partition: String,
        /// What is wrong.
        #[source]
        source: VerityError,
    },
    /// A worker thread panicked (a bug).
    #[error("an extraction worker panicked")]
    WorkerPanic,
    /// The caller passed a number of sources other than the number of planned partitions.
    #[error("{given} sources for {planned} partitions")]
    SourceCount {
        /// Sources given.
        given: usize,
        /// Partitions planned.
        planned: usize,
    },
    /// A partition reads its old image, and none was given.
    #[error("partition {partition}: the payload updates the old image, and none was given")]
    NoSource {
        /// Partition name.
        partition: String,
    },
    /// The old image does not have `old_partition_info.size`.
    #[error(
        "partition {partition}: the old image is {found} bytes, old_partition_info.size is {expected}"
    )]
    SourceSize {
        /// Partition name.
        partition: String,
        /// `old_partition_info.size`.
        expected: u64,
        /// The image's size.
        found: u64,
    },
    /// The old image is an Android sparse image (its size cannot match).
    #[error(
        "partition {partition}: the old image is an Android sparse image; expand it first (simg2img)"
    )]
    SourceSparse {
        /// Partition name.
        partition: String,
    },
    /// The old image is shorter than the operations' source extents reach (when the manifest
    /// has no `old_partition_info.size`).
    #[error(
        "partition {partition}: the old image is {len} bytes, the operations read blocks up to byte {need}"
    )]
    SourceTooShort {
        /// Partition name.
        partition: String,
        /// The image's size.
        len: u64,
        /// End of the furthest source extent.
        need: u64,
    },
    /// The old image does not have `old_partition_info.hash`.
    #[error(
        "partition {partition}: the old image's SHA-256 {found} does not match old_partition_info's {expected}"
    )]
    SourceHash {
        /// Partition name.
        partition: String,
        /// Hex SHA-256 from the manifest.
        expected: String,
        /// Hex SHA-256 of the image.
        found: String,
    },
    /// Reading the old image failed.
    #[error("partition {partition}: {doing} the old image")]
    SourceRead {
        /// Partition name.
        partition: String,
        /// `sizing`, `reading`.
        doing: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// What is wrong with a partition's dm-verity hash tree or FEC (inside [`OtaError::Verity`]).
/// Extents are in blocks of the manifest's block size.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerityError {
    /// A field the tree or FEC needs is absent (or an extent is empty).
    #[error("{field} is missing or empty")]
    Missing {
        /// The manifest field.
        field: &'static str,
    },
    /// An extent ends past the partition.
    #[error("{field} (blocks {start}+{count}) ends past the partition's {size} bytes")]
    ExtentPastPartition {
        /// The manifest field.
        field: &'static str,
        /// First block.
        start: u64,
        /// Block count.
        count: u64,
        /// Partition size in bytes.
        size: u64,
    },
    /// The tree or the FEC does not start after the end of its data, as update_engine
    /// requires.
    #[error("{field} starts at block {start}, before the end of {data_field} (block {data_end})")]
    BeforeData {
        /// The output's field (`hash_tree_extent`, `fec_extent`).
        field: &'static str,
        /// Its first block.
        start: u64,
        /// The data's field.
        data_field: &'static str,
        /// First block after the data.
        data_end: u64,
    },
    /// Two areas that must be apart overlap (the FEC would overwrite the tree or its data).
    #[error("{field} overlaps {other}")]
    Overlap {
        /// The field written later.
        field: &'static str,
        /// The field it overlaps.
        other: &'static str,
    },
    /// `hash_tree_algorithm` is not one update_engine knows.
    #[error("hash_tree_algorithm {0:?} is not sha1, sha256 or sha512")]
    UnknownAlgorithm(String),
    /// `hash_tree_extent` is not the size of the tree over its data.
    #[error(
        "hash_tree_extent has {blocks} blocks; a {algorithm} tree over {data_blocks} data blocks has {need}"
    )]
    TreeSize {
        /// Blocks of `hash_tree_extent`.
        blocks: u64,
        /// Blocks the tree has.
        need: u64,
        /// Blocks of `hash_tree_data_extent`.
        data_blocks: u64,
        /// The hash algorithm.
        algorithm: &'static str,
    },
    /// `fec_extent` is not the size of the FEC over its data.
    #[error(
        "fec_extent has {blocks} blocks; FEC with {roots} roots over {data_blocks} data blocks has {need}"
    )]
    FecSize {
        /// Blocks of `fec_extent`.
        blocks: u64,
        /// Blocks the FEC has.
        need: u64,
        /// Blocks of `fec_data_extent`.
        data_blocks: u64,
        /// `fec_roots`.
        roots: u32,
    },
    /// `fec_roots` is outside what libfec and update_engine accept.
    #[error("fec_roots {0} is outside 2..=24")]
    FecRoots(u32),
    /// FEC needs 4096-byte blocks (its interleave is defined for them).
    #[error("FEC needs 4096-byte blocks, the payload's are {0} bytes")]
    FecBlockSize(u32),
    /// The block size is not a power of two of at least 512 bytes.
    #[error("block size {0} is not a power of two of at least 512 bytes")]
    BlockSize(u32),
    /// Reading or writing the partition failed.
    #[error("{doing} at byte {offset}")]
    Io {
        /// What was being done (`reading the FEC's data`, `writing the hash tree`, ...).
        doing: &'static str,
        /// Byte offset in the partition.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A worker thread panicked (a bug).
    #[error("a verity worker panicked")]
    WorkerPanic,
}

/// What is wrong with one operation (inside [`OtaError::Op`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// This build cannot apply the operation type (yet).
    #[error("{op_type} is not supported by {what}")]
    Unsupported {
        /// The type.
        op_type: OpType,
        /// The command that cannot apply it (`extract`).
        what: &'static str,
    },
    /// The operation type number is not one update_engine defines.
    #[error("unknown operation type {0}")]
    UnknownType(i32),
    /// A destination extent ends past the partition.
    #[error(
        "destination extent {extent} (blocks {start}+{count}) ends past the partition's {blocks} blocks"
    )]
    ExtentPastPartition {
        /// Index of the extent in the op.
        extent: usize,
        /// First block.
        start: u64,
        /// Block count.
        count: u64,
        /// Blocks in the partition.
        blocks: u64,
    },
    /// A destination extent overlaps one written before.
    #[error("destination extent {extent} overlaps op {other}'s (block {block})")]
    Overlap {
        /// Index of the extent in this op.
        extent: usize,
        /// The op (same partition) that also writes the block.
        other: usize,
        /// First block written twice.
        block: u64,
    },
    /// The data blob lies past the end of the payload.
    #[error("data blob at {offset}+{length} ends past the payload's data area of {area} bytes")]
    BlobPastEnd {
        /// `data_offset`.
        offset: u64,
        /// `data_length`.
        length: u64,
        /// Bytes in the data area.
        area: u64,
    },
    /// The data blob ends past the start of the payload signature blob (update_engine reads
    /// every blob before it; the payload signature covers only the bytes before it).
    #[error(
        "data blob at {offset}+{length} runs past the payload signature blob at {signatures_offset} of the data area"
    )]
    BlobPastSignature {
        /// `data_offset`.
        offset: u64,
        /// `data_length`.
        length: u64,
        /// The manifest's `signatures_offset`.
        signatures_offset: u64,
    },
    /// The data blob's SHA-256 is not `data_sha256_hash`.
    #[error("data SHA-256 {found} does not match data_sha256_hash {expected}")]
    DataHash {
        /// Hex from the manifest.
        expected: String,
        /// Hex of the blob.
        found: String,
    },
    /// `data_sha256_hash` is not 32 bytes.
    #[error("data_sha256_hash has {0} bytes, not 32")]
    BadHashLength(usize),
    /// The data is larger than the destination (raw) or decompresses past it (a bomb).
    #[error("data {what} more than the {limit} bytes of its destination extents")]
    TooMuchData {
        /// `is` (raw) or `decompresses to` (compressed).
        what: &'static str,
        /// Destination size in bytes.
        limit: u64,
    },
    /// The compressed data could not be decompressed.
    #[error("decompressing {op_type} data")]
    Decode {
        /// The type.
        op_type: OpType,
        /// The decoder's error.
        #[source]
        source: io::Error,
    },
    /// Reading the data blob failed.
    #[error("reading the data blob at payload offset {offset}")]
    Read {
        /// Payload offset.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Writing the destination failed.
    #[error("writing the destination at byte {offset}")]
    Write {
        /// Byte offset in the partition.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A source extent ends past the old partition.
    #[error(
        "source extent {extent} (blocks {start}+{count}) ends past the old partition's {blocks} blocks"
    )]
    SourceExtentPastPartition {
        /// Index of the extent in the op.
        extent: usize,
        /// First block.
        start: u64,
        /// Block count.
        count: u64,
        /// Blocks in the old partition.
        blocks: u64,
    },
    /// `src_sha256_hash` is not 32 bytes.
    #[error("src_sha256_hash has {0} bytes, not 32")]
    BadSourceHashLength(usize),
    /// The old bytes the op reads do not have `src_sha256_hash`.
    #[error("source SHA-256 {found} does not match src_sha256_hash {expected}")]
    SourceHash {
        /// Hex from the manifest.
        expected: String,
        /// Hex of the source extents' bytes.
        found: String,
    },
    /// A SOURCE_COPY whose source and destination differ in size.
    #[error("SOURCE_COPY reads {src} bytes and writes {dst}")]
    CopyLength {
        /// Bytes of the source extents.
        src: u64,
        /// Bytes of the destination extents.
        dst: u64,
    },
    /// A patch operation's source or patch (or a PUFFDIFF's destination) is larger than
    /// this build holds in memory.
    #[error("{what} of {bytes} bytes is more than the limit of {limit} per operation")]
    TooLarge {
        /// `the source`, `the patch` or `the destination`.
        what: &'static str,
        /// Its size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// Memory for the op's source or patch could not be allocated.
    #[error("no memory for {bytes} bytes")]
    NoMemory {
        /// Bytes asked for.
        bytes: u64,
    },
    /// Reading the old image failed.
    #[error("reading the old image at byte {offset}")]
    SourceRead {
        /// Byte offset in the old partition.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The op's bsdiff patch is bad.
    #[error("applying the {op_type} patch")]
    Patch {
        /// SOURCE_BSDIFF or BROTLI_BSDIFF.
        op_type: OpType,
        /// What is wrong with it.
        #[source]
        source: crate::bspatch::PatchError,
    },
    /// The op's PUFFDIFF patch cannot be applied.
    #[error("applying the PUFFDIFF patch")]
    Puffdiff(#[source] crate::puffin::PuffError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_testsupport::errors;

    fn assert_cause_is_source(e: &dyn std::error::Error) {
        errors::assert_cause_is_source(e, Some("disk on fire"));
    }

    #[test]
    fn wrapped_causes_are_sources_not_text() {
        let io = || io::Error::other("disk on fire");
        let op = |source| OtaError::Op {
            partition: "system".into(),
            index: 3,
            source,
        };
        assert_cause_is_source(&OtaError::Read {
            offset: 1,
            source: io(),
        });
        assert_cause_is_source(&OtaError::Open(io()));
        errors::assert_cause_is_source(&OtaError::Zip(zip::result::ZipError::Io(io())), None);
        let bad = <crate::proto::DeltaArchiveManifest as prost::Message>::decode(&[0xffu8][..])
            .unwrap_err();
        errors::assert_cause_is_source(&OtaError::Manifest(bad), None);
        assert_cause_is_source(&OtaError::ZipEntry {
            name: "payload_properties.txt",
            source: io(),
        });
        assert_cause_is_source(&OtaError::PropertiesFile {
            path: "x".into(),
            source: io(),
        });
        assert_cause_is_source(&OtaError::Output {
            partition: "boot".into(),
            doing: "writing",
            source: io(),
        });
        let line = errors::assert_cause_is_source(
            &op(OpError::Read {
                offset: 0,
                source: io(),
            }),
            Some("reading the data blob at payload offset 0"),
        );
        assert_eq!(
            line,
            "partition system, op 3: reading the data blob at payload offset 0: disk on fire"
        );
        assert_cause_is_source(&OpError::Decode {
            op_type: OpType::ReplaceXz,
            source: io(),
        });
        assert_cause_is_source(&OpError::Read {
            offset: 0,
            source: io(),
        });
        assert_cause_is_source(&OpError::Write {
            offset: 0,
            source: io(),
        });
        assert_cause_is_source(&OpError::SourceRead {
            offset: 0,
            source: io(),
        });
        assert_cause_is_source(&OtaError::SourceRead {
            partition: "system".into(),
            doing: "reading",
            source: io(),
        });
        let line = errors::assert_cause_is_source(
            &op(OpError::Patch {
                op_type: OpType::BrotliBsdiff,
                source: crate::bspatch::PatchError::Decode {
                    stream: "diff",
                    source: io(),
                },
            }),
            Some("applying the BROTLI_BSDIFF patch"),
        );
        assert_cause_is_source(&crate::bspatch::PatchError::Decode {
            stream: "diff",
            source: io(),
        });
        assert_eq!(
            line,
            "partition system, op 3: applying the BROTLI_BSDIFF patch: decompressing the diff stream: disk on fire"
        );
        let v = OtaError::Verity {
            partition: "system".into(),
            source: VerityError::Io {
                doing: "writing the FEC",
                offset: 8192,
                source: io(),
            },
        };
        if let OtaError::Verity { source, .. } = &v {
            assert_cause_is_source(source);
        }
        let line = errors::assert_cause_is_source(&v, Some("writing the FEC at byte 8192"));
        assert_eq!(
            line,
            "partition system, verity: writing the FEC at byte 8192: disk on fire"
        );
        let line = errors::assert_cause_is_source(
            &op(OpError::Puffdiff(crate::puffin::PuffError::Bspatch(
                Box::new(crate::bspatch::PatchError::Decode {
                    stream: "extra",
                    source: io(),
                }),
            ))),
            Some("applying the PUFFDIFF patch"),
        );
        assert_eq!(
            line,
            "partition system, op 3: applying the PUFFDIFF patch: applying the PUFFDIFF's inner bsdiff patch: decompressing the extra stream: disk on fire"
        );
    }
}
