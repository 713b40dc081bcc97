//! `snapblk serve --fuse` end to end: the device file works with dd/cmp, with losetup + mount of
//! an ext4 image built by `mke2fs -d` (files compared with the source tree, `e2fsck -fn` clean),
//! for plain files and for snapshots (a COW made by `snapblk cow create`); read-only devices give
//! a read-only file; SIGTERM unmounts, but not while a loop device still uses the file.

#[path = "serve_common.rs"]
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn file_of(s: &Serve) -> String {
    s.ready_str("path")
}

/// A temp dir holding a pattern image `a.img` and an empty mount point `mnt`:
/// `(dir, image, image bytes, mount point)`.
fn image_and_mountpoint(tag: &str, len: usize, seed: u64) -> (TempDir, PathBuf, Vec<u8>, PathBuf) {
    let d = TempDir::new(tag);
    let (img, data) = write_image(d.path(), "a.img", len, seed);
    let mnt = d.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    (d, img, data, mnt)
}

/// `snapblk serve DEVICE_ARGS… --fuse MNT`.
fn serve_fuse(device_args: &[&str], mnt: &Path) -> Serve {
    let mut args = device_args.to_vec();
    args.extend(["--fuse", path_str(mnt)]);
    Serve::start(&args)
}

/// Lazily unmounts its mount points on drop if they are still mounted. A failing test kills its
/// server (SIGKILL), which would leave a dead FUSE mount ("Transport endpoint is not connected")
/// that keeps the temp dir, its images and the mount itself around after the run. Create it
/// after the `TempDir` so it drops first.
struct Unmount(Vec<PathBuf>);

impl Unmount {
    fn new(mounts: &[&Path]) -> Unmount {
        Unmount(mounts.iter().map(|m| m.to_path_buf()).collect())
    }
}

impl Drop for Unmount {
    fn drop(&mut self) {
        // Loop mounts first: they sit on the FUSE file.
        for m in self.0.iter().rev() {
            if is_mounted(m) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(m)
                    .status();
            }
        }
    }
}

/// Detaches a loop device if the test panics while it is attached (on success the test
/// detaches it itself; detaching again could hit a device another test attached meanwhile).
struct DetachOnPanic<'a>(&'a str);

impl Drop for DetachOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = std::process::Command::new("losetup")
                .args(["-d", self.0])
                .status();
        }
    }
}

fn is_mounted(dir: &Path) -> bool {
    let canon = dir.canonicalize().unwrap_or(dir.to_owned());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(canon.to_str().unwrap()))
}

/// A small directory tree with text, binary, empty, nested and larger files, and a symlink.
fn make_tree(root: &Path, seed: u64) {
    std::fs::create_dir_all(root.join("etc/conf.d")).unwrap();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("data/deep/er")).unwrap();
    std::fs::write(
        root.join("etc/hosts"),
        format!("127.0.0.1 localhost # {seed}\n"),
    )
    .unwrap();
    std::fs::write(root.join("etc/conf.d/a.conf"), "x=1\n".repeat(100)).unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::write(root.join("bin/tool"), pattern(300_000, seed)).unwrap();
    std::fs::write(
        root.join("data/deep/er/big.bin"),
        pattern(3 << 20, seed + 1),
    )
    .unwrap();
    for i in 0..40 {
        std::fs::write(
            root.join(format!("data/f{i}.txt")),
            format!("file {i} seed {seed}\n").repeat(i * 50 + 1),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("../etc/hosts", root.join("bin/hosts-link")).unwrap();
}

fn mkfs(tree: &Path, img: &Path) {
    let _ = std::fs::remove_file(img);
    // Fixed UUID/hash seed keep images of the same tree similar; sizes in 4 KiB blocks.
    tool_ok(
        "mke2fs",
        &[
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "4096",
            "-d",
            tree.to_str().unwrap(),
            img.to_str().unwrap(),
            "24M",
        ],
    );
}

/// Attach `file` to a loop device, mount it, compare with `tree`, optionally write a file,
/// unmount, fsck the loop device, detach.
fn loop_mount_check(file: &str, tree: &Path, mnt: &Path, write: bool) {
    let mut la = vec!["-f", "--show"];
    if !write {
        la.push("-r");
    }
    la.push(file);
    let dev = tool_ok("losetup", &la).trim().to_owned();
    assert!(dev.starts_with("/dev/loop"), "{dev}");
    let _detach = DetachOnPanic(&dev);
    let _unmount = Unmount::new(&[mnt]);
    let opts = if write { "rw" } else { "ro,noload" };
    let m = tool(
        "mount",
        &["-t", "ext4", "-o", opts, &dev, mnt.to_str().unwrap()],
    );
    if !m.status.success() {
        tool("losetup", &["-d", &dev]);
        panic!("mount {dev} failed: {}", String::from_utf8_lossy(&m.stderr));
    }
    let diff = tool(
        "diff",
        &[
            "-r",
            "--no-dereference",
            tree.to_str().unwrap(),
            mnt.to_str().unwrap(),
        ],
    );
    let diff_text = String::from_utf8_lossy(&diff.stdout)
        .replace(&format!("Only in {}: lost+found\n", mnt.display()), "");
    // diff exits 1 on differences (here at least lost+found); 2 or stderr means it could not compare.
    let mut ok = diff_text.trim().is_empty()
        && matches!(diff.status.code(), Some(0 | 1))
        && diff.stderr.is_empty();
    if write {
        let p = mnt.join("written-through-fuse.bin");
        std::fs::write(&p, pattern(1 << 20, 99)).unwrap();
        tool_ok("sync", &[]);
        ok &= std::fs::read(&p).unwrap() == pattern(1 << 20, 99);
    }
    tool_ok("umount", &[mnt.to_str().unwrap()]);
    let fsck = tool("e2fsck", &["-fn", &dev]);
    tool_ok("losetup", &["-d", &dev]);
    assert!(ok, "tree differs from the mounted image:\n{diff_text}");
    assert!(
        fsck.status.success(),
        "e2fsck -fn {dev} not clean: {}\n{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
}

#[test]
fn dd_and_cmp_through_the_file() {
    let (d, img, mut expect, mnt) = image_and_mountpoint("fuse-dd", 5 << 20, 5);
    let _unmount = Unmount::new(&[&mnt]);
    let s = serve_fuse(&[path_str(&img)], &mnt);
    assert_eq!(s.ready["export"], "fuse");
    let f = file_of(&s);
    assert_eq!(std::fs::metadata(&f).unwrap().len(), expect.len() as u64);
    tool_ok("cmp", &[&f, img.to_str().unwrap()]);
    // Unaligned and aligned writes with dd, then read back with cmp against the expectation.
    let src = d.join("src.bin");
    std::fs::write(&src, pattern(70_000, 6)).unwrap();
    tool_ok(
        "dd",
        &[
            &format!("if={}", src.display()),
            &format!("of={f}"),
            "bs=1000",
            "seek=777",
            "conv=notrunc,fsync",
            "status=none",
        ],
    );
    expect[777_000..847_000].copy_from_slice(&pattern(70_000, 6));
    tool_ok(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={f}"),
            "bs=4096",
            "seek=300",
            "count=16",
            "conv=notrunc",
            "oflag=direct",
            "status=none",
        ],
    );
    expect[300 * 4096..316 * 4096].fill(0);
    let exp = d.join("expect.bin");
    std::fs::write(&exp, &expect).unwrap();
    tool_ok("cmp", &[&f, exp.to_str().unwrap()]);
    // The size is fixed: growing the file fails.
    let grow = tool(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={f}"),
            "bs=4096",
            &format!("seek={}", expect.len() / 4096),
            "count=1",
            "conv=notrunc",
            "status=none",
        ],
    );
    assert!(!grow.status.success(), "writing past the end must fail");
    let (st, rest, err) = s.stop();
    assert!(st.success(), "{err}");
    assert_eq!(
        rest.last().map(String::as_str),
        Some(r#"{"event":"stopped","export":"fuse","schema":"snapblk.serve-event.v1"}"#)
    );
    assert!(!is_mounted(&mnt), "unmounted on SIGTERM");
    assert_file_eq(&img, &expect, "writes reached the device");
}

/// A device opened with O_DIRECT (`direct=true`) whose size is not a multiple of 512: the
/// partial last block reads back right through the mounted file, buffered and with O_DIRECT
/// (the export reads the whole last block from the device and returns its part inside the
/// file; an O_DIRECT read of just the tail's length fails with EINVAL).
#[test]
fn partial_last_block_of_an_o_direct_device_reads_back() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let (_d, img, data, mnt) = image_and_mountpoint("fuse-tail", (64 << 10) + 1000, 8);
    let _unmount = Unmount::new(&[&mnt]);
    let spec = format!("io_uring:path={},direct=true", img.display());
    let s = serve_fuse(&[&spec, "--read-only"], &mnt);
    let f = file_of(&s);
    assert_eq!(std::fs::metadata(&f).unwrap().len(), data.len() as u64);
    assert!(
        std::fs::read(&f).unwrap() == data,
        "buffered read of the whole file"
    );
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&f)
        .unwrap();
    // An aligned 8 KiB buffer at the last 4 KiB boundary: the kernel asks for the tail.
    let mut v = vec![0u8; 3 * 4096];
    let off = v.as_ptr().align_offset(4096);
    let buf = &mut v[off..off + 8192];
    // SAFETY: reads into `buf`, a live buffer of that length, from an open fd.
    let n = unsafe { libc::pread(file.as_raw_fd(), buf.as_mut_ptr().cast(), 8192, 64 << 10) };
    assert_eq!(n, 1000, "{}", std::io::Error::last_os_error());
    assert!(buf[..1000] == data[64 << 10..], "the tail's bytes");
    drop(file);
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
}

#[test]
fn read_only_device_gives_read_only_file() {
    let (_d, img, _, mnt) = image_and_mountpoint("fuse-ro", 1 << 20, 7);
    let _unmount = Unmount::new(&[&mnt]);
    let s = serve_fuse(&[path_str(&img), "--read-only"], &mnt);
    assert_eq!(s.ready["read_only"], true);
    let f = file_of(&s);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o444
    );
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc_erofs()), "{e}");
    tool_ok("cmp", &[&f, img.to_str().unwrap()]);
    let (st, _, _) = s.stop();
    assert!(st.success());
}

fn libc_erofs() -> i32 {
    30 // EROFS on Linux
}

#[test]
fn ext4_plain_file_loop_mount_and_fsck() {
    let d = TempDir::new("fuse-ext4");
    let tree = d.join("tree");
    make_tree(&tree, 1);
    let img = d.join("fs.img");
    mkfs(&tree, &img);
    let (mnt, lmnt) = (d.join("mnt"), d.join("lmnt"));
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&lmnt).unwrap();
    let _unmount = Unmount::new(&[&mnt, &lmnt]);
    let s = serve_fuse(&[path_str(&img)], &mnt);
    let f = file_of(&s);
    loop_mount_check(&f, &tree, &lmnt, false);
    loop_mount_check(&f, &tree, &lmnt, true);
    // Requests the export leaves unimplemented (an xattr probe, a new file) are refused
    // without fuser's multi-line "[Not Implemented]" warnings on stderr.
    let probe = "import os, sys\nfor f in (lambda: os.getxattr(sys.argv[1], 'security.selinux'), lambda: open(sys.argv[2], 'w')):\n    try: f()\n    except OSError: pass\n";
    let new_file = mnt.join("new-file");
    tool_ok("python3", &["-c", probe, &f, path_str(&new_file)]);
    assert!(!new_file.exists());
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
    assert!(!err.contains("[warn fuser"), "{err}");
    // The writes went through to the image file, which is still a clean file system.
    let fsck = tool("e2fsck", &["-fn", img.to_str().unwrap()]);
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    let ls = tool_ok("debugfs", &["-R", "ls -l /", img.to_str().unwrap()]);
    assert!(ls.contains("written-through-fuse.bin"), "{ls}");
}

#[test]
fn ext4_snapshot_loop_mount_and_fsck() {
    let d = TempDir::new("fuse-snap");
    let (old_tree, new_tree) = (d.join("old"), d.join("new"));
    make_tree(&old_tree, 1);
    make_tree(&new_tree, 2);
    std::fs::write(new_tree.join("added-in-new.txt"), "new file\n").unwrap();
    std::fs::remove_file(new_tree.join("data/f3.txt")).unwrap();
    let (old, new, cow) = (d.join("old.img"), d.join("new.img"), d.join("fs.cow"));
    mkfs(&old_tree, &old);
    mkfs(&new_tree, &new);
    let [old_s, new_s, cow_s] = [&old, &new, &cow].map(|p| path_str(p));
    tool_ok(
        bin(),
        &["cow", "create", "--old", old_s, "--new", new_s, "-o", cow_s],
    );
    let (mnt, lmnt) = (d.join("mnt"), d.join("lmnt"));
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&lmnt).unwrap();
    let _unmount = Unmount::new(&[&mnt, &lmnt]);
    let old_bytes = std::fs::read(&old).unwrap();

    // Read-only snapshot: the file is exactly new.img, and mounts as the new tree.
    let snapshot = ["--base", old_s, "--cow", cow_s];
    let s = serve_fuse(&snapshot, &mnt);
    assert_eq!(s.ready["read_only"], true);
    let f = file_of(&s);
    tool_ok("cmp", &[&f, new.to_str().unwrap()]);
    loop_mount_check(&f, &new_tree, &lmnt, false);
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");

    // Writable snapshot: mount read-write, write, fsck clean; the base is untouched.
    let s = serve_fuse(&[&snapshot[..], &["--writable"]].concat(), &mnt);
    assert_eq!(s.ready["read_only"], false);
    loop_mount_check(&file_of(&s), &new_tree, &lmnt, true);
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
    assert_file_eq(&old, &old_bytes, "base image modified");
}

#[test]
fn sigterm_waits_while_a_loop_device_holds_the_file() {
    let (_d, img, _, mnt) = image_and_mountpoint("fuse-busy", 2 << 20, 8);
    let _unmount = Unmount::new(&[&mnt]);
    let mut s = serve_fuse(&[path_str(&img)], &mnt);
    let f = file_of(&s);
    let dev = tool_ok("losetup", &["-f", "--show", &f]).trim().to_owned();
    s.signal("TERM");
    let still = s.running_after(Duration::from_secs(2));
    // Reads through the loop device keep working while we wait.
    let r = tool("cmp", &[&dev, img.to_str().unwrap()]);
    tool_ok("losetup", &["-d", &dev]);
    assert!(still, "must keep serving while the loop device is attached");
    assert!(r.status.success(), "loop device reads failed while busy");
    // Loop detach is asynchronous; retry the signal until the unmount succeeds.
    let mut exited = false;
    for _ in 0..50 {
        s.signal("TERM");
        if !s.running_after(Duration::from_millis(500)) {
            exited = true;
            break;
        }
    }
    assert!(exited, "did not exit after the loop device was detached");
    let (st, _, err) = s.wait();
    assert!(st.success(), "{err}");
    assert!(!is_mounted(&mnt));
}

/// The second signal while a loop device holds the file detaches the mount lazily but keeps
/// serving that user (and answering signals); detaching the loop device ends the process.
#[test]
fn second_signal_detaches_and_serves_the_loop_device_until_it_goes() {
    let (_d, img, _, mnt) = image_and_mountpoint("fuse-lazy", 2 << 20, 9);
    let _unmount = Unmount::new(&[&mnt]);
    let mut s = serve_fuse(&[path_str(&img)], &mnt);
    let f = file_of(&s);
    let dev = tool_ok("losetup", &["-f", "--show", &f]).trim().to_owned();
    s.signal("TERM");
    assert!(s.running_after(Duration::from_secs(1)));
    s.signal("TERM");
    let still = s.running_after(Duration::from_secs(2));
    let detached_mount = !is_mounted(&mnt);
    // The loop device still reads the image through us.
    let r = tool("cmp", &[&dev, img.to_str().unwrap()]);
    tool_ok("losetup", &["-d", &dev]);
    assert!(
        still,
        "must keep serving the loop device after the lazy detach"
    );
    assert!(detached_mount, "the mount point is still attached");
    assert!(
        r.status.success(),
        "loop device reads failed after the lazy detach"
    );
    // No further signal: the process ends once the loop device has let go.
    let mut exited = false;
    for _ in 0..40 {
        if !s.running_after(Duration::from_millis(500)) {
            exited = true;
            break;
        }
    }
    assert!(exited, "did not exit after the last user let go");
    let (st, _, err) = s.wait();
    assert!(st.success(), "{err}");
    assert!(err.contains("detached it lazily"), "{err}");
}

/// A third signal abandons the remaining users: the process exits at once, writes
/// acknowledged before it are in the image, and the loop device's I/O fails afterwards.
#[test]
fn third_signal_aborts_the_remaining_users_after_flushing() {
    let (_d, img, data, mnt) = image_and_mountpoint("fuse-abort", 2 << 20, 10);
    let _unmount = Unmount::new(&[&mnt]);
    let mut s = serve_fuse(&[path_str(&img)], &mnt);
    let f = file_of(&s);
    let dev = tool_ok("losetup", &["-f", "--show", &f]).trim().to_owned();
    // A write through the loop device, synced (so acknowledged by the export).
    let patch = vec![0x5au8; 4096];
    let pf = _d.path().join("patch");
    std::fs::write(&pf, &patch).unwrap();
    tool_ok(
        "dd",
        &[
            &format!("if={}", pf.display()),
            &format!("of={dev}"),
            "bs=4096",
            "seek=3",
            "conv=fsync,notrunc",
            "oflag=direct",
            "status=none",
        ],
    );
    for _ in 0..3 {
        s.signal("TERM");
        std::thread::sleep(Duration::from_millis(700));
    }
    let mut exited = false;
    for _ in 0..20 {
        if !s.running_after(Duration::from_millis(250)) {
            exited = true;
            break;
        }
    }
    let after = tool(
        "dd",
        &[
            &format!("if={dev}"),
            "of=/dev/null",
            "bs=4096",
            "count=1",
            "skip=100",
            "iflag=direct",
            "status=none",
        ],
    );
    tool_ok("losetup", &["-d", &dev]);
    assert!(
        exited,
        "a third signal must end the process with users left"
    );
    let (st, _, err) = s.wait();
    assert!(st.success(), "{err}");
    assert!(err.contains("aborting the FUSE connection"), "{err}");
    assert!(
        !after.status.success(),
        "the loop device still read after the export was gone"
    );
    let now = std::fs::read(&img).unwrap();
    assert_eq!(
        &now[3 * 4096..4 * 4096],
        &patch[..],
        "acknowledged write lost"
    );
    assert_eq!(&now[..3 * 4096], &data[..3 * 4096]);
}

/// A mount point that holds files is refused with one line (as fusermount refuses it), and its
/// files stay visible; `--fuse-nonempty` mounts over it anyway, hiding them until the unmount.
#[test]
fn a_non_empty_mount_point_is_refused_unless_asked() {
    let (_d, img, _, mnt) = image_and_mountpoint("fuse-nonempty", 1 << 20, 11);
    let _unmount = Unmount::new(&[&mnt]);
    let mine = mnt.join("mine.txt");
    std::fs::write(&mine, b"keep me").unwrap();
    // A server that mounts anyway is killed when what try_start returns is dropped.
    let args = [path_str(&img), "--read-only", "--fuse", path_str(&mnt)];
    let err = match Serve::try_start(&args) {
        Ok(s) => panic!("mounted over a non-empty directory: {}", s.ready),
        Err(e) => e,
    };
    let stderr = err.split_once("exit status: 1: ").map_or("", |(_, e)| e);
    assert!(
        stderr.contains("is not empty") && stderr.trim_end().lines().count() == 1,
        "{err}"
    );
    assert!(!is_mounted(&mnt));
    assert_eq!(std::fs::read(&mine).unwrap(), b"keep me");
    let s = serve_fuse(&[path_str(&img), "--read-only", "--fuse-nonempty"], &mnt);
    assert!(is_mounted(&mnt));
    assert!(!mine.exists(), "hidden under the mount");
    tool_ok("cmp", &[&file_of(&s), path_str(&img)]);
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
    assert_eq!(std::fs::read(&mine).unwrap(), b"keep me");
}
