//! The bsdiff patch applier behind SOURCE_BSDIFF (BSDIFF40 patches) and BROTLI_BSDIFF (BSDF2
//! patches). Written for untrusted patches: every length and position is checked, nothing is
//! allocated from a length the patch states, and the output may not exceed the caller's limit
//! (the operation's destination extents).
//!
//! ```text
//! 0   magic: "BSDIFF40", or "BSDF2" and one compressor byte per stream
//!     (control, diff, extra): 0 none, 1 bzip2, 2 brotli. BSDIFF40 streams are all bzip2.
//! 8   C: control stream length      (bsdiff integers: 8 bytes, little-endian magnitude,
//! 16  D: diff stream length          the top bit of the last byte is the sign)
//! 24  N: new size
//! 32  control stream (C bytes), diff stream (D bytes), extra stream (the rest of the patch)
//! ```
//!
//! The control stream is a sequence of triples of bsdiff integers (diff length, extra length,
//! seek): take `diff length` bytes of the diff stream, each added (mod 256) to the old byte at the
//! old position (old bytes outside the old file count as zero) and advancing it; then copy
//! `extra length` bytes of the extra stream; then move the old position by `seek`. The new file
//! is complete when it has N bytes; the rest of the control stream is not read.
//!
//! Memory: the old bytes and the patch are the caller's slices; the new bytes go out through a
//! caller-provided buffer; each stream's decoder holds its own state (bzip2 up to ~4 MiB, brotli
//! its window, at most 16 MiB).

use std::io::{self, Read};

/// A bsdiff integer: 8 bytes, little-endian magnitude in the low 63 bits, the sign in the top
/// bit (so there is a "negative zero", which is zero).
pub(crate) fn bsdiff_int(b: [u8; 8]) -> i64 {
    let v = u64::from_le_bytes(b);
    let magnitude = (v & (u64::MAX >> 1)) as i64;
    if v >> 63 == 1 { -magnitude } else { magnitude }
}

/// Control entries that write nothing (both lengths zero) accepted per patch: a control
/// stream can decompress to far more entries than the new file has bytes, and each costs a
/// loop turn.
pub(crate) const MAX_IDLE_ENTRIES: u64 = 1 << 20;

/// The three streams of a patch.
const STREAMS: [&str; 3] = ["control", "diff", "extra"];

/// What is wrong with a bsdiff patch (inside [`OpError::Patch`](crate::OpError::Patch)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PatchError {
    /// The patch is shorter than its header.
    #[error("patch of {len} bytes is shorter than the 32-byte bsdiff header")]
    Short {
        /// Patch length.
        len: usize,
    },
    /// The magic is neither `BSDIFF40` nor `BSDF2`.
    #[error("not a bsdiff patch: magic {found:02x?}, expected \"BSDIFF40\" or \"BSDF2\"")]
    BadMagic {
        /// The first eight bytes.
        found: [u8; 8],
    },
    /// A BSDF2 compressor byte names no known compressor.
    #[error(
        "BSDF2 compressor {code} for the {stream} stream is unknown (0 none, 1 bzip2, 2 brotli)"
    )]
    BadCompressor {
        /// `control`, `diff` or `extra`.
        stream: &'static str,
        /// The byte.
        code: u8,
    },
    /// A header length is negative or the streams lie past the patch's end.
    #[error(
        "bsdiff header: control {ctrl_len} bytes, diff {diff_len} bytes, new size {new_size}: negative or past the patch's {len} bytes"
    )]
    BadHeader {
        /// Control stream length, as stated.
        ctrl_len: i64,
        /// Diff stream length, as stated.
        diff_len: i64,
        /// New size, as stated.
        new_size: i64,
        /// Patch length.
        len: usize,
    },
    /// The patch makes a larger file than its destination holds.
    #[error("the patch makes {new_size} bytes, more than the {limit} bytes of its destination")]
    TooLong {
        /// New size from the header.
        new_size: u64,
        /// The destination's size.
        limit: u64,
    },
    /// A control entry has a negative length.
    #[error("control entry {entry}: negative length (diff {diff}, extra {extra})")]
    NegativeLength {
        /// Index of the entry.
        entry: u64,
        /// Diff length.
        diff: i64,
        /// Extra length.
        extra: i64,
    },
    /// A control entry writes past the new size.
    #[error("control entry {entry} writes up to byte {end}, past the new size {new_size}")]
    PastNewEnd {
        /// Index of the entry.
        entry: u64,
        /// Where it would end (saturated).
        end: u64,
        /// New size from the header.
        new_size: u64,
    },
    /// The old position left the range of a 64-bit integer.
    #[error("control entry {entry}: the old-file position overflows")]
    OldOverflow {
        /// Index of the entry.
        entry: u64,
    },
    /// Too many control entries write nothing.
    #[error("control entry {entry}: more than {MAX_IDLE_ENTRIES} entries write nothing")]
    Idle {
        /// Index of the entry.
        entry: u64,
    },
    /// A stream ended before the control entries were done with it.
    #[error("the {stream} stream ends early (control entry {entry})")]
    Truncated {
        /// `control`, `diff` or `extra`.
        stream: &'static str,
        /// Index of the entry being applied.
        entry: u64,
    },
    /// A compressed stream could not be decoded.
    #[error("decompressing the {stream} stream")]
    Decode {
        /// `control`, `diff` or `extra`.
        stream: &'static str,
        /// The decoder's error.
        #[source]
        source: io::Error,
    },
}

/// How a stream is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codec {
    /// Stored as is (BSDF2 code 0).
    None,
    /// bzip2 (BSDIFF40, BSDF2 code 1).
    Bzip2,
    /// brotli (BSDF2 code 2).
    Brotli,
}

/// A parsed patch header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Compressors of the control, diff and extra streams.
    pub(crate) codecs: [Codec; 3],
    /// Control stream length.
    pub(crate) ctrl_len: usize,
    /// Diff stream length.
    pub(crate) diff_len: usize,
    /// Size of the new file.
    pub(crate) new_size: u64,
}

/// Parse and check the header of `patch`.
pub(crate) fn header(patch: &[u8]) -> Result<Header, PatchError> {
    let Some(h) = patch.first_chunk::<32>() else {
        return Err(PatchError::Short { len: patch.len() });
    };
    let field = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[i..i + 8]);
        b
    };
    let magic = field(0);
    let codecs = if &magic == b"BSDIFF40" {
        [Codec::Bzip2; 3]
    } else if magic.starts_with(b"BSDF2") {
        let mut c = [Codec::None; 3];
        for (i, slot) in c.iter_mut().enumerate() {
            *slot = match magic[5 + i] {
                0 => Codec::None,
                1 => Codec::Bzip2,
                2 => Codec::Brotli,
                code => {
                    return Err(PatchError::BadCompressor {
                        stream: STREAMS[i],
                        code,
                    });
                }
            };
        }
        c
    } else {
        return Err(PatchError::BadMagic { found: magic });
    };
    let (ctrl, diff, new) = (
        bsdiff_int(field(8)),
        bsdiff_int(field(16)),
        bsdiff_int(field(24)),
    );
    let body = patch.len() - 32;
    let bad = PatchError::BadHeader {
        ctrl_len: ctrl,
        diff_len: diff,
        new_size: new,
        len: patch.len(),
    };
    let (Ok(ctrl_len), Ok(diff_len), Ok(new_size)) = (
        usize::try_from(ctrl),
        usize::try_from(diff),
        u64::try_from(new),
    ) else {
        return Err(bad);
    };
    if ctrl_len.checked_add(diff_len).is_none_or(|n| n > body) {
        return Err(bad);
    }
    Ok(Header {
        codecs,
        ctrl_len,
        diff_len,
        new_size,
    })
}

/// One decoding stream over a slice of the patch.
enum Stream<'p> {
    Raw(&'p [u8]),
    Bzip2(Box<bzip2::read::BzDecoder<&'p [u8]>>),
    Brotli(Box<brotli::Decompressor<&'p [u8]>>),
}

impl<'p> Stream<'p> {
    fn new(codec: Codec, bytes: &'p [u8]) -> Stream<'p> {
        match codec {
            Codec::None => Stream::Raw(bytes),
            Codec::Bzip2 => Stream::Bzip2(Box::new(bzip2::read::BzDecoder::new(bytes))),
            Codec::Brotli => Stream::Brotli(Box::new(brotli::Decompressor::new(bytes, 4096))),
        }
    }

    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Raw(r) => r.read(out),
            Stream::Bzip2(d) => d.read(out),
            Stream::Brotli(d) => d.read(out),
        }
    }
}

/// A stream with its name, for errors.
struct Named<'p> {
    stream: Stream<'p>,
    name: &'static str,
}

impl Named<'_> {
    /// Fill `out` exactly.
    fn fill(&mut self, mut out: &mut [u8], entry: u64) -> Result<(), PatchError> {
        while !out.is_empty() {
            match self.stream.read(out) {
                Ok(0) => {
                    return Err(PatchError::Truncated {
                        stream: self.name,
                        entry,
                    });
                }
                Ok(n) => out = &mut out[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(PatchError::Decode {
                        stream: self.name,
                        source,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Why [`apply`] stopped: the patch, or the caller's sink.
#[derive(Debug)]
pub(crate) enum Fail<E> {
    /// The patch is bad.
    Patch(PatchError),
    /// The sink failed.
    Sink(E),
}

impl<E> From<PatchError> for Fail<E> {
    fn from(e: PatchError) -> Self {
        Fail::Patch(e)
    }
}

/// The new file's bytes on their way out: `buf` is filled and handed to the sink when full.
struct Out<'b, 's, E> {
    buf: &'b mut [u8],
    n: usize,
    sink: &'s mut dyn FnMut(&[u8]) -> Result<(), E>,
}

impl<E> Out<'_, '_, E> {
    /// Free space of the buffer, flushing it first when full.
    fn space(&mut self) -> Result<usize, Fail<E>> {
        if self.n == self.buf.len() {
            self.flush()?;
        }
        Ok(self.buf.len() - self.n)
    }

    fn flush(&mut self) -> Result<(), Fail<E>> {
        if self.n > 0 {
            (self.sink)(&self.buf[..self.n]).map_err(Fail::Sink)?;
            self.n = 0;
        }
        Ok(())
    }
}

/// Add (mod 256) the old bytes at `pos..pos + out.len()` to `out`; positions outside `old`
/// add nothing.
fn add_old(out: &mut [u8], old: &[u8], pos: i64) {
    let len = old.len() as i128;
    let start = i128::from(pos).clamp(0, len);
    let end = (i128::from(pos) + out.len() as i128).clamp(0, len);
    if start >= end {
        return;
    }
    let skip = (start - i128::from(pos)) as usize;
    let src = &old[start as usize..end as usize];
    for (o, s) in out[skip..skip + src.len()].iter_mut().zip(src) {
        *o = o.wrapping_add(*s);
    }
}

/// Apply `patch` to `old`, handing the new file to `sink` in pieces of `buf.len()` bytes (the
/// last one shorter); `limit` is the most bytes the new file may have. Returns its size.
pub(crate) fn apply<E>(
    old: &[u8],
    patch: &[u8],
    limit: u64,
    buf: &mut [u8],
    sink: &mut dyn FnMut(&[u8]) -> Result<(), E>,
) -> Result<u64, Fail<E>> {
    let h = header(patch)?;
    if h.new_size > limit {
        return Err(PatchError::TooLong {
            new_size: h.new_size,
            limit,
        }
        .into());
    }
    // A caller's empty buffer would never make room: use a small one of our own.
    let mut own = [0u8; 4096];
    let buf = if buf.is_empty() { &mut own[..] } else { buf };
    let body = &patch[32..];
    let (ctrl, rest) = body.split_at(h.ctrl_len);
    let (diff, extra) = rest.split_at(h.diff_len);
    let named = |i: usize, bytes| Named {
        stream: Stream::new(h.codecs[i], bytes),
        name: STREAMS[i],
    };
    let (mut ctrl, mut diff, mut extra) = (named(0, ctrl), named(1, diff), named(2, extra));
    let mut out = Out { buf, n: 0, sink };
    let (mut new_pos, mut old_pos) = (0u64, 0i64);
    let (mut entry, mut idle) = (0u64, 0u64);
    while new_pos < h.new_size {
        let mut e = [0u8; 24];
        ctrl.fill(&mut e, entry)?;
        let int = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&e[i..i + 8]);
            bsdiff_int(b)
        };
        let (d, x, seek) = (int(0), int(8), int(16));
        let (Ok(d_len), Ok(x_len)) = (u64::try_from(d), u64::try_from(x)) else {
            return Err(PatchError::NegativeLength {
                entry,
                diff: d,
                extra: x,
            }
            .into());
        };
        let past = |end: Option<u64>| PatchError::PastNewEnd {
            entry,
            end: end.unwrap_or(u64::MAX),
            new_size: h.new_size,
        };
        let end = new_pos.checked_add(d_len);
        if end.is_none_or(|e| e > h.new_size) {
            return Err(past(end).into());
        }
        if d_len == 0 && x_len == 0 {
            idle += 1;
            if idle > MAX_IDLE_ENTRIES {
                return Err(PatchError::Idle { entry }.into());
            }
        }
        // Diff bytes plus old bytes. d_len <= new_size <= limit, far below i64::MAX.
        let mut left = d_len;
        while left > 0 {
            let k = (out.space()? as u64).min(left) as usize;
            let piece = &mut out.buf[out.n..out.n + k];
            diff.fill(piece, entry)?;
            add_old(piece, old, old_pos);
            out.n += k;
            left -= k as u64;
            old_pos = old_pos
                .checked_add(k as i64)
                .ok_or(PatchError::OldOverflow { entry })?;
        }
        new_pos += d_len;
        let end = new_pos.checked_add(x_len);
        if end.is_none_or(|e| e > h.new_size) {
            return Err(past(end).into());
        }
        let mut left = x_len;
        while left > 0 {
            let k = (out.space()? as u64).min(left) as usize;
            extra.fill(&mut out.buf[out.n..out.n + k], entry)?;
            out.n += k;
            left -= k as u64;
        }
        new_pos += x_len;
        old_pos = old_pos
            .checked_add(seek)
            .ok_or(PatchError::OldOverflow { entry })?;
        entry += 1;
    }
    out.flush()?;
    Ok(h.new_size)
}

#[cfg(test)]
mod tests;
