//! The bounded block cache: whole blocks of one object in memory, least recently used out
//! first, and the blocks some read is fetching right now (so that concurrent reads of one
//! block wait for its GET instead of sending their own).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Blocks by index, at most `cap` of them.
pub(crate) struct BlockCache {
    cap: usize,
    tick: u64,
    blocks: HashMap<u64, (Arc<[u8]>, u64)>,
    /// Last use → block index.
    lru: BTreeMap<u64, u64>,
    /// Blocks a GET in flight is fetching.
    fetching: HashSet<u64>,
}

impl BlockCache {
    /// A cache of at most `cap` blocks (0: keeps nothing).
    pub(crate) fn new(cap: usize) -> Self {
        BlockCache {
            cap,
            tick: 0,
            blocks: HashMap::new(),
            lru: BTreeMap::new(),
            fetching: HashSet::new(),
        }
    }

    /// Whether a read is fetching block `idx` now.
    pub(crate) fn is_fetching(&self, idx: u64) -> bool {
        self.fetching.contains(&idx)
    }

    /// Mark blocks `range` as being fetched (true) or no longer (false).
    pub(crate) fn set_fetching(&mut self, range: std::ops::Range<u64>, on: bool) {
        for i in range {
            if on {
                self.fetching.insert(i);
            } else {
                self.fetching.remove(&i);
            }
        }
    }

    /// Block `idx`, marked as just used.
    pub(crate) fn get(&mut self, idx: u64) -> Option<Arc<[u8]>> {
        self.tick += 1;
        let tick = self.tick;
        let (data, used) = self.blocks.get_mut(&idx)?;
        self.lru.remove(used);
        *used = tick;
        self.lru.insert(tick, idx);
        Some(data.clone())
    }

    /// Whether block `idx` is cached (without marking it used).
    pub(crate) fn contains(&self, idx: u64) -> bool {
        self.blocks.contains_key(&idx)
    }

    /// Keep block `idx`, evicting the least recently used blocks beyond the capacity.
    pub(crate) fn insert(&mut self, idx: u64, data: Arc<[u8]>) {
        if self.cap == 0 {
            return;
        }
        self.tick += 1;
        if let Some((_, used)) = self.blocks.insert(idx, (data, self.tick)) {
            self.lru.remove(&used);
        }
        self.lru.insert(self.tick, idx);
        while self.blocks.len() > self.cap {
            let Some((_, old)) = self.lru.pop_first() else {
                break;
            };
            self.blocks.remove(&old);
        }
    }

    /// Blocks held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(x: u8) -> Arc<[u8]> {
        Arc::from(vec![x; 4])
    }

    #[test]
    fn evicts_least_recently_used_within_capacity() {
        let mut c = BlockCache::new(2);
        c.insert(1, b(1));
        c.insert(2, b(2));
        assert!(c.get(1).is_some());
        c.insert(3, b(3));
        assert!(c.contains(1) && !c.contains(2) && c.contains(3));
        assert_eq!(c.len(), 2);
        c.insert(3, b(4));
        assert_eq!(c.get(3).unwrap()[0], 4);
        assert_eq!(c.len(), 2);
        let mut z = BlockCache::new(0);
        z.insert(1, b(1));
        assert_eq!(z.len(), 0);
    }
}
