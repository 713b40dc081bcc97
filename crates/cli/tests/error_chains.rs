//! Each cause of an error is printed once, in one line (issue 19, U4, U12, item 11): library
//! errors carry their cause as `source` and leave it out of their own message, and keep the
//! structure of the errors they wrap across crates. Drives the real binary.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_snapblk");

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snapblk-chain-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs snapblk with `args`; asserts exit 1 and returns the single stderr line.
fn one_line_error(args: &[&str]) -> String {
    let o = Command::new(BIN).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    err.trim_end().to_owned()
}

fn p(d: &Path, name: &str) -> String {
    d.join(name).display().to_string()
}

#[test]
fn cow_io_errors_print_the_cause_once() {
    let d = scratch("cow");
    std::fs::write(d.join("new.img"), vec![1u8; 8192]).unwrap();
    assert_eq!(
        one_line_error(&[
            "cow",
            "create",
            "--old",
            "/nonexistent/old.img",
            "--new",
            &p(&d, "new.img"),
            "-o",
            &p(&d, "x.cow"),
        ]),
        "snapblk: --old /nonexistent/old.img: No such file or directory (os error 2)"
    );
    // A directory is named as one, not as an I/O error at offset 0.
    let dir = d.display().to_string();
    assert_eq!(
        one_line_error(&[
            "cow",
            "create",
            "--old",
            &p(&d, "new.img"),
            "--new",
            &dir,
            "-o",
            &p(&d, "x.cow"),
        ]),
        format!("snapblk: --new {dir} is a directory")
    );
    assert!(!d.join("x.cow").exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn snapshot_io_errors_print_the_cause_once() {
    let d = scratch("snap");
    let base = p(&d, "base.img");
    std::fs::write(&base, vec![0u8; 8192]).unwrap();
    let missing = p(&d, "missing.cow");
    assert_eq!(
        one_line_error(&["merge", &missing, "--base", &base]),
        format!(
            "snapblk: opening {missing} with base {base}: opening COW: {missing}: No such file \
             or directory (os error 2)"
        )
    );
    let empty = p(&d, "empty.cow");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(
        one_line_error(&["merge", &empty, "--base", &base]),
        format!(
            "snapblk: opening {empty} with base {base}: reading COW header: short read at \
             offset 0"
        )
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn swapped_cow_and_base_are_named_as_not_a_cow() {
    // `merge IMAGE --base COW`: the image is named as no COW (bad magic), not as a device
    // whose size is not a multiple of a block size of 0; nothing is written.
    let d = scratch("swap");
    let image = p(&d, "system.img");
    std::fs::write(&image, vec![0u8; 16384]).unwrap();
    let cow = p(&d, "update.cow");
    std::fs::write(&cow, vec![0x11u8; 5000]).unwrap();
    for args in [
        vec!["merge", &image, "--base", &cow],
        vec!["serve", "--cow", &image, "--base", &cow, "--nbd", "0"],
    ] {
        let e = one_line_error(&args);
        assert!(e.contains("bad magic"), "{args:?}: {e}");
        assert!(!e.contains("block size 0"), "{args:?}: {e}");
    }
    assert_eq!(std::fs::read(&image).unwrap(), vec![0u8; 16384]);
    assert_eq!(std::fs::read(&cow).unwrap(), vec![0x11u8; 5000]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_command_that_cannot_start_is_named() {
    let d = scratch("rec");
    assert_eq!(
        one_line_error(&[
            "readahead",
            "record",
            "-o",
            &p(&d, "x.list"),
            "--scope",
            &d.display().to_string(),
            "--",
            "/nonexistent/cmd",
        ]),
        "snapblk: cannot run the command \"/nonexistent/cmd\": No such file or directory (os \
         error 2)"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// A COW error crosses from snapblk-cow through the snapshot layer whole: the report keeps
/// what the COW reader knew (here the magic it found), once.
#[test]
fn a_cow_error_keeps_its_detail_through_the_snapshot_layer() {
    let d = scratch("badcow");
    let base = p(&d, "base.img");
    std::fs::write(&base, vec![0u8; 8192]).unwrap();
    let cow = p(&d, "garbage.cow");
    std::fs::write(&cow, [0x5au8; 8192]).unwrap();
    assert_eq!(
        one_line_error(&["merge", &cow, "--base", &base]),
        format!(
            "snapblk: opening {cow} with base {base}: invalid COW: bad magic 0x5a5a5a5a5a5a5a5a \
             at offset 0 (expected 0x436f77634f572121)"
        )
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn readahead_fuse_and_bench_errors_print_the_cause_once() {
    let d = scratch("exports");
    let enoent = "No such file or directory (os error 2)";
    let nosuch = p(&d, "nosuch");
    assert_eq!(
        one_line_error(&[
            "readahead",
            "record",
            "-o",
            &p(&d, "x.list"),
            "--scope",
            &nosuch,
            "--duration",
            "0",
        ]),
        format!("snapblk: scope {nosuch}: {enoent}")
    );
    // The mount point is checked before FUSE is needed.
    assert_eq!(
        one_line_error(&["serve", "--fuse", &nosuch, "null:size=1M"]),
        format!("snapblk: mount point {nosuch}: {enoent}")
    );
    assert_eq!(
        one_line_error(&[
            "bench",
            &format!("sync:path={nosuch}"),
            "--runtime",
            "0.1",
            "--size",
            "1M",
        ]),
        format!("snapblk: open sync:path={nosuch},read-only=true: {enoent}")
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// `cow inspect` reports a record it cannot read with the reason (the I/O error was left
/// out when only the record error's own message was printed).
#[test]
fn an_unreadable_record_is_reported_with_its_cause() {
    let d = scratch("rec-state");
    let old: Vec<u8> = (0..65536u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut new = old.clone();
    new[..3].copy_from_slice(b"abc");
    std::fs::write(d.join("old.img"), &old).unwrap();
    std::fs::write(d.join("new.img"), &new).unwrap();
    let cow = p(&d, "x.cow");
    let o = Command::new(BIN)
        .args(["cow", "create", "--old", &p(&d, "old.img"), "--new"])
        .args([&p(&d, "new.img"), "-o", &cow])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A directory where the record file should be: reading it fails with EISDIR.
    let rec = format!("{cow}.snapblk");
    let _ = std::fs::remove_file(&rec);
    std::fs::create_dir(&rec).unwrap();
    let o = Command::new(BIN)
        .args(["cow", "inspect", &cow, "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["record"]["state"],
        format!("reading {rec}: Is a directory (os error 21)")
    );
    std::fs::remove_dir_all(&d).unwrap();
}
