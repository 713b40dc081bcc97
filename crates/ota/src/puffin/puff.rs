//! Puffing: deflate blocks to puffin's byte-aligned "puff" form, which keeps everything
//! needed to write the same bits again (block types, a stored block's padding bits, a
//! dynamic block's header as sent, the literal/length/distance sequence) without any
//! Huffman code.
//!
//! The puff of a run of blocks is a sequence of elements, each block being its metadata, its
//! data elements and an end of block:
//!
//! * metadata: 2 bytes big-endian (length − 1), then the bytes: first the block header
//!   `F TT SSSSS` (final bit, type, and for a stored block the padding bits up to the byte
//!   boundary, OR-ed in as puffin does); a dynamic block adds HLIT, HDIST, HCLEN (one byte
//!   each), the code-length code lengths two per byte (high nibble first), and one byte per
//!   code-length symbol as sent: 0–15, 16 + extra (16–19), 20 + extra (20–27), 28 + extra
//!   (28–155);
//! * a run of n literals: byte `n − 1` for n ≤ 127, else 127 and 2 bytes big-endian
//!   `n − 128` (n ≤ 65,663), then the literal bytes; a longer run is split there;
//! * a match: byte `0x80 | (length − 3)` for lengths below 130, else `0xff` and
//!   `length − 130`; then 2 bytes big-endian `distance − 1`;
//! * end of block: `0xff 0x81` (a "length" of 259).
//!
//! A stored block's bytes are one literal run.

use super::bits::BitReader;
use super::error::DeflateError;
use super::huffman::{
    CL_ORDER, DIST_BASE, DIST_EXTRA, Decoder, END_OF_BLOCK, FIXED_DIST_LENS, HuffmanAlphabet,
    LEN_BASE, LEN_EXTRA, fixed_litlen_lens,
};

/// Longest literal run one puff element holds.
pub(crate) const MAX_RUN: usize = 65_663;
/// Largest block metadata: header byte, HLIT, HDIST, HCLEN, 19 nibbles rounded up to bytes
/// fit with room in puffin's 1 + 3 + 286 + 30 + 19.
pub(crate) const MAX_METADATA: usize = 339;
/// The puff element that ends a block.
pub(crate) const END_OF_BLOCK_PUFF: [u8; 2] = [0xff, 0x81];

/// What puffing found that the puff form does not keep exactly; such a stream is puffed as
/// puffin puffs it, but huffing gives back different bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Lossy {
    /// A match of length 258 sent as symbol 284 with 31 extra bits (huffed as symbol 285).
    pub(crate) long_284: bool,
    /// A stored block whose padding bits do not fit the header's five bits.
    pub(crate) wide_padding: bool,
}

/// Appends puff elements to a byte vector, at most `limit` bytes past where it started.
struct PuffWriter<'o> {
    out: &'o mut Vec<u8>,
    end: usize,
    run: Vec<u8>,
}

impl<'o> PuffWriter<'o> {
    fn new(out: &'o mut Vec<u8>, limit: u64) -> Self {
        let end = usize::try_from(limit)
            .ok()
            .and_then(|l| out.len().checked_add(l))
            .unwrap_or(usize::MAX);
        PuffWriter {
            out,
            end,
            run: Vec::new(),
        }
    }

    fn room(&self, n: usize) -> Result<(), DeflateError> {
        if self.out.len().saturating_add(n) > self.end {
            return Err(DeflateError::PuffTooLong);
        }
        Ok(())
    }

    #[inline]
    fn literal(&mut self, b: u8) -> Result<(), DeflateError> {
        self.run.push(b);
        if self.run.len() == MAX_RUN {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DeflateError> {
        let n = self.run.len();
        if n == 0 {
            return Ok(());
        }
        self.room(n + 3)?;
        if n <= 127 {
            self.out.push((n - 1) as u8);
        } else {
            self.out.push(127);
            self.out
                .extend_from_slice(&((n - 128) as u16).to_be_bytes());
        }
        self.out.extend_from_slice(&self.run);
        self.run.clear();
        Ok(())
    }

    fn matched(&mut self, len: u16, dist: u16) -> Result<(), DeflateError> {
        self.flush()?;
        self.room(4)?;
        if len < 130 {
            self.out.push(0x80 | (len - 3) as u8);
        } else {
            self.out.push(0xff);
            self.out.push((len - 130) as u8);
        }
        self.out.extend_from_slice(&(dist - 1).to_be_bytes());
        Ok(())
    }

    fn end_of_block(&mut self) -> Result<(), DeflateError> {
        self.flush()?;
        self.room(2)?;
        self.out.extend_from_slice(&END_OF_BLOCK_PUFF);
        Ok(())
    }

    fn metadata(&mut self, m: &[u8]) -> Result<(), DeflateError> {
        self.flush()?;
        self.room(m.len() + 2)?;
        self.out
            .extend_from_slice(&((m.len() - 1) as u16).to_be_bytes());
        self.out.extend_from_slice(m);
        Ok(())
    }

    fn finish(mut self) -> Result<(), DeflateError> {
        self.flush()
    }
}

/// Decoders reused from block to block.
pub(crate) struct Puffer {
    fixed_lit: Decoder,
    fixed_dist: Decoder,
    lit: Decoder,
    dist: Decoder,
    cl: Decoder,
}

impl Puffer {
    pub(crate) fn new() -> Result<Self, DeflateError> {
        let fixed_lit = Decoder::new(&fixed_litlen_lens(), HuffmanAlphabet::LitLen)?;
        let fixed_dist = Decoder::new(&FIXED_DIST_LENS, HuffmanAlphabet::Distance)?;
        Ok(Puffer {
            lit: fixed_lit.clone(),
            dist: fixed_dist.clone(),
            cl: Decoder::new(&[1, 1], HuffmanAlphabet::CodeLengths)?,
            fixed_lit,
            fixed_dist,
        })
    }

    /// Puff the blocks in bits `[start, end)` of `data`, appending at most `limit` bytes to
    /// `out`. The blocks must end exactly at `end`. Returns what the puff form lost (see
    /// [`Lossy`]).
    pub(crate) fn puff(
        &mut self,
        data: &[u8],
        start: u64,
        end: u64,
        out: &mut Vec<u8>,
        limit: u64,
    ) -> Result<Lossy, DeflateError> {
        if end > data.len() as u64 * 8 || start >= end {
            return Err(DeflateError::EmptyExtent);
        }
        let mut r = BitReader::new(data, start, end);
        let mut w = PuffWriter::new(out, limit);
        let mut lossy = Lossy::default();
        while r.remaining() > 0 {
            self.block(&mut r, &mut w, &mut lossy)?;
        }
        w.finish()?;
        Ok(lossy)
    }

    /// Walk the deflate stream starting at bit `start` of `data` to the end of its final
    /// block, and return the bit extent of each compressed (fixed or dynamic) block, as
    /// puffin's generator locates them; stored blocks are left out (they stay raw bytes).
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn locate(
        &mut self,
        data: &[u8],
        start: u64,
    ) -> Result<(Vec<(u64, u64)>, u64), DeflateError> {
        let mut r = BitReader::new(data, start, data.len() as u64 * 8);
        let mut found = Vec::new();
        let mut sink = Vec::new();
        loop {
            let at = r.pos();
            let header = r.peek(3);
            sink.clear();
            let mut w = PuffWriter::new(&mut sink, u64::MAX);
            self.block(&mut r, &mut w, &mut Lossy::default())?;
            if header >> 1 != 0 {
                found.push((at, r.pos() - at));
            }
            if header & 1 == 1 {
                return Ok((found, r.pos()));
            }
        }
    }

    fn block(
        &mut self,
        r: &mut BitReader<'_>,
        w: &mut PuffWriter<'_>,
        lossy: &mut Lossy,
    ) -> Result<(), DeflateError> {
        let at = r.pos();
        let last = r.read(1)? as u8;
        let btype = r.read(2)? as u8;
        let header = (last << 7) | (btype << 5);
        match btype {
            0 => {
                let pad = r.to_boundary();
                let skipped = r.read(pad)? as u8;
                // puffin ORs the padding bits into the header byte, whatever their width.
                lossy.wide_padding |= skipped > 0x1f;
                let len = r.read(16)?;
                let nlen = r.read(16)?;
                if len ^ nlen != 0xffff {
                    return Err(DeflateError::StoredLength { at, len, nlen });
                }
                w.metadata(&[header | skipped])?;
                let bytes = r.bytes(len as usize)?;
                w.room(bytes.len() + 3)?;
                w.run.extend_from_slice(bytes);
                w.end_of_block()?;
                return Ok(());
            }
            1 => {
                w.metadata(&[header])?;
                let (lit, dist) = (&self.fixed_lit, &self.fixed_dist);
                return symbols(r, w, lit, dist, lossy);
            }
            2 => {
                let mut m = [0u8; MAX_METADATA];
                m[0] = header;
                let n = self.dynamic_header(r, &mut m)?;
                w.metadata(&m[..n])?;
            }
            _ => return Err(DeflateError::ReservedBlockType { at }),
        }
        symbols(r, w, &self.lit, &self.dist, lossy)
    }

    /// Read a dynamic block's header into `m[1..]` and build its decoders; returns the
    /// metadata length (with the header byte).
    fn dynamic_header(
        &mut self,
        r: &mut BitReader<'_>,
        m: &mut [u8; MAX_METADATA],
    ) -> Result<usize, DeflateError> {
        let hlit = r.read(5)? as usize;
        let hdist = r.read(5)? as usize;
        let hclen = r.read(4)? as usize;
        let (nlit, ndist, ncl) = (hlit + 257, hdist + 1, hclen + 4);
        if nlit > 286 || ndist > 30 {
            return Err(DeflateError::TooManyCodes { nlit, ndist });
        }
        m[1..4].copy_from_slice(&[hlit as u8, hdist as u8, hclen as u8]);
        let mut n = 4;
        let mut cl = [0u8; 19];
        for i in 0..ncl {
            let v = r.read(3)? as u8;
            cl[CL_ORDER[i]] = v;
            if i % 2 == 0 {
                m[n] = v << 4;
            } else {
                m[n] |= v;
                n += 1;
            }
        }
        if ncl % 2 == 1 {
            n += 1;
        }
        self.cl.rebuild(&cl)?;
        let total = nlit + ndist;
        let mut lens = [0u8; 286 + 30];
        let mut i = 0;
        while i < total {
            let sym = self.cl.decode(r)?;
            let (rep, val, code) = match sym {
                0..=15 => (1, sym as u8, sym as u8),
                16 => {
                    let Some(&prev) = i.checked_sub(1).and_then(|p| lens.get(p)) else {
                        return Err(DeflateError::RepeatWithoutLength);
                    };
                    let e = r.read(2)? as usize;
                    (3 + e, prev, 16 + e as u8)
                }
                17 => {
                    let e = r.read(3)? as usize;
                    (3 + e, 0, 20 + e as u8)
                }
                _ => {
                    let e = r.read(7)? as usize;
                    (11 + e, 0, 28 + e as u8)
                }
            };
            if i + rep > total {
                return Err(DeflateError::RepeatOverrun);
            }
            lens[i..i + rep].fill(val);
            i += rep;
            // At most 3 + 10 + 316 bytes: always inside `m`.
            m[n] = code;
            n += 1;
        }
        self.lit.rebuild(&lens[..nlit])?;
        self.dist.rebuild(&lens[nlit..total])?;
        Ok(n)
    }
}

/// Decode literals and matches up to the end of the block.
fn symbols(
    r: &mut BitReader<'_>,
    w: &mut PuffWriter<'_>,
    lit: &Decoder,
    dist: &Decoder,
    lossy: &mut Lossy,
) -> Result<(), DeflateError> {
    loop {
        let sym = lit.decode(r)?;
        if sym < END_OF_BLOCK {
            w.literal(sym as u8)?;
            continue;
        }
        if sym == END_OF_BLOCK {
            return w.end_of_block();
        }
        let i = sym - 257;
        let (Some(&base), Some(&extra)) = (LEN_BASE.get(i), LEN_EXTRA.get(i)) else {
            return Err(DeflateError::BadSymbol {
                alphabet: HuffmanAlphabet::LitLen,
                symbol: sym,
            });
        };
        let e = r.read(u32::from(extra))? as u16;
        lossy.long_284 |= sym == 284 && e == 31;
        let len = base + e;
        let d = dist.decode(r)?;
        let (Some(&dbase), Some(&dextra)) = (DIST_BASE.get(d), DIST_EXTRA.get(d)) else {
            return Err(DeflateError::BadSymbol {
                alphabet: HuffmanAlphabet::Distance,
                symbol: d,
            });
        };
        let distance = dbase + r.read(u32::from(dextra))? as u16;
        w.matched(len, distance)?;
    }
}
