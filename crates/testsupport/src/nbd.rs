//! Real NBD clients against an export URI: libnbd's nbdinfo and nbdcopy, qemu-img and qemu-io
//! (all installed by scripts/install-deps.sh; a missing tool fails the test).

use crate::{assert_file_eq, path_str, tool, tool_ok};
use std::path::Path;
use std::process::Output;

/// `nbdinfo --json URI`, parsed.
pub fn info(uri: &str) -> serde_json::Value {
    let out = tool_ok("nbdinfo", &["--json", uri]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("nbdinfo --json {uri}: {e}: {out}"))
}

/// `nbdcopy SRC DST` (either may be a URI or a file), which must succeed.
pub fn copy(src: &str, dst: &str) {
    tool_ok("nbdcopy", &[src, dst]);
}

/// `qemu-img compare` of two raw images (files or URIs); the caller checks the status.
pub fn qemu_img_compare(a: &str, b: &str) -> Output {
    tool("qemu-img", &["compare", "-f", "raw", "-F", "raw", a, b])
}

/// `qemu-img compare` of two raw images that must be identical.
pub fn assert_qemu_img_same(a: &str, b: &str) {
    tool_ok("qemu-img", &["compare", "-f", "raw", "-F", "raw", a, b]);
}

/// `qemu-img convert` of a raw image (file or URI) to a raw file, which must succeed.
pub fn qemu_img_convert(src: &str, dst: &Path) {
    tool_ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", src, path_str(dst)],
    );
}

/// The arguments of `qemu-io -f raw -c CMD… URI`.
fn qemu_io_args<'a>(uri: &'a str, cmds: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["-f", "raw"];
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(uri);
    args
}

/// Run qemu-io commands against `uri`; the caller checks the outcome.
pub fn qemu_io(uri: &str, cmds: &[&str]) -> Output {
    tool("qemu-io", &qemu_io_args(uri, cmds))
}

/// Run qemu-io commands that must succeed, with no "verification failed" in the output (the
/// `read -P` pattern check); returns stdout.
pub fn qemu_io_ok(uri: &str, cmds: &[&str]) -> String {
    let out = tool_ok("qemu-io", &qemu_io_args(uri, cmds));
    assert!(
        !out.contains("verification failed"),
        "qemu-io {cmds:?}: {out}"
    );
    out
}

/// Read the whole export with nbdcopy and with qemu-img convert, and qemu-img compare it with
/// `reference` (a file holding `expect`); every way must give exactly `expect`. Copies go to
/// `scratch`.
pub fn assert_export_reads(uri: &str, reference: &Path, expect: &[u8], scratch: &Path, what: &str) {
    let copied = scratch.join("nbdcopy.img");
    copy(uri, path_str(&copied));
    assert_file_eq(&copied, expect, &format!("{what}: nbdcopy"));
    assert_qemu_img_same(path_str(reference), uri);
    let conv = scratch.join("convert.img");
    qemu_img_convert(uri, &conv);
    assert_file_eq(&conv, expect, &format!("{what}: qemu-img convert"));
}
