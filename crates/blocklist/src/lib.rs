//! snapblk-blocklist: the block list format, shared by the snapshot driver (which records and
//! replays the device ranges it serves) and the readahead tool (which also replays lists into
//! block device nodes).
//!
//! * [`blocks`] is the format itself: [`BlockList`], [`BlockFile`] (with `#@ key=value`
//!   metadata), [`BlockRecorder`] and [`replay_blocks`].
//! * [`ranges`] holds the byte ranges and normalised range sets lists are made of.
//! * [`parse`] holds the bounds and errors of parsing untrusted lists; readahead's file lists
//!   use them too.
//!
//! This crate depends on no other snapblk crate, so a driver can read block lists without
//! linking the readahead tool.
#![warn(missing_docs)]

pub mod blocks;
pub mod parse;
pub mod ranges;

pub use blocks::{
    BLOCK_HEADER, BlockFile, BlockList, BlockPrefetch, BlockRecorder, MAX_META, META_PREFIX,
    replay_blocks,
};
pub use parse::{Limits, ParseError, ParseErrorKind};
pub use ranges::{Range, RangeSet};
