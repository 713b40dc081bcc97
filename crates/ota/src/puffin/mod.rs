//! PUFFDIFF, the patch of update_engine's operation type 9, in the format of ChromiumOS's
//! puffin (`external/puffin`), written from its format, not its code.
//!
//! A PUFFDIFF turns the source's deflate streams into "puffs" — a byte-aligned form of each
//! deflate block that keeps everything needed to write its exact bits again — applies a
//! bsdiff patch to the source's puff stream, and re-encodes ("huffs") the patched puff stream
//! back into deflate bits. The deflate streams are located by the generator (as bit extents of
//! each compressed block of the zip, gzip or zlib files of the partition) and listed in the
//! patch's header; the applier only follows the lists.
//!
//! * `bits.rs`: bit reader and writer, `huffman.rs`: canonical codes, `puff.rs` and `huff.rs`:
//!   one run of blocks each way, `stream.rs`: a whole buffer's puff stream and its layout,
//!   `header.rs`: the `PUF1` container.
//! * Every number of the patch is checked before it is used: the deflate extents lie in the
//!   buffer, sorted and disjoint; the puff extents are exactly where the layout puts them and
//!   each puff has its declared size; no puff stream is longer than [`MAX_PUFF_RATIO`] bytes
//!   per byte of its buffer; the output is exactly `dst_len` bytes and never grows past it.

mod bits;
mod error;
mod header;
mod huff;
mod huffman;
mod puff;
mod stream;
#[cfg(feature = "test-utils")]
pub mod testing;
#[cfg(test)]
mod tests;

pub use error::{DeflateError, PuffError, PuffSide};
pub use huffman::HuffmanAlphabet;

use stream::{huff_stream, layout, puff_stream};

/// Largest puff stream accepted per byte of its buffer (plus 64 bytes): a puff takes at most
/// two bytes per deflate bit (a match of two one-bit codes is four bytes), so 16 per byte.
pub const MAX_PUFF_RATIO: u64 = 17;

/// Apply the PUFFDIFF `patch` to `src` (the concatenated bytes of the operation's source
/// extents), giving the `dst_len` bytes of its destination extents.
///
/// `bspatch(old, patch, new_len, new)` applies the inner bsdiff patch (BSDIFF40 or BSDF2) to
/// the source's puff stream `old`, appending exactly `new_len` bytes to `new` (the length the
/// patch header declares, bounded by [`MAX_PUFF_RATIO`]; `new` is empty and has room for them).
///
/// Memory: `src`, its puff stream, the patched puff stream and the output, at most all at
/// once; each is reserved at its checked size before it is written, and a failed reservation
/// is [`PuffError::NoMemory`], not an abort.
pub fn apply_puffdiff<F, E>(
    src: &[u8],
    patch: &[u8],
    dst_len: u64,
    bspatch: F,
) -> Result<Vec<u8>, PuffError>
where
    F: FnOnce(&[u8], &[u8], u64, &mut Vec<u8>) -> Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    let p = header::parse(patch)?;
    let src_len = src.len() as u64;
    check_stream(PuffSide::Source, &p.src, src_len)?;
    check_stream(PuffSide::Destination, &p.dst, dst_len)?;
    let (old, lossy) = puff_stream(
        PuffSide::Source,
        src,
        &p.src.deflates,
        &p.src.puffs,
        p.src.puff_len,
        reserve(p.src.puff_len)?,
    )?;
    if lossy != puff::Lossy::default() {
        log::debug!("PUFFDIFF source puffs lose bits ({lossy:?}), as puffin's do");
    }
    let mut new = reserve(p.dst.puff_len)?;
    bspatch(&old, p.inner, p.dst.puff_len, &mut new)
        .map_err(|e| PuffError::Bspatch(Box::new(e)))?;
    drop(old);
    if new.len() as u64 != p.dst.puff_len {
        return Err(PuffError::PatchedSize {
            expected: p.dst.puff_len,
            found: new.len() as u64,
        });
    }
    huff_stream(
        &new,
        &p.dst.deflates,
        &p.dst.puffs,
        dst_len,
        reserve(dst_len)?,
    )
}

/// An empty vector with room for `n` bytes, or [`PuffError::NoMemory`].
fn reserve(n: u64) -> Result<Vec<u8>, PuffError> {
    let mut v = Vec::new();
    match usize::try_from(n) {
        Ok(k) if v.try_reserve_exact(k).is_ok() => Ok(v),
        _ => Err(PuffError::NoMemory { bytes: n }),
    }
}

/// The puff stream bound for a buffer of `len` bytes.
fn puff_limit(len: u64) -> u64 {
    len.saturating_mul(MAX_PUFF_RATIO).saturating_add(64)
}

/// Check one side of a patch against its buffer length: the limit, the deflate extents, and
/// the puff extents and length against the layout the deflates and puff sizes make.
fn check_stream(side: PuffSide, s: &header::Stream, len: u64) -> Result<(), PuffError> {
    let limit = puff_limit(len);
    if s.puff_len > limit {
        return Err(PuffError::PuffTooLarge {
            side,
            found: s.puff_len,
            limit,
            len,
        });
    }
    if s.deflates.len() != s.puffs.len() {
        return Err(PuffError::ExtentCount {
            side,
            deflates: s.deflates.len(),
            puffs: s.puffs.len(),
        });
    }
    let (puffs, total) = layout(side, &s.deflates, s.puffs.iter().map(|p| p.1), len)?;
    for (index, (want, got)) in puffs.iter().zip(&s.puffs).enumerate() {
        if want.0 != got.0 {
            return Err(PuffError::PuffLocation {
                side,
                index,
                expected: want.0,
                found: got.0,
            });
        }
    }
    if total != s.puff_len {
        return Err(PuffError::PuffLength {
            side,
            expected: total,
            found: s.puff_len,
        });
    }
    Ok(())
}
