//! The payload's bytes, read by position (`pread`), never loaded whole, through `snapblk_core`'s
//! positional I/O family ([`ReadAt`]); [`Source`] adds the fixed length the reader checks
//! every size against.

use snapblk_core::ReadAt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// A positional source of fixed length, shared between threads by `&self`.
pub(crate) trait Source: ReadAt + Send + Sync {
    /// Length in bytes.
    fn len(&self) -> u64;
}

/// `len` bytes of a file from `base` on: a bare payload (`base` 0) or the stored `payload.bin`
/// entry of a zip.
pub(crate) struct FileSlice {
    pub(crate) file: File,
    pub(crate) base: u64,
    pub(crate) len: u64,
}

/// No `as_file`: offsets are relative to `base`, so reads are not one-to-one `pread`s of the file.
impl ReadAt for FileSlice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.len.saturating_sub(offset);
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if n == 0 {
            return Ok(0);
        }
        let at = self
            .base
            .checked_add(offset)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        FileExt::read_at(&self.file, &mut buf[..n], at)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.len)
    }
}

impl Source for FileSlice {
    fn len(&self) -> u64 {
        self.len
    }
}

/// `len` bytes of any shared positional source from `base` on (a remote object, for one).
pub(crate) struct SourceSlice {
    pub(crate) src: Arc<dyn ReadAt + Send + Sync>,
    pub(crate) base: u64,
    pub(crate) len: u64,
}

impl ReadAt for SourceSlice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.len.saturating_sub(offset);
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if n == 0 {
            return Ok(0);
        }
        let at = self
            .base
            .checked_add(offset)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        self.src.read_at(at, &mut buf[..n])
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.len)
    }
}

impl Source for SourceSlice {
    fn len(&self) -> u64 {
        self.len
    }
}

/// A positional source as a `Read + Seek` stream (for the zip directory reader).
pub(crate) struct ReadAtCursor {
    pub(crate) src: Arc<dyn ReadAt + Send + Sync>,
    pub(crate) pos: u64,
    pub(crate) len: u64,
}

impl io::Read for ReadAtCursor {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if n == 0 {
            return Ok(0);
        }
        let got = self.src.read_at(self.pos, &mut buf[..n])?;
        self.pos += got as u64;
        Ok(got)
    }
}

impl io::Seek for ReadAtCursor {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let (from, delta) = match to {
            io::SeekFrom::Start(n) => (0u64, i128::from(n)),
            io::SeekFrom::End(d) => (self.len, i128::from(d)),
            io::SeekFrom::Current(d) => (self.pos, i128::from(d)),
        };
        let at = i128::from(from) + delta;
        self.pos = u64::try_from(at)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        Ok(self.pos)
    }
}

impl Source for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_reads_only_its_window() {
        let d = snapblk_testsupport::TempDir::new("ota-source");
        let p = d.join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let s = FileSlice {
            file: File::open(&p).unwrap(),
            base: 2,
            len: 5,
        };
        let mut b = [0u8; 8];
        assert_eq!(s.read_at(0, &mut b).unwrap(), 5);
        assert_eq!(&b[..5], b"23456");
        assert_eq!(s.read_at(4, &mut b).unwrap(), 1);
        assert_eq!(s.read_at(5, &mut b).unwrap(), 0);
        assert!(s.read_exact_at(3, &mut b[..3]).is_err());
        s.read_exact_at(3, &mut b[..2]).unwrap();
        assert_eq!(&b[..2], b"56");
    }

    #[test]
    fn a_source_slice_and_cursor_read_their_window() {
        use std::io::{Read, Seek, SeekFrom};
        let src: Arc<dyn ReadAt + Send + Sync> = Arc::new(b"0123456789".to_vec());
        let s = SourceSlice {
            src: src.clone(),
            base: 2,
            len: 5,
        };
        let mut b = [0u8; 8];
        assert_eq!(s.read_at(0, &mut b).unwrap(), 5);
        assert_eq!(&b[..5], b"23456");
        assert_eq!(s.read_at(5, &mut b).unwrap(), 0);
        let mut c = ReadAtCursor {
            src,
            pos: 0,
            len: 10,
        };
        assert_eq!(c.seek(SeekFrom::End(-3)).unwrap(), 7);
        let mut v = Vec::new();
        c.read_to_end(&mut v).unwrap();
        assert_eq!(v, b"789");
        assert_eq!(c.seek(SeekFrom::Current(-5)).unwrap(), 5);
        assert!(c.seek(SeekFrom::Current(-6)).is_err());
        assert_eq!(c.seek(SeekFrom::Start(20)).unwrap(), 20);
        assert_eq!(c.read(&mut b).unwrap(), 0);
    }
}
