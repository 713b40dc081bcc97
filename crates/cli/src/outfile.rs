//! Output files that never destroy a user's data: an output is refused when it is the same
//! file as an input (compared by device and inode, so hard links, symlinks, `/proc/self/fd/N`
//! and bind mounts are caught), and it is written to an unnamed temporary file in the target's
//! directory (`O_TMPFILE`), synced, linked under a hidden unique name and renamed over the
//! target only when complete. An error, Ctrl-C or a crash leaves the previous file untouched;
//! only a crash in the instant between link and rename can leave a hidden `.NAME.snapblk-*`
//! file behind (never a partial file at the target's name).

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Identity of an existing file: a block device is the device it names (two device nodes of
/// one disk are the same disk), anything else its (device, inode).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Identity {
    Block(u64),
    File(u64, u64),
}

fn identity(p: &Path) -> Option<Identity> {
    let m = std::fs::metadata(p).ok()?;
    Some(if m.file_type().is_block_device() {
        Identity::Block(m.rdev())
    } else {
        Identity::File(m.dev(), m.ino())
    })
}

/// The storage under a block device that writing it writes: a loop device's backing file
/// (`/sys/dev/block/MAJ:MIN/loop/backing_file`) and a device-mapper or md device's members
/// (`slaves/`), followed down to files and plain disks.
fn below(id: Identity, depth: u32, out: &mut Vec<Identity>) {
    let Identity::Block(rdev) = id else {
        return;
    };
    if depth > 8 {
        return;
    }
    let sys = format!("/sys/dev/block/{}:{}", libc::major(rdev), libc::minor(rdev));
    if let Ok(name) = std::fs::read_to_string(format!("{sys}/loop/backing_file"))
        && let Some(b) = identity(Path::new(name.trim_end_matches('\n')))
    {
        out.push(b);
        below(b, depth + 1, out);
    }
    if let Ok(rd) = std::fs::read_dir(format!("{sys}/slaves")) {
        for e in rd.flatten() {
            let dev = std::fs::read_to_string(e.path().join("dev")).unwrap_or_default();
            let mut mm = dev.trim().split(':').map(|x| x.parse::<u32>());
            if let (Some(Ok(ma)), Some(Ok(mi))) = (mm.next(), mm.next()) {
                let b = Identity::Block(libc::makedev(ma, mi));
                out.push(b);
                below(b, depth + 1, out);
            }
        }
    }
}

/// A file or device and everything [`below`] it.
fn storage(id: Identity) -> Vec<Identity> {
    let mut v = vec![id];
    below(id, 0, &mut v);
    v
}

/// Refuse when `out` (named `out_flag` on the command line) is the same file as any input, or
/// shares storage with one through loop or device-mapper devices (in either direction, stacked
/// or side by side: two loop devices over one file).
pub fn refuse_alias(out_flag: &str, out: &Path, inputs: &[(&str, &Path)]) -> Result<()> {
    let Some(o) = identity(out) else {
        return Ok(());
    };
    let o_all = storage(o);
    for (flag, p) in inputs {
        let Some(i) = identity(p) else { continue };
        if i == o {
            bail!(
                "{out_flag} {} is the same file as {flag} {}; refusing to overwrite an input",
                out.display(),
                p.display()
            );
        }
        if storage(i).iter().any(|x| o_all.contains(x)) {
            bail!(
                "{out_flag} {} and {flag} {} are the same storage (a loop or device-mapper device and what is under it); refusing to overwrite an input",
                out.display(),
                p.display()
            );
        }
    }
    Ok(())
}

/// Whether `a` and `b` name the same existing file or directory (by device and inode).
pub fn same_file(a: &Path, b: &Path) -> bool {
    identity(a).is_some_and(|x| identity(b) == Some(x))
}

/// Refuse when two inputs that must differ are the same file.
pub fn refuse_same(a: (&str, &Path), b: (&str, &Path)) -> Result<()> {
    if let (Some(x), Some(y)) = (identity(a.1), identity(b.1))
        && x == y
    {
        bail!(
            "{} {} and {} {} are the same file",
            a.0,
            a.1.display(),
            b.0,
            b.1.display()
        );
    }
    Ok(())
}

/// A file being written that appears at its target name only on [`AtomicFile::commit`].
pub struct AtomicFile {
    file: File,
    target: PathBuf,
    /// The named temporary file when `O_TMPFILE` is not available (removed on drop).
    named: Option<PathBuf>,
    /// Mode to give the file: the replaced file's, or the default for a new one after the umask.
    mode: u32,
    /// Owner of the replaced file, given back when we may (as root).
    owner: Option<(u32, u32)>,
}

/// Follow `p` while it is a symlink (at most 40 links), so an output named by a link replaces the
/// file it points to, not the link.
fn resolve_links(p: &Path) -> Result<PathBuf> {
    let mut p = p.to_owned();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to =
                    std::fs::read_link(&p).with_context(|| format!("read link {}", p.display()))?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            _ => return Ok(p),
        }
    }
    bail!("{}: too many levels of symbolic links", p.display())
}

impl AtomicFile {
    /// Start writing `target`. Refuses targets that are not regular files (block devices,
    /// FIFOs, `/dev/stdout`): they cannot be replaced atomically.
    pub fn create(target: &Path) -> Result<AtomicFile> {
        let target = &resolve_links(target)?;
        let mut owner = None;
        let mode = match std::fs::metadata(target) {
            Ok(m) if m.is_dir() => bail!("{} is a directory", target.display()),
            Ok(m) if !m.is_file() => {
                bail!(
                    "{} is {}; outputs are written to a new file and renamed into place, write to a regular file instead",
                    target.display(),
                    special_kind(&m)
                );
            }
            Ok(m) => {
                owner = Some((m.uid(), m.gid()));
                m.permissions().mode() & 0o7777
            }
            Err(_) => 0o666 & !umask(),
        };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        // Naming an O_TMPFILE file goes through /proc/self/fd; without /proc (a chroot, a
        // minimal container) use a named temporary file from the start.
        let tmp = if Path::new("/proc/self/fd").is_dir() {
            OpenOptions::new()
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_TMPFILE)
                .open(&dir)
        } else {
            Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
        };
        let (file, named) = match tmp {
            Ok(f) => (f, None),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                ) =>
            {
                let p = hidden_name(target);
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&p)
                    .with_context(|| format!("create {}", p.display()))?;
                (f, Some(p))
            }
            Err(e) => {
                return Err(e).with_context(|| format!("create a file in {}", dir.display()));
            }
        };
        Ok(AtomicFile {
            file,
            target: target.to_owned(),
            named,
            mode,
            owner,
        })
    }

    /// The file being written.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Sync the data, give it the target's mode, and put it in place of the target.
    pub fn commit(mut self) -> Result<()> {
        let t = self.target.display().to_string();
        if let Some((uid, gid)) = self.owner {
            // Only root may give a file away; anyone else keeps owning the new file.
            let _ = std::os::unix::fs::fchown(&self.file, Some(uid), Some(gid));
        }
        self.file
            .set_permissions(std::fs::Permissions::from_mode(self.mode))
            .with_context(|| format!("set the mode of {t}"))?;
        self.file.sync_all().with_context(|| format!("sync {t}"))?;
        let tmp = match self.named.take() {
            Some(p) => p,
            None => {
                let p = hidden_name(&self.target);
                link_tmpfile(&self.file, &p).with_context(|| format!("create {t}"))?;
                p
            }
        };
        if let Err(e) = std::fs::rename(&tmp, &self.target) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("rename into {t}"));
        }
        let dir = match self.target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("sync directory {}", dir.display()))?;
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(p) = self.named.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What a file that is neither a regular file nor a directory is, for messages.
fn special_kind(m: &std::fs::Metadata) -> &'static str {
    let ft = m.file_type();
    if ft.is_block_device() {
        "a block device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else {
        "not a regular file"
    }
}

/// Refuse an output a new file cannot replace (a device, a FIFO) unless the command was told
/// to write it in place with `flag`.
pub fn refuse_special(out: &Path, flag: &str) -> Result<()> {
    if let Ok(m) = std::fs::metadata(out)
        && !m.is_file()
        && !m.is_dir()
    {
        bail!(
            "{} is {}; outputs are replaced atomically, give {flag} to write it in place",
            out.display(),
            special_kind(&m)
        );
    }
    Ok(())
}

/// An existing output written in place (`--in-place`), for targets a new file cannot
/// replace: a block device (opened exclusively, so a mounted one is refused, and at least as
/// large as the image), a regular file (cut to the image's size once complete) or a stream (a
/// FIFO, a terminal, `/dev/stdout`). Nothing is truncated when it is opened.
pub struct InPlace {
    file: File,
    target: PathBuf,
    regular: bool,
    stream: bool,
}

impl InPlace {
    /// Open `target` for writing an image of `len` bytes.
    pub fn open(target: &Path, len: u64) -> Result<InPlace> {
        let t = target.display();
        let m = std::fs::metadata(target).with_context(|| {
            format!(
                "{t}: --in-place writes an existing file or device (leave it out to create one)"
            )
        })?;
        if m.is_dir() {
            bail!("{t} is a directory");
        }
        let s = target.to_string_lossy();
        if m.is_file()
            && (s.starts_with("/dev/std") || s.starts_with("/dev/fd/") || s.starts_with("/proc/"))
        {
            // A shell redirection (`>> log`): reopening it loses O_APPEND and the offset.
            bail!(
                "{t} is a regular file reached through a file descriptor; give its path, or pipe the output"
            );
        }
        let ft = m.file_type();
        let block = ft.is_block_device();
        let mut o = OpenOptions::new();
        o.write(true);
        if block {
            o.custom_flags(libc::O_EXCL);
        }
        let file = o.open(target).map_err(|e| {
            let in_use = block && e.raw_os_error() == Some(libc::EBUSY);
            anyhow::Error::new(e).context(if in_use {
                format!("{t} is in use (mounted or held open exclusively)")
            } else {
                format!("open {t}")
            })
        })?;
        if block {
            let size = snapblk_core::sys::blkgetsize64(file.as_raw_fd())
                .with_context(|| format!("size of {t}"))?;
            if size < len {
                bail!("{t} holds {size} bytes, too small for the new image of {len} bytes");
            }
        }
        Ok(InPlace {
            file,
            target: target.to_owned(),
            regular: m.is_file(),
            stream: !block && !m.is_file(),
        })
    }

    /// The file being written, from offset 0.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Reserve the space a regular file needs for `len` bytes before anything is written, so
    /// a full file system or quota fails the command here, with the file as it was, instead of
    /// half-way through overwriting it. A file system without `fallocate` is written as before.
    pub fn reserve(&self, len: u64) -> Result<()> {
        if !self.regular || len == 0 {
            return Ok(());
        }
        let Ok(n) = libc::off_t::try_from(len) else {
            bail!("{}: {len} bytes is too large", self.target.display());
        };
        // SAFETY: fallocate reads only its integer arguments; the descriptor is owned by
        // `self.file` and open for writing. KEEP_SIZE leaves the file's size and data as they
        // are.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, n) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                return Ok(());
            }
            return Err(anyhow::Error::new(e).context(format!(
                "reserving {} for {} before writing it in place (nothing was written)",
                crate::human::bytes_exact(len),
                self.target.display()
            )));
        }
        Ok(())
    }

    /// Cut a regular file to `len` bytes and sync what was written (a stream has nothing to
    /// sync).
    pub fn finish(self, len: u64) -> Result<()> {
        let t = self.target.display();
        if self.regular {
            self.file
                .set_len(len)
                .with_context(|| format!("set the size of {t}"))?;
        }
        if !self.stream {
            self.file.sync_all().with_context(|| format!("sync {t}"))?;
        }
        Ok(())
    }
}

fn umask() -> u32 {
    // SAFETY: umask only swaps the process's file mode mask; setting it back at once leaves it
    // as it was (the CLI creates no files from other threads at this point).
    unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    }
}

/// `.NAME.snapblk-PID-N` beside `target`.
fn hidden_name(target: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let hidden = format!(
        ".{name}.snapblk-{}-{}-{nanos:x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    target.with_file_name(hidden)
}

/// Give an `O_TMPFILE` file the name `p`.
fn link_tmpfile(f: &File, p: &Path) -> std::io::Result<()> {
    let src = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd()))?;
    let dst = CString::new(p.as_os_str().as_bytes())?;
    // SAFETY: both pointers are valid NUL-terminated strings that outlive the call; linkat only
    // reads them.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            src.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn commit_replaces_and_keeps_mode() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("out.img");
        std::fs::write(&t, b"old").unwrap();
        std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o640)).unwrap();
        let a = AtomicFile::create(&t).unwrap();
        a.file().write_all(b"new contents").unwrap();
        assert_eq!(std::fs::read(&t).unwrap(), b"old", "visible before commit");
        a.commit().unwrap();
        assert_eq!(std::fs::read(&t).unwrap(), b"new contents");
        let m = std::fs::metadata(&t).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, 0o640);
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            1,
            "no temp left"
        );
    }

    #[test]
    fn commit_keeps_a_mode_the_umask_would_change() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("out.img");
        std::fs::write(&t, b"old").unwrap();
        std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o666)).unwrap();
        let a = AtomicFile::create(&t).unwrap();
        a.commit().unwrap();
        let m = std::fs::metadata(&t).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, 0o666);
    }

    #[test]
    fn a_symlinked_output_replaces_the_file_it_points_to() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("real")).unwrap();
        let real = d.path().join("real/target.img");
        std::fs::write(&real, b"old").unwrap();
        let link = d.path().join("link.img");
        std::os::unix::fs::symlink("real/target.img", &link).unwrap();
        let a = AtomicFile::create(&link).unwrap();
        a.file().write_all(b"new").unwrap();
        a.commit().unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
    }

    #[test]
    fn drop_without_commit_leaves_old_file_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("out.img");
        std::fs::write(&t, b"old").unwrap();
        {
            let a = AtomicFile::create(&t).unwrap();
            a.file().write_all(b"partial").unwrap();
        }
        assert_eq!(std::fs::read(&t).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn alias_by_hard_link_and_symlink_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        std::fs::write(&a, b"x").unwrap();
        let h = d.path().join("h");
        std::fs::hard_link(&a, &h).unwrap();
        let s = d.path().join("s");
        std::os::unix::fs::symlink(&a, &s).unwrap();
        assert!(refuse_alias("-o", &h, &[("--old", &a)]).is_err());
        assert!(refuse_alias("-o", &s, &[("--old", &a)]).is_err());
        assert!(refuse_alias("-o", &d.path().join("new"), &[("--old", &a)]).is_ok());
    }

    #[test]
    fn same_file_compares_directories_by_inode() {
        let d = tempfile::tempdir().unwrap();
        let x = d.path().join("x");
        std::fs::create_dir(&x).unwrap();
        std::fs::create_dir(d.path().join("y")).unwrap();
        let l = d.path().join("l");
        std::os::unix::fs::symlink(&x, &l).unwrap();
        assert!(same_file(&x, &l));
        assert!(same_file(&x, &x.join(".")));
        assert!(!same_file(&x, &d.path().join("y")));
        assert!(!same_file(&x, &d.path().join("missing")));
        assert!(!same_file(
            &d.path().join("missing"),
            &d.path().join("missing")
        ));
    }
}
