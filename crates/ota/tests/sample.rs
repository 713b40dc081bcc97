//! The real AOSP sample payloads (tests/data/ota, made by update_engine's delta_generator):
//! what the reader finds in them, and extraction of the full one against the images it was
//! made from.

use std::path::{Path, PathBuf};

use snapblk_ota::testing::{apply_to_memory, extract_to_memory};
use snapblk_ota::{Container, OpError, Ota, OtaError};
use snapblk_testsupport::{TempDir, tool_ok};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/ota")
}

/// Unpack both archives into a new directory.
fn unpack() -> TempDir {
    let d = TempDir::new("ota-sample");
    for a in ["sample_payloads.tar.xz", "sample_images.tar.bz2"] {
        let src = data().join(a);
        tool_ok(
            "tar",
            &[
                "-xf",
                src.to_str().unwrap(),
                "-C",
                d.path().to_str().unwrap(),
            ],
        );
    }
    d
}

fn sha256(b: &[u8]) -> String {
    use sha2::Digest;
    snapblk_ota::hex(&sha2::Sha256::digest(b))
}

#[test]
fn the_full_sample_extracts_to_the_images_it_was_made_from() {
    let d = unpack();
    let ota = Ota::open(&d.join("full_payload.bin")).unwrap();
    assert_eq!(ota.container(), Container::Bare);
    assert!(ota.properties().is_none());
    let p = ota.payload();
    assert_eq!(p.len(), 2658);
    let s = p.summary();
    assert_eq!((s.minor_version, s.kind, s.block_size), (0, "full", 4096));
    assert_eq!(s.signatures.metadata_signature_size, 0);
    assert_eq!(s.signatures.payload_signature, None);
    // The AOSP samples are unsigned: both signatures say so, with or without digests.
    let r = p.signature_status().unwrap();
    assert_eq!(r.metadata, snapblk_ota::SignatureStatus::Unsigned);
    assert_eq!(r.payload, snapblk_ota::SignatureStatus::Unsigned);
    let digests = p.signature_digests(true, &mut |_| {}).unwrap();
    assert_eq!(digests.payload, None);
    let bytes = std::fs::read(d.join("full_payload.bin")).unwrap();
    assert_eq!(snapblk_ota::hex(&digests.file.unwrap()), sha256(&bytes));
    assert_eq!(
        snapblk_ota::hex(&digests.metadata),
        sha256(&bytes[..s.metadata_size as usize])
    );
    assert!(s.dynamic_partitions.is_none());
    let names: Vec<_> = s.partitions.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["kernel", "root"]);
    let mut ops = std::collections::BTreeMap::new();
    for part in &s.partitions {
        assert!(part.extractable, "{part:?}");
        for (t, n) in &part.op_counts {
            *ops.entry(t.clone()).or_insert(0) += n;
        }
    }
    assert_eq!(
        ops.into_iter().collect::<Vec<_>>(),
        [("REPLACE_BZ".to_string(), 2), ("REPLACE_XZ".to_string(), 1)]
    );
    for threads in [1, 2, 4] {
        let out = extract_to_memory(p, None, threads).unwrap();
        let kernel = std::fs::read(d.join("disk_ext2_4k.img")).unwrap();
        let root = std::fs::read(d.join("disk_sqfs_default.img")).unwrap();
        assert_eq!(out[0].0, "kernel");
        assert!(out[0].1 == kernel, "kernel differs from disk_ext2_4k.img");
        assert_eq!(out[1].0, "root");
        assert!(out[1].1 == root, "root differs from disk_sqfs_default.img");
        for (i, (_, img)) in out.iter().enumerate() {
            assert_eq!(Some(sha256(img)), s.partitions[i].sha256);
        }
    }
    // One partition alone.
    let out = extract_to_memory(p, Some(&["root".to_string()]), 0).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, "root");
}

#[test]
fn the_delta_sample_is_read_and_refused_by_extract_naming_the_op() {
    let d = unpack();
    let ota = Ota::open(&d.join("delta_payload.bin")).unwrap();
    let s = ota.payload().summary();
    assert_eq!((s.minor_version, s.kind), (6, "incremental"));
    let mut all = std::collections::BTreeSet::new();
    for part in &s.partitions {
        all.extend(part.op_counts.keys().cloned());
        assert!(
            part.old_size.is_some() && part.old_sha256.is_some(),
            "{part:?}"
        );
    }
    let want = [
        "BROTLI_BSDIFF",
        "REPLACE_BZ",
        "REPLACE_XZ",
        "SOURCE_COPY",
        "ZERO",
    ];
    assert_eq!(all.into_iter().collect::<Vec<_>>(), want);
    let blocked: Vec<_> = s
        .partitions
        .iter()
        .flat_map(|p| p.blocked_by.clone())
        .collect();
    assert!(blocked.contains(&"SOURCE_COPY".to_string()), "{blocked:?}");
    assert!(s.partitions.iter().any(|p| !p.extractable));
    let e = ota.payload().plan_extract(None).unwrap_err();
    let OtaError::Op {
        partition,
        index,
        source: OpError::Unsupported { op_type, .. },
    } = &e
    else {
        panic!("{e:?}");
    };
    let part = s.partitions.iter().find(|p| &p.name == partition).unwrap();
    assert!(part.blocked_by.contains(&op_type.name().to_string()));
    assert!(*index < part.ops);
}

#[test]
fn the_delta_sample_applies_to_the_images_it_was_made_from() {
    let d = unpack();
    let ota = Ota::open(&d.join("delta_payload.bin")).unwrap();
    let p = ota.payload();
    let s = p.summary();
    for part in &s.partitions {
        assert!(part.applicable, "{part:?}");
        assert!(part.apply_blocked_by.is_empty() && part.apply_blocker.is_none());
    }
    let read = |n: &str| std::fs::read(d.join(n)).unwrap();
    let (old_kernel, old_root) = (read("disk_ext2_4k_empty.img"), read("disk_sqfs_empty.img"));
    let (kernel, root) = (read("disk_ext2_4k.img"), read("disk_sqfs_default.img"));
    // The old images are what old_partition_info says.
    assert_eq!(Some(sha256(&old_kernel)), s.partitions[0].old_sha256);
    assert_eq!(Some(sha256(&old_root)), s.partitions[1].old_sha256);
    let old = [("kernel", &old_kernel[..]), ("root", &old_root[..])];
    for threads in [1, 2, 4] {
        let (out, skipped) = apply_to_memory(p, None, &old, false, threads).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(out[0].0, "kernel");
        assert!(out[0].1 == kernel, "kernel differs from disk_ext2_4k.img");
        assert_eq!(out[1].0, "root");
        assert!(out[1].1 == root, "root differs from disk_sqfs_default.img");
        for (i, (_, img)) in out.iter().enumerate() {
            assert_eq!(Some(sha256(img)), s.partitions[i].sha256);
        }
    }
    // The wrong old image is refused before anything is built.
    let swapped = [("kernel", &old_root[..]), ("root", &old_kernel[..])];
    let e = apply_to_memory(p, None, &swapped, false, 1).unwrap_err();
    assert!(matches!(e, OtaError::SourceSize { .. }), "{e}");
}
