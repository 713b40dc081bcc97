//! snapblk-core: the one block-device abstraction every snapblk driver implements and every
//! export, the C ABI and the CLI consume.
//!
//! The model follows libblkio (so the C ABI is a thin skin over it):
//! * a [`Blkio`] instance is created for a [`Driver`], configured through typed properties
//!   ([`PropSpec`], [`PropValue`]), then moves created → connected → started ([`State`]);
//! * a started instance hands out [`Queue`]s: each takes [`Request`]s carrying an opaque
//!   `user_data` and returns [`Completion`]s from [`Queue::do_io`], which submits, then waits
//!   (blocking, bounded by a timeout, or not at all); an eventfd per queue makes it usable from an
//!   event loop. A driver builds its queues from [`QueueCore`], which runs that algorithm over
//!   the driver's [`Engine`]; an engine whose requests finish on other threads (librbd's
//!   callbacks, HTTP workers) collects them in a [`DoneList`], which also does its waiting;
//! * memory regions ([`MemRegion`]) are memfd-backed buffers that drivers may register for
//!   zero-copy I/O;
//! * positional I/O ([`ReadAt`], [`WriteAt`], below) is how the layers above read and write bytes
//!   at an offset of a file, a device or memory, with the file descriptor an optional capability.
//!
//! Errors carry a negative-errno-compatible code plus a message ([`Error`]), because that is what
//! the C ABI must return, and Rust callers lose nothing by it.
//!
//! # Positional I/O
//!
//! The one "read at offset" trait family every snapblk crate reads and writes bytes through (a
//! COW file being parsed, the snapshot's base and COW devices, an image built in memory):
//!
//! * [`ReadAt`]: the size and a positional read (`pread`-style, may be short), with an exact
//!   read ([`ReadAt::read_exact_at`]) on top;
//! * [`WriteAt`]: a positional write of a whole buffer and durability ([`WriteAt::sync_data`]);
//! * the file descriptor is an optional capability, [`ReadAt::as_file`]: `Some` for a plain
//!   file, `None` (the default) for a source without one (memory, a network or RBD client, a
//!   device behind a queue). Fast paths that need a descriptor — a direct `pread` in the
//!   snapshot's read path, the ublk zero-copy plan, page-cache hints — apply only where it is
//!   `Some`; everything else goes through the trait methods, so every source works everywhere.
//!
//! Errors are [`std::io::Error`]. An OS error carries its errno (`raw_os_error`); a source that is
//! not an OS file reports an errno and a message as an [`Error`] inside the `io::Error`
//! (`io::Error::from(Error)`), which [`Error::from_io`] takes back out whole. Layers that hand
//! errors to the C ABI convert at their edge with [`Error::from_io`] (EIO for errors without an
//! errno) or, for exact reads, [`read_error`] (a short read becomes EIO "short read at offset N").
//!
//! Implemented for [`File`](std::fs::File), byte slices and `Vec<u8>` (read only), [`MemFile`] (a
//! growable image in memory, both), and forwarded through `&T`, `Arc<T>` and `Box<T>` (the
//! capability too).
//!
//! # Layout
//!
//! Modules are private and the API is re-exported at the root, except three public modules of
//! small shared helpers whose names read right only under their module (`mix` or `lock` alone
//! would say nothing at the root of a block-device crate):
//! * [`rng`]: the one PRNG, [`rng::Rng`] (SplitMix64), and its finaliser [`rng::mix`];
//! * [`sync`]: [`sync::lock`], the one mutex-lock helper (poisoning ignored);
//! * [`sys`]: the raw system interfaces more than one crate needs — a block device's size
//!   ([`sys::blkgetsize64`]), the page size ([`sys::page_size`]) and the eventfd
//!   ([`sys::EventFd`]).
//!
//! The one size grammar is [`parse_size`].

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod at;
mod device;
mod done;
mod error;
mod iostats;
mod mem;
mod props;
mod queue;
mod request;
pub mod rng;
mod size;
pub mod sync;
pub mod sys;
mod zone;

pub use at::{MemFile, ReadAt, WriteAt, read_error};
pub use device::{Blkio, DeviceInfo, Driver, State};
pub use done::DoneList;
pub use error::{Chain, Error, Result};
pub use iostats::{DirSnapshot, IoDir, IoStats, IoStatsSnapshot, LATENCY_BOUNDS_NS};
pub use mem::MemRegion;
pub use props::{Access, PropSpec, PropType, PropValue};
pub use queue::{Engine, Queue, QueueCore, QueueExt, check_do_io_args};
pub use request::{Completion, Op, ReqFlags, Request};
pub use size::{SizeError, parse_size};
pub use zone::{Zone, ZoneAction, ZoneOp};
