//! Incremental payloads written by the crate's writer (`testing::PayloadBuilder::delta`), whose
//! BSDIFF40 patches are made by Debian's `bsdiff` (an independent maker; scripts/install-deps.sh
//! installs it) and whose BSDF2 patches are those patches repacked with none/bzip2/brotli
//! streams: `apply` builds exactly the new images, and every bad input — wrong old image,
//! source hash mismatch, corrupt patch, missing source, unsupported types — is refused with a
//! one-line error naming the partition and the operation.

use snapblk_ota::testing::{
    Blocks, Built, DeltaOp, Encoding, PayloadBuilder, apply_to_memory, bsdiff_int, sha256,
};
use snapblk_ota::{Blocker, Extent, OpError, OpType, OtaError, Payload};
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

const BS: usize = 4096;

/// A BSDIFF40 patch from `old` to `new`, made by Debian's bsdiff.
fn bsdiff(old: &[u8], new: &[u8]) -> Vec<u8> {
    let d = TempDir::new("ota-bsdiff");
    let (o, n, p) = (d.join("old"), d.join("new"), d.join("patch"));
    std::fs::write(&o, old).unwrap();
    std::fs::write(&n, new).unwrap();
    tool_ok("bsdiff", &[path_str(&o), path_str(&n), path_str(&p)]);
    std::fs::read(&p).unwrap()
}

fn blocks(img: &[u8], start: usize, n: usize) -> &[u8] {
    &img[start * BS..(start + n) * BS]
}

/// Change a few bytes every `every` bytes of `b` (what a small edit to a file does).
fn edit(b: &mut [u8], every: usize, seed: u8) {
    for i in (seed as usize..b.len()).step_by(every) {
        b[i] = b[i].wrapping_add(seed | 1);
    }
}

/// Old and new images of two partitions, and the operations that make the new from the old:
/// copies (one and several source extents), bsdiff patches (one and several destination
/// extents, a source of zero extents), BSDF2 patches in several compressor mixes, REPLACE_XZ,
/// ZERO.
struct Case {
    old_system: Vec<u8>,
    system: Vec<u8>,
    system_ops: Vec<DeltaOp>,
    old_vendor: Vec<u8>,
    vendor: Vec<u8>,
    vendor_ops: Vec<DeltaOp>,
}

fn case() -> Case {
    let old = pattern(32 * BS, 7);
    let mut new = Vec::with_capacity(30 * BS);
    new.extend_from_slice(blocks(&old, 8, 4)); // 0..4: copy
    new.extend_from_slice(blocks(&old, 0, 2)); // 4..8: copy of two extents
    new.extend_from_slice(blocks(&old, 20, 2));
    let mut b = blocks(&old, 12, 8).to_vec(); // 8..16: bsdiff
    edit(&mut b, 997, 3);
    new.extend_from_slice(&b);
    let mut b = blocks(&old, 2, 4).to_vec(); // 16..20: BSDF2 brotli, inserted bytes
    b.splice(100..100, pattern(300, 9));
    b.truncate(4 * BS);
    new.extend_from_slice(&b);
    let mut b = [blocks(&old, 22, 4), blocks(&old, 26, 2)].concat(); // 20..24: BSDF2 mixed
    b.reverse();
    b.truncate(4 * BS);
    edit(&mut b, 501, 5);
    new.extend_from_slice(&b);
    new.extend_from_slice(&pattern(2 * BS, 11)); // 24..26: REPLACE_XZ
    new.extend_from_slice(&[0; 2 * BS]); // 26..28: ZERO
    let mut b = blocks(&old, 29, 2).to_vec(); // 28..30: BSDF2 bzip2/none from 4 blocks
    edit(&mut b, 3001, 7);
    new.extend_from_slice(&b);
    let v = |r: &[(u64, u64)]| -> Blocks { r.to_vec() };
    let system_ops = vec![
        DeltaOp::Copy {
            src: v(&[(8, 4)]),
            dst: v(&[(0, 4)]),
        },
        DeltaOp::Copy {
            src: v(&[(0, 2), (20, 2)]),
            dst: v(&[(4, 4)]),
        },
        DeltaOp::Bsdiff {
            src: v(&[(12, 8)]),
            dst: v(&[(8, 8)]),
        },
        DeltaOp::Bsdf2 {
            src: v(&[(2, 4)]),
            dst: v(&[(18, 2), (16, 2)]),
            codecs: [2, 2, 2],
        },
        DeltaOp::Bsdf2 {
            src: v(&[(22, 4), (26, 2)]),
            dst: v(&[(20, 4)]),
            codecs: [0, 1, 2],
        },
        DeltaOp::Replace {
            dst: v(&[(24, 2)]),
            encoding: Encoding::Xz,
        },
        DeltaOp::Zero { dst: v(&[(26, 2)]) },
        DeltaOp::Bsdf2 {
            src: v(&[(27, 4)]),
            dst: v(&[(28, 2)]),
            codecs: [1, 0, 0],
        },
    ];
    let system = new;
    // vendor: a patch from nothing (no source extents: all extra bytes; Debian's bsdiff cannot
    // read an empty old file, so this one is made by hand), and a plain SOURCE_BSDIFF.
    let old_vendor = pattern(6 * BS, 21);
    let mut vendor = pattern(4 * BS, 22);
    vendor.extend_from_slice(&old_vendor[..4 * BS]);
    edit(&mut vendor[4 * BS..], 77, 9);
    let n = 4 * BS as i64;
    let vendor_ops = vec![
        DeltaOp::Raw {
            op_type: OpType::BrotliBsdiff as i32,
            src: v(&[]),
            dst: v(&[(0, 4)]),
            blob: raw_bsdf2(&[(0, n, 0)], b"", &vendor[..4 * BS], n),
        },
        DeltaOp::Bsdiff {
            src: v(&[(0, 6)]),
            dst: v(&[(4, 4)]),
        },
    ];
    Case {
        old_system: old,
        system,
        system_ops,
        old_vendor,
        vendor,
        vendor_ops,
    }
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

fn build(c: &Case) -> Built {
    PayloadBuilder::new()
        .delta("system", &c.old_system, &c.system, &c.system_ops, &bsdiff)
        .delta("vendor", &c.old_vendor, &c.vendor, &c.vendor_ops, &bsdiff)
        .build()
}

fn old(c: &Case) -> Vec<(&'static str, &[u8])> {
    vec![("system", &c.old_system[..]), ("vendor", &c.old_vendor[..])]
}

fn apply_err(b: &Built, old: &[(&str, &[u8])]) -> OtaError {
    let p = Payload::from_bytes(b.to_bytes()).unwrap();
    apply_to_memory(&p, None, old, false, 2).unwrap_err()
}

/// The one-line report of `e` (its chain joined by ": ").
fn line(e: &OtaError) -> String {
    let mut s = e.to_string();
    let mut cur: &dyn std::error::Error = e;
    while let Some(src) = cur.source() {
        s.push_str(": ");
        s.push_str(&src.to_string());
        cur = src;
    }
    s
}

#[test]
fn incremental_payloads_apply_to_the_new_images() {
    let c = case();
    let b = build(&c);
    let p = Payload::from_bytes(b.to_bytes()).unwrap();
    assert_eq!(p.minor_version(), 6);
    let s = p.summary();
    for part in &s.partitions {
        assert!(part.applicable && !part.extractable, "{part:?}");
    }
    let ops = &s.partitions[0].op_counts;
    assert_eq!(ops["SOURCE_COPY"], 2);
    assert_eq!(ops["SOURCE_BSDIFF"], 1);
    assert_eq!(ops["BROTLI_BSDIFF"], 3);
    // Patches from bsdiff are BSDIFF40; the repacked ones BSDF2 with the asked compressors.
    let blob = |i: usize| {
        let op = &b.manifest.partitions[0].operations[i];
        let at = op.data_offset() as usize;
        &b.data[at..at + op.data_length() as usize]
    };
    assert_eq!(&blob(2)[..8], b"BSDIFF40");
    assert_eq!(&blob(3)[..8], b"BSDF2\x02\x02\x02");
    assert_eq!(&blob(4)[..8], b"BSDF2\x00\x01\x02");
    for threads in [1, 2, 4] {
        let (out, skipped) = apply_to_memory(&p, None, &old(&c), false, threads).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(out[0].0, "system");
        assert!(out[0].1 == c.system, "system differs ({threads} threads)");
        assert_eq!(out[1].0, "vendor");
        assert!(out[1].1 == c.vendor, "vendor differs ({threads} threads)");
    }
    // One partition alone needs only its own old image.
    let (out, _) = apply_to_memory(
        &p,
        Some(&names(&["vendor"])),
        &[("vendor", &c.old_vendor)],
        false,
        1,
    )
    .unwrap();
    assert!(out.len() == 1 && out[0].1 == c.vendor);
}

#[test]
fn full_payloads_and_new_partitions_need_no_old_image() {
    let img = pattern(5 * BS, 3);
    let full = PayloadBuilder::new()
        .partition("boot", &img, 2, &[Encoding::Bz])
        .bytes();
    let p = Payload::from_bytes(full).unwrap();
    let (out, _) = apply_to_memory(&p, None, &[], false, 1).unwrap();
    assert!(out[0].1 == img);
    // A partition of an incremental payload without old_partition_info and without
    // source-reading operations (one the update adds).
    let c = case();
    let b = PayloadBuilder::new()
        .delta("system", &c.old_system, &c.system, &c.system_ops, &bsdiff)
        .delta(
            "odm",
            &[],
            &img[..4 * BS],
            &[DeltaOp::Replace {
                dst: vec![(0, 4)],
                encoding: Encoding::Zstd,
            }],
            &bsdiff,
        );
    let mut built = b.build();
    built.manifest.partitions[1].old_partition_info = None;
    let p = Payload::from_bytes(built.to_bytes()).unwrap();
    let (out, _) = apply_to_memory(&p, None, &[("system", &c.old_system[..])], false, 1).unwrap();
    assert!(out[1].1 == img[..4 * BS]);
}

#[test]
fn a_wrong_old_image_is_refused_before_anything_is_built() {
    let c = case();
    let b = build(&c);
    let short = &c.old_system[..31 * BS];
    let e = apply_err(&b, &[("system", short), ("vendor", &c.old_vendor)]);
    assert_eq!(
        line(&e),
        format!(
            "partition system: the old image is {} bytes, old_partition_info.size is {}",
            31 * BS,
            32 * BS
        )
    );
    let mut flipped = c.old_system.clone();
    flipped[5 * BS + 17] ^= 1;
    let e = apply_err(&b, &[("system", &flipped), ("vendor", &c.old_vendor)]);
    assert!(
        matches!(&e, OtaError::SourceHash { partition, expected, .. }
            if partition == "system" && *expected == snapblk_ota::hex(&sha256(&c.old_system))),
        "{e}"
    );
    // An Android sparse image (made by img2simg) is named as such.
    let d = TempDir::new("ota-sparse");
    let raw = d.join("raw.img");
    std::fs::write(&raw, &c.old_system).unwrap();
    let sparse = d.join("sparse.img");
    tool_ok("img2simg", &[path_str(&raw), path_str(&sparse)]);
    let sparse = std::fs::read(&sparse).unwrap();
    let e = apply_err(&b, &[("system", &sparse), ("vendor", &c.old_vendor)]);
    assert_eq!(
        line(&e),
        "partition system: the old image is an Android sparse image; expand it first (simg2img)"
    );
    // No old image for a partition that reads it.
    let e = apply_err(&b, &[("vendor", &c.old_vendor)]);
    assert_eq!(
        line(&e),
        "partition system: the payload updates the old image, and none was given"
    );
    // Without old_partition_info, the old image must hold every source extent.
    let mut b2 = b.clone();
    b2.manifest.partitions[0].old_partition_info = None;
    let shorter = &c.old_system[..30 * BS];
    let e = apply_err(&b2, &[("system", shorter), ("vendor", &c.old_vendor)]);
    assert_eq!(
        line(&e),
        format!(
            "partition system: the old image is {} bytes, the operations read blocks up to byte {}",
            30 * BS,
            31 * BS
        )
    );
    // A partial last block is enough for the check (the rest reads as zeros), and then the
    // operation reading it finds the source hash wrong.
    let p = Payload::from_bytes(b2.to_bytes()).unwrap();
    let plan = p.plan_apply(None, false).unwrap();
    let partial = &c.old_system[..31 * BS - 100];
    let sources: [Option<&(dyn snapblk_core::ReadAt + Sync)>; 2] =
        [Some(&partial), Some(&c.old_vendor)];
    plan.check_sources(&sources, 1, None).unwrap();
    let e = apply_err(&b2, &[("system", partial), ("vendor", &c.old_vendor)]);
    assert!(
        matches!(
            e,
            OtaError::Op {
                index: 7,
                source: OpError::SourceHash { .. },
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn source_bytes_are_checked_against_src_sha256_hash_before_use() {
    let c = case();
    // The whole-image hash is not there to catch it: op 2's source block changed.
    let mut b = build(&c);
    b.manifest.partitions[0].old_partition_info = None;
    let mut changed = c.old_system.clone();
    changed[13 * BS] ^= 0x80;
    let e = apply_err(&b, &[("system", &changed), ("vendor", &c.old_vendor)]);
    let l = line(&e);
    assert!(
        l.starts_with("partition system, op 2: source SHA-256 "),
        "{l}"
    );
    assert!(matches!(
        e,
        OtaError::Op {
            index: 2,
            source: OpError::SourceHash { .. },
            ..
        }
    ));
    // A copy's source, likewise.
    let mut changed = c.old_system.clone();
    changed[21 * BS + 5] ^= 1;
    let e = apply_err(&b, &[("system", &changed), ("vendor", &c.old_vendor)]);
    assert!(
        matches!(
            e,
            OtaError::Op {
                index: 1,
                source: OpError::SourceHash { .. },
                ..
            }
        ),
        "{e}"
    );
    // A manifest whose src_sha256_hash is wrong.
    let mut b = build(&c);
    b.manifest.partitions[0].operations[4].src_sha256_hash = Some(vec![0; 32]);
    let e = apply_err(&b, &old(&c));
    assert!(
        line(&e).starts_with("partition system, op 4: source SHA-256 ")
            && line(&e).ends_with(&format!(
                "does not match src_sha256_hash {}",
                "00".repeat(32)
            )),
        "{e}"
    );
    b.manifest.partitions[0].operations[4].src_sha256_hash = Some(vec![0; 31]);
    let e = apply_err(&b, &old(&c));
    assert_eq!(
        line(&e),
        "partition system, op 4: src_sha256_hash has 31 bytes, not 32"
    );
}

/// Payload with one SOURCE_BSDIFF op (index 1, after a copy) whose blob is `patch`, from old
/// blocks 0..2 to new blocks 2..4.
fn with_patch(patch: Vec<u8>, t: OpType) -> (Built, Vec<u8>) {
    let old = pattern(4 * BS, 5);
    let new = [blocks(&old, 2, 2), blocks(&old, 0, 2)].concat();
    let ops = [
        DeltaOp::Copy {
            src: vec![(2, 2)],
            dst: vec![(0, 2)],
        },
        DeltaOp::Raw {
            op_type: t as i32,
            src: vec![(0, 2)],
            dst: vec![(2, 2)],
            blob: patch,
        },
    ];
    let b = PayloadBuilder::new()
        .delta("system", &old, &new, &ops, &bsdiff)
        .build();
    (b, old)
}

fn patch_err(patch: Vec<u8>, t: OpType) -> String {
    let (b, old) = with_patch(patch, t);
    line(&apply_err(&b, &[("system", &old)]))
}

/// A BSDF2 patch with uncompressed streams.
fn raw_bsdf2(entries: &[(i64, i64, i64)], diff: &[u8], extra: &[u8], new_size: i64) -> Vec<u8> {
    let ctrl: Vec<u8> = entries
        .iter()
        .flat_map(|&(a, b, c)| [bsdiff_int(a), bsdiff_int(b), bsdiff_int(c)])
        .flatten()
        .collect();
    let mut p = b"BSDF2\0\0\0".to_vec();
    p.extend(bsdiff_int(ctrl.len() as i64));
    p.extend(bsdiff_int(diff.len() as i64));
    p.extend(bsdiff_int(new_size));
    p.extend(ctrl);
    p.extend_from_slice(diff);
    p.extend_from_slice(extra);
    p
}

#[test]
fn corrupt_patches_are_refused_naming_the_op() {
    let old = pattern(4 * BS, 5);
    let good = bsdiff(blocks(&old, 0, 2), blocks(&old, 0, 2));
    // The good patch applies (the Raw op is what the builder made).
    let (b, o) = with_patch(good.clone(), OpType::SourceBsdiff);
    let p = Payload::from_bytes(b.to_bytes()).unwrap();
    apply_to_memory(&p, None, &[("system", &o)], false, 1).unwrap();
    let pre = "partition system, op 1: applying the SOURCE_BSDIFF patch: ";
    let mut bad = good.clone();
    bad[..8].copy_from_slice(b"BSDIFF41");
    let e = patch_err(bad, OpType::SourceBsdiff);
    assert!(
        e.starts_with(&format!("{pre}not a bsdiff patch: magic ")),
        "{e}"
    );
    // Control stream past the end of the patch.
    let mut bad = good.clone();
    bad[8..16].copy_from_slice(&bsdiff_int(good.len() as i64));
    let e = patch_err(bad, OpType::SourceBsdiff);
    assert!(
        e.starts_with(&format!("{pre}bsdiff header: control ")),
        "{e}"
    );
    assert!(e.contains(": negative or past the patch's "), "{e}");
    // A negative new size.
    let mut bad = good.clone();
    bad[24..32].copy_from_slice(&bsdiff_int(-4));
    let e = patch_err(bad, OpType::SourceBsdiff);
    assert!(e.contains("new size -4: negative"), "{e}");
    // Negative lengths in a control entry.
    let pre2 = "partition system, op 1: applying the BROTLI_BSDIFF patch: ";
    let e = patch_err(
        raw_bsdf2(&[(-5, 0, 0)], b"", b"", 2 * BS as i64),
        OpType::BrotliBsdiff,
    );
    assert_eq!(
        e,
        format!("{pre2}control entry 0: negative length (diff -5, extra 0)")
    );
    let e = patch_err(
        raw_bsdf2(&[(0, -1, 0)], b"", b"", 2 * BS as i64),
        OpType::BrotliBsdiff,
    );
    assert_eq!(
        e,
        format!("{pre2}control entry 0: negative length (diff 0, extra -1)")
    );
    // A control entry past the new size, and a stream that ends early.
    let e = patch_err(
        raw_bsdf2(&[(1, 3 * BS as i64, 0)], &[0], b"", 2 * BS as i64),
        OpType::BrotliBsdiff,
    );
    assert!(
        e.starts_with(&format!("{pre2}control entry 0 writes up to byte ")),
        "{e}"
    );
    let e = patch_err(
        raw_bsdf2(&[(10, 0, 0)], &[0; 4], b"", 10),
        OpType::BrotliBsdiff,
    );
    assert_eq!(
        e,
        format!("{pre2}the diff stream ends early (control entry 0)")
    );
    // A patch that makes more than the destination's two blocks.
    let longer = bsdiff(blocks(&old, 0, 2), blocks(&old, 0, 3));
    let e = patch_err(longer, OpType::SourceBsdiff);
    assert_eq!(
        e,
        format!(
            "{pre}the patch makes {} bytes, more than the {} bytes of its destination",
            3 * BS,
            2 * BS
        )
    );
    // An unknown BSDF2 compressor.
    let e = patch_err(
        b"BSDF2\x01\x07\x01"
            .iter()
            .copied()
            .chain([0u8; 24])
            .collect(),
        OpType::BrotliBsdiff,
    );
    assert_eq!(
        e,
        format!(
            "{pre2}BSDF2 compressor 7 for the diff stream is unknown (0 none, 1 bzip2, 2 brotli)"
        )
    );
    // The blob's own hash is checked before the patch is read.
    let (mut b, o) = with_patch(good.clone(), OpType::SourceBsdiff);
    let at = b.manifest.partitions[0].operations[1].data_offset() as usize;
    b.data[at + 40] ^= 1;
    let e = line(&apply_err(&b, &[("system", &o)]));
    assert!(
        e.starts_with("partition system, op 1: data SHA-256 "),
        "{e}"
    );
    // A shorter patch leaves the rest of the destination zero (and the partition hash fails).
    let shorter = bsdiff(blocks(&old, 0, 2), &blocks(&old, 0, 2)[..BS]);
    let (b, o) = with_patch(shorter, OpType::SourceBsdiff);
    let e = apply_err(&b, &[("system", &o)]);
    assert!(matches!(e, OtaError::PartitionHash { .. }), "{e}");
}

#[test]
fn source_extents_are_checked_by_the_plan() {
    let c = case();
    let plan_err = |b: &Built| {
        let p = Payload::from_bytes(b.to_bytes()).unwrap();
        line(&p.plan_apply(None, false).unwrap_err())
    };
    let mut b = build(&c);
    b.manifest.partitions[0].operations[1].src_extents[1] = Extent {
        start_block: Some(30),
        num_blocks: Some(3),
    };
    assert_eq!(
        plan_err(&b),
        "partition system, op 1: source extent 1 (blocks 30+3) ends past the old partition's 32 blocks"
    );
    b.manifest.partitions[0].operations[1].src_extents[1].start_block = Some(u64::MAX);
    assert!(plan_err(&b).contains("ends past the old partition's 32 blocks"));
    let mut b = build(&c);
    b.manifest.partitions[0].operations[0].src_extents[0].num_blocks = Some(3);
    assert_eq!(
        plan_err(&b),
        format!(
            "partition system, op 0: SOURCE_COPY reads {} bytes and writes {}",
            3 * BS,
            4 * BS
        )
    );
    // A patch larger than the memory limit is refused before anything is read.
    let mut b = build(&c);
    b.manifest.partitions[0].operations[2].data_length = Some(3 << 30);
    assert_eq!(
        plan_err(&b),
        format!(
            "partition system, op 2: the patch of {} bytes is more than the limit of {} per operation",
            3u64 << 30,
            snapblk_ota::MAX_PATCH_INPUT
        )
    );
    let mut b = build(&c);
    b.manifest.partitions[0]
        .old_partition_info
        .as_mut()
        .unwrap()
        .hash = Some(vec![1; 5]);
    assert_eq!(
        plan_err(&b),
        "partition system: old_partition_info hash is not 32 bytes"
    );
}

/// A payload with `system` (applicable), `product` (a ZUCCHINI at op 1), `odm` (type 42 at
/// op 0) and `vendor_dlkm` (a hash tree left to the device, without the data it covers).
fn mixed() -> (Built, Case) {
    let c = case();
    let odd = |t: i32| DeltaOp::Raw {
        op_type: t,
        src: vec![(0, 1)],
        dst: vec![(1, 1)],
        blob: b"not a patch".to_vec(),
    };
    let copy = DeltaOp::Copy {
        src: vec![(0, 1)],
        dst: vec![(0, 1)],
    };
    let img = pattern(2 * BS, 4);
    let mut b = PayloadBuilder::new()
        .delta("system", &c.old_system, &c.system, &c.system_ops, &bsdiff)
        .delta(
            "product",
            &img,
            &img,
            &[copy.clone(), odd(OpType::Zucchini as i32)],
            &bsdiff,
        )
        .delta("odm", &img, &img, &[odd(42), copy.clone()], &bsdiff)
        .delta(
            "vendor_dlkm",
            &img,
            &img,
            &[
                copy,
                DeltaOp::Copy {
                    src: vec![(1, 1)],
                    dst: vec![(1, 1)],
                },
            ],
            &bsdiff,
        )
        .build();
    b.manifest.partitions[3].hash_tree_extent = Some(Extent {
        start_block: Some(1),
        num_blocks: Some(1),
    });
    (b, c)
}

#[test]
fn unsupported_partitions_are_refused_or_skipped() {
    let (b, c) = mixed();
    let p = Payload::from_bytes(b.to_bytes()).unwrap();
    let img = pattern(2 * BS, 4);
    let old = [
        ("system", &c.old_system[..]),
        ("product", &img[..]),
        ("odm", &img[..]),
        ("vendor_dlkm", &img[..]),
    ];
    let e = apply_to_memory(&p, None, &old, false, 1).unwrap_err();
    assert_eq!(
        line(&e),
        "partition product, op 1: ZUCCHINI is not supported by apply"
    );
    let e = apply_to_memory(&p, Some(&names(&["odm"])), &old, false, 1).unwrap_err();
    assert_eq!(line(&e), "partition odm, op 0: unknown operation type 42");
    // Verity fields apply cannot use are an error, skipping or not (the plan checks them as
    // extract's does; crates/ota/tests/verity.rs applies valid ones).
    let verity = "partition vendor_dlkm, verity: hash_tree_data_extent is missing or empty";
    for skip in [false, true] {
        let e = apply_to_memory(&p, Some(&names(&["vendor_dlkm"])), &old, skip, 1).unwrap_err();
        assert_eq!(line(&e), verity);
    }
    let e = apply_to_memory(&p, None, &old, true, 1).unwrap_err();
    assert_eq!(line(&e), verity);
    let chosen = names(&["system", "product", "odm"]);
    let (out, skipped) = apply_to_memory(&p, Some(&chosen), &old, true, 2).unwrap();
    assert_eq!(out.len(), 1);
    assert!(out[0].0 == "system" && out[0].1 == c.system);
    let got: Vec<(&str, usize, &Blocker)> = skipped
        .iter()
        .map(|s| (s.name.as_str(), s.index, &s.blocker))
        .collect();
    let op = |index, t: &str| Blocker::Operation {
        index,
        op_type: t.to_string(),
    };
    assert_eq!(
        got,
        [
            ("product", 1, &op(1, "ZUCCHINI")),
            ("odm", 2, &op(0, "UNKNOWN(42)")),
        ]
    );
    // info says the same, per partition.
    let s = p.summary();
    let blockers: Vec<_> = s
        .partitions
        .iter()
        .map(|x| x.apply_blocker.clone())
        .collect();
    assert_eq!(
        blockers,
        [
            None,
            Some(op(1, "ZUCCHINI")),
            Some(op(0, "UNKNOWN(42)")),
            None
        ]
    );
    assert_eq!(s.partitions[1].apply_blocked_by, ["ZUCCHINI"]);
    assert!(s.partitions[0].applicable && !s.partitions[1].applicable);
    assert!(!s.partitions[3].applicable && s.partitions[3].apply_blocked_by.is_empty());
    let problem = s.partitions[3]
        .verity
        .as_ref()
        .and_then(|v| v.problem.as_deref());
    assert_eq!(problem, Some("hash_tree_data_extent is missing or empty"));
    // The LZ4DIFF types, likewise.
    for t in [OpType::Lz4diffBsdiff, OpType::Lz4diffPuffdiff, OpType::Move] {
        let mut b2 = b.clone();
        b2.manifest.partitions[1].operations[1].r#type = t as i32;
        let p = Payload::from_bytes(b2.to_bytes()).unwrap();
        let e = apply_to_memory(&p, Some(&names(&["product"])), &old, false, 1).unwrap_err();
        assert_eq!(
            line(&e),
            format!(
                "partition product, op 1: {} is not supported by apply",
                t.name()
            )
        );
    }
}
