//! I/O counters an export keeps for an operator (`snapblk serve --metrics`): requests, bytes,
//! errors and a latency histogram per direction, and client connections. Every update is a few
//! relaxed atomic additions, so the I/O path pays next to nothing; readers take a
//! [`IoStatsSnapshot`] whenever they like.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The kind of request a counter belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoDir {
    /// Reads.
    Read,
    /// Writes (and write-zeroes).
    Write,
    /// Flushes.
    Flush,
    /// Discards (trim).
    Discard,
}

impl IoDir {
    /// Every direction, in the order of [`IoStatsSnapshot::dirs`].
    pub const ALL: [IoDir; 4] = [IoDir::Read, IoDir::Write, IoDir::Flush, IoDir::Discard];

    /// Lower-case name (`read`, `write`, `flush`, `discard`), as the metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            IoDir::Read => "read",
            IoDir::Write => "write",
            IoDir::Flush => "flush",
            IoDir::Discard => "discard",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Upper bounds of the latency histogram's buckets, in nanoseconds: 8 µs doubling up to about
/// 4.3 s (20 buckets), then `+Inf` (counted as the total).
pub const LATENCY_BOUNDS_NS: [u64; 20] = {
    let mut b = [0u64; 20];
    let mut i = 0;
    while i < 20 {
        b[i] = 8192 << i;
        i += 1;
    }
    b
};

#[derive(Debug, Default)]
struct DirCounters {
    requests: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency_sum_ns: AtomicU64,
    /// Non-cumulative: bucket `i` counts latencies in (bound[i-1], bound[i]]; the last one
    /// counts those above every bound.
    buckets: [AtomicU64; LATENCY_BOUNDS_NS.len() + 1],
}

/// Counters of one export (shared by its connections, queues and threads).
#[derive(Debug, Default)]
pub struct IoStats {
    dirs: [DirCounters; 4],
    connections_total: AtomicU64,
    connections_closed: AtomicU64,
}

/// One direction's counters at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirSnapshot {
    /// Requests completed.
    pub requests: u64,
    /// Bytes those requests moved (0 for flushes).
    pub bytes: u64,
    /// Requests that completed with an error.
    pub errors: u64,
    /// Sum of their latencies, from arrival to completion, in nanoseconds.
    pub latency_sum_ns: u64,
    /// Cumulative histogram: `buckets[i]` counts requests that took at most
    /// [`LATENCY_BOUNDS_NS`]`[i]`.
    pub buckets: [u64; LATENCY_BOUNDS_NS.len()],
}

/// [`IoStats`] at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStatsSnapshot {
    /// Per direction, in the order of [`IoDir::ALL`].
    pub dirs: [DirSnapshot; 4],
    /// Client connections accepted since the start.
    pub connections_total: u64,
    /// Client connections open now.
    pub connections_active: u64,
}

impl IoStatsSnapshot {
    /// The counters of one direction.
    pub fn dir(&self, d: IoDir) -> &DirSnapshot {
        &self.dirs[d.index()]
    }
}

/// The histogram bucket of a latency: the first bound not below it.
fn bucket(ns: u64) -> usize {
    if ns <= LATENCY_BOUNDS_NS[0] {
        return 0;
    }
    // Bounds are 2^(13+i): the bucket is ceil(log2(ns)) - 13.
    let log = 64 - (ns - 1).leading_zeros() as usize;
    (log - 13).min(LATENCY_BOUNDS_NS.len())
}

impl IoStats {
    /// New, zeroed counters.
    pub fn new() -> IoStats {
        IoStats::default()
    }

    /// One request of `dir` that moved `bytes` completed after `latency`; `ok` false if it
    /// failed.
    #[inline]
    pub fn record(&self, dir: IoDir, bytes: u64, latency: Duration, ok: bool) {
        let c = &self.dirs[dir.index()];
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        if !ok {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        c.latency_sum_ns.fetch_add(ns, Ordering::Relaxed);
        c.buckets[bucket(ns)].fetch_add(1, Ordering::Relaxed);
    }

    /// A client connected.
    pub fn connection_opened(&self) {
        self.connections_total.fetch_add(1, Ordering::Relaxed);
    }

    /// A client that [`IoStats::connection_opened`] counted went away.
    pub fn connection_closed(&self) {
        self.connections_closed.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now (each one exact; taken one after the other, not all at one instant).
    pub fn snapshot(&self) -> IoStatsSnapshot {
        let mut s = IoStatsSnapshot::default();
        for (out, c) in s.dirs.iter_mut().zip(&self.dirs) {
            out.requests = c.requests.load(Ordering::Relaxed);
            out.bytes = c.bytes.load(Ordering::Relaxed);
            out.errors = c.errors.load(Ordering::Relaxed);
            out.latency_sum_ns = c.latency_sum_ns.load(Ordering::Relaxed);
            let mut acc = 0;
            for (o, b) in out.buckets.iter_mut().zip(&c.buckets) {
                acc += b.load(Ordering::Relaxed);
                *o = acc;
            }
        }
        let closed = self.connections_closed.load(Ordering::Relaxed);
        s.connections_total = self.connections_total.load(Ordering::Relaxed);
        s.connections_active = s.connections_total.saturating_sub(closed);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_the_first_bound_not_below() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(8192), 0);
        assert_eq!(bucket(8193), 1);
        assert_eq!(bucket(16384), 1);
        assert_eq!(bucket(16385), 2);
        let last = *LATENCY_BOUNDS_NS.last().unwrap();
        assert_eq!(bucket(last), LATENCY_BOUNDS_NS.len() - 1);
        assert_eq!(bucket(last + 1), LATENCY_BOUNDS_NS.len());
        assert_eq!(bucket(u64::MAX), LATENCY_BOUNDS_NS.len());
        for (i, &b) in LATENCY_BOUNDS_NS.iter().enumerate() {
            assert_eq!(bucket(b), i, "bound {b}");
        }
    }

    #[test]
    fn snapshot_is_cumulative_and_counts_connections() {
        let s = IoStats::new();
        s.record(IoDir::Read, 4096, Duration::from_micros(5), true);
        s.record(IoDir::Read, 8192, Duration::from_micros(20), true);
        s.record(IoDir::Read, 512, Duration::from_secs(100), false);
        s.record(IoDir::Flush, 0, Duration::from_micros(1), true);
        s.connection_opened();
        s.connection_opened();
        s.connection_closed();
        let snap = s.snapshot();
        let r = snap.dir(IoDir::Read);
        assert_eq!((r.requests, r.bytes, r.errors), (3, 4096 + 8192 + 512, 1));
        assert_eq!(r.buckets[0], 1);
        assert_eq!(r.buckets[1], 1);
        assert_eq!(r.buckets[2], 2);
        assert_eq!(*r.buckets.last().unwrap(), 2, "100 s is above every bound");
        assert_eq!(snap.dir(IoDir::Flush).requests, 1);
        assert_eq!(snap.dir(IoDir::Write).requests, 0);
        assert_eq!((snap.connections_total, snap.connections_active), (2, 1));
    }
}
