//! `snapblk cow ...` through the real binary: the 16 golden cases (apply, inspect --json,
//! verify) and create → verify → apply round trips (raw and Android sparse inputs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_snapblk"))
}

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/aosp-cow")
}

fn cases() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    assert_eq!(v.len(), 16);
    v
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

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snapblk-cow-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Op counts from the README's "Resulting op stream" section.
fn readme_counts(readme: &str) -> [u64; 4] {
    let sec = readme
        .split("## Resulting op stream")
        .nth(1)
        .unwrap()
        .split("```")
        .nth(1)
        .unwrap();
    let c = |t: &str| {
        sec.lines()
            .filter(|l| l.starts_with(&format!("CowOperation({t}")))
            .count() as u64
    };
    [
        c("kCowCopyOp"),
        c("kCowReplaceOp"),
        c("kZeroOp"),
        c("kCowXorOp"),
    ]
}

#[test]
fn golden_apply_inspect_verify() {
    let tmp = tmpdir("golden");
    for case in cases() {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        let cow = case.join("snapshot.cow");
        let base = case.join("base.img");
        let target = case.join("target.img");
        // apply
        let out = tmp.join(format!("{name}.img"));
        ok(bin()
            .args(["cow", "apply"])
            .arg(&cow)
            .arg("--base")
            .arg(&base)
            .arg("-o")
            .arg(&out));
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(&target).unwrap(),
            "{name}: apply differs"
        );
        // inspect --json
        let j: serde_json::Value =
            serde_json::from_str(&ok(bin().args(["cow", "inspect", "--json"]).arg(&cow))).unwrap();
        let got = ["copy", "replace", "zero", "xor"].map(|t| j["op_counts"][t].as_u64().unwrap());
        let readme = std::fs::read_to_string(case.join("README.md")).unwrap();
        assert_eq!(got, readme_counts(&readme), "{name}: op counts");
        // verify
        let o = run(bin()
            .args(["cow", "verify"])
            .arg(&cow)
            .arg("--base")
            .arg(&base)
            .arg("--expect")
            .arg(&target));
        if name == "v3_invalid_order_no_sequence" {
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
    let case = data().join("v2_basic_none");
    let o = run(bin()
        .args(["cow", "verify"])
        .arg(case.join("snapshot.cow"))
        .arg("--base")
        .arg(case.join("base.img"))
        .arg("--expect")
        .arg(case.join("base.img")));
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("differs from the expected image"));
    // A corrupt COW is a one-line error, not a panic.
    let bad = tmp.join("bad.cow");
    std::fs::write(&bad, b"!!WOcwoC garbage").unwrap();
    let o = run(bin().args(["cow", "inspect"]).arg(&bad));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("snapblk: "));
    std::fs::remove_dir_all(&tmp).unwrap();
}

fn make_pair(dir: &Path) -> (PathBuf, PathBuf) {
    let bs = 4096;
    let n = 256;
    let mut old = vec![0u8; n * bs];
    for (i, b) in old.iter_mut().enumerate() {
        let blk = i / bs;
        *b = if blk % 5 == 4 {
            0
        } else {
            ((i * 7 + blk * 13) % 251) as u8 ^ (blk as u8)
        };
    }
    let mut new = old.clone();
    new.copy_within(10 * bs..60 * bs, 12 * bs); // shift up
    new.copy_within(100 * bs..120 * bs, 98 * bs); // shift down
    new[150 * bs + 3] ^= 0xff; // small edit -> XOR
    new[200 * bs..205 * bs].fill(0);
    for (i, b) in new[220 * bs..230 * bs].iter_mut().enumerate() {
        *b = (i as u64).wrapping_mul(0x9e37_79b9) as u8;
    }
    let (o, nw) = (dir.join("old.img"), dir.join("new.img"));
    std::fs::write(&o, &old).unwrap();
    std::fs::write(&nw, &new).unwrap();
    (o, nw)
}

#[test]
fn create_verify_apply_roundtrip() {
    let tmp = tmpdir("create");
    let (old, new) = make_pair(&tmp);
    let want = std::fs::read(&new).unwrap();
    for (fmt, comp, extra) in [
        ("v2", "lz4", None),
        ("v2", "gz", Some("--no-xor")),
        ("v3", "zstd", None),
        ("v3", "brotli", None),
        ("v3", "none", Some("--no-scratch")),
        ("v3", "lz4", Some("--unit=65536")),
    ] {
        let cow = tmp.join(format!("{fmt}-{comp}.cow"));
        let mut c = bin();
        c.args(["cow", "create", "--old"])
            .arg(&old)
            .arg("--new")
            .arg(&new)
            .arg("-o")
            .arg(&cow);
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
        ok(bin()
            .args(["cow", "verify"])
            .arg(&cow)
            .arg("--base")
            .arg(&old)
            .arg("--expect")
            .arg(&new));
        let out = tmp.join("out.img");
        ok(bin()
            .args(["cow", "apply"])
            .arg(&cow)
            .arg("--base")
            .arg(&old)
            .arg("-o")
            .arg(&out));
        assert!(std::fs::read(&out).unwrap() == want, "{fmt} {comp}");
        let j: serde_json::Value =
            serde_json::from_str(&ok(bin().args(["cow", "inspect", "--json"]).arg(&cow))).unwrap();
        assert_eq!(j["version"], if fmt == "v2" { "2.0" } else { "3.0" });
        assert!(j["merge"]["error"].is_null());
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn create_from_android_sparse_images() {
    let tmp = tmpdir("sparse");
    let (old, new) = make_pair(&tmp);
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
    ok(bin()
        .args(["cow", "create", "--old"])
        .arg(&old_s)
        .arg("--new")
        .arg(&new_s)
        .arg("-o")
        .arg(&cow));
    let out = tmp.join("out.img");
    ok(bin()
        .args(["cow", "apply"])
        .arg(&cow)
        .arg("--base")
        .arg(&old)
        .arg("-o")
        .arg(&out));
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&new).unwrap());
    std::fs::remove_dir_all(&tmp).unwrap();
}
