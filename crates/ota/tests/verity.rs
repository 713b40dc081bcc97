//! The dm-verity hash tree and FEC against an independent implementation: cryptsetup's
//! `veritysetup format` (no superblock, format 1 = salt first, 4 KiB blocks) writes the tree and
//! the FEC into one image after its data; snapblk-ota must write the same bytes and report the
//! same root hash, directly (`Verity::write` over an image whose tree and FEC areas hold
//! garbage) and through payloads whose operations leave those areas out: a full one
//! (`extract`) and an incremental one built from an older veritysetup-made image with
//! SOURCE_COPY and patches made by Debian's `bsdiff` (`apply`).
//!
//! veritysetup's FEC, with the data, the hash tree and the FEC in one file (`--hash-offset` =
//! the end of the data, `--fec-device` the same file), covers the file from 0 to the FEC's
//! offset, as Android's `fec_data_extent` does; see docs/ota.md for the mapping.

use snapblk_core::MemFile;
use snapblk_core::sync::lock;
use snapblk_ota::testing::{DeltaOp, Encoding, PayloadBuilder, apply_to_memory, extract_to_memory};
use snapblk_ota::{
    Extent, ExtractOptions, ExtractProgress, HashAlgorithm, Output, PartitionUpdate, Payload,
    Verity, hash_tree_levels,
};
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

const BS: u64 = 4096;

/// One layout to compare.
struct Case {
    name: &'static str,
    /// Size of the ext4 file system (the data), in blocks.
    data_blocks: u64,
    hash: &'static str,
    /// Hex salt, `-` for none.
    salt: &'static str,
    roots: u32,
    /// Blocks between the tree and the FEC (covered by the FEC, as in veritysetup).
    gap: u64,
    /// Blocks after the FEC (vbmeta and footer in an avb image): left alone.
    trailer: u64,
}

const CASES: &[Case] = &[
    // One level (100 < 128 blocks, not a multiple of the fan-out).
    Case {
        name: "one-level",
        data_blocks: 100,
        hash: "sha256",
        salt: "a5c2f1e8d0b3947612a5c2f1e8d0b3947612a5c2f1e8d0b3947612a5c2f1e8d0",
        roots: 2,
        gap: 0,
        trailer: 0,
    },
    // Two levels, a partial bottom level, a gap and a trailer.
    Case {
        name: "two-level",
        data_blocks: 1000,
        hash: "sha256",
        salt: "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        roots: 2,
        gap: 3,
        trailer: 5,
    },
    // One level exactly full (128 blocks), and the smallest two-level tree (129).
    Case {
        name: "one-level-full",
        data_blocks: 128,
        hash: "sha256",
        salt: "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
        roots: 2,
        gap: 0,
        trailer: 1,
    },
    Case {
        name: "two-level-smallest",
        data_blocks: 129,
        hash: "sha256",
        salt: "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
        roots: 2,
        gap: 0,
        trailer: 0,
    },
    // Three levels (16,385+ blocks); the FEC spans more than one batch of rounds.
    Case {
        name: "three-level",
        data_blocks: 16_500,
        hash: "sha256",
        salt: "5a17",
        roots: 2,
        gap: 0,
        trailer: 0,
    },
    // SHA-1 (20-byte digests in 32-byte slots), an odd salt, the most roots.
    Case {
        name: "sha1-24-roots",
        data_blocks: 300,
        hash: "sha1",
        salt: "01020304050607",
        roots: 24,
        gap: 0,
        trailer: 2,
    },
    // SHA-512, no salt, 3 roots.
    Case {
        name: "sha512-no-salt",
        data_blocks: 700,
        hash: "sha512",
        salt: "-",
        roots: 3,
        gap: 1,
        trailer: 0,
    },
];

/// An ext4 image of `blocks` 4 KiB blocks made by `mke2fs -d` from a small tree of files.
fn ext4(dir: &Path, blocks: u64, seed: u64) -> Vec<u8> {
    let tree = dir.join(format!("tree-{seed}"));
    std::fs::create_dir_all(tree.join("etc/init")).unwrap();
    std::fs::create_dir_all(tree.join("lib")).unwrap();
    std::fs::write(tree.join("etc/init/a.rc"), "service x /bin/x\n".repeat(50)).unwrap();
    // About a fifth of the file system in files, at most 8 MiB.
    let big = ((blocks * BS) / 8).min(8 << 20) as usize;
    std::fs::write(tree.join("lib/big.so"), pattern(big, seed)).unwrap();
    for i in 0..(blocks / 25).min(20) {
        std::fs::write(
            tree.join(format!("lib/f{i}")),
            pattern(1000 + i as usize * 777, seed + i),
        )
        .unwrap();
    }
    let img = dir.join(format!("fs-{seed}.img"));
    tool_ok(
        "mke2fs",
        &[
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "4096",
            "-d",
            path_str(&tree),
            path_str(&img),
            &blocks.to_string(),
        ],
    );
    let b = std::fs::read(&img).unwrap();
    assert_eq!(b.len() as u64, blocks * BS);
    b
}

/// The value of `key:` in veritysetup's report.
fn field(report: &str, key: &str) -> String {
    report
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {key} in veritysetup's report:\n{report}"))
}

/// What veritysetup made: the whole image, its root hash, and the manifest's verity fields
/// describing it.
struct Made {
    image: Vec<u8>,
    root: String,
    fields: PartitionUpdate,
    tree: (u64, u64),
    fec: (u64, u64),
}

fn veritysetup(dir: &Path, c: &Case, data: &[u8]) -> Made {
    let n = data.len() as u64 / BS;
    let common = |hash_args: &mut Vec<String>| {
        hash_args.extend(
            [
                "format",
                "--no-superblock",
                "--format=1",
                &format!("--hash={}", c.hash),
                "--data-block-size=4096",
                "--hash-block-size=4096",
                &format!("--salt={}", c.salt),
            ]
            .map(String::from),
        );
    };
    // First the tree alone in its own file: its size says where the FEC goes.
    let data_file = dir.join(format!("{}-data.img", c.name));
    std::fs::write(&data_file, data).unwrap();
    let hash_file = dir.join(format!("{}-hash.img", c.name));
    let mut args = Vec::new();
    common(&mut args);
    args.extend([path_str(&data_file).into(), path_str(&hash_file).into()]);
    let report = tool_ok(
        "veritysetup",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let tree_blocks: u64 = field(&report, "Hash blocks:").parse().unwrap();
    let root = field(&report, "Root hash:");
    assert_eq!(
        std::fs::metadata(&hash_file).unwrap().len(),
        tree_blocks * BS
    );
    // Then data | tree | gap | FEC in one file.
    let fec_start = n + tree_blocks + c.gap;
    let mut image = data.to_vec();
    image.resize(((n + tree_blocks) * BS) as usize, 0);
    image.extend(pattern((c.gap * BS) as usize, 77));
    let img = dir.join(format!("{}.img", c.name));
    std::fs::write(&img, &image).unwrap();
    let mut args = Vec::new();
    common(&mut args);
    args.extend([
        format!("--data-blocks={n}"),
        format!("--hash-offset={}", n * BS),
        format!("--fec-device={}", path_str(&img)),
        format!("--fec-offset={}", fec_start * BS),
        format!("--fec-roots={}", c.roots),
        path_str(&img).into(),
        path_str(&img).into(),
    ]);
    let report = tool_ok(
        "veritysetup",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_eq!(field(&report, "Root hash:"), root, "{}", c.name);
    let fec_blocks: u64 = field(&report, "FEC blocks:").parse().unwrap();
    let mut image = std::fs::read(&img).unwrap();
    assert_eq!(
        image.len() as u64,
        (fec_start + fec_blocks) * BS,
        "{}",
        c.name
    );
    image.extend(pattern((c.trailer * BS) as usize, 78));
    let salt = if c.salt == "-" {
        Vec::new()
    } else {
        (0..c.salt.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&c.salt[i..i + 2], 16).unwrap())
            .collect()
    };
    let ext = |start: u64, num: u64| {
        Some(Extent {
            start_block: Some(start),
            num_blocks: Some(num),
        })
    };
    let fields = PartitionUpdate {
        hash_tree_data_extent: ext(0, n),
        hash_tree_extent: ext(n, tree_blocks),
        hash_tree_algorithm: Some(c.hash.into()),
        hash_tree_salt: Some(salt),
        fec_data_extent: ext(0, fec_start),
        fec_extent: ext(fec_start, fec_blocks),
        fec_roots: Some(c.roots),
        ..Default::default()
    };
    Made {
        image,
        root,
        fields,
        tree: (n, tree_blocks),
        fec: (fec_start, fec_blocks),
    }
}

/// The block where `a` and `b` first differ, for the message.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .map(|i| i / BS as usize)
        .or_else(|| (a.len() != b.len()).then_some(a.len().min(b.len()) / BS as usize))
}

#[test]
fn hash_tree_and_fec_match_veritysetup() {
    let d = TempDir::new("ota-verity");
    for (i, c) in CASES.iter().enumerate() {
        let data = ext4(d.path(), c.data_blocks, i as u64 + 1);
        let made = veritysetup(d.path(), c, &data);
        let algorithm = HashAlgorithm::parse(c.hash).unwrap();
        // veritysetup's tree has the levels update_engine counts (for more than one block).
        let levels = hash_tree_levels(c.data_blocks, 4096, algorithm);
        assert_eq!(levels.iter().sum::<u64>(), made.tree.1, "{}", c.name);
        let expect_levels = match c.data_blocks {
            0..=128 => 1,
            129..=16_384 => 2,
            _ => 3,
        };
        assert_eq!(levels.len(), expect_levels, "{}", c.name);

        // Directly: the tree and FEC areas hold garbage first.
        let size = made.image.len() as u64;
        let v = Verity::from_partition(&made.fields, 4096, size)
            .unwrap()
            .expect("verity");
        let mut start = made.image.clone();
        for (first, count) in [made.tree, made.fec] {
            let (a, b) = ((first * BS) as usize, ((first + count) * BS) as usize);
            start[a..b].copy_from_slice(&pattern(b - a, 99));
        }
        let img = MemFile::new(start);
        let report = v.write(&img, 2).unwrap();
        let got = img.into_inner();
        assert!(
            got == made.image,
            "{}: differs from veritysetup's image at block {:?}",
            c.name,
            first_difference(&got, &made.image)
        );
        assert_eq!(report.root_digest.as_deref(), Some(made.root.as_str()));
        assert_eq!(report.hash_algorithm, Some(algorithm));
        assert_eq!(report.hash_tree_bytes, made.tree.1 * BS);
        assert_eq!(report.fec_bytes, made.fec.1 * BS);

        // Through a payload whose operations leave the tree and the FEC out (not for the
        // large case: the direct comparison covers its three levels, this covers the
        // plumbing).
        if c.data_blocks > 2000 {
            continue;
        }
        let built = {
            let mut b = PayloadBuilder::new()
                .partition(c.name, &made.image, 64, &[Encoding::Replace])
                .skip_blocks(made.tree.0, made.tree.1)
                .skip_blocks(made.fec.0, made.fec.1)
                .build();
            let p = &mut b.manifest.partitions[0];
            let name = p.partition_name.clone();
            let (ops, info) = (p.operations.clone(), p.new_partition_info.clone());
            *p = made.fields.clone();
            p.partition_name = name;
            p.operations = ops;
            p.new_partition_info = info;
            b
        };
        let payload = Payload::from_bytes(built.to_bytes()).unwrap();
        let plan = payload.plan_extract(None).unwrap();
        let written: u64 = plan.partitions()[0].dst_bytes;
        assert_eq!(
            written,
            size - (made.tree.1 + made.fec.1) * BS,
            "{}: the operations leave out the tree and the FEC",
            c.name
        );
        let out = extract_to_memory(&payload, None, 2).unwrap();
        assert!(
            out[0].1 == made.image,
            "{}: extract differs from veritysetup's image at block {:?}",
            c.name,
            first_difference(&out[0].1, &made.image)
        );
    }
}

#[test]
fn extract_refuses_bad_verity_fields_before_writing() {
    let image = pattern(40 * BS as usize, 3);
    let built = PayloadBuilder::new()
        .partition("vendor", &image, 8, &[Encoding::Replace])
        .build();
    let ext = |start: u64, num: u64| {
        Some(Extent {
            start_block: Some(start),
            num_blocks: Some(num),
        })
    };
    type Change<'a> = Box<dyn Fn(&mut PartitionUpdate) + 'a>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "partition vendor, verity: hash_tree_extent (blocks 38+4) ends past the partition's 163840 bytes",
            Box::new(|p| p.hash_tree_extent = ext(38, 4)),
        ),
        (
            "partition vendor, verity: hash_tree_extent starts at block 10, before the end of hash_tree_data_extent (block 30)",
            Box::new(|p| p.hash_tree_extent = ext(10, 1)),
        ),
        (
            "partition vendor, verity: hash_tree_algorithm \"blake3\" is not sha1, sha256 or sha512",
            Box::new(|p| p.hash_tree_algorithm = Some("blake3".into())),
        ),
        (
            "partition vendor, verity: fec_roots 30 is outside 2..=24",
            Box::new(|p| p.fec_roots = Some(30)),
        ),
        (
            "partition vendor, verity: fec_extent overlaps hash_tree_extent",
            Box::new(|p| {
                p.fec_data_extent = ext(0, 30);
                p.fec_extent = ext(30, 2);
            }),
        ),
    ];
    for (want, change) in cases {
        let mut b = built.clone();
        let p = &mut b.manifest.partitions[0];
        p.hash_tree_data_extent = ext(0, 30);
        p.hash_tree_extent = ext(30, 1);
        p.hash_tree_algorithm = Some("sha256".into());
        p.fec_data_extent = ext(0, 31);
        p.fec_extent = ext(31, 2);
        p.fec_roots = Some(2);
        change(p);
        let payload = Payload::from_bytes(b.to_bytes()).unwrap();
        let e = payload.plan_extract(None).unwrap_err();
        assert_eq!(snapblk_testsupport::errors::chain(&e), want);
    }
}

/// A BSDIFF40 patch from `old` to `new`, made by Debian's bsdiff.
fn bsdiff(old: &[u8], new: &[u8]) -> Vec<u8> {
    let d = TempDir::new("ota-verity-bsdiff");
    let (o, n, p) = (d.join("old"), d.join("new"), d.join("patch"));
    std::fs::write(&o, old).unwrap();
    std::fs::write(&n, new).unwrap();
    tool_ok("bsdiff", &[path_str(&o), path_str(&n), path_str(&p)]);
    std::fs::read(&p).unwrap()
}

/// The operations of an update from `old` to `new` (images of the same layout) that write every
/// block but the hash tree and the FEC: chunks of 16 blocks of the data, a SOURCE_COPY where
/// the old blocks at the same place are equal, otherwise a patch from them (BSDIFF40 and BSDF2
/// with brotli streams in turn); the blocks between the tree and the FEC and after the FEC as
/// REPLACE_XZ.
fn update_ops(old: &[u8], new: &[u8], made: &Made) -> Vec<DeltaOp> {
    let b = |x: u64| (x * BS) as usize;
    let mut ops = Vec::new();
    let (data_blocks, tree_end) = (made.tree.0, made.tree.0 + made.tree.1);
    let mut first = 0;
    while first < data_blocks {
        let n = (data_blocks - first).min(16);
        let range = b(first)..b(first + n);
        let v = vec![(first, n)];
        ops.push(if old[range.clone()] == new[range] {
            DeltaOp::Copy {
                src: v.clone(),
                dst: v,
            }
        } else if ops.len() % 2 == 0 {
            DeltaOp::Bsdiff {
                src: v.clone(),
                dst: v,
            }
        } else {
            DeltaOp::Bsdf2 {
                src: v.clone(),
                dst: v,
                codecs: [2, 2, 2],
            }
        });
        first += n;
    }
    let end = new.len() as u64 / BS;
    let fec_end = made.fec.0 + made.fec.1;
    for (start, count) in [(tree_end, made.fec.0 - tree_end), (fec_end, end - fec_end)] {
        if count > 0 {
            ops.push(DeltaOp::Replace {
                dst: vec![(start, count)],
                encoding: Encoding::Xz,
            });
        }
    }
    ops
}

#[test]
fn apply_recomputes_the_hash_tree_and_fec_to_veritysetups_image() {
    let d = TempDir::new("ota-verity-apply");
    // Two levels with a gap before the FEC and a trailer; SHA-1 with 24 roots.
    for (i, c) in [&CASES[1], &CASES[5]].into_iter().enumerate() {
        let old_data = ext4(d.path(), c.data_blocks, 40 + i as u64);
        // The new data: the old one with every third 16-block chunk edited.
        let mut new_data = old_data.clone();
        for chunk in new_data.chunks_mut(16 * BS as usize).step_by(3) {
            for k in (7..chunk.len()).step_by(1021) {
                chunk[k] = chunk[k].wrapping_add(0x5b);
            }
        }
        std::fs::create_dir_all(d.join("old")).unwrap();
        std::fs::create_dir_all(d.join("new")).unwrap();
        let old = veritysetup(&d.join("old"), c, &old_data);
        let new = veritysetup(&d.join("new"), c, &new_data);
        assert_eq!(old.image.len(), new.image.len());
        let ops = update_ops(&old.image, &new.image, &new);
        assert!(ops.iter().any(|o| matches!(o, DeltaOp::Copy { .. })));
        assert!(ops.iter().any(|o| matches!(o, DeltaOp::Bsdf2 { .. })));
        let mut built = PayloadBuilder::new()
            .delta(c.name, &old.image, &new.image, &ops, &bsdiff)
            .build();
        let p = &mut built.manifest.partitions[0];
        let mut fields = new.fields.clone();
        fields.partition_name = p.partition_name.clone();
        fields.operations = p.operations.clone();
        fields.old_partition_info = p.old_partition_info.clone();
        fields.new_partition_info = p.new_partition_info.clone();
        *p = fields;
        let payload = Payload::from_bytes(built.to_bytes()).unwrap();
        // info says apply can build it.
        let s = payload.summary();
        assert!(s.partitions[0].applicable, "{}", c.name);
        assert!(s.partitions[0].verity.as_ref().unwrap().problem.is_none());

        let plan = payload.plan_apply(None, false).unwrap();
        let size = new.image.len() as u64;
        let planned = &plan.partitions()[0];
        assert_eq!(
            planned.dst_bytes,
            size - (new.tree.1 + new.fec.1) * BS,
            "{}: the operations leave out the tree and the FEC",
            c.name
        );
        let work = planned
            .verity
            .as_ref()
            .expect("verity planned")
            .work_bytes();
        assert!(work > 0);
        assert_eq!(plan.progress_bytes(), planned.dst_bytes + work);
        let image: &[u8] = &old.image;
        let checked = plan.check_sources(&[Some(&image)], 2, None).unwrap();
        let out = MemFile::default();
        let events = Mutex::new(Vec::new());
        let on = |e: ExtractProgress| lock(&events).push(e);
        let report = plan
            .run(
                &checked,
                &[&out as &dyn Output],
                &ExtractOptions {
                    threads: 2,
                    progress: Some(&on),
                },
            )
            .unwrap();
        let got = out.into_inner();
        assert!(
            got == new.image,
            "{}: apply differs from veritysetup's image at block {:?}",
            c.name,
            first_difference(&got, &new.image)
        );
        let v = report.partitions[0].verity.as_ref().expect("verity report");
        assert_eq!(
            v.root_digest.as_deref(),
            Some(new.root.as_str()),
            "{}",
            c.name
        );
        assert_eq!(v.fec_roots, Some(c.roots));
        assert_eq!(v.hash_tree_bytes, new.tree.1 * BS);
        assert_eq!(v.fec_bytes, new.fec.1 * BS);
        // The run's timing has the verity step, within the whole run.
        let t = report.timing;
        assert!(
            t.verity > Duration::ZERO && t.verity <= t.elapsed,
            "{}: {t:?}",
            c.name
        );
        assert_eq!(t.operations() + t.verity, t.elapsed, "{}", c.name);
        // The progress events count the verity step: they add up to what Start announced.
        let events = events.into_inner().unwrap();
        assert_eq!(
            events.first(),
            Some(&ExtractProgress::Start {
                bytes: plan.progress_bytes()
            })
        );
        let advanced: u64 = events
            .iter()
            .map(|e| match e {
                ExtractProgress::Advance { bytes } => *bytes,
                _ => 0,
            })
            .sum();
        assert_eq!(advanced, plan.progress_bytes(), "{}", c.name);
        assert_eq!(events.last(), Some(&ExtractProgress::Done));
        // One worker gives the same image.
        let (one, _) = apply_to_memory(&payload, None, &[(c.name, &old.image)], false, 1).unwrap();
        assert!(one[0].1 == new.image, "{}: one worker", c.name);
    }
}

#[test]
fn apply_refuses_bad_verity_fields_before_reading_the_old_image() {
    let old = pattern(40 * BS as usize, 3);
    let mut new = old.clone();
    new[5 * BS as usize] ^= 1;
    let copy = |s: u64, n: u64| DeltaOp::Copy {
        src: vec![(s, n)],
        dst: vec![(s, n)],
    };
    let mut built = PayloadBuilder::new()
        .delta("vendor", &old, &new, &[copy(0, 30)], &bsdiff)
        .build();
    let ext = |start: u64, num: u64| {
        Some(Extent {
            start_block: Some(start),
            num_blocks: Some(num),
        })
    };
    let p = &mut built.manifest.partitions[0];
    p.hash_tree_data_extent = ext(0, 30);
    p.hash_tree_extent = ext(30, 1);
    p.hash_tree_algorithm = Some("sha256".into());
    p.fec_data_extent = ext(0, 31);
    p.fec_extent = ext(31, 2);
    p.fec_roots = Some(25);
    let payload = Payload::from_bytes(built.to_bytes()).unwrap();
    for skip in [false, true] {
        let e = payload.plan_apply(None, skip).unwrap_err();
        assert_eq!(
            snapblk_testsupport::errors::chain(&e),
            "partition vendor, verity: fec_roots 25 is outside 2..=24"
        );
    }
    let s = payload.summary();
    assert!(!s.partitions[0].applicable && s.partitions[0].apply_blocker.is_none());
    let problem = s.partitions[0]
        .verity
        .as_ref()
        .and_then(|v| v.problem.as_deref());
    assert_eq!(problem, Some("fec_roots 25 is outside 2..=24"));
}
