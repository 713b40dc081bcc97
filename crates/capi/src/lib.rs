//! libblkio 1.x compatible C ABI (`libblkio.so.1`) over snapblk.
//!
//! Every exported function is a thin skin over [`snapblk_core::Blkio`] and its queues: it
//! checks pointers, converts C types, runs the call inside `catch_unwind` (no panic crosses the
//! FFI boundary: a panic becomes `-EIO` with a message), and turns a [`snapblk_core::Error`] into
//! the negative errno plus the thread-local error message, as libblkio does.
//!
//! Differences from libblkio 1.5 are bug fixes and are listed in `docs/blkio.md`.

#![allow(clippy::missing_safety_doc)]

mod ffi;

pub use ffi::*;
