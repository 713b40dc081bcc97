//! Typed errors for every way a COW file (or a request against it) can be wrong.

use crate::codec::Compression;

/// Everything the reader, writer and generator can report.
///
/// Parsing errors name the op index (position in the file's op stream / op array) and, where it
/// helps, the absolute file offset of the record or payload involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CowError {
    /// The cause is the `source`, not part of the message: a report of the chain
    /// (`{:#}`) prints it once.
    #[error("I/O error at offset {offset}")]
    Io {
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("truncated file: {what} needs {need} bytes at offset {offset}, file has {len}")]
    Truncated {
        what: &'static str,
        offset: u64,
        need: u64,
        len: u64,
    },
    #[error("bad magic {found:#018x} at offset 0 (expected 0x436f77634f572121)")]
    BadMagic { found: u64 },
    #[error("unsupported COW version {major}.{minor}")]
    UnsupportedVersion { major: u16, minor: u16 },
    #[error("bad header field {field} = {value}: {reason}")]
    BadHeader {
        field: &'static str,
        value: u64,
        reason: &'static str,
    },
    #[error("op {index} at offset {offset}: unknown op type {op_type}")]
    UnknownOpType {
        index: u64,
        offset: u64,
        op_type: u8,
    },
    #[error("op {index} at offset {offset}: {reason}")]
    BadOp {
        index: u64,
        offset: u64,
        reason: &'static str,
    },
    #[error("op {index} at offset {offset}: unknown compression id {id}")]
    UnknownCompression { index: u64, offset: u64, id: u64 },
    #[error("op {index}: compression {found:?} differs from the file's {file:?} (mixed codecs)")]
    MixedCompression {
        index: u64,
        file: Compression,
        found: Compression,
    },
    #[error("op {index}: block {block} is past the device end ({device_blocks} blocks)")]
    OpPastDevice {
        index: u64,
        block: u64,
        device_blocks: u64,
    },
    #[error(
        "op {index}: payload [{offset}, +{len}) is past the end of the file ({file_len} bytes)"
    )]
    PayloadPastEnd {
        index: u64,
        offset: u64,
        len: u64,
        file_len: u64,
    },
    #[error("op {index}: payload of {len} bytes is larger than its {limit}-byte unit")]
    PayloadTooLarge { index: u64, len: u64, limit: u64 },
    #[error("op {index}: uncompressed payload of {len} bytes is shorter than its {unit}-byte unit")]
    RawPayloadTooShort { index: u64, len: u64, unit: u64 },
    #[error("op {index}: payload [{offset}, +{len}) lies outside the data region [{start}, {end})")]
    PayloadOutsideData {
        index: u64,
        offset: u64,
        len: u64,
        start: u64,
        end: u64,
    },
    #[error(
        "op {index}: sequence data reaches {entries} entries, more than the {limit} data ops the rest of the file can hold"
    )]
    SequenceTooLong {
        index: u64,
        entries: u64,
        limit: u64,
    },
    #[error(
        "op {index}: SEQUENCE payload at offset {offset} overlaps the previous one (ends at {prev_end})"
    )]
    SequenceOverlap {
        index: u64,
        offset: u64,
        prev_end: u64,
    },
    #[error("op {index} (payload at offset {offset}): {codec:?} payload is corrupt: {reason}")]
    Corrupt {
        index: u64,
        offset: u64,
        codec: Compression,
        reason: String,
    },
    #[error(
        "op {index} (payload at offset {offset}): payload decodes to more than its {unit}-byte unit"
    )]
    DecodedTooLong { index: u64, offset: u64, unit: u64 },
    #[error(
        "op {index} (payload at offset {offset}): payload decodes to {got} bytes, expected {unit}"
    )]
    DecodedTooShort {
        index: u64,
        offset: u64,
        got: u64,
        unit: u64,
    },
    #[error("op {index}: new block {block} is already written by op {first}")]
    DuplicateTarget { index: u64, block: u64, first: u64 },
    #[error("sequence entry {entry}: block {block}: {reason}")]
    BadSequence {
        entry: u64,
        block: u64,
        reason: &'static str,
    },
    #[error("no footer found (op stream walked to offset {offset}; file has {len} bytes)")]
    MissingFooter { offset: u64, len: u64 },
    #[error("footer at offset {offset}: {field} is {found}, walked stream says {expected}")]
    FooterMismatch {
        offset: u64,
        field: &'static str,
        found: u64,
        expected: u64,
    },
    #[error("label {label} not found")]
    LabelNotFound { label: u64 },
    #[error("merge order position {position} (op {index}, new block {block}): {reason}")]
    MergeOrder {
        position: u64,
        index: u64,
        block: u64,
        reason: String,
    },
    #[error("base image too short: need {need} bytes at offset {offset}")]
    BaseShort { offset: u64, need: u64 },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("v3 op array is full ({max} ops)")]
    TooManyOps { max: u64 },
}

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, CowError>;

pub(crate) fn io_at(offset: u64) -> impl FnOnce(std::io::Error) -> CowError {
    move |source| CowError::Io { offset, source }
}

#[cfg(test)]
mod tests {
    use super::*;

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
