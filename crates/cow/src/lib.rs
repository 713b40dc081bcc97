//! Android Virtual A/B COW format (v1/v2/v3): reader, writer, generator.
//!
//! A COW file describes a *new* partition image as per-block operations against the *old* one
//! (the base): COPY a base block, REPLACE with stored (optionally compressed) data, ZERO, or XOR
//! stored data with base bytes. This crate reads every version Android has shipped
//! ([`CowReader`]), writes v2 and v3 files Android accepts ([`CowWriter`]), and generates a
//! COW from two images ([`generate()`]). It does no I/O policy: callers pass anything that
//! implements [`ReadAt`] (files, byte slices).
//!
//! Layout of the crate: [`format`](mod@format) (on-disk structures), [`codec`] (payload compression),
//! [`reader`], [`writer`], [`generate`](mod@generate), [`sparse`] (Android sparse images), [`tools`]
//! (apply/verify/inspect helpers used by the CLI).

#![warn(missing_docs)]

pub mod codec;
pub mod error;
pub mod format;
#[cfg(feature = "test-utils")]
pub mod fuzzing;
pub mod generate;
pub mod io;
pub mod reader;
pub mod record;
pub mod sparse;
pub mod tools;
pub mod writer;

pub use codec::{Codec, Compression, PayloadBuf};
pub use error::{CowError, Result};
pub use format::{Header, ScratchLayout};
pub use generate::{GenerateOptions, GenerateProgress, GenerateStats, Stage, generate};
pub use io::{MemFile, ReadAt, WriteAt};
pub use reader::{
    CowReader, DuplicatePolicy, Footer, Op, OpKind, OpenOptions, Payload, read_num_merge_ops,
    write_num_merge_ops,
};
pub use writer::{
    BatchOp, CowSink, CowWriter, EncodedUnit, WriterOptions, encode_unit, encode_unit_into,
};
