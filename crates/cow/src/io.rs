//! The positional I/O traits the reader and writer work through, so they use files without
//! loading them: snapblk-core's one family ([`snapblk_core::ReadAt`], [`snapblk_core::WriteAt`],
//! [`snapblk_core::MemFile`]), re-exported under this crate's names.

pub use snapblk_core::{MemFile, ReadAt, WriteAt};
