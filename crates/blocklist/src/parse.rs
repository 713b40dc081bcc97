//! Bounds and errors for parsing untrusted lists: the block lists of this crate and the file
//! lists of `snapblk-readahead` share them, so both report errors the same way.

/// Bounds applied while parsing untrusted lists.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest line accepted, in bytes (default 16 MiB).
    pub max_line: usize,
    /// Most entries a list may hold (default 10 million).
    pub max_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line: 16 << 20,
            max_entries: 10_000_000,
        }
    }
}

/// A parse error and the 1-based line it happened on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {kind}")]
pub struct ParseError {
    /// The 1-based line of the list where parsing failed.
    pub line: u64,
    /// What was wrong with it.
    pub kind: ParseErrorKind,
}

/// What was wrong with a line of a list.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// A line over [`Limits::max_line`] bytes.
    #[error("line longer than {0} bytes")]
    LineTooLong(usize),
    /// More entries than [`Limits::max_entries`].
    #[error("more than {0} entries")]
    TooManyEntries(usize),
    /// An entry without a path.
    #[error("empty path")]
    EmptyPath,
    /// A path over `PATH_MAX` (4096 bytes).
    #[error("path longer than 4096 bytes")]
    PathTooLong,
    /// A path with a NUL byte (no file can have one).
    #[error("path contains a NUL byte")]
    NulInPath,
    /// A backslash escape in a path that is not one the writer produces.
    #[error("bad escape sequence in path: {0}")]
    BadEscape(String),
    /// A range that is not `OFFSET:LENGTH` in decimal bytes.
    #[error("bad range {0:?} (expected OFFSET:LENGTH in decimal bytes)")]
    BadRange(String),
    /// A bad range list in a classic `FILE OFFSET:LENGTH,...` line.
    #[error("bad range list {token:?} in a classic `FILE OFFSET:LENGTH,...` line: {error}")]
    BadRangeList {
        /// The token that held the list.
        token: String,
        /// What was wrong with it.
        error: Box<ParseErrorKind>,
    },
    /// A range of length 0.
    #[error("empty range (length 0)")]
    EmptyRange,
    /// A range whose end does not fit in 64 bits.
    #[error("range end overflows 64 bits")]
    RangeOverflow,
    /// A file identity field (device, inode, size, mtime) that does not parse.
    #[error("bad identity: {0}")]
    BadIdentity(String),
    /// A line of the TAB-separated form without exactly three fields.
    #[error("expected 3 TAB-separated fields (path, identity, ranges), got {0}")]
    FieldCount(usize),
    /// A JSON entry that does not parse (the parser's own words).
    #[error("bad JSON entry: {0}")]
    Json(String),
    /// The list could not be read (the I/O error's words).
    #[error("read error: {0}")]
    Io(String),
}
