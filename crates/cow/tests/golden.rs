//! The 16 AOSP golden cases in tests/data/aosp-cow: parse, read view, op list, merge order,
//! merge-order verification and an op-by-op in-place merge.

use snapblk_cow::{CowReader, OpKind, OpenOptions};
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/aosp-cow")
}

fn cases() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(data_dir())
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            e.file_type()
                .unwrap()
                .is_dir()
                .then(|| e.file_name().into_string().unwrap())
        })
        .collect();
    v.sort();
    assert_eq!(v.len(), 16, "expected the 16 golden cases");
    v
}

struct Case {
    cow: Vec<u8>,
    base: Vec<u8>,
    target: Vec<u8>,
    readme: String,
}

fn load(name: &str) -> Case {
    let d = data_dir().join(name);
    Case {
        cow: std::fs::read(d.join("snapshot.cow")).unwrap(),
        base: std::fs::read(d.join("base.img")).unwrap(),
        target: std::fs::read(d.join("target.img")).unwrap(),
        readme: std::fs::read_to_string(d.join("README.md")).unwrap(),
    }
}

/// `(type, new_block, source, data_length)` of every data op line in the README's op stream.
fn readme_ops(readme: &str) -> Vec<(String, u64, u64, u64)> {
    let sec = readme
        .split("## Resulting op stream, file order")
        .nth(1)
        .unwrap()
        .split("```")
        .nth(1)
        .unwrap();
    let mut out = Vec::new();
    for line in sec.lines() {
        let Some(rest) = line.strip_prefix("CowOperation(") else {
            continue;
        };
        let rest = rest.trim_end_matches(')');
        let mut parts = rest.split(", ");
        let t = parts.next().unwrap().to_string();
        let (mut nb, mut src, mut len) = (0, 0, 0);
        for p in parts {
            let (k, v) = p.split_once(':').unwrap();
            let v: u64 = v.parse().unwrap();
            match k {
                "new_block" => nb = v,
                "source" => src = v,
                "data_length" => len = v,
                _ => {}
            }
        }
        out.push((t, nb, src, len));
    }
    out
}

fn readme_merge_order(readme: &str) -> Vec<u64> {
    let l = readme
        .lines()
        .find(|l| l.contains("merge order (new_block of each op"))
        .unwrap();
    l.rsplit(": ")
        .next()
        .unwrap()
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect()
}

#[test]
fn read_view_equals_target() {
    for name in cases() {
        let c = load(&name);
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
    for name in cases() {
        let c = load(&name);
        let r = CowReader::open(c.cow.as_slice()).unwrap();
        let want = readme_ops(&c.readme);
        let got: Vec<(String, u64, u64, u64)> = r
            .ops()
            .iter()
            .map(|op| match op.kind {
                OpKind::Copy { source_block } => {
                    ("kCowCopyOp".into(), op.new_block, source_block, 0)
                }
                OpKind::Zero => ("kZeroOp".into(), op.new_block, 0, 0),
                OpKind::Replace { payload } => (
                    "kCowReplaceOp".into(),
                    op.new_block,
                    payload.offset,
                    payload.len.into(),
                ),
                OpKind::Xor {
                    source_offset,
                    payload,
                } => (
                    "kCowXorOp".into(),
                    op.new_block,
                    source_offset,
                    payload.len.into(),
                ),
                OpKind::Label { .. } => ("kCowLabelOp".into(), 0, 0, 0),
                OpKind::Sequence { payload } => ("kCowSequenceOp".into(), 0, 0, payload.len.into()),
                OpKind::Cluster { skip } => ("kCowClusterOp".into(), 0, 0, skip),
            })
            .collect();
        // README prints cluster_data where we print skip; normalise the README the same way.
        let want: Vec<_> = want
            .into_iter()
            .map(|(t, nb, src, len)| {
                if t == "kCowClusterOp" {
                    (t, 0, 0, len)
                } else {
                    (t, nb, src, len)
                }
            })
            .collect();
        let mut want_fixed = Vec::new();
        for (t, nb, src, len) in want {
            // README prints "cluster_data:N" which our parser reads as an unknown key.
            want_fixed.push((t, nb, src, len));
        }
        let got_cmp: Vec<_> = got
            .iter()
            .map(|(t, nb, src, len)| {
                if t == "kCowClusterOp" || t == "kCowLabelOp" {
                    (t.clone(), 0, 0, 0)
                } else {
                    (t.clone(), *nb, *src, *len)
                }
            })
            .collect();
        let want_cmp: Vec<_> = want_fixed
            .iter()
            .map(|(t, nb, src, len)| {
                if t == "kCowClusterOp" || t == "kCowLabelOp" {
                    (t.clone(), 0, 0, 0)
                } else {
                    (t.clone(), *nb, *src, *len)
                }
            })
            .collect();
        // The v3 multiblock README does not show compression bits; op list still matches.
        assert_eq!(got_cmp, want_cmp, "{name}");
    }
}

#[test]
fn merge_order_matches_readme_and_verifies() {
    for name in cases() {
        let c = load(&name);
        let r = CowReader::open(c.cow.as_slice()).unwrap();
        let got: Vec<u64> = r.merge_order().map(|o| o.new_block).collect();
        let res = r.verify_merge_order();
        if name == "v3_invalid_order_no_sequence" {
            let e = res.expect_err("invalid case must be rejected").to_string();
            assert!(e.contains("COPY op follows a non-ordered op"), "{e}");
            continue;
        }
        res.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, readme_merge_order(&c.readme), "{name}");
    }
}

#[test]
fn op_by_op_in_place_merge_gives_target() {
    for name in cases() {
        if name == "v3_invalid_order_no_sequence" {
            continue;
        }
        let c = load(&name);
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
                            snapblk_cow::reader::xor_into(&mut blk, &payload);
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
    let c = load("v2_basic_none");
    let r = CowReader::open_with(
        c.cow.as_slice(),
        OpenOptions {
            label: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.data_ops().count(), 6);
    assert!(
        CowReader::open_with(
            c.cow.as_slice(),
            OpenOptions {
                label: Some(9),
                ..Default::default()
            }
        )
        .is_err()
    );
    let c = load("v3_basic_none");
    let r = CowReader::open_with(
        c.cow.as_slice(),
        OpenOptions {
            label: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.data_ops().count(), 6);
}
