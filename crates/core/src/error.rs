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
    /// `No such file or directory (os error 2)`). An `io::Error` made from an [`Error`] (how a
    /// source without a file descriptor reports one through [`ReadAt`](crate::ReadAt)) gives that
    /// [`Error`] back; any other error without an errno is EIO with its text.
    pub fn from_io(e: std::io::Error) -> Self {
        if let Some(errno) = e.raw_os_error() {
            return Self::new(errno, e.to_string());
        }
        if let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<Error>()) {
            return inner.clone();
        }
        Self::new(libc::EIO, e.to_string())
    }
    /// The last OS error (`errno`) as an [`Error`].
    pub fn last_os_error() -> Self {
        Self::from_io(std::io::Error::last_os_error())
    }
    /// An OS error from a raw errno value.
    pub fn from_errno(errno: i32) -> Self {
        Self::from_io(std::io::Error::from_raw_os_error(errno))
    }
    /// An error for the C ABI from a typed error: `errno` and the message of `e`'s whole
    /// [`Chain`] (the C caller has one message, not a chain to walk).
    pub fn from_chain(errno: i32, e: &dyn std::error::Error) -> Self {
        Self::new(errno, Chain(e).to_string())
    }
}

/// Displays an error and each of its [`source`](std::error::Error::source)s, joined by `": "`,
/// in one line: what `anyhow` prints for `{:#}`. Every snapblk error leaves its cause out of its
/// own message, so each cause appears once.
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'a));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cur = self.0.source();
        while let Some(c) = cur {
            write!(f, ": {c}")?;
            cur = c.source();
        }
        Ok(())
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self::from_io(e)
    }
}

/// The [`Error`] inside an `io::Error` of the kind its errno maps to; [`Error::from_io`] takes it
/// back out whole (errno and message).
impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.errno).kind(), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn chain_prints_each_error_once_in_one_line() {
        let e = Outer(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            Chain(&e).to_string(),
            "outer: No such file or directory (os error 2)"
        );
        let c = Error::from_chain(libc::ENOENT, &e);
        assert_eq!(c.errno, libc::ENOENT);
        assert_eq!(c.msg, "outer: No such file or directory (os error 2)");
        // A leaf is its own message.
        assert_eq!(Chain(&Error::inval("bad")).to_string(), "bad");
    }

    #[test]
    fn an_error_survives_a_trip_through_io_error() {
        let e = Error::new(libc::ENOSPC, "injected write error (seed 7)");
        let io = std::io::Error::from(e.clone());
        assert_eq!(io.kind(), std::io::ErrorKind::StorageFull);
        assert_eq!(io.to_string(), "injected write error (seed 7)");
        assert_eq!(Error::from_io(io), e);
        // OS errors keep their errno and text; others are EIO with their text.
        let os = Error::from_io(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(os.errno, libc::ENOENT);
        assert_eq!(os.msg, "No such file or directory (os error 2)");
        let other = Error::from_io(std::io::Error::other("odd"));
        assert_eq!((other.errno, &*other.msg), (libc::EIO, "odd"));
    }
}
