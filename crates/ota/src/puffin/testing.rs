//! Test scaffolding for PUFFDIFF (feature `test-utils`): finding the deflate blocks of zlib,
//! gzip and zip data as puffin's generator does, puff and huff of whole buffers, a
//! PUFFDIFF patch maker taking the inner bsdiff as a closure, and the fuzz entry point.

use super::bits::BitWriter;
use super::error::{DeflateError, PuffError, PuffSide};
use super::header::{self, Stream};
use super::huff::{Huffer, inflate};
use super::puff::Puffer;
use super::stream::{self, huff_stream, layout, puff_stream};

/// A buffer's deflate bit extents, where their puffs go and the puff stream's length.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Deflate bit extents `(offset, length)`, sorted.
    pub deflates: Vec<(u64, u64)>,
    /// Puff byte extents `(offset, length)`, one per deflate.
    pub puffs: Vec<(u64, u64)>,
    /// Bytes of the whole puff stream.
    pub puff_len: u64,
}

impl Layout {
    /// Puff each extent of `data` to learn its size and lay the puffs out.
    pub fn of(data: &[u8], deflates: Vec<(u64, u64)>) -> Result<Layout, PuffError> {
        let mut puffer = Puffer::new().map_err(PuffError::Internal)?;
        let mut sizes = Vec::with_capacity(deflates.len());
        let mut scratch = Vec::new();
        for (index, &(offset, length)) in deflates.iter().enumerate() {
            scratch.clear();
            let end = offset.saturating_add(length);
            puffer
                .puff(data, offset, end, &mut scratch, u64::MAX)
                .map_err(|source| PuffError::Deflate {
                    side: PuffSide::Source,
                    index,
                    offset,
                    length,
                    source,
                })?;
            sizes.push(scratch.len() as u64);
        }
        let (puffs, puff_len) = layout(PuffSide::Source, &deflates, sizes, data.len() as u64)?;
        Ok(Layout {
            deflates,
            puffs,
            puff_len,
        })
    }

    /// The puff stream of `data`.
    pub fn puff(&self, data: &[u8]) -> Result<Vec<u8>, PuffError> {
        puff_stream(
            PuffSide::Source,
            data,
            &self.deflates,
            &self.puffs,
            self.puff_len,
            Vec::new(),
        )
        .map(|(p, _)| p)
    }

    /// The `len` bytes a puff stream of this layout huffs to.
    pub fn huff(&self, puff: &[u8], len: u64) -> Result<Vec<u8>, PuffError> {
        huff_stream(puff, &self.deflates, &self.puffs, len, Vec::new())
    }

    fn stream(&self) -> Stream {
        Stream {
            deflates: self.deflates.clone(),
            puffs: self.puffs.clone(),
            puff_len: self.puff_len,
        }
    }
}

/// The compressed blocks of the raw deflate stream starting at bit `start` of `data` (stored
/// blocks are not listed: they stay raw bytes), and the bit just past its final block.
pub fn locate_raw(data: &[u8], start: u64) -> Result<(Vec<(u64, u64)>, u64), DeflateError> {
    Puffer::new()?.locate(data, start)
}

/// How deflate streams are wrapped in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Container {
    /// One raw deflate stream from the first byte.
    Raw,
    /// A zlib stream (RFC 1950): 2-byte header, 4 more with a preset dictionary.
    Zlib,
    /// gzip members (RFC 1952), one after the other.
    Gzip,
    /// A zip archive: every DEFLATE entry found by its local header.
    Zip,
}

/// The compressed blocks of every deflate stream in `data`, found as puffin's generator finds
/// them (stored blocks are not listed).
pub fn deflates_in(data: &[u8], container: Container) -> Result<Vec<(u64, u64)>, PuffError> {
    match container {
        Container::Raw => Ok(stream::locate(data, 0)?.0),
        Container::Zlib => {
            let start = if data.get(1).is_some_and(|f| f & 0x20 != 0) {
                6
            } else {
                2
            };
            Ok(stream::locate(data, start)?.0)
        }
        Container::Gzip => in_gzip(data),
        Container::Zip => Ok(in_zip(data)),
    }
}

fn in_gzip(data: &[u8]) -> Result<Vec<(u64, u64)>, PuffError> {
    let mut found = Vec::new();
    let mut pos = 0usize;
    while data.get(pos..pos + 3) == Some(&[0x1f, 0x8b, 8]) {
        let flags = data.get(pos + 3).copied().unwrap_or(0);
        let mut at = pos + 10;
        if flags & 4 != 0 {
            let x = data
                .get(at..at + 2)
                .map_or(0, |b| usize::from(u16::from_le_bytes([b[0], b[1]])));
            at += 2 + x;
        }
        for bit in [8, 16] {
            if flags & bit != 0 {
                while data.get(at).is_some_and(|&b| b != 0) {
                    at += 1;
                }
                at += 1;
            }
        }
        if flags & 2 != 0 {
            at += 2;
        }
        let (blocks, end) = stream::locate(data, at)?;
        found.extend(blocks);
        pos = end + 8;
    }
    Ok(found)
}

fn in_zip(data: &[u8]) -> Vec<(u64, u64)> {
    let mut found = Vec::new();
    let mut pos = 0usize;
    while pos + 30 <= data.len() {
        let h = &data[pos..pos + 30];
        let u16_at = |i: usize| usize::from(u16::from_le_bytes([h[i], h[i + 1]]));
        if &h[..4] != b"PK\x03\x04" || u16_at(8) != 8 {
            pos += 1;
            continue;
        }
        let start = pos + 30 + u16_at(26) + u16_at(28);
        match stream::locate(data, start) {
            Ok((blocks, end)) => {
                found.extend(blocks);
                pos = end;
            }
            Err(_) => pos += 4,
        }
    }
    found
}

/// The puff of the blocks in bits `[start, end)` of `data` (which must end exactly there).
pub fn puff_run(data: &[u8], start: u64, end: u64) -> Result<Vec<u8>, DeflateError> {
    let mut out = Vec::new();
    Puffer::new()?.puff(data, start, end, &mut out, u64::MAX)?;
    Ok(out)
}

/// Huff a puff of whole blocks starting on a byte boundary: the bytes and the bit count.
pub fn huff_run(puff: &[u8]) -> Result<(Vec<u8>, u64), DeflateError> {
    let mut w = BitWriter::new(puff.len() as u64 * 16 + 64);
    Huffer::new()?.huff(puff, &mut w)?;
    let bits = w.bits();
    Ok((w.finish(), bits))
}

/// Decompress a puff of whole blocks (at most `limit` bytes); also the number of its stored,
/// fixed and dynamic blocks.
pub fn inflate_puff(puff: &[u8], limit: usize) -> Result<(Vec<u8>, [usize; 3]), DeflateError> {
    inflate(puff, limit)
}

/// A PUFFDIFF patch from `src` to `dst` with these layouts, its inner patch made by
/// `bsdiff(old_puff_stream, new_puff_stream)`.
pub fn make_puffdiff(
    src: &[u8],
    src_layout: &Layout,
    dst: &[u8],
    dst_layout: &Layout,
    bsdiff: impl FnOnce(&[u8], &[u8]) -> Vec<u8>,
) -> Result<Vec<u8>, PuffError> {
    let old = src_layout.puff(src)?;
    let new = dst_layout.puff(dst)?;
    Ok(puf1(src_layout, dst_layout, &bsdiff(&old, &new)))
}

/// A `PUF1` patch: these layouts in its header, then `inner`.
pub fn puf1(src: &Layout, dst: &Layout, inner: &[u8]) -> Vec<u8> {
    header::write(&src.stream(), &dst.stream(), inner)
}

/// Fuzz entry point (crates/ota/fuzz, target `puffin`): must never panic except on a broken
/// invariant. The first byte's low two bits choose what the rest is:
///
/// * 0: a raw deflate stream, shifted by `(flags >> 2) & 7` bits: its blocks are located,
///   puffed and huffed, and must give back the same bytes unless puffing reported a loss;
/// * 1: a puff of whole blocks: if it huffs, puffing and huffing the result again must give
///   the same bits;
/// * 2, 3: a big-endian u16 destination length, then a PUFFDIFF patch applied to an empty
///   source with an inner patch that is the new puff stream itself.
pub fn fuzz_puffin(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    match flags & 3 {
        0 => fuzz_round_trip(rest, u32::from(flags >> 2) & 7),
        1 => fuzz_huff(rest),
        _ => fuzz_patch(rest),
    }
}

fn fuzz_round_trip(deflate: &[u8], shift: u32) {
    // The stream moved up by `shift` bits, after `shift` one bits.
    let mut buf = Vec::with_capacity(deflate.len() + 1);
    let mut carry = (1u16 << shift) - 1;
    for &b in deflate {
        let v = (u16::from(b) << shift) | carry;
        buf.push(v as u8);
        carry = v >> 8;
    }
    buf.push(carry as u8);
    let Ok((blocks, _)) = locate_raw(&buf, u64::from(shift)) else {
        return;
    };
    let layout = match Layout::of(&buf, blocks) {
        Ok(l) => l,
        Err(e) => panic!("located blocks do not puff: {e}"),
    };
    let (puff, lossy) = match puff_stream(
        PuffSide::Source,
        &buf,
        &layout.deflates,
        &layout.puffs,
        layout.puff_len,
        Vec::new(),
    ) {
        Ok(p) => p,
        Err(e) => panic!("a checked layout does not puff: {e}"),
    };
    assert_eq!(puff.len() as u64, layout.puff_len);
    let back = layout.huff(&puff, buf.len() as u64);
    if lossy == super::puff::Lossy::default() {
        match back {
            Ok(b) => assert!(b == buf, "puff then huff changed the bytes"),
            Err(e) => panic!("a lossless puff does not huff: {e}"),
        }
    }
}

fn fuzz_huff(puff: &[u8]) {
    let Ok((d, bits)) = huff_run(puff) else {
        return;
    };
    if bits == 0 {
        return;
    }
    let p2 = match puff_run(&d, 0, bits) {
        Ok(p) => p,
        Err(e) => panic!("huffed blocks do not puff: {e}"),
    };
    match huff_run(&p2) {
        Ok((d2, bits2)) => assert!(
            d2 == d && bits2 == bits,
            "huff, puff, huff changed the bits"
        ),
        Err(e) => panic!("a puff of huffed blocks does not huff: {e}"),
    }
}

fn fuzz_patch(rest: &[u8]) {
    let [a, b, patch @ ..] = rest else {
        return;
    };
    let dst_len = u64::from(u16::from_be_bytes([*a, *b]));
    let out = super::apply_puffdiff(&[], patch, dst_len, |_, inner, n, new| {
        new.extend_from_slice(inner);
        new.resize(n as usize, 0);
        Ok::<_, std::convert::Infallible>(())
    });
    if let Ok(o) = out {
        assert_eq!(o.len() as u64, dst_len);
    }
}
