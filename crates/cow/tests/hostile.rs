//! Hostile inputs: every malformed file gets a specific typed error, never a panic. The list is
//! mirrored in docs/cow.md ("Hostile-input list"). Ends with a bounded, deterministic fuzz smoke
//! run over mutated golden files (the same entry point as the cargo-fuzz target).

use snapblk_cow::{
    Codec, Compression, CowError, CowReader, CowWriter, EncodedUnit, MemFile, OpenOptions,
    WriterOptions,
};
use std::path::PathBuf;

fn golden(case: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/aosp-cow")
        .join(case)
        .join("snapshot.cow");
    std::fs::read(p).unwrap()
}

fn open(b: &[u8]) -> Result<CowReader<&[u8]>, CowError> {
    CowReader::open(b)
}

fn put(b: &mut [u8], off: usize, v: &[u8]) {
    b[off..off + v.len()].copy_from_slice(v);
}

// v2_tiny_noscratch: header 38 bytes, ops at 38 (COPY), 58 (ZERO), 78 (REPLACE, payload at 98),
// footer at 4194. v3_tiny_noscratch: ops at 142 (COPY), 158 (ZERO), 174 (REPLACE), data at 270.
const V2_OP0: usize = 38;
const V2_OP2: usize = 78;
const V2_FOOTER: usize = 4194;
const V3_OP0: usize = 142;
const V3_OP2: usize = 174;

#[test]
fn h01_empty_file() {
    assert!(matches!(
        open(&[]),
        Err(CowError::Truncated {
            what: "header prefix",
            ..
        })
    ));
}

#[test]
fn h02_bad_magic() {
    let mut b = golden("v2_tiny_noscratch");
    b[0] = b'X';
    assert!(matches!(open(&b), Err(CowError::BadMagic { .. })));
}

#[test]
fn h03_unsupported_version() {
    let mut b = golden("v2_tiny_noscratch");
    put(&mut b, 8, &4u16.to_le_bytes());
    assert!(matches!(
        open(&b),
        Err(CowError::UnsupportedVersion { major: 4, .. })
    ));
    let mut b = golden("v2_tiny_noscratch");
    put(&mut b, 10, &1u16.to_le_bytes());
    assert!(matches!(
        open(&b),
        Err(CowError::UnsupportedVersion { minor: 1, .. })
    ));
}

#[test]
fn h04_bad_header_fields() {
    let cases: &[(&str, usize, &[u8], &str)] = &[
        ("v2_tiny_noscratch", 12, &78u16.to_le_bytes(), "header_size"),
        ("v2_tiny_noscratch", 14, &0u16.to_le_bytes(), "footer_size"),
        ("v2_tiny_noscratch", 16, &16u16.to_le_bytes(), "op_size"),
        (
            "v2_tiny_noscratch",
            18,
            &3000u32.to_le_bytes(),
            "block_size",
        ),
        ("v2_tiny_noscratch", 18, &0u32.to_le_bytes(), "block_size"),
        ("v2_tiny_noscratch", 22, &1u32.to_le_bytes(), "cluster_ops"),
        (
            "v3_tiny_noscratch",
            70,
            &9u32.to_le_bytes(),
            "compression_algorithm",
        ),
        (
            "v3_tiny_noscratch",
            74,
            &5000u32.to_le_bytes(),
            "max_compression_size",
        ),
        ("v3_tiny_noscratch", 54, &9u64.to_le_bytes(), "op_count"),
        ("v3_tiny_noscratch", 22, &8u32.to_le_bytes(), "cluster_ops"),
    ];
    for (case, off, val, field) in cases {
        let mut b = golden(case);
        put(&mut b, *off, val);
        match open(&b) {
            Err(CowError::BadHeader { field: f, .. }) => assert_eq!(f, *field),
            other => panic!("{case}@{off}: expected BadHeader({field}), got {other:?}"),
        }
    }
}

#[test]
fn h05_scratch_past_end() {
    let mut b = golden("v2_tiny_noscratch");
    put(&mut b, 34, &0x7fff_0000u32.to_le_bytes());
    assert!(matches!(
        open(&b),
        Err(CowError::Truncated {
            what: "scratch area",
            ..
        })
    ));
}

#[test]
fn h06_truncated_v2_has_no_footer() {
    let b = golden("v2_tiny_noscratch");
    for cut in [38, 60, 100, 4194, 4200, 4277] {
        let e = open(&b[..cut]).unwrap_err();
        assert!(
            matches!(
                e,
                CowError::MissingFooter { .. }
                    | CowError::Truncated { .. }
                    | CowError::PayloadPastEnd { .. }
            ),
            "cut {cut}: {e:?}"
        );
    }
    assert!(matches!(
        open(&b[..4214]),
        Err(CowError::Truncated { what: "footer", .. })
    ));
    assert!(matches!(
        open(&b[..4200]),
        Err(CowError::MissingFooter { offset: 4194, .. })
    ));
}

#[test]
fn h07_footer_count_mismatch() {
    let mut b = golden("v2_tiny_noscratch");
    put(&mut b, V2_FOOTER + 12, &7u64.to_le_bytes());
    assert!(matches!(
        open(&b),
        Err(CowError::FooterMismatch {
            field: "num_ops",
            found: 7,
            expected: 3,
            ..
        })
    ));
}

#[test]
fn h08_unknown_op_type_and_compression() {
    let mut b = golden("v2_tiny_noscratch");
    b[V2_OP0] = 42;
    assert!(matches!(
        open(&b),
        Err(CowError::UnknownOpType {
            index: 0,
            op_type: 42,
            ..
        })
    ));
    let mut b = golden("v2_tiny_noscratch");
    b[V2_OP2 + 1] = 9;
    assert!(matches!(
        open(&b),
        Err(CowError::UnknownCompression {
            index: 2,
            id: 9,
            ..
        })
    ));
    let mut b = golden("v3_tiny_noscratch");
    b[V3_OP0 + 15] = 0xe0; // type 14
    assert!(matches!(
        open(&b),
        Err(CowError::UnknownOpType {
            index: 0,
            op_type: 14,
            ..
        })
    ));
}

#[test]
fn h09_payload_past_end() {
    let mut b = golden("v2_tiny_noscratch");
    put(&mut b, V2_OP2 + 12, &1_000_000u64.to_le_bytes());
    assert!(matches!(
        open(&b),
        Err(CowError::PayloadPastEnd { index: 2, .. })
    ));
    let b = golden("v3_tiny_noscratch");
    assert!(matches!(
        open(&b[..300]),
        Err(CowError::PayloadPastEnd { index: 2, .. })
    ));
}

#[test]
fn h10_v3_huge_counts_do_not_allocate() {
    let mut b = golden("v3_tiny_noscratch");
    put(&mut b, 62, &u64::MAX.to_le_bytes()); // op_count_max
    put(&mut b, 54, &(u64::MAX / 2).to_le_bytes()); // op_count
    assert!(matches!(
        open(&b),
        Err(CowError::Truncated {
            what: "op array",
            ..
        })
    ));
    let mut b = golden("v3_tiny_noscratch");
    put(&mut b, 38, &(1u64 << 60).to_le_bytes()); // sequence_data_count
    assert!(matches!(
        open(&b),
        Err(CowError::Truncated {
            what: "sequence area",
            ..
        })
    ));
    let mut b = golden("v3_tiny_noscratch");
    put(&mut b, 46, &u32::MAX.to_le_bytes()); // resume_point_count
    put(&mut b, 50, &u32::MAX.to_le_bytes()); // resume_point_max
    assert!(matches!(
        open(&b),
        Err(CowError::Truncated {
            what: "resume area",
            ..
        })
    ));
}

#[test]
fn h11_op_past_device_end() {
    let b = golden("v2_tiny_noscratch");
    let opts = OpenOptions {
        device_blocks: Some(3),
        ..Default::default()
    };
    assert!(matches!(
        CowReader::open_with(b.as_slice(), opts),
        Err(CowError::OpPastDevice {
            index: 2,
            block: 3,
            device_blocks: 3
        })
    ));
    let opts = OpenOptions {
        base_blocks: Some(4),
        ..Default::default()
    };
    assert!(matches!(
        CowReader::open_with(b.as_slice(), opts),
        Err(CowError::OpPastDevice {
            index: 0,
            block: 5,
            ..
        })
    ));
}

#[test]
fn h12_duplicate_target() {
    let mut b = golden("v2_tiny_noscratch");
    put(&mut b, V2_OP0 + 20 + 4, &2u64.to_le_bytes()); // ZERO now also targets block 2
    assert!(matches!(
        open(&b),
        Err(CowError::DuplicateTarget {
            index: 1,
            block: 2,
            first: 0
        })
    ));
    // The documented alternatives resolve it instead.
    for (p, want) in [
        (snapblk_cow::DuplicatePolicy::FirstWins, "copy"),
        (snapblk_cow::DuplicatePolicy::LastWins, "zero"),
    ] {
        let r = CowReader::open_with(
            b.as_slice(),
            OpenOptions {
                duplicates: p,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(r.lookup(2).unwrap().type_name(), want);
    }
}

#[test]
fn h13_impossible_sequence() {
    let mut b = golden("v3_copy_chain_seq");
    let seq = 78 + 2097152;
    put(&mut b, seq, &30u32.to_le_bytes()); // no op writes block 30
    assert!(matches!(
        open(&b),
        Err(CowError::BadSequence {
            entry: 0,
            block: 30,
            ..
        })
    ));
    let mut b = golden("v3_copy_chain_seq");
    put(&mut b, seq + 4, &11u32.to_le_bytes()); // 11 listed twice
    assert!(matches!(
        open(&b),
        Err(CowError::BadSequence {
            entry: 1,
            block: 11,
            ..
        })
    ));
}

#[test]
fn h14_v3_structural_op_errors() {
    let mut b = golden("v3_tiny_noscratch");
    put(&mut b, V3_OP2 + 8, &271u32.to_le_bytes()); // REPLACE source != running position
    assert!(matches!(open(&b), Err(CowError::BadOp { index: 2, .. })));
    let mut b = golden("v3_tiny_noscratch");
    b[V3_OP0 + 15] = 0x12; // COPY with compression bits 1
    assert!(matches!(open(&b), Err(CowError::BadOp { index: 0, .. })));
    let mut b = golden("v3_tiny_noscratch");
    b[V3_OP0 + 15] = 0x40; // LABEL in a v3 op array
    assert!(matches!(open(&b), Err(CowError::BadOp { index: 0, .. })));
}

#[test]
fn h15_v2_sequence_in_unclustered_file() {
    let mut b = golden("v2_tiny_noscratch");
    b[V2_OP0] = 7;
    assert!(matches!(open(&b), Err(CowError::BadOp { index: 0, .. })));
}

#[test]
fn h16_label_not_found() {
    let b = golden("v3_basic_none");
    let opts = OpenOptions {
        label: Some(77),
        ..Default::default()
    };
    assert!(matches!(
        CowReader::open_with(b.as_slice(), opts),
        Err(CowError::LabelNotFound { label: 77 })
    ));
    let b = golden("v2_basic_none");
    assert!(matches!(
        CowReader::open_with(b.as_slice(), opts),
        Err(CowError::LabelNotFound { label: 77 })
    ));
}

fn v3_lz4_with(payload: Vec<u8>) -> Vec<u8> {
    let sink = MemFile::default();
    let opts = WriterOptions {
        codec: Codec::new(Compression::Lz4),
        op_count_max: 4,
        scratch_size: 0,
        ..Default::default()
    };
    let mut w = CowWriter::new(&sink, opts).unwrap();
    w.add_encoded_replace(
        1,
        &EncodedUnit {
            bytes: payload,
            unit_blocks: 1,
        },
    )
    .unwrap();
    w.finalize().unwrap();
    sink.into_inner()
}

#[test]
fn h17_payload_decodes_to_more_than_its_unit() {
    let b = v3_lz4_with(lz4_flex::block::compress(&[0u8; 8192]));
    let r = open(&b).unwrap();
    let mut out = vec![0u8; 4096];
    let op = r.lookup(1).unwrap();
    assert!(matches!(
        r.decode_payload(op, &mut out),
        Err(CowError::DecodedTooLong {
            index: 0,
            unit: 4096,
            ..
        })
    ));
}

#[test]
fn h18_payload_decodes_to_less_than_its_unit() {
    let b = v3_lz4_with(lz4_flex::block::compress(&[0u8; 1000]));
    let r = open(&b).unwrap();
    let mut out = vec![0u8; 4096];
    assert!(matches!(
        r.decode_payload(r.lookup(1).unwrap(), &mut out),
        Err(CowError::DecodedTooShort {
            index: 0,
            got: 1000,
            unit: 4096,
            ..
        })
    ));
}

#[test]
fn h19_corrupt_payload() {
    let b = v3_lz4_with(vec![0xf0; 50]);
    let r = open(&b).unwrap();
    let mut out = vec![0u8; 4096];
    let e = r
        .decode_payload(r.lookup(1).unwrap(), &mut out)
        .unwrap_err();
    assert!(
        matches!(
            e,
            CowError::Corrupt {
                index: 0,
                codec: Compression::Lz4,
                ..
            } | CowError::DecodedTooShort { .. }
        ),
        "{e:?}"
    );
    // The same through the block read path.
    let mut blk = vec![0u8; 4096];
    assert!(r.read_block(1, [0u8; 0].as_slice(), &mut blk).is_err());
}

#[test]
fn h20_payload_larger_than_unit() {
    let mut b = v3_lz4_with(vec![1u8; 100]);
    // Grow the op's data_length beyond its 4 KiB unit (and the file so the bound is the unit).
    let op = 78 + 64;
    put(&mut b, op, &5000u32.to_le_bytes());
    b.resize(b.len() + 5000, 0);
    assert!(matches!(
        open(&b),
        Err(CowError::PayloadTooLarge {
            index: 0,
            len: 5000,
            limit: 4096
        })
    ));
}

#[test]
fn h21_invalid_merge_order() {
    let b = golden("v3_invalid_order_no_sequence");
    let r = open(&b).unwrap();
    assert!(matches!(
        r.verify_merge_order(),
        Err(CowError::MergeOrder {
            position: 1,
            block: 2,
            ..
        })
    ));
}

#[test]
fn h22_mixed_v2_codecs() {
    let mut b = golden("v2_replace_lz4");
    // Second REPLACE op claims zstd while the first is lz4.
    let op1 = 38 + 20;
    b[op1 + 1] = 4;
    assert!(matches!(
        open(&b),
        Err(CowError::MixedCompression { index: 1, .. })
    ));
}

/// A clustered v2 file (no scratch, block size `bs`): the given op records from offset 38, a
/// footer after them, then `tail` (payload bytes the records may point at).
fn v2_clustered(bs: u32, records: &[[u8; 20]], tail: &[u8]) -> (Vec<u8>, u64) {
    let mut b = snapblk_cow::Header::new_v2(bs, 1024, 0).encode();
    for r in records {
        b.extend_from_slice(r);
    }
    // The 84-byte v2 footer: a FOOTER op record (type 255, data_length 64) then zeros.
    let n = records.len() as u64;
    b.extend_from_slice(&op_v2(255, 64, n * 20, n));
    b.extend_from_slice(&[0u8; 64]);
    let tail_at = b.len() as u64;
    b.extend_from_slice(tail);
    (b, tail_at)
}

/// A 20-byte v2 op record (format §4.1) without compression: type, compression 0,
/// `data_length`, `new_block`, `source`, little-endian.
fn op_v2(op_type: u8, data_length: u16, new_block: u64, source: u64) -> [u8; 20] {
    let mut r = [0u8; 20];
    r[0] = op_type;
    r[2..4].copy_from_slice(&data_length.to_le_bytes());
    r[4..12].copy_from_slice(&new_block.to_le_bytes());
    r[12..20].copy_from_slice(&source.to_le_bytes());
    r
}

fn seq_record(len: u16, source: u64) -> [u8; 20] {
    op_v2(7, len, 0, source)
}

#[test]
fn h23_sequence_payloads_are_bounded() {
    // The DoS shape: thousands of SEQUENCE records sharing one 65532-byte payload (32 KiB blocks,
    // so 2 × block_size allows it). Unchecked, 2000 × 16383 entries (~130 MB) were collected
    // before anything looked at them; now the first record already claims more entries than the
    // rest of the file has room for data ops, and nothing is read.
    let n = 2000u64;
    let payload_at = 38 + 20 * n + 84;
    let recs = vec![seq_record(65532, payload_at); n as usize];
    let (b, at) = v2_clustered(32768, &recs, &vec![0u8; 65532]);
    assert_eq!(at, payload_at);
    assert!(b.len() < 120_000);
    let e = open(&b).unwrap_err();
    assert!(
        matches!(
            e,
            CowError::SequenceTooLong {
                index: 0,
                entries: 16383,
                limit,
            } if limit < 16383
        ),
        "{e:?}"
    );
    // Payloads small enough for the cap but shared: the second record is refused before its
    // payload is read (total memory stays bounded by the file size).
    let payload_at = 38 + 20 * 2 + 84;
    let (b, _) = v2_clustered(4096, &[seq_record(400, payload_at); 2], &[0u8; 4096]);
    let e = open(&b).unwrap_err();
    assert!(
        matches!(
            e,
            CowError::SequenceOverlap {
                index: 1,
                offset,
                prev_end,
            } if offset == payload_at && prev_end == payload_at + 400
        ),
        "{e:?}"
    );
    // One op's payload is at most 2 blocks of entries (format §11).
    let (b, at) = v2_clustered(4096, &[seq_record(8196, 0)], &[0u8; 8196]);
    let mut b = b;
    put(&mut b, 38 + 12, &at.to_le_bytes());
    assert!(matches!(
        open(&b),
        Err(CowError::PayloadTooLarge {
            index: 0,
            len: 8196,
            limit: 8192
        })
    ));
    // Distinct, non-overlapping payloads, but more entries than the file has room for data ops.
    let recs: Vec<[u8; 20]> = (0..4u64)
        .map(|i| seq_record(8192, 38 + 20 * 4 + 84 + i * 8192))
        .collect();
    let (b, _) = v2_clustered(4096, &recs, &vec![0u8; 4 * 8192]);
    let e = open(&b).unwrap_err();
    assert!(
        matches!(e, CowError::SequenceTooLong { index: 0, entries: 2048, limit } if limit < 2048),
        "{e:?}"
    );
}

#[test]
fn h24_payload_outside_data_region() {
    // REPLACE payload inside the header.
    let mut b = golden("v2_tiny_noscratch");
    put(&mut b, V2_OP2 + 12, &10u64.to_le_bytes());
    assert!(matches!(
        open(&b),
        Err(CowError::PayloadOutsideData {
            index: 2,
            offset: 10,
            start: 38,
            ..
        })
    ));
    // REPLACE payload inside the scratch area (which the merge overwrites).
    let sink = MemFile::default();
    let mut w = CowWriter::new(
        &sink,
        WriterOptions {
            version: 2,
            cluster_ops: 0,
            scratch_size: 65536,
            ..Default::default()
        },
    )
    .unwrap();
    w.add_raw_blocks(1, &[7u8; 4096]).unwrap();
    w.finalize().unwrap();
    let mut b = sink.into_inner();
    let ops_start = 38 + 65536;
    open(&b).unwrap();
    put(&mut b, ops_start + 12, &100u64.to_le_bytes());
    assert!(matches!(
        open(&b),
        Err(CowError::PayloadOutsideData {
            index: 0,
            offset: 100,
            start,
            ..
        }) if start == ops_start as u64
    ));
    // REPLACE payload after the footer: it would lie where the overlay journal goes
    // (align_up(data_end)); data_end used to be the footer's end regardless.
    let mut b = golden("v2_tiny_noscratch");
    let len = b.len() as u64;
    b.extend_from_slice(&[9u8; 4096]);
    put(&mut b, V2_OP2 + 12, &len.to_le_bytes());
    let e = open(&b).unwrap_err();
    assert!(
        matches!(
            e,
            CowError::PayloadOutsideData { index: 2, offset, len: 4096, end, .. }
                if offset == len && end == V2_FOOTER as u64
        ),
        "{e:?}"
    );
}

#[test]
fn h25_v3_raw_payload_shorter_than_its_unit() {
    // Uncompressed file: a REPLACE storing 100 bytes for a 4 KiB block would be served as those
    // 100 bytes plus whatever follows them.
    let mut b = golden("v3_tiny_noscratch");
    put(&mut b, V3_OP2, &100u32.to_le_bytes());
    assert!(matches!(
        open(&b),
        Err(CowError::RawPayloadTooShort {
            index: 2,
            len: 100,
            unit: 4096
        })
    ));
}

/// Deterministic mutation fuzzing of every golden file through the fuzz entry point.
#[test]
fn fuzz_smoke_mutated_golden_files() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/aosp-cow");
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let d = e.unwrap().path();
        if !d.is_dir() {
            continue;
        }
        let p = d.join("snapshot.cow");
        let mut b = std::fs::read(p).unwrap();
        // Drop the (all-zero) scratch area so mutations hit ops and payloads, not zeros.
        if b.len() > 2 << 20 {
            let hs = u16::from_le_bytes([b[12], b[13]]) as usize;
            b.drain(hs..hs + (2 << 20));
            put(&mut b, 34, &0u32.to_le_bytes());
        }
        seeds.push(b);
    }
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..4000 {
        let mut b = seeds[i % seeds.len()].clone();
        let n = 1 + rnd() % 6;
        for _ in 0..n {
            let len = b.len() as u64;
            match rnd() % 5 {
                0 | 1 => {
                    let at = (rnd() % len.clamp(1, 400)) as usize; // header/op area
                    b[at] = rnd() as u8;
                }
                2 => {
                    let at = (rnd() % len) as usize;
                    b[at] ^= 1 << (rnd() % 8);
                }
                3 => {
                    let cut = (rnd() % len) as usize;
                    b.truncate(cut.max(1));
                }
                _ => {
                    let at = (rnd() % len.clamp(1, 300)) as usize;
                    let v = [0xffu8; 8];
                    let end = (at + 8).min(b.len());
                    b[at..end].copy_from_slice(&v[..end - at]);
                }
            }
            if b.is_empty() {
                break;
            }
        }
        snapblk_cow::fuzzing::fuzz_cow(&b);
        snapblk_cow::fuzzing::fuzz_sparse(&b);
    }
}
