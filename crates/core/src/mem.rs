//! Memory regions: memfd-backed buffers that can be shared with a driver (and, through the fd,
//! with other processes or the kernel).

use crate::{Error, Result};
use std::os::fd::RawFd;

/// Laid out exactly as `struct blkio_mem_region` (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRegion {
    pub addr: *mut u8,
    pub len: usize,
    /// Reserved, 0.
    pub iova: u64,
    pub fd_offset: i64,
    /// -1 if the memory has no fd.
    pub fd: RawFd,
    /// Reserved, 0.
    pub flags: u32,
}

// SAFETY: a region is a description of memory (address, length, fd); who may touch the memory is
// governed by the request contract of `Queue::enqueue`, not by which thread holds the description.
unsafe impl Send for MemRegion {}
// SAFETY: as above; the struct itself is immutable plain data.
unsafe impl Sync for MemRegion {}

impl MemRegion {
    /// Allocate `len` bytes of memfd-backed shared memory (page aligned, close-on-exec — libblkio
    /// 1.5 forgot CLOEXEC; we don't).
    pub fn alloc(len: usize) -> Result<MemRegion> {
        if len == 0 {
            return Err(Error::inval("Invalid argument (os error 22)"));
        }
        // SAFETY: the name is a valid C string; flags are a plain bitmask.
        let fd = unsafe { libc::memfd_create(c"libblkio-buf".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os_error());
        }
        // SAFETY: `fd` is a memfd we own.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } < 0 {
            let e = Error::last_os_error();
            // SAFETY: closing our own fd.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        // SAFETY: mapping a fresh fd of `len` bytes; the result is checked below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            let e = Error::last_os_error();
            // SAFETY: closing our own fd.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(MemRegion {
            addr: addr as *mut u8,
            len,
            iova: 0,
            fd_offset: 0,
            fd,
            flags: 0,
        })
    }

    /// Unmap and close a region made by [`MemRegion::alloc`].
    ///
    /// # Safety
    /// The region must come from `alloc`, not be freed already, and no request may still use it.
    pub unsafe fn free(self) {
        // SAFETY: per the contract, addr/len/fd are the live mapping and fd from `alloc`.
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, self.len);
            libc::close(self.fd);
        }
    }

    /// The region as a byte slice.
    ///
    /// # Safety
    /// The region must be live and not concurrently written (e.g. by an in-flight read).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }

    /// The region as a mutable byte slice.
    ///
    /// # Safety
    /// The region must be live and not accessed by anyone else for the slice's lifetime.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_c() {
        assert_eq!(std::mem::size_of::<MemRegion>(), 40);
        assert_eq!(std::mem::offset_of!(MemRegion, fd), 32);
        assert_eq!(std::mem::offset_of!(MemRegion, flags), 36);
    }

    #[test]
    fn alloc_is_cloexec_and_usable() {
        let r = MemRegion::alloc(8192).unwrap();
        // SAFETY: querying flags of our own fd.
        let fl = unsafe { libc::fcntl(r.fd, libc::F_GETFD) };
        assert_ne!(fl & libc::FD_CLOEXEC, 0);
        // SAFETY: fresh region, no I/O.
        unsafe { r.as_mut_slice()[8191] = 7 };
        // SAFETY: as above.
        assert_eq!(unsafe { r.as_slice()[8191] }, 7);
        // SAFETY: allocated above, unused.
        unsafe { r.free() };
        assert_eq!(MemRegion::alloc(0).unwrap_err().errno, libc::EINVAL);
    }
}
