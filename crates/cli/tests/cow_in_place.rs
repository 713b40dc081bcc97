//! `snapblk cow apply --in-place` writes outputs that a new file cannot replace (a block
//! device, a regular file kept where it is, a FIFO, `/dev/stdout`), and only after a pass that
//! proves the whole result. Without the flag such outputs are refused, and a loop device over
//! an input counts as that input.

use snapblk_testsupport::path_str;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

#[path = "cli_common.rs"]
mod common;
use common::{Case, ok, patch, read, refused, replace_op_offset, snapblk};

/// A loop device over `file`, detached on drop (the tests run as root).
struct Loop(String);

impl Loop {
    fn over(file: &Path) -> Loop {
        let o = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .expect("losetup (util-linux) must be installed");
        assert!(
            o.status.success(),
            "losetup failed (root needed): {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Loop(String::from_utf8(o.stdout).unwrap().trim().to_owned())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

fn apply_args<'a>(c: &'a Case, out: &'a str) -> Vec<&'a str> {
    vec![
        "cow",
        "apply",
        path_str(&c.cow),
        "--base",
        path_str(&c.old),
        "-o",
        out,
    ]
}

#[test]
fn devices_and_streams_are_refused_without_in_place() {
    let c = Case::new("inplace-refused", 256, &[]);
    let fifo = c.p("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let dev_file = c.file_copy(&c.old, "dev.img");
    let dev = Loop::over(&dev_file);
    for (out, kind) in [
        (path_str(&fifo), "a FIFO"),
        (dev.0.as_str(), "a block device"),
        ("/dev/null", "a character device"),
    ] {
        refused(
            &apply_args(&c, out),
            &format!("is {kind}; outputs are replaced atomically, give --in-place"),
        );
    }
    assert_eq!(read(&dev_file), read(&c.old), "the device was written");
    // An output that does not exist is created by the normal path, not in place.
    let none = c.p("none.img");
    let mut a = apply_args(&c, path_str(&none));
    a.push("--in-place");
    refused(&a, "--in-place writes an existing file or device");
}

#[test]
fn in_place_writes_a_block_device_that_is_large_enough_and_free() {
    let c = Case::new("inplace-block", 256, &[]);
    let new = read(&c.new);
    let len = new.len();
    // A device 64 KiB larger than the image: the tail stays as it was.
    let dev_file = c.p("dev.img");
    std::fs::write(&dev_file, vec![0x5a; len + (64 << 10)]).unwrap();
    let dev = Loop::over(&dev_file);
    let mut a = apply_args(&c, &dev.0);
    a.push("--in-place");
    ok(&a);
    let got = read(&dev_file);
    assert!(
        got[..len] == new[..],
        "the device does not hold the new image"
    );
    assert!(got[len..].iter().all(|&b| b == 0x5a), "past the image");

    // Too small: refused with both sizes, nothing written.
    let small_file = c.p("small.img");
    std::fs::write(&small_file, vec![0x5a; len - 4096]).unwrap();
    let small = Loop::over(&small_file);
    let mut a = apply_args(&c, &small.0);
    a.push("--in-place");
    refused(
        &a,
        &format!(
            "holds {} bytes, too small for the new image of {len} bytes",
            len - 4096
        ),
    );
    assert!(read(&small_file).iter().all(|&b| b == 0x5a));

    // In use (held open exclusively, as a mount holds it): refused, nothing written.
    std::fs::write(&dev_file, vec![0x5a; len + (64 << 10)]).unwrap();
    let held = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&dev.0)
        .unwrap();
    let mut a = apply_args(&c, &dev.0);
    a.push("--in-place");
    refused(&a, "is in use (mounted or held open exclusively)");
    drop(held);
    assert!(read(&dev_file).iter().all(|&b| b == 0x5a));

    // A loop device over the base is the base; so is a second loop device over it, and a loop
    // device over that one.
    let base_dev = Loop::over(&c.old);
    let before = read(&c.old);
    let mut a = apply_args(&c, &base_dev.0);
    a.push("--in-place");
    refused(&a, "are the same storage");
    let twin = Loop::over(&c.old);
    let stacked = Loop::over(Path::new(&twin.0));
    for out in [&twin.0, &stacked.0] {
        let mut a = apply_args(&c, out);
        a[4] = &base_dev.0;
        a.push("--in-place");
        refused(&a, "are the same storage");
        let mut a = apply_args(&c, out);
        a.push("--in-place");
        refused(&a, "are the same storage");
    }
    assert_eq!(read(&c.old), before);
    // And the base given as its loop device cannot be the output's backing file either.
    let out = c.file_copy(&c.old, "out.img");
    let out_dev = Loop::over(&out);
    let mut a = apply_args(&c, path_str(&out));
    a[4] = &out_dev.0;
    a.push("--no-record");
    refused(&a, "are the same storage");
}

#[test]
fn in_place_writes_a_regular_file_where_it_is_and_streams() {
    let c = Case::new("inplace-file", 256, &[]);
    let new = read(&c.new);
    // A larger regular file: written in place (same inode) and cut to the image's size.
    let out = c.p("out.img");
    std::fs::write(&out, vec![0xa5; new.len() * 2]).unwrap();
    let ino = std::fs::metadata(&out).unwrap().ino();
    let mut a = apply_args(&c, path_str(&out));
    a.push("--in-place");
    ok(&a);
    assert!(read(&out) == new, "the file does not hold the new image");
    assert_eq!(std::fs::metadata(&out).unwrap().ino(), ino, "not in place");

    // /dev/stdout.
    let mut a = apply_args(&c, "/dev/stdout");
    a.push("--in-place");
    let o = snapblk(&a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout == new, "stdout does not carry the new image");

    // /dev/stdout redirected to a file (`>> log`): refused, the file kept as it was.
    let log = c.p("log.txt");
    std::fs::write(&log, b"earlier lines\n").unwrap();
    let mut a = apply_args(&c, "/dev/stdout");
    a.push("--in-place");
    let o = Command::new(env!("CARGO_BIN_EXE_snapblk"))
        .args(&a)
        .stdin(Stdio::null())
        .stdout(std::fs::OpenOptions::new().append(true).open(&log).unwrap())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("reached through a file descriptor"), "{err}");
    assert_eq!(read(&log), b"earlier lines\n");

    // A FIFO with a reader.
    let fifo = c.p("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let f2 = fifo.clone();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::fs::File::open(&f2)
            .unwrap()
            .read_to_end(&mut v)
            .unwrap();
        v
    });
    let mut a = apply_args(&c, path_str(&fifo));
    a.push("--in-place");
    ok(&a);
    assert!(reader.join().unwrap() == new, "the FIFO did not carry it");
}

#[test]
fn in_place_refuses_a_result_it_cannot_prove_before_the_first_byte() {
    let c = Case::new("inplace-corrupt", 256, &["--compression", "none"]);
    let (_, payload) = replace_op_offset(&c.cow);
    patch(&c.cow, payload + 100, |b| b ^ 0x01);
    let out = c.p("out.img");
    std::fs::write(&out, vec![0xa5; 1 << 20]).unwrap();
    let mut a = apply_args(&c, path_str(&out));
    a.push("--in-place");
    refused(&a, "the COW is corrupt");
    assert!(
        read(&out).iter().all(|&b| b == 0xa5),
        "written before the check"
    );

    // Without the record, a wrong expected digest is caught the same way; on a stream no byte
    // is sent.
    let mut a = apply_args(&c, "/dev/stdout");
    a.extend(["--in-place", "--no-record", "--expect-sha256"]);
    let zero = "0".repeat(64);
    a.push(&zero);
    let o = Command::new(env!("CARGO_BIN_EXE_snapblk"))
        .args(&a)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty(), "bytes sent before the check");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not the expected"), "{err}");
}

/// The SHA-256 of `p` by sha256sum (an independent digest).
fn sha256sum(p: &Path) -> String {
    let o = Command::new("sha256sum").arg(p).output().unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap()[..64].to_owned()
}

#[test]
fn apply_summarises_where_the_image_does_not_go() {
    let c = Case::new("apply-summary", 256, &[]);
    let new = read(&c.new);
    let (sha, len) = (sha256sum(&c.new), new.len());
    // Into a file: one human line on stdout, with the digest sha256sum computes.
    let out = c.p("out.img");
    let text = ok(&apply_args(&c, path_str(&out)));
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with(&format!("{}: 1.00 MiB ({len} bytes) in ", out.display()))
            && text.contains(&format!("SHA-256 {sha}, checked against the record ")),
        "{text}"
    );
    assert_eq!(sha256sum(&out), sha);
    // Into stdout: the image alone on stdout, the summary on stderr.
    let mut a = apply_args(&c, "/dev/stdout");
    a.push("--in-place");
    let o = snapblk(&a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout == new, "stdout does not carry the new image alone");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("written in place in ") && err.contains(&sha),
        "{err}"
    );
    // --json: exact numbers; refused when stdout is the output (nothing written there).
    let j = ok(&[&apply_args(&c, path_str(&c.p("j.img")))[..], &["--json"]].concat());
    let j: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(j["sha256"], sha.as_str());
    assert_eq!(j["size"], len as u64);
    assert_eq!(j["in_place"], false);
    a.push("--json");
    let o = snapblk(&a);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty(), "something was written to stdout");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--json: the output /dev/stdout is stdout"),
        "{err}"
    );
}

#[test]
fn in_place_on_a_full_file_system_fails_before_the_first_byte() {
    // The space is reserved before writing: the file used to be half overwritten with the
    // new image, then the apply failed with ENOSPC.
    let c = Case::new("inplace-full", 256, &[]);
    let mnt = c.p("tiny");
    std::fs::create_dir(&mnt).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "tiny", path_str(&mnt)])
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs (the tests run as root)");
    let out = mnt.join("out.img");
    std::fs::write(&out, b"previous contents").unwrap();
    let mut a = apply_args(&c, path_str(&out));
    a.push("--in-place");
    let o = snapblk(&a);
    let after = read(&out);
    Command::new("umount").arg(&mnt).status().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("No space left on device") && err.contains("nothing was written"),
        "{err}"
    );
    assert_eq!(after, b"previous contents");
}
