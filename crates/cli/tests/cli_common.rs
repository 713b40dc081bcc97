//! Helpers shared by the `snapblk` command tests that check refusals (included with `#[path]`,
//! as serve_common.rs is): run the binary, require success, or require a one-line refusal.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Run `snapblk ARGS` with no standard input.
pub fn snapblk(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_snapblk"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run snapblk")
}

/// Run a command that must succeed; returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let o = snapblk(args);
    assert!(
        o.status.success(),
        "snapblk {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Run a command that must fail (exit 1, no panic) with a last `snapblk:` line containing
/// `want`; returns stderr.
pub fn refused(args: &[&str], want: &str) -> String {
    let o = snapblk(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "snapblk {args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("snapblk: ") && last.contains(want),
        "{args:?}: {err}"
    );
    err
}

/// The bytes of a file.
pub fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}
