//! Ring ownership: building a queue's ring ([`make_ring`]), entering it, and which thread may
//! do so. Rings are `SINGLE_ISSUER | DEFER_TASKRUN` where the kernel has it, created disabled
//! and enabled by the first thread that submits; the engine moves a queue to a new ring when
//! another thread takes it over or its completion fd is handed out (`UringEngine::claim`).

use super::bufs::{BUF_SLOTS, Buffers};
use crate::file::Target;
use io_uring::{IoUring, Submitter};
use snapblk_core::{Error, Result};
use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

const IORING_ENTER_GETEVENTS: u32 = 1;
const IORING_ENTER_EXT_ARG: u32 = 8;
/// The kernel's `sigset_t` is 8 bytes (`_NSIG / 8`), not glibc's 128: passing glibc's size is
/// what made libblkio's `do_io_interruptible` fail with EINVAL.
const KERNEL_SIGSET_SIZE: u32 = 8;

/// `struct io_uring_getevents_arg`.
#[repr(C)]
struct GeteventsArg {
    sigmask: u64,
    sigmask_sz: u32,
    min_wait_usec: u32,
    ts: u64,
}

/// A ring just built by [`make_ring`].
pub(super) struct NewRing {
    pub(super) io: IoUring,
    /// `SINGLE_ISSUER | DEFER_TASKRUN`, created disabled.
    pub(super) defer: bool,
    /// The target is fixed file 0.
    pub(super) fixed_file: bool,
    /// The ring holds every mapped region (see `Buffers::attach`).
    pub(super) fixed_bufs: bool,
    /// Says when the kernel has let go of the ring (None: it could not be registered).
    pub(super) canary: Option<Canary>,
}

/// A new ring for `t`, with the target, the regions mapped so far, the eventfd and a
/// [`Canary`] registered.
///
/// Regular queues whose completion fd nobody asked for (`defer_ok`) ask for
/// `SINGLE_ISSUER | DEFER_TASKRUN` (completions are posted when the owning thread enters the
/// kernel, instead of through task work that interrupts it: ~1.5x the IOPS at QD32 on zram and
/// tmpfs) and `R_DISABLED`, so that the thread that first submits — not the one that created
/// the queue — becomes the owner ([`UringEngine::claim`]). Kernels without these flags, poll
/// queues and queues whose completion fd is in use get a plain ring: with DEFER_TASKRUN the
/// kernel signals the eventfd once when a completion is queued and again when it is posted,
/// i.e. a spurious wakeup per batch for eventfd-driven callers. The eventfd is registered but
/// silent until someone asks for it (`completion_fd`). A `SINGLE_ISSUER` ring without a canary
/// is never used: only its owner could wait for its requests, so a queue dropped in another
/// thread could not (see `UringQueue::drop`); such a ring is rebuilt plain.
pub(super) fn make_ring(
    t: &Target,
    bufs: &Buffers,
    efd: Option<RawFd>,
    entries: u32,
    poll: bool,
    defer_ok: bool,
) -> Result<NewRing> {
    let mut defer = !poll && defer_ok;
    loop {
        let mut ring = None;
        if defer {
            let mut b = IoUring::builder();
            b.setup_single_issuer()
                .setup_defer_taskrun()
                .setup_coop_taskrun()
                .setup_r_disabled();
            ring = b.build(entries).ok();
        }
        let mut ring = match ring {
            Some(r) => r,
            None => {
                defer = false;
                let mut b = IoUring::builder();
                if poll {
                    b.setup_iopoll();
                }
                b.build(entries).map_err(Error::from_io)?
            }
        };
        ring.completion().disable_eventfd();
        let sub = ring.submitter();
        if let Some(e) = efd {
            sub.register_eventfd(e)
                .map_err(|e| Error::new(libc::ENOTSUP, e.to_string()))?;
        }
        let (fixed_file, canary) = Canary::register(&sub, t.raw());
        if defer && canary.is_none() {
            defer = false;
            continue;
        }
        // Buffers: a sparse table, filled with the regions mapped so far (see
        // `Buffers::attach`).
        let fixed_bufs =
            sub.register_buffers_sparse(BUF_SLOTS).is_ok() && bufs.attach(ring.as_raw_fd());
        return Ok(NewRing {
            io: ring,
            defer,
            fixed_file,
            fixed_bufs,
            canary,
        });
    }
}

/// The read end of a pipe whose only write end is fixed file 1 of a ring. The kernel drops
/// its registered files when it frees the ring, which it does only once every request of the
/// ring is finished (completed or cancelled, including reads an io-wq worker is still copying
/// into, which no cancellation stops). So end-of-file here says that no request of the ring
/// can touch a caller's buffer any more, and waiting for it needs no `io_uring_enter` — which
/// on a `SINGLE_ISSUER` ring only its owner may do.
pub(crate) struct Canary {
    rd: OwnedFd,
    /// Wait for end-of-file when dropped (after the ring is closed: see [`Ring`]).
    pub(crate) wait: bool,
}

impl Canary {
    /// Register the target as fixed file 0 and a canary as fixed file 1; returns whether the
    /// target is registered, and the canary if it is.
    pub(crate) fn register(sub: &Submitter<'_>, target: RawFd) -> (bool, Option<Canary>) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0 {
            // SAFETY: both descriptors were just created and are owned here only.
            let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            // The ring takes its own reference to the write end; ours is closed on return.
            if sub.register_files(&[target, wr.as_raw_fd()]).is_ok() {
                return (true, Some(Canary { rd, wait: false }));
            }
        }
        (sub.register_files(&[target]).is_ok(), None)
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        if !self.wait {
            return;
        }
        let mut b = [0u8; 8];
        loop {
            // SAFETY: reads into a live local buffer from our own pipe end.
            let n = unsafe { libc::read(self.rd.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
            // 0: end-of-file; nothing is ever written, so any other result is an error.
            if n == 0 || (n < 0 && crate::file::errno() != libc::EINTR) {
                break;
            }
        }
    }
}

/// Identifies the calling thread cheaply (the address of a thread-local), to notice when a
/// queue is driven from a thread other than its ring's owner.
pub(super) fn thread_token() -> usize {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|t| t as *const u8 as usize)
}

/// A queue's ring and what is known about it.
pub(super) struct Ring {
    /// Declared before `canary`, so dropped first: the canary's wait needs the ring closed.
    pub(super) io: IoUring,
    /// The target is registered as fixed file 0.
    pub(super) fixed_file: bool,
    pub(super) poll: bool,
    /// The ring is `SINGLE_ISSUER | DEFER_TASKRUN`, created disabled (see [`make_ring`]).
    pub(super) defer: bool,
    /// [`thread_token`] of the thread that enabled the ring (0: not enabled yet).
    pub(super) owner: usize,
    /// For rebuilding the ring in another thread: its size, the eventfd, and whether the
    /// eventfd is currently signalled.
    pub(super) entries: u32,
    pub(super) efd: Option<RawFd>,
    pub(super) efd_on: Cell<bool>,
    /// The completion fd was handed out: move to a plain ring at the next chance.
    pub(super) want_plain: Cell<bool>,
    /// CQ entries: the most requests the kernel may hold at once.
    pub(super) cq_cap: usize,
    /// Says when the kernel has freed `io` (see [`Canary`]); dropped after `io`.
    pub(super) canary: Option<Canary>,
}

impl Ring {
    /// A queue's first ring (see [`make_ring`]); also says whether it holds the fixed buffers.
    pub(super) fn new(
        t: &Target,
        bufs: &Buffers,
        efd: Option<RawFd>,
        entries: u32,
        poll: bool,
    ) -> Result<(Ring, bool)> {
        let NewRing {
            io,
            defer,
            fixed_file,
            fixed_bufs,
            canary,
        } = make_ring(t, bufs, efd, entries, poll, true)?;
        let cq_cap = io.params().cq_entries() as usize;
        let ring = Ring {
            io,
            fixed_file,
            poll,
            defer,
            owner: 0,
            entries,
            efd,
            efd_on: Cell::new(false),
            want_plain: Cell::new(false),
            cq_cap,
            canary,
        };
        Ok((ring, fixed_bufs))
    }

    /// Whether the calling thread must claim the ring before entering it: a `SINGLE_ISSUER`
    /// ring owned by another thread (or by nobody yet), or one that should become plain.
    #[inline]
    pub(super) fn needs_claim(&self) -> bool {
        self.defer && (self.owner != thread_token() || self.want_plain.get())
    }

    /// Enable a disabled `SINGLE_ISSUER` ring: the thread `me` becomes its owner.
    pub(super) fn enable(&mut self, me: usize) -> std::result::Result<(), i32> {
        self.io
            .submitter()
            .register_enable_rings()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
        self.owner = me;
        Ok(())
    }

    /// Replace the ring by `new` (from [`make_ring`]), which the thread `me` owns if it is a
    /// `SINGLE_ISSUER` ring. The old ring is closed: whatever sat in its SQ must be queued
    /// again by the caller, and nothing of it may be in the kernel.
    pub(super) fn replace(
        &mut self,
        new: NewRing,
        bufs: &Buffers,
        me: usize,
    ) -> std::result::Result<(), i32> {
        let old = std::mem::replace(&mut self.io, new.io);
        bufs.detach(old.as_raw_fd());
        drop(old);
        self.canary = new.canary;
        self.defer = new.defer;
        self.fixed_file = new.fixed_file;
        self.cq_cap = self.io.params().cq_entries() as usize;
        if self.efd_on.get() {
            self.io.completion().enable_eventfd();
        }
        self.owner = 0;
        if self.defer {
            self.enable(me)?;
        }
        Ok(())
    }

    /// `io_uring_enter` from whatever thread calls (see `enter`).
    pub(super) fn enter_now(
        &mut self,
        to_submit: u32,
        want: u32,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> std::result::Result<usize, i32> {
        // With DEFER_TASKRUN completions are only posted inside a GETEVENTS enter.
        let getevents = want > 0 || self.poll || self.defer;
        enter(
            &self.io.submitter(),
            to_submit,
            want,
            getevents,
            timeout,
            sigmask,
        )
    }
}

/// `io_uring_enter`: submit `to_submit` entries and, with `getevents`, wait for `want`
/// completions, at most `timeout`, with `sigmask` as the signal mask while waiting. Also used
/// by the nvme-io_uring driver's rings. `Err` is the errno.
pub(crate) fn enter(
    sub: &Submitter<'_>,
    to_submit: u32,
    want: u32,
    getevents: bool,
    timeout: Option<Duration>,
    sigmask: Option<&libc::sigset_t>,
) -> std::result::Result<usize, i32> {
    let mut flags = if getevents { IORING_ENTER_GETEVENTS } else { 0 };
    let ts;
    let arg;
    let r = if want > 0 && (timeout.is_some() || sigmask.is_some()) {
        flags |= IORING_ENTER_EXT_ARG;
        ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        arg = GeteventsArg {
            sigmask: sigmask.map_or(0, |m| m as *const libc::sigset_t as u64),
            sigmask_sz: if sigmask.is_some() {
                KERNEL_SIGSET_SIZE
            } else {
                0
            },
            min_wait_usec: 0,
            ts: ts.as_ref().map_or(0, |t| t as *const libc::timespec as u64),
        };
        // SAFETY: `arg` (and the timespec/sigmask it points to) outlive the call; the size
        // passed by `enter` is that of `GeteventsArg`, the kernel's getevents_arg.
        unsafe { sub.enter(to_submit, want, flags, Some(&arg)) }
    } else {
        // SAFETY: no argument pointer.
        unsafe { sub.enter::<libc::sigset_t>(to_submit, want, flags, None) }
    };
    r.map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))
}

/// `claim`'s refusal to move a queue whose requests are in another thread's ring (negative, so
/// it cannot be mistaken for the kernel's EBUSY, which means "reap, then retry").
pub(super) const IN_OTHER_THREADS_RING: i32 = -libc::EBUSY;
