//! The puff stream of a whole buffer: each deflate bit extent replaced by its puff, the bits
//! between them kept as bytes. Between the end `a` of one deflate (or the buffer's start) and
//! the start `b` of the next (or the buffer's end), the puff stream holds
//! `ceil(b / 8) − floor(a / 8)` bytes, or none when `a == b`: byte `k` holds, from its least
//! significant bit up, the buffer's bits of byte `floor(a / 8) + k` that lie in `[a, b)`. So
//! a deflate that ends inside a byte leaves that byte's remaining bits to the next gap byte,
//! and two deflates that meet inside a byte have no gap byte between them — puffin's layout
//! (`FindPuffLocations` and its stream), which a patch's puff extents must match exactly.

use super::bits::{BitWriter, low_mask};
use super::error::{PuffError, PuffSide};
use super::huff::Huffer;
use super::puff::{Lossy, Puffer};

/// A bit extent `(offset, length)` of a deflate run of blocks, or a byte extent of a puff.
pub(crate) type Extent = (u64, u64);

/// Bytes the puff stream holds for the bits `[a, b)` between two deflates.
pub(crate) fn gap_len(a: u64, b: u64) -> u64 {
    if a >= b { 0 } else { b.div_ceil(8) - a / 8 }
}

/// Check that `deflates` are sorted, non-empty, non-overlapping bit extents inside a buffer of
/// `len` bytes, and return where their puffs of lengths `puff_lens` go and the whole puff
/// stream's length.
pub(crate) fn layout(
    side: PuffSide,
    deflates: &[Extent],
    puff_lens: impl IntoIterator<Item = u64>,
    len: u64,
) -> Result<(Vec<Extent>, u64), PuffError> {
    let bits = len
        .checked_mul(8)
        .ok_or(PuffError::TooLarge { side, len })?;
    let mut puffs = Vec::with_capacity(deflates.len());
    let mut lens = puff_lens.into_iter();
    let (mut a, mut at) = (0u64, 0u64);
    for (index, &(offset, length)) in deflates.iter().enumerate() {
        let end = offset
            .checked_add(length)
            .filter(|&e| length > 0 && offset >= a && e <= bits)
            .ok_or(PuffError::DeflateExtent {
                side,
                index,
                offset,
                length,
                bits,
            })?;
        let plen = lens.next().ok_or(PuffError::ExtentCount {
            side,
            deflates: deflates.len(),
            puffs: index,
        })?;
        at = at
            .checked_add(gap_len(a, offset))
            .ok_or(PuffError::TooLarge { side, len })?;
        puffs.push((at, plen));
        at = at
            .checked_add(plen)
            .ok_or(PuffError::TooLarge { side, len })?;
        a = end;
    }
    let extra = lens.count();
    if extra != 0 {
        return Err(PuffError::ExtentCount {
            side,
            deflates: deflates.len(),
            puffs: deflates.len() + extra,
        });
    }
    let total = at
        .checked_add(gap_len(a, bits))
        .ok_or(PuffError::TooLarge { side, len })?;
    Ok((puffs, total))
}

/// Append the puff-stream bytes of bits `[a, b)` of `data`.
fn push_gap(data: &[u8], a: u64, b: u64, out: &mut Vec<u8>) {
    if a >= b {
        return;
    }
    let mut j = (a / 8) as usize;
    if !a.is_multiple_of(8) {
        let hi = b.min(a / 8 * 8 + 8);
        let byte = u64::from(data.get(j).copied().unwrap_or(0));
        out.push(((byte >> (a % 8)) & low_mask((hi - a) as u32)) as u8);
        j += 1;
        if hi == b {
            return;
        }
    }
    let full = (b / 8) as usize;
    out.extend_from_slice(data.get(j..full).unwrap_or(&[]));
    if !b.is_multiple_of(8) {
        let byte = u64::from(data.get(full).copied().unwrap_or(0));
        out.push((byte & low_mask((b % 8) as u32)) as u8);
    }
}

/// The puff stream of `data` for its deflate extents and their puff extents (checked by
/// [`layout`] against `puff_len` already), in `out` (cleared; room reserved in it beforehand is
/// used): every puff must have exactly its extent's length. Returns the stream and whether any
/// puff lost bits (see [`Lossy`]).
pub(crate) fn puff_stream(
    side: PuffSide,
    data: &[u8],
    deflates: &[Extent],
    puffs: &[Extent],
    puff_len: u64,
    mut out: Vec<u8>,
) -> Result<(Vec<u8>, Lossy), PuffError> {
    let mut puffer = Puffer::new().map_err(PuffError::Internal)?;
    out.clear();
    let mut lossy = Lossy::default();
    let mut a = 0u64;
    for (index, (&(offset, length), &(poff, plen))) in deflates.iter().zip(puffs).enumerate() {
        push_gap(data, a, offset, &mut out);
        debug_assert_eq!(out.len() as u64, poff);
        let l = puffer
            .puff(data, offset, offset + length, &mut out, plen)
            .map_err(|source| PuffError::Deflate {
                side,
                index,
                offset,
                length,
                source,
            })?;
        lossy.long_284 |= l.long_284;
        lossy.wide_padding |= l.wide_padding;
        let found = out.len() as u64 - poff;
        if found != plen {
            return Err(PuffError::PuffSize {
                side,
                index,
                expected: plen,
                found,
            });
        }
        a = offset + length;
    }
    push_gap(data, a, data.len() as u64 * 8, &mut out);
    debug_assert_eq!(out.len() as u64, puff_len);
    Ok((out, lossy))
}

/// Write the gap bytes `g` as bits `[a, b)`; bits of `g` outside that range must be zero
/// (puffing leaves them so), and `g` must be exactly the gap's bytes.
fn write_gap(g: &[u8], a: u64, b: u64, w: &mut BitWriter) -> Result<(), PuffError> {
    let bad = |at| PuffError::GapBits { at };
    let mut g = g;
    let mut a = a;
    if a < b && !a.is_multiple_of(8) {
        let hi = b.min(a / 8 * 8 + 8);
        let n = (hi - a) as u32;
        let (&first, rest) = g.split_first().ok_or(bad(a))?;
        if u64::from(first) >> n != 0 {
            return Err(bad(a));
        }
        w.write(n, u32::from(first)).map_err(PuffError::Output)?;
        g = rest;
        a = hi;
    }
    if a < b {
        let full = usize::try_from(b / 8 - a / 8).map_err(|_| bad(a))?;
        let (bytes, rest) = g.split_at_checked(full).ok_or(bad(a))?;
        w.write_bytes(bytes).map_err(PuffError::Output)?;
        g = rest;
        if !b.is_multiple_of(8) {
            let (&last, rest) = g.split_first().ok_or(bad(b / 8 * 8))?;
            if u64::from(last) >> (b % 8) != 0 {
                return Err(bad(b / 8 * 8));
            }
            w.write((b % 8) as u32, u32::from(last))
                .map_err(PuffError::Output)?;
            g = rest;
        }
    }
    if !g.is_empty() {
        return Err(bad(b));
    }
    Ok(())
}

/// Deflate bytes from a puff stream (whose layout [`layout`] checked): `len` bytes in `out`
/// (cleared; room reserved in it beforehand is used), each deflate extent re-encoded from its
/// puff to exactly its bit length.
pub(crate) fn huff_stream(
    puff: &[u8],
    deflates: &[Extent],
    puffs: &[Extent],
    len: u64,
    out: Vec<u8>,
) -> Result<Vec<u8>, PuffError> {
    let huffer = Huffer::new().map_err(PuffError::Internal)?;
    let bits = len.saturating_mul(8);
    let mut w = BitWriter::with_vec(out, bits);
    let mut a = 0u64;
    let mut p = 0u64;
    // The layout was checked against the puff stream's length: these slices are inside.
    let slice = |from: u64, n: u64| -> Result<&[u8], PuffError> {
        let end = from.saturating_add(n);
        usize::try_from(from)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(f, e)| puff.get(f..e))
            .ok_or(PuffError::PatchedSize {
                expected: end,
                found: puff.len() as u64,
            })
    };
    for (index, (&(offset, length), &(poff, plen))) in deflates.iter().zip(puffs).enumerate() {
        write_gap(slice(p, poff.saturating_sub(p))?, a, offset, &mut w)?;
        debug_assert_eq!(w.bits(), offset);
        huffer
            .huff(slice(poff, plen)?, &mut w)
            .map_err(|source| PuffError::Huff {
                index,
                offset,
                length,
                source,
            })?;
        let found = w.bits() - offset;
        if found != length {
            return Err(PuffError::HuffLength {
                index,
                expected: length,
                found,
            });
        }
        a = offset + length;
        p = poff.saturating_add(plen);
    }
    write_gap(
        slice(p, (puff.len() as u64).saturating_sub(p))?,
        a,
        bits,
        &mut w,
    )?;
    debug_assert_eq!(w.bits(), bits);
    Ok(w.finish())
}

/// Bit extents of the compressed blocks of the deflate stream starting at byte `start` of
/// `data`, as puffin's generator finds them; and the byte just past the stream.
#[cfg(any(test, feature = "test-utils"))]
pub(crate) fn locate(data: &[u8], start: usize) -> Result<(Vec<Extent>, usize), PuffError> {
    let mut puffer = Puffer::new().map_err(PuffError::Internal)?;
    let (found, end) =
        puffer
            .locate(data, start as u64 * 8)
            .map_err(|source| PuffError::Deflate {
                side: PuffSide::Source,
                index: 0,
                offset: start as u64 * 8,
                length: 0,
                source,
            })?;
    Ok((found, end.div_ceil(8) as usize))
}
