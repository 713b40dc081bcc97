//! Each cause of an error is printed once, in one line (issue 19, U4, U12, item 11): library
//! errors carry their cause as `source` and leave it out of their own message. Drives the
//! real binary.

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
        "snapblk: read /nonexistent/old.img: I/O error at offset 0: No such file or directory \
         (os error 2)"
    );
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
