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
///
/// Its message is `line N: ` and the [`kind`](ParseError::kind)'s message; its
/// [`source`](std::error::Error::source) is the kind's (the I/O or JSON error of an
/// [`Io`](ParseErrorKind::Io) or [`Json`](ParseErrorKind::Json) kind), so a one-line report of
/// the chain names the cause once.
#[derive(Debug)]
pub struct ParseError {
    /// The 1-based line of the list where parsing failed.
    pub line: u64,
    /// What was wrong with it.
    pub kind: ParseErrorKind,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.kind)
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.kind.source()
    }
}

/// What was wrong with a line of a list.
#[derive(Debug, thiserror::Error)]
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
    /// A JSON entry that does not parse; the parser's error is the source.
    #[error("bad JSON entry")]
    Json(#[source] serde_json::Error),
    /// The list could not be read; the I/O error is the source.
    #[error("read error")]
    Io(#[source] std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_testsupport::errors::{assert_cause_is_source, chain};
    use std::error::Error as _;

    #[test]
    fn every_wrapping_kind_keeps_its_cause_as_source_only() {
        let io = || std::io::Error::from_raw_os_error(5);
        let json = || serde_json::from_str::<u8>("x").unwrap_err();
        let json_text = json().to_string();
        let cases = [
            (ParseErrorKind::Io(io()), io().to_string()),
            (ParseErrorKind::Json(json()), json_text.clone()),
        ];
        for (kind, cause) in cases {
            assert_cause_is_source(&kind, Some(&cause));
            // The line number stays in the message; the cause is the source of the whole error.
            let e = ParseError { line: 3, kind };
            let line = assert_cause_is_source(&e, Some(&cause));
            assert!(line.starts_with("line 3: "), "{line}");
        }
        let e = ParseError {
            line: 7,
            kind: ParseErrorKind::Io(io()),
        };
        assert_eq!(
            chain(&e),
            "line 7: read error: Input/output error (os error 5)"
        );
        let e = ParseError {
            line: 2,
            kind: ParseErrorKind::Json(json()),
        };
        assert_eq!(chain(&e), format!("line 2: bad JSON entry: {json_text}"));
        // Kinds in this layer's own words have no source.
        let e = ParseError {
            line: 1,
            kind: ParseErrorKind::EmptyRange,
        };
        assert!(e.source().is_none());
        assert_eq!(e.to_string(), "line 1: empty range (length 0)");
    }
}
