//! `snapblk cow ...` through the real binary: the 16 golden cases (apply, inspect --json,
//! verify) and create → verify → apply round trips (raw and Android sparse inputs).

use snapblk_testsupport::{TempDir, assert_file_eq, golden, image_pair, path_str};
use std::path::Path;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_snapblk"))
}

fn run(c: &mut Command) -> Output {
    c.output().expect("run snapblk")
}

fn ok(c: &mut Command) -> String {
    let o = run(c);
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `snapblk cow ARGS…`.
fn cow_cmd(args: &[&str]) -> Command {
    let mut c = bin();
    c.arg("cow").args(args);
    c
}

fn cow_create(old: &Path, new: &Path, cow: &Path) -> Command {
    let [old, new, cow] = [old, new, cow].map(path_str);
    cow_cmd(&["create", "--old", old, "--new", new, "-o", cow])
}

fn cow_apply(cow: &Path, base: &Path, out: &Path) -> Command {
    let [cow, base, out] = [cow, base, out].map(path_str);
    cow_cmd(&["apply", cow, "--base", base, "-o", out])
}

fn cow_verify(cow: &Path, base: &Path, expect: &Path) -> Command {
    let [cow, base, expect] = [cow, base, expect].map(path_str);
    cow_cmd(&["verify", cow, "--base", base, "--expect", expect])
}

/// `snapblk cow inspect --json COW`, parsed.
fn cow_inspect(cow: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(&mut cow_cmd(&["inspect", "--json", path_str(cow)]))).unwrap()
}

#[test]
fn golden_apply_inspect_verify() {
    let tmp = TempDir::new("cow-cli-golden");
    for case in golden::cases() {
        let name = &case.name;
        let cow = case.cow();
        // apply
        let out = tmp.join(&format!("{name}.img"));
        ok(&mut cow_apply(&cow, &case.base(), &out));
        assert_file_eq(&out, &case.read("target.img"), &format!("{name}: apply"));
        // inspect --json
        let j = cow_inspect(&cow);
        let got = ["copy", "replace", "zero", "xor"].map(|t| j["op_counts"][t].as_u64().unwrap());
        assert_eq!(
            got,
            golden::readme_op_counts(&case.readme()),
            "{name}: op counts"
        );
        // verify
        let o = run(&mut cow_verify(&cow, &case.base(), &case.target()));
        if case.invalid_merge_order() {
            assert!(!o.status.success(), "{name}: verify must fail");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains("merge order") && err.contains("COPY op follows a non-ordered op"),
                "{err}"
            );
            assert!(j["merge"]["error"].is_string());
        } else {
            assert!(
                o.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(j["merge"]["error"].is_null());
        }
    }
    // A wrong expected image is reported.
    let case = golden::case("v2_basic_none");
    let o = run(&mut cow_verify(&case.cow(), &case.base(), &case.base()));
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("differs from the expected image"));
    // A corrupt COW is a one-line error, not a panic.
    let bad = tmp.join("bad.cow");
    std::fs::write(&bad, b"!!WOcwoC garbage").unwrap();
    let o = run(&mut cow_cmd(&["inspect", path_str(&bad)]));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("snapblk: "));
}

#[test]
fn create_verify_apply_roundtrip() {
    let tmp = TempDir::new("cow-cli-create");
    let (old, new) = image_pair(tmp.path(), 256);
    let want = std::fs::read(&new).unwrap();
    for (fmt, comp, extra) in [
        ("v2", "lz4", None),
        ("v2", "gz", Some("--no-xor")),
        ("v3", "zstd", None),
        ("v3", "brotli", None),
        ("v3", "none", Some("--no-scratch")),
        ("v3", "lz4", Some("--unit=65536")),
    ] {
        let cow = tmp.join(&format!("{fmt}-{comp}.cow"));
        let mut c = cow_create(&old, &new, &cow);
        c.args(["--format", fmt, "--compression", comp, "--json"]);
        if let Some(e) = extra {
            c.arg(e);
        }
        let stats: serde_json::Value = serde_json::from_str(&ok(&mut c)).unwrap();
        assert!(stats["copy"].as_u64().unwrap() >= 50, "{stats}");
        if extra == Some("--no-xor") || comp == "none" {
            assert_eq!(stats["xor"], 0);
        } else {
            assert!(stats["xor"].as_u64().unwrap() >= 1, "{fmt} {comp}: {stats}");
        }
        ok(&mut cow_verify(&cow, &old, &new));
        let out = tmp.join("out.img");
        ok(&mut cow_apply(&cow, &old, &out));
        assert_file_eq(&out, &want, &format!("{fmt} {comp}"));
        let j = cow_inspect(&cow);
        assert_eq!(j["version"], if fmt == "v2" { "2.0" } else { "3.0" });
        assert!(j["merge"]["error"].is_null());
    }
}

#[test]
fn create_from_android_sparse_images() {
    let tmp = TempDir::new("cow-cli-sparse");
    let (old, new) = image_pair(tmp.path(), 256);
    let (old_s, new_s) = (tmp.join("old.simg"), tmp.join("new.simg"));
    for (a, b) in [(&old, &old_s), (&new, &new_s)] {
        // img2simg comes from android-sdk-libsparse-utils (scripts/install-deps.sh).
        let st = Command::new("img2simg")
            .arg(a)
            .arg(b)
            .status()
            .expect("img2simg must be installed");
        assert!(st.success());
    }
    let cow = tmp.join("s.cow");
    ok(&mut cow_create(&old_s, &new_s, &cow));
    let out = tmp.join("out.img");
    ok(&mut cow_apply(&cow, &old, &out));
    assert_file_eq(
        &out,
        &std::fs::read(&new).unwrap(),
        "apply of a sparse-made COW",
    );
}
