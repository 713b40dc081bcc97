//! Payload codecs: none, gz (zlib stream), brotli, lz4 (block format), zstd (frame).
//!
//! Every payload decodes to exactly one unit; decoders here are told the unit size and fail when
//! the payload decodes to more or less (never allocating beyond the unit).

use std::cell::RefCell;
use std::io::{Read, Write};

/// Compression algorithm ids as stored in the COW (v2 per op, v3 per file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None = 0,
    Gz = 1,
    Brotli = 2,
    Lz4 = 3,
    Zstd = 4,
}

impl Compression {
    /// All algorithms, in id order.
    pub const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gz,
        Compression::Brotli,
        Compression::Lz4,
        Compression::Zstd,
    ];

    /// Map an on-disk id.
    pub fn from_id(id: u64) -> Option<Self> {
        Some(match id {
            0 => Compression::None,
            1 => Compression::Gz,
            2 => Compression::Brotli,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            _ => return None,
        })
    }

    /// The on-disk id.
    pub fn id(self) -> u8 {
        self as u8
    }

    /// The name AOSP's writer option uses (`none`, `gz`, `brotli`, `lz4`, `zstd`).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gz => "gz",
            Compression::Brotli => "brotli",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "none" | "" => Compression::None,
            "gz" | "gzip" | "zlib" => Compression::Gz,
            "brotli" => Compression::Brotli,
            "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd,
            _ => {
                return Err(format!(
                    "unknown compression {s:?} (none|gz|brotli|lz4|zstd)"
                ));
            }
        })
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a payload failed to decode.
#[derive(Debug)]
pub enum DecodeError {
    /// The codec rejected the stream.
    Corrupt(String),
    /// The stream produces more bytes than the unit.
    TooLong,
    /// The stream ends before filling the unit.
    TooShort(usize),
}

thread_local! {
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    static ZSTD_C: RefCell<Option<(i32, u32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
}

/// Decode `input` with `algo` into exactly `out.len()` bytes.
pub fn decompress(algo: Compression, input: &[u8], out: &mut [u8]) -> Result<(), DecodeError> {
    match algo {
        Compression::None => {
            if input.len() > out.len() {
                return Err(DecodeError::TooLong);
            }
            if input.len() < out.len() {
                return Err(DecodeError::TooShort(input.len()));
            }
            out.copy_from_slice(input);
            Ok(())
        }
        Compression::Lz4 => match lz4_flex::block::decompress_into(input, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(DecodeError::TooShort(n)),
            Err(lz4_flex::block::DecompressError::OutputTooSmall { .. }) => {
                Err(DecodeError::TooLong)
            }
            Err(e) => Err(DecodeError::Corrupt(e.to_string())),
        },
        Compression::Zstd => {
            // Frames that declare a content size larger than the unit are "too long".
            if let Ok(Some(sz)) = zstd::zstd_safe::get_frame_content_size(input)
                && sz > out.len() as u64
            {
                return Err(DecodeError::TooLong);
            }
            let r = ZSTD_D.with(|cell| {
                let mut slot = cell.borrow_mut();
                if slot.is_none() {
                    *slot = Some(
                        zstd::bulk::Decompressor::new()
                            .map_err(|e| DecodeError::Corrupt(e.to_string()))?,
                    );
                }
                match slot.as_mut() {
                    Some(d) => d
                        .decompress_to_buffer(input, out)
                        .map_err(|e| DecodeError::Corrupt(e.to_string())),
                    None => Err(DecodeError::Corrupt("no zstd context".into())),
                }
            });
            match r {
                Ok(n) if n == out.len() => Ok(()),
                Ok(n) => Err(DecodeError::TooShort(n)),
                Err(DecodeError::Corrupt(m)) if m.contains("too small") => {
                    Err(DecodeError::TooLong)
                }
                Err(e) => Err(e),
            }
        }
        Compression::Gz => {
            let d = flate2::read::ZlibDecoder::new(input);
            read_exactly(d, out)
        }
        Compression::Brotli => {
            let d = brotli::Decompressor::new(input, 4096);
            read_exactly(d, out)
        }
    }
}

fn read_exactly(mut r: impl Read, out: &mut [u8]) -> Result<(), DecodeError> {
    let mut got = 0;
    while got < out.len() {
        match r.read(&mut out[got..]) {
            Ok(0) => return Err(DecodeError::TooShort(got)),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DecodeError::Corrupt(e.to_string())),
        }
    }
    let mut extra = [0u8; 1];
    match r.read(&mut extra) {
        Ok(0) => Ok(()),
        Ok(_) => Err(DecodeError::TooLong),
        Err(e) => Err(DecodeError::Corrupt(e.to_string())),
    }
}

/// Encoder settings. `level: None` means AOSP's defaults (gz 9, brotli 11, zstd 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Codec {
    pub algo: Compression,
    pub level: Option<i32>,
}

impl Codec {
    /// AOSP-default settings for `algo`.
    pub fn new(algo: Compression) -> Self {
        Codec { algo, level: None }
    }
}

/// Compress one unit. Returns the encoded stream (which may be longer than the input; callers
/// decide whether to store it raw). `window_log` is log2 of the largest unit (zstd only).
pub fn compress(codec: Codec, input: &[u8], window_log: u32) -> Vec<u8> {
    match codec.algo {
        Compression::None => input.to_vec(),
        Compression::Lz4 => lz4_flex::block::compress(input),
        Compression::Zstd => {
            let level = codec.level.unwrap_or(3);
            let r = ZSTD_C.with(|cell| -> std::io::Result<Vec<u8>> {
                let mut slot = cell.borrow_mut();
                let fresh = !matches!(&*slot, Some((l, w, _)) if *l == level && *w == window_log);
                if fresh {
                    let mut c = zstd::bulk::Compressor::new(level)?;
                    c.set_parameter(zstd::zstd_safe::CParameter::WindowLog(window_log))?;
                    *slot = Some((level, window_log, c));
                }
                match slot.as_mut() {
                    Some((_, _, c)) => c.compress(input),
                    None => Err(std::io::Error::other("no zstd context")),
                }
            });
            // Compression into a growable Vec cannot fail for valid parameters; fall back to a
            // raw copy (which every reader treats as an uncompressed unit) if it ever does.
            r.unwrap_or_else(|_| input.to_vec())
        }
        Compression::Gz => {
            let level = codec.level.unwrap_or(9).clamp(0, 9) as u32;
            let mut e = flate2::write::ZlibEncoder::new(
                Vec::with_capacity(input.len() / 2),
                flate2::Compression::new(level),
            );
            // Writing into a Vec cannot fail.
            let _ = e.write_all(input);
            e.finish().unwrap_or_default()
        }
        Compression::Brotli => {
            let q = codec.level.unwrap_or(11).clamp(0, 11) as u32;
            let mut out = Vec::with_capacity(input.len() / 2);
            {
                let mut w = brotli::CompressorWriter::new(&mut out, 4096, q, 22);
                let _ = w.write_all(input);
                let _ = w.flush();
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_every_codec() {
        let mut data = vec![0u8; 8192];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i % 251) as u8 ^ (i / 300) as u8;
        }
        for algo in Compression::ALL {
            let enc = compress(Codec::new(algo), &data, 13);
            let mut out = vec![0u8; data.len()];
            decompress(algo, &enc, &mut out).unwrap();
            assert_eq!(out, data, "{algo:?}");
            // Too small an output buffer is a "too long" payload, never a panic.
            let mut small = vec![0u8; 4096];
            if algo != Compression::None {
                assert!(matches!(
                    decompress(algo, &enc, &mut small),
                    Err(DecodeError::TooLong)
                ));
            }
            let mut big = vec![0u8; 16384];
            assert!(decompress(algo, &enc, &mut big).is_err());
        }
    }

    #[test]
    fn garbage_is_an_error() {
        let junk = [0xffu8; 37];
        for algo in Compression::ALL {
            let mut out = vec![0u8; 4096];
            assert!(decompress(algo, &junk, &mut out).is_err(), "{algo:?}");
        }
    }
}
