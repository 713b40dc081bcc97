//! Android Virtual A/B COW format (v1/v2/v3): reader, writer, generator.
//!
//! A COW file describes a *new* partition image as per-block operations against the *old* one
//! (the base): COPY a base block, REPLACE with stored (optionally compressed) data, ZERO, or XOR
//! stored data with base bytes. This crate reads every version Android has shipped
//! ([`CowReader`]), writes v2 and v3 files Android accepts ([`CowWriter`]), and generates a
//! COW from two images ([`generate()`]). It does no I/O policy: callers pass anything that
//! implements [`ReadAt`] (files, byte slices).
//!
//! * On-disk structures: [`Header`] (with its [`ScratchLayout`]); ops as the reader returns
//!   them ([`Op`], [`OpKind`], [`Payload`]); the merge counter ([`read_num_merge_ops`],
//!   [`write_num_merge_ops`]).
//! * Payload compression: [`Compression`], [`Codec`], [`decompress`].
//! * Generation: [`generate()`] is [`compute_ops`] (decide an op per block and a safe merge
//!   order, an [`OpList`]) followed by [`write_ops`]; [`GenerateOptions`] and
//!   [`GenerateProgress`] drive it, [`GenerateStats`] reports it. Input images are raw or
//!   Android sparse ([`load_image`]).
//! * Whole-file operations the CLI runs: [`summarize`] (inspect), [`verify`], [`apply`],
//!   [`extent`], [`simulate_merge`].
//!
//! Modules are private and the API is re-exported here, except two public namespaces:
//! * [`record`]: the COW record, a sidecar file (`COW.snapblk`) with its own format, errors and
//!   helpers (`record::sha256_of`, `record::hex`, `record::check_base`, ...) whose names read
//!   right only under it;
//! * `fuzzing` (with the `test-utils` feature): the fuzz entry points, test scaffolding.

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod codec;
mod error;
mod format;
#[cfg(feature = "test-utils")]
pub mod fuzzing;
mod generate;
mod io;
mod lz4c;
mod reader;
pub mod record;
mod sparse;
mod tools;
mod writer;

pub use codec::{Codec, Compression, DecodeError, LevelError, decompress};
pub use error::{CowError, Result};
pub use format::{DEFAULT_SCRATCH_SIZE, Header, NUM_MERGE_OPS_OFFSET, ScratchLayout};
pub use generate::{
    GenerateOptions, GenerateProgress, GenerateStats, OpList, Stage, compute_ops, generate,
    write_ops,
};
pub use io::{MemFile, ReadAt, WriteAt};
pub use reader::{
    CowReader, DuplicatePolicy, Footer, Op, OpKind, OpenOptions, Payload, read_num_merge_ops,
    write_num_merge_ops,
};
pub use tools::{
    Extent, Image, MergeSummary, Summary, TypeStats, VerifyReport, apply, extent, load_image,
    simulate_merge, summarize, verify,
};
pub use writer::{CowSink, CowWriter, EncodedUnit, WriterOptions};
