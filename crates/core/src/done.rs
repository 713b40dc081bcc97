//! [`DoneList`]: where a queue whose requests finish on other threads (librbd's callbacks, the
//! `s3`/`http` driver's workers) collects their completions, and how its `do_io` waits for them.
//!
//! The finishing thread [`push`](DoneList::push)es; the queue's thread
//! [`wait`](DoneList::wait)s for a number of entries and [`take`](DoneList::take)s them. Two
//! eventfds carry the wake-ups: a private one, signalled only while `do_io` is (about to be)
//! asleep on it, and optionally the caller's completion fd (a second descriptor of the
//! [`QueueCore`](crate::QueueCore)'s eventfd), signalled when the list turns non-empty while it
//! is enabled, and kept readable while entries are left after a `take`.

use crate::sync::lock;
use crate::sys::EventFd;
use crate::{Error, Result};
use std::os::fd::RawFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Completions finished on other threads, in completion order (see the module docs).
#[derive(Debug)]
pub struct DoneList<T> {
    done: Mutex<Vec<T>>,
    /// The queue's thread is (about to be) asleep on `wake`.
    waiting: AtomicBool,
    wake: EventFd,
    /// The caller's completion fd, if the queue has one.
    user: Option<EventFd>,
    user_on: AtomicBool,
}

impl<T> DoneList<T> {
    /// An empty list; `user` is the caller's completion fd (`None` for a poll queue), enabled.
    pub fn new(user: Option<EventFd>) -> Result<DoneList<T>> {
        Ok(DoneList {
            done: Mutex::new(Vec::new()),
            waiting: AtomicBool::new(false),
            wake: EventFd::new()?,
            user_on: AtomicBool::new(user.is_some()),
            user,
        })
    }

    /// Add a finished request and wake whoever waits for it. Called from any thread.
    pub fn push(&self, t: T) {
        let was_empty = {
            let mut d = lock(&self.done);
            let e = d.is_empty();
            d.push(t);
            e
        };
        if self.waiting.load(Ordering::SeqCst) {
            self.wake.signal();
        }
        if was_empty && self.user_on.load(Ordering::Relaxed) {
            self.signal_user();
        }
    }

    /// How many entries wait to be taken.
    pub fn len(&self) -> usize {
        lock(&self.done).len()
    }

    /// Whether no entry waits to be taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Turn signalling the caller's completion fd on or off (always off without one).
    pub fn set_user_on(&self, on: bool) {
        self.user_on
            .store(on && self.user.is_some(), Ordering::Relaxed);
    }

    fn signal_user(&self) {
        if let Some(u) = &self.user {
            u.signal();
        }
    }

    /// Wait until the list holds `n` entries: ETIME once `timeout` passes, EINTR if a signal
    /// arrives while `sigmask` is installed. With `spin` (a poll queue) it busy-waits instead of
    /// sleeping, and `sigmask` is not used. One thread waits at a time (the queue's: a queue is
    /// driven by one thread at a time).
    pub fn wait(
        &self,
        n: usize,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
        spin: bool,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.len() >= n {
                return Ok(());
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Err(Error::from_errno(libc::ETIME)),
                },
                None => None,
            };
            if spin {
                std::hint::spin_loop();
                continue;
            }
            self.waiting.store(true, Ordering::SeqCst);
            // Re-check after announcing the wait: an entry pushed before the store did not
            // signal `wake`.
            if self.len() >= n {
                self.waiting.store(false, Ordering::SeqCst);
                return Ok(());
            }
            let r = ppoll(self.wake.raw(), left, sigmask);
            self.waiting.store(false, Ordering::SeqCst);
            self.wake.drain();
            r?;
        }
    }

    /// Take up to `max` entries, oldest first, handing each to `f` (under the list's lock: `f`
    /// must not push). Returns how many were taken. If entries are left and the caller's
    /// completion fd is enabled, it is signalled, so it stays readable for them.
    pub fn take(&self, max: usize, mut f: impl FnMut(T)) -> usize {
        let mut d = lock(&self.done);
        let n = d.len().min(max);
        d.drain(..n).for_each(&mut f);
        if !d.is_empty() && self.user_on.load(Ordering::Relaxed) {
            self.signal_user();
        }
        n
    }
}

/// Sleep until `fd` is readable, `timeout` passes or (with `sigmask`) a signal arrives (EINTR).
fn ppoll(fd: RawFd, timeout: Option<Duration>, sigmask: Option<&libc::sigset_t>) -> Result<()> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos().into(),
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const _);
    let smp = sigmask.map_or(std::ptr::null(), |s| s as *const _);
    // SAFETY: one live pollfd; the timespec and sigset live across the call or are NULL.
    let r = unsafe { libc::ppoll(&mut pfd, 1, tsp, smp) };
    if r < 0 {
        return Err(Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_wait_ends_when_another_thread_pushes_enough() {
        let l = Arc::new(DoneList::<u32>::new(None).unwrap());
        let l2 = l.clone();
        let t = std::thread::spawn(move || {
            for i in 0..3 {
                std::thread::sleep(Duration::from_millis(10));
                l2.push(i);
            }
        });
        // A minute is only this test's guard against a lost wake-up hanging it.
        l.wait(3, Some(Duration::from_secs(60)), None, false)
            .expect("a push woke the wait");
        t.join().unwrap();
        let mut got = Vec::new();
        assert_eq!(l.take(10, |x| got.push(x)), 3);
        assert_eq!(got, [0, 1, 2]);
        assert!(l.is_empty());
    }

    #[test]
    fn a_wait_for_more_than_arrives_times_out_with_etime() {
        let l = DoneList::<u32>::new(None).unwrap();
        l.push(1);
        let e = l
            .wait(2, Some(Duration::from_millis(20)), None, false)
            .unwrap_err();
        assert_eq!(e.errno, libc::ETIME);
        let e = l
            .wait(2, Some(Duration::from_millis(20)), None, true)
            .unwrap_err();
        assert_eq!(e.errno, libc::ETIME, "spinning");
        l.wait(1, Some(Duration::ZERO), None, false).unwrap();
    }

    #[test]
    fn the_user_fd_turns_readable_on_the_first_entry_and_stays_so_for_the_rest() {
        let efd = EventFd::new().unwrap();
        let l = DoneList::<u32>::new(Some(efd.try_clone().unwrap())).unwrap();
        l.push(1);
        l.push(2);
        assert_eq!(efd.drain(), 1, "only the first entry signals");
        assert_eq!(l.take(1, |_| {}), 1);
        assert_eq!(efd.drain(), 1, "one left: signalled again");
        assert_eq!(l.take(1, |_| {}), 1);
        assert_eq!(efd.drain(), 0, "none left");
        l.set_user_on(false);
        l.push(3);
        assert_eq!(efd.drain(), 0, "disabled");
        assert_eq!(l.take(0, |_| {}), 0);
        assert_eq!(efd.drain(), 0);
        l.set_user_on(true);
        assert_eq!(l.take(0, |_| {}), 0);
        assert_eq!(efd.drain(), 1, "enabled again with an entry left");
    }
}
