//! Where the payload comes from: a bare `payload.bin`, or an OTA zip whose stored
//! `payload.bin` entry is read in place (no temporary copy; zip64 through the `zip` crate,
//! which reads only the directory and the entry's local header here). Also finds
//! `payload_properties.txt`: in the zip, or beside a bare payload.

use std::fs::File;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use snapblk_core::ReadAt;

use crate::error::{OtaError, Result};
use crate::payload::{MAGIC, Payload};
use crate::properties::Properties;
use crate::source::{FileSlice, ReadAtCursor, Source, SourceSlice};

/// Name of the payload entry in an OTA zip.
pub const PAYLOAD_ENTRY: &str = "payload.bin";
/// Name of the properties file (in the zip, or beside a bare payload).
pub const PROPERTIES_NAME: &str = "payload_properties.txt";
/// Largest `payload_properties.txt` read (it has four short lines, a few more in streaming
/// OTAs).
const MAX_PROPERTIES: u64 = 64 << 10;

/// How the payload is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Container {
    /// A bare `payload.bin`.
    Bare,
    /// The stored `payload.bin` entry of a zip.
    Zip {
        /// Offset of the entry's data in the zip file.
        payload_offset: u64,
    },
}

/// Where `payload_properties.txt` came from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PropertiesOrigin {
    /// The zip's entry.
    Zip,
    /// A file beside the bare payload.
    File {
        /// Its path.
        path: PathBuf,
    },
}

/// An opened OTA: the payload, how it is stored, and its properties file if there is one.
#[derive(Debug)]
pub struct Ota {
    payload: Payload,
    container: Container,
    properties: Option<(Properties, PropertiesOrigin)>,
}

impl Ota {
    /// Open `path`, an OTA zip or a bare payload (told apart by their first bytes).
    pub fn open(path: &Path) -> Result<Ota> {
        let file = File::open(path).map_err(OtaError::Open)?;
        let len = file.metadata().map_err(OtaError::Open)?.len();
        let mut magic = [0u8; 4];
        let n =
            std::os::unix::fs::FileExt::read_at(&file, &mut magic, 0).map_err(OtaError::Open)?;
        if n == 4 && magic == MAGIC {
            let props = beside(path)?;
            let payload = Payload::from_source(Box::new(FileSlice { file, base: 0, len }))?;
            return Ok(Ota {
                payload,
                container: Container::Bare,
                properties: props,
            });
        }
        if n < 4 || &magic[..2] != b"PK" {
            return Err(OtaError::NotOta);
        }
        let reader = file.try_clone().map_err(OtaError::Open)?;
        open_zip(reader, len, move |base, len| {
            Box::new(FileSlice { file, base, len })
        })
    }

    /// Open an OTA zip or bare payload read through `src` (a remote object, memory, ...):
    /// the same as [`Ota::open`] except that a bare payload has no properties file beside it.
    /// The zip's directory, the manifest and the partitions asked for are all that is read.
    pub fn open_reader(src: Arc<dyn ReadAt + Send + Sync>) -> Result<Ota> {
        let len = src.size().map_err(OtaError::Open)?;
        let mut magic = [0u8; 4];
        let n = src.read_at(0, &mut magic).map_err(OtaError::Open)?;
        if n == 4 && magic == MAGIC {
            let payload = Payload::from_source(Box::new(SourceSlice { src, base: 0, len }))?;
            return Ok(Ota {
                payload,
                container: Container::Bare,
                properties: None,
            });
        }
        if n < 4 || &magic[..2] != b"PK" {
            return Err(OtaError::NotOta);
        }
        let cursor = ReadAtCursor {
            src: src.clone(),
            pos: 0,
            len,
        };
        open_zip(cursor, len, move |base, len| {
            Box::new(SourceSlice { src, base, len })
        })
    }

    /// The payload.
    pub fn payload(&self) -> &Payload {
        &self.payload
    }

    /// How the payload is stored.
    pub fn container(&self) -> Container {
        self.container
    }

    /// `payload_properties.txt`, parsed, and where it came from.
    pub fn properties(&self) -> Option<(&Properties, &PropertiesOrigin)> {
        self.properties.as_ref().map(|(p, o)| (p, o))
    }
}

/// `payload_properties.txt` beside a bare payload, if there is one.
fn beside(path: &Path) -> Result<Option<(Properties, PropertiesOrigin)>> {
    let p = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.join(PROPERTIES_NAME),
        _ => PathBuf::from(PROPERTIES_NAME),
    };
    let f = match File::open(&p) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(OtaError::PropertiesFile {
                path: p.display().to_string(),
                source,
            });
        }
    };
    let text = read_text(f).map_err(|source| OtaError::PropertiesFile {
        path: p.display().to_string(),
        source,
    })?;
    Ok(Some((
        Properties::parse(&text)?,
        PropertiesOrigin::File { path: p },
    )))
}

/// At most [`MAX_PROPERTIES`] bytes of UTF-8 text.
fn read_text(r: impl Read) -> std::io::Result<String> {
    let mut s = String::new();
    r.take(MAX_PROPERTIES + 1).read_to_string(&mut s)?;
    if s.len() as u64 > MAX_PROPERTIES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_PROPERTIES} bytes"),
        ));
    }
    Ok(s)
}

/// Open the zip `reader` (`len` bytes); `slice(base, len)` makes the payload entry's source.
fn open_zip<R: Read + Seek>(
    reader: R,
    len: u64,
    slice: impl FnOnce(u64, u64) -> Box<dyn Source>,
) -> Result<Ota> {
    let mut zip = zip::ZipArchive::new(reader).map_err(OtaError::Zip)?;
    let idx = zip
        .index_for_name(PAYLOAD_ENTRY)
        .ok_or(OtaError::NoPayloadInZip)?;
    let (base, size) = {
        let e = zip.by_index_raw(idx).map_err(OtaError::Zip)?;
        if e.encrypted() {
            return Err(OtaError::EncryptedPayload);
        }
        if e.compression() != zip::CompressionMethod::Stored {
            return Err(OtaError::CompressedPayload {
                method: e.compression().to_string(),
            });
        }
        let base = e
            .data_start()
            .ok_or(OtaError::Zip(zip::result::ZipError::InvalidArchive(
                "payload.bin has no data offset".into(),
            )))?;
        (base, e.compressed_size())
    };
    if base.saturating_add(size) > len {
        return Err(OtaError::PastEnd {
            what: "zip's payload.bin entry",
            end: base.saturating_add(size),
            len,
        });
    }
    let props = match zip.index_for_name(PROPERTIES_NAME) {
        None => None,
        Some(i) => {
            let e = zip.by_index(i).map_err(OtaError::Zip)?;
            let text = read_text(e).map_err(|source| OtaError::ZipEntry {
                name: PROPERTIES_NAME,
                source,
            })?;
            Some((Properties::parse(&text)?, PropertiesOrigin::Zip))
        }
    };
    drop(zip);
    let payload = Payload::from_source(slice(base, size))?;
    Ok(Ota {
        payload,
        container: Container::Zip {
            payload_offset: base,
        },
        properties: props,
    })
}
