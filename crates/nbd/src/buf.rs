//! Aligned, reusable I/O buffers without `unsafe`: an over-allocated `Vec` used from its first
//! aligned byte.

use snapblk_core::sync::lock;
use std::sync::Mutex;

/// A buffer whose usable part starts at an `align`-aligned address.
pub(crate) struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    cap: usize,
}

impl AlignedBuf {
    pub(crate) fn new(cap: usize, align: usize) -> AlignedBuf {
        let align = align.max(1);
        let v = vec![0u8; cap + align];
        let off = v.as_ptr().align_offset(align).min(align);
        AlignedBuf { v, off, cap }
    }
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }
    /// The first `len` usable bytes (`len` is clamped to the capacity).
    pub(crate) fn slice(&self, len: usize) -> &[u8] {
        &self.v[self.off..self.off + len.min(self.cap)]
    }
    pub(crate) fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.v[self.off..self.off + len.min(self.cap)]
    }
}

/// A small pool of buffers, so steady-state I/O does not allocate.
pub(crate) struct BufPool {
    free: Mutex<Vec<AlignedBuf>>,
    align: usize,
    /// Keep at most this many bytes of idle buffers.
    keep_bytes: usize,
}

impl BufPool {
    pub(crate) fn new(align: usize, keep_bytes: usize) -> BufPool {
        BufPool {
            free: Mutex::new(Vec::new()),
            align,
            keep_bytes,
        }
    }

    /// A buffer of at least `len` bytes.
    pub(crate) fn get(&self, len: usize) -> AlignedBuf {
        {
            let mut f = lock(&self.free);
            if let Some(i) = f.iter().position(|b| b.capacity() >= len) {
                return f.swap_remove(i);
            }
        }
        AlignedBuf::new(len.max(4096).next_power_of_two(), self.align)
    }

    pub(crate) fn put(&self, b: AlignedBuf) {
        let mut f = lock(&self.free);
        let held: usize = f.iter().map(|b| b.capacity()).sum();
        if held + b.capacity() <= self.keep_bytes {
            f.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_reused() {
        let p = BufPool::new(4096, 1 << 20);
        let mut b = p.get(1000);
        assert_eq!(b.slice_mut(1000).as_ptr() as usize % 4096, 0);
        assert_eq!(b.capacity(), 4096);
        b.slice_mut(10)[9] = 1;
        p.put(b);
        let b2 = p.get(3000);
        assert_eq!(b2.slice(10)[9], 1, "the pooled buffer came back");
        let big = p.get(1 << 21);
        p.put(big); // over keep_bytes: dropped
        assert_eq!(p.free.lock().unwrap().len(), 0);
    }
}
