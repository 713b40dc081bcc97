//! Scheduled access to the base and COW devices, and the decoded-unit cache.

use crate::dev::BlockDev;
use crate::error::{Result, SnapError};
use crate::sched::{FgLane, IoClass, Scheduler};
use snapblk_core::read_error;
use snapblk_core::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Which backing device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dev {
    /// The base device: the old image, which the merge overwrites in place.
    Base = 0,
    /// The device holding the Android COW file (ops, payloads, scratch area, merge header).
    Cow = 1,
}

/// The base and COW devices behind the scheduler. Background I/O is split into pieces no larger
/// than the scheduler's current budget.
pub(crate) struct Io {
    /// The base device (old image; merge target).
    pub base: Arc<dyn BlockDev>,
    /// The COW device (ops, payloads, scratch area and merge state).
    pub cow: Arc<dyn BlockDev>,
    /// The scheduler every base/COW request is admitted through (foreground, merge and
    /// readahead classes).
    pub sched: Arc<Scheduler>,
    /// Duplicates of the devices' files when they offer one ([`ReadAt::as_file`]): foreground
    /// reads `pread` them directly.
    ///
    /// [`ReadAt::as_file`]: snapblk_core::ReadAt::as_file
    files: [Option<File>; 2],
}

impl Io {
    /// Base and COW behind `sched`.
    pub(crate) fn new(
        base: Arc<dyn BlockDev>,
        cow: Arc<dyn BlockDev>,
        sched: Arc<Scheduler>,
    ) -> Self {
        // Without a duplicate (out of descriptors) reads simply go through the device.
        let dup = |d: &Arc<dyn BlockDev>| d.as_file().and_then(|f| f.try_clone().ok());
        Io {
            files: [dup(&base), dup(&cow)],
            base,
            cow,
            sched,
        }
    }

    pub(crate) fn dev(&self, d: Dev) -> &dyn BlockDev {
        match d {
            Dev::Base => &*self.base,
            Dev::Cow => &*self.cow,
        }
    }

    fn what(d: Dev, write: bool) -> &'static str {
        match (d, write) {
            (Dev::Base, false) => "reading base",
            (Dev::Base, true) => "writing base",
            (Dev::Cow, false) => "reading COW",
            (Dev::Cow, true) => "writing COW",
        }
    }

    /// Read `buf.len()` bytes at `off`.
    #[inline]
    pub(crate) fn read(&self, class: IoClass, d: Dev, off: u64, buf: &mut [u8]) -> Result<()> {
        if class == IoClass::Foreground {
            let _t = self.sched.admit(class, buf.len() as u64);
            // One pread in the common case; short reads and errors take the device's own path
            // (which retries and reports them).
            if let Some(f) = &self.files[d as usize]
                && std::os::unix::fs::FileExt::read_at(f, buf, off).is_ok_and(|n| n == buf.len())
            {
                return Ok(());
            }
            return self.read_fg_slow(d, off, buf);
        }
        self.read_bg(class, d, off, buf)
    }

    /// A foreground read that only says whether it worked: one `pread` of the device's file
    /// (the device's own exact read when it has none), counted on the queue's `lane` when
    /// given, else admitted by the scheduler. True when all of `buf` was read; false when the
    /// `pread` failed or came short (or the exact read failed), and the caller reads again
    /// through [`Io::read`], which retries and reports (the failed attempt counts as a
    /// foreground request of its own).
    #[inline]
    pub(crate) fn try_read_fg(
        &self,
        lane: Option<&FgLane>,
        d: Dev,
        off: u64,
        buf: &mut [u8],
    ) -> bool {
        match lane {
            Some(l) => {
                l.begin(buf.len() as u64);
                let ok = self.try_read_once(d, off, buf);
                l.end();
                ok
            }
            None => {
                let _t = self.sched.admit(IoClass::Foreground, buf.len() as u64);
                self.try_read_once(d, off, buf)
            }
        }
    }

    #[inline]
    fn try_read_once(&self, d: Dev, off: u64, buf: &mut [u8]) -> bool {
        match &self.files[d as usize] {
            Some(f) => {
                std::os::unix::fs::FileExt::read_at(f, buf, off).is_ok_and(|n| n == buf.len())
            }
            None => self.try_read_dev(d, off, buf),
        }
    }

    /// [`Io::try_read_fg`] of a device without a file, out of the `pread`'s way.
    #[inline(never)]
    fn try_read_dev(&self, d: Dev, off: u64, buf: &mut [u8]) -> bool {
        self.dev(d).read_exact_at(off, buf).is_ok()
    }

    /// A foreground read that the fd fast path did not finish (no fd, a short read, an error):
    /// the device's own exact read, which retries and reports. Kept out of line so that
    /// [`Io::read`]'s fast path stays small enough to inline into the request dispatch.
    #[cold]
    #[inline(never)]
    fn read_fg_slow(&self, d: Dev, off: u64, buf: &mut [u8]) -> Result<()> {
        self.dev(d)
            .read_exact_at(off, buf)
            .map_err(|e| SnapError::io(Self::what(d, false))(read_error(off, e)))
    }

    /// Background reads go in pieces of at most the scheduler's budget.
    #[inline(never)]
    fn read_bg(&self, class: IoClass, d: Dev, off: u64, buf: &mut [u8]) -> Result<()> {
        let mut pos = 0usize;
        while pos < buf.len() {
            let n = (self.sched.chunk() as usize).min(buf.len() - pos);
            let _t = self.sched.admit(class, n as u64);
            let at = off + pos as u64;
            self.dev(d)
                .read_exact_at(at, &mut buf[pos..pos + n])
                .map_err(|e| SnapError::io(Self::what(d, false))(read_error(at, e)))?;
            pos += n;
        }
        Ok(())
    }

    /// Write `buf` at `off`.
    pub(crate) fn write(&self, class: IoClass, d: Dev, off: u64, buf: &[u8]) -> Result<()> {
        let mut pos = 0usize;
        while pos < buf.len() {
            let n = if class == IoClass::Foreground {
                buf.len()
            } else {
                (self.sched.chunk() as usize).min(buf.len() - pos)
            };
            let _t = self.sched.admit(class, n as u64);
            self.dev(d)
                .write_all_at(off + pos as u64, &buf[pos..pos + n])
                .map_err(SnapError::io(Self::what(d, true)))?;
            pos += n;
        }
        Ok(())
    }

    /// Flush one device.
    pub(crate) fn flush(&self, class: IoClass, d: Dev) -> Result<()> {
        let _t = self.sched.admit(class, 0);
        self.dev(d).sync_data().map_err(SnapError::io(match d {
            Dev::Base => "flushing base",
            Dev::Cow => "flushing COW",
        }))
    }
}

/// Decoded-unit cache counters.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CacheStats {
    /// Lookups that found the decoded unit in the cache, since the cache was created.
    pub hits: u64,
    /// Lookups that did not, so the payload had to be read and decoded.
    pub misses: u64,
    /// Decoded bytes held in the cache now.
    pub bytes: u64,
    /// The cache's byte limit (0: the cache is disabled).
    pub capacity: u64,
}

struct Entry {
    data: Arc<Vec<u8>>,
    referenced: bool,
}

/// Hashes the cache's u64 keys (payload file offsets) with one multiply: the default SipHash
/// cost more than the rest of a cache lookup.
#[derive(Default)]
struct OffsetHasher(u64);

impl std::hash::Hasher for OffsetHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, k: u64) {
        // Fibonacci hashing; the shift brings the well-mixed high bits down to the low bits the
        // table indexes with.
        let x = (k ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 32);
    }
}

type OffsetMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<OffsetHasher>>;

#[derive(Default)]
struct CacheInner {
    map: OffsetMap<Entry>,
    fifo: VecDeque<u64>,
    bytes: u64,
}

/// A bounded cache of decoded payload units, keyed by payload file offset, with second-chance
/// FIFO eviction (cheap, and scan-resistant enough for sequential reads of multi-block units).
pub(crate) struct UnitCache {
    cap: u64,
    inner: Mutex<CacheInner>,
    /// Bytes held, readable without the lock (a cache nobody filled is skipped at no cost).
    held: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl UnitCache {
    /// A cache holding at most `cap` bytes of decoded data (0 disables it).
    pub(crate) fn new(cap: u64) -> Self {
        UnitCache {
            cap,
            inner: Mutex::new(CacheInner::default()),
            held: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        lock(&self.inner)
    }

    /// Whether a unit of `len` bytes would be kept.
    pub(crate) fn accepts(&self, len: u64) -> bool {
        len <= self.cap
    }

    /// The unit at `key`, if cached.
    pub(crate) fn get(&self, key: u64) -> Option<Arc<Vec<u8>>> {
        if self.held.load(Ordering::Relaxed) == 0 {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let mut g = self.lock();
        match g.map.get_mut(&key) {
            Some(e) => {
                e.referenced = true;
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(e.data.clone())
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Insert a decoded unit, evicting as needed.
    pub(crate) fn insert(&self, key: u64, data: Arc<Vec<u8>>) {
        let len = data.len() as u64;
        if len > self.cap {
            return;
        }
        let mut g = self.lock();
        if g.map.contains_key(&key) {
            return;
        }
        while g.bytes + len > self.cap {
            let Some(k) = g.fifo.pop_front() else { break };
            let second_chance = match g.map.get_mut(&k) {
                Some(e) if e.referenced => {
                    e.referenced = false;
                    true
                }
                _ => false,
            };
            if second_chance {
                g.fifo.push_back(k);
            } else if let Some(e) = g.map.remove(&k) {
                g.bytes -= e.data.len() as u64;
            }
        }
        g.bytes += len;
        self.held.store(g.bytes, Ordering::Relaxed);
        g.fifo.push_back(key);
        g.map.insert(
            key,
            Entry {
                data,
                referenced: false,
            },
        );
    }

    /// Counters.
    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes: self.lock().bytes,
            capacity: self.cap,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_is_bounded_and_gives_second_chances() {
        let c = UnitCache::new(3 * 4096);
        for k in 0..3 {
            c.insert(k, Arc::new(vec![k as u8; 4096]));
        }
        assert!(c.get(0).is_some());
        c.insert(3, Arc::new(vec![3; 4096]));
        assert!(c.get(0).is_some(), "referenced entry survived");
        assert!(c.get(1).is_none(), "oldest unreferenced entry evicted");
        assert!(c.stats().bytes <= 3 * 4096);
        c.insert(9, Arc::new(vec![0; 5 * 4096]));
        assert!(c.get(9).is_none(), "oversize units are not cached");
    }
}
