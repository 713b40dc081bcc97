//! Property tests: random old/new image pairs → generate → the COW's read view, its in-place
//! merge and `apply` all equal the new image; for v2 and v3 and every codec.

use proptest::prelude::*;
use snapblk_cow::{
    Codec, Compression, CowReader, GenerateOptions, MemFile, WriterOptions, apply, generate,
    simulate_merge,
};

const BS: usize = 4096;

fn block(kind: u8, seed: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    match kind % 3 {
        0 => {
            // Compressible text.
            let s = format!("block seed {seed} lorem ipsum dolor sit amet ");
            for (i, c) in b.iter_mut().enumerate() {
                *c = s.as_bytes()[i % s.len()];
            }
        }
        1 => {
            let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
            for c in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *c = x as u8;
            }
        }
        _ => {}
    }
    b
}

#[derive(Clone, Debug)]
enum Edit {
    Shift {
        from: usize,
        to: usize,
        len: usize,
    },
    Zero {
        at: usize,
        len: usize,
    },
    Tweak {
        at: usize,
        byte: usize,
        val: u8,
    },
    Fresh {
        at: usize,
        kind: u8,
        seed: u64,
    },
    Swap {
        a: usize,
        b: usize,
    },
    /// Old bytes moved by a non-block amount (an insertion/deletion inside a file), with one
    /// byte changed: candidates for XOR ops whose source is not block-aligned.
    ByteShift {
        from: usize,
        to: usize,
        len: usize,
        shift: usize,
        tweak: usize,
    },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (0..40usize, 0..40usize, 1..8usize).prop_map(|(from, to, len)| Edit::Shift {
            from,
            to,
            len
        }),
        (0..40usize, 1..4usize).prop_map(|(at, len)| Edit::Zero { at, len }),
        (0..40usize, 0..BS, any::<u8>()).prop_map(|(at, byte, val)| Edit::Tweak { at, byte, val }),
        (0..40usize, any::<u8>(), any::<u64>()).prop_map(|(at, kind, seed)| Edit::Fresh {
            at,
            kind,
            seed
        }),
        (0..40usize, 0..40usize).prop_map(|(a, b)| Edit::Swap { a, b }),
        (0..40usize, 0..40usize, 1..8usize, 1..BS, 0..8 * BS).prop_map(
            |(from, to, len, shift, tweak)| Edit::ByteShift {
                from,
                to,
                len,
                shift,
                tweak
            }
        ),
    ]
}

fn images() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (
        8..40usize,
        prop::collection::vec((any::<u8>(), any::<u64>()), 40),
        prop::collection::vec(edit(), 0..12),
        0..4usize,
    )
        .prop_map(|(n, kinds, edits, grow)| {
            let mut old = Vec::with_capacity(n * BS);
            for (k, s) in kinds.iter().take(n) {
                old.extend_from_slice(&block(*k, *s));
            }
            let mut new = old.clone();
            new.resize((n + grow) * BS, 0xa5);
            let nb = n + grow;
            for e in edits {
                match e {
                    Edit::Shift { from, to, len } => {
                        let (from, to) = (from % n, to % nb);
                        let len = len.min(n - from).min(nb - to);
                        let src = old[from * BS..(from + len) * BS].to_vec();
                        new[to * BS..(to + len) * BS].copy_from_slice(&src);
                    }
                    Edit::Zero { at, len } => {
                        let at = at % nb;
                        let len = len.min(nb - at);
                        new[at * BS..(at + len) * BS].fill(0);
                    }
                    Edit::Tweak { at, byte, val } => new[(at % nb) * BS + byte] = val,
                    Edit::Fresh { at, kind, seed } => {
                        let at = at % nb;
                        new[at * BS..(at + 1) * BS].copy_from_slice(&block(kind, seed));
                    }
                    Edit::ByteShift {
                        from,
                        to,
                        len,
                        shift,
                        tweak,
                    } => {
                        let (from, to) = (from % n, to % nb);
                        // Source bytes [from*BS + shift, +len*BS) must lie inside the old image.
                        let len = len.min(n - from - 1).min(nb - to);
                        if len > 0 {
                            let s = from * BS + shift;
                            let src = old[s..s + len * BS].to_vec();
                            new[to * BS..(to + len) * BS].copy_from_slice(&src);
                            new[to * BS + tweak % (len * BS)] ^= 0x5a;
                        }
                    }
                    Edit::Swap { a, b } => {
                        let (a, b) = (a % n.min(nb), b % n.min(nb));
                        let (x, y) = (
                            old[a * BS..(a + 1) * BS].to_vec(),
                            old[b * BS..(b + 1) * BS].to_vec(),
                        );
                        new[a * BS..(a + 1) * BS].copy_from_slice(&y);
                        new[b * BS..(b + 1) * BS].copy_from_slice(&x);
                    }
                }
            }
            (old, new)
        })
}

fn check(
    old: &[u8],
    new: &[u8],
    version: u16,
    algo: Compression,
    unit: u32,
) -> Result<(), TestCaseError> {
    let opts = GenerateOptions {
        writer: WriterOptions {
            version,
            codec: Codec::new(algo),
            max_compression_size: unit,
            scratch_size: 0,
            ..Default::default()
        },
        ..Default::default()
    };
    let sink = MemFile::default();
    let stats = generate(old, new, &sink, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let cow = sink.into_inner();
    prop_assert_eq!(stats.cow_bytes, cow.len() as u64);
    let r = CowReader::open(cow.as_slice()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    r.verify_merge_order()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut out = Vec::new();
    apply(&r, old, new.len() as u64, &mut out, &|_| {})
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(out == new, "apply differs");
    let mut disk = old.to_vec();
    disk.resize(new.len(), 0);
    simulate_merge(&r, &mut disk).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(disk == new, "in-place merge differs");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn v2_every_codec((old, new) in images()) {
        for algo in Compression::ALL {
            check(&old, &new, 2, algo, 4096)?;
        }
    }

    #[test]
    fn v3_every_codec((old, new) in images()) {
        for algo in Compression::ALL {
            check(&old, &new, 3, algo, 4096)?;
        }
        check(&old, &new, 3, Compression::Zstd, 65536)?;
        check(&old, &new, 3, Compression::Lz4, 16384)?;
    }
}

#[test]
fn swap_cycle_is_broken() {
    let mut old = Vec::new();
    for i in 0..8 {
        old.extend_from_slice(&block(1, i));
    }
    let mut new = old.clone();
    // Swap blocks 1 and 2, rotate 4 -> 5 -> 6 -> 4.
    new[BS..2 * BS].copy_from_slice(&old[2 * BS..3 * BS]);
    new[2 * BS..3 * BS].copy_from_slice(&old[BS..2 * BS]);
    new[5 * BS..6 * BS].copy_from_slice(&old[4 * BS..5 * BS]);
    new[6 * BS..7 * BS].copy_from_slice(&old[5 * BS..6 * BS]);
    new[4 * BS..5 * BS].copy_from_slice(&old[6 * BS..7 * BS]);
    let sink = MemFile::default();
    let stats = generate(&old, &new, &sink, &GenerateOptions::default()).unwrap();
    assert_eq!(stats.cycle_breaks, 2, "{stats:?}");
    assert_eq!(stats.copy, 3);
    check(&old, &new, 3, Compression::None, 4096).unwrap();
}

#[test]
fn shifted_data_becomes_copies_and_edits_become_xor() {
    let mut old = Vec::new();
    for i in 0..32 {
        old.extend_from_slice(&block(0, i));
    }
    let mut new = vec![0u8; old.len()];
    // Shift everything up by 3 blocks; edit a few bytes in block 20.
    new[3 * BS..].copy_from_slice(&old[..old.len() - 3 * BS]);
    new[20 * BS + 7] ^= 0x55;
    let sink = MemFile::default();
    let opts = GenerateOptions {
        writer: WriterOptions {
            codec: Codec::new(Compression::Lz4),
            ..Default::default()
        },
        ..Default::default()
    };
    let stats = generate(&old, &new, &sink, &opts).unwrap();
    assert_eq!(stats.copy, 28, "{stats:?}");
    assert_eq!(stats.xor, 1, "{stats:?}");
    assert_eq!(stats.zero, 3, "{stats:?}");
    check(&old, &new, 2, Compression::Lz4, 4096).unwrap();
}

#[test]
fn byte_shifted_data_becomes_unaligned_xor() {
    // Random-looking old image; the new one has the first 8 blocks unchanged, 100 bytes
    // inserted in block 8, and everything after shifted by those 100 bytes (one byte edited).
    let mut old = Vec::new();
    for i in 0..32 {
        old.extend_from_slice(&block(1, i + 1));
    }
    let mut new = old[..8 * BS + 50].to_vec();
    new.extend_from_slice(&block(1, 999)[..100]);
    new.extend_from_slice(&old[8 * BS + 50..]);
    new.truncate(old.len());
    new[20 * BS + 9] ^= 0x77;
    for version in [2, 3] {
        let sink = MemFile::default();
        let opts = GenerateOptions {
            writer: WriterOptions {
                version,
                codec: Codec::new(Compression::Lz4),
                ..Default::default()
            },
            ..Default::default()
        };
        let stats = generate(&old, &new, &sink, &opts).unwrap();
        let cow = sink.into_inner();
        let r = CowReader::open(cow.as_slice()).unwrap();
        let unaligned = r
            .ops()
            .iter()
            .filter(|o| {
                matches!(o.kind, snapblk_cow::OpKind::Xor { source_offset, .. }
                    if source_offset % BS as u64 != 0)
            })
            .count();
        // Blocks 9..31 read old bytes 100 bytes before their own offset.
        assert!(unaligned >= 20, "{unaligned} unaligned XOR ops; {stats:?}");
        // Each shifted block XORs to (nearly) all zeros: tiny payloads.
        assert!(stats.xor_payload_bytes < 64 * stats.xor, "{stats:?}");
        check(&old, &new, version, Compression::Lz4, 4096).unwrap();
        check(&old, &new, version, Compression::Zstd, 4096).unwrap();
    }
}
