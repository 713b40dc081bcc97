//! IOVAs for the device: first-fit allocation of page-aligned ranges inside the range the
//! device accepts (`VHOST_VDPA_GET_IOVA_RANGE`).

/// Allocation granule and alignment (`VHOST_PAGE_SIZE`, libblkio's `mem-region-alignment`).
pub(crate) const PAGE: u64 = 4096;

/// The device's IOVA range and the ranges handed out, sorted by start.
#[derive(Debug)]
pub(crate) struct Iovas {
    first: u64,
    /// Inclusive.
    last: u64,
    used: Vec<(u64, u64)>,
}

impl Iovas {
    /// `first..=last` as the device reports it.
    pub(crate) fn new(first: u64, last: u64) -> Iovas {
        Iovas {
            first,
            last,
            used: Vec::new(),
        }
    }

    /// A free range of `len` bytes (rounded up to [`PAGE`]), page-aligned; `None` if the
    /// device's range has no such gap.
    pub(crate) fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.max(1).checked_next_multiple_of(PAGE)?;
        let mut at = self.first.checked_next_multiple_of(PAGE)?;
        let mut slot = self.used.len();
        for (i, &(s, l)) in self.used.iter().enumerate() {
            if at.checked_add(len)? <= s {
                slot = i;
                break;
            }
            at = at.max((s + l).checked_next_multiple_of(PAGE)?);
        }
        let end = at.checked_add(len - 1)?;
        if end > self.last {
            return None;
        }
        self.used.insert(slot, (at, len));
        Some(at)
    }

    /// Give back the range starting at `iova`.
    pub(crate) fn free(&mut self, iova: u64) {
        self.used.retain(|&(s, _)| s != iova);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_aligned_disjoint_and_inside() {
        let mut a = Iovas::new(1, 64 * PAGE - 1);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(3 * PAGE).unwrap();
        let z = a.alloc(PAGE + 1).unwrap();
        assert_eq!((x, y, z), (PAGE, 2 * PAGE, 5 * PAGE));
        a.free(y);
        // First fit: the freed gap is reused by what fits in it.
        assert_eq!(a.alloc(2 * PAGE), Some(2 * PAGE));
        assert_eq!(a.alloc(PAGE), Some(4 * PAGE));
        assert_eq!(a.alloc(PAGE), Some(7 * PAGE));
        // The end of the range is honoured (the last page is 63).
        assert_eq!(a.alloc(56 * PAGE), Some(8 * PAGE));
        assert_eq!(a.alloc(PAGE), None);
    }

    #[test]
    fn full_address_space_does_not_overflow() {
        let mut a = Iovas::new(0, u64::MAX);
        assert_eq!(a.alloc(PAGE), Some(0));
        assert_eq!(a.alloc(u64::MAX - 2 * PAGE), Some(PAGE));
        assert_eq!(a.alloc(u64::MAX), None);
    }

    proptest::proptest! {
        #[test]
        fn never_overlaps(ops in proptest::collection::vec((0u64..5 * PAGE, proptest::bool::ANY), 1..60)) {
            let mut a = Iovas::new(3 * PAGE, 200 * PAGE - 1);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (len, free) in ops {
                if free && !live.is_empty() {
                    let (s, _) = live.remove(len as usize % live.len());
                    a.free(s);
                    continue;
                }
                if let Some(s) = a.alloc(len) {
                    let l = len.max(1).next_multiple_of(PAGE);
                    proptest::prop_assert!(s.is_multiple_of(PAGE) && s >= 3 * PAGE && s + l <= 200 * PAGE);
                    for &(t, m) in &live {
                        proptest::prop_assert!(s + l <= t || t + m <= s);
                    }
                    live.push((s, l));
                }
            }
        }
    }
}
