//! Drivers for snapblk-core.
//!
//! * [`NullDriver`] (`null`): completes every request at once (reads return zeros); measures
//!   the stack itself.
//! * [`SyncDriver`] (`sync`): `preadv2`/`pwritev2` on a regular file or block device, executed
//!   in `do_io`.
//! * [`UringDriver`] (`io_uring`): the fast path for files and block devices.
//!
//! File-backed drivers share the `path`/`fd`/`direct` properties and libblkio's rules for
//! deriving alignment and other device facts (see `file`).
//!
//! Modules are private; the drivers are re-exported here.

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod file;
mod null;
mod sync;
mod uring;

pub use null::NullDriver;
pub use sync::SyncDriver;
pub use uring::UringDriver;
