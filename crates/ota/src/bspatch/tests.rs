//! Patches built by hand, entry by entry, in every stream encoding: what they make, and every
//! way a patch can be wrong. Patches made by independent tools (Debian's bsdiff, PyPI bsdiff4)
//! are applied in crates/ota/tests/delta.rs.

use super::*;
use std::io::Write;

/// The bsdiff integer encoding of `x`.
fn int(x: i64) -> [u8; 8] {
    let m = x.unsigned_abs();
    (if x < 0 { m | 1 << 63 } else { m }).to_le_bytes()
}

fn compress(c: Codec, data: &[u8]) -> Vec<u8> {
    match c {
        Codec::None => data.to_vec(),
        Codec::Bzip2 => {
            let mut w = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
            w.write_all(data).unwrap();
            w.finish().unwrap()
        }
        Codec::Brotli => {
            let mut v = Vec::new();
            {
                let mut w = brotli::CompressorWriter::new(&mut v, 4096, 9, 22);
                w.write_all(data).unwrap();
            }
            v
        }
    }
}

fn code(c: Codec) -> u8 {
    match c {
        Codec::None => 0,
        Codec::Bzip2 => 1,
        Codec::Brotli => 2,
    }
}

/// A patch: `entries` as the control stream, then the diff and extra streams, with `magic`
/// (`None`: BSDF2 with `codecs`) and the header's new size `new_size`.
struct P {
    codecs: [Codec; 3],
    legacy: bool,
    entries: Vec<(i64, i64, i64)>,
    diff: Vec<u8>,
    extra: Vec<u8>,
    new_size: i64,
}

impl P {
    fn new(entries: &[(i64, i64, i64)], diff: &[u8], extra: &[u8], new_size: i64) -> P {
        P {
            codecs: [Codec::None; 3],
            legacy: false,
            entries: entries.to_vec(),
            diff: diff.to_vec(),
            extra: extra.to_vec(),
            new_size,
        }
    }
    fn codecs(mut self, c: [Codec; 3]) -> P {
        self.codecs = c;
        self
    }
    fn legacy(mut self) -> P {
        self.legacy = true;
        self.codecs = [Codec::Bzip2; 3];
        self
    }
    fn bytes(&self) -> Vec<u8> {
        let ctrl: Vec<u8> = self
            .entries
            .iter()
            .flat_map(|&(a, b, c)| [int(a), int(b), int(c)])
            .flatten()
            .collect();
        let streams = [&ctrl, &self.diff, &self.extra]
            .iter()
            .zip(self.codecs)
            .map(|(s, c)| compress(c, s))
            .collect::<Vec<_>>();
        let mut out = Vec::new();
        if self.legacy {
            out.extend_from_slice(b"BSDIFF40");
        } else {
            out.extend_from_slice(b"BSDF2");
            out.extend(self.codecs.map(code));
        }
        out.extend(int(streams[0].len() as i64));
        out.extend(int(streams[1].len() as i64));
        out.extend(int(self.new_size));
        for s in streams {
            out.extend(s);
        }
        out
    }
}

/// Apply with a small output buffer (so pieces cross entries); the new file, or the error.
fn run(old: &[u8], patch: &[u8], limit: u64) -> Result<Vec<u8>, PatchError> {
    let mut new = Vec::new();
    let mut buf = [0u8; 7];
    let mut pieces = Vec::new();
    let r = apply(old, patch, limit, &mut buf, &mut |b: &[u8]| {
        pieces.push(b.len());
        new.extend_from_slice(b);
        Ok::<(), ()>(())
    });
    match r {
        Ok(n) => {
            assert_eq!(n, new.len() as u64);
            // Every piece but the last is a full buffer.
            let (last, full) = pieces.split_last().unwrap_or((&0, &[]));
            assert!(full.iter().all(|&k| k == 7) && *last <= 7, "{pieces:?}");
            Ok(new)
        }
        Err(Fail::Patch(e)) => Err(e),
        Err(Fail::Sink(())) => unreachable!(),
    }
}

const OLD: &[u8] = b"0123456789abcdef";

/// Diff 4 bytes over old[0..4] (+1 each), extra "XY", seek +6 (to 10), diff 3 over old[10..13]
/// (+0), extra "Z".
fn sample() -> P {
    P::new(&[(4, 2, 6), (3, 1, 0)], &[1, 1, 1, 1, 0, 0, 0], b"XYZ", 10)
}

const SAMPLE_NEW: &[u8] = b"1234XYabcZ";

#[test]
fn integers_are_sign_magnitude_little_endian() {
    assert_eq!(bsdiff_int([5, 0, 0, 0, 0, 0, 0, 0]), 5);
    assert_eq!(bsdiff_int([5, 0, 0, 0, 0, 0, 0, 0x80]), -5);
    assert_eq!(bsdiff_int([0, 0, 0, 0, 0, 0, 0, 0x80]), 0, "negative zero");
    assert_eq!(bsdiff_int([0, 1, 0, 0, 0, 0, 0, 0]), 256);
    assert_eq!(bsdiff_int([0xff; 8]), -i64::MAX);
    for x in [0, 1, -1, 1 << 40, -(1 << 40), i64::MAX, -i64::MAX] {
        assert_eq!(bsdiff_int(int(x)), x);
    }
}

#[test]
fn every_stream_encoding_makes_the_same_file() {
    use Codec::{Brotli, Bzip2, None};
    for codecs in [
        [None; 3],
        [Bzip2; 3],
        [Brotli; 3],
        [Bzip2, Brotli, None],
        [None, Bzip2, Brotli],
    ] {
        let p = sample().codecs(codecs).bytes();
        assert_eq!(header(&p).unwrap().codecs, codecs);
        assert_eq!(run(OLD, &p, 10).unwrap(), SAMPLE_NEW, "{codecs:?}");
    }
    let p = sample().legacy().bytes();
    assert_eq!(&p[..8], b"BSDIFF40");
    assert_eq!(run(OLD, &p, 1 << 20).unwrap(), SAMPLE_NEW);
}

#[test]
fn old_bytes_outside_the_old_file_count_as_zero() {
    // Seek to -2 and diff 4 bytes: two before the file, two from it; then seek past the end.
    let p = P::new(
        &[(0, 0, -2), (4, 0, 100), (2, 0, 0)],
        &[7, 7, 7, 7, 9, 9],
        b"",
        6,
    );
    assert_eq!(
        run(OLD, &p.bytes(), 6).unwrap(),
        [7, 7, 7 + b'0', 7 + b'1', 9, 9]
    );
    // Addition wraps.
    let p = P::new(&[(1, 0, 0)], &[0xff], b"", 1);
    assert_eq!(run(b"\x02", &p.bytes(), 1).unwrap(), [1]);
    // An empty old file: the diff bytes are the new bytes.
    assert_eq!(
        run(b"", &sample().bytes(), 10).unwrap(),
        b"\x01\x01\x01\x01XY\0\0\0Z"
    );
}

#[test]
fn the_control_stream_past_the_new_size_is_not_read() {
    let mut p = sample();
    p.entries.push((-1, -1, -1));
    assert_eq!(run(OLD, &p.bytes(), 10).unwrap(), SAMPLE_NEW);
    let p = P::new(&[(-1, 0, 0)], b"", b"", 0);
    assert_eq!(run(OLD, &p.bytes(), 0).unwrap(), b"");
}

#[test]
fn bad_headers_are_refused() {
    let good = sample().bytes();
    assert!(matches!(
        run(OLD, &good[..31], 10),
        Err(PatchError::Short { len: 31 })
    ));
    let mut b = good.clone();
    b[..8].copy_from_slice(b"BSDIFF41");
    assert!(matches!(run(OLD, &b, 10), Err(PatchError::BadMagic { .. })));
    let mut b = good.clone();
    b[6] = 3;
    let e = run(OLD, &b, 10).unwrap_err();
    assert!(
        matches!(
            e,
            PatchError::BadCompressor {
                stream: "diff",
                code: 3
            }
        ),
        "{e:?}"
    );
    for (at, v) in [(8, -1), (16, -1), (24, -1), (8, 1 << 40), (16, 1 << 40)] {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&int(v));
        assert!(
            matches!(run(OLD, &b, 10), Err(PatchError::BadHeader { .. })),
            "{at} {v}"
        );
    }
    // Control and diff lengths that add past the patch (and would overflow).
    let mut b = good.clone();
    b[8..16].copy_from_slice(&int(i64::MAX));
    b[16..24].copy_from_slice(&int(i64::MAX));
    assert!(matches!(
        run(OLD, &b, 10),
        Err(PatchError::BadHeader { .. })
    ));
    let e = run(OLD, &good, 9).unwrap_err();
    assert!(
        matches!(
            e,
            PatchError::TooLong {
                new_size: 10,
                limit: 9
            }
        ),
        "{e:?}"
    );
}

/// Patches with one thing wrong, and what the error says.
fn bad_entries() -> Vec<(P, &'static str)> {
    vec![
        (P::new(&[(-1, 0, 0)], b"", b"", 4), "negative length"),
        (P::new(&[(0, -3, 0)], b"", b"", 4), "negative length"),
        (P::new(&[(5, 0, 0)], &[0; 5], b"", 4), "past the new size"),
        (
            P::new(&[(2, 3, 0)], &[0; 2], b"xyz", 4),
            "past the new size",
        ),
        (
            P::new(&[(0, 1, i64::MAX), (1, 0, 0), (1, 0, 0)], &[0; 2], b"x", 3),
            "overflows",
        ),
        (
            P::new(&[(2, 0, 0)], &[0; 2], b"", 4),
            "control stream ends early",
        ),
        (
            P::new(&[(4, 0, 0)], &[0; 3], b"", 4),
            "diff stream ends early",
        ),
        (
            P::new(&[(0, 4, 0)], b"", b"ab", 4),
            "extra stream ends early",
        ),
    ]
}

#[test]
fn bad_control_entries_are_refused_in_every_encoding() {
    for codecs in [
        [Codec::None; 3],
        [Codec::Brotli; 3],
        [Codec::Bzip2; 3],
        [Codec::Bzip2, Codec::None, Codec::Brotli],
    ] {
        for (p, want) in bad_entries() {
            let e = run(OLD, &p.codecs(codecs).bytes(), 4).unwrap_err();
            assert!(e.to_string().contains(want), "{codecs:?} {want}: {e}");
        }
    }
    let p = P::new(&[(2, 3, 0)], &[0; 2], b"xyz", 4);
    let e = run(OLD, &p.bytes(), 4).unwrap_err();
    assert!(
        matches!(
            e,
            PatchError::PastNewEnd {
                entry: 0,
                end: 5,
                new_size: 4
            }
        ),
        "{e:?}"
    );
    let p = P::new(&[(1, 0, 0), (4, 0, 0)], &[0; 3], b"", 5);
    let e = run(OLD, &p.bytes(), 5).unwrap_err();
    assert!(
        matches!(
            e,
            PatchError::Truncated {
                stream: "diff",
                entry: 1
            }
        ),
        "{e:?}"
    );
}

#[test]
fn idle_entries_are_bounded() {
    let mut entries = vec![(0, 0, 1); MAX_IDLE_ENTRIES as usize + 1];
    entries.push((1, 0, 0));
    let p = P::new(&entries, &[0], b"", 1);
    let e = run(OLD, &p.bytes(), 1).unwrap_err();
    assert!(
        matches!(e, PatchError::Idle { entry } if entry == MAX_IDLE_ENTRIES),
        "{e:?}"
    );
    // Up to the bound they are accepted.
    let mut entries = vec![(0, 0, 0); 1000];
    entries.push((1, 0, 0));
    let p = P::new(&entries, &[5], b"", 1).codecs([Codec::Brotli; 3]);
    assert_eq!(run(OLD, &p.bytes(), 1).unwrap(), [5 + b'0']);
}

#[test]
fn a_corrupt_compressed_stream_is_a_decode_error() {
    let p = sample().codecs([Codec::Bzip2; 3]).bytes();
    let h = header(&p).unwrap();
    let mut b = p.clone();
    b[32 + h.ctrl_len] ^= 0x55; // the "BZh" magic of the diff stream
    let e = run(OLD, &b, 10).unwrap_err();
    assert!(
        matches!(e, PatchError::Decode { stream: "diff", .. }),
        "{e:?}"
    );
    let p = sample().codecs([Codec::Brotli; 3]).bytes();
    let h = header(&p).unwrap();
    let mut b = p.clone();
    b[32..32 + h.ctrl_len].fill(0xff);
    let e = run(OLD, &b, 10).unwrap_err();
    assert!(
        matches!(
            e,
            PatchError::Decode {
                stream: "control",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn a_sink_error_stops_the_patch() {
    let p = sample().bytes();
    let mut buf = [0u8; 4];
    let mut calls = 0;
    let r = apply(OLD, &p, 10, &mut buf, &mut |_: &[u8]| {
        calls += 1;
        if calls == 2 { Err("full") } else { Ok(()) }
    });
    assert!(matches!(r, Err(Fail::Sink("full"))));
    assert_eq!(calls, 2);
    // An empty buffer still works.
    let mut new = Vec::new();
    apply(OLD, &p, 10, &mut [], &mut |b: &[u8]| {
        new.extend_from_slice(b);
        Ok::<(), ()>(())
    })
    .unwrap();
    assert_eq!(new, SAMPLE_NEW);
}
