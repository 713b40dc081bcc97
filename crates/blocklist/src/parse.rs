//! Bounds and errors for parsing untrusted lists: the block lists of this crate and the file
//! lists of `snapblk-readahead` share them, so both report errors the same way.

/// Bounds applied while parsing untrusted lists.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_line: usize,
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
    pub line: u64,
    pub kind: ParseErrorKind,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseErrorKind {
    #[error("line longer than {0} bytes")]
    LineTooLong(usize),
    #[error("more than {0} entries")]
    TooManyEntries(usize),
    #[error("empty path")]
    EmptyPath,
    #[error("path longer than 4096 bytes")]
    PathTooLong,
    #[error("path contains a NUL byte")]
    NulInPath,
    #[error("bad escape sequence in path: {0}")]
    BadEscape(String),
    #[error("bad range {0:?} (expected OFFSET:LENGTH in decimal bytes)")]
    BadRange(String),
    #[error("bad range list {token:?} in a classic `FILE OFFSET:LENGTH,...` line: {error}")]
    BadRangeList {
        token: String,
        error: Box<ParseErrorKind>,
    },
    #[error("empty range (length 0)")]
    EmptyRange,
    #[error("range end overflows 64 bits")]
    RangeOverflow,
    #[error("bad identity: {0}")]
    BadIdentity(String),
    #[error("expected 3 TAB-separated fields (path, identity, ranges), got {0}")]
    FieldCount(usize),
    #[error("bad JSON entry: {0}")]
    Json(String),
    #[error("read error: {0}")]
    Io(String),
}
