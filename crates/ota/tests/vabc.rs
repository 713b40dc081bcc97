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
use snapblk_cow::{CowReader, OpKind};
use snapblk_ota::testing::apply_to_memory;
use snapblk_ota::testing::vabc::{VabcFields, cow_copy, cow_xor, vabc_case};
use snapblk_ota::{
    DeviceProfile, END_OF_INSTALL_LABEL, PartitionUpdate, Payload, VabcError, VabcParams,
    estimate_vabc_cow, vabc_merge_sequence, write_vabc_cow,
};
use snapblk_testsupport::{TempDir, path_str, tool_ok};

mod cow_size;

use cow_size::{B, Counts, zlib_bound};

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
    write_on(c, profile, None)
}

/// [`write`] with the writer compressing on `threads` threads instead of the manifest's 2.
fn write_on(
    c: &Case,
    profile: DeviceProfile,
    threads: Option<u32>,
) -> (Vec<u8>, PartitionUpdate, VabcParams) {
    let payload = Payload::from_bytes(c.payload.clone()).unwrap();
    let (applied, _) = apply_to_memory(&payload, None, &[("system", &c.old)], false, 1).unwrap();
    assert!(applied[0].1 == c.new, "apply builds the new image");
    let m = payload.manifest();
    let p = m.partitions[0].clone();
    let mut params = VabcParams::from_manifest(m, &p).unwrap();
    assert_eq!(params.threads, 2, "vabc_feature_set.threaded");
    params.threads = threads.unwrap_or(params.threads);
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

/// The format's size of a COW, from counts derived from the payload ([`Counts`]), checked
/// two ways (an exact size cannot be derived for compressed payloads: their lengths depend on
/// the compressor's implementation and version, which is why update_engine's generator runs
/// its writer dry):
/// - exact layout: the file is its fixed parts (header, scratch, sequence, resume area, `slots`
///   op records; v2: clusters of 1024 record slots, the last padded when it holds payloads,
///   and the footer) plus the stored payloads the reader finds, not one byte more;
/// - upper bound: the same layout with every block's payload at its worst case (v3, and v2
///   lz4/zstd: the raw block, which the writer stores when compression does not shrink it;
///   v2 gz: zlib's `compressBound` per block), equal to the size for `none`.
///
/// Returns the bound.
fn analytical_bound(
    cow: &CowReader<Vec<u8>>,
    len: u64,
    c: &Counts,
    slots: u64,
    comp: &str,
    what: &str,
) -> u64 {
    let stored: u64 = cow
        .data_ops()
        .filter_map(|o| o.payload())
        .map(|p| u64::from(p.len))
        .sum();
    if cow.header().major >= 3 {
        assert_eq!(len, c.v3_size(slots, 0) + stored, "{what}: v3 layout");
        return c.v3_size(slots, B);
    }
    assert_eq!(len, c.v2_size(0) + stored, "{what}: v2 layout");
    let gz = comp.is_empty() || comp.starts_with("gz");
    c.v2_size(if gz { zlib_bound(B) } else { B })
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
                    // The counts from the payload are the writer's.
                    let c = Counts::from_payload(&p, profile);
                    let r = est.report;
                    assert_eq!(
                        (c.copy, c.xor, c.replace, c.zero, c.verity, c.sequence),
                        (
                            r.copy_blocks,
                            r.xor_blocks,
                            r.replace_blocks,
                            r.zero_blocks,
                            r.verity_blocks,
                            r.sequence_blocks
                        ),
                        "{what}: counts from the payload"
                    );
                    let bound = analytical_bound(&cow, len, &c, params.op_count_max, comp, &what);
                    assert!(
                        len <= bound,
                        "{what}: {len} over the analytical bound {bound}"
                    );
                    if comp == "none" {
                        assert_eq!(len, bound, "{what}: uncompressed = the bound");
                    }
                    if version == 3 && comp == "none" && factor == 0 {
                        // One op record per block without multi-block units.
                        assert_eq!(c.op_records(), r.op_records, "{what}");
                        let want = c.v3_size(params.op_count_max, B);
                        assert_eq!(len, want, "{what}: analytical size");
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

/// SHA-256 of the COW per (version, compression, compression factor, profile) of the case,
/// pinned on 2026-11-28 (commit 21674f0): the writer's speed work must not change one byte.
/// Every COW here also verifies and merges right (the test above); if a dependency update
/// (lz4_flex, zstd, flate2) changes a compressed stream, re-pin after that test passes.
const PINNED: &[&str] = &[
    "v2 none 0 p0 47ffd585564df2eeba8f5036eedc39c10abf3a9bf214854d5ba959ee153cd2a5",
    "v2 none 0 p1 0e0cdf619e562cbea19e7399388df28f91dc7cb2fd0d013845df4daa85dc559e",
    "v2 none 0 p2 f3cbc50f78501c03bfb9d4b6b4e7d552bad3812b1b5810fdbe5e1d666d90a721",
    "v2 lz4 0 p0 ca40131b68ee9ed13b1701abb6cc3a16fcb071378481590bf78b08ca0b38244d",
    "v2 lz4 0 p1 7a828707d40d895477edc3a52711032df00202e85ef17912bfa594e83c067662",
    "v2 lz4 0 p2 401fef4426f5c0c07ae4110c3ee38da27aa40b2030e2fc5a57bef48240f9c715",
    "v2 gz 0 p0 1f321a5ca4824018c1b6f8a685006ebff5062a997164885dc7b7c4daf736d1c0",
    "v2 gz 0 p1 56023b7d3a2aa3d82b8741ed35ae57b7645edbe76f077d78eaf66137703cc30b",
    "v2 gz 0 p2 67ab7df7a91776c8f32cf639782bcf4c14547fbfb6ac55942ef94aee512c72da",
    "v2 zstd,3 0 p0 4a4b9eaba0d66e76a22d37904cbe26b1066bea1d42aee21bbce1df078a349b8e",
    "v2 zstd,3 0 p1 809305e94a34bbccacf199b0725f934bbb5323b948dc1437d0bd241cd3929bd1",
    "v2 zstd,3 0 p2 6aa40d1b771f309a5dfef7af799cae844d018ed37738da57f7b75c40585e49c5",
    "v3 none 0 p0 5b92d03ebe19ea50a0274f8925f5d0a995ebb0318b4f8511ccab2bb1d86b32fa",
    "v3 none 0 p1 b11b5cffed01109e0d4016a249dfeb5c42a584223f44abed2eeb5eba74a287cd",
    "v3 none 0 p2 19f291c992216fb796f08df9590dd4474d848978ef64d0c1c3598705dba6dbd8",
    "v3 none 16384 p0 aa379ce28a7f0211e166ef9f9f1bfc37c270be093a395f520c2db29178aaab55",
    "v3 none 16384 p1 8cc0ca3025cc9285247a284f19b73743fb98e47e0eba84d4c35e7c6791fc8043",
    "v3 none 16384 p2 5990059cadce2dcb793d5d06c4bc2bb5fd9f8941457b895417a1e7eee2ee4f80",
    "v3 lz4 0 p0 437cd8e5241bbc34c736aabb175bc926adaae8839f7118bfb52a6eff1930bca4",
    "v3 lz4 0 p1 d192ad8fa87d90da1154bf033416f93d52065ee362745a4a052d1a89bfb02a6a",
    "v3 lz4 0 p2 0bc08daf0d5129c649f4350156b18fc3f452e024249ecb8df0b70b3d6ccb0774",
    "v3 lz4 16384 p0 b7f7b030248166668dce551d33a74eee61b646dd6ac3707d587f884328ea738b",
    "v3 lz4 16384 p1 79fecb5640543d7bc0bca826097bd3140fe550ccb9cb61c895da0dbcbf0e613c",
    "v3 lz4 16384 p2 a3faa15203bbdb18b504a1b5c2f139ebacd5b33a1e89db6c77d50a962473c108",
    "v3 gz 0 p0 4b6a00f285cb9714178f0adcd87b1be48830d1b8189f90e917fadac9091351ff",
    "v3 gz 0 p1 8566e5cd6cdf48813970a55ef18951503c5abea4eeb329d467be6b4527aa0850",
    "v3 gz 0 p2 8e6d9d1408cc9d360892e4cd5caf2fd25333a533129dd8f0403ce765637b1d20",
    "v3 gz 16384 p0 fc612b0330f49edcbbb5ebe1bcf993e99185a3c7e5fcf194bb8b8228a7aedb23",
    "v3 gz 16384 p1 2944d73238d7dc9ae03527f329c578c757561bb59ae9176ab76267a1608fc0dd",
    "v3 gz 16384 p2 00d7c2cd55c67faa6ea5f0a11ad9ed845b2c385b920515f0b7f68f3b60f7012a",
    "v3 zstd,3 0 p0 046423e0420ece2792b6e69f708c4650bff209d0c73a85484090e92f8da085d2",
    "v3 zstd,3 0 p1 068759c997ac956007e6789644d59206aa0d65529aec3baf4cc582a610ff955e",
    "v3 zstd,3 0 p2 bdea09bd920db0d3c13ff2990bd7e8307948376f81a5248f26f760cd693408cd",
    "v3 zstd,3 16384 p0 3736752cf2b5f742c122da3fd856fdd464ea52209ee27b45898c8d2b64f1de95",
    "v3 zstd,3 16384 p1 a83f94fef70d241607d92f4bfdc0c3bcb183cdbfe27e37b658cdf2daa7d0b90c",
    "v3 zstd,3 16384 p2 87f5721fa7ba5b24755a97e034b8113019bdf5216fc8a8c53351ca88eb4e2fad",
];

#[test]
fn cow_bytes_stay_pinned() {
    let mut got = Vec::new();
    for version in [2, 3] {
        for comp in ["none", "lz4", "gz", "zstd,3"] {
            for factor in [0, 16384] {
                if version == 2 && factor > 0 {
                    continue;
                }
                let c = case(&fields(version, comp, factor));
                for (k, profile) in PROFILES.into_iter().enumerate() {
                    // The same bytes on one thread as on the manifest's two and on four.
                    let (bytes, _, _) = write(&c, profile);
                    for t in [1, 4] {
                        assert!(
                            write_on(&c, profile, Some(t)).0 == bytes,
                            "v{version} {comp} {factor} p{k}: {t} threads write other bytes"
                        );
                    }
                    let h = <sha2::Sha256 as sha2::Digest>::digest(&bytes);
                    let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
                    got.push(format!("v{version} {comp} {factor} p{k} {hex}"));
                }
            }
        }
    }
    let want: Vec<String> = PINNED.iter().map(|s| s.to_string()).collect();
    assert!(got == want, "COW bytes changed; now:\n{}", got.join("\n"));
}
