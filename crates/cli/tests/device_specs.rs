//! Device specs are checked where they are parsed, with one-line messages (issue 19, U1, W4,
//! item 11), and `snapblk info` opens read-only (U9). Drives the real binary.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_snapblk");

fn snapblk(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// Exit status 1 and exactly this one line on stderr, nothing on stdout.
fn assert_fails_with(args: &[&str], line: &str) {
    let o = snapblk(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert_eq!(err, format!("{line}\n"), "{args:?}");
    assert!(o.stdout.is_empty(), "{args:?}");
}

/// A scratch directory anyone can enter (for the unprivileged run).
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snapblk-specs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[test]
fn unknown_driver_is_named_with_the_known_ones() {
    for drv in ["nosuch", "NULL"] {
        let spec = format!("{drv}:size=1G");
        assert_fails_with(
            &["info", &spec],
            &format!(
                "snapblk: {spec}: unknown driver '{drv}' (known: http, io_uring, null, nvme-io_uring, rbd, s3, snapshot, sync, virtio-blk-vfio-pci, virtio-blk-vhost-user, virtio-blk-vhost-vdpa)"
            ),
        );
    }
    // bench names it too (its own wording, checked before the spec parser).
    let o = snapblk(&["bench", "nosuch:size=1G", "--runtime", "0.05"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown driver"));
}

#[test]
fn a_file_named_like_a_spec_is_still_a_path() {
    let d = scratch("colon");
    let f = d.join("nosuch:size=1G");
    std::fs::write(&f, vec![0u8; 8192]).unwrap();
    let o = Command::new(BIN)
        .args(["info", "nosuch:size=1G"])
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.lines().any(|l| {
        l.split_whitespace()
            .eq(["capacity", "8.00", "KiB", "(8192", "bytes)"])
    }));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn capacities_are_checked_in_the_spec() {
    assert_fails_with(
        &["info", "null:size=513"],
        "snapblk: null:size=513: size: 513 is not a multiple of 512 bytes",
    );
    assert_fails_with(
        &["info", "null:size=18446744073709551615"],
        "snapblk: null:size=18446744073709551615: size: 18446744073709551615 is more than the \
         largest capacity, 2^63-1 bytes",
    );
    // bench used to fail only at the first I/O ("offset must fit in a signed 64-bit integer").
    let o = snapblk(&[
        "bench",
        "null:size=18446744073709551615",
        "--runtime",
        "0.05",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("size: 18446744073709551615 is more than the largest capacity"),
        "{err}"
    );
    assert!(snapblk(&["info", "null:size=1G"]).status.success());
}

#[test]
fn duplicate_keys_are_refused() {
    assert_fails_with(
        &["info", "null:size=1G,size=2G"],
        "snapblk: null:size=1G,size=2G: duplicate key 'size' in device spec",
    );
}

/// `info` only reads: a 0444 file works for a user who may not write it.
#[test]
fn info_opens_read_only_for_an_unprivileged_user() {
    let d = scratch("ro");
    let f = d.join("ro444.img");
    std::fs::write(&f, vec![0u8; 65536]).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o444)).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let o = cmd_for(root).arg("info").arg(&f).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "info on a 0444 file: {err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().eq(["read-only", "true"]))
    );
    assert!(out.lines().any(|l| {
        l.split_whitespace()
            .eq(["capacity", "64.00", "KiB", "(65536", "bytes)"])
    }));
    // The user's own choice still wins (and then needs write permission).
    let spec = format!("io_uring:path={},read-only=false", f.display());
    let o = cmd_for(root).args(["info", &spec]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Permission denied"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// The binary, run as nobody when the test runs as root (root may write any file).
fn cmd_for(root: bool) -> Command {
    if root {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            BIN,
        ]);
        c
    } else {
        Command::new(BIN)
    }
}

/// `info` on a read-only mount (root only: a read-only bind mount in a private mount
/// namespace, so nothing outside the test sees it).
#[test]
fn info_works_on_a_read_only_mount() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root for a read-only mount");
        return;
    }
    let d = scratch("romnt");
    let f = d.join("ro.img");
    std::fs::write(&f, vec![0u8; 4096]).unwrap();
    let script = format!(
        "mount --bind {d} {d} && mount -o remount,ro,bind {d} && exec {BIN} info {f}",
        d = d.display(),
        f = f.display()
    );
    let o = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    if err.contains("mount:") || err.contains("unshare:") {
        eprintln!("skipped: cannot make a read-only mount here: {err}");
        return;
    }
    assert!(o.status.success(), "info on a read-only mount: {err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn one_size_grammar_for_specs_bench_and_readahead() {
    // `4KiB` (fio's spelling) means 4096 wherever a size is typed.
    let info = snapblk(&["info", "null:size=4KiB", "--json"]);
    assert!(info.status.success(), "{info:?}");
    let v: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(v["capacity"], 4096, "{v}");
    let bench = snapblk(&[
        "bench",
        "null:size=1MiB",
        "--bs",
        "4KiB",
        "--size",
        "64KiB",
        "--runtime",
        "1",
        "--json",
    ]);
    assert!(bench.status.success(), "{bench:?}");
    let dir = scratch("size-grammar");
    let list = dir.join("empty.list");
    std::fs::write(&list, "").unwrap();
    let ra = snapblk(&[
        "readahead",
        "replay",
        list.to_str().unwrap(),
        "--chunk",
        "4KiB",
    ]);
    assert!(ra.status.success(), "{ra:?}");
    assert!(
        String::from_utf8_lossy(&ra.stdout).contains("chunk 4.00 KiB"),
        "{ra:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    // And a bad unit is refused the same way everywhere.
    assert_fails_with(
        &["info", "null:size=4x"],
        r#"snapblk: null:size=4x: size: invalid size "4x""#,
    );
    let ra = snapblk(&["readahead", "replay", "/dev/null", "--chunk", "4x"]);
    assert_eq!(ra.status.code(), Some(2), "{ra:?}");
}

/// A machine without Ceph's client libraries gets one line naming what is missing and how to
/// install it when an rbd spec is opened, not a crash at start (librbd is loaded at connect).
#[test]
fn rbd_without_librbd_says_what_to_install() {
    // librados loads first; a missing librbd shows only where librados is installed.
    let has_rados = Command::new("ldconfig")
        .arg("-p")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("librados.so.2"));
    let mut cases = vec![("SNAPBLK_LIBRADOS", "/nonexistent/librados.so.2")];
    if has_rados {
        cases.push(("SNAPBLK_LIBRBD", "/nonexistent/librbd.so.1"));
    }
    for (var, lib) in cases {
        let o = Command::new(BIN)
            .args(["info", "rbd:pool=rbd,image=x"])
            .env(var, lib)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{var}: {err}");
        assert_eq!(
            err,
            format!(
                "snapblk: rbd:pool=rbd,image=x: rbd: cannot load {lib}: cannot open shared object \
                 file: No such file or directory (install librbd1, e.g. apt-get install librbd1)\n"
            ),
            "{var}"
        );
    }
}
