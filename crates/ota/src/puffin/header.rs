//! The PUFFDIFF patch container: `PUF1`, a big-endian u32 header length, a `PatchHeader`
//! protobuf (puffin's `puffin.metadata` package, proto3), then the inner patch. The messages
//! are declared here by hand from their field numbers and decoded with `prost`'s derive.

use prost::Message;

use super::error::{PuffError, PuffSide};
use super::stream::Extent;

/// The patch magic.
pub(crate) const MAGIC: [u8; 4] = *b"PUF1";

/// `BitExtent`: `length` bits from bit `offset` (puff extents too are stored in bits).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub(crate) struct BitExtent {
    /// First bit (field 1).
    #[prost(uint64, tag = "1")]
    pub(crate) offset: u64,
    /// Bits (field 2).
    #[prost(uint64, tag = "2")]
    pub(crate) length: u64,
}

/// `StreamInfo`: one side's deflate extents (bits), puff extents (bits, whole bytes) and the
/// length of the whole puff stream (bytes).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub(crate) struct StreamInfo {
    /// Field 1.
    #[prost(message, repeated, tag = "1")]
    pub(crate) deflates: Vec<BitExtent>,
    /// Field 2.
    #[prost(message, repeated, tag = "2")]
    pub(crate) puffs: Vec<BitExtent>,
    /// Field 3.
    #[prost(uint64, tag = "3")]
    pub(crate) puff_length: u64,
}

/// `PatchHeader`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub(crate) struct PatchHeader {
    /// Field 1: 1 as puffin writes it; puffin's applier does not check it.
    #[prost(int32, tag = "1")]
    pub(crate) version: i32,
    /// Field 2.
    #[prost(message, optional, tag = "2")]
    pub(crate) src: Option<StreamInfo>,
    /// Field 3.
    #[prost(message, optional, tag = "3")]
    pub(crate) dst: Option<StreamInfo>,
    /// Field 4: 0 BSDIFF, 1 ZUCCHINI.
    #[prost(int32, tag = "4")]
    pub(crate) r#type: i32,
}

/// One side of a decoded patch: deflate bit extents, puff byte extents, puff stream length.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stream {
    pub(crate) deflates: Vec<Extent>,
    pub(crate) puffs: Vec<Extent>,
    pub(crate) puff_len: u64,
}

/// A decoded patch.
#[derive(Debug)]
pub(crate) struct Patch<'a> {
    pub(crate) src: Stream,
    pub(crate) dst: Stream,
    pub(crate) inner: &'a [u8],
}

impl Stream {
    fn from_info(side: PuffSide, info: Option<StreamInfo>) -> Result<Stream, PuffError> {
        let info = info.unwrap_or_default();
        let puffs = info
            .puffs
            .iter()
            .enumerate()
            .map(|(index, e)| {
                if e.offset % 8 != 0 || e.length % 8 != 0 {
                    return Err(PuffError::PuffNotBytes {
                        side,
                        index,
                        offset: e.offset,
                        length: e.length,
                    });
                }
                Ok((e.offset / 8, e.length / 8))
            })
            .collect::<Result<_, _>>()?;
        Ok(Stream {
            deflates: info.deflates.iter().map(|e| (e.offset, e.length)).collect(),
            puffs,
            puff_len: info.puff_length,
        })
    }

    #[cfg(any(test, feature = "test-utils"))]
    fn to_info(&self) -> StreamInfo {
        let ext = |&(offset, length): &Extent| BitExtent { offset, length };
        StreamInfo {
            deflates: self.deflates.iter().map(ext).collect(),
            puffs: self
                .puffs
                .iter()
                .map(|&(o, l)| BitExtent {
                    offset: o * 8,
                    length: l * 8,
                })
                .collect(),
            puff_length: self.puff_len,
        }
    }
}

/// Split and decode a patch. The header's numbers are not checked against anything here.
pub(crate) fn parse(patch: &[u8]) -> Result<Patch<'_>, PuffError> {
    let (Some(magic), Some(size)) = (patch.first_chunk::<4>(), patch.get(4..8)) else {
        return Err(PuffError::ShortPatch { len: patch.len() });
    };
    if *magic != MAGIC {
        return Err(PuffError::BadMagic { found: *magic });
    }
    let header = u32::from_be_bytes([size[0], size[1], size[2], size[3]]);
    let rest = &patch[8..];
    let (h, inner) = usize::try_from(header)
        .ok()
        .and_then(|n| rest.split_at_checked(n))
        .ok_or(PuffError::HeaderPastEnd {
            header,
            left: rest.len(),
        })?;
    let h = PatchHeader::decode(h).map_err(PuffError::Header)?;
    match h.r#type {
        0 => {}
        1 => {
            return Err(PuffError::UnsupportedType {
                name: "ZUCCHINI".into(),
            });
        }
        t => {
            return Err(PuffError::UnsupportedType {
                name: t.to_string(),
            });
        }
    }
    if h.version != 1 {
        log::debug!("PUFFDIFF header version {} (puffin writes 1)", h.version);
    }
    Ok(Patch {
        src: Stream::from_info(PuffSide::Source, h.src)?,
        dst: Stream::from_info(PuffSide::Destination, h.dst)?,
        inner,
    })
}

/// A whole patch: magic, header, `inner`.
#[cfg(any(test, feature = "test-utils"))]
pub(crate) fn write(src: &Stream, dst: &Stream, inner: &[u8]) -> Vec<u8> {
    let h = PatchHeader {
        version: 1,
        src: Some(src.to_info()),
        dst: Some(dst.to_info()),
        r#type: 0,
    }
    .encode_to_vec();
    let mut out = Vec::with_capacity(8 + h.len() + inner.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&(h.len() as u32).to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(inner);
    out
}
