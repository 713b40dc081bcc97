//! Errors of the VABC COW writer.

use std::io;

/// An error writing a partition's Virtual A/B COW.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VabcError {
    /// The manifest's VABC parameters cannot be written (COW version, compression, factor).
    #[error("VABC parameters: {0}")]
    Params(String),
    /// The manifest's compression level is outside its algorithm's range.
    #[error("VABC parameters: compression level")]
    Level(#[source] snapblk_cow::LevelError),
    /// A merge operation is malformed or does not fit the partition.
    #[error("merge operation {index}: {reason}")]
    MergeOp {
        /// Index in `merge_operations`.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// An install operation cannot be turned into COW ops (extents outside the partition,
    /// source and destination lengths that differ, an XOR read past the source's end).
    #[error("operation {index}: {reason}")]
    Operation {
        /// Index in the partition's operations.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A dm-verity hash tree or FEC extent lies outside the new partition.
    #[error("verity extent {start}+{blocks} outside the new partition ({new_blocks} blocks)")]
    Verity {
        /// First block.
        start: u64,
        /// Blocks.
        blocks: u64,
        /// Blocks of the new partition.
        new_blocks: u64,
    },
    /// Reading the old (source) image failed.
    #[error("reading the old image at offset {offset}")]
    ReadSource {
        /// Byte offset.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Reading the new (target) image failed.
    #[error("reading the new image at offset {offset}")]
    ReadTarget {
        /// Byte offset.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The partition has operations that read the old image, and none was given.
    #[error("operation {index} reads the old image, and none was given")]
    NoSource {
        /// Index in the partition's operations.
        index: usize,
    },
    /// The COW writer refused a call or its sink failed (an op area too small for the ops
    /// counts as the COW not fitting).
    #[error("writing the COW")]
    Cow(#[source] snapblk_cow::CowError),
}

impl From<snapblk_cow::CowError> for VabcError {
    fn from(e: snapblk_cow::CowError) -> Self {
        VabcError::Cow(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_testsupport::errors;

    /// A compression level out of range in the manifest is refused with the COW library's
    /// typed error as the source (the encoders would have clamped it).
    #[test]
    fn an_out_of_range_level_is_refused_with_the_cause_as_source() {
        for (param, text) in [
            ("gz,10", "gz level 10 is out of range: gz levels are 0 to 9"),
            (
                "brotli,12",
                "brotli level 12 is out of range: brotli levels are 0 to 11",
            ),
        ] {
            let e = crate::parse_compression(param).unwrap_err();
            assert!(matches!(e, VabcError::Level(_)), "{param}: {e:?}");
            errors::assert_cause_is_source(&e, Some(text));
        }
        assert_eq!(crate::parse_compression("gz,9").unwrap().level, Some(9));
        assert_eq!(crate::parse_compression("zstd,-5").unwrap().level, Some(-5));
    }
}
