//! Every `unsafe` of the vhost-user driver: the shared ring memory (a memfd mapped
//! `MAP_SHARED`, read and written with atomics because the backend process uses it at the same
//! time), `sendmsg` with `SCM_RIGHTS`, and `ppoll`.

use snapblk_core::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Memory shared with the backend: a memfd of `len` bytes mapped read-write and shared.
///
/// Accessors take byte offsets computed by the ring code from its own layout; an offset out of
/// bounds or misaligned is a bug in that code, so it panics rather than touch other memory.
#[derive(Debug)]
pub(crate) struct Shm {
    addr: *mut u8,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics.
unsafe impl Send for Shm {}
// SAFETY: as above.
unsafe impl Sync for Shm {}

impl Shm {
    /// A zeroed memfd mapping of `len` bytes (a multiple of the page size).
    pub(crate) fn new(name: &std::ffi::CStr, len: usize) -> Result<Shm> {
        // SAFETY: `name` is a valid C string; flags are a plain bitmask.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `fd` is our memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } < 0 {
            return Err(Error::last_os_error());
        }
        // SAFETY: mapping a fresh fd of `len` bytes; the result is checked below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(Error::last_os_error());
        }
        Ok(Shm {
            addr: addr.cast(),
            len,
            fd,
        })
    }
    /// The process address of the mapping (also its address for the backend: identity).
    pub(crate) fn addr(&self) -> u64 {
        self.addr as u64
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    fn at(&self, off: usize, size: usize) -> *mut u8 {
        assert!(
            off.checked_add(size).is_some_and(|e| e <= self.len) && off.is_multiple_of(size),
            "shared-memory access {off}+{size} outside {} bytes",
            self.len
        );
        // SAFETY: in bounds, checked above.
        unsafe { self.addr.add(off) }
    }
    pub(crate) fn load_u8(&self, off: usize) -> u8 {
        // SAFETY: in bounds (checked by `at`), live for `self`'s lifetime; atomics make the
        // backend's concurrent writes defined.
        unsafe { (*self.at(off, 1).cast::<AtomicU8>()).load(Ordering::Relaxed) }
    }
    pub(crate) fn store_u8(&self, off: usize, v: u8) {
        // SAFETY: as in `load_u8`.
        unsafe { (*self.at(off, 1).cast::<AtomicU8>()).store(v, Ordering::Relaxed) }
    }
    pub(crate) fn load_u16(&self, off: usize, o: Ordering) -> u16 {
        // SAFETY: as in `load_u8`; `at` checks the alignment.
        u16::from_le(unsafe { (*self.at(off, 2).cast::<AtomicU16>()).load(o) })
    }
    pub(crate) fn store_u16(&self, off: usize, v: u16, o: Ordering) {
        // SAFETY: as in `load_u16`.
        unsafe { (*self.at(off, 2).cast::<AtomicU16>()).store(v.to_le(), o) }
    }
    pub(crate) fn load_u32(&self, off: usize) -> u32 {
        // SAFETY: as in `load_u16`.
        u32::from_le(unsafe { (*self.at(off, 4).cast::<AtomicU32>()).load(Ordering::Relaxed) })
    }
    pub(crate) fn store_u32(&self, off: usize, v: u32) {
        // SAFETY: as in `load_u16`.
        unsafe { (*self.at(off, 4).cast::<AtomicU32>()).store(v.to_le(), Ordering::Relaxed) }
    }
    pub(crate) fn store_u64(&self, off: usize, v: u64) {
        // SAFETY: as in `load_u16`.
        unsafe { (*self.at(off, 8).cast::<AtomicU64>()).store(v.to_le(), Ordering::Relaxed) }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once; nothing in this process refers to it any more
        // (its queue is being dropped).
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// Send `bytes` on the connected unix socket `sock` with `fds` attached (`SCM_RIGHTS`).
pub(crate) fn send_with_fds(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is a valid "no name, no control" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` has a control buffer of `space` bytes, enough for one header carrying
        // `fds`; CMSG_FIRSTHDR/CMSG_DATA point inside it and the copy stays within it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), fd_bytes);
        }
    }
    let mut sent = 0;
    while sent < bytes.len() {
        let mut iov = libc::iovec {
            iov_base: bytes[sent..].as_ptr() as *mut libc::c_void,
            iov_len: bytes.len() - sent,
        };
        msg.msg_iov = &mut iov;
        // SAFETY: `msg` points at live buffers (`iov` over `bytes`, `cbuf`) for the call.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
        // The fds went with the first byte; the rest (rare) is plain data.
        msg.msg_control = std::ptr::null_mut();
        msg.msg_controllen = 0;
    }
    Ok(())
}

/// `ppoll` on `fds` (fd, events) for `timeout` (`None`: forever), with `sigmask` installed while
/// waiting. Returns the `revents` of each, or the error (EINTR included).
pub(crate) fn ppoll(
    fds: &[(RawFd, i16)],
    timeout: Option<Duration>,
    sigmask: Option<&libc::sigset_t>,
) -> Result<Vec<i16>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    // SAFETY: `p` is a live array of `p.len()` pollfds; the timespec and sigmask pointers are
    // null or point at live values for the call.
    let n = unsafe {
        libc::ppoll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            ts.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            sigmask.map_or(std::ptr::null(), |s| s as *const _),
        )
    };
    if n < 0 {
        return Err(Error::last_os_error());
    }
    Ok(p.iter().map(|x| x.revents).collect())
}

/// Reset the non-blocking eventfd `fd` (a queue's call fd) by reading its counter; nothing
/// happens if it was not signalled.
pub(crate) fn read_eventfd(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64; `fd` is an eventfd the queue owns.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// A duplicate (close-on-exec) of `fd`, kept by the reconnect code to send again later.
pub(crate) fn dup_fd(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: `fd` is open for the length of this call (a caller's memory-region fd, a ring
    // memfd or the control socket); the duplicate is a new descriptor owned by the result.
    let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    b.try_clone_to_owned()
}
