//! Huffing: a puff (see `puff.rs` for the form) back to deflate bits, exactly those the
//! puffed blocks had when they came from a canonical encoder. It accepts only what puffing
//! produces (and any split of literal runs): anything else in a patched puff is an error,
//! found before the partition hash would find it.

use super::bits::BitWriter;
use super::error::DeflateError;
use super::huffman::{
    CL_ORDER, DIST_BASE, DIST_EXTRA, END_OF_BLOCK, Encoder, FIXED_DIST_LENS, HuffmanAlphabet,
    LEN_BASE, LEN_EXTRA, distance_symbol, fixed_litlen_lens, length_symbol,
};
use super::puff::MAX_METADATA;

/// One puff element.
#[derive(Debug)]
enum Elem<'a> {
    Literals(&'a [u8]),
    Match { len: u16, dist: u16 },
    EndOfBlock,
}

/// Reads puff elements.
struct PuffReader<'a> {
    p: &'a [u8],
    i: usize,
}

impl<'a> PuffReader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DeflateError> {
        let s = self
            .p
            .get(self.i..self.i.saturating_add(n))
            .ok_or(DeflateError::PuffTruncated { at: self.p.len() })?;
        self.i += n;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, DeflateError> {
        Ok(self.take(1)?[0])
    }

    fn be16(&mut self) -> Result<u16, DeflateError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn malformed(&self, what: &'static str) -> DeflateError {
        DeflateError::PuffMalformed { what, at: self.i }
    }

    fn metadata(&mut self) -> Result<&'a [u8], DeflateError> {
        let n = usize::from(self.be16()?) + 1;
        if n > MAX_METADATA {
            return Err(self.malformed("block metadata longer than 339 bytes"));
        }
        self.take(n)
    }

    fn data(&mut self) -> Result<Elem<'a>, DeflateError> {
        let b = self.byte()?;
        if b & 0x80 != 0 {
            let mut len = u16::from(b & 0x7f);
            if len == 127 {
                len += u16::from(self.byte()?);
            }
            len += 3;
            if len == 259 {
                return Ok(Elem::EndOfBlock);
            }
            if len > 259 {
                return Err(self.malformed("match length over 258"));
            }
            let d = self.be16()?;
            if d >= 1 << 15 {
                return Err(self.malformed("match distance over 32,768"));
            }
            return Ok(Elem::Match { len, dist: d + 1 });
        }
        let mut n = usize::from(b);
        if n == 127 {
            n += usize::from(self.be16()?);
        }
        Ok(Elem::Literals(self.take(n + 1)?))
    }
}

/// The fixed-block encoders.
pub(crate) struct Huffer {
    fixed_lit: Encoder,
    fixed_dist: Encoder,
}

impl Huffer {
    pub(crate) fn new() -> Result<Self, DeflateError> {
        Ok(Huffer {
            fixed_lit: Encoder::new(&fixed_litlen_lens(), HuffmanAlphabet::LitLen)?,
            fixed_dist: Encoder::new(&FIXED_DIST_LENS, HuffmanAlphabet::Distance)?,
        })
    }

    /// Write the blocks of `puff` (whole blocks, each from its metadata to its end) to `w`.
    pub(crate) fn huff(&self, puff: &[u8], w: &mut BitWriter) -> Result<(), DeflateError> {
        let mut r = PuffReader { p: puff, i: 0 };
        while r.i < puff.len() {
            let m = r.metadata()?;
            let (&header, rest) = m
                .split_first()
                .ok_or_else(|| r.malformed("empty block metadata"))?;
            let btype = (header >> 5) & 3;
            let padding = header & 0x1f;
            w.write(1, u32::from(header >> 7))?;
            w.write(2, u32::from(btype))?;
            if btype != 0 && padding != 0 {
                return Err(r.malformed("padding bits in a compressed block's header"));
            }
            match btype {
                0 => {
                    if !rest.is_empty() {
                        return Err(r.malformed("stored block metadata past its header byte"));
                    }
                    stored(&mut r, w, padding)?;
                }
                1 => {
                    if !rest.is_empty() {
                        return Err(r.malformed("fixed block metadata past its header byte"));
                    }
                    symbols(&mut r, w, &self.fixed_lit, &self.fixed_dist)?;
                }
                2 => {
                    let (lit, dist) = dynamic_header(rest, w).map_err(|e| match e {
                        DeflateError::PuffMalformed { what, .. } => r.malformed(what),
                        e => e,
                    })?;
                    symbols(&mut r, w, &lit, &dist)?;
                }
                _ => return Err(r.malformed("block type 3 (reserved)")),
            }
        }
        Ok(())
    }
}

/// A stored block after its 3 header bits: padding, LEN, NLEN, the bytes.
fn stored(r: &mut PuffReader<'_>, w: &mut BitWriter, padding: u8) -> Result<(), DeflateError> {
    let pad = w.to_boundary();
    if u32::from(padding) >> pad != 0 {
        return Err(r.malformed("stored block padding bits wider than the padding"));
    }
    w.write(pad, u32::from(padding))?;
    let bytes: &[u8] = match r.data()? {
        Elem::EndOfBlock => &[],
        Elem::Literals(b) => {
            if !matches!(r.data()?, Elem::EndOfBlock) {
                return Err(r.malformed("stored block not ended after its bytes"));
            }
            b
        }
        Elem::Match { .. } => return Err(r.malformed("match in a stored block")),
    };
    let len = u16::try_from(bytes.len())
        .map_err(|_| r.malformed("stored block longer than 65,535 bytes"))?;
    w.write(16, u32::from(len))?;
    w.write(16, u32::from(!len))?;
    w.write_bytes(bytes)
}

/// Literals and matches up to the end of the block.
fn symbols(
    r: &mut PuffReader<'_>,
    w: &mut BitWriter,
    lit: &Encoder,
    dist: &Encoder,
) -> Result<(), DeflateError> {
    loop {
        match r.data()? {
            Elem::Literals(b) => {
                for &x in b {
                    lit.write(w, usize::from(x))?;
                }
            }
            Elem::Match { len, dist: d } => {
                let ls = length_symbol(len);
                lit.write(w, ls)?;
                let i = ls - 257;
                w.write(u32::from(LEN_EXTRA[i]), u32::from(len - LEN_BASE[i]))?;
                let ds = distance_symbol(d);
                dist.write(w, ds)?;
                w.write(u32::from(DIST_EXTRA[ds]), u32::from(d - DIST_BASE[ds]))?;
            }
            Elem::EndOfBlock => return lit.write(w, END_OF_BLOCK),
        }
    }
}

/// Write a dynamic block's header from its metadata (after the header byte) and build its
/// encoders. `PuffMalformed` offsets are fixed up by the caller.
fn dynamic_header(m: &[u8], w: &mut BitWriter) -> Result<(Encoder, Encoder), DeflateError> {
    let bad = |what| DeflateError::PuffMalformed { what, at: 0 };
    let [hlit, hdist, hclen, rest @ ..] = m else {
        return Err(bad("dynamic block metadata shorter than its three counts"));
    };
    let (nlit, ndist, ncl) = (
        usize::from(*hlit) + 257,
        usize::from(*hdist) + 1,
        usize::from(*hclen) + 4,
    );
    if nlit > 286 || ndist > 30 {
        return Err(DeflateError::TooManyCodes { nlit, ndist });
    }
    if ncl > 19 {
        return Err(bad("more than 19 code-length code lengths"));
    }
    w.write(5, u32::from(*hlit))?;
    w.write(5, u32::from(*hdist))?;
    w.write(4, u32::from(*hclen))?;
    let packed = rest.get(..ncl.div_ceil(2)).ok_or(bad(
        "dynamic block metadata ends inside its code-length code",
    ))?;
    let mut cl = [0u8; 19];
    for (i, &slot) in CL_ORDER.iter().enumerate().take(ncl) {
        let byte = packed[i / 2];
        let v = if i % 2 == 0 { byte >> 4 } else { byte & 0x0f };
        if v > 7 {
            return Err(bad("code-length code length over 7"));
        }
        cl[slot] = v;
        w.write(3, u32::from(v))?;
    }
    if ncl % 2 == 1 && packed[ncl / 2] & 0x0f != 0 {
        return Err(bad("bits in the unused nibble of the code-length code"));
    }
    let cl_code = Encoder::new(&cl, HuffmanAlphabet::CodeLengths)?;
    let total = nlit + ndist;
    let mut lens = [0u8; 286 + 30];
    let mut i = 0;
    let mut entries = rest[packed.len()..].iter();
    while i < total {
        let &p = entries
            .next()
            .ok_or(bad("dynamic block metadata ends before its code lengths"))?;
        let (sym, nextra, extra, rep, val) = match p {
            0..=15 => (usize::from(p), 0, 0, 1, p),
            16..=19 => {
                let prev = i
                    .checked_sub(1)
                    .map(|j| lens[j])
                    .ok_or(DeflateError::RepeatWithoutLength)?;
                (16, 2, p - 16, 3 + usize::from(p - 16), prev)
            }
            20..=27 => (17, 3, p - 20, 3 + usize::from(p - 20), 0),
            28..=155 => (18, 7, p - 28, 11 + usize::from(p - 28), 0),
            _ => return Err(bad("code-length entry over 155")),
        };
        cl_code.write(w, sym)?;
        w.write(nextra, u32::from(extra))?;
        if i + rep > total {
            return Err(DeflateError::RepeatOverrun);
        }
        lens[i..i + rep].fill(val);
        i += rep;
    }
    if entries.next().is_some() {
        return Err(bad("dynamic block metadata longer than its code lengths"));
    }
    Ok((
        Encoder::new(&lens[..nlit], HuffmanAlphabet::LitLen)?,
        Encoder::new(&lens[nlit..total], HuffmanAlphabet::Distance)?,
    ))
}

/// Decompress a puff of whole blocks (test scaffolding: checks what puffing decoded against
/// the data a compressor was given), and count its stored, fixed and dynamic blocks. At most
/// `limit` bytes.
#[cfg(any(test, feature = "test-utils"))]
pub(crate) fn inflate(puff: &[u8], limit: usize) -> Result<(Vec<u8>, [usize; 3]), DeflateError> {
    let mut r = PuffReader { p: puff, i: 0 };
    let mut out: Vec<u8> = Vec::new();
    let mut kinds = [0; 3];
    while r.i < puff.len() {
        let m = r.metadata()?;
        if let Some(k) = kinds.get_mut(usize::from((m[0] >> 5) & 3)) {
            *k += 1;
        }
        loop {
            match r.data()? {
                Elem::Literals(b) => out.extend_from_slice(b),
                Elem::Match { len, dist } => {
                    let from = out
                        .len()
                        .checked_sub(usize::from(dist))
                        .ok_or_else(|| r.malformed("match distance before the start"))?;
                    // Overlapping copies repeat the last `dist` bytes: copy in pieces of that.
                    let mut left = usize::from(len);
                    while left > 0 {
                        let n = left.min(usize::from(dist));
                        out.extend_from_within(from..from + n);
                        left -= n;
                    }
                }
                Elem::EndOfBlock => break,
            }
            if out.len() > limit {
                return Err(DeflateError::OutputLimit {
                    limit: limit as u64 * 8,
                });
            }
        }
    }
    Ok((out, kinds))
}
