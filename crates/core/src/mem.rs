//! Memory regions: memfd-backed buffers that can be shared with a driver (and, through the fd,
//! with other processes or the kernel), or private anonymous ones for callers that share
//! nothing.

use crate::{Error, Result};
use std::os::fd::RawFd;

/// A mapped buffer that request buffers may point into; a plain description (copying it does
/// not copy the memory), freed explicitly. Laid out exactly as `struct blkio_mem_region`
/// (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRegion {
    /// Start of the mapping (page aligned when allocated here).
    pub addr: *mut u8,
    /// Length of the mapping in bytes.
    pub len: usize,
    /// Reserved, 0.
    pub iova: u64,
    /// Offset in `fd` at which the mapping starts (0 for regions allocated here).
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

    /// Allocate `len` bytes of private anonymous memory (page aligned, no fd: `fd` is -1) —
    /// what `malloc` gives a program, and what fio's I/O buffers are by default.
    ///
    /// Why not always [`MemRegion::alloc`]: shared (memfd) pages cost more to pin for each
    /// O_DIRECT system call than private ones (~10 % of a 4 KiB `pread` on zram, measured),
    /// so a benchmark that compares with fio, or plain file I/O that never shares its buffer,
    /// should not pay for sharing it does not use. Drivers that need an fd
    /// (`needs-mem-region-fd`) cannot use these.
    pub fn alloc_private(len: usize) -> Result<MemRegion> {
        if len == 0 {
            return Err(Error::inval("Invalid argument (os error 22)"));
        }
        // SAFETY: a fresh anonymous mapping; the result is checked below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(Error::last_os_error());
        }
        Ok(MemRegion {
            addr: addr as *mut u8,
            len,
            iova: 0,
            fd_offset: 0,
            fd: -1,
            flags: 0,
        })
    }

    /// Unmap (and close the fd of) a region made by [`MemRegion::alloc`] or
    /// [`MemRegion::alloc_private`].
    ///
    /// # Safety
    /// The region must come from one of those, not be freed already, and no request may still
    /// use it.
    pub unsafe fn free(self) {
        // SAFETY: per the contract, addr/len/fd are the live mapping and fd (if any) from the
        // allocation.
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, self.len);
            if self.fd >= 0 {
                libc::close(self.fd);
            }
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

    #[test]
    fn private_regions_are_anonymous_private_and_shared_ones_memfd() {
        let p = MemRegion::alloc_private(8192).unwrap();
        assert_eq!(p.fd, -1);
        assert!((p.addr as usize).is_multiple_of(4096));
        // SAFETY: fresh region, no I/O.
        unsafe { p.as_mut_slice()[8191] = 9 };
        // SAFETY: as above.
        assert_eq!(unsafe { p.as_slice()[8191] }, 9);
        use snapblk_testsupport::mapping_of;
        assert_eq!(mapping_of(p.addr as usize), "rw-p ");
        let s = MemRegion::alloc(8192).unwrap();
        let m = mapping_of(s.addr as usize);
        assert!(m.starts_with("rw-s /memfd:libblkio-buf"), "{m}");
        // SAFETY: allocated above, unused.
        unsafe { p.free() };
        // SAFETY: as above.
        unsafe { s.free() };
        assert_eq!(MemRegion::alloc_private(0).unwrap_err().errno, libc::EINVAL);
    }
}
