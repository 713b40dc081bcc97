//! The device's watcher thread: it fans a shared MSI-X vector out to the completion eventfds
//! of the queues sharing it, and answers the kernel's request to release the device.
//!
//! * Sharing: when the device has fewer MSI-X vectors than regular queues, the last vector
//!   signals the `hub` eventfd instead of one queue's. On every wake-up the thread drains the
//!   hub, then signals each sharing queue's own completion eventfd (an eventfd counter keeps a
//!   signal until read, so no interrupt is lost; a queue with nothing new sees a spurious
//!   wake-up, which the ring tolerates). The thread blocks in `poll`: no busy loop.
//! * Removal: the kernel signals the request interrupt when the device is removed or unbound,
//!   and waits until the user releases it. The thread then marks the device gone (it shuts
//!   the `gone` socket down; every queue watches the other end as its ring's "socket", and a
//!   hang-up there fails every request, now and later, with EIO), releases the device ([`Dev::release`]) and wakes every
//!   queue's completion eventfd, so that callers waiting on one see the failures.
//!
//! The thread stops and is joined when the watcher is dropped (at destroy).

use super::pci::Dev;
use super::sys::{self, signal_fd};
use crate::vhost_user::sys::{dup_fd, ppoll};
use snapblk_core::sys::EventFd;
use snapblk_core::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A queue's completion eventfd as the watcher keeps it (a duplicate), and whether the queue
/// is on the shared vector.
#[derive(Debug)]
struct Target {
    call: OwnedFd,
    shared: bool,
}

/// The watcher of one open device.
#[derive(Debug)]
pub(crate) struct Watcher {
    hub: Arc<EventFd>,
    stop: Arc<EventFd>,
    /// The queues' end of the `gone` socket pair (the thread shuts the other end down).
    gone: OwnedFd,
    targets: Arc<Mutex<Vec<Target>>>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Start watching `dev`: wire its request interrupt (when it has one) and start the thread.
    pub(crate) fn start(dev: Arc<Dev>) -> Result<Watcher> {
        let req = EventFd::new()?;
        let req = dev.wire_request(req.raw()).then_some(req);
        if req.is_none() {
            log::debug!("vfio-pci: the device has no request interrupt");
        }
        Watcher::spawn(req, Box::new(move || dev.release()))
    }

    /// Start the thread: `req` signals the kernel's request, `release` gives the device back.
    fn spawn(req: Option<EventFd>, release: Box<dyn Fn() + Send>) -> Result<Watcher> {
        let hub = Arc::new(EventFd::new()?);
        let stop = Arc::new(EventFd::new()?);
        let (gone, hang) = sys::socketpair().map_err(Error::from_io)?;
        let targets: Arc<Mutex<Vec<Target>>> = Arc::default();
        let (h, s, t) = (hub.clone(), stop.clone(), targets.clone());
        let thread = std::thread::Builder::new()
            .name("vfio-pci-watch".into())
            .spawn(move || run(&*release, &h, &s, &hang, req.as_ref(), &t))
            .map_err(Error::from_io)?;
        Ok(Watcher {
            hub,
            stop,
            gone,
            targets,
            thread: Some(thread),
        })
    }

    /// The eventfd a shared vector signals.
    pub(crate) fn hub(&self) -> RawFd {
        self.hub.raw()
    }

    /// A duplicate of the queues' end of the `gone` socket pair: it hangs up once the device
    /// was released.
    pub(crate) fn gone(&self) -> Result<OwnedFd> {
        dup_fd(self.gone.as_raw_fd()).map_err(Error::from_io)
    }

    /// Watch a regular queue's completion eventfd `call`; `shared` if it is on the hub.
    pub(crate) fn add(&self, call: RawFd, shared: bool) -> Result<()> {
        let call = dup_fd(call).map_err(Error::from_io)?;
        snapblk_core::sync::lock(&self.targets).push(Target { call, shared });
        Ok(())
    }

    /// Put the queue added last on the hub (its vector becomes the shared one).
    pub(crate) fn share_last(&self) {
        if let Some(t) = snapblk_core::sync::lock(&self.targets).last_mut() {
            t.shared = true;
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.signal();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            log::warn!("vfio-pci: the watcher thread panicked");
        }
    }
}

fn run(
    release: &dyn Fn(),
    hub: &EventFd,
    stop: &EventFd,
    hang: &OwnedFd,
    req: Option<&EventFd>,
    targets: &Mutex<Vec<Target>>,
) {
    let mut fds = vec![(stop.raw(), libc::POLLIN), (hub.raw(), libc::POLLIN)];
    if let Some(r) = req {
        fds.push((r.raw(), libc::POLLIN));
    }
    loop {
        let r = match ppoll(&fds, None, None) {
            Ok(r) => r,
            Err(e) if e.errno == libc::EINTR => continue,
            Err(e) => {
                log::warn!("vfio-pci: the watcher stops: {e}");
                return;
            }
        };
        if r[0] != 0 {
            return;
        }
        if r[1] & libc::POLLIN != 0 {
            hub.drain();
            for t in snapblk_core::sync::lock(targets)
                .iter()
                .filter(|t| t.shared)
            {
                signal_fd(t.call.as_raw_fd());
            }
        }
        if let (Some(rq), Some(&re)) = (req, r.get(2))
            && re & libc::POLLIN != 0
        {
            rq.drain();
            log::warn!("vfio-pci: the kernel asks for the device back (removal): releasing it");
            sys::shutdown(hang);
            release();
            for t in snapblk_core::sync::lock(targets).iter() {
                signal_fd(t.call.as_raw_fd());
            }
            // Nothing more to answer: the thread only waits to be stopped.
            fds.truncate(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Watcher;
    use crate::vhost_user::sys::ppoll;
    use snapblk_core::sys::EventFd;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn readable(fd: i32, events: i16, ms: u64) -> i16 {
        ppoll(&[(fd, events)], Some(Duration::from_millis(ms)), None).unwrap()[0]
    }

    #[test]
    fn the_hub_wakes_only_sharing_queues_and_a_request_releases_and_wakes_all() {
        let req = EventFd::new().unwrap();
        let req_raw = req.raw();
        let released = Arc::new(AtomicUsize::new(0));
        let r = released.clone();
        let w = Watcher::spawn(
            Some(req),
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
        let own = EventFd::new().unwrap();
        let (a, b) = (EventFd::new().unwrap(), EventFd::new().unwrap());
        w.add(own.raw(), false).unwrap();
        w.add(a.raw(), false).unwrap();
        w.share_last();
        w.add(b.raw(), true).unwrap();
        let gone = w.gone().unwrap();
        use std::os::fd::AsRawFd;
        // Two interrupts on the shared vector: each wakes both sharing queues.
        for _ in 0..2 {
            super::signal_fd(w.hub());
            assert_ne!(readable(a.raw(), libc::POLLIN, 10_000), 0);
            assert_ne!(readable(b.raw(), libc::POLLIN, 10_000), 0);
            assert!(a.drain() > 0 && b.drain() > 0);
        }
        assert_eq!(readable(own.raw(), libc::POLLIN, 0), 0);
        assert_eq!(readable(gone.as_raw_fd(), libc::POLLRDHUP, 0), 0);
        // The kernel's request: the device is released once, the queues' socket hangs up and
        // every queue is woken.
        super::signal_fd(req_raw);
        assert_ne!(
            readable(gone.as_raw_fd(), libc::POLLRDHUP, 10_000) & (libc::POLLHUP | libc::POLLRDHUP),
            0
        );
        for q in [&own, &a, &b] {
            assert_ne!(readable(q.raw(), libc::POLLIN, 10_000), 0);
        }
        assert_eq!(released.load(Ordering::SeqCst), 1);
        // Dropping stops and joins the thread.
        drop(w);
    }
}
