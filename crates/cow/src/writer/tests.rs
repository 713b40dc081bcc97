use super::*;
use crate::io::MemFile;
use crate::reader::CowReader;

/// A mixed op list, payloads encoded with `codec` as (op, payload bytes).
fn sample_ops(codec: Codec, version: u16, unit: u32) -> Vec<(BatchOp, Vec<u8>)> {
    let mut v = Vec::new();
    for i in 0..40u64 {
        let data: Vec<u8> = (0..4096u32 * if i % 5 == 0 { 2 } else { 1 })
            .map(|k| ((k as u64 * (i + 3)) % 7 + i % 3) as u8)
            .collect();
        let e = encode_unit(codec, version, 4096, unit, &data);
        let len = e.bytes.len() as u32;
        let op = match i % 4 {
            0 => BatchOp::Copy {
                new_block: 100 + i,
                old_block: i,
            },
            1 => BatchOp::Zero { new_block: 100 + i },
            2 => BatchOp::Xor {
                new_block: 100 + i,
                source_offset: i * 4096 + 17,
                len: if e.unit_blocks == 1 { len } else { 0 },
            },
            _ => BatchOp::Replace {
                new_block: 100 + i,
                unit_blocks: e.unit_blocks,
                len,
            },
        };
        let bytes = match op {
            BatchOp::Replace { .. } => e.bytes,
            BatchOp::Xor { len, .. } if len > 0 => e.bytes,
            _ => Vec::new(),
        };
        if let BatchOp::Xor { len: 0, .. } = op {
            continue;
        }
        v.push((op, bytes));
    }
    v
}

fn one_by_one(w: &mut CowWriter<&MemFile>, ops: &[(BatchOp, Vec<u8>)]) {
    for (op, bytes) in ops {
        match *op {
            BatchOp::Copy {
                new_block,
                old_block,
            } => w.add_copy(new_block, old_block, 1).unwrap(),
            BatchOp::Zero { new_block } => w.add_zero_blocks(new_block, 1).unwrap(),
            BatchOp::Replace {
                new_block,
                unit_blocks,
                ..
            } => w
                .add_encoded_replace(
                    new_block,
                    &EncodedUnit {
                        bytes: bytes.clone(),
                        unit_blocks,
                    },
                )
                .unwrap(),
            BatchOp::Xor {
                new_block,
                source_offset,
                ..
            } => w
                .add_encoded_xor(
                    new_block,
                    source_offset,
                    &EncodedUnit {
                        bytes: bytes.clone(),
                        unit_blocks: 1,
                    },
                )
                .unwrap(),
        }
    }
}

#[test]
fn add_batch_writes_the_same_file_as_op_by_op_calls() {
    for (version, cluster_ops, unit, algo) in [
        (2u16, 1024u32, 4096u32, Compression::Lz4),
        (2, 0, 4096, Compression::Zstd),
        (2, 3, 4096, Compression::Gz),
        (3, 1024, 8192, Compression::Lz4),
        (3, 1024, 8192, Compression::None),
    ] {
        let opts = WriterOptions {
            version,
            cluster_ops,
            codec: Codec::new(algo),
            max_compression_size: unit,
            op_count_max: 1000,
            ..Default::default()
        };
        let mut ops = sample_ops(opts.codec, version, unit);
        if version == 2 {
            // v2 units are single blocks.
            ops.retain(
                |(op, _)| !matches!(op, BatchOp::Replace { unit_blocks, .. } if *unit_blocks != 1),
            );
        }
        let a = MemFile::default();
        let mut w = CowWriter::new(&a, opts).unwrap();
        one_by_one(&mut w, &ops[..10]);
        w.add_label(0).unwrap();
        one_by_one(&mut w, &ops[10..]);
        w.finalize().unwrap();

        let b = MemFile::default();
        let mut w = CowWriter::new(&b, opts).unwrap();
        let batch = |w: &mut CowWriter<&MemFile>, part: &[(BatchOp, Vec<u8>)]| {
            let list: Vec<BatchOp> = part.iter().map(|o| o.0).collect();
            let bytes: Vec<u8> = part.iter().flat_map(|o| o.1.clone()).collect();
            w.add_batch(&list, &bytes).unwrap();
        };
        batch(&mut w, &ops[..10]);
        w.add_label(0).unwrap();
        batch(&mut w, &ops[10..20]);
        batch(&mut w, &ops[20..]);
        w.finalize().unwrap();
        assert_eq!(
            a.into_inner(),
            b.into_inner(),
            "v{version} k={cluster_ops} {algo:?}"
        );
    }
}

#[test]
fn add_batch_rejects_bad_batches_without_storing_any_op() {
    let opts = WriterOptions {
        version: 3,
        codec: Codec::new(Compression::None),
        op_count_max: 4,
        ..Default::default()
    };
    let f = MemFile::default();
    let mut w = CowWriter::new(&f, opts).unwrap();
    let rep = |new_block, len| BatchOp::Replace {
        new_block,
        unit_blocks: 1,
        len,
    };
    // Payload bytes that do not match the ops.
    assert!(w.add_batch(&[rep(0, 4096)], &[0u8; 100]).is_err());
    // A unit larger than max_compression_size.
    let big = BatchOp::Replace {
        new_block: 0,
        unit_blocks: 2,
        len: 8192,
    };
    assert!(w.add_batch(&[big], &vec![0u8; 8192]).is_err());
    // A block that does not fit in a v3 record, after a valid op: neither is kept.
    let bad = [
        BatchOp::Zero { new_block: 1 },
        BatchOp::Zero { new_block: 1 << 33 },
    ];
    assert!(w.add_batch(&bad, &[]).is_err());
    // More ops than op_count_max.
    let many: Vec<BatchOp> = (0..5).map(|b| BatchOp::Zero { new_block: b }).collect();
    assert!(matches!(
        w.add_batch(&many, &[]),
        Err(CowError::TooManyOps { max: 4 })
    ));
    w.add_batch(&[rep(7, 4096)], &[9u8; 4096]).unwrap();
    let len = w.finalize().unwrap();
    let r = CowReader::open(MemFile::new(f.into_inner())).unwrap();
    assert_eq!(r.ops().len(), 1);
    assert!(len > 4096);
}

/// v3 labels that go down (100–105, then 1 and 2), written as Android's `CowWriterV3` writes
/// them: each label drops the resume points at or above it and rewrites only the survivors at
/// the start of the area; the slots after them keep their old bytes, and `resume_point_count`
/// counts every label. (Android's reader reads min(count, max) slots, so zeroed slots would
/// show it a label 0 the writer never wrote.)
#[test]
fn v3_decreasing_labels_leave_stale_resume_slots_like_android() {
    let opts = WriterOptions {
        version: 3,
        codec: Codec::new(Compression::None),
        scratch_size: 2 << 20,
        op_count_max: 64,
        ..Default::default()
    };
    let f = MemFile::default();
    let mut w = CowWriter::new(&f, opts).unwrap();
    let mut at = Vec::new();
    let mut b = 0;
    for label in [100u64, 101, 102, 103, 104, 105, 1, 2] {
        for _ in 0..3 {
            w.add_copy(1000 + b, b, 1).unwrap();
            b += 1;
        }
        w.add_label(label).unwrap();
        at.push((label, b));
    }
    w.finalize().unwrap();
    let bytes = f.into_inner();
    let r = CowReader::open(MemFile::new(bytes.clone())).unwrap();
    let h = r.header();
    assert_eq!((h.resume_point_count, h.resume_point_max), (8, 4));
    // Slots: label 2 rewrote 0–1 ((1, 21), (2, 24)); label 1 had rewritten slot 0; slots 2–3
    // still hold 104 and 105 from when the area was [102, 103, 104, 105].
    let want = [at[6], at[7], at[4], at[5]];
    let off = h.v3_resume_offset() as usize;
    // No sequence data: the area follows the 78-byte header and the 2 MiB scratch area; slot
    // 2's first byte is the byte `cmp` numbers 2,097,263, where zeroed slots differed.
    assert_eq!(off + 32, 2_097_262);
    for (i, (l, n)) in want.iter().enumerate() {
        let s = off + i * 16;
        assert_eq!(
            bytes[s..s + 16],
            encode_resume_point(*l, *n),
            "resume slot {i}"
        );
    }
    assert_eq!(r.resume_points(), &want[..]);
}

/// A level out of its algorithm's range is refused by the writer, the appender and the
/// generator before anything reaches the sink (the encoders used to clamp it silently).
#[test]
fn levels_out_of_range_are_refused_before_any_write() {
    let gz10 = Codec {
        algo: Compression::Gz,
        level: Some(10),
    };
    let is_level = |r: Result<_>| match r {
        Err(CowError::Level(e)) => e.algo == Compression::Gz && e.level == 10,
        _ => false,
    };
    for version in [2, 3] {
        let opts = WriterOptions {
            version,
            codec: gz10,
            op_count_max: 4,
            ..Default::default()
        };
        let f = MemFile::default();
        assert!(is_level(CowWriter::new(&f, opts).map(|_| ())), "v{version}");
        assert!(f.into_inner().is_empty(), "v{version}");
        let g = crate::GenerateOptions {
            writer: opts,
            ..Default::default()
        };
        let img = vec![7u8; 8192];
        let f = MemFile::default();
        assert!(
            is_level(crate::generate(&img, &img, &f, &g).map(|_| ())),
            "v{version}"
        );
        assert!(f.into_inner().is_empty(), "v{version}");
    }
    // Appending to a valid v3 gz file with an out-of-range level.
    let opts = WriterOptions {
        version: 3,
        codec: Codec::new(Compression::Gz),
        op_count_max: 4,
        ..Default::default()
    };
    let f = MemFile::default();
    let mut w = CowWriter::new(&f, opts).unwrap();
    w.add_zero_blocks(0, 1).unwrap();
    w.finalize().unwrap();
    let bytes = f.into_inner();
    let r = CowReader::open(MemFile::new(bytes.clone())).unwrap();
    let sink = MemFile::new(bytes.clone());
    assert!(is_level(CowWriter::append_v3(&sink, &r, gz10).map(|_| ())));
    assert_eq!(sink.into_inner(), bytes);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Deferred labels (`defer_labels`) give the file immediate ones give: labels that rise,
    /// fall back (dropping later resume points, leaving stale slots) and overflow the four
    /// resume slots, between raw blocks and COPY ops, with an explicit commit in the middle.
    #[test]
    fn deferred_labels_write_the_same_file(
        steps in proptest::collection::vec((0u8..4, 0u64..12), 1..40),
        commit_at in 0usize..40,
    ) {
        let opts = WriterOptions {
            version: 3,
            codec: Codec::new(Compression::Lz4),
            op_count_max: 256,
            ..Default::default()
        };
        let write = |defer: bool| {
            let f = MemFile::default();
            let mut w = CowWriter::new(&f, opts).unwrap();
            if defer {
                w.defer_labels();
            }
            let mut next = 0u64;
            for (i, &(kind, v)) in steps.iter().enumerate() {
                if i == commit_at {
                    w.commit().unwrap();
                }
                match kind {
                    0 => {
                        w.add_raw_blocks(next, &[v as u8; 4096]).unwrap();
                        next += 1;
                    }
                    1 => {
                        w.add_copy(next, v, 1).unwrap();
                        next += 1;
                    }
                    _ => w.add_label(v).unwrap(),
                }
            }
            w.finalize().unwrap();
            f.into_inner()
        };
        proptest::prop_assert_eq!(write(false), write(true));
    }
}
