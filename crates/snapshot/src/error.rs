//! The crate's typed error.

/// Everything that can go wrong in the snapshot layer.
#[derive(Debug, thiserror::Error)]
pub enum SnapError {
    /// An I/O error from the base or COW device (errno preserved for the C ABI).
    #[error("{what}")]
    Io {
        /// What was being done, e.g. "reading base" (the whole display message).
        what: &'static str,
        /// The device's error, carrying the errno the C ABI returns.
        #[source]
        source: snapblk_core::Error,
    },
    /// The COW file could not be parsed: the COW reader's error, with its op index and offset.
    #[error("invalid COW")]
    Cow(#[from] snapblk_cow::CowError),
    /// The COW is inconsistent with the snapshot layer's own rules or with the device.
    #[error("invalid COW: {0}")]
    Format(String),
    /// The background merge thread could not be started.
    #[error("starting the merge thread")]
    MergeThread(#[source] std::io::Error),
    /// The merge order violates the rules a safe in-place merge relies on (format §9.2).
    #[error("merge refused: {0}")]
    MergeOrder(String),
    /// The scratch area holds a staged window that does not match the merge order.
    #[error("scratch area inconsistent with merge order: {0}")]
    Scratch(String),
    /// A write to a read-only snapshot.
    #[error("snapshot is read-only")]
    ReadOnly,
    /// A request outside the device.
    #[error("request out of range: offset {offset} len {len} capacity {capacity}")]
    Range {
        /// Byte offset of the request on the device.
        offset: u64,
        /// Length of the request in bytes.
        len: u64,
        /// Size of the snapshot device in bytes (the new image's size).
        capacity: u64,
    },
    /// The merge stash is unusable for this merge (another COW's, damaged, or not matching
    /// the base).
    #[error("merge stash {}: {what}", path.display())]
    Stash {
        /// The stash file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// The merge stash could not be read or written.
    #[error("{what} {}", path.display())]
    StashIo {
        /// The stash file.
        path: std::path::PathBuf,
        /// What was being done.
        what: &'static str,
        /// The file system's error.
        #[source]
        source: std::io::Error,
    },
    /// A block of the XOR op that reads its own destination and was next to merge when a merge
    /// with a stash stopped: only that stash knows whether the base still holds its source.
    #[error(
        "this block belongs to the merge step that was next when a stashed merge stopped; it is readable once the merge resumes with its stash (snapblk merge --stash FILE)"
    )]
    InFlight,
    /// The merge was stopped on request.
    #[error("merge interrupted")]
    Interrupted,
    /// A merge window failed earlier; the snapshot stays readable but that window errors.
    #[error("merge failed earlier; merged blocks of the failed window are unavailable")]
    MergeFailed,
    /// Payload decoding failed.
    #[error("{codec:?} payload at COW offset {offset} does not decode")]
    Decode {
        /// Byte offset of the payload in the COW file.
        offset: u64,
        /// The payload's compression.
        codec: crate::map::Codec,
        /// The decoder's error.
        #[source]
        source: snapblk_cow::DecodeError,
    },
    /// A compressed payload is larger than any unit can encode to (bounded before allocating).
    #[error("payload at COW offset {offset}: {len} bytes is larger than any unit encodes to")]
    PayloadTooLarge {
        /// Byte offset of the payload in the COW file.
        offset: u64,
        /// Its stored length in bytes.
        len: u32,
    },
    /// An uncompressed payload is shorter than its unit.
    #[error("payload at COW offset {offset}: {len} bytes do not fill a {unit}-byte unit")]
    PayloadShort {
        /// Byte offset of the payload in the COW file.
        offset: u64,
        /// Its stored length in bytes.
        len: u32,
        /// The unit it must fill, in bytes.
        unit: u32,
    },
    /// A block of the new image does not match the COW record's digest.
    #[error(
        "block {block} of the new image does not match the COW record (corrupt COW or wrong base)"
    )]
    Corrupt {
        /// The new-image block (in COW block-size units) whose data failed the digest check.
        block: u64,
    },
    /// The base is not the one the COW record says the COW was made for (or that its merge
    /// belongs to).
    #[error("{0}")]
    WrongBase(String),
    /// The COW record could not be used (damaged, stale, unreadable).
    #[error("COW record {}", path.display())]
    Record {
        /// Path of the COW record file.
        path: std::path::PathBuf,
        /// Why the record was rejected.
        #[source]
        source: snapblk_cow::record::RecordError,
    },
    /// The check of a merge against the attached COW record failed.
    #[error("checking the base against the COW record")]
    RecordCheck(#[source] snapblk_cow::record::RecordError),
    /// Bad configuration (device spec, properties).
    #[error("{0}")]
    Config(String),
    /// The base is shorter than the blocks the COW reads or writes (a truncated, empty or wrong
    /// base). `base` names it ("base PATH", or "the base").
    #[error(
        "{base} is {size} bytes; the COW reads/writes up to block {block} (needs at least {needed} bytes)"
    )]
    BaseTooShort {
        /// How the message names the base: "base PATH", or "the base" when no path is known.
        base: String,
        /// The base's actual size in bytes.
        size: u64,
        /// The highest block (COW block-size units) the COW reads from or writes to.
        block: u64,
        /// The smallest base size in bytes that covers `block`.
        needed: u64,
    },
    /// The COW writes past the base end while every block it reads lies inside the base: the new
    /// image is larger than the base (a growing update), which must be grown first. `how` says
    /// how (for a regular file, the `truncate` command).
    #[error(
        "the new image is larger than {base} ({size} bytes): the COW writes up to block {block}, so the base must be grown to at least {needed} bytes first ({how})"
    )]
    BaseSmallerThanNewImage {
        /// How the message names the base: "base PATH", or "the base" when no path is known.
        base: String,
        /// The base's actual size in bytes.
        size: u64,
        /// The highest block (COW block-size units) the COW writes.
        block: u64,
        /// The base size in bytes the new image needs (covers `block`).
        needed: u64,
        /// A hint for growing the base: a `truncate -s` command for a regular file, otherwise
        /// generic advice.
        how: String,
    },
    /// A directory where the base (or the COW) file was expected.
    #[error("{what} {path} is a directory")]
    IsDirectory {
        /// Which file it should have been: "base" or "COW".
        what: &'static str,
        /// The path given for it.
        path: std::path::PathBuf,
    },
    /// The pre-merge check found a payload of an op still to merge that does not decode: the
    /// merge is refused before its first write.
    #[error(
        "merge refused (nothing written): op {op} (new block {block}): payload at COW offset {offset} does not decode"
    )]
    UndecodablePayload {
        /// Index of the op in the COW's merge order (the map's op list).
        op: usize,
        /// The op's first new-image block (COW block-size units).
        block: u64,
        /// Byte offset of the payload in the COW file.
        offset: u64,
        /// The decoder's error.
        #[source]
        source: snapblk_cow::DecodeError,
    },
    /// The pre-merge check found an op the merge could not carry out (outside the device or
    /// the base, a payload outside the COW or shorter than its blocks): refused before the
    /// first write.
    #[error("merge refused (nothing written): op {op} (new block {block}): {reason}")]
    OpOutOfBounds {
        /// Index of the op in the COW's merge order (the map's op list).
        op: usize,
        /// The op's first new-image block (COW block-size units).
        block: u64,
        /// Which bound it breaks, in words (e.g. "writes past the device end (N blocks)").
        reason: String,
    },
}

impl SnapError {
    /// Wrap a device's error (a [`snapblk_core::Error`], or an `io::Error` of the positional
    /// I/O family, converted keeping its errno) with what was being done.
    pub fn io<E: Into<snapblk_core::Error>>(what: &'static str) -> impl FnOnce(E) -> SnapError {
        move |source| SnapError::Io {
            what,
            source: source.into(),
        }
    }

    /// The errno a C caller should see.
    pub fn errno(&self) -> i32 {
        match self {
            SnapError::Io { source, .. } => source.errno,
            SnapError::MergeThread(source) => source.raw_os_error().unwrap_or(libc::EAGAIN),
            SnapError::ReadOnly => libc::EROFS,
            SnapError::Range { .. } | SnapError::Config(_) => libc::EINVAL,
            SnapError::Interrupted => libc::EINTR,
            _ => libc::EIO,
        }
    }
}

/// The C ABI has one message per error: the whole chain, each cause once.
impl From<SnapError> for snapblk_core::Error {
    fn from(e: SnapError) -> Self {
        snapblk_core::Error::from_chain(e.errno(), &e)
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, SnapError>;

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_core::Chain;
    use snapblk_testsupport::errors::assert_cause_is_source;
    use std::error::Error as _;

    #[test]
    fn every_wrapping_variant_keeps_its_cause_as_source_only() {
        let io = || std::io::Error::from_raw_os_error(libc::ENOENT);
        let io_text = io().to_string();
        let cases: Vec<(SnapError, String)> = vec![
            (
                SnapError::io("reading COW header")(snapblk_core::Error::new(
                    libc::EIO,
                    "short read at offset 0",
                )),
                "short read at offset 0".into(),
            ),
            (
                SnapError::Cow(snapblk_cow::CowError::BadMagic { found: 7 }),
                snapblk_cow::CowError::BadMagic { found: 7 }.to_string(),
            ),
            (SnapError::MergeThread(io()), io_text.clone()),
            (
                SnapError::Record {
                    path: "x.snapblk".into(),
                    source: snapblk_cow::record::RecordError::Version(9),
                },
                snapblk_cow::record::RecordError::Version(9).to_string(),
            ),
            (
                SnapError::RecordCheck(snapblk_cow::record::RecordError::Version(9)),
                snapblk_cow::record::RecordError::Version(9).to_string(),
            ),
            (
                SnapError::UndecodablePayload {
                    op: 1,
                    block: 2,
                    offset: 3,
                    source: snapblk_cow::DecodeError::TooShort(5),
                },
                "the stream decodes to 5 bytes, short of its unit".into(),
            ),
        ];
        for (e, cause) in &cases {
            assert_cause_is_source(e, Some(cause));
        }
    }

    #[test]
    fn a_cow_error_keeps_its_op_index_and_offset() {
        let e = SnapError::from(snapblk_cow::CowError::UnknownOpType {
            index: 5,
            offset: 4096,
            op_type: 99,
        });
        let Some(snapblk_cow::CowError::UnknownOpType { index, offset, .. }) = e
            .source()
            .and_then(|s| s.downcast_ref::<snapblk_cow::CowError>())
        else {
            panic!("{e:?}");
        };
        assert_eq!((*index, *offset), (5, 4096));
        assert_eq!(
            Chain(&e).to_string(),
            "invalid COW: op 5 at offset 4096: unknown op type 99"
        );
    }

    #[test]
    fn io_error_chain_prints_the_cause_once() {
        let cause = snapblk_core::Error::new(libc::EIO, "short read at offset 0");
        let e = SnapError::io("reading COW header")(cause);
        assert_eq!(
            Chain(&e).to_string(),
            "reading COW header: short read at offset 0"
        );
        // The C ABI has one message: the whole chain, and the cause's errno.
        let c: snapblk_core::Error = e.into();
        assert_eq!(c.errno, libc::EIO);
        assert_eq!(c.msg, "reading COW header: short read at offset 0");
        let c: snapblk_core::Error =
            SnapError::MergeThread(std::io::Error::from_raw_os_error(libc::EAGAIN)).into();
        assert_eq!(c.errno, libc::EAGAIN);
        assert!(
            c.msg
                .starts_with("starting the merge thread: Resource temporarily"),
            "{}",
            c.msg
        );
    }
}
