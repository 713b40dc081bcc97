//! Payload codecs: none, gz (zlib stream), brotli, lz4 (block format), zstd (frame).
//!
//! Every payload decodes to exactly one unit; decoders here are told the unit size and fail when
//! the payload decodes to more or less (never allocating beyond the unit).

use std::cell::RefCell;
use std::io::{Read, Write};

/// Compression algorithm ids as stored in the COW (v2 per op, v3 per file).
///
/// The discriminant is libsnapshot's `CowCompressionAlgorithm` value (format §6.1). Every
/// payload decodes to exactly one unit; the stream carries no decoded length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// `kCowCompressNone` (0): payloads are stored raw.
    None = 0,
    /// `kCowCompressGz` (1): a zlib stream (RFC 1950: deflate with a 2-byte header and an
    /// Adler-32 trailer), despite the name neither gzip nor raw deflate. AOSP encodes at
    /// level 9.
    Gz = 1,
    /// `kCowCompressBrotli` (2): a bare Brotli stream (RFC 7932). AOSP encodes at quality 11,
    /// window 22.
    Brotli = 2,
    /// `kCowCompressLz4` (3): the LZ4 *block* format, with no frame header and no size
    /// prefix.
    Lz4 = 3,
    /// `kCowCompressZstd` (4): a standard zstd frame. AOSP encodes at level 3 with a window
    /// of the file's largest unit.
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
    pub(crate) fn from_id(id: u64) -> Option<Self> {
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

    /// The encoder levels a user may ask for ([`Codec::level`]): gz 0..=9, brotli 0..=11,
    /// zstd from libzstd's lowest (negative, "fast") level to 22; `None` for none and lz4,
    /// which have no level.
    pub fn levels(self) -> Option<std::ops::RangeInclusive<i32>> {
        match self {
            Compression::Gz => Some(0..=9),
            Compression::Brotli => Some(0..=11),
            Compression::Zstd => Some(zstd::compression_level_range()),
            Compression::None | Compression::Lz4 => None,
        }
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
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The codec rejected the stream; the decoder's own error is the source.
    #[error("the stream is corrupt")]
    Corrupt(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The stream produces more bytes than the unit.
    #[error("the stream decodes to more bytes than its unit")]
    TooLong,
    /// The stream ends before filling the unit; the count is the bytes it produced.
    #[error("the stream decodes to {0} bytes, short of its unit")]
    TooShort(usize),
}

impl DecodeError {
    fn corrupt(e: impl std::error::Error + Send + Sync + 'static) -> DecodeError {
        DecodeError::Corrupt(Box::new(e))
    }
}

/// Encoder contexts kept per thread and codec.
const CONTEXTS: usize = 4;

thread_local! {
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    // Encoder contexts by (level, window log): a few, since dense and sparse units alternate.
    static ZSTD_C: RefCell<Vec<(i32, u32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(Vec::new()) };
    static GZ_C: RefCell<Vec<(u32, flate2::Compress)>> = const { RefCell::new(Vec::new()) };
}

/// lz4 through `lz4_flex`: the error kinds (too long, too short, corrupt) for inputs liblz4
/// does not decode to exactly one unit.
#[cold]
fn decompress_lz4_flex(input: &[u8], out: &mut [u8]) -> Result<(), DecodeError> {
    match lz4_flex::block::decompress_into(input, out) {
        Ok(n) if n == out.len() => Ok(()),
        Ok(n) => Err(DecodeError::TooShort(n)),
        Err(lz4_flex::block::DecompressError::OutputTooSmall { .. }) => Err(DecodeError::TooLong),
        Err(e) => Err(DecodeError::corrupt(e)),
    }
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
        // liblz4 decodes well-formed blocks (faster on short overlapping matches); anything
        // it does not decode to exactly one unit goes to lz4_flex, which names the error.
        Compression::Lz4 => match crate::lz4c::decompress_safe(input, out) {
            Some(n) if n == out.len() => Ok(()),
            _ => decompress_lz4_flex(input, out),
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
                    *slot = Some(zstd::bulk::Decompressor::new().map_err(DecodeError::corrupt)?);
                }
                match slot.as_mut() {
                    Some(d) => d.decompress_to_buffer(input, out).map_err(|e| {
                        if e.to_string().contains("too small") {
                            DecodeError::TooLong
                        } else {
                            DecodeError::corrupt(e)
                        }
                    }),
                    None => Err(DecodeError::Corrupt("no zstd decoder context".into())),
                }
            });
            match r {
                Ok(n) if n == out.len() => Ok(()),
                Ok(n) => Err(DecodeError::TooShort(n)),
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
            Err(e) => return Err(DecodeError::corrupt(e)),
        }
    }
    let mut extra = [0u8; 1];
    match r.read(&mut extra) {
        Ok(0) => Ok(()),
        Ok(_) => Err(DecodeError::TooLong),
        Err(e) => Err(DecodeError::corrupt(e)),
    }
}

/// An encoder level outside its algorithm's range ([`Compression::levels`]): the encoders
/// would have to clamp it, so the writer refuses it instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{algo} level {level} is out of range: {algo} levels are {} to {}", levels.start(), levels.end())]
pub struct LevelError {
    /// The algorithm.
    pub algo: Compression,
    /// The level asked for.
    pub level: i32,
    /// The algorithm's levels ([`Compression::levels`]).
    pub levels: std::ops::RangeInclusive<i32>,
}

/// Encoder settings. `level: None` means AOSP's defaults (gz 9, brotli 11, zstd 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Codec {
    /// The algorithm; written as the op's (v2) or the file's (v3) compression id.
    pub algo: Compression,
    /// Encoder level in the algorithm's own scale, or `None` for AOSP's default: zlib 0..=9,
    /// brotli quality 0..=11, zstd up to 22 (negative levels trade size for speed) — the
    /// ranges of [`Compression::levels`], which [`Codec::checked`] and the writer enforce;
    /// lz4 has no level and ignores it.
    pub level: Option<i32>,
}

impl Codec {
    /// AOSP-default settings for `algo`.
    pub fn new(algo: Compression) -> Self {
        Codec { algo, level: None }
    }

    /// These settings, or a [`LevelError`] if the level is outside the algorithm's
    /// [`levels`](Compression::levels) (an algorithm without levels ignores it). The COW
    /// writer and generator check their codec with it before writing anything.
    pub fn checked(self) -> Result<Codec, LevelError> {
        match (self.level, self.algo.levels()) {
            (Some(level), Some(levels)) if !levels.contains(&level) => Err(LevelError {
                algo: self.algo,
                level,
                levels,
            }),
            _ => Ok(self),
        }
    }

    /// The settings used for one unit. With default levels, *sparse* units (at most 1/8
    /// non-zero bytes — typically XOR payloads) use cheaper settings that compress them as well:
    /// zstd level -1 (raw literals; on the benchmark pair's XOR payloads 2.4x faster for +0.6 %
    /// bytes) and deflate level 4 (level 9's long lazy-match chains over zero runs made those
    /// payloads 2.4x slower *and* 2 % larger). An explicit level is always used as given.
    pub(crate) fn for_unit(self, data: &[u8]) -> Codec {
        if self.level.is_some() || !matches!(self.algo, Compression::Zstd | Compression::Gz) {
            return self;
        }
        if nonzero_bytes(data) * 8 > data.len() {
            return self;
        }
        let level = match self.algo {
            Compression::Zstd => -1,
            _ => 4,
        };
        Codec {
            algo: self.algo,
            level: Some(level),
        }
    }
}

/// How many bytes of `data` are not zero (fixed-size chunks so the loop vectorizes).
pub(crate) fn nonzero_bytes(data: &[u8]) -> usize {
    let mut chunks = data.chunks_exact(64);
    let mut n = 0usize;
    for c in &mut chunks {
        let mut s = 0u8;
        for b in c {
            s += u8::from(*b != 0);
        }
        n += usize::from(s);
    }
    n + chunks.remainder().iter().filter(|&&b| b != 0).count()
}

/// An append-only byte buffer that is reused between batches without zero-filling it again:
/// encoders write into [`spare`](Self::spare) (initialized memory past the used part) and
/// [`commit`](Self::commit) what they wrote.
#[derive(Default, Debug)]
pub(crate) struct PayloadBuf {
    buf: Vec<u8>,
    len: usize,
}

impl PayloadBuf {
    /// The bytes committed so far.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    /// Number of committed bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    /// Forget the committed bytes (the memory stays).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }
    /// Drop committed bytes from `len` on (`len` ≤ [`len`](Self::len)).
    pub(crate) fn clear_to(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    /// `n` writable bytes after the committed ones (zero-filled only when the buffer grows).
    pub(crate) fn spare(&mut self, n: usize) -> &mut [u8] {
        if self.buf.len() < self.len + n {
            self.buf.resize(self.len + n, 0);
        }
        &mut self.buf[self.len..self.len + n]
    }
    /// Mark `n` bytes of the spare area as written.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len = (self.len + n).min(self.buf.len());
    }
    /// Append bytes.
    pub(crate) fn extend(&mut self, b: &[u8]) {
        self.spare(b.len()).copy_from_slice(b);
        self.commit(b.len());
    }
}

/// Compress one unit. Returns the encoded stream (which may be longer than the input; callers
/// decide whether to store it raw). `window_log` is log2 of the largest unit (zstd only).
#[cfg(test)]
fn compress(codec: Codec, input: &[u8], window_log: u32) -> Vec<u8> {
    let mut out = PayloadBuf::default();
    compress_into(codec, input, window_log, &mut out);
    out.buf.truncate(out.len);
    out.buf
}

/// Like [`compress`], appending the stream to `out`; returns its length. Encoder contexts
/// (zstd, deflate) are kept per thread and reused, as AOSP's writer keeps one per worker.
pub(crate) fn compress_into(
    codec: Codec,
    input: &[u8],
    window_log: u32,
    out: &mut PayloadBuf,
) -> usize {
    match codec.algo {
        Compression::None => {
            out.extend(input);
            input.len()
        }
        Compression::Lz4 => {
            let dst = out.spare(lz4_flex::block::get_maximum_output_size(input.len()));
            match lz4_flex::block::compress_into(input, dst) {
                Ok(n) => {
                    out.commit(n);
                    n
                }
                // Cannot happen with a worst-case sized output; a raw copy is always valid.
                Err(_) => {
                    out.extend(input);
                    input.len()
                }
            }
        }
        Compression::Zstd => {
            let level = codec.level.unwrap_or(3);
            let dst = out.spare(zstd::zstd_safe::compress_bound(input.len()));
            let r = ZSTD_C.with(|cell| -> std::io::Result<usize> {
                let mut ctxs = cell.borrow_mut();
                let k = match ctxs
                    .iter()
                    .position(|(l, w, _)| *l == level && *w == window_log)
                {
                    Some(k) => k,
                    None => {
                        let mut c = zstd::bulk::Compressor::new(level)?;
                        c.set_parameter(zstd::zstd_safe::CParameter::WindowLog(window_log))?;
                        if ctxs.len() >= CONTEXTS {
                            ctxs.remove(0);
                        }
                        ctxs.push((level, window_log, c));
                        ctxs.len() - 1
                    }
                };
                ctxs[k].2.compress_to_buffer(input, dst)
            });
            match r {
                Ok(n) => {
                    out.commit(n);
                    n
                }
                // Cannot fail for valid parameters and a bound-sized output; fall back to a
                // raw copy (which every reader treats as an uncompressed unit) if it ever does.
                Err(_) => {
                    out.extend(input);
                    input.len()
                }
            }
        }
        Compression::Gz => {
            // In range ([`Codec::checked`], enforced by the writer); the clamp only keeps the
            // cast defined.
            let level = codec.level.unwrap_or(9).clamp(0, 9) as u32;
            let dst = out.spare(input.len() + input.len() / 64 + 64);
            let n = GZ_C.with(|cell| {
                let mut ctxs = cell.borrow_mut();
                let k = match ctxs.iter().position(|(l, _)| *l == level) {
                    Some(k) => {
                        ctxs[k].1.reset();
                        k
                    }
                    None => {
                        if ctxs.len() >= CONTEXTS {
                            ctxs.remove(0);
                        }
                        let c = flate2::Compress::new(flate2::Compression::new(level), true);
                        ctxs.push((level, c));
                        ctxs.len() - 1
                    }
                };
                let c = &mut ctxs[k].1;
                match c.compress(input, dst, flate2::FlushCompress::Finish) {
                    Ok(flate2::Status::StreamEnd) => usize::try_from(c.total_out()).ok(),
                    _ => None,
                }
            });
            match n {
                Some(n) => {
                    out.commit(n);
                    n
                }
                None => {
                    // Output bound too small (cannot happen for deflate's stored-block worst
                    // case): take the streaming encoder instead.
                    let mut e = flate2::write::ZlibEncoder::new(
                        Vec::with_capacity(input.len() / 2),
                        flate2::Compression::new(level),
                    );
                    let _ = e.write_all(input);
                    let v = e.finish().unwrap_or_default();
                    out.extend(&v);
                    v.len()
                }
            }
        }
        Compression::Brotli => {
            // In range, as for gz.
            let q = codec.level.unwrap_or(11).clamp(0, 11) as u32;
            let mut v = Vec::with_capacity(input.len() / 2);
            {
                let mut w = brotli::CompressorWriter::new(&mut v, 4096, q, 22);
                let _ = w.write_all(input);
                let _ = w.flush();
            }
            out.extend(&v);
            v.len()
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
    fn levels_outside_the_range_are_refused() {
        let at = |algo, level| Codec {
            algo,
            level: Some(level),
        };
        let zmin = *zstd::compression_level_range().start();
        for (algo, bad, good) in [
            (Compression::Gz, [-1, 10], [0, 9]),
            (Compression::Brotli, [-1, 12], [0, 11]),
            (Compression::Zstd, [zmin - 1, 23], [zmin, 22]),
        ] {
            for l in bad {
                let e = at(algo, l).checked().unwrap_err();
                assert_eq!((e.algo, e.level), (algo, l));
                assert_eq!(Some(e.levels.clone()), algo.levels());
                let r = algo.levels().unwrap();
                assert_eq!(
                    e.to_string(),
                    format!(
                        "{algo} level {l} is out of range: {algo} levels are {} to {}",
                        r.start(),
                        r.end()
                    )
                );
            }
            for l in good {
                assert_eq!(at(algo, l).checked(), Ok(at(algo, l)));
            }
        }
        // No level, or an algorithm without levels: nothing to check.
        for algo in Compression::ALL {
            assert!(Codec::new(algo).checked().is_ok());
        }
        assert!(at(Compression::Lz4, 99).checked().is_ok());
        assert!(at(Compression::None, -7).checked().is_ok());
    }

    #[test]
    fn garbage_is_an_error() {
        let junk = [0xffu8; 37];
        for algo in Compression::ALL {
            let mut out = vec![0u8; 4096];
            assert!(decompress(algo, &junk, &mut out).is_err(), "{algo:?}");
        }
    }

    #[test]
    fn sparse_units_get_cheaper_settings_and_still_roundtrip() {
        let mut sparse = vec![0u8; 4096];
        for k in (0..4096).step_by(97) {
            sparse[k] = (k % 200) as u8 + 1; // 43 non-zero bytes
        }
        let dense: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(nonzero_bytes(&sparse), 43);
        let z = Codec::new(Compression::Zstd);
        assert_eq!(z.for_unit(&sparse).level, Some(-1));
        assert_eq!(z.for_unit(&dense), z);
        assert_eq!(Codec::new(Compression::Gz).for_unit(&sparse).level, Some(4));
        assert_eq!(Codec::new(Compression::Lz4).for_unit(&sparse).level, None);
        // An explicit level is never overridden.
        let z9 = Codec {
            algo: Compression::Zstd,
            level: Some(9),
        };
        assert_eq!(z9.for_unit(&sparse), z9);
        // One buffer and one thread's contexts across codecs, levels and units, in any order.
        let mut buf = PayloadBuf::default();
        let mut spans = Vec::new();
        for round in 0..3 {
            for algo in Compression::ALL {
                for data in [&sparse, &dense] {
                    let c = Codec::new(algo).for_unit(data);
                    let start = buf.len();
                    let n = compress_into(c, data, 12, &mut buf);
                    assert_eq!(buf.len(), start + n);
                    spans.push((algo, round, start, n, data.clone()));
                }
            }
            if round == 1 {
                // Reuse without zero-filling: later payloads overwrite older bytes.
                buf.clear();
                spans.clear();
            }
        }
        for (algo, _, start, n, data) in spans {
            let mut out = vec![0u8; 4096];
            decompress(algo, &buf.as_slice()[start..start + n], &mut out).unwrap();
            assert_eq!(out, data, "{algo:?}");
        }
    }
}
