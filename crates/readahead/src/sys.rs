//! Thin wrappers over the Linux system calls this crate needs. All `unsafe` of the crate lives
//! here; every wrapper takes a borrowed fd so it cannot outlive the file it refers to.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// cachestat(2) is number 451 on every architecture with the unified syscall table (>= 6.5).
const SYS_CACHESTAT: libc::c_long = 451;

/// Page counts returned by cachestat(2) for a byte range of a file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStat {
    /// Pages of the range in the page cache (`nr_cache`).
    pub cache: u64,
    /// Cached pages that are dirty (`nr_dirty`).
    pub dirty: u64,
    /// Cached pages under writeback (`nr_writeback`).
    pub writeback: u64,
    /// Pages evicted from the range whose shadow entries remain (`nr_evicted`).
    pub evicted: u64,
    /// Of those, pages evicted recently enough to count as refaults if read again
    /// (`nr_recently_evicted`).
    pub recently_evicted: u64,
}

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct CachestatOut {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// cachestat(2) on `[off, off+len)`; `len == 0` means "to end of file".
pub fn cachestat(fd: BorrowedFd<'_>, off: u64, len: u64) -> io::Result<CacheStat> {
    let range = CachestatRange { off, len };
    let mut out = CachestatOut::default();
    // SAFETY: both pointers refer to live, correctly laid out #[repr(C)] structs that the kernel
    // reads (range) and writes (out) only for the duration of the call; flags must be 0.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd(),
            &range as *const CachestatRange,
            &mut out as *mut CachestatOut,
            0u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(CacheStat {
        cache: out.nr_cache,
        dirty: out.nr_dirty,
        writeback: out.nr_writeback,
        evicted: out.nr_evicted,
        recently_evicted: out.nr_recently_evicted,
    })
}

/// System page size (cached).
pub(crate) fn page_size() -> u64 {
    use std::sync::OnceLock;
    static PS: OnceLock<u64> = OnceLock::new();
    *PS.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if v > 0 { v as u64 } else { 4096 }
    })
}

/// A read-only mapping of whole pages of a file, unmapped when dropped (so no error path can
/// leak it). Only used to ask the kernel about the file's pages (mincore, madvise), never to
/// hand out references into the file.
struct Mapping {
    addr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    /// Maps `pages` pages from page `first`. `flags` is `MAP_SHARED` or `MAP_PRIVATE`.
    fn new(fd: BorrowedFd<'_>, first: u64, pages: u64, flags: libc::c_int) -> io::Result<Self> {
        let ps = page_size();
        let len = (pages * ps) as usize;
        // SAFETY: a fresh read-only mapping placed by the kernel (addr NULL), so it cannot
        // overlap memory Rust owns; Drop unmaps it.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                flags,
                fd.as_raw_fd(),
                (first * ps) as libc::off_t,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { addr, len })
    }

    /// mincore over the whole mapping: one byte per page into `vec`.
    fn mincore(&self, vec: &mut [u8]) -> io::Result<()> {
        assert!(vec.len() as u64 >= (self.len as u64).div_ceil(page_size()));
        // SAFETY: addr/len describe this mapping; vec holds a byte per page (asserted above).
        let r = unsafe { libc::mincore(self.addr, self.len, vec.as_mut_ptr()) };
        if r != 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Faults in every page by reading its first byte. The caller must have mapped only pages
    /// inside the file: touching a page wholly past EOF raises SIGBUS.
    fn touch_pages(&self) {
        let ps = page_size() as usize;
        for off in (0..self.len).step_by(ps) {
            // SAFETY: off < len, so the byte lies inside this readable mapping; the file's
            // size was checked by the caller (a file truncated meanwhile would raise SIGBUS,
            // as for any mapping).
            unsafe { std::ptr::read_volatile((self.addr as *const u8).add(off)) };
        }
    }

    fn madvise(&self, advice: libc::c_int) -> io::Result<()> {
        // SAFETY: addr/len describe this mapping; madvise only changes its pages' fate.
        let r = unsafe { libc::madvise(self.addr, self.len, advice) };
        if r != 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the region mapped in `new`, once.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// Calls `f(page_index, resident)` for every page touching `[off, off+len)` using mmap +
/// mincore, in bounded windows so a huge file never needs a huge vector. mincore (unlike
/// cachestat) only reports pages that are up to date, so pages still being read count as
/// absent. Only meaningful when the caller may trust mincore for this file (see `residency`).
fn mincore_range(
    fd: BorrowedFd<'_>,
    off: u64,
    len: u64,
    mut f: impl FnMut(u64, bool),
) -> io::Result<()> {
    const WINDOW_PAGES: u64 = 1 << 16; // 256 MiB of file per mapping, 64 KiB of vector
    let ps = page_size();
    let first = off / ps;
    let last = off.saturating_add(len).div_ceil(ps);
    let mut vec = vec![0u8; WINDOW_PAGES.min(last.saturating_sub(first)).max(1) as usize];
    let mut page = first;
    while page < last {
        let n = (last - page).min(WINDOW_PAGES);
        Mapping::new(fd, page, n, libc::MAP_SHARED)?.mincore(&mut vec)?;
        for (i, b) in vec.iter().take(n as usize).enumerate() {
            f(page + i as u64, b & 1 != 0);
        }
        page += n;
    }
    Ok(())
}

/// Calls `f(page_index, resident)` for every page of `[0, size)`, from mincore: pages still
/// being read count as absent; only meaningful where mincore can be trusted for the file (see
/// `residency`).
pub(crate) fn mincore_pages(
    fd: BorrowedFd<'_>,
    size: u64,
    f: impl FnMut(u64, bool),
) -> io::Result<()> {
    mincore_range(fd, 0, size, f)
}

/// Number of pages touching `[off, off+len)` that mincore reports resident (up to date; pages
/// still being read are not counted).
pub(crate) fn mincore_count(fd: BorrowedFd<'_>, off: u64, len: u64) -> io::Result<u64> {
    let mut n = 0;
    mincore_range(fd, off, len, |_, resident| n += u64::from(resident))?;
    Ok(n)
}

/// Reclaims the pages of `[off, off+len)` the way memory pressure does (MADV_PAGEOUT): each
/// page is faulted in through a private read-only mapping (read first if it is absent), then
/// handed to reclaim, which leaves a shadow entry that cachestat counts as evicted. It lets
/// tests reproduce "read, then reclaimed" exactly; pages mapped elsewhere may stay. The range
/// is clipped to the file's size.
pub fn pageout(fd: BorrowedFd<'_>, off: u64, len: u64) -> io::Result<()> {
    let ps = page_size();
    let first = off / ps;
    // Clipped to the file: touching a page wholly past EOF would raise SIGBUS.
    let size = std::fs::File::from(fd.try_clone_to_owned()?)
        .metadata()?
        .len();
    let last = off.saturating_add(len).min(size).div_ceil(ps);
    if last <= first {
        return Ok(());
    }
    let map = Mapping::new(fd, first, last - first, libc::MAP_PRIVATE)?;
    map.touch_pages();
    map.madvise(libc::MADV_PAGEOUT)
}

/// Soft RLIMIT_NOFILE (open files), `None` if unlimited or unknown.
pub(crate) fn nofile_limit() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid, writable struct rlimit for the duration of the call.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) };
    (r == 0 && rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur)
}

/// readahead(2): queue asynchronous reads of `[off, off+len)` into the page cache.
pub(crate) fn readahead(fd: BorrowedFd<'_>, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: no pointers; the fd is valid for the call.
    let r = unsafe { libc::readahead(fd.as_raw_fd(), off as libc::off64_t, len as usize) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// posix_fadvise(2) with the given advice.
pub fn fadvise(fd: BorrowedFd<'_>, off: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: no pointers; the fd is valid for the call.
    let r = unsafe {
        libc::posix_fadvise(
            fd.as_raw_fd(),
            off as libc::off_t,
            len as libc::off_t,
            advice,
        )
    };
    if r != 0 {
        Err(io::Error::from_raw_os_error(r))
    } else {
        Ok(())
    }
}

/// fdatasync(2).
pub(crate) fn fdatasync(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: no pointers; the fd is valid for the call.
    if unsafe { libc::fdatasync(fd.as_raw_fd()) } != 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether the effective user may write `path` (faccessat with AT_EACCESS).
pub(crate) fn may_write(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: c is a valid NUL-terminated string living across the call.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) == 0 }
}

/// Mount tracefs at `dir` (`mount -t tracefs nodev DIR`). Needs CAP_SYS_ADMIN.
pub(crate) fn mount_tracefs(dir: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let target = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call; tracefs
    // takes no mount data (NULL).
    let r = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Effective user id of this process.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and has no preconditions.
    unsafe { libc::geteuid() }
}

/// I/O priority classes for ioprio_set(2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPrio {
    /// Real-time class (`IOPRIO_CLASS_RT`) with level 0 (highest) ..= 7; needs CAP_SYS_ADMIN.
    RealTime(u8),
    /// Best-effort class (`IOPRIO_CLASS_BE`, the default) with level 0 (highest) ..= 7.
    BestEffort(u8),
    /// Idle class (`IOPRIO_CLASS_IDLE`): served only when no other I/O wants the device.
    Idle,
}

impl IoPrio {
    /// The ioprio_set(2)/ioprio_get(2) encoding: class << 13 | level.
    pub fn raw(self) -> libc::c_int {
        const SHIFT: libc::c_int = 13;
        match self {
            IoPrio::RealTime(l) => (1 << SHIFT) | (l.min(7) as libc::c_int),
            IoPrio::BestEffort(l) => (2 << SHIFT) | (l.min(7) as libc::c_int),
            IoPrio::Idle => 3 << SHIFT,
        }
    }
}

/// ioprio_set(IOPRIO_WHO_PROCESS, 0, prio): applies to the calling thread; threads created
/// afterwards inherit it.
pub(crate) fn set_ioprio(p: IoPrio) -> io::Result<()> {
    const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    // SAFETY: no pointers.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, p.raw()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// ioprio_get(IOPRIO_WHO_PROCESS, 0): the calling thread's raw I/O priority (see
/// [`IoPrio::raw`]).
#[cfg(test)]
pub(crate) fn get_ioprio() -> io::Result<libc::c_int> {
    const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    // SAFETY: no pointers.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as libc::c_int)
    }
}

/// getpriority(PRIO_PROCESS, 0): the calling thread's nice value on Linux.
#[cfg(test)]
pub(crate) fn get_nice() -> io::Result<i32> {
    // -1 is a valid nice value, so errors are told apart by errno.
    // SAFETY: __errno_location returns this thread's errno; getpriority has no pointers.
    let r = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    let err = io::Error::last_os_error();
    if r == -1 && err.raw_os_error().is_some_and(|e| e != 0) {
        Err(err)
    } else {
        Ok(r)
    }
}

/// setpriority(PRIO_PROCESS, 0, nice): on Linux this is the calling thread; new threads inherit.
pub(crate) fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: no pointers.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if r != 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// statfs f_type of the filesystem holding the fd.
pub(crate) fn fs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: st points to writable storage large enough for struct statfs.
    let r = unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatfs succeeded, so the struct is initialised.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast)] // f_type is not i64 on every architecture
    Ok(st.f_type as i64)
}

/// The calling thread's kernel thread id.
pub(crate) fn gettid() -> i32 {
    // SAFETY: gettid cannot fail and has no preconditions.
    unsafe { libc::gettid() }
}

/// CPU time, in nanoseconds, of thread `tid` of this process, exact up to now (unlike the
/// scheduler statistics in /proc, which lag a running thread by up to a tick). `None` once the
/// thread is gone — which can be a moment after `join` returns: the joiner is woken when the
/// thread releases its memory, before the kernel removes the task.
pub(crate) fn thread_cpu_ns(tid: i32) -> Option<u64> {
    // The kernel's per-thread CPU clock id: !tid << 3 | CPUCLOCK_PERTHREAD (4) | CPUCLOCK_SCHED
    // (2), as glibc's pthread_getcpuclockid builds it. The kernel refuses (EINVAL) ids of
    // threads outside the caller's thread group.
    let id = ((!tid) << 3) | 4 | 2;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let r = unsafe { libc::clock_gettime(id as libc::clockid_t, &mut ts) };
    (r == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// overlayfs (`OVERLAYFS_SUPER_MAGIC`).
pub(crate) const OVERLAYFS_MAGIC: u64 = 0x794c_7630;

/// Whether cachestat(2) tells the truth about this open file. Not on overlayfs: its pages are
/// cached in the underlying file's inode, and cachestat on the overlay's file counts the
/// overlay inode's own (empty) cache, a false 0 %; mincore through a mapping, which maps the
/// underlying file, sees them. Callers treat `false` as cachestat being unsupported.
pub(crate) fn cachestat_truthful(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: the fd is valid for the call; `st` is as `f_type` promises.
    let magic = f_type(|st| unsafe { libc::fstatfs(fd.as_raw_fd(), st) });
    magic.map_or(true, |m| m != OVERLAYFS_MAGIC)
}

/// The file system type (`f_type`, a `*_SUPER_MAGIC`) that `path` lives on, from statfs(2).
pub(crate) fn fs_magic(path: &std::path::Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))?;
    // SAFETY: c is a NUL-terminated path; `st` is as `f_type` promises.
    f_type(|st| unsafe { libc::statfs(c.as_ptr(), st) })
}

/// `f_type` from a statfs-family call, which is given writable storage for one struct statfs
/// and must return 0 only after filling it (as statfs and fstatfs do).
fn f_type(call: impl FnOnce(*mut libc::statfs) -> libc::c_int) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    if call(st.as_mut_ptr()) != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call returned 0, so it filled st.
    Ok(unsafe { st.assume_init() }.f_type as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn cachestat_and_mincore_agree_on_fresh_file() {
        let dir = crate::test_support::disk_dir();
        let p = dir.join(format!("snapblk-ra-sys-{}", std::process::id()));
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&vec![7u8; 3 * page_size() as usize]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let cs = cachestat(f.as_fd(), 0, 0).unwrap();
        let mut n = 0;
        mincore_pages(f.as_fd(), 3 * page_size(), |_, r| n += r as u64).unwrap();
        assert_eq!(cs.cache, 3);
        assert_eq!(n, 3);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn thread_cpu_clock_of_this_and_other_threads() {
        let me = gettid();
        let a = thread_cpu_ns(me).unwrap();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(thread_cpu_ns(me).unwrap() > a, "{x}");
        let other = std::thread::spawn(gettid).join().unwrap();
        // Gone within moments of the join (a CI run once saw it still there right after).
        let t0 = std::time::Instant::now();
        while thread_cpu_ns(other).is_some() && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(thread_cpu_ns(other), None, "an exited thread has no clock");
        assert_eq!(thread_cpu_ns(1), None, "init is not one of our threads");
    }

    #[test]
    fn ioprio_raw_values() {
        assert_eq!(IoPrio::Idle.raw(), 3 << 13);
        assert_eq!(IoPrio::BestEffort(4).raw(), (2 << 13) | 4);
        assert_eq!(IoPrio::RealTime(9).raw(), (1 << 13) | 7);
    }
}
