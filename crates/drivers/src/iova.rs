//! Device addresses (IOVAs) for DMA mappings: first fit inside the ranges the device accepts
//! (`VFIO_IOMMU_GET_INFO`'s usable ranges for vfio-pci, `VHOST_VDPA_GET_IOVA_RANGE` for
//! vhost-vdpa).

use std::collections::BTreeMap;

/// The IOVA space of a device and what is taken of it.
#[derive(Debug)]
pub(crate) struct IovaSpace {
    /// Usable ranges, inclusive ends, as the kernel reports them.
    ranges: Vec<(u64, u64)>,
    /// Taken: start -> length.
    used: BTreeMap<u64, u64>,
    /// The smallest page: every start and length is a multiple of it.
    align: u64,
}

impl IovaSpace {
    /// `align` is a power of two. IOVA 0 is never handed out.
    pub(crate) fn new(ranges: Vec<(u64, u64)>, align: u64) -> IovaSpace {
        IovaSpace {
            ranges,
            used: BTreeMap::new(),
            align: align.max(1),
        }
    }

    /// Take `len` bytes (rounded up to the alignment); `None` when no range has room.
    pub(crate) fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.max(1).checked_next_multiple_of(self.align)?;
        for &(s, e) in &self.ranges {
            let Some(mut at) = s.max(self.align).checked_next_multiple_of(self.align) else {
                continue;
            };
            for (&us, &ul) in &self.used {
                if us.saturating_add(ul) <= at {
                    continue;
                }
                if at.checked_add(len).is_some_and(|end| end <= us) {
                    break;
                }
                match us.saturating_add(ul).checked_next_multiple_of(self.align) {
                    Some(n) => at = n,
                    None => return None,
                }
            }
            if at.checked_add(len - 1).is_some_and(|last| last <= e) {
                self.used.insert(at, len);
                return Some(at);
            }
        }
        None
    }

    /// Give back what [`IovaSpace::alloc`] returned.
    pub(crate) fn free(&mut self, iova: u64) {
        self.used.remove(&iova);
    }
}

#[cfg(test)]
mod tests {
    use super::IovaSpace;

    #[test]
    fn allocations_are_aligned_disjoint_and_inside_the_ranges() {
        let mut s = IovaSpace::new(vec![(0, 0x3fff), (0x10000, 0x1ffff)], 0x1000);
        // IOVA 0 is skipped: the first range holds 3 pages.
        assert_eq!(s.alloc(1), Some(0x1000));
        assert_eq!(s.alloc(0x2000), Some(0x2000));
        // The first range is full: the next one is used.
        assert_eq!(s.alloc(0x1000), Some(0x10000));
        assert_eq!(s.alloc(0x10000), None, "0xf000 bytes are left");
        assert_eq!(s.alloc(0xf000), Some(0x11000));
        assert_eq!(s.alloc(1), None);
        // A freed hole is reused.
        s.free(0x2000);
        assert_eq!(s.alloc(0x1800), Some(0x2000));
    }

    #[test]
    fn a_range_ending_at_the_top_of_the_space_does_not_overflow() {
        let mut s = IovaSpace::new(vec![(u64::MAX - 0x1fff, u64::MAX)], 0x1000);
        assert_eq!(s.alloc(0x1000), Some(u64::MAX - 0x1fff));
        assert_eq!(s.alloc(0x1000), Some(u64::MAX - 0xfff));
        assert_eq!(s.alloc(0x1000), None);
        assert_eq!(s.alloc(u64::MAX), None);
    }

    proptest::proptest! {
        #[test]
        fn never_overlaps(ops in proptest::collection::vec((0u64..0x5000, proptest::bool::ANY), 1..60)) {
            const PAGE: u64 = 0x1000;
            let mut a = IovaSpace::new(vec![(3 * PAGE, 200 * PAGE - 1)], PAGE);
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
