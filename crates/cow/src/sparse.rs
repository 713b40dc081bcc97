//! Android sparse image format (`img2simg` output): detection and expansion to a raw image.
//!
//! Layout: a 28-byte file header (magic `0xed26ff3a`, version 1.0, block size, total blocks,
//! chunk count) followed by chunks, each with a 12-byte header: RAW (data follows), FILL
//! (4-byte pattern), DONT_CARE (zeros here), CRC32 (4 bytes, ignored).

use crate::error::{CowError, Result, io_at};
use crate::io::ReadAt;

/// Sparse file magic.
pub(crate) const SPARSE_MAGIC: u32 = 0xed26_ff3a;
const CHUNK_RAW: u16 = 0xcac1;
const CHUNK_FILL: u16 = 0xcac2;
const CHUNK_DONT_CARE: u16 = 0xcac3;
const CHUNK_CRC32: u16 = 0xcac4;

/// Parsed sparse header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SparseHeader {
    pub block_size: u32,
    pub total_blocks: u32,
    pub total_chunks: u32,
    pub file_header_size: u16,
    pub chunk_header_size: u16,
}

fn bad(offset: u64, reason: &'static str) -> CowError {
    CowError::BadOp {
        index: 0,
        offset,
        reason,
    }
}

/// True if `src` starts with the sparse magic.
pub(crate) fn is_sparse<R: ReadAt + ?Sized>(src: &R) -> bool {
    let mut m = [0u8; 4];
    src.read_exact_at(0, &mut m).is_ok() && u32::from_le_bytes(m) == SPARSE_MAGIC
}

/// Parse the sparse file header.
pub(crate) fn parse_header(b: &[u8]) -> Result<SparseHeader> {
    if b.len() < 28 {
        return Err(CowError::Truncated {
            what: "sparse header",
            offset: 0,
            need: 28,
            len: b.len() as u64,
        });
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    if u32_at(0) != SPARSE_MAGIC {
        return Err(bad(0, "not a sparse image (bad magic)"));
    }
    if u16_at(4) != 1 {
        return Err(bad(4, "unsupported sparse major version"));
    }
    let h = SparseHeader {
        file_header_size: u16_at(8),
        chunk_header_size: u16_at(10),
        block_size: u32_at(12),
        total_blocks: u32_at(16),
        total_chunks: u32_at(20),
    };
    if h.file_header_size < 28 || h.chunk_header_size < 12 {
        return Err(bad(8, "sparse header sizes too small"));
    }
    if h.block_size == 0 || !h.block_size.is_multiple_of(4) {
        return Err(bad(
            12,
            "sparse block size must be a non-zero multiple of 4",
        ));
    }
    Ok(h)
}

/// Expand a sparse image into raw bytes. `max_len` bounds the output size (the header's
/// block count is untrusted); exceeding it, or failing to reserve memory, is an error.
pub(crate) fn expand<R: ReadAt + ?Sized>(src: &R, max_len: u64) -> Result<Vec<u8>> {
    let file_len = src.size().map_err(io_at(0))?;
    let mut hb = [0u8; 28];
    src.read_exact_at(0, &mut hb)
        .map_err(|_| CowError::Truncated {
            what: "sparse header",
            offset: 0,
            need: 28,
            len: file_len,
        })?;
    let h = parse_header(&hb)?;
    let bs = u64::from(h.block_size);
    let total = u64::from(h.total_blocks) * bs;
    if total > max_len {
        return Err(CowError::InvalidArgument(format!(
            "sparse image expands to {total} bytes, more than the allowed {max_len}"
        )));
    }
    let mut out: Vec<u8> = Vec::new();
    out.try_reserve_exact(total as usize)
        .map_err(|_| CowError::InvalidArgument(format!("cannot allocate {total} bytes")))?;
    let mut pos = u64::from(h.file_header_size);
    for _ in 0..h.total_chunks {
        let mut ch = [0u8; 12];
        src.read_exact_at(pos, &mut ch)
            .map_err(|_| CowError::Truncated {
                what: "sparse chunk header",
                offset: pos,
                need: 12,
                len: file_len,
            })?;
        let ctype = u16::from_le_bytes([ch[0], ch[1]]);
        let blocks = u64::from(u32::from_le_bytes([ch[4], ch[5], ch[6], ch[7]]));
        let total_sz = u64::from(u32::from_le_bytes([ch[8], ch[9], ch[10], ch[11]]));
        let data_off = pos + u64::from(h.chunk_header_size);
        let data_len = total_sz
            .checked_sub(u64::from(h.chunk_header_size))
            .ok_or(bad(pos, "chunk total size smaller than its header"))?;
        let out_len = blocks * bs;
        if ctype != CHUNK_CRC32 && out.len() as u64 + out_len > total {
            return Err(bad(
                pos,
                "chunks cover more blocks than the header declares",
            ));
        }
        match ctype {
            CHUNK_RAW => {
                if data_len != out_len {
                    return Err(bad(pos, "RAW chunk size mismatch"));
                }
                if data_off.checked_add(data_len).is_none_or(|e| e > file_len) {
                    return Err(CowError::Truncated {
                        what: "sparse RAW chunk",
                        offset: data_off,
                        need: data_len,
                        len: file_len,
                    });
                }
                let s = out.len();
                out.resize(s + out_len as usize, 0);
                src.read_exact_at(data_off, &mut out[s..])
                    .map_err(io_at(data_off))?;
            }
            CHUNK_FILL => {
                if data_len != 4 {
                    return Err(bad(pos, "FILL chunk must carry 4 bytes"));
                }
                let mut p = [0u8; 4];
                src.read_exact_at(data_off, &mut p)
                    .map_err(io_at(data_off))?;
                let s = out.len();
                out.resize(s + out_len as usize, 0);
                for c in out[s..].chunks_exact_mut(4) {
                    c.copy_from_slice(&p);
                }
            }
            CHUNK_DONT_CARE => {
                if data_len != 0 {
                    return Err(bad(pos, "DONT_CARE chunk carries data"));
                }
                out.resize(out.len() + out_len as usize, 0);
            }
            CHUNK_CRC32 => {
                if data_len != 4 {
                    return Err(bad(pos, "CRC32 chunk must carry 4 bytes"));
                }
            }
            _ => return Err(bad(pos, "unknown sparse chunk type")),
        }
        pos = data_off + data_len;
    }
    if out.len() as u64 != total {
        return Err(bad(
            pos,
            "chunks cover fewer blocks than the header declares",
        ));
    }
    Ok(out)
}

/// Build a sparse image from raw bytes (RAW / FILL / DONT_CARE for zero runs). Used by tests and
/// tools; not byte-identical to `img2simg` but readable by it.
#[cfg(test)]
fn encode(raw: &[u8], block_size: u32) -> Vec<u8> {
    let bs = block_size as usize;
    let nblocks = raw.len().div_ceil(bs);
    let mut chunks: Vec<u8> = Vec::new();
    let mut nchunks = 0u32;
    let block = |i: usize| -> Vec<u8> {
        let mut b = raw[i * bs..((i + 1) * bs).min(raw.len())].to_vec();
        b.resize(bs, 0);
        b
    };
    let fill_of = |b: &[u8]| -> Option<[u8; 4]> {
        let p = [b[0], b[1], b[2], b[3]];
        b.chunks_exact(4).all(|c| c == p).then_some(p)
    };
    let mut i = 0;
    while i < nblocks {
        let b = block(i);
        let mut j = i + 1;
        if let Some(p) = fill_of(&b) {
            while j < nblocks && fill_of(&block(j)) == Some(p) {
                j += 1;
            }
            let n = (j - i) as u32;
            if p == [0; 4] {
                chunks.extend_from_slice(&CHUNK_DONT_CARE.to_le_bytes());
                chunks.extend_from_slice(&[0, 0]);
                chunks.extend_from_slice(&n.to_le_bytes());
                chunks.extend_from_slice(&12u32.to_le_bytes());
            } else {
                chunks.extend_from_slice(&CHUNK_FILL.to_le_bytes());
                chunks.extend_from_slice(&[0, 0]);
                chunks.extend_from_slice(&n.to_le_bytes());
                chunks.extend_from_slice(&16u32.to_le_bytes());
                chunks.extend_from_slice(&p);
            }
        } else {
            while j < nblocks && fill_of(&block(j)).is_none() {
                j += 1;
            }
            let n = (j - i) as u32;
            chunks.extend_from_slice(&CHUNK_RAW.to_le_bytes());
            chunks.extend_from_slice(&[0, 0]);
            chunks.extend_from_slice(&n.to_le_bytes());
            chunks.extend_from_slice(&(12 + n * block_size).to_le_bytes());
            for k in i..j {
                chunks.extend_from_slice(&block(k));
            }
        }
        nchunks += 1;
        i = j;
    }
    let mut out = Vec::with_capacity(28 + chunks.len());
    out.extend_from_slice(&SPARSE_MAGIC.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&28u16.to_le_bytes());
    out.extend_from_slice(&12u16.to_le_bytes());
    out.extend_from_slice(&block_size.to_le_bytes());
    out.extend_from_slice(&(nblocks as u32).to_le_bytes());
    out.extend_from_slice(&nchunks.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&chunks);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let mut raw = vec![0u8; 4096 * 10];
        raw[4096 * 2..4096 * 3].fill(7);
        for (i, b) in raw[4096 * 5..4096 * 7].iter_mut().enumerate() {
            *b = (i * 31 % 256) as u8;
        }
        let sp = encode(&raw, 4096);
        assert!(is_sparse(sp.as_slice()));
        assert_eq!(expand(sp.as_slice(), 1 << 30).unwrap(), raw);
        // Bounded: a header promising more than max_len is refused before allocating.
        assert!(expand(sp.as_slice(), 4096).is_err());
        // Truncations never panic.
        for n in 0..sp.len() {
            let _ = expand(&sp[..n], 1 << 30);
        }
    }
}
