//! Byte ranges and normalised range sets (sorted, non-overlapping, non-adjacent).

use serde::{Deserialize, Serialize};

/// A byte range `[offset, offset + len)`. `len > 0` and the end never overflows `u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Range {
    /// First byte of the range.
    pub offset: u64,
    /// Length in bytes (never 0).
    pub len: u64,
}

impl Range {
    /// Creates a range, or `None` if it is empty or its end overflows.
    pub fn new(offset: u64, len: u64) -> Option<Range> {
        if len == 0 {
            return None;
        }
        offset.checked_add(len)?;
        Some(Range { offset, len })
    }

    /// One past the last byte of the range.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// Clips to `[0, limit)`; `None` if nothing is left.
    pub fn clip(&self, limit: u64) -> Option<Range> {
        let end = self.end().min(limit);
        if end <= self.offset {
            None
        } else {
            Some(Range {
                offset: self.offset,
                len: end - self.offset,
            })
        }
    }

    /// Widens to whole pages of `page` bytes (page is a power of two).
    pub fn page_align(&self, page: u64) -> Range {
        let start = self.offset & !(page - 1);
        let end = self
            .end()
            .checked_next_multiple_of(page)
            .unwrap_or(!(page - 1));
        Range {
            offset: start,
            len: end.max(start + page) - start,
        }
    }

    /// Splits into pieces of at most `chunk` bytes, aligned to multiples of `chunk`.
    pub fn chunks(&self, chunk: u64) -> impl Iterator<Item = Range> + '_ {
        let chunk = chunk.max(1);
        let mut pos = self.offset;
        let end = self.end();
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let next = (pos / chunk)
                .saturating_add(1)
                .saturating_mul(chunk)
                .min(end);
            let r = Range {
                offset: pos,
                len: next - pos,
            };
            pos = next;
            Some(r)
        })
    }
}

/// A normalised set of ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<Range>,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a normalised set from arbitrary (unsorted, overlapping) ranges.
    pub fn from_ranges(mut v: Vec<Range>) -> Self {
        v.sort_unstable();
        let mut out: Vec<Range> = Vec::with_capacity(v.len());
        for r in v {
            match out.last_mut() {
                Some(last) if r.offset <= last.end() => {
                    let end = last.end().max(r.end());
                    last.len = end - last.offset;
                }
                _ => out.push(r),
            }
        }
        RangeSet { ranges: out }
    }

    /// Appends a range that starts at or after the end of the last one (used by page scans).
    pub fn push_sorted(&mut self, r: Range) {
        match self.ranges.last_mut() {
            Some(last) if r.offset <= last.end() => {
                let end = last.end().max(r.end());
                last.len = end - last.offset;
            }
            _ => self.ranges.push(r),
        }
    }

    /// The ranges, sorted, non-overlapping and non-adjacent.
    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    /// The ranges, as [`ranges`](Self::ranges) orders them.
    pub fn into_vec(self) -> Vec<Range> {
        self.ranges
    }

    /// Whether the set holds no byte.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The number of bytes the set covers.
    pub fn total_bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }

    /// `self ∪ other`, normalised.
    pub fn union(self, other: RangeSet) -> RangeSet {
        if other.is_empty() {
            return self;
        }
        RangeSet::from_ranges([self.ranges, other.ranges].concat())
    }

    /// `self \ other`.
    pub fn difference(&self, other: &RangeSet) -> RangeSet {
        let mut out = RangeSet::new();
        let o = &other.ranges;
        let mut j = 0;
        for r in &self.ranges {
            let mut start = r.offset;
            let end = r.end();
            while j < o.len() && o[j].end() <= start {
                j += 1;
            }
            let mut k = j;
            while start < end && k < o.len() && o[k].offset < end {
                if o[k].offset > start {
                    out.ranges.push(Range {
                        offset: start,
                        len: o[k].offset - start,
                    });
                }
                start = start.max(o[k].end());
                k += 1;
            }
            if start < end {
                out.ranges.push(Range {
                    offset: start,
                    len: end - start,
                });
            }
        }
        out
    }

    /// Clips every range to `[0, limit)`.
    pub fn clip(&self, limit: u64) -> RangeSet {
        RangeSet {
            ranges: self.ranges.iter().filter_map(|r| r.clip(limit)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(o: u64, l: u64) -> Range {
        Range::new(o, l).unwrap()
    }

    #[test]
    fn merge_and_difference() {
        let a = RangeSet::from_ranges(vec![r(10, 10), r(0, 5), r(5, 2), r(30, 5)]);
        assert_eq!(a.ranges(), &[r(0, 7), r(10, 10), r(30, 5)]);
        let b = RangeSet::from_ranges(vec![r(2, 1), r(12, 20)]);
        assert_eq!(
            a.difference(&b).ranges(),
            &[r(0, 2), r(3, 4), r(10, 2), r(32, 3)]
        );
        assert_eq!(a.clone().union(b).ranges(), &[r(0, 7), r(10, 25)]);
        assert_eq!(a.clone().union(RangeSet::new()), a);
    }

    #[test]
    fn chunks_are_aligned() {
        let v: Vec<_> = r(100, 300).chunks(128).collect();
        assert_eq!(v, vec![r(100, 28), r(128, 128), r(256, 128), r(384, 16)]);
        assert!(Range::new(u64::MAX, 2).is_none());
        assert_eq!(r(5, 1).page_align(4096), r(0, 4096));
        assert_eq!(r(4095, 2).page_align(4096), r(0, 8192));
    }

    proptest! {
        #[test]
        fn difference_matches_bitmap(a in proptest::collection::vec((0u64..200, 1u64..40), 0..8),
                                     b in proptest::collection::vec((0u64..200, 1u64..40), 0..8)) {
            let sa = RangeSet::from_ranges(a.iter().map(|&(o, l)| r(o, l)).collect());
            let sb = RangeSet::from_ranges(b.iter().map(|&(o, l)| r(o, l)).collect());
            let d = sa.difference(&sb);
            let mut bits = [0u8; 256];
            for x in sa.ranges() { for i in x.offset..x.end() { bits[i as usize] |= 1; } }
            for x in sb.ranges() { for i in x.offset..x.end() { bits[i as usize] |= 2; } }
            let mut got = [false; 256];
            for x in d.ranges() { for i in x.offset..x.end() { got[i as usize] = true; } }
            for i in 0..256 { prop_assert_eq!(got[i], bits[i] == 1); }
            // normalised: sorted, non-adjacent
            for w in d.ranges().windows(2) { prop_assert!(w[0].end() < w[1].offset); }
        }
    }
}
