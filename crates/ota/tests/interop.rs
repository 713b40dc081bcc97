//! Payloads written by this crate's writer, read by an independent third-party dumper (PyPI
//! `payload-dumper` 0.3.0, which handles REPLACE, REPLACE_BZ, REPLACE_XZ, ZERO, and with the
//! old images SOURCE_COPY and SOURCE_BSDIFF through PyPI bsdiff4): it must produce the images
//! the payloads were made from. The incremental payloads' patches come from independent makers
//! too (bsdiff4 and Debian's bsdiff). A payload from the generator (`snapblk_ota::generate`
//! with BSDIFF40 patches, of two ext4 images made by mkfs.ext4) must apply to the new image.
//! Ignored in a plain `cargo test` for want of the dumper;
//! tests/suites/ota-interop.sh installs it into a venv and runs these with `--ignored`, the
//! dumper's path in `PAYLOAD_DUMPER` and the venv's python in `BSDIFF4_PYTHON`.

use snapblk_ota::testing::{Encoding, PayloadBuilder};
use snapblk_testsupport::ext4;
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

#[test]
#[ignore = "needs PyPI payload-dumper: tests/suites/ota-interop.sh"]
fn payload_dumper_reads_our_payloads_to_the_same_images() {
    let dumper = std::env::var("PAYLOAD_DUMPER")
        .expect("PAYLOAD_DUMPER must name the payload_dumper executable");
    let d = TempDir::new("ota-interop");
    // Whole blocks (the dumper writes whole destination blocks), zero runs in the middle and at
    // the end (ZERO ops), every encoding the dumper knows, several chunk sizes.
    let mut system = pattern(64 * 4096, 1);
    system[10 * 4096..20 * 4096].fill(0);
    system[60 * 4096..].fill(0);
    let vendor = pattern(17 * 4096, 2);
    let mut boot = vec![0u8; 8 * 4096];
    boot[..100].copy_from_slice(&pattern(100, 3));
    let images = [("system", system), ("vendor", vendor), ("boot", boot)];
    let encodings = [Encoding::Replace, Encoding::Bz, Encoding::Xz];
    for (chunk, name) in [(1, "small"), (4, "medium"), (32, "large")] {
        let mut b = PayloadBuilder::new();
        for (i, (n, img)) in images.iter().enumerate() {
            let mut enc = encodings.to_vec();
            enc.rotate_left(i);
            b = b.partition(n, img, chunk, &enc);
        }
        let payload = d.join(&format!("{name}.bin"));
        std::fs::write(&payload, b.bytes()).unwrap();
        let out = d.join(name);
        tool_ok(
            &dumper,
            &[
                "--out",
                path_str(&out),
                "--workers",
                "2",
                path_str(&payload),
            ],
        );
        for (n, img) in &images {
            let got = std::fs::read(out.join(format!("{n}.img"))).unwrap();
            assert!(
                got == *img,
                "{name}: payload_dumper's {n}.img differs ({} bytes, want {})",
                got.len(),
                img.len()
            );
        }
    }
}

/// A BSDIFF40 patch from `old` to `new` made by PyPI bsdiff4, run by the Python in
/// `BSDIFF4_PYTHON` (the interop suite's venv, where it comes with payload-dumper).
fn bsdiff4(old: &[u8], new: &[u8]) -> Vec<u8> {
    let py = std::env::var("BSDIFF4_PYTHON")
        .expect("BSDIFF4_PYTHON must name a python3 that has bsdiff4");
    let d = TempDir::new("ota-bsdiff4");
    let (o, n, p) = (d.join("old"), d.join("new"), d.join("patch"));
    std::fs::write(&o, old).unwrap();
    std::fs::write(&n, new).unwrap();
    let code = "import bsdiff4, sys; r = lambda f: open(f, 'rb').read(); \
                open(sys.argv[3], 'wb').write(bsdiff4.diff(r(sys.argv[1]), r(sys.argv[2])))";
    tool_ok(&py, &["-c", code, path_str(&o), path_str(&n), path_str(&p)]);
    std::fs::read(&p).unwrap()
}

/// A BSDIFF40 patch from `old` to `new` made by Debian's bsdiff.
fn bsdiff(old: &[u8], new: &[u8]) -> Vec<u8> {
    let d = TempDir::new("ota-bsdiff");
    let (o, n, p) = (d.join("old"), d.join("new"), d.join("patch"));
    std::fs::write(&o, old).unwrap();
    std::fs::write(&n, new).unwrap();
    tool_ok("bsdiff", &[path_str(&o), path_str(&n), path_str(&p)]);
    std::fs::read(&p).unwrap()
}

#[test]
#[ignore = "needs PyPI payload-dumper and bsdiff4: tests/suites/ota-interop.sh"]
fn payload_dumper_reads_our_incremental_payloads_to_the_same_images() {
    use snapblk_ota::Payload;
    use snapblk_ota::testing::{DeltaOp, apply_to_memory};
    let dumper = std::env::var("PAYLOAD_DUMPER")
        .expect("PAYLOAD_DUMPER must name the payload_dumper executable");
    const BS: usize = 4096;
    let d = TempDir::new("ota-interop-delta");
    // system: copies (several source extents), a bsdiff4 patch with two destination extents,
    // REPLACE_BZ, ZERO, a second patch; vendor: a growing Debian-bsdiff patch and REPLACE_XZ
    // (the dumper writes a copy's destination as one run and each REPLACE at its first extent).
    let old_system = pattern(24 * BS, 31);
    let blk = |img: &[u8], s: usize, n: usize| img[s * BS..(s + n) * BS].to_vec();
    let mut system = [blk(&old_system, 4, 2), blk(&old_system, 10, 2)].concat();
    let mut patched = blk(&old_system, 0, 8);
    patched.rotate_left(3 * BS + 17);
    patched.truncate(6 * BS);
    for i in (0..patched.len()).step_by(333) {
        patched[i] ^= 0x42;
    }
    system.extend_from_slice(&patched[..3 * BS]); // blocks 4..7
    system.extend_from_slice(&blk(&old_system, 20, 2)); // 7..9
    system.extend_from_slice(&patched[3 * BS..]); // 9..12
    system.extend_from_slice(&pattern(2 * BS, 32)); // 12..14
    system.extend_from_slice(&[0; 2 * BS]); // 14..16
    let mut tail = blk(&old_system, 16, 8);
    tail[5000..5100].fill(7);
    system.extend_from_slice(&tail); // 16..24
    let system_ops = [
        DeltaOp::Copy {
            src: vec![(4, 2), (10, 2)],
            dst: vec![(0, 4)],
        },
        DeltaOp::Bsdiff {
            src: vec![(0, 8)],
            dst: vec![(4, 3), (9, 3)],
        },
        DeltaOp::Copy {
            src: vec![(20, 2)],
            dst: vec![(7, 2)],
        },
        DeltaOp::Replace {
            dst: vec![(12, 2)],
            encoding: Encoding::Bz,
        },
        DeltaOp::Zero { dst: vec![(14, 2)] },
        DeltaOp::Bsdiff {
            src: vec![(16, 8)],
            dst: vec![(16, 8)],
        },
    ];
    let old_vendor = pattern(4 * BS, 33);
    let mut vendor = old_vendor.clone();
    vendor.splice(2 * BS..2 * BS, pattern(2 * BS, 34));
    vendor.extend_from_slice(&pattern(BS, 35));
    let vendor_ops = [
        DeltaOp::Bsdiff {
            src: vec![(0, 4)],
            dst: vec![(0, 6)],
        },
        DeltaOp::Replace {
            dst: vec![(6, 1)],
            encoding: Encoding::Xz,
        },
    ];
    let bytes = PayloadBuilder::new()
        .delta("system", &old_system, &system, &system_ops, &bsdiff4)
        .delta("vendor", &old_vendor, &vendor, &vendor_ops, &bsdiff)
        .bytes();
    let payload = d.join("delta.bin");
    std::fs::write(&payload, &bytes).unwrap();
    let old = d.join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::write(old.join("system.img"), &old_system).unwrap();
    std::fs::write(old.join("vendor.img"), &old_vendor).unwrap();
    let out = d.join("theirs");
    tool_ok(
        &dumper,
        &[
            "--diff",
            "--old",
            path_str(&old),
            "--out",
            path_str(&out),
            path_str(&payload),
        ],
    );
    let images = [("system", &system), ("vendor", &vendor)];
    for (n, img) in images {
        let got = std::fs::read(out.join(format!("{n}.img"))).unwrap();
        assert!(
            got == *img,
            "payload_dumper's {n}.img differs ({} bytes, want {})",
            got.len(),
            img.len()
        );
    }
    // And snapblk builds the same.
    let p = Payload::from_bytes(bytes).unwrap();
    let olds = [("system", &old_system[..]), ("vendor", &old_vendor[..])];
    let (ours, _) = apply_to_memory(&p, None, &olds, false, 2).unwrap();
    for ((n, img), (m, want)) in ours.iter().zip(images) {
        assert!(n == m && img == want, "snapblk's {n} differs");
    }
}

#[test]
#[ignore = "needs PyPI payload-dumper and bsdiff4: tests/suites/ota-interop.sh"]
fn payload_dumper_applies_generated_bsdiff40_payloads() {
    use snapblk_ota::{BsdiffFormat, GenerateOptions, OpType, PartitionImages, Payload, generate};
    let dumper = std::env::var("PAYLOAD_DUMPER")
        .expect("PAYLOAD_DUMPER must name the payload_dumper executable");
    let d = TempDir::new("ota-interop-gen");
    // Files edited in place, grown by inserted bytes, moved, deleted and added.
    let doc = pattern(900 * 1024, 51);
    let mut doc2 = doc.clone();
    doc2.splice(200_000..200_000, pattern(3000, 52));
    let bin = pattern(400 * 1024, 53);
    let mut bin2 = bin.clone();
    for i in (0..bin2.len()).step_by(40_000) {
        bin2[i] ^= 0xa5;
    }
    let moved = pattern(300 * 1024, 54);
    let gone = pattern(80_000, 55);
    let old_files = [
        ("a/doc", doc),
        ("b/bin", bin),
        ("c/moved", moved.clone()),
        ("d/gone", gone),
    ];
    let old = ext4::of_files(d.path(), "old-fs", &old_files, 16);
    let fresh = pattern(60_000, 56);
    let new_files = [
        ("a/doc", doc2),
        ("b/bin", bin2),
        ("x/moved", moved),
        ("e/fresh", fresh),
    ];
    let new = ext4::of_files(d.path(), "new-fs", &new_files, 16);
    let opts = GenerateOptions {
        bsdiff_format: BsdiffFormat::Bsdiff40,
        threads: 2,
        ..GenerateOptions::default()
    };
    let parts = [PartitionImages {
        name: "system",
        old: Some(&old),
        new: &new,
    }];
    let bytes = generate(&parts, &opts).unwrap().to_bytes();
    let p = Payload::from_bytes(bytes.clone()).unwrap();
    let types: Vec<OpType> = p.manifest().partitions[0]
        .operations
        .iter()
        .map(|o| o.op_type().unwrap())
        .collect();
    for t in [
        OpType::SourceCopy,
        OpType::SourceBsdiff,
        OpType::ReplaceXz,
        OpType::Zero,
    ] {
        assert!(types.contains(&t), "no {t:?} in the payload");
    }
    let payload = d.join("gen.bin");
    std::fs::write(&payload, &bytes).unwrap();
    let olddir = d.join("old");
    std::fs::create_dir(&olddir).unwrap();
    std::fs::write(olddir.join("system.img"), &old).unwrap();
    let out = d.join("theirs");
    let args = [
        "--diff",
        "--old",
        path_str(&olddir),
        "--out",
        path_str(&out),
    ];
    let mut args = args.to_vec();
    args.push(path_str(&payload));
    tool_ok(&dumper, &args);
    let got = std::fs::read(out.join("system.img")).unwrap();
    assert!(
        got == new,
        "payload_dumper's system.img differs from the new image"
    );
}
