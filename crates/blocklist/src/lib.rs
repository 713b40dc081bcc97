//! snapblk-blocklist: the block list format, shared by the snapshot driver (which records and
//! replays the device ranges it serves) and the readahead tool (which also replays lists into
//! block device nodes).
//!
//! * The format itself: [`BlockList`], [`BlockFile`] (with `#@ key=value` metadata),
//!   [`BlockRecorder`] and [`replay_blocks`] (module `blocks`).
//! * The byte ranges and normalised range sets lists are made of: [`Range`], [`RangeSet`]
//!   (module `ranges`).
//! * The bounds and errors of parsing untrusted lists: [`Limits`], [`ParseError`] (module
//!   `parse`); readahead's file lists use them too.
//!
//! Modules are private; everything public is re-exported here.
//!
//! This crate depends on no other snapblk crate, so a driver can read block lists without
//! linking the readahead tool.
#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod blocks;
mod parse;
mod ranges;

pub use blocks::{
    BLOCK_HEADER, BlockFile, BlockList, BlockPrefetch, BlockRecorder, MAX_META, META_PREFIX,
    replay_blocks,
};
pub use parse::{Limits, ParseError, ParseErrorKind};
pub use ranges::{Range, RangeSet};
