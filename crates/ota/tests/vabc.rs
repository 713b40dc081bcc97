//! The VABC COW writer (`write_vabc_cow`) on an incremental payload built by the crate's
//! writer (bsdiff patches by Debian's `bsdiff`), with merge operations of every kind, a
//! dm-verity tree and FEC left to the device, over COW v2 and v3, every compression, and the
//! three device profiles: a test per rule of update_engine's writer (COPY only for merge-op
//! blocks, XOR only inside COW_XOR extents against the source at `src_offset` with the
//! past-the-end edge case, REPLACE elsewhere, ZERO for ZERO/DISCARD, the merge sequence,
//! labels, verity after the end label), then the COW read back by snapblk-cow's reader:
//! `verify` against the new image, the snapshot view and a simulated merge equal to the new
//! image, and the size against the dry run and an analytical count from the format.

use std::collections::BTreeMap;
use std::time::Duration;

use snapblk_core::MemFile;
use snapblk_cow::{CowReader, Header, OpKind};
use snapblk_ota::testing::apply_to_memory;
use snapblk_ota::testing::vabc::{VabcFields, cow_copy, cow_xor, vabc_case};
use snapblk_ota::{
    DeviceProfile, END_OF_INSTALL_LABEL, PartitionUpdate, Payload, VabcError, VabcParams,
    VabcReport, estimate_vabc_cow, vabc_merge_sequence, write_vabc_cow,
};
use snapblk_testsupport::{TempDir, path_str, tool_ok};

const BS: usize = 4096;
const B: u64 = BS as u64;

fn bsdiff(old: &[u8], new: &[u8]) -> Vec<u8> {
    let d = TempDir::new("ota-vabc-bsdiff");
    let (o, n, p) = (d.join("old"), d.join("new"), d.join("patch"));
    std::fs::write(&o, old).unwrap();
    std::fs::write(&n, new).unwrap();
    tool_ok("bsdiff", &[path_str(&o), path_str(&n), path_str(&p)]);
    std::fs::read(&p).unwrap()
}

struct Case {
    old: Vec<u8>,
    new: Vec<u8>,
    payload: Vec<u8>,
}

fn case(vabc: &VabcFields) -> Case {
    let c = vabc_case(vabc, &bsdiff);
    Case {
        old: c.old,
        new: c.new,
        payload: c.built.to_bytes(),
    }
}

fn fields(version: u32, compression: &str, factor: u64) -> VabcFields {
    VabcFields {
        cow_version: version,
        compression: compression.into(),
        compression_factor: factor,
        batch_writes: true,
        threaded: true,
    }
}

/// The COW of the case's partition under `profile`, and the partition as the payload has it.
fn write(c: &Case, profile: DeviceProfile) -> (Vec<u8>, PartitionUpdate, VabcParams) {
    let payload = Payload::from_bytes(c.payload.clone()).unwrap();
    let (applied, _) = apply_to_memory(&payload, None, &[("system", &c.old)], false, 1).unwrap();
    assert!(applied[0].1 == c.new, "apply builds the new image");
    let m = payload.manifest();
    let p = m.partitions[0].clone();
    let params = VabcParams::from_manifest(m, &p).unwrap();
    let sink = MemFile::new(Vec::new());
    let r = write_vabc_cow(&p, &params, profile, Some(&c.old), &applied[0].1, &sink).unwrap();
    // The writer's timing: its image reads and its verity blocks within the whole call.
    let t = r.timing;
    assert!(
        t.read > Duration::ZERO
            && t.read <= t.total
            && t.verity > Duration::ZERO
            && t.verity <= t.total,
        "{t:?}"
    );
    (sink.into_inner(), p, params)
}

/// Per new block, the op the COW has for it: ("copy"|"xor"|"replace"|"zero", source offset).
fn ops_by_block(cow: &CowReader<Vec<u8>>) -> BTreeMap<u64, (&'static str, u64)> {
    let mut m = BTreeMap::new();
    for op in cow.data_ops() {
        let (t, src) = match op.kind {
            OpKind::Copy { source_block } => ("copy", source_block * B),
            OpKind::Xor { source_offset, .. } => ("xor", source_offset),
            OpKind::Replace { .. } => ("replace", 0),
            OpKind::Zero => ("zero", 0),
            _ => continue,
        };
        for b in op.new_block..op.new_block + op.block_count() {
            assert!(m.insert(b, (t, src)).is_none(), "block {b} written twice");
        }
    }
    m
}

const PROFILES: [DeviceProfile; 3] = [
    DeviceProfile::CURRENT,
    DeviceProfile::NO_XOR,
    DeviceProfile::LEGACY,
];

#[test]
fn every_block_gets_the_op_update_engine_writes() {
    let c = case(&fields(3, "lz4", 0));
    for profile in PROFILES {
        let (cow, _, _) = write(&c, profile);
        let cow = CowReader::open(cow).unwrap();
        let got = ops_by_block(&cow);
        let mut want: BTreeMap<u64, (&str, u64)> = BTreeMap::new();
        for i in 0..4 {
            want.insert(i, ("copy", (36 + i) * B)); // COW_COPY
        }
        // 4, 5: identity copy, nothing. 6, 7: SOURCE_COPY without a merge op.
        for b in [6, 7, 14, 15, 20, 21, 27, 31] {
            want.insert(b, ("replace", 0));
        }
        want.insert(22, ("copy", 21 * B));
        want.insert(23, ("copy", 22 * B));
        for b in 28..31 {
            want.insert(b, ("zero", 0));
        }
        for b in 32..35 {
            want.insert(b, ("replace", 0)); // hash tree, FEC
        }
        for b in (8..14).chain(16..20).chain(24..27) {
            let x = match b {
                8..14 => (12 + b - 8) * B,
                // Block 19 would read 100 bytes past the old image's end: aligned source.
                19 => 47 * B,
                16..19 => (44 + b - 16) * B + 100,
                _ => (28 + b - 24) * B + 200,
            };
            want.insert(
                b,
                if profile.xor {
                    ("xor", x)
                } else {
                    ("replace", 0)
                },
            );
        }
        assert_eq!(got, want, "{profile:?}");
    }
}

#[test]
fn merge_sequence_follows_the_merge_operations_and_the_profile() {
    let c = case(&fields(3, "none", 0));
    let asc_desc: Vec<u32> = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 16, 17, 18, 19, 23, 22]
        .into_iter()
        .chain([24, 25, 26])
        .collect();
    let (cow, p, _) = write(&c, DeviceProfile::CURRENT);
    let cow = CowReader::open(cow).unwrap();
    assert_eq!(cow.sequence(), &asc_desc[..]);
    assert_eq!(
        vabc_merge_sequence(&p, 4096, 48, DeviceProfile::CURRENT).unwrap(),
        asc_desc
    );
    cow.verify_merge_order().unwrap();
    // Without userspace snapshots, non-overlapping ops descend; overlapping ones keep their
    // direction.
    let p2 = DeviceProfile {
        xor: true,
        userspace_snapshots: false,
    };
    let want: Vec<u32> = [
        3, 2, 1, 0, 8, 9, 10, 11, 12, 13, 19, 18, 17, 16, 23, 22, 26, 25, 24,
    ]
    .into();
    assert_eq!(vabc_merge_sequence(&p, 4096, 48, p2).unwrap(), want);
    // One overlapping copy moving forward descends, one moving back ascends, in both modes.
    let mut q = p.clone();
    q.merge_operations = vec![cow_copy(21, 22, 2), cow_copy(9, 8, 2)];
    for profile in [DeviceProfile::CURRENT, p2] {
        assert_eq!(
            vabc_merge_sequence(&q, 4096, 48, profile).unwrap(),
            [23, 22, 8, 9]
        );
    }
    // No XOR: no sequence; the COW_COPY ops come first (before label 0), in merge order,
    // block by block from the last without userspace snapshots.
    for (profile, order) in [
        (DeviceProfile::NO_XOR, vec![0, 1, 2, 3, 23, 22]),
        (DeviceProfile::LEGACY, vec![3, 2, 1, 0, 23, 22]),
    ] {
        let (cow, _, _) = write(&c, profile);
        let cow = CowReader::open(cow).unwrap();
        assert!(cow.sequence().is_empty());
        let first: Vec<u64> = cow
            .data_ops()
            .take(6)
            .map(|o| {
                assert!(matches!(o.kind, OpKind::Copy { .. }), "{profile:?}: {o:?}");
                o.new_block
            })
            .collect();
        assert_eq!(first, order, "{profile:?}");
    }
}

/// The op index each label of a v3 COW points at, and the v2 COW's op stream as
/// (label | data block) in file order.
#[test]
fn labels_after_every_operation_and_verity_after_the_end_label() {
    let c = case(&fields(2, "gz", 0));
    let (cow, p, _) = write(&c, DeviceProfile::CURRENT);
    let cow = CowReader::open(cow).unwrap();
    let mut labels = Vec::new();
    let mut after_end = Vec::new();
    for op in cow.ops() {
        match op.kind {
            OpKind::Label { label } => labels.push(label),
            _ if labels.last() == Some(&END_OF_INSTALL_LABEL) && op.is_data() => {
                assert!(matches!(op.kind, OpKind::Replace { .. }), "{op:?}");
                after_end.push(op.new_block)
            }
            _ => {}
        }
    }
    let want: Vec<u64> = (0..=p.operations.len() as u64)
        .chain([END_OF_INSTALL_LABEL])
        .collect();
    assert_eq!(labels, want);
    assert_eq!(after_end, vec![32, 33, 34]);

    // v3: resume points, the end one before the verity ops.
    let c = case(&fields(3, "gz", 0));
    let (cow, _, _) = write(&c, DeviceProfile::CURRENT);
    let cow = CowReader::open(cow).unwrap();
    let rp = cow.resume_points();
    let &(label, at) = rp.last().unwrap();
    assert_eq!(label, END_OF_INSTALL_LABEL);
    let tail: Vec<u64> = cow.ops()[at as usize..]
        .iter()
        .map(|o| {
            assert!(matches!(o.kind, OpKind::Replace { .. }));
            o.new_block
        })
        .collect();
    assert_eq!(tail, vec![32, 33, 34]);
}

/// What the format says the file must hold, counted from the rules without the writer:
/// v3 = header + scratch + sequence (4 B per entry) + resume area + 16 B per op + payloads.
fn analytical_v3_none(h: &Header, seq: u64, ops: u64, data_blocks: u64) -> u64 {
    u64::from(h.header_size)
        + u64::from(h.buffer_size)
        + seq * 4
        + u64::from(h.resume_point_max) * 16
        + ops * 16
        + data_blocks * B
}

/// zlib's `compressBound`: the most a deflate stream of `n` bytes can take (stored blocks and
/// the zlib wrapper), whatever the implementation.
fn zlib_bound(n: u64) -> u64 {
    n + (n >> 12) + (n >> 14) + (n >> 25) + 13
}

/// The format's size of a compressed COW, checked two ways (an exact size cannot be derived
/// for compressed payloads: their lengths depend on the compressor's implementation and
/// version, which is why update_engine's generator runs its writer dry):
/// - exact layout: the file is its fixed parts (header, scratch, sequence, resume area, op
///   records; v2: clusters of `cluster_ops` record slots, the last padded when it holds
///   payloads, and the footer) plus the stored payloads the reader finds, not one byte more;
/// - upper bound: the same layout with every unit at its worst case (v3, and v2 lz4/zstd: the
///   raw unit, which the writer stores when compression does not shrink it; v2 gz: zlib's
///   `compressBound` per block), equal to the size for `none`.
///
/// Returns the bound.
fn analytical_bound(cow: &CowReader<Vec<u8>>, len: u64, r: &VabcReport, what: &str) -> u64 {
    let h = cow.header();
    let data_blocks = r.xor_blocks + r.replace_blocks + r.verity_blocks;
    let stored: u64 = cow
        .data_ops()
        .filter_map(|o| o.payload())
        .map(|p| u64::from(p.len))
        .sum();
    let comp = cow
        .data_ops()
        .filter_map(|o| o.payload())
        .map(|p| p.recorded)
        .find(|c| *c != snapblk_cow::Compression::None);
    let fixed = u64::from(h.header_size) + u64::from(h.buffer_size);
    if h.major >= 3 {
        let structure = analytical_v3_none(h, r.sequence_blocks, h.op_count_max, 0);
        assert_eq!(len, structure + stored, "{what}: v3 layout");
        return structure + data_blocks * B;
    }
    // v2: one record per block op, per label and per sequence op (u32 entries, at most
    // 65535 bytes a record), plus a CLUSTER record closing each cluster.
    let footer = cow.footer().expect("a finalized v2 COW has a footer");
    let n = footer.num_ops;
    let k = u64::from(h.cluster_ops);
    let seq_bytes = r.sequence_blocks * 4;
    let tight = fixed + 20 * n + seq_bytes + stored + 84;
    let padded = fixed + 20 * k * n.div_ceil(k) + seq_bytes + stored + 84;
    assert!(
        len == tight || len == padded,
        "{what}: v2 layout {len} vs {tight}/{padded}"
    );
    let per_block = match comp {
        Some(snapblk_cow::Compression::Gz) => zlib_bound(B),
        _ => B,
    };
    len - stored + data_blocks * per_block
}

#[test]
fn cows_verify_merge_to_the_new_image_in_every_version_and_compression() {
    for version in [2, 3] {
        for comp in ["none", "lz4", "gz", "zstd,3", ""] {
            for factor in [0, 16384] {
                if version == 2 && factor > 0 {
                    continue;
                }
                let c = case(&fields(version, comp, factor));
                for profile in PROFILES {
                    let what = format!("v{version} {comp:?} factor {factor} {profile:?}");
                    let (bytes, p, params) = write(&c, profile);
                    let len = bytes.len() as u64;
                    let cow = CowReader::open(bytes).unwrap();
                    let want_comp = if comp.is_empty() {
                        "gz"
                    } else {
                        &comp[..comp.find(',').unwrap_or(comp.len())]
                    };
                    if version == 3 {
                        assert_eq!(cow.compression().name(), want_comp, "{what}");
                    }
                    let r = snapblk_cow::verify(&cow, &c.old, c.new.len() as u64, Some(&c.new))
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(r.matches_expected, Some(true), "{what}");
                    // The snapshot view, and a merge over a copy of the old image.
                    let mut view = Vec::new();
                    snapblk_cow::apply(&cow, &c.old, c.new.len() as u64, &mut view, &|_| {})
                        .unwrap();
                    assert!(view == c.new, "{what}: view");
                    let mut disk = c.old.clone();
                    snapblk_cow::simulate_merge(&cow, &mut disk).unwrap();
                    assert!(disk[..c.new.len()] == c.new[..], "{what}: merge");
                    // Dry run: the same size once the op area holds exactly the ops.
                    let est =
                        estimate_vabc_cow(&p, &params, profile, Some(&c.old), &c.new).unwrap();
                    let slack = if version == 3 {
                        (params.op_count_max - est.report.op_records) * 16
                    } else {
                        0
                    };
                    if version == 3 && est.report.op_records >= 25 {
                        assert_eq!(len - slack, est.cow_size, "{what}");
                    }
                    assert_eq!(est.estimate_cow_size, est.cow_size + est.cow_size / 100);
                    let bound = analytical_bound(&cow, len, &est.report, &what);
                    assert!(
                        len <= bound,
                        "{what}: {len} over the analytical bound {bound}"
                    );
                    if comp == "none" {
                        assert_eq!(len, bound, "{what}: uncompressed = the bound");
                    }
                    if version == 3 && comp == "none" && factor == 0 {
                        let r = est.report;
                        let ops = r.copy_blocks
                            + r.xor_blocks
                            + r.replace_blocks
                            + r.zero_blocks
                            + r.verity_blocks;
                        let data = r.xor_blocks + r.replace_blocks + r.verity_blocks;
                        let want = analytical_v3_none(
                            cow.header(),
                            r.sequence_blocks,
                            params.op_count_max,
                            data,
                        );
                        assert_eq!(len, want, "{what}: analytical size");
                        assert_eq!(ops, est.report.op_records, "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn v3_units_follow_the_compression_factor_per_call() {
    // 16 KiB units: REPLACE runs are cut per call into the largest power of two that fits.
    let c = case(&fields(3, "none", 16384));
    let (cow, _, _) = write(&c, DeviceProfile::NO_XOR);
    let cow = CowReader::open(cow).unwrap();
    let units: Vec<(u64, u32)> = cow
        .data_ops()
        .filter_map(|o| match o.kind {
            OpKind::Replace { payload } => Some((o.new_block, payload.unit_blocks)),
            _ => None,
        })
        .collect();
    // 8..16 (one call of 8 blocks): two 4-block units; 16..20: one; 24..28: 4; 32 and 33..35
    // (the tree and the FEC are separate extents): 1, then 2.
    for u in [
        (8, 4),
        (12, 4),
        (16, 4),
        (24, 4),
        (32, 1),
        (33, 2),
        (6, 2),
        (20, 2),
    ] {
        assert!(units.contains(&u), "{u:?} in {units:?}");
    }
}

#[test]
fn bad_merge_operations_and_a_cow_too_small_are_refused() {
    let c = case(&fields(3, "none", 0));
    let payload = Payload::from_bytes(c.payload.clone()).unwrap();
    let m = payload.manifest();
    let mut p = m.partitions[0].clone();
    let params = VabcParams::from_manifest(m, &p).unwrap();
    let run = |p: &PartitionUpdate, params: &VabcParams| {
        write_vabc_cow(
            p,
            params,
            DeviceProfile::CURRENT,
            Some(&c.old),
            &c.new,
            MemFile::new(Vec::new()),
        )
    };
    p.merge_operations.push(cow_copy(47, 30, 2));
    let e = run(&p, &params).unwrap_err();
    assert!(matches!(e, VabcError::MergeOp { index: 7, .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "merge operation 7: source 47+2 outside the old image (48 blocks)"
    );
    p.merge_operations.pop();
    p.merge_operations.push(cow_xor(0, 1, 9, 1, 0));
    let e = run(&p, &params).unwrap_err();
    assert!(e.to_string().contains("overlaps another XOR"), "{e}");
    p.merge_operations.pop();
    let mut small = params;
    small.op_count_max = 10;
    let e = run(&p, &small).unwrap_err();
    assert!(matches!(e, VabcError::Cow(_)), "{e}");
    // An offset XOR reading neither one extra block nor ending at the old image's end.
    p.merge_operations[3] = cow_xor(46, 2, 16, 4, 100);
    let e = run(&p, &params).unwrap_err();
    assert_eq!(
        e.to_string(),
        "merge operation 3: 2 source blocks for 4 destination blocks (want 5)"
    );
}
