//! The `snapblk-conformance` binary: exit status, summary lines, and no writes unless
//! `--allow-destructive`.

use std::process::Command;

fn conformance(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_snapblk-conformance"))
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

struct Img(std::path::PathBuf);
impl Drop for Img {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn img(tag: &str) -> (Img, Vec<u8>) {
    let p = std::path::Path::new("/dev/shm")
        .join(format!("snapblk-conf-{tag}-{}.img", std::process::id()));
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&p, &data).unwrap();
    (Img(p), data)
}

#[test]
fn without_allow_destructive_the_target_is_only_read() {
    let (f, data) = img("ro");
    let spec = format!("io_uring:path={},direct=true", f.0.display());
    let (rc, out) = conformance(&[&spec]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("read-only run"), "{out}");
    assert!(out.contains("PASS write-refusal"), "{out}");
    assert!(out.contains("0 failed"), "{out}");
    assert!(std::fs::read(&f.0).unwrap() == data, "the target changed");
    // Asking for a writable instance without the flag is refused before anything is opened.
    let (rc, out) = conformance(&[&format!("{spec},read-only=false")]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("--allow-destructive"), "{out}");
    assert!(std::fs::read(&f.0).unwrap() == data, "the target changed");
}

#[test]
fn destructive_runs_pass_on_files_and_null() {
    let (f, data) = img("rw");
    for spec in [
        format!("io_uring:path={},direct=true", f.0.display()),
        format!("sync:path={},num-queues=2", f.0.display()),
        "null:size=64M".to_owned(),
    ] {
        let (rc, out) = conformance(&[&spec, "--allow-destructive"]);
        assert_eq!(rc, 0, "{spec}: {out}");
        assert!(out.contains("PASS read-write/mapped"), "{spec}: {out}");
        assert!(out.lines().last().unwrap().ends_with(" skipped"), "{out}");
    }
    assert!(
        std::fs::read(&f.0).unwrap() != data,
        "the destructive run wrote nothing"
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(conformance(&[]).0, 2);
    assert_eq!(conformance(&["null:", "--bogus"]).0, 2);
    let (rc, out) = conformance(&["nosuch:x=1", "--allow-destructive"]);
    assert_eq!(rc, 2);
    assert!(out.contains("unknown driver 'nosuch'"), "{out}");
}
