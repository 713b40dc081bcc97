//! Typed errors for every way a COW file (or a request against it) can be wrong.

use crate::codec::Compression;

/// Everything the reader, writer and generator can report.
///
/// Parsing errors name the op index (position in the file's op stream / op array) and, where it
/// helps, the absolute file offset of the record or payload involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CowError {
    /// A read, write, size query or sync on the COW file, the base image or another file the
    /// caller passed failed.
    ///
    /// The cause is the `source`, not part of the message: a report of the chain
    /// (`{:#}`) prints it once.
    #[error("I/O error at offset {offset}")]
    Io {
        /// Byte offset in that file where the failing read or write started. Calls without a
        /// position (open, size query, sync, truncate) give the offset of the data they
        /// concern, most often 0.
        offset: u64,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A structure runs past the end of its file: the COW header, scratch area, v3 sequence
    /// area, resume area or op array, an op record, or a header or chunk of an Android sparse
    /// image.
    #[error("truncated file: {what} needs {need} bytes at offset {offset}, file has {len}")]
    Truncated {
        /// The structure, e.g. `"header"`, `"op record"`, `"resume area"`,
        /// `"sparse RAW chunk"`.
        what: &'static str,
        /// Absolute byte offset where the structure starts.
        offset: u64,
        /// Bytes it needs from `offset`.
        need: u64,
        /// Length of the file in bytes (for a header parsed from a buffer, the buffer's).
        len: u64,
    },
    /// The first 8 bytes are not the COW magic (`"!!WOcwoC"` on disk): the file is not a COW.
    #[error("bad magic {found:#018x} at offset 0 (expected 0x436f77634f572121)")]
    BadMagic {
        /// The little-endian u64 read at offset 0.
        found: u64,
    },
    /// The header's version is not one this crate reads: `major` must be 1, 2 or 3 and
    /// `minor` 0, as libsnapshot requires.
    #[error("unsupported COW version {major}.{minor}")]
    UnsupportedVersion {
        /// `major_version` (header offset 8).
        major: u16,
        /// `minor_version` (header offset 10).
        minor: u16,
    },
    /// A header field is out of range or does not fit the version: `header_size` for the
    /// version, `block_size` not a power of two in 512..=32768, `footer_size`, `op_size` or
    /// `cluster_ops` not what the version requires, an unknown v3 `compression_algorithm`, a
    /// `max_compression_size` that is no power of two between the block size and 256 KiB,
    /// `op_count` above `op_count_max`, or a v3 resume point naming more ops than `op_count`.
    #[error("bad header field {field} = {value}: {reason}")]
    BadHeader {
        /// The field, named as in [`Header`](crate::format::Header) (or
        /// `"resume_point.op_index"`).
        field: &'static str,
        /// The value found.
        value: u64,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// An op record's type is none the format defines (1..=7 for data and metadata ops, 255
    /// for the v2 footer).
    #[error("op {index} at offset {offset}: unknown op type {op_type}")]
    UnknownOpType {
        /// Index of the record: v2, its position in the op stream counting LABEL, CLUSTER and
        /// SEQUENCE records; v3, its slot in the op array.
        index: u64,
        /// Absolute file offset of the record.
        offset: u64,
        /// The type found (v2: byte 0 of the record; v3: bits 60..63 of `source_info`).
        op_type: u8,
    },
    /// An op record breaks a rule of its type. v2: a payload length or compression on a type
    /// without payload, `new_block` ≥ 2^32 or `source` ≥ 2^48, a CLUSTER or SEQUENCE op in an
    /// unclustered file, a SEQUENCE op after a data op or with a compressed or misaligned
    /// payload, a footer whose `data_length` is not 64, stream positions that overflow. v3:
    /// reserved `source_info` bits set, compression bits on an op other than REPLACE or above
    /// `max_compression_size`, a payload length on COPY/ZERO, a REPLACE whose `source` is not
    /// the running payload position, a metadata type in the op array. Both: an empty data
    /// payload.
    ///
    /// Also reports a malformed Android sparse image ([`load_image`](crate::load_image)): then
    /// `index` is 0 and `offset` is where the bad header field or chunk header is.
    #[error("op {index} at offset {offset}: {reason}")]
    BadOp {
        /// Index of the record (see [`UnknownOpType`](Self::UnknownOpType)).
        index: u64,
        /// Absolute file offset of the record.
        offset: u64,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// A v2 op record's compression byte is no algorithm id libsnapshot defines (0..=4, see
    /// [`Compression`]). An unknown v3 file-wide algorithm is a [`BadHeader`](Self::BadHeader).
    #[error("op {index} at offset {offset}: unknown compression id {id}")]
    UnknownCompression {
        /// Index of the record in the op stream.
        index: u64,
        /// Absolute file offset of the record.
        offset: u64,
        /// The id found (byte 1 of the record).
        id: u64,
    },
    /// Compressed ops of a v2 file use two algorithms. libsnapshot takes one file-wide
    /// algorithm from the first compressed op, so Android cannot read such a file.
    #[error("op {index}: compression {found:?} differs from the file's {file:?} (mixed codecs)")]
    MixedCompression {
        /// Index of the op whose algorithm differs.
        index: u64,
        /// The algorithm of the file's first compressed op.
        file: Compression,
        /// This op's algorithm.
        found: Compression,
    },
    /// An op names a block past the end of a device: a new block at or past
    /// [`OpenOptions::device_blocks`](crate::OpenOptions::device_blocks), a COPY/XOR source at or
    /// past [`OpenOptions::base_blocks`](crate::OpenOptions::base_blocks), or (in
    /// [`verify`](crate::verify) and [`simulate_merge`](crate::simulate_merge)) a block outside
    /// the base or image being checked or merged.
    #[error("op {index}: block {block} is past the device end ({device_blocks} blocks)")]
    OpPastDevice {
        /// Index of the op.
        index: u64,
        /// A block the op reaches that lies outside: its last new block, or its last base
        /// block when the source is out of range.
        block: u64,
        /// Size in blocks of the device checked against (new image or base).
        device_blocks: u64,
    },
    /// An op's payload reaches past the end of the COW file.
    #[error(
        "op {index}: payload [{offset}, +{len}) is past the end of the file ({file_len} bytes)"
    )]
    PayloadPastEnd {
        /// Index of the op.
        index: u64,
        /// Absolute file offset of the payload.
        offset: u64,
        /// Stored payload length in bytes (`data_length`).
        len: u64,
        /// Length of the COW file in bytes.
        file_len: u64,
    },
    /// A payload is longer than it may be: a v3 payload longer than its unit
    /// (`block_size << compression bits`), a raw v2 payload longer than a block, or a v2
    /// SEQUENCE payload longer than two blocks (2048 entries at 4 KiB).
    #[error("op {index}: payload of {len} bytes is larger than its {limit}-byte unit")]
    PayloadTooLarge {
        /// Index of the op.
        index: u64,
        /// Stored payload length in bytes.
        len: u64,
        /// The most bytes the payload may have.
        limit: u64,
    },
    /// A payload of an uncompressed file is shorter than its unit. Raw payloads are served
    /// byte for byte, so a short one would expose the bytes after it.
    #[error("op {index}: uncompressed payload of {len} bytes is shorter than its {unit}-byte unit")]
    RawPayloadTooShort {
        /// Index of the op.
        index: u64,
        /// Stored payload length in bytes.
        len: u64,
        /// Unit size in bytes (`block_size << compression bits`; the block size in v2).
        unit: u64,
    },
    /// A v2 payload lies outside the data region: it starts in the header or scratch area
    /// (which a merge overwrites), or it reaches past the footer (where an appender writes).
    #[error("op {index}: payload [{offset}, +{len}) lies outside the data region [{start}, {end})")]
    PayloadOutsideData {
        /// Index of the op.
        index: u64,
        /// Absolute file offset of the payload.
        offset: u64,
        /// Stored payload length in bytes.
        len: u64,
        /// Start of the data region: `header_size + buffer_size` (byte offset).
        start: u64,
        /// End of the data region: the footer's offset, or the file length when the payload
        /// starts too early.
        end: u64,
    },
    /// The SEQUENCE ops of a v2 file list more entries than there can be data ops after them
    /// (every entry names a distinct data op, each with its own 20-byte record later in the
    /// file). Checked before the entries are read, which bounds memory by the file size.
    #[error(
        "op {index}: sequence data reaches {entries} entries, more than the {limit} data ops the rest of the file can hold"
    )]
    SequenceTooLong {
        /// Index of the SEQUENCE op that goes over.
        index: u64,
        /// Entries of all SEQUENCE ops so far, this one included.
        entries: u64,
        /// Op records that fit between this op and the end of the file.
        limit: u64,
    },
    /// A v2 SEQUENCE payload starts before the previous SEQUENCE payload ends. Disjoint
    /// payloads keep the sequence no larger than the file.
    #[error(
        "op {index}: SEQUENCE payload at offset {offset} overlaps the previous one (ends at {prev_end})"
    )]
    SequenceOverlap {
        /// Index of the SEQUENCE op.
        index: u64,
        /// Absolute file offset of its payload.
        offset: u64,
        /// File offset just past the previous SEQUENCE payload.
        prev_end: u64,
    },
    /// The codec rejected a payload: it is not a valid stream of the file's algorithm.
    #[error("op {index} (payload at offset {offset}): {codec:?} payload is corrupt")]
    Corrupt {
        /// Index of the op.
        index: u64,
        /// Absolute file offset of the payload.
        offset: u64,
        /// The algorithm it was decoded with.
        codec: Compression,
        /// The decoder's own error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A payload decodes to more bytes than its unit (every payload decodes to exactly one
    /// unit).
    #[error(
        "op {index} (payload at offset {offset}): payload decodes to more than its {unit}-byte unit"
    )]
    DecodedTooLong {
        /// Index of the op.
        index: u64,
        /// Absolute file offset of the payload.
        offset: u64,
        /// Unit size in bytes.
        unit: u64,
    },
    /// A payload decodes to fewer bytes than its unit, or a raw payload is shorter than it.
    #[error(
        "op {index} (payload at offset {offset}): payload decodes to {got} bytes, expected {unit}"
    )]
    DecodedTooShort {
        /// Index of the op.
        index: u64,
        /// Absolute file offset of the payload.
        offset: u64,
        /// Bytes the payload produced (for a raw payload, its stored length).
        got: u64,
        /// Unit size in bytes.
        unit: u64,
    },
    /// Two data ops write the same new block and
    /// [`OpenOptions::duplicates`](crate::OpenOptions::duplicates) does not settle it: the
    /// policy is [`Reject`](crate::DuplicatePolicy::Reject), or the two ops cover different
    /// block runs (a multi-block REPLACE overlapping another op), which no policy settles.
    #[error("op {index}: new block {block} is already written by op {first}")]
    DuplicateTarget {
        /// Index of the later op in file order.
        index: u64,
        /// First new block both ops write.
        block: u64,
        /// Index of the earlier op in file order.
        first: u64,
    },
    /// A sequence entry (v2 SEQUENCE payloads, v3 sequence area) does not name a data op of
    /// its own: no data op starts at that block, or the block is listed twice.
    #[error("sequence entry {entry}: block {block}: {reason}")]
    BadSequence {
        /// Position of the entry in the whole sequence (0-based, across SEQUENCE ops).
        entry: u64,
        /// The new block it names.
        block: u64,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A v2 file opened without a label has no footer: the op stream reached the end of the
    /// file before a FOOTER record, as in a file whose writer never finalized it. Such a file
    /// can still be opened at a label ([`OpenOptions::label`](crate::OpenOptions::label)).
    #[error("no footer found (op stream walked to offset {offset}; file has {len} bytes)")]
    MissingFooter {
        /// File offset where the next record would have started.
        offset: u64,
        /// Length of the file in bytes.
        len: u64,
    },
    /// The v2 footer's counts differ from the op stream walked before it.
    #[error("footer at offset {offset}: {field} is {found}, walked stream says {expected}")]
    FooterMismatch {
        /// Absolute file offset of the footer.
        offset: u64,
        /// `"num_ops"` (records before the footer) or `"ops_size"` (those records' bytes).
        field: &'static str,
        /// The value in the footer.
        found: u64,
        /// The value the walk counted.
        expected: u64,
    },
    /// [`OpenOptions::label`](crate::OpenOptions::label) names a label the file does not have:
    /// no v2 LABEL op with that value, or no v3 resume point (only the last
    /// `resume_point_max` labels are kept).
    #[error("label {label} not found")]
    LabelNotFound {
        /// The label asked for.
        label: u64,
    },
    /// The merge order breaks a rule an in-place merge relies on
    /// ([`CowReader::verify_merge_order`](crate::CowReader::verify_merge_order)): a COPY/XOR
    /// op comes after a REPLACE/ZERO op, or reads a base block an earlier op of the order
    /// has already overwritten.
    #[error("merge order position {position} (op {index}, new block {block}): {reason}")]
    MergeOrder {
        /// Position of the op in the merge order (0-based).
        position: u64,
        /// Index of the op in the file.
        index: u64,
        /// The op's new block.
        block: u64,
        /// Which rule it breaks, with the blocks involved.
        reason: String,
    },
    /// The base image ends before bytes the COW reads from it: a COPY or XOR source, or an
    /// unchanged block of the new image.
    #[error("base image too short: need {need} bytes at offset {offset}")]
    BaseShort {
        /// Byte offset in the base.
        offset: u64,
        /// Bytes needed from there.
        need: u64,
    },
    /// The caller asked for something invalid: writer options or calls out of range or out
    /// of order, a buffer of the wrong size, an image larger than allowed or than memory
    /// holds, or (in [`verify`](crate::verify)) an expected image that differs.
    /// The text says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The writer's codec asks for a level its algorithm does not have
    /// ([`Codec::checked`](crate::Codec::checked)); nothing was written.
    #[error("checking the writer's codec")]
    Level(#[from] crate::LevelError),
    /// A v3 writer was given more ops than the op slots it reserved at creation
    /// ([`WriterOptions::op_count_max`](crate::WriterOptions::op_count_max)).
    #[error("v3 op array is full ({max} ops)")]
    TooManyOps {
        /// The number of op slots (`op_count_max`).
        max: u64,
    },
}

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, CowError>;

pub(crate) fn io_at(offset: u64) -> impl FnOnce(std::io::Error) -> CowError {
    move |source| CowError::Io { offset, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn io_error_chain_prints_the_cause_once() {
        let e = io_at(0)(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(e.to_string(), "I/O error at offset 0");
        let chain = anyhow_like_chain(&e);
        assert_eq!(
            chain,
            "I/O error at offset 0: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_corrupt_payload_keeps_the_decoder_error_as_source() {
        let mut out = [0u8; 4096];
        let Err(crate::DecodeError::Corrupt(source)) =
            crate::decompress(crate::Compression::Gz, b"not zlib at all", &mut out)
        else {
            panic!("garbage decoded");
        };
        let cause = source.to_string();
        let e = CowError::Corrupt {
            index: 7,
            offset: 4096,
            codec: crate::Compression::Gz,
            source,
        };
        assert_eq!(
            e.to_string(),
            "op 7 (payload at offset 4096): Gz payload is corrupt"
        );
        assert_eq!(e.source().map(|s| s.to_string()), Some(cause.clone()));
        assert_eq!(anyhow_like_chain(&e), format!("{e}: {cause}"));
    }

    #[test]
    fn a_level_out_of_range_is_the_source() {
        let level = crate::Codec {
            algo: crate::Compression::Gz,
            level: Some(10),
        }
        .checked()
        .unwrap_err();
        let e = CowError::from(level.clone());
        assert_eq!(e.source().map(|s| s.to_string()), Some(level.to_string()));
        assert_eq!(
            anyhow_like_chain(&e),
            "checking the writer's codec: gz level 10 is out of range: gz levels are 0 to 9"
        );
    }

    /// What `format!("{:#}", anyhow::Error::from(e))` prints: each error in the chain once.
    fn anyhow_like_chain(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut cur = e.source();
        while let Some(c) = cur {
            s.push_str(": ");
            s.push_str(&c.to_string());
            cur = c.source();
        }
        s
    }
}
