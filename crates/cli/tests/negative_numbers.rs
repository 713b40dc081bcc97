//! Negative numbers on the command line (issue 19, U8, item 11): accepted where the help says
//! they are valid (`--level -1`, `--nice -5`), and a range error rather than clap's
//! "unexpected argument '-1'" for options that cannot be negative. Drives the real binary.

use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_snapblk");

fn snapblk(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snapblk-neg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn negative_bench_values_are_range_errors() {
    for (opt, line) in [
        (
            "--iodepth",
            "snapblk: invalid job: iodepth -1 is out of range: it cannot be negative",
        ),
        (
            "--numjobs",
            "snapblk: invalid job: numjobs -1 is out of range: it cannot be negative",
        ),
        (
            "--size",
            "snapblk: invalid job: size -1 is out of range: it cannot be negative",
        ),
        (
            "--runtime",
            "snapblk: invalid job: duration -1 is out of range: it cannot be negative",
        ),
    ] {
        let mut args = vec!["bench", "null:size=1M", opt, "-1"];
        if opt != "--runtime" {
            args.extend(["--runtime", "0.05"]);
        }
        let o = snapblk(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{opt}: {err}");
        assert_eq!(err, format!("{line}\n"), "{opt}");
    }
    // A plain unsigned option: clap's own range message, not "unexpected argument".
    let o = snapblk(&[
        "bench",
        "null:size=1M",
        "--rw",
        "randrw",
        "--rwmixread",
        "-5",
        "--runtime",
        "0.05",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: invalid value '-5' for '--rwmixread <RWMIXREAD>': -5 is not in"),
        "{err}"
    );
}

#[test]
fn documented_negative_values_are_accepted() {
    let d = scratch("level");
    let (old, new, cow) = (d.join("old.img"), d.join("new.img"), d.join("c.cow"));
    std::fs::write(&old, vec![1u8; 64 << 10]).unwrap();
    std::fs::write(&new, vec![2u8; 64 << 10]).unwrap();
    // zstd level -1 (the help's own example), with a space like every other option.
    let o = Command::new(BIN)
        .args(["cow", "create", "--compression", "zstd", "--level", "-1"])
        .arg("--old")
        .arg(&old)
        .arg("--new")
        .arg(&new)
        .arg("-o")
        .arg(&cow)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(cow.exists());
    // readahead's --nice takes -20..19.
    let list = d.join("empty.list");
    std::fs::write(&list, b"").unwrap();
    let o = Command::new(BIN)
        .args(["readahead", "replay", "--nice", "-5"])
        .arg(&list)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("unexpected argument"), "{err}");
    assert!(o.status.success(), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}
