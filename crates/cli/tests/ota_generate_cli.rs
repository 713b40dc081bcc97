//! `snapblk ota generate`: payloads from image directories and single images that `snapblk ota
//! apply` (and `extract`, for full payloads) turns into exactly the new images, signed ones
//! that `ota info --key` verifies with the openssl-made public key, and the bad inputs refused
//! before anything is written: source and target the same file, an output that is an input,
//! missing images, contradictory arguments. End to end: ext4 images (mkfs.ext4 -d) → `ota
//! generate` → `ota cow --verify --verify-merge` (the COW fits the generator's estimate) →
//! `snapblk serve` over NBD, read by nbdcopy, is the new image, and `snapblk merge` makes it.

use std::path::Path;

use snapblk_testsupport::ext4;
use snapblk_testsupport::openssl;
use snapblk_testsupport::{TempDir, nbd, path_str, pattern};

#[path = "cli_common.rs"]
mod common;
use common::{ok, read, refused};
#[path = "serve_common.rs"]
mod serve_common;
use serve_common::Serve;

const BS: usize = 4096;

/// old/{system,vendor}.img and new/{system,vendor,product}.img (product is new).
fn dirs(d: &TempDir) {
    for sub in ["old", "new"] {
        std::fs::create_dir(d.join(sub)).unwrap();
    }
    let sys = pattern(64 * BS, 1);
    let mut sys2 = sys.clone();
    sys2.splice(10 * BS..10 * BS, pattern(300, 2));
    sys2.truncate(64 * BS);
    sys2[40 * BS..44 * BS].fill(0);
    let ven = pattern(16 * BS, 3);
    let mut ven2 = ven.clone();
    ven2[..4 * BS].copy_from_slice(&ven[8 * BS..12 * BS]);
    std::fs::write(d.join("old/system.img"), &sys).unwrap();
    std::fs::write(d.join("new/system.img"), &sys2).unwrap();
    std::fs::write(d.join("old/vendor.img"), &ven).unwrap();
    std::fs::write(d.join("new/vendor.img"), &ven2).unwrap();
    std::fs::write(d.join("new/product.img"), pattern(8 * BS, 4)).unwrap();
}

fn same(a: &Path, b: &Path) {
    assert!(
        read(a) == read(b),
        "{} differs from {}",
        a.display(),
        b.display()
    );
}

#[test]
fn directories_generate_apply_and_extract_round_trip() {
    let d = TempDir::new("ota-gen-cli");
    dirs(&d);
    let (old, new, pay) = (d.join("old"), d.join("new"), d.join("p.bin"));
    let out = ok(&[
        "ota",
        "generate",
        "--source",
        path_str(&old),
        "--target",
        path_str(&new),
        "-o",
        path_str(&pay),
        "--threads",
        "2",
    ]);
    assert!(
        out.contains("incremental payload, minor version 8"),
        "{out}"
    );
    assert!(out.contains("COW estimate"), "{out}");
    let applied = d.join("applied");
    ok(&[
        "ota",
        "apply",
        path_str(&pay),
        "--source",
        path_str(&old),
        "-o",
        path_str(&applied),
    ]);
    for p in ["system", "vendor", "product"] {
        same(
            &applied.join(format!("{p}.img")),
            &new.join(format!("{p}.img")),
        );
    }
    // The COWs of every partition (one only moved blocks, one is new) fit their estimates.
    let cows = d.join("cows");
    let doc = ok(&[
        "ota",
        "cow",
        path_str(&pay),
        "--source",
        path_str(&old),
        "-o",
        path_str(&cows),
        "--verify",
        "--json",
    ]);
    let c: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let parts = c["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 3, "{doc}");
    for r in parts {
        let (size, est) = (r["cow_size"].as_u64(), r["estimate_cow_size"].as_u64());
        assert!(size.is_some() && size <= est, "{doc}");
    }
    // bsdiff40 and JSON.
    let pay40 = d.join("p40.bin");
    let json = ok(&[
        "ota",
        "generate",
        "--source",
        path_str(&old),
        "--target",
        path_str(&new),
        "-o",
        path_str(&pay40),
        "--bsdiff-format",
        "bsdiff40",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["ok"], true);
    let sys = v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "system");
    assert!(
        sys.unwrap()["ops"]["SOURCE_BSDIFF"].as_u64() > Some(0),
        "{json}"
    );
    let applied40 = d.join("applied40");
    ok(&[
        "ota",
        "apply",
        path_str(&pay40),
        "--source",
        path_str(&old),
        "-o",
        path_str(&applied40),
    ]);
    same(&applied40.join("system.img"), &new.join("system.img"));
    // A full payload of one image, named after the file.
    let full = d.join("full.bin");
    ok(&[
        "ota",
        "generate",
        "--target",
        path_str(&new.join("vendor.img")),
        "-o",
        path_str(&full),
    ]);
    let ex = d.join("ex");
    ok(&["ota", "extract", path_str(&full), "-o", path_str(&ex)]);
    same(&ex.join("vendor.img"), &new.join("vendor.img"));
}

#[test]
fn signed_payloads_verify_with_ota_info() {
    let d = TempDir::new("ota-gen-cli-sign");
    dirs(&d);
    let k = openssl::key(d.path(), "rsa", "rsa:2048");
    let e = openssl::key(d.path(), "ec", "ec:P-256");
    let pay = d.join("s.bin");
    ok(&[
        "ota",
        "generate",
        "--source",
        path_str(&d.join("old")),
        "--target",
        path_str(&d.join("new")),
        "-o",
        path_str(&pay),
        "--key",
        path_str(&k.private),
        "--key",
        path_str(&e.private),
    ]);
    let info = ok(&[
        "ota",
        "info",
        path_str(&pay),
        "--key",
        path_str(&e.public_pem),
    ]);
    assert!(info.matches("verified with").count() >= 2, "{info}");
    let other = openssl::key(d.path(), "other", "rsa:2048");
    let o = common::snapblk(&[
        "ota",
        "info",
        path_str(&pay),
        "--key",
        path_str(&other.public_pem),
    ]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("MISMATCH"));
}

#[test]
fn bad_inputs_are_refused_before_anything_is_written() {
    let d = TempDir::new("ota-gen-cli-bad");
    dirs(&d);
    let (old, new) = (d.join("old"), d.join("new"));
    let img = new.join("system.img");
    let pay = d.join("p.bin");
    let try_gen = |src: &Path, tgt: &Path, out: &Path, want: &str| {
        refused(
            &[
                "ota",
                "generate",
                "--source",
                path_str(src),
                "--target",
                path_str(tgt),
                "-o",
                path_str(out),
            ],
            want,
        );
    };
    // Source and target the same file (also through a hard link).
    try_gen(&img, &img, &pay, "are the same file");
    std::fs::hard_link(&img, d.join("link.img")).unwrap();
    try_gen(&d.join("link.img"), &img, &pay, "are the same file");
    // The output is an input: the target, the source, an image inside the directories, a key.
    let old_img = old.join("system.img");
    let before = read(&old_img);
    try_gen(&old_img, &img, &img, "refusing to overwrite an input");
    try_gen(&old_img, &img, &old_img, "refusing to overwrite an input");
    try_gen(
        &old,
        &new,
        &new.join("vendor.img"),
        "refusing to overwrite an input",
    );
    try_gen(
        &old,
        &new,
        &old.join("vendor.img"),
        "refusing to overwrite an input",
    );
    let k = openssl::key(d.path(), "k", "rsa:2048");
    refused(
        &[
            "ota",
            "generate",
            "--target",
            path_str(&img),
            "-o",
            path_str(&k.private),
            "--key",
            path_str(&k.private),
        ],
        "refusing to overwrite an input",
    );
    assert!(read(&old_img) == before);
    // Missing images, file against directory, a directory as output, a bad key.
    try_gen(&d.join("nope.img"), &img, &pay, "--source");
    try_gen(&old_img, &d.join("nope.img"), &pay, "--target");
    try_gen(&old, &img, &pay, "both be images or both be directories");
    try_gen(&old, &new, d.path(), "is a directory");
    refused(
        &[
            "ota",
            "generate",
            "--target",
            path_str(&img),
            "-o",
            path_str(&pay),
            "--key",
            path_str(&k.public_pem),
        ],
        "not an RSA",
    );
    let empty = d.join("empty");
    std::fs::create_dir(&empty).unwrap();
    refused(
        &[
            "ota",
            "generate",
            "--target",
            path_str(&empty),
            "-o",
            path_str(&pay),
        ],
        "holds no <partition>.img",
    );
    // An image that is not whole blocks.
    std::fs::write(d.join("odd.img"), [1u8; 100]).unwrap();
    refused(
        &[
            "ota",
            "generate",
            "--target",
            path_str(&d.join("odd.img")),
            "-o",
            path_str(&pay),
        ],
        "not a multiple of 4096",
    );
    assert!(!pay.exists(), "a refused run left {}", pay.display());
}

#[test]
fn generated_payload_to_cow_served_and_merged_is_the_new_image() {
    let d = TempDir::new("ota-gen-cow");
    let doc = pattern(700 * 1024, 41);
    let mut doc2 = doc.clone();
    doc2.splice(100_000..100_000, pattern(777, 42));
    let mut bin2 = pattern(300 * 1024, 43);
    let bin = bin2.clone();
    bin2[5000..5100].fill(1);
    let old = ext4::of_files(
        d.path(),
        "o",
        &[
            ("a/doc", doc),
            ("b/bin", bin),
            ("c/gone", pattern(90_000, 44)),
        ],
        8,
    );
    let new = ext4::of_files(
        d.path(),
        "n",
        &[
            ("a/doc", doc2),
            ("b/bin", bin2),
            ("d/new", pattern(50_000, 45)),
        ],
        8,
    );
    for sub in ["old", "new"] {
        std::fs::create_dir(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("old/system.img"), &old).unwrap();
    std::fs::write(d.join("new/system.img"), &new).unwrap();
    for (comp, version) in [("lz4", "3"), ("gz", "2")] {
        let pay = d.join(&format!("{comp}.bin"));
        let j = ok(&[
            "ota",
            "generate",
            "--source",
            path_str(&d.join("old")),
            "--target",
            path_str(&d.join("new")),
            "-o",
            path_str(&pay),
            "--vabc-compression",
            comp,
            "--cow-version",
            version,
            "--json",
        ]);
        let g: serde_json::Value = serde_json::from_str(&j).unwrap();
        let estimate = g["partitions"][0]["estimate_cow_size"].as_u64().unwrap();
        assert!(g["partitions"][0]["cow_xor"].as_u64() > Some(0), "{j}");
        let out = d.join(&format!("cow-{comp}"));
        let doc = ok(&[
            "ota",
            "cow",
            path_str(&pay),
            "--source",
            path_str(&d.join("old")),
            "-o",
            path_str(&out),
            "--verify",
            "--verify-merge",
            "--json",
        ]);
        let c: serde_json::Value = serde_json::from_str(&doc).unwrap();
        let r = &c["partitions"][0];
        let want = snapblk_ota::hex(&snapblk_ota::testing::sha256(&new));
        assert_eq!(r["view_sha256"], want, "{comp}: {doc}");
        assert_eq!(r["merge_sha256"], want, "{comp}: {doc}");
        let size = r["cow_size"].as_u64().unwrap();
        assert!(
            size <= estimate,
            "{comp}: COW of {size} bytes, estimate {estimate}"
        );
        let cow = out.join("system.cow");
        let old_img = d.join("old/system.img");
        let srv = Serve::start(&[
            "--base",
            path_str(&old_img),
            "--cow",
            path_str(&cow),
            "--read-only",
            "--nbd",
            "0",
        ]);
        let got = d.join("served.img");
        nbd::copy(&srv.ready_str("uri"), path_str(&got));
        drop(srv);
        assert!(read(&got) == new, "{comp}: served view differs");
        let base = d.join("base.img");
        std::fs::copy(&old_img, &base).unwrap();
        ok(&["merge", path_str(&cow), "--base", path_str(&base)]);
        assert!(
            read(&base)[..new.len()] == new[..],
            "{comp}: merged image differs"
        );
    }
}

/// `--no-vabc` with a Virtual A/B setting is a contradiction: refused (clap's usage error,
/// exit status 2) before anything is written, rather than the setting silently dropped.
#[test]
fn vabc_settings_without_vabc_are_refused() {
    let d = TempDir::new("ota-gen-cli-novabc");
    dirs(&d);
    let img = d.join("new").join("system.img");
    let pay = d.join("p.bin");
    for extra in [
        &["--no-xor"][..],
        &["--vabc-compression", "gz"],
        &["--cow-version", "2"],
        &["--compression-factor", "4096"],
    ] {
        let mut args = vec!["ota", "generate", "--target", path_str(&img)];
        args.extend(["-o", path_str(&pay), "--no-vabc"]);
        args.extend(extra);
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains("cannot be used with"), "{extra:?}: {err}");
        assert!(!pay.exists(), "{extra:?}");
    }
}

/// A `,LEVEL` outside the algorithm's range (which the encoders would silently clamp) is
/// refused with one line naming the range, before anything is written.
#[test]
fn vabc_compression_levels_out_of_range_are_refused() {
    let d = TempDir::new("ota-gen-cli-level");
    dirs(&d);
    let pay = d.join("p.bin");
    for (param, range) in [
        ("zstd,23", "zstd levels are -131072 to 22"),
        ("zstd,-131073", "zstd levels are -131072 to 22"),
        ("gz,10", "gz levels are 0 to 9"),
    ] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"))
            .args(["ota", "generate", "--source", path_str(&d.join("old"))])
            .args(["--target", path_str(&d.join("new")), "-o", path_str(&pay)])
            .args(["--vabc-compression", param])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{param}: {err}");
        assert!(
            err.contains(range) && err.lines().count() == 1,
            "{param}: {err}"
        );
        assert!(!pay.exists(), "{param}");
    }
}
