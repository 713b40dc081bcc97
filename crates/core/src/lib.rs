//! snapblk-core: the one block-device abstraction every snapblk driver implements and every
//! export, the C ABI and the CLI consume.
//!
//! The model follows libblkio (so the C ABI is a thin skin over it):
//! * a [`Blkio`] instance is created for a [`Driver`], configured through typed
//!   [properties](props), then moves created → connected → started ([`State`]);
//! * a started instance hands out [`Queue`]s: each takes [`Request`]s carrying an opaque
//!   `user_data` and returns [`Completion`]s from [`Queue::do_io`], which submits, then waits
//!   (blocking, bounded by a timeout, or not at all); an eventfd per queue makes it usable from an
//!   event loop;
//! * [memory regions](mem) are memfd-backed buffers that drivers may register for zero-copy I/O;
//! * [positional I/O](at) ([`ReadAt`], [`WriteAt`]) is how the layers above read and write bytes
//!   at an offset of a file, a device or memory, with the file descriptor an optional capability.
//!
//! Errors carry a negative-errno-compatible code plus a message ([`Error`]), because that is what
//! the C ABI must return, and Rust callers lose nothing by it.

#![warn(missing_docs)]

pub mod at;
pub mod device;
pub mod error;
pub mod mem;
pub mod props;
pub mod queue;
pub mod request;
pub mod rng;
pub mod size;
pub mod sync;
pub mod sys;

pub use at::{MemFile, ReadAt, WriteAt};
pub use device::{Blkio, DeviceInfo, Driver, State};
pub use error::{Chain, Error, Result};
pub use mem::MemRegion;
pub use props::{Access, PropSpec, PropType, PropValue};
pub use queue::{Queue, QueueExt};
pub use request::{Completion, Op, ReqFlags, Request};
