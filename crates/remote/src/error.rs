//! The errors of remote reads and transfers, each one line that says what to do.

use std::path::PathBuf;

/// A remote read or transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The text is no URL this crate reads (`s3://BUCKET/KEY`, `http://…`, `https://…`).
    #[error(
        "{url:?}: not a remote location (expected s3://BUCKET/KEY, http://HOST/PATH or https://HOST/PATH): {why}"
    )]
    BadUrl {
        /// The text given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An `AWS_*` setting or a flag has a value that cannot be used.
    #[error("{what}: {why}")]
    BadConfig {
        /// The setting.
        what: String,
        /// What is wrong with it.
        why: String,
    },
    /// The server refused the credentials (HTTP 401/403).
    #[error(
        "{url}: access denied (HTTP {status}{code}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the bucket's permissions"
    )]
    Denied {
        /// The object.
        url: String,
        /// The HTTP status.
        status: u16,
        /// `, CODE` with the S3 error code when the body had one.
        code: String,
    },
    /// The object (or its bucket) does not exist (HTTP 404).
    #[error("{url}: no such object (HTTP 404{code})")]
    NotFound {
        /// The object.
        url: String,
        /// `, CODE` with the S3 error code when the body had one.
        code: String,
    },
    /// The object was replaced after it was opened (HTTP 412 to `If-Match` or
    /// `If-Unmodified-Since`, or a reply with another ETag, Last-Modified date or size).
    #[error(
        "{url}: the object changed since it was opened (it was {etag}); reopen it to read the new version"
    )]
    Changed {
        /// The object.
        url: String,
        /// The version it was opened at: its ETag, or its Last-Modified date when it has none.
        etag: String,
    },
    /// The server gives neither an ETag nor a Last-Modified date: a change of the object
    /// between two reads could not be noticed.
    #[error(
        "{url}: the server gives neither an ETag nor a Last-Modified date, so a change between reads would go unnoticed (set SNAPBLK_REMOTE_ALLOW_UNPINNED=1 to read it anyway)"
    )]
    Unpinned {
        /// The object.
        url: String,
    },
    /// No answer: connection refused, name not resolved, TLS failure or timeout, after retries.
    #[error(
        "{url}: cannot reach the endpoint after {attempts} attempt(s) (timeout {timeout_secs} s)"
    )]
    Unreachable {
        /// The object.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The per-request timeout.
        timeout_secs: u64,
        /// The transport error of the last attempt.
        #[source]
        source: TransportError,
    },
    /// Any other HTTP error status (after retries for 5xx).
    #[error("{url}: HTTP {status}{code}")]
    Status {
        /// The object.
        url: String,
        /// The HTTP status.
        status: u16,
        /// `, CODE` with the S3 error code when the body had one.
        code: String,
    },
    /// The server answered with something this client cannot use.
    #[error("{url}: bad response: {why}")]
    BadResponse {
        /// The object.
        url: String,
        /// What was wrong.
        why: String,
    },
    /// Reading a response body failed.
    #[error("{url}: reading the response")]
    Body {
        /// The object.
        url: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A read of bytes the object does not have.
    #[error("{url}: {len} bytes at offset {offset} are past the end of the object ({size} bytes)")]
    OutOfRange {
        /// The object.
        url: String,
        /// Offset of the read.
        offset: u64,
        /// Length of the read.
        len: u64,
        /// The object's size.
        size: u64,
    },
    /// A local file of a transfer.
    #[error("{path}")]
    Local {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The caller stopped the transfer (`remote put` on SIGINT/SIGTERM/SIGHUP) before the
    /// object was written: a multipart upload is aborted, a single PUT cut short, so the key
    /// holds what it held before.
    #[error("{url}: stopped before the object was written")]
    Stopped {
        /// The object.
        url: String,
    },
    /// A downloaded object's SHA-256 is not the one recorded when it was pushed.
    #[error(
        "{url}: checksum mismatch: the object's metadata says sha256 {want}, the bytes are {got}"
    )]
    Checksum {
        /// The object.
        url: String,
        /// The recorded digest.
        want: String,
        /// The digest of the bytes received.
        got: String,
    },
}

/// The HTTP client's transport error, as its one-line text: the client's own message already
/// ends with its causes, so they are not chained a second time.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TransportError(pub String);

impl RemoteError {
    /// The errno a C caller gets for this error.
    pub fn errno(&self) -> i32 {
        match self {
            RemoteError::BadUrl { .. } | RemoteError::BadConfig { .. } => libc::EINVAL,
            RemoteError::Denied { .. } => libc::EACCES,
            RemoteError::NotFound { .. } => libc::ENOENT,
            RemoteError::Changed { .. } => libc::ESTALE,
            RemoteError::Unreachable { .. } => libc::EHOSTUNREACH,
            RemoteError::Stopped { .. } => libc::ECANCELED,
            RemoteError::Local { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        }
    }
}

impl From<RemoteError> for snapblk_core::Error {
    fn from(e: RemoteError) -> Self {
        snapblk_core::Error::from_chain(e.errno(), &e)
    }
}

impl From<RemoteError> for std::io::Error {
    fn from(e: RemoteError) -> Self {
        snapblk_core::Error::from(e).into()
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, RemoteError>;
