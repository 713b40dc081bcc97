//! `--key` of `snapblk ota info | extract | apply`: payloads signed by independent makers —
//! the AOSP full sample signed by `tests/lib/ota-sign.py` (written from the format) with
//! openssl, and the crate's writer signed by openssl — are reported, verified with the right
//! key and refused with another key or after tampering, before anything is written; without
//! `--key` a signed payload is processed with one note on stderr, and the unsigned AOSP
//! samples are reported unsigned.

use std::path::{Path, PathBuf};

use snapblk_ota::testing::{DeltaOp, Encoding, PayloadBuilder};
use snapblk_testsupport::openssl::{self, Key};
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

#[path = "cli_common.rs"]
mod common;
use common::{ok, read, refused, snapblk};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The AOSP sample payloads unpacked into `d`.
fn samples(d: &TempDir) {
    let data = repo().join("tests/data/ota");
    for a in ["sample_payloads.tar.xz", "sample_images.tar.bz2"] {
        tool_ok(
            "tar",
            &["-xf", path_str(&data.join(a)), "-C", path_str(d.path())],
        );
    }
}

/// `payload` signed by `key` (its padded size `pad`) with tests/lib/ota-sign.py into `out`.
fn sign_py(payload: &Path, out: &Path, key: &Key, pad: usize) {
    let script = repo().join("tests/lib/ota-sign.py");
    tool_ok(
        "python3",
        &[
            path_str(&script),
            path_str(payload),
            path_str(out),
            path_str(&key.private),
            &pad.to_string(),
        ],
    );
}

fn stderr(args: &[&str]) -> (bool, String, String) {
    let o = snapblk(args);
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

const NOTE: &str = "its signatures were not checked (give --key CERT)";

#[test]
fn the_aosp_samples_are_unsigned() {
    let d = TempDir::new("ota-sig-cli");
    samples(&d);
    let full = d.join("full_payload.bin");
    let text = ok(&["ota", "info", path_str(&full)]);
    assert!(text.contains("Signatures: none (unsigned)"), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["ota", "info", path_str(&full), "--json"])).unwrap();
    assert_eq!(v["signatures"]["metadata"]["status"], "unsigned");
    assert_eq!(v["signatures"]["payload"]["status"], "unsigned");
    // No note for an unsigned payload; with --key it is refused (nothing to verify).
    let (okay, _, err) = stderr(&[
        "ota",
        "extract",
        path_str(&full),
        "-o",
        path_str(&d.join("o")),
    ]);
    assert!(okay && !err.contains(NOTE), "{err}");
    let k = openssl::key(d.path(), "rsa", "rsa:2048");
    let out = d.join("o2");
    refused(
        &[
            "ota",
            "extract",
            path_str(&full),
            "-o",
            path_str(&out),
            "--key",
            path_str(&k.cert_pem),
        ],
        "the payload signature does not verify: the payload has none",
    );
    assert!(!out.exists());
}

#[test]
fn the_signed_aosp_sample_is_verified_or_refused() {
    let d = TempDir::new("ota-sig-cli");
    samples(&d);
    let rsa = openssl::key(d.path(), "rsa", "rsa:2048");
    let ec = openssl::key(d.path(), "ec", "ec:P-256");
    let signed = d.join("signed.bin");
    sign_py(&d.join("full_payload.bin"), &signed, &rsa, 256);
    let s = path_str(&signed);

    // info: not checked, verified, mismatch.
    let text = ok(&["ota", "info", s]);
    assert!(
        text.contains("Payload signature (267 bytes at offset ")
            && text.contains("signed (1 signature), not checked (give --key)"),
        "{text}"
    );
    let text = ok(&["ota", "info", s, "--key", path_str(&rsa.cert_pem)]);
    let line = text
        .lines()
        .find(|l| l.starts_with("Payload signature"))
        .unwrap();
    assert!(
        line.contains(&format!(
            "verified with {} (RSA-2048",
            path_str(&rsa.cert_pem)
        )) && line.ends_with("signature 1 of 1"),
        "{text}"
    );
    assert!(text.contains("Metadata signature (267 bytes): verified with"));
    let (okay, text, err) = stderr(&["ota", "info", s, "--key", path_str(&ec.public_pem)]);
    assert!(!okay, "{err}");
    assert!(
        text.contains("Payload signature")
            && text.contains("MISMATCH: none of its 1 signature verifies with the 1 key given"),
        "{text}"
    );
    assert_eq!(
        err.trim(),
        "snapblk: the payload signature does not verify: none of its 1 signatures verifies with the keys given"
    );
    // A zip of certificates (as otacerts.zip): the second entry's key verifies.
    let zip = d.join("otacerts.zip");
    tool_ok(
        "zip",
        &[
            "-j",
            "-q",
            path_str(&zip),
            path_str(&ec.cert_pem),
            path_str(&rsa.cert_pem),
        ],
    );
    let text = ok(&["ota", "info", s, "--key", path_str(&zip)]);
    assert!(
        text.contains(&format!("verified with {} (RSA-2048", path_str(&zip))),
        "{text}"
    );
    // --json: the statuses and the keys their indexes name; a mismatch is ok: false.
    let o = snapblk(&[
        "ota",
        "info",
        s,
        "--json",
        "--key",
        path_str(&ec.cert_der),
        "--key",
        path_str(&rsa.public_der),
    ]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sig = &v["signatures"];
    assert_eq!(sig["payload"]["status"], "verified");
    assert_eq!(sig["payload"]["key"], 1);
    assert_eq!(sig["metadata"]["signature"], 0);
    assert_eq!(sig["keys"][0]["algorithm"]["kind"], "ecdsa_p256");
    assert_eq!(sig["keys"][1]["algorithm"]["bits"], 2048);
    assert_eq!(sig["keys"][1]["file"], path_str(&rsa.public_der));
    let o = snapblk(&["ota", "info", s, "--json", "--key", path_str(&ec.cert_pem)]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["signatures"]["payload"]["status"], "mismatch");
    assert!(v["error"].as_str().unwrap().contains("does not verify"));

    // extract: without --key, one note; with the key, the same images; with another key or
    // after tampering, refused before the output directory exists.
    let (okay, _, err) = stderr(&["ota", "extract", s, "-o", path_str(&d.join("a"))]);
    assert!(okay, "{err}");
    assert_eq!(err.matches(NOTE).count(), 1, "{err}");
    let (okay, text, err) = stderr(&[
        "ota",
        "extract",
        s,
        "-o",
        path_str(&d.join("b")),
        "--key",
        path_str(&rsa.cert_der),
    ]);
    assert!(okay && !err.contains(NOTE), "{err}");
    assert!(text.contains("2 partitions written"), "{text}");
    assert!(read(&d.join("b/kernel.img")) == read(&d.join("disk_ext2_4k.img")));
    let c = d.join("c");
    refused(
        &[
            "ota",
            "extract",
            s,
            "-o",
            path_str(&c),
            "--key",
            path_str(&ec.cert_pem),
        ],
        "the payload signature does not verify",
    );
    assert!(!c.exists());
    // One byte of a data blob changed (the blob's own hash in the manifest would catch it
    // later; the signature check refuses it first).
    let mut bytes = read(&signed);
    let n = bytes.len();
    bytes[n - 300] ^= 0x04;
    let bad = d.join("bad.bin");
    std::fs::write(&bad, &bytes).unwrap();
    refused(
        &[
            "ota",
            "extract",
            path_str(&bad),
            "-o",
            path_str(&c),
            "--key",
            path_str(&rsa.cert_pem),
        ],
        "the payload signature does not verify: none of its 1 signatures verifies",
    );
    assert!(!c.exists());
    // A key file that is not a usable key: the error names the file.
    refused(
        &[
            "ota",
            "extract",
            s,
            "-o",
            path_str(&c),
            "--key",
            path_str(&ec.private),
        ],
        &format!(
            "--key {}: PEM block 1 is a private key (PRIVATE KEY)",
            path_str(&ec.private)
        ),
    );
    let ed = openssl::key(d.path(), "ed", "ed25519");
    refused(
        &["ota", "info", s, "--key", path_str(&ed.cert_pem)],
        "Ed25519 (1.3.101.112) key: only RSA (PKCS#1 v1.5 signatures) and ECDSA P-256 keys are supported",
    );
}

#[test]
fn apply_checks_signatures_before_reading_the_old_images() {
    let d = TempDir::new("ota-sig-cli");
    let ec = openssl::key(d.path(), "ec", "ec:P-256");
    let other = openssl::key(d.path(), "other", "ec:P-256");
    let old = pattern(8 * 4096, 3);
    let mut new = old.clone();
    new[5 * 4096..6 * 4096].copy_from_slice(&pattern(4096, 11));
    let ops = [
        DeltaOp::Copy {
            src: vec![(0, 5)],
            dst: vec![(0, 5)],
        },
        DeltaOp::Replace {
            dst: vec![(5, 1)],
            encoding: Encoding::Xz,
        },
        DeltaOp::Copy {
            src: vec![(6, 2)],
            dst: vec![(6, 2)],
        },
    ];
    let no_differ = |_: &[u8], _: &[u8]| -> Vec<u8> { unreachable!() };
    let u = PayloadBuilder::new()
        .delta("system", &old, &new, &ops, &no_differ)
        .build()
        .unsigned(&[72], true);
    let tmp = d.join("sig");
    std::fs::create_dir_all(&tmp).unwrap();
    let bytes = u.sign(&|_, m| openssl::sign(&tmp, &ec.private, m));
    let ota = d.join("delta.bin");
    std::fs::write(&ota, &bytes).unwrap();
    std::fs::create_dir_all(d.join("old")).unwrap();
    std::fs::write(d.join("old/system.img"), &old).unwrap();
    let args = |out: &Path, key: Option<&Path>| {
        let mut v: Vec<String> = ["ota", "apply", path_str(&ota), "--source"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend([
            path_str(&d.join("old")).into(),
            "-o".into(),
            path_str(out).into(),
        ]);
        if let Some(k) = key {
            v.extend(["--key".into(), path_str(k).into()]);
        }
        v
    };
    let run = |a: &[String]| stderr(&a.iter().map(String::as_str).collect::<Vec<_>>());
    // Without a key: applied, one note.
    let (okay, _, err) = run(&args(&d.join("a"), None));
    assert!(okay, "{err}");
    assert_eq!(err.matches(NOTE).count(), 1, "{err}");
    assert!(read(&d.join("a/system.img")) == new);
    // With the key (--json: the report names it), then with another.
    let mut a = args(&d.join("b"), Some(&ec.cert_pem));
    a.push("--json".into());
    let (okay, text, err) = run(&a);
    assert!(okay && !err.contains(NOTE), "{err}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["signatures"]["payload"]["status"], "verified");
    assert_eq!(v["signatures"]["metadata"]["status"], "verified");
    assert!(read(&d.join("b/system.img")) == new);
    let c = d.join("c");
    let a = args(&c, Some(&other.public_pem));
    refused(
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        "the payload signature does not verify",
    );
    assert!(!c.exists());
    // The old image is not even needed to refuse a payload whose signature does not verify.
    std::fs::remove_file(d.join("old/system.img")).unwrap();
    refused(
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        "the payload signature does not verify",
    );
}

/// A `--key` file is an input like the OTA: an output image that is the same file (here the
/// certificate stored as `DIR/kernel.img`, by name and through a link) is refused before
/// anything is written, and the certificate is left as it was.
#[test]
fn no_output_replaces_a_key_file() {
    let d = TempDir::new("ota-sig-key-alias");
    samples(&d);
    let rsa = openssl::key(d.path(), "rsa", "rsa:2048");
    let signed = d.join("signed.bin");
    sign_py(&d.join("full_payload.bin"), &signed, &rsa, 256);
    let out = d.join("out");
    std::fs::create_dir(&out).unwrap();
    let cert = out.join("kernel.img");
    std::fs::copy(&rsa.cert_pem, &cert).unwrap();
    let before = read(&cert);
    let link = d.join("cert-link.pem");
    std::os::unix::fs::symlink(&cert, &link).unwrap();
    for key in [&cert, &link] {
        let args = ["ota", "extract", path_str(&signed), "-o", path_str(&out)];
        let mut args = args.to_vec();
        args.extend(["--key", path_str(key)]);
        refused(&args, "is the same file as --key");
        assert!(read(&cert) == before, "{}", key.display());
    }
}
