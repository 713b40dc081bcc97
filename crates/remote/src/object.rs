//! [`RemoteObject`]: one remote object, pinned to the version it was opened at, read by
//! position through the block cache.

use crate::cache::BlockCache;
use crate::config::{RemoteConfig, Target};
use crate::error::{RemoteError, Result};
use crate::http::{Body, Client, parse_content_range};
use snapblk_core::sync::{lock, wait};
use snapblk_core::{ReadAt, WriteAt};
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Most blocks one GET fetches ...
const MAX_RUN_BLOCKS: u64 = 64;
/// ... and most bytes (with large blocks, fewer of them).
const MAX_RUN_BYTES: u64 = 64 << 20;

/// Counters of a [`RemoteObject`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Ranged GETs sent (one per fetched run of blocks; retries not counted).
    pub requests: u64,
    /// Response body bytes received.
    pub bytes_fetched: u64,
    /// Block lookups served from the cache.
    pub hits: u64,
    /// Block lookups that had to fetch.
    pub misses: u64,
}

impl RemoteStats {
    /// One-line JSON.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"requests\":{},\"bytes_fetched\":{},\"hits\":{},\"misses\":{}}}",
            self.requests, self.bytes_fetched, self.hits, self.misses
        )
    }
}

/// How the object's version is pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pin {
    /// `If-Match: ETAG` on every read.
    ETag(String),
    /// `If-Unmodified-Since: DATE` (a server without ETags); a reply with another
    /// Last-Modified date or size is refused too (servers that ignore the condition).
    LastModified(String),
    /// The server gives neither: reads are not pinned ([`RemoteConfig::allow_unpinned`]).
    None,
}

/// A remote object read by position: its size and version are fixed when it is opened (a HEAD),
/// every later ranged GET carries `If-Match` with that ETag, so a replaced object fails with
/// [`RemoteError::Changed`] instead of mixing versions. Reads fetch whole blocks into a bounded
/// LRU cache; a read that continues the previous one also fetches the next
/// [`RemoteConfig::readahead_blocks`] blocks in the same GET.
pub struct RemoteObject {
    client: Client,
    target: Target,
    size: u64,
    pin: Pin,
    block: u64,
    cache: Mutex<BlockCache>,
    /// Signalled when a GET's blocks are in the cache (or it failed).
    fetched: Condvar,
    /// Reads that waited for another read's GET (tests watch it).
    #[cfg(test)]
    pub(crate) waited: AtomicU64,
    /// End offset of the last read (sequential detection).
    last_end: AtomicU64,
    requests: AtomicU64,
    bytes: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for RemoteObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteObject")
            .field("url", &self.target.display)
            .field("size", &self.size)
            .field("pin", &self.pin)
            .finish_non_exhaustive()
    }
}

impl RemoteObject {
    /// Open `url` (`s3://BUCKET/KEY`, `http(s)://…`): one HEAD for its size and ETag.
    pub fn open(url: &str, cfg: &RemoteConfig) -> Result<RemoteObject> {
        cfg.validate()?;
        let target = Target::parse(url, cfg)?;
        let client = Client::new(cfg);
        let resp = client.send(&target, "HEAD", &[], &Body::Empty, None)?;
        let bad = |why: &str| RemoteError::BadResponse {
            url: target.display.clone(),
            why: why.to_owned(),
        };
        let size = resp
            .header("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| bad("HEAD gave no Content-Length"))?;
        if size > i64::MAX as u64 {
            return Err(bad("Content-Length above 2^63-1"));
        }
        let pin = match (resp.header("etag"), resp.header("last-modified")) {
            (Some(e), _) if !e.trim().is_empty() => Pin::ETag(e.trim().to_owned()),
            (_, Some(d)) if !d.trim().is_empty() => Pin::LastModified(d.trim().to_owned()),
            _ if cfg.allow_unpinned => Pin::None,
            _ => {
                return Err(RemoteError::Unpinned {
                    url: target.display.clone(),
                });
            }
        };
        let cap = usize::try_from(cfg.cache_bytes / cfg.block_size).unwrap_or(usize::MAX);
        Ok(RemoteObject {
            block: cfg.block_size,
            client,
            target,
            size,
            pin,
            cache: Mutex::new(BlockCache::new(cap)),
            fetched: Condvar::new(),
            #[cfg(test)]
            waited: AtomicU64::new(0),
            last_end: AtomicU64::new(u64::MAX),
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// Size in bytes, as of opening.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Whether the object is empty.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The object's name: its URL as given.
    pub fn name(&self) -> &str {
        &self.target.display
    }

    /// The ETag reads are pinned to, if the server gave one.
    pub fn etag(&self) -> Option<&str> {
        match &self.pin {
            Pin::ETag(e) => Some(e),
            _ => None,
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> RemoteStats {
        RemoteStats {
            requests: self.requests.load(Ordering::Relaxed),
            bytes_fetched: self.bytes.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// Fetch bytes `[start, end)` (inside the object) with one ranged GET into `out`; no
    /// further attempt once `halted` says so.
    fn fetch(
        &self,
        start: u64,
        end: u64,
        out: &mut [u8],
        halted: Option<Halted<'_>>,
    ) -> Result<()> {
        let range = format!("bytes={}-{}", start, end - 1);
        let mut headers: Vec<(&str, &str)> = vec![("range", &range)];
        let pin = match &self.pin {
            Pin::ETag(e) => {
                headers.push(("if-match", e));
                Some(e.as_str())
            }
            Pin::LastModified(d) => {
                headers.push(("if-unmodified-since", d));
                Some(d.as_str())
            }
            Pin::None => None,
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        let body = match halted {
            Some(halted) => Body::EmptyUntil { halted },
            None => Body::Empty,
        };
        let resp = self
            .client
            .get_range(&self.target, &headers, &body, pin, end - start)?;
        let bad = |why: String| RemoteError::BadResponse {
            url: self.target.display.clone(),
            why,
        };
        let changed = match (&self.pin, resp.header("etag"), resp.header("last-modified")) {
            (Pin::ETag(want), Some(got), _) => got.trim() != want,
            // A server may ignore If-Unmodified-Since: its reply says which version it is.
            (Pin::LastModified(want), _, Some(got)) => got.trim() != want,
            _ => false,
        };
        if changed {
            return Err(RemoteError::Changed {
                url: self.target.display.clone(),
                etag: pin.unwrap_or("unknown").to_owned(),
            });
        }
        let status = resp.status();
        let skip = match status {
            206 => {
                let cr = resp.header("content-range").unwrap_or("");
                match parse_content_range(cr) {
                    Some((a, b, total))
                        if a == start && b == end - 1 && total.is_none_or(|t| t == self.size) => {}
                    Some((_, _, Some(t))) if t != self.size => {
                        return Err(RemoteError::Changed {
                            url: self.target.display.clone(),
                            etag: pin.unwrap_or("unknown").to_owned(),
                        });
                    }
                    _ => return Err(bad(format!("asked for {range}, got Content-Range {cr:?}"))),
                }
                0
            }
            // A server that ignores Range sends the whole object: skip to the range (only
            // tolerable for small objects, so refuse large skips).
            200 if start < (16 << 20) => {
                let len = resp.header("content-length").map(str::trim);
                if len.is_some_and(|l| l != self.size.to_string()) {
                    return Err(RemoteError::Changed {
                        url: self.target.display.clone(),
                        etag: pin.unwrap_or("unknown").to_owned(),
                    });
                }
                start
            }
            _ => return Err(bad(format!("HTTP {status} to a ranged GET of {range}"))),
        };
        let mut r = resp.into_reader();
        if skip > 0 {
            let n = io::copy(&mut (&mut r).take(skip), &mut io::sink()).map_err(|source| {
                RemoteError::Body {
                    url: self.target.display.clone(),
                    source,
                }
            })?;
            self.bytes.fetch_add(n, Ordering::Relaxed);
        }
        r.read_exact(out).map_err(|source| RemoteError::Body {
            url: self.target.display.clone(),
            source,
        })?;
        self.bytes.fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Read exactly `buf.len()` bytes at `offset`; a range that does not lie inside the object
    /// fails with [`RemoteError::OutOfRange`].
    pub fn read_exact_remote(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_exact_until(offset, buf, None)
    }

    /// [`RemoteObject::read_exact_remote`], making no further HTTP attempt once `halted` says
    /// so (the request then fails with [`RemoteError::Stopped`]).
    pub(crate) fn read_exact_until(
        &self,
        offset: u64,
        buf: &mut [u8],
        halted: Option<Halted<'_>>,
    ) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| RemoteError::OutOfRange {
                url: self.target.display.clone(),
                offset,
                len: buf.len() as u64,
                size: self.size,
            })?;
        let bs = self.block;
        let max_run = (MAX_RUN_BYTES / bs).clamp(1, MAX_RUN_BLOCKS);
        let nblocks = self.size.div_ceil(bs);
        let (first, last) = (offset / bs, (end - 1) / bs);
        let sequential = self.last_end.swap(end, Ordering::Relaxed) == offset;
        let mut i = first;
        while i <= last {
            let mut c = lock(&self.cache);
            if let Some(data) = c.get(i) {
                drop(c);
                self.hits.fetch_add(1, Ordering::Relaxed);
                copy_block(i, bs, &data, offset, buf);
                i += 1;
                continue;
            }
            if c.is_fetching(i) {
                // Another read's GET brings this block: wait for it, then look again (it may
                // have failed, or the block been evicted at once: then fetch it here).
                #[cfg(test)]
                self.waited.fetch_add(1, Ordering::Relaxed);
                drop(wait(&self.fetched, c));
                continue;
            }
            // A run of missing blocks, fetched by one GET, plus readahead past a sequential read.
            let free = |c: &BlockCache, j: u64| !c.contains(j) && !c.is_fetching(j);
            let mut j = i + 1;
            while j <= last && j - i < max_run && free(&c, j) {
                j += 1;
            }
            if j > last && sequential {
                let stop = (last + 1 + self.client.config().readahead_blocks)
                    .min(nblocks)
                    .min(i + max_run);
                while j < stop && free(&c, j) {
                    j += 1;
                }
            }
            c.set_fetching(i..j, true);
            drop(c);
            let _done = Fetching {
                obj: self,
                blocks: i..j,
            };
            let (start, stop) = (i * bs, (j * bs).min(self.size));
            let mut data = vec![0u8; (stop - start) as usize];
            self.fetch(start, stop, &mut data, halted)?;
            let mut c = lock(&self.cache);
            for (k, chunk) in (i..j).zip(data.chunks(bs as usize)) {
                self.misses.fetch_add(1, Ordering::Relaxed);
                let blk: Arc<[u8]> = Arc::from(chunk);
                if k <= last {
                    copy_block(k, bs, &blk, offset, buf);
                }
                c.insert(k, blk);
            }
            i = j;
        }
        Ok(())
    }
}

impl RemoteObject {
    /// Read `len` bytes at `offset` from the cache alone: when every block is cached, hand
    /// each piece to `sink(position in the read, bytes)` in order and return true (counted as
    /// hits, and as the last read for sequential detection); otherwise touch nothing and
    /// return false. The range must lie inside the object.
    pub(crate) fn read_cached(
        &self,
        offset: u64,
        len: u64,
        mut sink: impl FnMut(u64, &[u8]),
    ) -> bool {
        let Some(end) = offset
            .checked_add(len)
            .filter(|&e| len > 0 && e <= self.size)
        else {
            return false;
        };
        let bs = self.block;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let blocks: Option<Vec<Arc<[u8]>>> = {
            let mut c = lock(&self.cache);
            if !(first..=last).all(|i| c.contains(i)) {
                return false;
            }
            (first..=last).map(|i| c.get(i)).collect()
        };
        let Some(blocks) = blocks else { return false };
        for (i, data) in (first..).zip(&blocks) {
            let bstart = i * bs;
            let from = offset.max(bstart);
            let to = end.min(bstart + data.len() as u64);
            if from < to {
                sink(
                    from - offset,
                    &data[(from - bstart) as usize..(to - bstart) as usize],
                );
            }
        }
        self.hits.fetch_add(blocks.len() as u64, Ordering::Relaxed);
        self.last_end.store(end, Ordering::Relaxed);
        true
    }
}

/// Blocks one read is fetching: no longer marked once it is done (fetched and cached, or
/// failed), and the reads waiting for them wake.
struct Fetching<'a> {
    obj: &'a RemoteObject,
    blocks: std::ops::Range<u64>,
}

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        lock(&self.obj.cache).set_fetching(self.blocks.clone(), false);
        self.obj.fetched.notify_all();
    }
}

/// Says when a read should make no further HTTP attempt (its requester is gone).
pub(crate) type Halted<'a> = &'a (dyn Fn() -> bool + Sync);

/// Copy the part of block `idx` (of size `bs`, data `data`) that overlaps `[offset, offset +
/// buf.len())` into `buf`.
fn copy_block(idx: u64, bs: u64, data: &[u8], offset: u64, buf: &mut [u8]) {
    let bstart = idx * bs;
    let bend = bstart + data.len() as u64;
    let from = offset.max(bstart);
    let to = (offset + buf.len() as u64).min(bend);
    if from >= to {
        return;
    }
    buf[(from - offset) as usize..(to - offset) as usize]
        .copy_from_slice(&data[(from - bstart) as usize..(to - bstart) as usize]);
}

impl ReadAt for RemoteObject {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.size.saturating_sub(offset);
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        self.read_exact_remote(offset, &mut buf[..n])?;
        Ok(n)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.size)
    }
}

/// Writes fail with EROFS: so a remote object can stand where a device that could be written is
/// expected (a snapshot's base or COW opened read-only).
impl WriteAt for RemoteObject {
    fn write_all_at(&self, _offset: u64, _buf: &[u8]) -> io::Result<()> {
        Err(snapblk_core::Error::new(
            libc::EROFS,
            format!("{}: remote objects are read-only", self.name()),
        )
        .into())
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_block_takes_the_overlap() {
        let data: Vec<u8> = (0..8).collect();
        let mut buf = [0xffu8; 6];
        // Block 1 covers [8, 16); the buffer covers [5, 11).
        copy_block(1, 8, &data, 5, &mut buf);
        assert_eq!(buf, [0xff, 0xff, 0xff, 0, 1, 2]);
        copy_block(3, 8, &data, 5, &mut buf);
        assert_eq!(buf, [0xff, 0xff, 0xff, 0, 1, 2]);
    }
}
