//! The error type shared by every snapblk I/O crate: an errno plus a human message.

use std::borrow::Cow;
use std::fmt;

/// An error with the errno a C caller will see (as `-errno`) and a message for the thread's error
/// buffer. Drivers build them from OS errors with [`Error::from_io`] or with a fixed message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    /// Positive errno value (e.g. `libc::EINVAL`).
    pub errno: i32,
    /// Human-readable message; libblkio-compatible text where the spec gives one.
    pub msg: Cow<'static, str>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

/// Result alias for the I/O crates.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with a given errno and message.
    pub fn new(errno: i32, msg: impl Into<Cow<'static, str>>) -> Self {
        Error {
            errno,
            msg: msg.into(),
        }
    }
    /// `EINVAL` with a message.
    pub fn inval(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::new(libc::EINVAL, msg)
    }
    /// An OS error, with Rust's `io::Error` text (as libblkio prints it, e.g.
    /// `No such file or directory (os error 2)`).
    pub fn from_io(e: std::io::Error) -> Self {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        Self::new(errno, e.to_string())
    }
    /// The last OS error (`errno`) as an [`Error`].
    pub fn last_os_error() -> Self {
        Self::from_io(std::io::Error::last_os_error())
    }
    /// An OS error from a raw errno value.
    pub fn from_errno(errno: i32) -> Self {
        Self::from_io(std::io::Error::from_raw_os_error(errno))
    }
    /// The negative errno a C function returns.
    pub fn neg(&self) -> i32 {
        -self.errno
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self::from_io(e)
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(
            std::io::Error::from_raw_os_error(e.errno).kind(),
            e.msg.into_owned(),
        )
    }
}
