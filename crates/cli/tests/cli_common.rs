//! Helpers shared by the `snapblk` command tests that check refusals (included with `#[path]`,
//! as serve_common.rs is): run the binary, require success, or require a one-line refusal.

#![allow(dead_code)]

use snapblk_testsupport::{TempDir, image_pair, path_str};
use std::path::{Path, PathBuf};
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

/// An image pair (`snapblk_testsupport::image_pair`) and the COW `cow create` made of it, with
/// its record, in a fresh directory.
pub struct Case {
    pub tmp: TempDir,
    pub old: PathBuf,
    pub new: PathBuf,
    pub cow: PathBuf,
}

impl Case {
    /// `new_blocks` 4 KiB blocks of new image; `extra` flags for `cow create`.
    pub fn new(tag: &str, new_blocks: usize, extra: &[&str]) -> Case {
        let tmp = TempDir::new(tag);
        let (old, new) = image_pair(tmp.path(), new_blocks);
        let cow = tmp.join("u.cow");
        let mut args = vec!["cow", "create", "--old", path_str(&old), "--new"];
        args.extend([path_str(&new), "-o", path_str(&cow)]);
        args.extend(extra);
        ok(&args);
        Case { tmp, old, new, cow }
    }
    /// A path in the case's directory.
    pub fn p(&self, name: &str) -> PathBuf {
        self.tmp.join(name)
    }
    /// The COW's record.
    pub fn record(&self) -> PathBuf {
        PathBuf::from(format!("{}.snapblk", self.cow.display()))
    }
    /// A copy of the COW and its record named `name`.
    pub fn cow_copy(&self, name: &str) -> PathBuf {
        let c = self.p(name);
        std::fs::copy(&self.cow, &c).unwrap();
        std::fs::copy(self.record(), format!("{}.snapblk", c.display())).unwrap();
        c
    }
    /// A copy of `src` named `name`.
    pub fn file_copy(&self, src: &Path, name: &str) -> PathBuf {
        let p = self.p(name);
        std::fs::copy(src, &p).unwrap();
        p
    }
}

/// Offset of the v3 op record of the first REPLACE op (from `inspect --ops --json`).
pub fn replace_op_offset(cow: &Path) -> (u64, u64) {
    let j: serde_json::Value =
        serde_json::from_str(&ok(&["cow", "inspect", "--json", "--ops", path_str(cow)])).unwrap();
    let op = j["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"]["type"] == "replace")
        .unwrap()
        .clone();
    (
        op["record_offset"].as_u64().unwrap(),
        op["kind"]["payload"]["offset"].as_u64().unwrap(),
    )
}

/// Change the byte at `off` of the file `p` to `f` of it.
pub fn patch(p: &Path, off: u64, f: impl Fn(u8) -> u8) {
    let mut d = read(p);
    d[off as usize] = f(d[off as usize]);
    std::fs::write(p, d).unwrap();
}
