//! `snapblk ota info|extract` on the real AOSP sample payloads (tests/data/ota) and on
//! payloads the crate's writer makes (one with a hash tree and FEC made by veritysetup that its
//! operations leave out): exact images, verified hashes, sparse outputs, and the data-safety
//! rules (untrusted partition names, outputs that are the input, nothing under a
//! final name after a failure).

use snapblk_testsupport::entries;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use snapblk_ota::testing::{Encoding, PayloadBuilder};
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

#[path = "cli_common.rs"]
mod common;
use common::{ok, read, refused, snapblk};

/// The sample payloads and images, unpacked into a new directory.
fn samples() -> TempDir {
    let d = TempDir::new("ota-cli");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/ota");
    for a in ["sample_payloads.tar.xz", "sample_images.tar.bz2"] {
        tool_ok(
            "tar",
            &["-xf", path_str(&data.join(a)), "-C", path_str(d.path())],
        );
    }
    d
}

fn sha256_hex(p: &Path) -> String {
    let out = tool_ok("sha256sum", &[path_str(p)]);
    out.split_whitespace().next().unwrap().to_string()
}

#[test]
fn extract_of_the_aosp_full_payload_gives_its_images() {
    let d = samples();
    let out = d.join("out");
    let text = ok(&[
        "ota",
        "extract",
        path_str(&d.join("full_payload.bin")),
        "-o",
        path_str(&out),
    ]);
    assert_eq!(entries(&out), ["kernel.img", "root.img"]);
    assert!(read(&out.join("kernel.img")) == read(&d.join("disk_ext2_4k.img")));
    assert!(read(&out.join("root.img")) == read(&d.join("disk_sqfs_default.img")));
    // The manifest's hashes, as sha256sum computes them, are what the command verified.
    let info: serde_json::Value = serde_json::from_str(&ok(&[
        "ota",
        "info",
        path_str(&d.join("full_payload.bin")),
        "--json",
    ]))
    .unwrap();
    assert_eq!(info["schema"], "snapblk.ota-info.v1");
    assert_eq!(info["kind"], "full");
    assert_eq!(info["minor_version"], 0);
    for (i, name) in ["kernel", "root"].iter().enumerate() {
        let p = &info["partitions"][i];
        assert_eq!(p["name"], *name);
        assert_eq!(p["extractable"], true);
        let h = sha256_hex(&out.join(format!("{name}.img")));
        assert_eq!(p["sha256"], h.as_str());
        assert!(
            text.contains(&format!("{name}.img: ")) && text.contains(&h),
            "{text}"
        );
    }
    // Zeros are holes: the 4 MiB kernel image is mostly empty.
    let m = std::fs::metadata(out.join("kernel.img")).unwrap();
    assert!(m.blocks() * 512 < m.len() / 4, "{} blocks", m.blocks());
    // Again with --json and one worker, over the previous files.
    let doc: serde_json::Value = serde_json::from_str(&ok(&[
        "ota",
        "extract",
        path_str(&d.join("full_payload.bin")),
        "-o",
        path_str(&out),
        "--threads",
        "1",
        "--json",
    ]))
    .unwrap();
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["threads"], 1);
    assert_eq!(doc["partitions"][1]["name"], "root");
    assert_eq!(
        doc["partitions"][1]["sha256"],
        sha256_hex(&d.join("disk_sqfs_default.img")).as_str()
    );
    assert_eq!(entries(&out), ["kernel.img", "root.img"]);
}

#[test]
fn the_delta_payload_is_described_and_its_full_partitions_extract() {
    let d = samples();
    let delta = d.join("delta_payload.bin");
    let text = ok(&["ota", "info", path_str(&delta)]);
    assert!(
        text.contains("Kind: incremental (minor version 6)"),
        "{text}"
    );
    assert!(
        text.contains("extract: no (BROTLI_BSDIFF, SOURCE_COPY not supported)"),
        "{text}"
    );
    let out = d.join("out");
    let err = refused(
        &["ota", "extract", path_str(&delta), "-o", path_str(&out)],
        "partition kernel, op 0: BROTLI_BSDIFF is not supported by extract",
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        !out.exists(),
        "nothing is created for a payload that cannot be extracted"
    );
    // root is REPLACE_XZ only.
    ok(&[
        "ota",
        "extract",
        path_str(&delta),
        "-o",
        path_str(&out),
        "--partitions",
        "root",
    ]);
    assert_eq!(entries(&out), ["root.img"]);
    assert!(read(&out.join("root.img")) == read(&d.join("disk_sqfs_default.img")));
    refused(
        &[
            "ota",
            "extract",
            path_str(&delta),
            "-o",
            path_str(&out),
            "--partitions",
            "root,boot",
        ],
        "no partition \"boot\" in the payload (it has: kernel, root)",
    );
}

#[test]
fn outputs_that_are_the_input_are_refused() {
    let d = samples();
    let ota = d.join("full_payload.bin");
    let before = read(&ota);
    let out = d.join("out");
    std::fs::create_dir(&out).unwrap();
    // A hard link and a symlink to the OTA under an output's name.
    std::fs::hard_link(&ota, out.join("kernel.img")).unwrap();
    refused(
        &["ota", "extract", path_str(&ota), "-o", path_str(&out)],
        "is the same file as OTA",
    );
    std::fs::remove_file(out.join("kernel.img")).unwrap();
    std::os::unix::fs::symlink(&ota, out.join("root.img")).unwrap();
    refused(
        &["ota", "extract", path_str(&ota), "-o", path_str(&out)],
        "is the same file as OTA",
    );
    assert!(read(&ota) == before);
    assert_eq!(entries(&out), ["root.img"]);
    // -o naming the OTA itself (a file, not a directory).
    refused(
        &["ota", "extract", path_str(&ota), "-o", path_str(&ota)],
        "is not a directory",
    );
    assert!(read(&ota) == before);
}

#[test]
fn a_failure_leaves_no_output_under_a_final_name() {
    let d = samples();
    // Corrupt the last blob (root's REPLACE_XZ data): kernel verifies, root fails.
    let mut bytes = read(&d.join("full_payload.bin"));
    let n = bytes.len();
    bytes[n - 20] ^= 0x40;
    let bad = d.join("bad.bin");
    std::fs::write(&bad, &bytes).unwrap();
    let out = d.join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("kernel.img"), b"previous").unwrap();
    let o = snapblk(&[
        "ota",
        "extract",
        path_str(&bad),
        "-o",
        path_str(&out),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("snapblk: partition root, op 0: "), "{err}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["schema"], "snapblk.ota-extract.v1");
    assert_eq!(read(&out.join("kernel.img")), b"previous");
    assert_eq!(entries(&out), ["kernel.img"], "no temporary file left");
}

#[test]
fn untrusted_partition_names_never_leave_the_output_directory() {
    let d = TempDir::new("ota-cli-names");
    for evil in ["../escape", "/etc/evil", "..", ".hidden"] {
        let bytes = PayloadBuilder::new()
            .partition(evil, &pattern(4096, 1), 1, &[Encoding::Replace])
            .bytes();
        let p: PathBuf = d.join("evil.bin");
        std::fs::write(&p, bytes).unwrap();
        let out = d.join("out");
        let err = refused(
            &["ota", "extract", path_str(&p), "-o", path_str(&out)],
            "refusing to use it as a file name",
        );
        assert!(err.contains(&format!("{evil:?}")), "{err}");
        assert!(!out.exists());
        assert_eq!(entries(d.path()), ["evil.bin"], "{evil}");
        // info shows it, escaped.
        let text = ok(&["ota", "info", path_str(&p)]);
        assert!(text.contains("extract: no (partition name: "), "{text}");
    }
}

#[test]
fn errors_print_each_cause_once_on_one_line() {
    let o = snapblk(&["ota", "info", "/nonexistent/ota.zip"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "snapblk: /nonexistent/ota.zip: opening the OTA: No such file or directory (os error 2)\n"
    );
    let d = samples();
    let mut b = read(&d.join("full_payload.bin"));
    b[30..40].fill(0xff);
    let bad = d.join("bad.bin");
    std::fs::write(&bad, &b).unwrap();
    let err = refused(&["ota", "info", path_str(&bad)], "decoding the manifest: ");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(err.matches("decoding the manifest").count(), 1, "{err}");
}

/// A 300-block image with its hash tree (4 blocks) and FEC (4 blocks, 2 roots) made by
/// veritysetup, and a payload whose operations cover only the data, the verity fields set.
fn verity_payload(d: &Path) -> (Vec<u8>, String, snapblk_ota::testing::Built) {
    let mut data = pattern(300 * 4096, 5);
    data[100 * 4096..120 * 4096].fill(0);
    let img = d.join("expected.img");
    let mut image = data.clone();
    image.resize(304 * 4096, 0);
    std::fs::write(&img, &image).unwrap();
    let salt = "aa".repeat(32);
    let report = tool_ok(
        "veritysetup",
        &[
            "format",
            "--no-superblock",
            "--format=1",
            "--hash=sha256",
            "--data-block-size=4096",
            "--hash-block-size=4096",
            &format!("--salt={salt}"),
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
    let mut built = PayloadBuilder::new()
        .partition("system", &image, 16, &[Encoding::Replace, Encoding::Xz])
        .skip_blocks(300, 8)
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
    p.hash_tree_salt = Some(vec![0xaa; 32]);
    p.fec_data_extent = ext(0, 304);
    p.fec_extent = ext(304, 4);
    p.fec_roots = Some(2);
    (image, root, built)
}

#[test]
fn extract_recomputes_the_hash_tree_and_fec_the_payload_leaves_out() {
    let d = TempDir::new("ota-cli-verity");
    let (image, root, built) = verity_payload(d.path());
    let payload = d.join("payload.bin");
    std::fs::write(&payload, built.to_bytes()).unwrap();
    let text = ok(&["ota", "info", path_str(&payload)]);
    let salt = "aa".repeat(32);
    for want in [
        format!("    hash tree: sha256 of blocks 0+300 at blocks 300+4, salt {salt}"),
        "    FEC: 2 roots over blocks 0+304 at blocks 304+4".into(),
        "    extract: yes".into(),
    ] {
        assert!(text.lines().any(|l| l == want), "{want:?} in\n{text}");
    }
    let info: serde_json::Value =
        serde_json::from_str(&ok(&["ota", "info", path_str(&payload), "--json"])).unwrap();
    let v = &info["partitions"][0]["verity"];
    assert_eq!(v["hash_tree_extent"]["start_block"], 300);
    assert_eq!(v["hash_tree_extent"]["num_blocks"], 4);
    assert_eq!(v["hash_tree_algorithm"], "sha256");
    assert_eq!(v["hash_tree_salt"], salt.as_str());
    assert_eq!(v["fec_data_extent"]["num_blocks"], 304);
    assert_eq!(v["fec_roots"], 2);
    assert_eq!(v["problem"], serde_json::Value::Null);

    let out = d.join("out");
    let text = ok(&["ota", "extract", path_str(&payload), "-o", path_str(&out)]);
    assert!(
        read(&out.join("system.img")) == image,
        "differs from veritysetup's"
    );
    assert!(
        text.contains(&format!(
            "system.img: 1.20 MiB (1261568 bytes), 19 ops, hash tree (sha256 root {root}) and FEC (2 roots) recomputed, sha256 "
        )),
        "{text}"
    );
    let doc: serde_json::Value = serde_json::from_str(&ok(&[
        "ota",
        "extract",
        path_str(&payload),
        "-o",
        path_str(&d.join("out2")),
        "--json",
    ]))
    .unwrap();
    let v = &doc["partitions"][0]["verity"];
    assert_eq!(v["root_digest"], root.as_str());
    assert_eq!(v["hash_algorithm"], "sha256");
    assert_eq!(v["hash_tree_bytes"], 4 * 4096);
    assert_eq!(v["fec_roots"], 2);
    assert_eq!(v["fec_bytes"], 4 * 4096);
}

#[test]
fn bad_verity_fields_are_refused_before_the_output_directory_is_touched() {
    let d = TempDir::new("ota-cli-verity-bad");
    let (_, _, mut built) = verity_payload(d.path());
    built.manifest.partitions[0].fec_roots = Some(40);
    let payload = d.join("payload.bin");
    std::fs::write(&payload, built.to_bytes()).unwrap();
    let text = ok(&["ota", "info", path_str(&payload)]);
    assert!(
        text.contains("    extract: no (verity: fec_roots 40 is outside 2..=24)"),
        "{text}"
    );
    let out = d.join("out");
    let err = refused(
        &["ota", "extract", path_str(&payload), "-o", path_str(&out)],
        "",
    );
    assert_eq!(
        err,
        "snapblk: partition system, verity: fec_roots 40 is outside 2..=24\n"
    );
    assert!(!out.exists());
}
