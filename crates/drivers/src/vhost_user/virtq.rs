//! A split virtqueue carrying virtio-blk requests (virtio 1.x, §2.7 and §5.2), in memory shared
//! with the backend, and the driver's [`Queue`] on top of it.
//!
//! Layout of one queue of `n` entries in its memfd: the descriptor table (16 bytes each), the
//! available ring (`flags`, `idx`, `n` entries, `used_event`), the used ring (`flags`, `idx`, `n`
//! elements of 8 bytes, `avail_event`), then per head descriptor a 32-byte request area (the
//! 16-byte virtio-blk header and a 16-byte discard/write-zeroes segment) and one status byte.
//! A request's descriptors are its header, its data buffers (the caller's, inside mapped
//! regions) or its segment, and its status byte.

use super::link::{self, Shared, Vring};
use super::packed::{Packed, Used};
use super::sys::{Shm, ppoll, read_eventfd};
use snapblk_core::sys::EventFd;
use snapblk_core::{Completion, Engine, Error, Op, Queue, QueueCore, ReqFlags, Request, Result};
use std::collections::VecDeque;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const AVAIL_F_NO_INTERRUPT: u16 = 1;
const USED_F_NO_NOTIFY: u16 = 1;

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_DISCARD: u32 = 11;
const T_WRITE_ZEROES: u32 = 13;

/// Mapped memory regions as `(start, end)` process addresses and the address the device knows
/// `start` by (the process address itself for vhost-user, an IOVA for vhost-vdpa).
pub(crate) type Regions = Arc<RwLock<Vec<(usize, usize, u64)>>>;

/// How long requests on a ring may make no progress before a [`Probe`] is asked whether the
/// device is still there.
pub(crate) const STALL: Duration = Duration::from_secs(5);

/// A liveness check, for transports whose device can vanish without a sign on any descriptor
/// (a VDUSE daemon that dies): `false` means the device is gone.
pub(crate) type Probe = Box<dyn FnMut() -> bool + Send>;

/// How a ring notifies its device when that is not an eventfd write (e.g. a PCI BAR write).
pub(crate) trait Doorbell: Send {
    /// Tell the device that the available ring has new entries.
    fn ring(&self);
}

/// What the queue knows of the negotiated device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    pub(crate) read_only: bool,
    pub(crate) flush: bool,
    pub(crate) discard: bool,
    pub(crate) write_zeroes: bool,
    pub(crate) max_segments: usize,
}

impl Caps {
    /// What the negotiated virtio-blk `features` allow, on an instance opened `read_only`.
    pub(crate) fn negotiated(features: u64, read_only: bool, max_segments: usize) -> Caps {
        Caps {
            read_only,
            flush: features & super::F_FLUSH != 0,
            discard: features & super::F_DISCARD != 0,
            write_zeroes: features & super::F_WRITE_ZEROES != 0,
            max_segments,
        }
    }
}

/// The call eventfd as [`Ring::new`] takes it: the raw fd the ring waits on (a regular queue),
/// and the eventfd kept only so the device has one to signal (a poll queue).
pub(crate) type Calls = (Option<RawFd>, Option<EventFd>);

/// How a queue learns of completions, from the eventfd the device signals (`call`): a regular
/// queue hands it out as its completion fd and the ring waits on it; a poll queue keeps it
/// only so the device has one to signal, and hands out none. Returns the ring's call fd and
/// spare (for [`Ring::new`]) and the queue's core.
pub(crate) fn completion_wiring(call: EventFd, poll: bool) -> Result<(Calls, QueueCore)> {
    Ok(if poll {
        ((None, Some(call)), QueueCore::new(true)?)
    } else {
        (
            (Some(call.raw()), None),
            QueueCore::with_eventfd(call, false),
        )
    })
}

/// Byte offsets of one queue's parts inside its memfd.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub(crate) n: usize,
    pub(crate) avail: usize,
    pub(crate) used: usize,
    req: usize,
    status: usize,
    pub(crate) size: usize,
}

impl Layout {
    /// The packed layout (virtio 1.2 §2.8): the descriptor ring, the driver event suppression
    /// area (`avail`), the device's (`used`), then the request areas and status bytes.
    pub(crate) fn packed(n: usize) -> Layout {
        let avail = 16 * n;
        let used = avail + 4;
        let req = (used + 4).next_multiple_of(16);
        let status = req + 32 * n;
        let size = (status + n).next_multiple_of(snapblk_core::sys::page_size());
        Layout {
            n,
            avail,
            used,
            req,
            status,
            size,
        }
    }

    pub(crate) fn new(n: usize) -> Layout {
        let avail = 16 * n;
        let used = (avail + 6 + 2 * n).next_multiple_of(4);
        let req = (used + 6 + 8 * n).next_multiple_of(16);
        let status = req + 32 * n;
        let size = (status + n).next_multiple_of(snapblk_core::sys::page_size());
        Layout {
            n,
            avail,
            used,
            req,
            status,
            size,
        }
    }
}

/// A request waiting for descriptors.
#[derive(Debug, Clone)]
struct Pending {
    user_data: usize,
    ty: u32,
    sector: u64,
    /// Data buffers `(address, length)`; written by the device for reads.
    segs: Vec<(u64, u32)>,
    /// Discard / write-zeroes: `(sectors, flags)` for the segment.
    range: Option<(u32, u32)>,
    /// Send a flush after this request succeeds and complete only then (FUA emulation).
    flush_after: bool,
}

/// A request on the ring, by head descriptor.
#[derive(Debug)]
struct InFlight {
    req: Pending,
    descs: Vec<u16>,
}

/// What a queue needs to set its vring up again on a new connection.
struct Relink {
    shared: Shared,
    vring: Vring,
    /// The generation of the connection the vring was last set up on.
    epoch: u64,
    /// The `reconnect` property.
    on: bool,
}

/// The ring and its requests: the [`Engine`] of a queue.
pub(crate) struct Ring {
    relink: Option<Relink>,
    /// The stall probe, the message requests fail with when it says the device is gone, and
    /// how long requests may make no progress before it is asked.
    probe: Option<(Probe, &'static CStr, Duration)>,
    /// How the device is notified; `None`: a write to the kick eventfd (vhost-user, vhost-vdpa).
    bell: Option<Box<dyn Doorbell>>,
    /// The packed layout's state; `None`: a split ring. With it, `free` holds buffer ids.
    packed: Option<Packed>,
    shm: Shm,
    /// The address the device knows `shm` by (its process address unless [`Ring::at`]).
    dev_base: u64,
    lay: Layout,
    free: Vec<u16>,
    slots: Vec<Option<InFlight>>,
    in_ring: usize,
    avail_idx: u16,
    last_used: u16,
    pending: VecDeque<Pending>,
    ready: VecDeque<Completion>,
    kick: EventFd,
    /// The call eventfd (owned by the queue's [`QueueCore`]); `None` on a poll queue.
    call: Option<RawFd>,
    /// A poll queue's call eventfd, given to the backend and never read.
    _spare_call: Option<EventFd>,
    /// A duplicate of the control socket: a hang-up means the backend is gone.
    sock: OwnedFd,
    /// Why requests fail once `sock` reports the backend gone (without reconnecting).
    hangup: &'static CStr,
    dead: Option<&'static CStr>,
    notify: bool,
    /// `VIRTIO_RING_F_EVENT_IDX` negotiated: kicks and interrupts are suppressed through the
    /// rings' event indexes instead of their flags.
    event_idx: bool,
}

/// Whether moving an index from `old` to `new` passes `event` (virtio 1.x §2.7.10).
fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

impl Ring {
    pub(crate) fn new(
        shm: Shm,
        lay: Layout,
        kick: EventFd,
        (call, _spare_call): Calls,
        sock: OwnedFd,
        event_idx: bool,
    ) -> Ring {
        let r = Ring {
            relink: None,
            probe: None,
            dev_base: shm.addr(),
            bell: None,
            packed: None,
            _spare_call,
            event_idx,
            free: (0..lay.n as u16).rev().collect(),
            slots: (0..lay.n).map(|_| None).collect(),
            shm,
            lay,
            in_ring: 0,
            avail_idx: 0,
            last_used: 0,
            pending: VecDeque::new(),
            ready: VecDeque::new(),
            kick,
            call,
            sock,
            hangup: c"vhost-user backend disconnected",
            dead: None,
            notify: false,
        };
        r.set_interrupts(false);
        r
    }

    /// The device knows the ring memory by `dev_base` (an IOVA), not its process address.
    pub(crate) fn at(mut self, dev_base: u64) -> Ring {
        self.dev_base = dev_base;
        self
    }

    /// Ask `probe` whether the device is still there when requests make no progress for
    /// `after` ([`STALL`] in the drivers); if not, every request fails with EIO and `why`.
    pub(crate) fn with_probe(mut self, probe: Probe, why: &'static CStr, after: Duration) -> Ring {
        self.probe = Some((probe, why, after));
        self
    }

    /// Fail requests with `why` when the "socket" reports the backend gone.
    pub(crate) fn with_hangup(mut self, why: &'static CStr) -> Ring {
        self.hangup = why;
        self
    }

    /// Attach the control link: with `on`, a hang-up reconnects instead of failing requests.
    pub(crate) fn with_link(mut self, vring: Vring, epoch: u64, shared: Shared, on: bool) -> Ring {
        self.relink = Some(Relink {
            shared,
            vring,
            epoch,
            on,
        });
        self
    }

    /// Notify the device through `bell` (a PCI BAR write) instead of the kick eventfd.
    pub(crate) fn with_doorbell(mut self, bell: Box<dyn Doorbell>) -> Ring {
        self.bell = Some(bell);
        self
    }

    /// Use the packed layout (`lay` from [`Layout::packed`]).
    pub(crate) fn with_packed(mut self) -> Ring {
        self.packed = Some(Packed::new(self.lay.n));
        // `new` wrote the split ring's interrupt suppression: clear it, then set the packed one.
        for o in self.lay.avail..self.lay.avail + 4 {
            self.shm.store_u8(o, 0);
        }
        self.set_interrupts(false);
        self
    }

    /// The backend hung up. Without `reconnect`, fail every request; with it, get a new
    /// connection (see [`link`]), set the vring up again from index 0 and put the requests
    /// that were on the ring back in front of the pending ones, to be sent again.
    fn revive(&mut self) {
        let Some(rl) = self.relink.as_ref().filter(|r| r.on) else {
            return self.fail_all(self.hangup);
        };
        let (shared, vring, mut seen) = (rl.shared.clone(), rl.vring, rl.epoch);
        // What the old backend finished completes normally and is not sent again.
        self.drain_used();
        if self.dead.is_some() {
            return;
        }
        let mut l = link::lock(&shared);
        loop {
            let Some(epoch) = l.renew(seen) else {
                drop(l);
                return self.fail_all(c"vhost-user backend disconnected and reconnecting failed");
            };
            self.reset();
            if l.setup_vring(vring).is_ok()
                && let Ok(sock) = l.sock_dup()
            {
                self.sock = sock;
                if let Some(r) = self.relink.as_mut() {
                    r.epoch = epoch;
                }
                break;
            }
            seen = epoch;
        }
        drop(l);
        self.push_pending();
    }

    /// Empty the ring for a new backend: indexes and flags to zero, every descriptor free,
    /// requests on the ring back to the front of `pending`.
    fn reset(&mut self) {
        let on_ring: Vec<Pending> = self
            .slots
            .iter_mut()
            .filter_map(Option::take)
            .map(|f| f.req)
            .collect();
        for p in on_ring.into_iter().rev() {
            self.pending.push_front(p);
        }
        self.in_ring = 0;
        self.free = (0..self.lay.n as u16).rev().collect();
        self.avail_idx = 0;
        self.last_used = 0;
        if self.packed.is_some() {
            self.packed = Some(Packed::new(self.lay.n));
        }
        let n = self.lay.n;
        for o in (self.lay.avail..self.lay.avail + 6 + 2 * n)
            .chain(self.lay.used..self.lay.used + 6 + 8 * n)
        {
            self.shm.store_u8(o, 0);
        }
        self.set_interrupts(self.notify);
    }

    fn set_interrupts(&self, on: bool) {
        if let Some(pk) = &self.packed {
            return pk.set_interrupts(&self.shm, &self.lay, on);
        }
        if self.event_idx {
            // `used_event`: interrupt once the used index passes it. Off: one behind, so it
            // fires only after a full wrap of the index (harmless).
            let ev = if on {
                self.last_used
            } else {
                self.last_used.wrapping_sub(1)
            };
            self.shm
                .store_u16(self.lay.avail + 4 + 2 * self.lay.n, ev, Ordering::Relaxed);
        } else {
            let f = if on { 0 } else { AVAIL_F_NO_INTERRUPT };
            self.shm.store_u16(self.lay.avail, f, Ordering::Relaxed);
        }
    }

    /// Put as many pending requests on the ring as there are descriptors for; kick if any.
    fn push_pending(&mut self) {
        let old = self.avail_idx;
        let mut added = false;
        while let Some(p) = self.pending.front() {
            let need = p.segs.len() + if p.range.is_some() { 3 } else { 2 };
            let room = match &self.packed {
                Some(pk) => pk.free >= need && !self.free.is_empty(),
                None => self.free.len() >= need,
            };
            if !room {
                break;
            }
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            if self.packed.is_some() {
                self.place_packed(p);
            } else {
                self.place(p, need);
            }
            added = true;
        }
        if added && let Some(pk) = &self.packed {
            fence(Ordering::SeqCst);
            if pk.need_kick(&self.shm, &self.lay)
                && let Some(b) = &self.bell
            {
                b.ring();
            }
        } else if added {
            fence(Ordering::Release);
            self.shm
                .store_u16(self.lay.avail + 2, self.avail_idx, Ordering::Release);
            fence(Ordering::SeqCst);
            let kick = if self.event_idx {
                let ev = self
                    .shm
                    .load_u16(self.lay.used + 4 + 8 * self.lay.n, Ordering::Relaxed);
                need_event(ev, self.avail_idx, old)
            } else {
                self.shm.load_u16(self.lay.used, Ordering::Relaxed) & USED_F_NO_NOTIFY == 0
            };
            if kick {
                match &self.bell {
                    Some(b) => b.ring(),
                    None => self.kick.signal(),
                }
            }
        }
    }

    fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let o = 16 * i as usize;
        self.shm.store_u64(o, addr);
        self.shm.store_u32(o + 8, len);
        self.shm.store_u16(o + 12, flags, Ordering::Relaxed);
        self.shm.store_u16(o + 14, next, Ordering::Relaxed);
    }

    fn place(&mut self, p: Pending, need: usize) {
        let at = self.free.len() - need;
        let descs: Vec<u16> = self.free.split_off(at);
        let head = descs[0] as usize;
        let req = self.lay.req + 32 * head;
        let base = self.dev_base;
        self.shm.store_u32(req, p.ty);
        self.shm.store_u32(req + 4, 0);
        self.shm.store_u64(req + 8, p.sector);
        let mut k = 0;
        let mut link = |flags: u16, addr: u64, len: u32| {
            let next = descs.get(k + 1).copied().unwrap_or(0);
            let more = if k + 1 < descs.len() { DESC_F_NEXT } else { 0 };
            self.desc(descs[k], addr, len, flags | more, next);
            k += 1;
        };
        link(0, base + req as u64, 16);
        if let Some((sectors, flags)) = p.range {
            self.shm.store_u64(req + 16, p.sector);
            self.shm.store_u32(req + 24, sectors);
            self.shm.store_u32(req + 28, flags);
            link(0, base + req as u64 + 16, 16);
        }
        let wflag = if p.ty == T_IN { DESC_F_WRITE } else { 0 };
        for &(a, l) in &p.segs {
            link(wflag, a, l);
        }
        let st = self.lay.status + head;
        self.shm.store_u8(st, 0xff);
        link(DESC_F_WRITE, base + st as u64, 1);
        let slot = self.lay.avail + 4 + 2 * (self.avail_idx as usize % self.lay.n);
        self.shm.store_u16(slot, head as u16, Ordering::Relaxed);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.slots[head] = Some(InFlight { req: p, descs });
        self.in_ring += 1;
    }

    /// [`Ring::place`] for the packed layout: one buffer id, consecutive ring entries.
    fn place_packed(&mut self, p: Pending) {
        let Some(id) = self.free.pop() else {
            return self.pending.push_front(p);
        };
        let head = usize::from(id);
        let req = self.lay.req + 32 * head;
        let base = self.dev_base;
        self.shm.store_u32(req, p.ty);
        self.shm.store_u32(req + 4, 0);
        self.shm.store_u64(req + 8, p.sector);
        let mut list = Vec::with_capacity(p.segs.len() + 3);
        list.push((base + req as u64, 16, 0));
        if let Some((sectors, flags)) = p.range {
            self.shm.store_u64(req + 16, p.sector);
            self.shm.store_u32(req + 24, sectors);
            self.shm.store_u32(req + 28, flags);
            list.push((base + req as u64 + 16, 16, 0));
        }
        let wflag = if p.ty == T_IN { DESC_F_WRITE } else { 0 };
        for &(a, l) in &p.segs {
            list.push((a, l, wflag));
        }
        let st = self.lay.status + head;
        self.shm.store_u8(st, 0xff);
        list.push((base + st as u64, 1, DESC_F_WRITE));
        if let Some(pk) = self.packed.as_mut() {
            pk.place(&self.shm, &list, id);
        }
        self.slots[head] = Some(InFlight {
            req: p,
            descs: vec![id],
        });
        self.in_ring += 1;
    }

    /// Move finished requests from the used ring to `ready`.
    fn collect(&mut self) {
        self.collect_armed(self.notify);
    }

    /// [`Ring::collect`]; with `arm`, leave interrupts armed past the last entry seen, checking
    /// the used index again after arming so that no completion slips in between unsignalled.
    fn collect_armed(&mut self, arm: bool) {
        loop {
            self.drain_used();
            if self.dead.is_some() || !arm {
                return;
            }
            self.set_interrupts(true);
            fence(Ordering::SeqCst);
            let more = match &self.packed {
                Some(pk) => pk.has_used(&self.shm),
                None => self.shm.load_u16(self.lay.used + 2, Ordering::Acquire) != self.last_used,
            };
            if !more {
                return;
            }
        }
    }

    fn drain_used(&mut self) {
        // A dead ring failed every request: what the device wrote afterwards is stale.
        if self.dead.is_some() {
            return;
        }
        let idx = match self.packed {
            Some(_) => 0,
            None => self.shm.load_u16(self.lay.used + 2, Ordering::Acquire),
        };
        let mut resubmit = false;
        loop {
            let id = if let Some(pk) = self.packed.as_mut() {
                match pk.pop_used(&self.shm) {
                    None => break,
                    Some(Used::Id(i)) => usize::from(i),
                    Some(Used::Bad) => usize::MAX,
                }
            } else {
                if self.last_used == idx {
                    break;
                }
                let e = self.lay.used + 4 + 8 * (self.last_used as usize % self.lay.n);
                self.last_used = self.last_used.wrapping_add(1);
                self.shm.load_u32(e) as usize
            };
            let Some(f) = self.slots.get_mut(id).and_then(Option::take) else {
                self.fail_all(c"the device returned an unknown request; the queue is stopped");
                return;
            };
            self.in_ring -= 1;
            self.free.extend_from_slice(&f.descs);
            let status = self.shm.load_u8(self.lay.status + id);
            let ud = f.req.user_data;
            match status {
                0 if f.req.flush_after => {
                    self.pending.push_front(Pending {
                        user_data: ud,
                        ty: T_FLUSH,
                        sector: 0,
                        segs: Vec::new(),
                        range: None,
                        flush_after: false,
                    });
                    resubmit = true;
                }
                0 => self.ready.push_back(Completion::ok(ud)),
                2 => self.ready.push_back(Completion::err(
                    ud,
                    libc::ENOTSUP,
                    c"request not supported by the device",
                )),
                _ => self.ready.push_back(Completion::err(ud, libc::EIO, c"")),
            }
        }
        if resubmit {
            self.push_pending();
        }
    }

    /// The backend is gone or broken: every request fails, now and later.
    fn fail_all(&mut self, why: &'static CStr) {
        self.dead = Some(why);
        for s in self.slots.iter_mut() {
            if let Some(f) = s.take() {
                self.ready
                    .push_back(Completion::err(f.req.user_data, libc::EIO, why));
            }
        }
        self.in_ring = 0;
        for p in self.pending.drain(..) {
            self.ready
                .push_back(Completion::err(p.user_data, libc::EIO, why));
        }
    }

    fn check_socket(&mut self, revents: i16) {
        if revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP | libc::POLLIN) != 0 {
            self.revive();
        }
    }

    fn wait(
        &mut self,
        want: usize,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<()> {
        let start = Instant::now();
        let mut spins = 0u32;
        // Progress seen (the used index moving), for the stall probe.
        let mut seen = (self.last_used, Instant::now());
        loop {
            // A new connection after a reconnect has a new socket.
            let sock = (self.sock.as_raw_fd(), libc::POLLRDHUP);
            self.collect();
            if self.ready.len() >= want || self.dead.is_some() {
                return Ok(());
            }
            if self.last_used != seen.0 {
                seen = (self.last_used, Instant::now());
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Err(Error::from_errno(libc::ETIME)),
                },
                None => None,
            };
            let stall = self.stalled(&mut seen);
            if self.dead.is_some() {
                continue;
            }
            match self.call {
                None => {
                    // A poll queue: spin, looking at the socket now and then.
                    spins += 1;
                    if spins.is_multiple_of(4096) {
                        let r = ppoll(&[sock], Some(Duration::ZERO), None)?;
                        self.check_socket(r[0]);
                    }
                    std::hint::spin_loop();
                }
                Some(call) => {
                    self.collect_armed(true);
                    if self.ready.len() >= want || self.dead.is_some() {
                        self.set_interrupts(self.notify);
                        return Ok(());
                    }
                    // With a stall probe, wake up in time to run it.
                    let sleep = match (left, stall) {
                        (Some(l), Some(s)) => Some(l.min(s)),
                        (l, s) => l.or(s),
                    };
                    let r = ppoll(&[(call, libc::POLLIN), sock], sleep, sigmask);
                    self.set_interrupts(self.notify);
                    let r = r?;
                    if r[0] & libc::POLLIN != 0 {
                        read_eventfd(call);
                    }
                    self.check_socket(r[1]);
                }
            }
        }
    }

    /// With a stall probe: once requests on the ring have made no progress since `seen` for
    /// the probe's time, ask the probe whether the device is still there, and fail every request if
    /// not. Returns how long until the next probe is due (`None` without a probe).
    fn stalled(&mut self, seen: &mut (u16, Instant)) -> Option<Duration> {
        let probe = self.probe.as_mut()?;
        let after = probe.2;
        if self.in_ring == 0 {
            *seen = (self.last_used, Instant::now());
            return Some(after);
        }
        match after.checked_sub(seen.1.elapsed()) {
            Some(d) if !d.is_zero() => Some(d),
            _ => {
                let why = probe.1;
                if !(probe.0)() {
                    self.fail_all(why);
                }
                *seen = (self.last_used, Instant::now());
                Some(after)
            }
        }
    }
}

impl Engine for Ring {
    fn in_flight(&self) -> usize {
        self.pending.len() + self.in_ring + self.ready.len()
    }
    fn submit(
        &mut self,
        wait: usize,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<()> {
        if self.dead.is_none() {
            self.push_pending();
        }
        self.collect();
        if wait > self.ready.len() {
            self.wait(wait, timeout, sigmask)?;
        }
        Ok(())
    }
    fn reap(&mut self, out: &mut [Completion]) -> usize {
        if self.dead.is_none() {
            self.collect();
        }
        let n = out.len().min(self.ready.len());
        for (o, c) in out.iter_mut().zip(self.ready.drain(..n)) {
            *o = c;
        }
        n
    }
}

/// A virtio-blk queue of the vhost-user driver.
pub(crate) struct VuQueue {
    pub(crate) core: QueueCore,
    pub(crate) ring: Ring,
    pub(crate) caps: Caps,
    pub(crate) regions: Regions,
}

impl VuQueue {
    /// Turn a request into ring work, or the errno and message of its failed completion.
    ///
    /// # Safety
    /// For readv/writev, `iov` must point to `iovcnt` valid iovecs.
    unsafe fn prepare(
        &self,
        req: &Request,
    ) -> std::result::Result<Option<Pending>, (i32, &'static CStr)> {
        let c = self.caps;
        let fua = req.flags.contains(ReqFlags::FUA);
        let (ty, offset, segs, range) = match req.op {
            Op::Read { offset, buf, len } => (T_IN, offset, vec![(buf as usize, len)], None),
            Op::Write { offset, buf, len } => (T_OUT, offset, vec![(buf as usize, len)], None),
            Op::Readv {
                offset,
                iov,
                iovcnt,
            }
            | Op::Writev {
                offset,
                iov,
                iovcnt,
            } => {
                let v = if iovcnt <= 0 || iov.is_null() {
                    &[][..]
                } else {
                    // SAFETY: guaranteed by the caller.
                    unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) }
                };
                let ty = if matches!(req.op, Op::Readv { .. }) {
                    T_IN
                } else {
                    T_OUT
                };
                (
                    ty,
                    offset,
                    v.iter().map(|i| (i.iov_base as usize, i.iov_len)).collect(),
                    None,
                )
            }
            Op::Flush if !c.flush => return Ok(None),
            Op::Flush => (T_FLUSH, 0, Vec::new(), None),
            Op::Discard { offset, len } => {
                if !c.discard {
                    return Err((libc::ENOTSUP, c"discard not supported"));
                }
                (T_DISCARD, offset, Vec::new(), Some(len))
            }
            Op::WriteZeroes { offset, len } => {
                if !c.write_zeroes {
                    return Err((libc::ENOTSUP, c"write zeroes not supported"));
                }
                (T_WRITE_ZEROES, offset, Vec::new(), Some(len))
            }
            Op::Zone(_) => return Err((libc::ENOTSUP, c"request not supported for this driver")),
        };
        if !offset.is_multiple_of(512) {
            return Err((libc::EINVAL, c"invalid start offset"));
        }
        if c.read_only && ty != T_IN && ty != T_FLUSH {
            return Err((libc::EBADF, c"device is read-only"));
        }
        let segs: Vec<(usize, usize)> = segs.into_iter().filter(|s| s.1 > 0).collect();
        let total: u64 = segs.iter().map(|s| s.1 as u64).sum::<u64>() + range.unwrap_or(0);
        if !total.is_multiple_of(512) {
            return Err((libc::EINVAL, c"len must be a multiple of request-alignment"));
        }
        if segs.len() > c.max_segments || segs.len() + 3 > self.ring.lay.n {
            return Err((libc::EINVAL, c"iovcnt exceeds max-segments"));
        }
        if segs.iter().any(|s| s.1 > u32::MAX as usize) {
            return Err((libc::EINVAL, c"a buffer is longer than 4 GiB"));
        }
        let segs = {
            let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
            let dev = |&(b, l): &(usize, usize)| {
                regions
                    .iter()
                    .find(|&&(s, e, _)| b >= s && b.checked_add(l).is_some_and(|end| end <= e))
                    .map(|&(s, _, d)| (d + (b - s) as u64, l as u32))
            };
            segs.iter()
                .map(dev)
                .collect::<Option<Vec<(u64, u32)>>>()
                .ok_or((libc::EFAULT, c"buffer is not inside a mapped memory region"))?
        };
        let range = match range {
            Some(len) => {
                let sectors =
                    u32::try_from(len / 512).map_err(|_| (libc::EINVAL, c"len is too large"))?;
                let unmap = ty == T_WRITE_ZEROES && !req.flags.contains(ReqFlags::NO_UNMAP);
                Some((sectors, u32::from(unmap)))
            }
            None => None,
        };
        Ok(Some(Pending {
            user_data: req.user_data,
            ty,
            sector: offset / 512,
            segs,
            range,
            flush_after: fua && c.flush,
        }))
    }
}

impl Queue for VuQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        let ud = req.user_data;
        if let Err(m) = req.validate() {
            return self.core.complete(Completion::err(ud, libc::EINVAL, m));
        }
        if let Some(why) = self.ring.dead {
            return self.core.complete(Completion::err(ud, libc::EIO, why));
        }
        // SAFETY: the caller of `enqueue` guarantees the iovec array.
        match unsafe { self.prepare(&req) } {
            Ok(Some(p)) => self.ring.pending.push_back(p),
            Ok(None) => self.core.complete(Completion::ok(ud)),
            Err((errno, m)) => self.core.complete(Completion::err(ud, errno, m)),
        }
    }
    fn do_io(
        &mut self,
        out: &mut [Completion],
        min: usize,
        timeout: Option<&mut Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<usize> {
        self.core.do_io(&mut self.ring, out, min, timeout, sigmask)
    }
    fn completion_fd(&self) -> Option<RawFd> {
        self.core.completion_fd()
    }
    fn set_completion_fd_enabled(&mut self, enabled: bool) {
        self.core.set_completion_fd_enabled(enabled);
        if self.ring.call.is_some() {
            self.ring.notify = enabled;
            self.ring.set_interrupts(enabled);
        }
    }
    fn is_poll(&self) -> bool {
        self.core.is_poll()
    }
    fn outstanding(&self) -> usize {
        self.core.backlog_len() + self.ring.in_flight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A ring nobody serves, with one read on it, and a probe that counts its calls and says
    /// the device is there for the first `alive` of them.
    fn stuck_ring(alive: usize) -> (Ring, Arc<AtomicUsize>) {
        let lay = Layout::new(8);
        let shm = Shm::new(c"test-ring", lay.size).unwrap();
        let call = EventFd::new().unwrap();
        let raw = call.raw();
        let sock = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let calls = Arc::new(AtomicUsize::new(0));
        let n = calls.clone();
        let probe: Probe = Box::new(move || n.fetch_add(1, Ordering::SeqCst) < alive);
        let mut r = Ring::new(
            shm,
            lay,
            EventFd::new().unwrap(),
            (Some(raw), Some(call)),
            sock,
            false,
        )
        .with_probe(probe, c"gone", Duration::from_millis(20));
        r.pending.push_back(Pending {
            user_data: 7,
            ty: T_IN,
            sector: 0,
            segs: vec![(0x1000, 512)],
            range: None,
            flush_after: false,
        });
        (r, calls)
    }

    #[test]
    fn a_stalled_request_fails_once_the_probe_says_the_device_is_gone() {
        let (mut r, calls) = stuck_ring(2);
        // The timeout only bounds a broken probe: the request must fail long before.
        r.submit(1, Some(Duration::from_secs(20)), None).unwrap();
        let mut out = [Completion::ok(0)];
        assert_eq!(r.reap(&mut out), 1);
        assert_eq!((out[0].user_data, out[0].ret), (7, -libc::EIO));
        // Asked until it said no: twice alive, then gone.
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Later requests fail at once.
        assert!(r.dead.is_some());
    }

    #[test]
    fn used_entries_written_after_the_ring_died_are_ignored() {
        let (mut r, _) = stuck_ring(0);
        r.submit(1, Some(Duration::from_secs(20)), None).unwrap();
        let mut out = [Completion::ok(0)];
        assert_eq!(r.reap(&mut out), 1);
        // The device completes the request it had after all: a stale entry, not a new error.
        let used = r.lay.used;
        r.shm.store_u32(used + 4, 0);
        r.shm.store_u16(used + 2, 1, Ordering::Release);
        r.drain_used();
        assert_eq!(r.dead, Some(c"gone"));
        assert_eq!(r.reap(&mut out), 0);
    }

    #[test]
    fn a_live_device_keeps_the_request_waiting() {
        let (mut r, calls) = stuck_ring(usize::MAX);
        let e = r.submit(1, Some(Duration::from_secs(1)), None).unwrap_err();
        assert_eq!(e.errno, libc::ETIME);
        assert!(calls.load(Ordering::SeqCst) >= 1);
        assert_eq!(r.in_flight(), 1);
    }
}
