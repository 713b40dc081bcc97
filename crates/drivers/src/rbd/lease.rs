//! Whether the holder of the image's exclusive lock may still write: the lease that the lock's
//! renewals extend, apart from librados so its rules are tested without a cluster.
//!
//! The OSD keeps a lock for [`LOCK_SECS`] after each renewal. The holder counts that time from
//! when it *sent* the renewal (the OSD applied it later, so its lock lasts at least that long)
//! minus [`MARGIN`] for the two clocks' rates, and refuses writes once that moment has passed
//! without a newer renewal, even while the renewal is still waiting for an answer. A renewal
//! that fails for any reason but a timeout (the lock was broken or taken, the client was
//! blocklisted) loses the lock at once, and so does any I/O that finds the client blocklisted
//! (ESHUTDOWN, [`Lost::Blocklisted`]). Once lost, always lost: another client may have written
//! meanwhile, so nothing this handle still holds may reach the image.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A lock lasts this long on the OSD unless renewed, so a holder that dies frees it by itself.
pub(super) const LOCK_SECS: u64 = 30;
/// What the holder subtracts from [`LOCK_SECS`] for the client's and the OSD's clocks.
pub(super) const MARGIN: Duration = Duration::from_secs(5);

/// Why the lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lost {
    /// A renewal failed with this errno (ENOENT: broken or expired; EBUSY: another client took
    /// it; ESHUTDOWN: this client was blocklisted).
    Renewal(i32),
    /// No renewal succeeded within the lease.
    Expired,
    /// An I/O of this client failed with ESHUTDOWN: the cluster has blocklisted it (every OSD
    /// refuses it from then on, librbd's write-back of its cache included).
    Blocklisted,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::Renewal(e) => write!(
                f,
                "renewing it failed: {}",
                std::io::Error::from_raw_os_error(*e)
            ),
            Lost::Expired => write!(
                f,
                "no renewal succeeded within {} s",
                (Duration::from_secs(LOCK_SECS) - MARGIN).as_secs()
            ),
            Lost::Blocklisted => write!(f, "an I/O found this client blocklisted"),
        }
    }
}

/// The lease of one held lock, shared by the renewal thread and every queue.
pub(super) struct Lease {
    /// What `until` counts from.
    origin: Instant,
    /// Nanoseconds after `origin` until which writes may go out.
    until: AtomicU64,
    lost: AtomicBool,
    why: Mutex<Option<Lost>>,
    /// The image, for the log line.
    what: String,
}

impl Lease {
    /// The lease of a lock just taken by a call sent at `sent`.
    pub(super) fn new(sent: Instant, what: &str) -> Lease {
        let l = Lease {
            origin: sent,
            until: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            why: Mutex::new(None),
            what: what.to_owned(),
        };
        l.renewed(sent);
        l
    }

    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A renewal sent at `sent` succeeded.
    pub(super) fn renewed(&self, sent: Instant) {
        let end = sent + Duration::from_secs(LOCK_SECS) - MARGIN;
        self.until.fetch_max(self.nanos(end), Ordering::SeqCst);
    }

    /// The result of a renewal sent at `sent` (a librados return value: 0 or a negative
    /// errno). A timeout leaves the lease running out by itself; any other error loses it.
    pub(super) fn renewal(&self, sent: Instant, ret: i32) {
        match -ret {
            0 => self.renewed(sent),
            libc::ETIMEDOUT | libc::EINTR | libc::EAGAIN => {}
            e => self.lose(Lost::Renewal(e)),
        }
    }

    /// Mark the lock lost (logged once, at the first loss).
    pub(super) fn lose(&self, why: Lost) {
        {
            let mut w = snapblk_core::sync::lock(&self.why);
            if w.is_some() {
                return;
            }
            *w = Some(why);
            self.lost.store(true, Ordering::Release);
        }
        log::error!(
            "rbd: lost the exclusive lock on image '{}' ({why}); refusing every later write and flush with EIO",
            self.what
        );
    }

    /// Whether a write may go out at `now`; marks the lock lost when the lease has run out.
    pub(super) fn check(&self, now: Instant) -> std::result::Result<(), Lost> {
        if self.lost.load(Ordering::Acquire) {
            return Err(self.why().unwrap_or(Lost::Expired));
        }
        if self.nanos(now) >= self.until.load(Ordering::Acquire) {
            self.lose(Lost::Expired);
            return Err(self.why().unwrap_or(Lost::Expired));
        }
        Ok(())
    }

    /// Whether the lock is lost.
    #[cfg(test)]
    fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Why the lock was lost, if it was.
    pub(super) fn why(&self) -> Option<Lost> {
        *snapblk_core::sync::lock(&self.why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn fresh_lock_allows_writes_until_the_lease_ends() {
        let t0 = Instant::now();
        let l = Lease::new(t0, "rbd/x");
        assert_eq!(l.check(t0), Ok(()));
        assert_eq!(l.check(t0 + secs(24)), Ok(()));
        // 30 s lock minus the 5 s margin: refused from 25 s on, and for good.
        assert_eq!(l.check(t0 + secs(25)), Err(Lost::Expired));
        assert!(l.is_lost());
        l.renewal(t0 + secs(26), 0);
        assert_eq!(l.check(t0 + secs(26)), Err(Lost::Expired));
    }

    #[test]
    fn renewals_extend_the_lease_from_when_they_were_sent() {
        let t0 = Instant::now();
        let l = Lease::new(t0, "rbd/x");
        l.renewal(t0 + secs(10), 0);
        l.renewal(t0 + secs(20), 0);
        assert_eq!(l.check(t0 + secs(44)), Ok(()));
        assert_eq!(l.check(t0 + secs(45)), Err(Lost::Expired));
    }

    #[test]
    fn an_older_renewal_answered_late_does_not_shorten_the_lease() {
        let t0 = Instant::now();
        let l = Lease::new(t0, "rbd/x");
        l.renewal(t0 + secs(20), 0);
        l.renewal(t0 + secs(10), 0);
        assert_eq!(l.check(t0 + secs(44)), Ok(()));
    }

    #[test]
    fn a_timed_out_renewal_keeps_the_lease_running_out() {
        let t0 = Instant::now();
        let l = Lease::new(t0, "rbd/x");
        l.renewal(t0 + secs(10), -libc::ETIMEDOUT);
        assert_eq!(l.check(t0 + secs(20)), Ok(()));
        assert!(!l.is_lost());
        assert_eq!(l.check(t0 + secs(25)), Err(Lost::Expired));
    }

    #[test]
    fn a_failed_renewal_loses_the_lock_at_once_and_for_good() {
        for e in [libc::ENOENT, libc::EBUSY, libc::ESHUTDOWN, libc::EPERM] {
            let t0 = Instant::now();
            let l = Lease::new(t0, "rbd/x");
            l.renewal(t0 + secs(10), -e);
            assert!(l.is_lost(), "errno {e}");
            assert_eq!(l.check(t0 + secs(10)), Err(Lost::Renewal(e)));
            // A later success (another call racing) does not bring it back.
            l.renewal(t0 + secs(11), 0);
            assert_eq!(l.check(t0 + secs(11)), Err(Lost::Renewal(e)));
        }
    }

    #[test]
    fn the_first_cause_is_kept() {
        let t0 = Instant::now();
        let l = Lease::new(t0, "rbd/x");
        l.renewal(t0 + secs(10), -libc::EBUSY);
        l.lose(Lost::Expired);
        assert_eq!(l.why(), Some(Lost::Renewal(libc::EBUSY)));
        assert!(Lost::Renewal(libc::EBUSY).to_string().contains("busy"));
        assert_eq!(
            Lost::Expired.to_string(),
            "no renewal succeeded within 25 s"
        );
    }

    #[test]
    fn a_blocklisted_io_loses_a_running_lease_for_good() {
        let t0 = Instant::now();
        let l = Lease::new(t0, "rbd/x");
        assert_eq!(l.check(t0 + secs(1)), Ok(()));
        l.lose(Lost::Blocklisted);
        assert_eq!(l.check(t0 + secs(1)), Err(Lost::Blocklisted));
        // The renewal that fails later does not replace the first cause.
        l.renewal(t0 + secs(10), -libc::ESHUTDOWN);
        assert_eq!(l.why(), Some(Lost::Blocklisted));
        assert_eq!(
            Lost::Blocklisted.to_string(),
            "an I/O found this client blocklisted"
        );
    }
}
