//! Drivers for snapblk-core.
//!
//! * [`NullDriver`] (`null`): completes every request at once (reads return zeros); measures
//!   the stack itself.
//! * [`SyncDriver`] (`sync`): `preadv2`/`pwritev2` on a regular file or block device, executed
//!   in `do_io`.
//! * [`UringDriver`] (`io_uring`): the fast path for files and block devices.
//! * [`VhostUserDriver`] (`virtio-blk-vhost-user`): a virtio-blk device served by a vhost-user
//!   backend over a unix socket (e.g. `qemu-storage-daemon`).
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
mod vfio_pci;
mod vhost_user;

pub use null::NullDriver;
pub use sync::SyncDriver;
pub use uring::UringDriver;
pub use vfio_pci::VfioPciDriver;
pub use vhost_user::VhostUserDriver;
