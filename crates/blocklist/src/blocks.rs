//! Block-level readahead lists, for a block device (e.g. the snapshot device's `serve --record`):
//! a device records the byte ranges it served during the first seconds after start with
//! [`BlockRecorder`], saves them as a [`BlockList`] (text: one `offset:length` per line after a
//! header), and on the next start replays them with [`replay_blocks`] into anything that
//! implements [`BlockPrefetch`] (e.g. the snapshot device's own cache). [`BlockFile`] adds `#@ key=value` metadata lines
//! (e.g. the identity of the device a list was recorded on), which plain [`BlockList::parse`]
//! reads as comments.
//!
//! ```
//! use snapblk_blocklist::{BlockPrefetch, BlockRecorder, replay_blocks};
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

use crate::parse::{Limits, ParseError, ParseErrorKind};
use crate::ranges::{Range, RangeSet};
use std::io::{BufRead, Read, Write};
use std::time::{Duration, Instant};

/// Header line of the text form.
pub const BLOCK_HEADER: &str = "# snapblk-block-list v1";

/// A normalised list of device byte ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockList {
    /// The device byte ranges, normalised.
    pub ranges: RangeSet,
}

impl BlockList {
    /// Writes the list in its text form: the header line, then one `OFFSET:LENGTH` per line.
    pub fn write<W: Write>(&self, mut w: W) -> std::io::Result<()> {
        writeln!(w, "{BLOCK_HEADER}")?;
        for r in self.ranges.ranges() {
            writeln!(w, "{}:{}", r.offset, r.len)?;
        }
        Ok(())
    }

    /// Parses the text form (comments and blank lines ignored), bounded like file lists.
    pub fn parse<R: BufRead>(r: R, limits: Limits) -> Result<BlockList, ParseError> {
        parse_inner(r, limits, None)
    }
}

/// Prefix of a metadata line (`#@ key=value`). To [`BlockList::parse`] it is a comment, so lists
/// with metadata stay readable by older parsers; [`BlockFile::parse`] collects it.
pub const META_PREFIX: &str = "#@ ";

/// Most metadata lines a [`BlockFile`] may carry (the rest of the file is bounded by [`Limits`]).
pub const MAX_META: usize = 64;

/// A block list with its metadata (e.g. which device it was recorded on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockFile {
    /// `(key, value)` pairs in file order. Keys are `[A-Za-z0-9_.-]+`; values are one line.
    pub meta: Vec<(String, String)>,
    /// The ranges.
    pub list: BlockList,
}

impl BlockFile {
    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.meta
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Writes the header, the metadata lines, then the ranges. Keys that are not
    /// `[A-Za-z0-9_.-]+` and values with line breaks are refused (they would not read back).
    pub fn write<W: Write>(&self, mut w: W) -> std::io::Result<()> {
        writeln!(w, "{BLOCK_HEADER}")?;
        for (k, v) in &self.meta {
            if !valid_key(k) || v.contains(['\n', '\r']) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("block list metadata {k:?} cannot be written"),
                ));
            }
            writeln!(w, "{META_PREFIX}{k}={v}")?;
        }
        for r in self.list.ranges.ranges() {
            writeln!(w, "{}:{}", r.offset, r.len)?;
        }
        Ok(())
    }

    /// Parses the text form like [`BlockList::parse`], keeping `#@ key=value` lines (at most
    /// [`MAX_META`]; `#@` lines that are not `key=value` are plain comments).
    pub fn parse<R: BufRead>(r: R, limits: Limits) -> Result<BlockFile, ParseError> {
        let mut meta = Vec::new();
        let list = parse_inner(r, limits, Some(&mut meta))?;
        Ok(BlockFile { meta, list })
    }
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn parse_inner<R: BufRead>(
    mut r: R,
    limits: Limits,
    mut meta: Option<&mut Vec<(String, String)>>,
) -> Result<BlockList, ParseError> {
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
            .map_err(|e| err(ParseErrorKind::Io(e)))?;
        if n == 0 {
            break;
        }
        if buf.len() > limits.max_line {
            return Err(err(ParseErrorKind::LineTooLong(limits.max_line)));
        }
        let s = String::from_utf8_lossy(&buf);
        let s = s.trim();
        if let (Some(m), Some(kv)) = (meta.as_deref_mut(), s.strip_prefix(META_PREFIX.trim_end()))
            && let Some((k, v)) = kv.trim().split_once('=')
            && valid_key(k)
        {
            if m.len() >= MAX_META {
                return Err(err(ParseErrorKind::TooManyEntries(MAX_META)));
            }
            m.push((k.to_owned(), v.to_owned()));
            continue;
        }
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
            // Compacting sorts pending + kept ranges: waiting until pending is as large as the
            // kept set keeps the amortised cost per read logarithmic even when sparse reads
            // never merge (a fixed threshold made it linear in the kept set).
            if self.pending.len() >= self.set.ranges().len().max(4096) {
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

    /// The ranges gathered so far, compacted to the recorder's bound.
    pub fn finish(mut self) -> BlockList {
        self.compact();
        BlockList { ranges: self.set }
    }
}

/// Something that can prefetch device byte ranges.
pub trait BlockPrefetch {
    /// Why a prefetch failed.
    type Error;
    /// Starts reading `len` bytes at `offset` of the device into the cache.
    fn prefetch(&mut self, offset: u64, len: u64) -> Result<(), Self::Error>;
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

    #[test]
    fn sparse_reads_across_many_compactions_are_all_kept() {
        // Every other block, in a scattered order: nothing merges, the kept set outgrows the
        // initial compaction threshold several times.
        let n = 20_000u64;
        let mut rec = BlockRecorder::new(Duration::from_secs(60), 1 << 20);
        for i in 0..n {
            let b = (i * 7919) % n;
            rec.note_read(b * 8192, 4096);
            rec.note_read(b * 8192 + 1000, 10); // inside the first: adds nothing
        }
        let l = rec.finish();
        assert_eq!(l.ranges.ranges().len() as u64, n);
        assert_eq!(l.ranges.total_bytes(), n * 4096);
        assert!(
            l.ranges
                .ranges()
                .windows(2)
                .all(|w| w[0].end() < w[1].offset)
        );
    }

    #[test]
    fn block_file_meta_round_trip_and_bounds() {
        let mut rec = BlockRecorder::new(Duration::from_secs(60), 100);
        rec.note_read(8192, 4096);
        rec.note_read(4096, 4096);
        let f = BlockFile {
            meta: vec![
                ("device".into(), "snapshot".into()),
                ("capacity".into(), "1048576".into()),
            ],
            list: rec.finish(),
        };
        let mut buf = Vec::new();
        f.write(&mut buf).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert!(text.starts_with(BLOCK_HEADER), "{text}");
        assert!(text.contains("#@ capacity=1048576\n"), "{text}");
        let back = BlockFile::parse(&buf[..], Limits::default()).unwrap();
        assert_eq!(back, f);
        assert_eq!(back.get("capacity"), Some("1048576"));
        assert_eq!(back.get("nope"), None);
        // Adjacent reads merged into one range.
        assert_eq!(
            back.list.ranges.ranges(),
            &[Range::new(4096, 8192).unwrap()]
        );
        // The plain parser sees metadata as comments.
        assert_eq!(
            BlockList::parse(&buf[..], Limits::default()).unwrap(),
            f.list
        );
        // `#@` lines that are not key=value are comments; bad keys too.
        let odd = BlockFile::parse(&b"#@ hello\n#@ a b=c\n0:1\n"[..], Limits::default()).unwrap();
        assert!(odd.meta.is_empty());
        assert_eq!(odd.list.ranges.total_bytes(), 1);
        // Metadata is bounded.
        let many: String = (0..=MAX_META).map(|i| format!("#@ k{i}=v\n")).collect();
        let e = BlockFile::parse(many.as_bytes(), Limits::default()).unwrap_err();
        assert!(
            matches!(e.kind, ParseErrorKind::TooManyEntries(MAX_META)),
            "{e}"
        );
        assert_eq!(e.line, MAX_META as u64 + 1);
        // Unwritable metadata is refused rather than producing a list that reads back differently.
        let bad = BlockFile {
            meta: vec![("k".into(), "a\nb".into())],
            list: BlockList::default(),
        };
        assert!(bad.write(Vec::new()).is_err());
        let bad = BlockFile {
            meta: vec![("k k".into(), "v".into())],
            list: BlockList::default(),
        };
        assert!(bad.write(Vec::new()).is_err());
    }

    proptest::proptest! {
        #[test]
        fn block_file_round_trips(
            meta in proptest::collection::vec(("[A-Za-z0-9_.-]{1,12}", "[!-~]([ -~]{0,20}[!-~])?"), 0..8),
            ranges in proptest::collection::vec((0u64..1 << 40, 1u64..1 << 20), 0..50),
        ) {
            let list = BlockList {
                ranges: RangeSet::from_ranges(
                    ranges.iter().map(|&(o, l)| Range::new(o, l).unwrap()).collect(),
                ),
            };
            let f = BlockFile { meta, list };
            let mut buf = Vec::new();
            f.write(&mut buf).unwrap();
            proptest::prop_assert_eq!(BlockFile::parse(&buf[..], Limits::default()).unwrap(), f);
        }
    }
}
