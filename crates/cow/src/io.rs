//! The positional I/O traits the reader and writer work through, so they use files without
//! loading them: snapblk-core's one family ([`snapblk_core::at`]), re-exported under this
//! crate's names.

pub use snapblk_core::at::{MemFile, ReadAt, WriteAt};
