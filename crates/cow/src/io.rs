//! Small random-access I/O traits so the reader works on files without loading them.

use std::io;
use std::sync::Arc;

/// Positional reads (`pread`-style). Implemented for files and in-memory byte slices.
pub trait ReadAt {
    /// Read up to `buf.len()` bytes at `offset`; returns the count (0 at end of data).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// Total size in bytes.
    fn size(&self) -> io::Result<u64>;

    /// Fill `buf` completely from `offset`, or fail with `UnexpectedEof`.
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
}

/// Positional writes (`pwrite`-style), used for in-place header updates during a merge.
pub trait WriteAt {
    /// Write all of `buf` at `offset`.
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Make previous writes durable (fdatasync for files; no-op in memory).
    fn sync_data(&self) -> io::Result<()>;
}

impl ReadAt for std::fs::File {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        let m = self.metadata()?;
        if m.file_type().is_block_device() {
            use std::io::Seek;
            // Block devices report 0 in metadata; seek to the end to learn their size.
            let mut f = self;
            let end = f.seek(io::SeekFrom::End(0))?;
            return Ok(end);
        }
        Ok(m.len())
    }
}

use std::os::unix::fs::FileTypeExt;

impl WriteAt for std::fs::File {
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        std::fs::File::sync_data(self)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let len = self.len() as u64;
        if offset >= len {
            return Ok(0);
        }
        let start = offset as usize;
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
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

impl<T: ReadAt + ?Sized> ReadAt for &T {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_at(offset, buf)
    }
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
}

impl<T: ReadAt + ?Sized> ReadAt for Arc<T> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_at(offset, buf)
    }
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
}

impl<T: ReadAt + ?Sized> ReadAt for Box<T> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_at(offset, buf)
    }
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
}

impl<T: WriteAt + ?Sized> WriteAt for &T {
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_all_at(offset, buf)
    }
    fn sync_data(&self) -> io::Result<()> {
        (**self).sync_data()
    }
}

/// An in-memory, growable image usable with both traits (tests, small tools).
#[derive(Debug, Default)]
pub struct MemFile(pub std::sync::Mutex<Vec<u8>>);

impl MemFile {
    /// Wrap existing bytes.
    pub fn new(data: Vec<u8>) -> Self {
        MemFile(std::sync::Mutex::new(data))
    }
    /// Take the bytes back.
    pub fn into_inner(self) -> Vec<u8> {
        self.0.into_inner().unwrap_or_else(|p| p.into_inner())
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ReadAt for MemFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.lock().as_slice().read_at(offset, buf)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.lock().len() as u64)
    }
}

impl WriteAt for MemFile {
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut v = self.lock();
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
