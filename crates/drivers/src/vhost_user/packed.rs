//! The packed virtqueue layout (virtio 1.2 §2.8), used by [`Ring`](super::virtq::Ring) when
//! `VIRTIO_F_RING_PACKED` was negotiated (the vfio-pci driver asks for it, as libblkio's PCI
//! transport does).
//!
//! One descriptor ring of `n` 16-byte entries (`addr`, `len`, buffer `id`, `flags`) shared by
//! driver and device, a driver event suppression area (written here) and a device event
//! suppression area (read here). A request's chain takes consecutive ring entries; its buffer
//! id is the ring's request slot. The device returns one used entry per chain, at the position
//! of the chain's first entry, and both sides skip the rest of the chain.

use super::sys::Shm;
use super::virtq::Layout;
use std::sync::atomic::{Ordering, fence};

const F_NEXT: u16 = 1;
const F_AVAIL: u16 = 1 << 7;
const F_USED: u16 = 1 << 15;
/// Event suppression flags: notifications on / off.
const EV_ENABLE: u16 = 0;
const EV_DISABLE: u16 = 1;

/// The driver's side of a packed ring.
#[derive(Debug)]
pub(crate) struct Packed {
    n: u16,
    next_avail: u16,
    avail_wrap: bool,
    next_used: u16,
    used_wrap: bool,
    /// Ring entries not taken by a chain.
    pub(crate) free: usize,
    /// Chain length per buffer id (0: not in flight).
    chain: Vec<u16>,
}

/// What the device returned at the next used position.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Used {
    /// The chain with this buffer id is done.
    Id(u16),
    /// A buffer id that is not in flight: the device is broken.
    Bad,
}

impl Packed {
    pub(crate) fn new(n: usize) -> Packed {
        Packed {
            n: n as u16,
            next_avail: 0,
            avail_wrap: true,
            next_used: 0,
            used_wrap: true,
            free: n,
            chain: vec![0; n],
        }
    }

    /// Make the chain `list` of `(address, length, flags)` available under buffer `id`: every
    /// entry but the first, then the first one's flags after a release fence, so the device
    /// sees the whole chain at once. The caller checked that `free` holds it.
    pub(crate) fn place(&mut self, shm: &Shm, list: &[(u64, u32, u16)], id: u16) {
        let head = self.next_avail;
        let mut head_flags = 0;
        for (k, &(addr, len, f)) in list.iter().enumerate() {
            let mut flags = f | if self.avail_wrap { F_AVAIL } else { F_USED };
            if k + 1 < list.len() {
                flags |= F_NEXT;
            }
            let o = 16 * usize::from(self.next_avail);
            shm.store_u64(o, addr);
            shm.store_u32(o + 8, len);
            shm.store_u16(o + 12, id, Ordering::Relaxed);
            if k == 0 {
                head_flags = flags;
            } else {
                shm.store_u16(o + 14, flags, Ordering::Relaxed);
            }
            self.next_avail += 1;
            if self.next_avail == self.n {
                self.next_avail = 0;
                self.avail_wrap = !self.avail_wrap;
            }
        }
        fence(Ordering::Release);
        shm.store_u16(16 * usize::from(head) + 14, head_flags, Ordering::Release);
        self.free -= list.len();
        if let Some(c) = self.chain.get_mut(usize::from(id)) {
            *c = list.len() as u16;
        }
    }

    fn used_at_next(&self, shm: &Shm) -> bool {
        let f = shm.load_u16(16 * usize::from(self.next_used) + 14, Ordering::Acquire);
        let (a, u) = (f & F_AVAIL != 0, f & F_USED != 0);
        a == u && u == self.used_wrap
    }

    /// Whether the device has returned a chain not yet taken.
    pub(crate) fn has_used(&self, shm: &Shm) -> bool {
        self.used_at_next(shm)
    }

    /// Take the next used chain, if any.
    pub(crate) fn pop_used(&mut self, shm: &Shm) -> Option<Used> {
        if !self.used_at_next(shm) {
            return None;
        }
        let id = shm.load_u16(16 * usize::from(self.next_used) + 12, Ordering::Relaxed);
        let len = match self.chain.get_mut(usize::from(id)) {
            Some(c) if *c > 0 => std::mem::take(c),
            _ => return Some(Used::Bad),
        };
        self.next_used += len;
        if self.next_used >= self.n {
            self.next_used -= self.n;
            self.used_wrap = !self.used_wrap;
        }
        self.free += usize::from(len);
        Some(Used::Id(id))
    }

    /// Ask the device for interrupts (`on`) or not, in the driver event suppression area.
    pub(crate) fn set_interrupts(&self, shm: &Shm, lay: &Layout, on: bool) {
        let f = if on { EV_ENABLE } else { EV_DISABLE };
        shm.store_u16(lay.avail + 2, f, Ordering::Relaxed);
    }

    /// Whether the device wants a notification (its event suppression area; a descriptor
    /// event counts as "yes": one notification too many is harmless).
    pub(crate) fn need_kick(&self, shm: &Shm, lay: &Layout) -> bool {
        shm.load_u16(lay.used + 2, Ordering::Relaxed) != EV_DISABLE
    }
}

#[cfg(test)]
mod tests {
    use super::{F_AVAIL, F_USED, Packed, Used};
    use crate::vhost_user::sys::Shm;
    use crate::vhost_user::virtq::Layout;
    use std::sync::atomic::Ordering;

    /// The device's side, as the spec describes it: write a used entry for the chain at
    /// `pos` (buffer `id`) with the device's wrap counter.
    fn device_use(shm: &Shm, pos: usize, id: u16, wrap: bool) {
        shm.store_u16(16 * pos + 12, id, Ordering::Relaxed);
        let f = if wrap { F_AVAIL | F_USED } else { 0 };
        shm.store_u16(16 * pos + 14, f, Ordering::Release);
    }

    #[test]
    fn chains_wrap_around_and_come_back_by_id() {
        let lay = Layout::packed(4);
        let shm = Shm::new(c"packed-test", lay.size).unwrap();
        let mut p = Packed::new(4);
        let d = |a| (a, 512u32, 0u16);
        // Two chains of 2 and 1 entries.
        p.place(&shm, &[d(0x1000), d(0x2000)], 7 % 4);
        p.place(&shm, &[d(0x3000)], 1);
        assert_eq!(p.free, 1);
        let flags = |i: usize| shm.load_u16(16 * i + 14, Ordering::Relaxed);
        // Made available with wrap 1: AVAIL set, USED clear; the first entry chains on.
        assert_eq!(flags(0), F_AVAIL | 1);
        assert_eq!(flags(1), F_AVAIL);
        assert_eq!(flags(2), F_AVAIL);
        assert!(!p.has_used(&shm));
        // The device completes the second chain first: its used entry goes at position 0.
        device_use(&shm, 0, 1, true);
        assert_eq!(p.pop_used(&shm), Some(Used::Id(1)));
        assert_eq!(p.free, 2);
        assert_eq!(p.pop_used(&shm), None, "position 1 is not used yet");
        device_use(&shm, 1, 3, true);
        assert_eq!(p.pop_used(&shm), Some(Used::Id(3)));
        assert_eq!(p.free, 4);
        // Next chain wraps: entries 3 and 0, the second one with wrap 0 (USED set, AVAIL
        // clear).
        p.place(&shm, &[d(0x4000), d(0x5000)], 0);
        assert_eq!(flags(3), F_AVAIL | 1);
        assert_eq!(flags(0), F_USED);
        // Old used flags at position 3 (zero) do not count; the device's wrap is still 1.
        assert!(!p.has_used(&shm));
        device_use(&shm, 3, 0, true);
        assert_eq!(p.pop_used(&shm), Some(Used::Id(0)));
        // A used entry whose id is not in flight is reported, not trusted.
        device_use(&shm, 1, 2, false);
        assert_eq!(p.pop_used(&shm), Some(Used::Bad));
    }
}
