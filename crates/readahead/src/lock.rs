//! Locking files' pages in memory (vmtouch's `-l` and `-L`): every file is mapped read-only and
//! shared, and its pages locked with mlock(2) — which reads in what is not resident — or, all
//! mappings at once, with mlockall(2). The pages stay resident, immune to eviction and
//! reclaim, until the [`Locked`] value is dropped (or the process ends).

use crate::walk::{self, LinkDedup, WalkError, WalkOptions};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Mutex;

/// Why locking could not be done at all (per-file failures are in [`Locked::errors`]).
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// mlockall(2) failed (e.g. over RLIMIT_MEMLOCK without CAP_IPC_LOCK).
    #[error("mlockall")]
    LockAll(#[source] std::io::Error),
}

/// One file mapping, unmapped (and so unlocked) on drop.
#[derive(Debug)]
struct Mapping {
    addr: usize,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `addr`/`len` are a mapping this value made with mmap and nobody else refers
        // to; after munmap it is never touched again.
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, self.len);
        }
    }
}

/// Files whose pages are locked in memory; dropping it unlocks them.
#[derive(Debug, Default)]
pub struct Locked {
    maps: Vec<Mapping>,
    /// Files locked (hard links counted once; empty files are not mapped and not counted).
    pub files: u64,
    /// Bytes locked (the files' sizes; the kernel locks whole pages).
    pub bytes: u64,
    /// Paths that could not be walked, opened, mapped or locked, with the error text.
    pub errors: Vec<WalkError>,
}

/// Map every regular file under `roots` and lock its pages: each with mlock(2) (vmtouch `-l`),
/// or with `all`, every mapping at once with mlockall(2) (vmtouch `-L`). A file that cannot be
/// locked (RLIMIT_MEMLOCK without CAP_IPC_LOCK) is an entry of [`Locked::errors`].
pub fn lock(roots: &[PathBuf], opts: &WalkOptions, all: bool) -> Result<Locked, LockError> {
    let dedup = LinkDedup::default();
    let out = Mutex::new(Locked::default());
    let fail = |p: &std::path::Path, e: String| {
        if let Ok(mut o) = out.lock() {
            o.errors.push(WalkError {
                path: p.to_path_buf(),
                error: e,
            });
        }
    };
    let walk_errors = walk::walk(roots, opts, |found| {
        let p = found.path();
        let f = match found.open_quiet() {
            Ok(f) => f,
            Err(e) => return fail(p, e.to_string()),
        };
        let m = match f.metadata() {
            Ok(m) => m,
            Err(e) => return fail(p, e.to_string()),
        };
        if !dedup.first_visit(&m) || m.len() == 0 {
            return;
        }
        let Ok(len) = usize::try_from(m.len()) else {
            return fail(p, "too large to map".into());
        };
        // SAFETY: a new read-only shared mapping of an open file; the kernel picks the address.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return fail(p, format!("mmap: {}", std::io::Error::last_os_error()));
        }
        let map = Mapping {
            addr: addr as usize,
            len,
        };
        // SAFETY: the range is exactly the mapping made above.
        if !all && unsafe { libc::mlock(addr, len) } != 0 {
            return fail(p, format!("mlock: {}", std::io::Error::last_os_error()));
        }
        if let Ok(mut o) = out.lock() {
            o.maps.push(map);
            o.files += 1;
            o.bytes += m.len();
        }
    });
    let mut out = out.into_inner().unwrap_or_default();
    out.errors.extend(walk_errors);
    // SAFETY: mlockall only changes how this process's mappings are paged.
    if all && !out.maps.is_empty() && unsafe { libc::mlockall(libc::MCL_CURRENT) } != 0 {
        return Err(LockError::LockAll(std::io::Error::last_os_error()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm_lck_kb() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmLck:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    }

    #[test]
    fn locked_pages_are_counted_in_vmlck_until_dropped() {
        let d = snapblk_testsupport::TempDir::new("lock-unit");
        std::fs::write(d.join("a"), vec![7u8; 64 << 10]).unwrap();
        std::fs::write(d.join("empty"), b"").unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/b"), vec![9u8; 10_000]).unwrap();
        let before = vm_lck_kb();
        let opts = WalkOptions {
            recursive: true,
            ..Default::default()
        };
        let l = lock(&[d.path().to_path_buf()], &opts, false).unwrap();
        assert!(l.errors.is_empty(), "{:?}", l.errors);
        assert_eq!((l.files, l.bytes), (2, (64 << 10) + 10_000));
        // 16 + 3 pages of 4 KiB (other threads of the test binary may lock nothing).
        assert_eq!(vm_lck_kb() - before, 64 + 12);
        drop(l);
        assert_eq!(vm_lck_kb(), before);
        let e = lock(&[d.join("missing")], &opts, false).unwrap();
        assert_eq!(e.errors.len(), 1);
    }
}
