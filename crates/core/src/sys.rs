//! The few raw system interfaces more than one crate needs, written once: a block device's
//! size (`BLKGETSIZE64`), the page size, and the eventfd that is a queue's completion fd.

use crate::{Error, Result};
use std::os::fd::RawFd;

/// `BLKGETSIZE64`, `_IOR(0x12, 114, size_t)`: a block device's size in bytes (libc does not
/// export it).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// The size in bytes of the block device open as `fd` (`BLKGETSIZE64`); an error for anything
/// else (ENOTTY for a regular file).
pub fn blkgetsize64(fd: RawFd) -> Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer we pass, which is valid.
    if unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &mut size as *mut u64) } < 0 {
        return Err(Error::last_os_error());
    }
    Ok(size)
}

/// The system page size (4096 if `sysconf` cannot tell), read once.
pub fn page_size() -> usize {
    use std::sync::OnceLock;
    static PS: OnceLock<usize> = OnceLock::new();
    *PS.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 { p as usize } else { 4096 }
    })
}

/// A non-blocking, close-on-exec eventfd: the completion fd of a queue.
#[derive(Debug)]
pub struct EventFd(std::os::fd::OwnedFd);

impl EventFd {
    /// A new eventfd with counter 0.
    pub fn new() -> Result<EventFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(EventFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }
    /// A second descriptor of the same eventfd (signalling either signals both), e.g. for a
    /// completion callback that must outlive nothing but its own copy.
    pub fn try_clone(&self) -> Result<EventFd> {
        self.0.try_clone().map(EventFd).map_err(Error::from_io)
    }
    /// The raw descriptor.
    pub fn raw(&self) -> RawFd {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }
    /// Add 1 to the counter (makes the fd readable).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A full counter (EAGAIN)
        // still leaves the fd readable, which is all a signal has to achieve.
        unsafe { libc::write(self.raw(), (&one as *const u64).cast(), 8) };
    }
    /// Reset the counter to 0; returns the value read (0 if it was not signalled).
    pub fn drain(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        let n = unsafe { libc::read(self.raw(), (&mut v as *mut u64).cast(), 8) };
        if n == 8 { v } else { 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn page_size_is_a_power_of_two() {
        let p = page_size();
        assert!(p >= 4096 && p.is_power_of_two(), "{p}");
    }

    #[test]
    fn blkgetsize64_refuses_a_regular_file() {
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        assert_eq!(blkgetsize64(f.as_raw_fd()).unwrap_err().errno, libc::ENOTTY);
    }

    #[test]
    fn eventfd_counts_signals_until_drained() {
        let e = EventFd::new().unwrap();
        assert_eq!(e.drain(), 0);
        e.signal();
        e.signal();
        assert_eq!(e.drain(), 2);
        assert_eq!(e.drain(), 0);
    }
}
