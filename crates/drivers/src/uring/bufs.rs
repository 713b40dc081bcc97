//! The fixed-buffer table: memory regions mapped with `map_mem_region`, registered as fixed
//! buffers of every ring of the device ([`Buffers`], shared), and each queue's cache of it
//! ([`FixedBufCache`]), which finds the buffer index of a request's memory without a lock.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Fixed-buffer slots per ring (regions beyond this are used unregistered).
pub(crate) const BUF_SLOTS: u32 = 64;
const IORING_REGISTER_BUFFERS_UPDATE: libc::c_uint = 16;

/// Registered-buffer table shared by the driver (which maps/unmaps) and its queues (which look
/// buffers up per request).
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    /// Bumped after every change; queues refresh their local copy when it moves.
    generation: AtomicU64,
    inner: Mutex<BufInner>,
}

#[derive(Debug, Default)]
struct BufInner {
    /// (addr, len) per fixed-buffer index.
    slots: Vec<Option<(usize, usize)>>,
    /// Ring fds of live queues. A queue removes its fd here before closing the ring, under the
    /// lock, so an fd in this list is always the live ring.
    rings: Vec<RawFd>,
}

#[repr(C)]
struct RsrcUpdate2 {
    offset: u32,
    resv: u32,
    data: u64,
    tags: u64,
    nr: u32,
    resv2: u32,
}

fn update_buffer(ring: RawFd, index: u32, iov: &libc::iovec) -> std::result::Result<(), i32> {
    let up = RsrcUpdate2 {
        offset: index,
        resv: 0,
        data: iov as *const libc::iovec as u64,
        tags: 0,
        nr: 1,
        resv2: 0,
    };
    // SAFETY: `up` and the iovec it points to are live for the call; the kernel copies them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring,
            IORING_REGISTER_BUFFERS_UPDATE,
            &up as *const RsrcUpdate2,
            std::mem::size_of::<RsrcUpdate2>(),
        )
    };
    if r < 0 {
        Err(crate::file::errno())
    } else {
        Ok(())
    }
}

impl Buffers {
    /// Register `(addr, len)` in every ring; `false` if it could not be (table full, pinning
    /// refused): the region then simply works unregistered.
    pub(crate) fn register(&self, addr: usize, len: usize) -> bool {
        let Ok(mut g) = self.inner.lock() else {
            return false;
        };
        if len == 0 || len > u32::MAX as usize {
            return false;
        }
        let idx = match g.slots.iter().position(|s| s.is_none()) {
            Some(i) => i,
            None if g.slots.len() < BUF_SLOTS as usize => {
                g.slots.push(None);
                g.slots.len() - 1
            }
            None => return false,
        };
        let iov = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        for (i, &ring) in g.rings.iter().enumerate() {
            if update_buffer(ring, idx as u32, &iov).is_err() {
                for &r in &g.rings[..i] {
                    let _ = update_buffer(r, idx as u32, &empty);
                }
                return false;
            }
        }
        g.slots[idx] = Some((addr, len));
        self.generation.fetch_add(1, Ordering::Release);
        true
    }

    pub(crate) fn unregister(&self, addr: usize, len: usize) {
        let Ok(mut g) = self.inner.lock() else { return };
        let Some(idx) = g.slots.iter().position(|s| *s == Some((addr, len))) else {
            return;
        };
        g.slots[idx] = None;
        self.generation.fetch_add(1, Ordering::Release);
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        for &ring in &g.rings {
            let _ = update_buffer(ring, idx as u32, &empty);
        }
    }
    /// Fill a new ring's sparse table with the regions mapped so far; `true` if every one of
    /// them could be registered, and the ring then follows later changes. Registration is an
    /// optimisation only, so failures leave the ring without fixed buffers — all of them: the
    /// table's indexes are shared by every ring, so a ring missing one of its entries would
    /// fail I/O into that region with EFAULT. The kernel charges pinned pages to
    /// RLIMIT_MEMLOCK per ring, so a second ring can fail where the first succeeded.
    pub(crate) fn attach(&self, ring: RawFd) -> bool {
        let Ok(mut g) = self.inner.lock() else {
            return false;
        };
        let fixed_bufs = g.slots.iter().enumerate().all(|(i, s)| match *s {
            Some((a, l)) => {
                let iov = libc::iovec {
                    iov_base: a as *mut libc::c_void,
                    iov_len: l,
                };
                update_buffer(ring, i as u32, &iov).is_ok()
            }
            None => true,
        });
        // Only rings with the whole table follow later changes (a region mapped later is
        // registered in all of them or in none).
        if fixed_bufs {
            g.rings.push(ring);
        }
        fixed_bufs
    }

    /// Stop updating `ring` (called before it is closed, so an fd in the list is always live).
    pub(crate) fn detach(&self, ring: RawFd) {
        if let Ok(mut g) = self.inner.lock() {
            g.rings.retain(|&r| r != ring);
        }
    }
}

/// A queue's view of [`Buffers`]: whether its ring holds the table, and a local copy of it
/// refreshed when the table's generation moves, so that looking up a request's buffer takes no
/// lock.
pub(crate) struct FixedBufCache {
    shared: Arc<Buffers>,
    /// This ring holds every mapped region in the shared fixed-buffer table (see
    /// [`super::ring::make_ring`]); when it could not (e.g. RLIMIT_MEMLOCK, charged per ring),
    /// it uses none of them.
    pub(crate) enabled: bool,
    generation: u64,
    /// Local copy of the registered buffers: (start, end, index).
    local: Vec<(usize, usize, u16)>,
    /// The last registered buffer a request fell into (empty range: none).
    last_hit: (usize, usize, u16),
}

impl FixedBufCache {
    pub(crate) fn new(shared: Arc<Buffers>, enabled: bool) -> FixedBufCache {
        FixedBufCache {
            shared,
            enabled,
            generation: u64::MAX,
            local: Vec::new(),
            last_hit: (0, 0, 0),
        }
    }

    /// The table this cache copies.
    pub(crate) fn shared(&self) -> &Buffers {
        &self.shared
    }

    fn refresh(&mut self) {
        let g = self.shared.generation.load(Ordering::Acquire);
        if g == self.generation {
            return;
        }
        if let Ok(inner) = self.shared.inner.lock() {
            self.last_hit = (0, 0, 0);
            self.local.clear();
            for (i, s) in inner.slots.iter().enumerate() {
                if let Some((a, l)) = *s {
                    self.local.push((a, a + l, i as u16));
                }
            }
            self.generation = g;
        }
    }

    /// The registered buffer holding `addr..addr+len`, if any.
    #[inline(always)]
    pub(crate) fn index(&mut self, addr: usize, len: usize) -> Option<u16> {
        if !self.enabled {
            return None;
        }
        // Requests of one client nearly always come from the same region: try the last hit
        // (valid while the table has not changed) before anything else.
        let (lo, hi, bi) = self.last_hit;
        if addr >= lo
            && addr <= hi
            && len <= hi - addr
            && self.shared.generation.load(Ordering::Acquire) == self.generation
        {
            return Some(bi);
        }
        self.index_slow(addr, len)
    }

    #[inline(never)]
    fn index_slow(&mut self, addr: usize, len: usize) -> Option<u16> {
        self.refresh();
        let end = addr.checked_add(len)?;
        let hit = *self
            .local
            .iter()
            .find(|(s, e, _)| addr >= *s && end <= *e)?;
        self.last_hit = hit;
        Some(hit.2)
    }
}
