//! Drivers for snapblk-core.
//!
//! * [`null`]: completes every request at once (reads return zeros); measures the stack itself.
//! * [`sync`]: `preadv2`/`pwritev2` on a regular file or block device, executed in `do_io`.
//! * [`uring`] (the `io_uring` driver): the fast path for files and block devices.
//!
//! File-backed drivers share the `path`/`fd`/`direct` properties and libblkio's rules for
//! deriving alignment and other device facts (see `file`).

#![warn(missing_docs)]

mod file;
pub mod null;
pub mod sync;
pub mod uring;

pub use null::NullDriver;
pub use sync::SyncDriver;
pub use uring::UringDriver;
