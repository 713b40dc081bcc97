//! Drivers for snapblk-core.
//!
//! * [`NullDriver`] (`null`): completes every request at once (reads return zeros); measures
//!   the stack itself.
//! * [`SyncDriver`] (`sync`): `preadv2`/`pwritev2` on a regular file or block device, executed
//!   in `do_io`.
//! * [`UringDriver`] (`io_uring`): the fast path for files and block devices.
//! * [`VhostUserDriver`] (`virtio-blk-vhost-user`): a virtio-blk device served by a vhost-user
//!   backend over a unix socket (e.g. `qemu-storage-daemon`).
//! * [`VhostVdpaDriver`] (`virtio-blk-vhost-vdpa`): a virtio-blk device on the kernel's
//!   vhost-vdpa bus (`/dev/vhost-vdpa-N`: hardware vDPA or VDUSE).
//!
//! * [`NvmeDriver`] (`nvme-io_uring`): an NVMe namespace through its generic character device
//!   (`/dev/ngXnY`), NVMe commands passed through io_uring.
//! * `RbdDriver` (`rbd`, cargo feature `rbd`): a Ceph RBD image through librbd, loaded at
//!   connect.
//!
//! File-backed drivers share the `path`/`fd`/`direct` properties and libblkio's rules for
//! deriving alignment and other device facts (see `file`).
//!
//! Modules are private; the drivers are re-exported here.

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod file;
mod iova;
mod null;
mod nvme;
#[cfg(feature = "rbd")]
mod rbd;
mod sync;
mod uring;
mod vfio_pci;
mod vhost_user;
mod vhost_vdpa;

pub use null::NullDriver;
pub use nvme::NvmeDriver;
#[cfg(feature = "rbd")]
pub use rbd::RbdDriver;
pub use sync::SyncDriver;
pub use uring::UringDriver;
pub use vfio_pci::VfioPciDriver;
pub use vhost_user::VhostUserDriver;
pub use vhost_vdpa::VhostVdpaDriver;
