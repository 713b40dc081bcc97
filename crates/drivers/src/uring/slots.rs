//! The slot table: per-request state of the requests a queue has accepted, indexed by the
//! CQE's `user_data` and reused (no allocation per request once the table has grown to the
//! queue depth). Like libblkio's `Requests`.

use crate::file::{advance, zero_iov};
use snapblk_core::{Op, Request};

/// What a slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    Free,
    /// The request's main operation.
    Main,
    /// The flush that follows a FUA write-zeroes.
    FuaFlush,
}

#[derive(Debug)]
pub(super) struct Slot {
    pub(super) req: Request,
    pub(super) stage: Stage,
    /// Bytes transferred so far (reads/writes).
    pub(super) done: usize,
    /// Remaining iovecs after a short vectored transfer.
    pub(super) iov_rest: Vec<libc::iovec>,
}

/// The slots and their free list.
#[derive(Debug, Default)]
pub(super) struct SlotTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slots allocated (waiting + in the kernel).
    live: usize,
}

impl SlotTable {
    /// Slots allocated (waiting + in the kernel).
    #[inline]
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// A slot for `req` at the start of its main operation.
    #[inline]
    pub(super) fn alloc(&mut self, req: Request) -> u32 {
        self.live += 1;
        if let Some(i) = self.free.pop() {
            let s = &mut self.slots[i as usize];
            s.req = req;
            s.stage = Stage::Main;
            s.done = 0;
            s.iov_rest.clear();
            i
        } else {
            self.slots.push(Slot {
                req,
                stage: Stage::Main,
                done: 0,
                iov_rest: Vec::new(),
            });
            (self.slots.len() - 1) as u32
        }
    }

    #[inline]
    pub(super) fn release(&mut self, i: u32) {
        self.slots[i as usize].stage = Stage::Free;
        self.free.push(i);
        self.live -= 1;
    }

    /// Indexes of the allocated slots, in index order.
    pub(super) fn in_use(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.stage != Stage::Free)
            .map(|(i, _)| i as u32)
    }
}

impl std::ops::Index<u32> for SlotTable {
    type Output = Slot;
    #[inline]
    fn index(&self, i: u32) -> &Slot {
        &self.slots[i as usize]
    }
}

impl std::ops::IndexMut<u32> for SlotTable {
    #[inline]
    fn index_mut(&mut self, i: u32) -> &mut Slot {
        &mut self.slots[i as usize]
    }
}

/// Zero what a read did not fill.
///
/// # Safety
/// The slot's read buffers must be valid and writable.
pub(super) unsafe fn zero_rest(slot: &Slot) {
    match slot.req.op {
        Op::Read { buf, len, .. } => {
            // SAFETY: `done < len`; the buffer is valid per the contract.
            unsafe { std::ptr::write_bytes(buf.add(slot.done), 0, len - slot.done) };
        }
        Op::Readv { iov, iovcnt, .. } => {
            // SAFETY: per the contract.
            let all = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
            // SAFETY: per the contract.
            unsafe { zero_iov(&advance(all, slot.done)) };
        }
        _ => {}
    }
}
