//! Block-level readahead lists, for a block device (e.g. the snapshot device's `serve --record`):
//! a device records the byte ranges it served during the first seconds after start with
//! [`BlockRecorder`], saves them as a [`BlockList`] (text: one `offset:length` per line after a
//! header), and on the next start replays them with [`replay_blocks`] into anything that
//! implements [`BlockPrefetch`] — its own cache, or [`FdPrefetch`] for readahead(2) on a block
//! device node. This module does not depend on any other snapblk crate.
//!
//! ```
//! use snapblk_readahead::blocks::{BlockRecorder, replay_blocks, BlockPrefetch};
//! use std::time::Duration;
//! let mut rec = BlockRecorder::new(Duration::from_secs(30), 1 << 20);
//! rec.note_read(0, 4096);
//! rec.note_read(4096, 4096);
//! let list = rec.finish();
//! struct Sink(Vec<(u64, u64)>);
//! impl BlockPrefetch for Sink {
//!     type Error = std::convert::Infallible;
//!     fn prefetch(&mut self, off: u64, len: u64) -> Result<(), Self::Error> {
//!         self.0.push((off, len));
//!         Ok(())
//!     }
//! }
//! let mut s = Sink(vec![]);
//! replay_blocks(&list, 2 << 20, &mut s).unwrap();
//! assert_eq!(s.0, vec![(0, 8192)]);
//! ```

use crate::list::{Limits, ParseError, ParseErrorKind};
use crate::ranges::{Range, RangeSet};
use std::io::{BufRead, Read, Write};
use std::time::{Duration, Instant};

/// Header line of the text form.
pub const BLOCK_HEADER: &str = "# snapblk-block-list v1";

/// A normalised list of device byte ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockList {
    pub ranges: RangeSet,
}

impl BlockList {
    pub fn write<W: Write>(&self, mut w: W) -> std::io::Result<()> {
        writeln!(w, "{BLOCK_HEADER}")?;
        for r in self.ranges.ranges() {
            writeln!(w, "{}:{}", r.offset, r.len)?;
        }
        Ok(())
    }

    /// Parses the text form (comments and blank lines ignored), bounded like file lists.
    pub fn parse<R: BufRead>(mut r: R, limits: Limits) -> Result<BlockList, ParseError> {
        let mut v = Vec::new();
        let mut buf = Vec::new();
        let mut line = 0u64;
        loop {
            buf.clear();
            line += 1;
            let err = |kind| ParseError { line, kind };
            let n = (&mut r)
                .take(limits.max_line as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|e| err(ParseErrorKind::Io(e.to_string())))?;
            if n == 0 {
                break;
            }
            if buf.len() > limits.max_line {
                return Err(err(ParseErrorKind::LineTooLong(limits.max_line)));
            }
            let s = String::from_utf8_lossy(&buf);
            let s = s.trim();
            if s.is_empty() || s.starts_with('#') {
                continue;
            }
            if v.len() >= limits.max_entries {
                return Err(err(ParseErrorKind::TooManyEntries(limits.max_entries)));
            }
            let bad = || err(ParseErrorKind::BadRange(s.chars().take(40).collect()));
            let (o, l) = s.split_once(':').ok_or_else(bad)?;
            let o: u64 = o.parse().map_err(|_| bad())?;
            let l: u64 = l.parse().map_err(|_| bad())?;
            if l == 0 {
                return Err(err(ParseErrorKind::EmptyRange));
            }
            v.push(Range::new(o, l).ok_or_else(|| err(ParseErrorKind::RangeOverflow))?);
        }
        Ok(BlockList {
            ranges: RangeSet::from_ranges(v),
        })
    }
}

/// Collects the ranges a device serves during a time window after its creation.
#[derive(Debug)]
pub struct BlockRecorder {
    start: Instant,
    window: Duration,
    max_ranges: usize,
    pending: Vec<Range>,
    set: RangeSet,
}

impl BlockRecorder {
    /// Records for `window`; at most `max_ranges` distinct ranges are kept (memory bound).
    pub fn new(window: Duration, max_ranges: usize) -> Self {
        BlockRecorder {
            start: Instant::now(),
            window,
            max_ranges,
            pending: Vec::new(),
            set: RangeSet::new(),
        }
    }

    /// Notes a read served at `[offset, offset+len)`. Returns false once the window is over (the
    /// caller may then stop calling).
    pub fn note_read(&mut self, offset: u64, len: u64) -> bool {
        if self.start.elapsed() > self.window {
            return false;
        }
        if let Some(r) = Range::new(offset, len) {
            self.pending.push(r);
            if self.pending.len() >= 4096 {
                self.compact();
            }
        }
        true
    }

    fn compact(&mut self) {
        let mut v = std::mem::take(&mut self.pending);
        v.extend_from_slice(self.set.ranges());
        self.set = RangeSet::from_ranges(v);
        if self.set.ranges().len() > self.max_ranges {
            // Keep the earliest-offset ranges; dropping is better than growing without bound.
            let mut v = std::mem::take(&mut self.set).into_vec();
            v.truncate(self.max_ranges);
            self.set = RangeSet::from_ranges(v);
        }
    }

    pub fn finish(mut self) -> BlockList {
        self.compact();
        BlockList { ranges: self.set }
    }
}

/// Something that can prefetch device byte ranges.
pub trait BlockPrefetch {
    type Error;
    fn prefetch(&mut self, offset: u64, len: u64) -> Result<(), Self::Error>;
}

/// Prefetch into the page cache of a block device node with readahead(2).
pub struct FdPrefetch<'a>(pub &'a std::fs::File);

impl BlockPrefetch for FdPrefetch<'_> {
    type Error = std::io::Error;
    fn prefetch(&mut self, offset: u64, len: u64) -> std::io::Result<()> {
        crate::sys::readahead(std::os::fd::AsFd::as_fd(self.0), offset, len)
    }
}

/// Replays a block list in chunks of at most `chunk` bytes, in offset order. Returns the number
/// of bytes handed to the sink.
pub fn replay_blocks<P: BlockPrefetch>(
    list: &BlockList,
    chunk: u64,
    sink: &mut P,
) -> Result<u64, P::Error> {
    let mut n = 0;
    for r in list.ranges.ranges() {
        for c in r.chunks(chunk) {
            sink.prefetch(c.offset, c.len)?;
            n += c.len;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_chunking() {
        let mut rec = BlockRecorder::new(Duration::from_secs(60), 100);
        for i in 0..10u64 {
            rec.note_read(i * 4096, 4096);
        }
        rec.note_read(1 << 30, 512);
        let list = rec.finish();
        let mut buf = Vec::new();
        list.write(&mut buf).unwrap();
        let back = BlockList::parse(&buf[..], Limits::default()).unwrap();
        assert_eq!(back, list);
        struct V(Vec<(u64, u64)>);
        impl BlockPrefetch for V {
            type Error = ();
            fn prefetch(&mut self, o: u64, l: u64) -> Result<(), ()> {
                self.0.push((o, l));
                Ok(())
            }
        }
        let mut v = V(vec![]);
        assert_eq!(replay_blocks(&back, 16384, &mut v).unwrap(), 40960 + 512);
        assert_eq!(
            v.0,
            vec![(0, 16384), (16384, 16384), (32768, 8192), (1 << 30, 512)]
        );
        let e = BlockList::parse(&b"# x\n1:0\n"[..], Limits::default()).unwrap_err();
        assert_eq!(e.line, 2);
    }

    #[test]
    fn window_and_bound() {
        let mut rec = BlockRecorder::new(Duration::from_secs(0), 10);
        std::thread::sleep(Duration::from_millis(2));
        assert!(!rec.note_read(0, 1));
        let mut rec = BlockRecorder::new(Duration::from_secs(60), 3);
        for i in 0..5000u64 {
            rec.note_read(i * 10, 1);
        }
        assert_eq!(rec.finish().ranges.ranges().len(), 3);
    }
}
