//! The payload (`payload.bin`, update_engine's "CrAU" format, major version 2): the header,
//! the manifest and the regions they name, every size checked against the payload's length
//! before anything is read or allocated.
//!
//! ```text
//! 0   "CrAU"                       4 bytes
//! 4   major version (2)            u64, big-endian
//! 12  manifest size M              u64, big-endian
//! 20  metadata signature size S    u32, big-endian
//! 24  manifest (DeltaArchiveManifest)          M bytes
//! 24+M  metadata signature (Signatures)        S bytes
//! 24+M+S  data area: op blobs (data_offset is relative to it), then the payload signature
//! ```

use std::fmt;
use std::io;

use prost::Message;
use sha2::{Digest, Sha256};

use crate::error::{OtaError, Result};
use crate::proto::{DeltaArchiveManifest, Signatures};
use crate::source::Source;
use snapblk_core::ReadAt;

/// Length of the fixed header of a major-version-2 payload.
pub const HEADER_LEN: u64 = 24;
/// The payload magic.
pub const MAGIC: [u8; 4] = *b"CrAU";
/// The only major version Android uses (1 was Chrome OS's).
pub const MAJOR_VERSION: u64 = 2;
/// Largest manifest accepted, in bytes (an incremental OTA of a large device has a few tens of
/// MiB of manifest); a larger size is refused before anything is allocated.
pub const MAX_MANIFEST: u64 = 256 << 20;

/// Chunk size of sequential reads (hashing the payload).
const CHUNK: usize = 1 << 20;

/// The fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Header {
    /// Major version (always [`MAJOR_VERSION`] after a successful open).
    pub major_version: u64,
    /// Manifest size in bytes.
    pub manifest_size: u64,
    /// Size of the metadata signature in bytes (0: unsigned metadata).
    pub metadata_signature_size: u32,
}

/// A payload opened for reading: header and manifest decoded and bounds-checked; the data
/// blobs are read on demand with positional reads.
pub struct Payload {
    src: Box<dyn Source>,
    header: Header,
    manifest: DeltaArchiveManifest,
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Payload")
            .field("len", &self.len())
            .field("header", &self.header)
            .field("partitions", &self.manifest.partitions.len())
            .finish()
    }
}

/// `a + b`, saturated (for error messages about regions past the end).
fn end(a: u64, b: u64) -> u64 {
    a.saturating_add(b)
}

impl Payload {
    /// Parse a payload held in memory (tests, fuzzing, small payloads).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Payload> {
        Payload::from_source(Box::new(bytes))
    }

    /// Parse the payload `src` holds.
    pub(crate) fn from_source(src: Box<dyn Source>) -> Result<Payload> {
        let len = src.len();
        if len < HEADER_LEN {
            return Err(OtaError::ShortHeader {
                len,
                need: HEADER_LEN,
            });
        }
        let mut h = [0u8; HEADER_LEN as usize];
        src.read_exact_at(0, &mut h)
            .map_err(|source| OtaError::Read { offset: 0, source })?;
        let be64 = |i: usize| u64::from_be_bytes(h[i..i + 8].try_into().unwrap_or([0; 8]));
        let magic: [u8; 4] = h[..4].try_into().unwrap_or([0; 4]);
        if magic != MAGIC {
            return Err(OtaError::BadMagic { found: magic });
        }
        let major_version = be64(4);
        if major_version != MAJOR_VERSION {
            return Err(OtaError::BadVersion {
                major: major_version,
            });
        }
        let header = Header {
            major_version,
            manifest_size: be64(12),
            metadata_signature_size: u32::from_be_bytes(h[20..24].try_into().unwrap_or([0; 4])),
        };
        let m = header.manifest_size;
        if end(HEADER_LEN, m) > len {
            return Err(OtaError::PastEnd {
                what: "manifest",
                end: end(HEADER_LEN, m),
                len,
            });
        }
        if m > MAX_MANIFEST {
            return Err(OtaError::ManifestTooLarge {
                size: m,
                limit: MAX_MANIFEST,
            });
        }
        let sig_end = HEADER_LEN + m + u64::from(header.metadata_signature_size);
        if sig_end > len {
            return Err(OtaError::PastEnd {
                what: "metadata signature",
                end: sig_end,
                len,
            });
        }
        let mut buf = vec![0u8; m as usize];
        src.read_exact_at(HEADER_LEN, &mut buf)
            .map_err(|source| OtaError::Read {
                offset: HEADER_LEN,
                source,
            })?;
        let manifest = DeltaArchiveManifest::decode(buf.as_slice()).map_err(OtaError::Manifest)?;
        let bs = manifest.block_size();
        if !bs.is_power_of_two() || !(512..=1 << 20).contains(&bs) {
            return Err(OtaError::BadBlockSize(bs));
        }
        let p = Payload {
            src,
            header,
            manifest,
        };
        if let Some((at, n)) = p.signatures_range()
            && end(at, n) > len
        {
            return Err(OtaError::PastEnd {
                what: "payload signature",
                end: end(at, n),
                len,
            });
        }
        Ok(p)
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The manifest.
    pub fn manifest(&self) -> &DeltaArchiveManifest {
        &self.manifest
    }

    /// Length of the payload in bytes.
    pub fn len(&self) -> u64 {
        self.src.len()
    }

    /// Whether the payload has no bytes (never true for an opened payload).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Block size in bytes (a power of two, 512..=1 MiB; Android's is 4096).
    pub fn block_size(&self) -> u32 {
        self.manifest.block_size()
    }

    /// Minor version: 0 for a full payload.
    pub fn minor_version(&self) -> u32 {
        self.manifest.minor_version()
    }

    /// Whether this is a full payload (minor version 0): every partition is written from the
    /// payload alone.
    pub fn is_full(&self) -> bool {
        self.minor_version() == 0
    }

    /// Size of the metadata, header plus manifest (`METADATA_SIZE` of `payload_properties.txt`;
    /// what the metadata signature signs).
    pub fn metadata_size(&self) -> u64 {
        HEADER_LEN + self.header.manifest_size
    }

    /// Offset of the data area (op blobs' `data_offset` counts from here).
    pub fn data_start(&self) -> u64 {
        self.metadata_size() + u64::from(self.header.metadata_signature_size)
    }

    /// Bytes from the data area's start to the end of the payload.
    pub fn data_len(&self) -> u64 {
        self.len().saturating_sub(self.data_start())
    }

    /// Payload offset and size of the payload signature blob, when the manifest names one.
    pub fn signatures_range(&self) -> Option<(u64, u64)> {
        let m = &self.manifest;
        if m.signatures_offset.is_none() && m.signatures_size.is_none() {
            return None;
        }
        Some((
            end(self.data_start(), m.signatures_offset()),
            m.signatures_size(),
        ))
    }

    /// The metadata signature, decoded (`None` when the payload has none).
    pub fn metadata_signatures(&self) -> Result<Option<Signatures>> {
        let n = self.header.metadata_signature_size as usize;
        if n == 0 {
            return Ok(None);
        }
        let mut buf = vec![0u8; n];
        self.read_exact_at(self.metadata_size(), &mut buf)?;
        Signatures::decode(buf.as_slice())
            .map(Some)
            .map_err(OtaError::Manifest)
    }

    /// SHA-256 of the metadata (`METADATA_HASH`).
    pub fn metadata_sha256(&self) -> Result<[u8; 32]> {
        self.sha256_of(0, self.metadata_size(), &mut |_| {})
    }

    /// SHA-256 of the whole payload (`FILE_HASH`): one sequential pass; `progress` gets the
    /// bytes of each chunk read.
    pub fn file_sha256(&self, progress: &mut dyn FnMut(u64)) -> Result<[u8; 32]> {
        self.sha256_of(0, self.len(), progress)
    }

    fn sha256_of(&self, from: u64, len: u64, progress: &mut dyn FnMut(u64)) -> Result<[u8; 32]> {
        let mut h = Sha256::new();
        let mut buf = vec![0u8; CHUNK.min(len as usize)];
        let mut at = from;
        let stop = from + len;
        while at < stop {
            let n = (stop - at).min(CHUNK as u64) as usize;
            self.read_exact_at(at, &mut buf[..n])?;
            h.update(&buf[..n]);
            progress(n as u64);
            at += n as u64;
        }
        Ok(h.finalize().into())
    }

    /// Read `buf.len()` bytes at payload offset `offset`.
    pub(crate) fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.src
            .read_exact_at(offset, buf)
            .map_err(|source| OtaError::Read { offset, source })
    }

    /// Read at payload offset `offset` (may be short).
    pub(crate) fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.src.read_at(offset, buf)
    }
}
