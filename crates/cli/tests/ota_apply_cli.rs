//! `snapblk ota apply` on update_engine's sample delta payload (tests/data/ota) and on
//! incremental payloads the crate's writer makes with Debian bsdiff's patches: exact images,
//! verified hashes, and the data-safety rules (the old images and the OTA are never outputs,
//! `-o` is never the source directory, old images checked before anything is written, nothing
//! under a final name after a failure), unsupported partitions refused or skipped, and a
//! partition whose dm-verity hash tree and FEC (made by veritysetup) the payload leaves out
//! built to exactly veritysetup's image.

use snapblk_testsupport::entries;
use std::path::{Path, PathBuf};

use snapblk_ota::OpType;
use snapblk_ota::testing::{DeltaOp, PayloadBuilder};
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

#[path = "cli_common.rs"]
mod common;
use common::{ok, read, refused, snapblk};

/// The sample payloads and images unpacked, and `old/` holding the delta's old images under
/// their partition names.
fn samples() -> TempDir {
    let d = TempDir::new("ota-apply-cli");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/ota");
    for a in ["sample_payloads.tar.xz", "sample_images.tar.bz2"] {
        tool_ok(
            "tar",
            &["-xf", path_str(&data.join(a)), "-C", path_str(d.path())],
        );
    }
    std::fs::create_dir(d.join("old")).unwrap();
    std::fs::copy(d.join("disk_ext2_4k_empty.img"), d.join("old/kernel.img")).unwrap();
    std::fs::copy(d.join("disk_sqfs_empty.img"), d.join("old/root.img")).unwrap();
    d
}

fn sha256_hex(p: &Path) -> String {
    let out = tool_ok("sha256sum", &[path_str(p)]);
    out.split_whitespace().next().unwrap().to_string()
}

fn apply_args<'a>(ota: &'a Path, old: &'a Path, out: &'a Path) -> Vec<&'a str> {
    vec![
        "ota",
        "apply",
        path_str(ota),
        "--source",
        path_str(old),
        "-o",
        path_str(out),
    ]
}

#[test]
fn apply_of_the_aosp_delta_payload_gives_its_images() {
    let d = samples();
    let delta = d.join("delta_payload.bin");
    let out = d.join("out");
    let text = ok(&apply_args(&delta, &d.join("old"), &out));
    assert_eq!(entries(&out), ["kernel.img", "root.img"]);
    assert!(read(&out.join("kernel.img")) == read(&d.join("disk_ext2_4k.img")));
    assert!(read(&out.join("root.img")) == read(&d.join("disk_sqfs_default.img")));
    assert!(
        text.ends_with(&format!("2 partitions written to {}\n", out.display())),
        "{text}"
    );
    // The manifest's hashes, as sha256sum computes them, are what the command verified.
    let info: serde_json::Value =
        serde_json::from_str(&ok(&["ota", "info", path_str(&delta), "--json"])).unwrap();
    for (i, name) in ["kernel", "root"].iter().enumerate() {
        let p = &info["partitions"][i];
        assert_eq!(p["name"], *name);
        assert_eq!(p["applicable"], true);
        let h = sha256_hex(&out.join(format!("{name}.img")));
        assert_eq!(p["sha256"], h.as_str());
        assert!(
            text.contains(&format!("{name}.img: ")) && text.contains(&h),
            "{text}"
        );
    }
    let info = ok(&["ota", "info", path_str(&delta)]);
    assert_eq!(info.matches("    apply: yes\n").count(), 2, "{info}");
    // Again with --json, one worker, one partition, over the previous file.
    let old = d.join("old");
    let mut args = apply_args(&delta, &old, &out);
    args.extend(["--threads", "1", "--partitions", "kernel", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
    assert_eq!(doc["schema"], "snapblk.ota-apply.v1");
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["threads"], 1);
    assert_eq!(doc["skipped"], serde_json::json!([]));
    assert_eq!(doc["partitions"][0]["name"], "kernel");
    assert_eq!(
        doc["partitions"][0]["sha256"],
        sha256_hex(&d.join("disk_ext2_4k.img")).as_str()
    );
    assert_eq!(entries(&out), ["kernel.img", "root.img"]);
}

#[test]
fn the_old_images_and_their_directory_are_never_outputs() {
    let d = samples();
    let delta = d.join("delta_payload.bin");
    let old = d.join("old");
    let before = (read(&old.join("kernel.img")), read(&old.join("root.img")));
    let untouched = |d: &TempDir| {
        assert!(read(&old.join("kernel.img")) == before.0);
        assert!(read(&old.join("root.img")) == before.1);
        assert_eq!(entries(&d.join("old")), ["kernel.img", "root.img"]);
    };
    let e = refused(
        &apply_args(&delta, &old, &old),
        "is the same directory as --source",
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    untouched(&d);
    // The same directory by another name.
    let link = d.join("link");
    std::os::unix::fs::symlink(&old, &link).unwrap();
    refused(
        &apply_args(&delta, &old, &link),
        "is the same directory as --source",
    );
    refused(
        &apply_args(&delta, &link, &d.join("old/.")),
        "is the same directory as --source",
    );
    untouched(&d);
    // An output that is an old image: a hard link, a symlink, another partition's image.
    let out = d.join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::hard_link(old.join("kernel.img"), out.join("kernel.img")).unwrap();
    refused(
        &apply_args(&delta, &old, &out),
        "kernel.img is the same file as --source ",
    );
    std::fs::remove_file(out.join("kernel.img")).unwrap();
    std::os::unix::fs::symlink(old.join("kernel.img"), out.join("root.img")).unwrap();
    let e = refused(
        &apply_args(&delta, &old, &out),
        "refusing to overwrite an input",
    );
    assert!(
        e.contains("root.img is the same file as --source ") && e.contains("kernel.img"),
        "{e}"
    );
    untouched(&d);
    std::fs::remove_file(out.join("root.img")).unwrap();
    // An output that is the OTA.
    std::fs::hard_link(&delta, out.join("root.img")).unwrap();
    refused(
        &apply_args(&delta, &old, &out),
        "root.img is the same file as OTA ",
    );
    assert_eq!(entries(&out), ["root.img"]);
    untouched(&d);
}

#[test]
fn missing_and_wrong_old_images_are_refused_before_the_output_exists() {
    let d = samples();
    let delta = d.join("delta_payload.bin");
    let old = d.join("old");
    let out = d.join("out");
    std::fs::remove_file(old.join("kernel.img")).unwrap();
    let e = refused(
        &apply_args(&delta, &old, &out),
        "partition kernel: old image ",
    );
    assert!(
        e.trim_end()
            .ends_with("kernel.img: No such file or directory (os error 2)"),
        "{e}"
    );
    assert!(!out.exists());
    // root's image where kernel's should be: the wrong size.
    std::fs::copy(old.join("root.img"), old.join("kernel.img")).unwrap();
    let e = refused(
        &apply_args(&delta, &old, &out),
        "partition kernel: the old image is 4096 bytes, old_partition_info.size is 4194304",
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    // The right size, one byte changed.
    let mut k = read(&d.join("disk_ext2_4k_empty.img"));
    k[1024 + 7] ^= 1;
    std::fs::write(old.join("kernel.img"), &k).unwrap();
    refused(
        &apply_args(&delta, &old, &out),
        "partition kernel: the old image's SHA-256 ",
    );
    assert!(
        !out.exists(),
        "nothing is created before the old images check out"
    );
    // --source that is not a directory.
    refused(
        &apply_args(&delta, &old.join("root.img"), &out),
        "is not a directory",
    );
    let e = refused(&apply_args(&delta, &d.join("nowhere"), &out), "--source ");
    assert!(e.contains("No such file or directory"), "{e}");
    assert!(!out.exists());
}

/// A BSDIFF40 patch made by Debian's bsdiff.
fn bsdiff(old: &[u8], new: &[u8]) -> Vec<u8> {
    let d = TempDir::new("ota-apply-bsdiff");
    let (o, n, p) = (d.join("o"), d.join("n"), d.join("p"));
    std::fs::write(&o, old).unwrap();
    std::fs::write(&n, new).unwrap();
    tool_ok("bsdiff", &[path_str(&o), path_str(&n), path_str(&p)]);
    read(&p)
}

/// A payload with `system` (a copy and a bsdiff patch) and `product` (a copy and a ZUCCHINI
/// at op 1), its old images in `old/`.
fn mixed(d: &TempDir, zucchini: bool) -> (PathBuf, Vec<u8>) {
    let old = pattern(8 * 4096, 1);
    let mut new = old[4 * 4096..].to_vec();
    new.extend_from_slice(&old[..4 * 4096]);
    for i in (0..new.len()).step_by(1000) {
        new[i] ^= 0x11;
    }
    let system_ops = [
        DeltaOp::Copy {
            src: vec![(0, 2)],
            dst: vec![(0, 2)],
        },
        DeltaOp::Bsdiff {
            src: vec![(0, 8)],
            dst: vec![(2, 6)],
        },
    ];
    let mut new_system = old[..2 * 4096].to_vec();
    new_system.extend_from_slice(&new[2 * 4096..]);
    let small = pattern(2 * 4096, 3);
    let t = if zucchini {
        OpType::Zucchini
    } else {
        OpType::SourceBsdiff
    };
    let product_ops = [
        DeltaOp::Copy {
            src: vec![(0, 1)],
            dst: vec![(0, 1)],
        },
        DeltaOp::Raw {
            op_type: t as i32,
            src: vec![(1, 1)],
            dst: vec![(1, 1)],
            blob: bsdiff(&small[4096..], &small[4096..]),
        },
    ];
    let bytes = PayloadBuilder::new()
        .delta("system", &old, &new_system, &system_ops, &bsdiff)
        .delta("product", &small, &small, &product_ops, &bsdiff)
        .bytes();
    let p = d.join("mixed.bin");
    std::fs::write(&p, bytes).unwrap();
    std::fs::create_dir_all(d.join("old")).unwrap();
    std::fs::write(d.join("old/system.img"), &old).unwrap();
    std::fs::write(d.join("old/product.img"), &small).unwrap();
    (p, new_system)
}

#[test]
fn unsupported_partitions_are_refused_or_skipped() {
    let d = TempDir::new("ota-apply-skip");
    let (ota, system) = mixed(&d, true);
    let (old, out) = (d.join("old"), d.join("out"));
    let e = refused(
        &apply_args(&ota, &old, &out),
        "partition product, op 1: ZUCCHINI is not supported by apply",
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(!out.exists());
    let info = ok(&["ota", "info", path_str(&ota)]);
    assert!(
        info.contains("    apply: no (ZUCCHINI at op 1 not supported)"),
        "{info}"
    );
    let mut args = apply_args(&ota, &old, &out);
    args.push("--skip-unsupported");
    let text = ok(&args);
    assert!(
        text.contains("skipped product: ZUCCHINI at op 1 not supported\n"),
        "{text}"
    );
    assert!(text.ends_with(", 1 skipped\n"), "{text}");
    assert_eq!(entries(&out), ["system.img"]);
    assert!(read(&out.join("system.img")) == system);
    args.push("--json");
    let doc: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
    assert_eq!(
        doc["skipped"],
        serde_json::json!([{
            "name": "product",
            "index": 1,
            "blocker": {"kind": "operation", "index": 1, "op_type": "ZUCCHINI"}
        }])
    );
    assert_eq!(doc["partitions"].as_array().unwrap().len(), 1);
    // Without the ZUCCHINI, both build.
    let d = TempDir::new("ota-apply-both");
    let (ota, _) = mixed(&d, false);
    ok(&apply_args(&ota, &d.join("old"), &d.join("out")));
    assert_eq!(entries(&d.join("out")), ["product.img", "system.img"]);
}

#[test]
fn a_failure_leaves_no_output_under_a_final_name() {
    let d = TempDir::new("ota-apply-fail");
    let (ota, _) = mixed(&d, false);
    let out = d.join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("system.img"), b"previous").unwrap();
    // An old image that does not check out: nothing is written.
    let mut old_product = read(&d.join("old/product.img"));
    old_product[4096 + 5] ^= 1;
    std::fs::write(d.join("old/product.img"), &old_product).unwrap();
    let old = d.join("old");
    let mut args = apply_args(&ota, &old, &out);
    args.push("--json");
    let o = snapblk(&args);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("snapblk: partition product: the old image's SHA-256 "),
        "{err}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["schema"], "snapblk.ota-apply.v1");
    assert_eq!(entries(&out), ["system.img"]);
    assert_eq!(read(&out.join("system.img")), b"previous");
    // A failure while building (a corrupt last blob: system builds, product fails): no image
    // appears, no temporary stays.
    std::fs::write(d.join("old/product.img"), pattern(2 * 4096, 3)).unwrap();
    let mut b = read(&ota);
    let n = b.len();
    b[n - 10] ^= 0x40;
    let bad = d.join("bad.bin");
    std::fs::write(&bad, &b).unwrap();
    let e = refused(
        &apply_args(&bad, &d.join("old"), &out),
        "partition product, op 1: data SHA-256 ",
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    assert_eq!(entries(&out), ["system.img"], "no temporary file left");
    assert_eq!(read(&out.join("system.img")), b"previous");
}

/// `data` (300 blocks) with its hash tree (4 blocks) and FEC (4 blocks, 2 roots) made by
/// veritysetup into `dir/name.img`: the image and its root hash.
fn verity_image(dir: &Path, name: &str, data: &[u8]) -> (Vec<u8>, String) {
    assert_eq!(data.len(), 300 * 4096);
    let img = dir.join(format!("{name}.img"));
    let mut image = data.to_vec();
    image.resize(304 * 4096, 0);
    std::fs::write(&img, &image).unwrap();
    let report = tool_ok(
        "veritysetup",
        &[
            "format",
            "--no-superblock",
            "--format=1",
            "--hash=sha256",
            "--data-block-size=4096",
            "--hash-block-size=4096",
            &format!("--salt={}", "5e".repeat(32)),
            "--data-blocks=300",
            &format!("--hash-offset={}", 300 * 4096),
            &format!("--fec-device={}", path_str(&img)),
            &format!("--fec-offset={}", 304 * 4096),
            "--fec-roots=2",
            path_str(&img),
            path_str(&img),
        ],
    );
    let root = report
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .unwrap()
        .trim()
        .to_string();
    let image = read(&img);
    assert_eq!(image.len(), 308 * 4096);
    (image, root)
}

/// An incremental payload updating `system` from one veritysetup-made image to another: its
/// operations (SOURCE_COPY where 25-block chunks are unchanged, bsdiff patches elsewhere) cover
/// the 300 data blocks only, and its verity fields name the tree and the FEC (with `roots`
/// roots, 2 the right number). Writes the old image to `old/system.img`; returns the payload's
/// path, the new image and its root hash.
fn verity_update(d: &TempDir, roots: u32) -> (PathBuf, Vec<u8>, String) {
    let data = pattern(300 * 4096, 21);
    let mut new_data = data.clone();
    for chunk in [2, 5, 11] {
        for i in (chunk * 25 * 4096..(chunk + 1) * 25 * 4096).step_by(777) {
            new_data[i] ^= 0x3c;
        }
    }
    new_data[200 * 4096..210 * 4096].fill(0);
    let (old, _) = verity_image(d.path(), "old-verity", &data);
    let (new, root) = verity_image(d.path(), "new-verity", &new_data);
    let ops: Vec<DeltaOp> = (0..12u64)
        .map(|c| {
            let v = vec![(c * 25, 25)];
            let r = (c * 25 * 4096) as usize..((c + 1) * 25 * 4096) as usize;
            if old[r.clone()] == new[r] {
                DeltaOp::Copy {
                    src: v.clone(),
                    dst: v,
                }
            } else {
                DeltaOp::Bsdiff {
                    src: v.clone(),
                    dst: v,
                }
            }
        })
        .collect();
    let mut built = PayloadBuilder::new()
        .delta("system", &old, &new, &ops, &bsdiff)
        .build();
    let ext = |start, num| {
        Some(snapblk_ota::Extent {
            start_block: Some(start),
            num_blocks: Some(num),
        })
    };
    let p = &mut built.manifest.partitions[0];
    p.hash_tree_data_extent = ext(0, 300);
    p.hash_tree_extent = ext(300, 4);
    p.hash_tree_algorithm = Some("sha256".into());
    p.hash_tree_salt = Some(vec![0x5e; 32]);
    p.fec_data_extent = ext(0, 304);
    p.fec_extent = ext(304, 4);
    p.fec_roots = Some(roots);
    let path = d.join("verity.bin");
    std::fs::write(&path, built.to_bytes()).unwrap();
    std::fs::create_dir_all(d.join("old")).unwrap();
    std::fs::write(d.join("old/system.img"), &old).unwrap();
    (path, new, root)
}

#[test]
fn apply_recomputes_the_hash_tree_and_fec_the_payload_leaves_out() {
    let d = TempDir::new("ota-apply-verity");
    let (ota, image, root) = verity_update(&d, 2);
    let info = ok(&["ota", "info", path_str(&ota)]);
    for want in [
        format!(
            "    hash tree: sha256 of blocks 0+300 at blocks 300+4, salt {}",
            "5e".repeat(32)
        ),
        "    FEC: 2 roots over blocks 0+304 at blocks 304+4".into(),
        "    apply: yes".into(),
    ] {
        assert!(info.lines().any(|l| l == want), "{want:?} in\n{info}");
    }
    let (old, out) = (d.join("old"), d.join("out"));
    let text = ok(&apply_args(&ota, &old, &out));
    assert!(
        read(&out.join("system.img")) == image,
        "differs from veritysetup's image"
    );
    assert!(
        text.contains(&format!(
            "system.img: 1.20 MiB (1261568 bytes), 12 ops, hash tree (sha256 root {root}) and FEC (2 roots) recomputed, sha256 {} verified",
            sha256_hex(&out.join("system.img"))
        )),
        "{text}"
    );
    let out2 = d.join("out2");
    let mut args = apply_args(&ota, &old, &out2);
    args.extend(["--json", "--threads", "1"]);
    let doc: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
    let v = &doc["partitions"][0]["verity"];
    assert_eq!(v["root_digest"], root.as_str());
    assert_eq!(v["hash_algorithm"], "sha256");
    assert_eq!(v["hash_tree_bytes"], 4 * 4096);
    assert_eq!(v["fec_roots"], 2);
    assert_eq!(v["fec_bytes"], 4 * 4096);
    assert!(read(&out2.join("system.img")) == image);
}

#[test]
fn bad_verity_fields_are_refused_before_the_output_directory_exists() {
    let d = TempDir::new("ota-apply-verity-bad");
    let (ota, _, _) = verity_update(&d, 40);
    let info = ok(&["ota", "info", path_str(&ota)]);
    assert!(
        info.contains("    apply: no (verity: fec_roots 40 is outside 2..=24)"),
        "{info}"
    );
    let (old, out) = (d.join("old"), d.join("out"));
    for skip in [false, true] {
        let mut args = apply_args(&ota, &old, &out);
        if skip {
            args.push("--skip-unsupported");
        }
        let e = refused(
            &args,
            "partition system, verity: fec_roots 40 is outside 2..=24",
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(!out.exists());
    }
}
