//! The 16 AOSP golden cases in tests/data/aosp-cow: parse, read view, op list, merge order,
//! merge-order verification and an op-by-op in-place merge.

use snapblk_cow::{CowReader, OpKind, OpenOptions};
use snapblk_testsupport::golden::{self, ReadmeOp};

fn load(name: &str) -> golden::CaseData {
    golden::case(name).load()
}

/// Label and cluster ops compare by type only: labels carry no block, and the README prints a
/// cluster's `cluster_data` where the reader keeps `skip`.
fn comparable(mut op: ReadmeOp) -> ReadmeOp {
    if op.kind == "kCowClusterOp" || op.kind == "kCowLabelOp" {
        (op.new_block, op.source, op.data_length) = (0, 0, 0);
    }
    op
}

#[test]
fn read_view_equals_target() {
    for case in golden::cases() {
        let name = &case.name;
        let c = case.load();
        let blocks = (c.base.len() / 4096) as u64;
        let opts = OpenOptions {
            device_blocks: Some(blocks),
            base_blocks: Some(blocks),
            ..Default::default()
        };
        let r =
            CowReader::open_with(c.cow.as_slice(), opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut out = vec![0u8; c.base.len()];
        r.read_at_new(0, &mut out, c.base.as_slice()).unwrap();
        assert!(out == c.target, "{name}: read view differs from target.img");
        // Unaligned read like the snapuserd harness (sector 11, 5000 bytes).
        let mut un = vec![0u8; 5000];
        r.read_at_new(11 * 512, &mut un, c.base.as_slice()).unwrap();
        assert_eq!(un, c.target[11 * 512..11 * 512 + 5000], "{name}");
        // Per-block path too.
        let mut blk = vec![0u8; 4096];
        for b in 0..blocks {
            r.read_block(b, c.base.as_slice(), &mut blk).unwrap();
            assert!(
                blk[..] == c.target[(b * 4096) as usize..][..4096],
                "{name} block {b}"
            );
        }
    }
}

#[test]
fn op_stream_matches_readme() {
    for case in golden::cases() {
        let name = &case.name;
        let c = case.load();
        let r = CowReader::open(c.cow.as_slice()).unwrap();
        let got: Vec<ReadmeOp> = r
            .ops()
            .iter()
            .map(|op| {
                let (kind, new_block, source, data_length) = match op.kind {
                    OpKind::Copy { source_block } => ("kCowCopyOp", op.new_block, source_block, 0),
                    OpKind::Zero => ("kZeroOp", op.new_block, 0, 0),
                    OpKind::Replace { payload } => (
                        "kCowReplaceOp",
                        op.new_block,
                        payload.offset,
                        payload.len.into(),
                    ),
                    OpKind::Xor {
                        source_offset,
                        payload,
                    } => ("kCowXorOp", op.new_block, source_offset, payload.len.into()),
                    OpKind::Label { .. } => ("kCowLabelOp", 0, 0, 0),
                    OpKind::Sequence { payload } => ("kCowSequenceOp", 0, 0, payload.len.into()),
                    OpKind::Cluster { skip } => ("kCowClusterOp", 0, 0, skip),
                };
                comparable(ReadmeOp {
                    kind: kind.into(),
                    new_block,
                    source,
                    data_length,
                })
            })
            .collect();
        let want: Vec<ReadmeOp> = golden::readme_ops(&c.readme)
            .into_iter()
            .map(comparable)
            .collect();
        // The v3 multiblock README does not show compression bits; op list still matches.
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn merge_order_matches_readme_and_verifies() {
    for case in golden::cases() {
        let name = &case.name;
        let c = case.load();
        let r = CowReader::open(c.cow.as_slice()).unwrap();
        let got: Vec<u64> = r.merge_order().map(|o| o.new_block).collect();
        let res = r.verify_merge_order();
        if case.invalid_merge_order() {
            let e = res.expect_err("invalid case must be rejected").to_string();
            assert!(e.contains("COPY op follows a non-ordered op"), "{e}");
            continue;
        }
        res.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, golden::readme_merge_order(&c.readme), "{name}");
    }
}

#[test]
fn op_by_op_in_place_merge_gives_target() {
    for case in golden::cases() {
        if case.invalid_merge_order() {
            continue;
        }
        let name = &case.name;
        let c = case.load();
        let r = CowReader::open(c.cow.as_slice()).unwrap();
        let pristine = c.base.clone();
        let mut disk = c.base.clone();
        let bs = 4096usize;
        for op in r.merge_order() {
            let n = op.block_count() as usize;
            let mut buf = vec![0u8; n * bs];
            // Sources come from the *current* disk: that is what makes the order matter.
            for k in 0..n {
                let b = op.new_block as usize + k;
                match op.kind {
                    OpKind::Copy { source_block } => {
                        let s = source_block as usize * bs;
                        buf.copy_from_slice(&disk[s..s + bs]);
                    }
                    _ => {
                        let mut blk = vec![0u8; bs];
                        // For XOR read the base bytes from the current disk as well.
                        if let OpKind::Xor { source_offset, .. } = op.kind {
                            let s = source_offset as usize;
                            let mut payload = vec![0u8; bs];
                            r.decode_payload(op, &mut payload).unwrap();
                            blk.copy_from_slice(&disk[s..s + bs]);
                            for (d, s) in blk.iter_mut().zip(&payload) {
                                *d ^= s;
                            }
                        } else {
                            r.read_block(b as u64, pristine.as_slice(), &mut blk)
                                .unwrap();
                        }
                        buf[k * bs..(k + 1) * bs].copy_from_slice(&blk);
                    }
                }
            }
            let d = op.new_block as usize * bs;
            disk[d..d + n * bs].copy_from_slice(&buf);
        }
        assert!(
            disk == c.target,
            "{name}: in-place merge differs from target"
        );
    }
}

#[test]
fn header_fields() {
    let c = load("v3_copy_chain_seq");
    let r = CowReader::open(c.cow.as_slice()).unwrap();
    let h = r.header();
    assert_eq!((h.major, h.header_size, h.buffer_size), (3, 78, 2097152));
    assert_eq!(r.sequence(), &[11, 10, 9, 8, 7, 6, 5, 20, 21, 22, 23]);
    assert_eq!(h.scratch().unwrap().offset, 78);
    let c = load("v3_basic_none");
    let r = CowReader::open(c.cow.as_slice()).unwrap();
    assert_eq!(r.resume_points(), &[(0, 3), (1, 6), (2, 8)]);
    let c = load("v3_multiblock_lz4_64k");
    let r = CowReader::open(c.cow.as_slice()).unwrap();
    let units: Vec<u32> = r
        .data_ops()
        .filter_map(|o| o.payload())
        .map(|p| p.unit_blocks)
        .collect();
    assert_eq!(units, vec![16, 4, 2, 1]);
    let c = load("v2_basic_none");
    let r = CowReader::open(c.cow.as_slice()).unwrap();
    assert_eq!(r.labels(), vec![0, 1, 2]);
    assert_eq!(r.footer().unwrap().num_ops, 12);
}

#[test]
fn open_at_label() {
    let at = |cow: &[u8], label| {
        let opts = OpenOptions {
            label: Some(label),
            ..Default::default()
        };
        CowReader::open_with(cow, opts).map(|r| r.data_ops().count())
    };
    let v2 = load("v2_basic_none").cow;
    assert_eq!(at(&v2, 1).unwrap(), 6);
    assert!(at(&v2, 9).is_err(), "a label that is not in the file");
    assert_eq!(at(&load("v3_basic_none").cow, 1).unwrap(), 6);
}
