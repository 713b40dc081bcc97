//! Positional I/O: the `ReadAt`/`WriteAt` family (see the crate documentation), its error
//! conversion and its implementations for files, byte slices, [`MemFile`] and smart pointers.

use crate::error::Error;
use crate::sync::into_inner;
use crate::sync::lock;
use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex};

/// Positional reads (`pread`-style) of a source of known size, shared between threads by `&self`.
pub trait ReadAt {
    /// Read up to `buf.len()` bytes at `offset`; returns the count, which may be short, and is 0
    /// at or past the end.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// The size of the source in bytes.
    fn size(&self) -> io::Result<u64>;

    /// Fill `buf` completely from `offset`, retrying short reads and `EINTR`; a source that ends
    /// first fails with [`io::ErrorKind::UnexpectedEof`]. Sources whose natural operation is an
    /// exact read (a device queue) override it.
    fn read_exact_at(&self, mut offset: u64, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(offset, buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The file whose bytes these are, read one-to-one (`read_at(o)` is `pread` of it at `o`),
    /// for fast paths that need a descriptor. `None` (the default) for sources without one.
    fn as_file(&self) -> Option<&File> {
        None
    }
}

/// Positional writes (`pwrite`-style) and durability, shared between threads by `&self`.
pub trait WriteAt {
    /// Write all of `buf` at `offset`, extending the target if it can grow.
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Make every completed write durable (`fdatasync` for files; nothing in memory).
    fn sync_data(&self) -> io::Result<()>;
}

/// The [`Error`] for a failed exact read at `offset`: a short read (an
/// [`UnexpectedEof`](io::ErrorKind::UnexpectedEof) of [`ReadAt::read_exact_at`]) is EIO "short
/// read at offset N"; any other error is [`Error::from_io`] (its errno, or EIO).
#[cold]
pub fn read_error(offset: u64, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::UnexpectedEof && e.get_ref().is_none() {
        Error::new(libc::EIO, format!("short read at offset {offset}"))
    } else {
        Error::from_io(e)
    }
}

impl ReadAt for File {
    #[inline]
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        use std::os::unix::fs::FileTypeExt;
        let m = self.metadata()?;
        if m.file_type().is_block_device() {
            // A block device reports size 0 in its metadata; ask the kernel.
            use std::os::fd::AsRawFd;
            return Ok(crate::sys::blkgetsize64(self.as_raw_fd())?);
        }
        Ok(m.len())
    }
    #[inline]
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
    #[inline]
    fn as_file(&self) -> Option<&File> {
        Some(self)
    }
}

impl WriteAt for File {
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let Some(rest) = usize::try_from(offset).ok().and_then(|o| self.get(o..)) else {
            return Ok(0);
        };
        let n = buf.len().min(rest.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.as_slice().read_at(offset, buf)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }
}

/// Forwards every method of the family, the descriptor capability included, to the pointee.
macro_rules! forward {
    ($($ptr:ty),*) => {$(
        impl<T: ReadAt + ?Sized> ReadAt for $ptr {
            #[inline]
            fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
                (**self).read_at(offset, buf)
            }
            fn size(&self) -> io::Result<u64> {
                (**self).size()
            }
            #[inline]
            fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
                (**self).read_exact_at(offset, buf)
            }
            #[inline]
            fn as_file(&self) -> Option<&File> {
                (**self).as_file()
            }
        }

        impl<T: WriteAt + ?Sized> WriteAt for $ptr {
            #[inline]
            fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
                (**self).write_all_at(offset, buf)
            }
            fn sync_data(&self) -> io::Result<()> {
                (**self).sync_data()
            }
        }
    )*};
}

forward!(&T, Arc<T>, Box<T>);

/// An in-memory, growable image with no file descriptor, usable with both traits (tests, images
/// built in memory, fuzzing). Writes past the end extend it with zeros.
#[derive(Debug, Default)]
pub struct MemFile(pub Mutex<Vec<u8>>);

impl MemFile {
    /// Wrap existing bytes.
    pub fn new(data: Vec<u8>) -> Self {
        MemFile(Mutex::new(data))
    }
    /// Take the bytes back.
    pub fn into_inner(self) -> Vec<u8> {
        into_inner(self.0)
    }
    /// A copy of the bytes now.
    pub fn contents(&self) -> Vec<u8> {
        lock(&self.0).clone()
    }
}

impl ReadAt for MemFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        lock(&self.0).as_slice().read_at(offset, buf)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(lock(&self.0).len() as u64)
    }
}

impl WriteAt for MemFile {
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut v = lock(&self.0);
        let end = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(buf.len()))
            .ok_or_else(|| io::Error::other("offset overflow"))?;
        if v.len() < end {
            v.resize(end, 0);
        }
        v[end - buf.len()..end].copy_from_slice(buf);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A source that hands out at most `step` bytes per read and fails with `EINTR` first.
    struct Trickle {
        data: Vec<u8>,
        step: usize,
        interrupted: std::sync::atomic::AtomicBool,
    }

    impl ReadAt for Trickle {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
            if !self
                .interrupted
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                return Err(io::Error::from_raw_os_error(libc::EINTR));
            }
            let n = buf.len().min(self.step);
            self.data.read_at(offset, &mut buf[..n])
        }
        fn size(&self) -> io::Result<u64> {
            Ok(self.data.len() as u64)
        }
    }

    fn temp_file(bytes: &[u8]) -> File {
        let mut f = tempfile().expect("temporary file");
        f.write_all(bytes).expect("write temporary file");
        f
    }

    /// An unlinked file in the temporary directory.
    fn tempfile() -> io::Result<File> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("snapblk-core-at-{}-{n}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        std::fs::remove_file(&path)?;
        Ok(f)
    }

    #[test]
    fn partial_reads_stop_at_the_end() {
        let data: Vec<u8> = (0..10).collect();
        let mut buf = [0u8; 4];
        assert_eq!(data.read_at(8, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], &[8, 9]);
        assert_eq!(data.read_at(10, &mut buf).unwrap(), 0);
        assert_eq!(data.read_at(u64::MAX, &mut buf).unwrap(), 0);
        assert_eq!(data.as_slice().size().unwrap(), 10);
    }

    #[test]
    fn exact_read_retries_short_reads_and_eintr_and_fails_at_eof() {
        let t = Trickle {
            data: (0..100).collect(),
            step: 3,
            interrupted: Default::default(),
        };
        let mut buf = [0u8; 10];
        t.read_exact_at(90, &mut buf).unwrap();
        assert_eq!(buf.to_vec(), (90..100).collect::<Vec<u8>>());
        let e = t.read_exact_at(95, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let c = read_error(95, e);
        assert_eq!((c.errno, &*c.msg), (libc::EIO, "short read at offset 95"));
        // A file ends the same way, and an empty read of nothing succeeds anywhere.
        let f = temp_file(b"0123456789");
        let e = f.read_exact_at(8, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(read_error(8, e).msg, "short read at offset 8");
        f.read_exact_at(1 << 40, &mut []).unwrap();
    }

    #[test]
    fn read_error_keeps_an_errno_and_an_errors_message() {
        let os = read_error(0, io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(os.errno, libc::EIO);
        let inner = Error::new(libc::ENODEV, "no such fault disk");
        assert_eq!(read_error(0, inner.clone().into()), inner);
    }

    #[test]
    fn mem_file_grows_on_write_and_reads_back() {
        let m = MemFile::default();
        m.write_all_at(4, b"abc").unwrap();
        assert_eq!(m.size().unwrap(), 7);
        assert_eq!(m.contents(), b"\0\0\0\0abc");
        let mut buf = [0u8; 8];
        assert_eq!(m.read_at(5, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"bc");
        m.write_all_at(0, b"xy").unwrap();
        m.sync_data().unwrap();
        assert_eq!(m.into_inner(), b"xy\0\0abc");
        let e = MemFile::default().write_all_at(u64::MAX, b"a").unwrap_err();
        assert_eq!(e.to_string(), "offset overflow");
    }

    #[test]
    fn pointers_forward_every_method() {
        fn check<R: ReadAt + WriteAt>(r: R, fd: bool) {
            r.write_all_at(0, b"hello").unwrap();
            r.sync_data().unwrap();
            let mut buf = [0u8; 5];
            r.read_exact_at(0, &mut buf).unwrap();
            assert_eq!(&buf, b"hello");
            assert_eq!(r.read_at(3, &mut buf).unwrap(), 2);
            assert_eq!(r.size().unwrap(), 5);
            assert_eq!(r.as_file().is_some(), fd);
        }
        let m = MemFile::default();
        check(&m, false);
        check(Arc::new(MemFile::default()), false);
        check(Box::new(MemFile::default()), false);
        check(Arc::new(MemFile::default()) as Arc<dyn Rw>, false);
        let f = temp_file(b"");
        check(&f, true);
        check(Arc::new(temp_file(b"")), true);
        check(Box::new(temp_file(b"")) as Box<dyn Rw>, true);
    }

    /// Both traits behind one trait object, as a device layer holds them.
    trait Rw: ReadAt + WriteAt {}
    impl<T: ReadAt + WriteAt + ?Sized> Rw for T {}

    #[test]
    fn only_a_file_offers_its_descriptor() {
        let f = temp_file(b"xyz");
        let fd = f.as_file().expect("a file has a descriptor");
        let mut buf = [0u8; 3];
        std::os::unix::fs::FileExt::read_exact_at(fd, &mut buf, 0).unwrap();
        assert_eq!(&buf, b"xyz");
        assert!(std::ptr::eq(fd, &f));
        assert!(MemFile::new(b"xyz".to_vec()).as_file().is_none());
        assert!(b"xyz".to_vec().as_file().is_none());
        assert!(b"xyz"[..].as_file().is_none());
        let r: &dyn ReadAt = &f;
        assert!(r.as_file().is_some());
        assert_eq!(f.size().unwrap(), 3);
    }
}
