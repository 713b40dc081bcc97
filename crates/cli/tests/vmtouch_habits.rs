//! vmtouch's habits in `snapblk residency` and `snapblk readahead`, checked against the real
//! vmtouch (Debian package) on the same files on disk: per-file counts after a partial read
//! (`-v`), eviction (`-e`), following symlinks (`-f`) and locking pages in memory (`-l`, `-L`,
//! `-d` with a pid file), the latter also through /proc/PID/status VmLck.

use serde_json::Value;
use std::io::BufRead;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_snapblk");
const PAGE: u64 = 4096;

/// A directory on disk (tmpfs pages cannot be evicted), removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("vmtouch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let fs = Command::new("stat")
            .args(["-f", "-c", "%T"])
            .arg(&d)
            .output()
            .unwrap();
        let fs = String::from_utf8_lossy(&fs.stdout).trim().to_string();
        assert!(fs != "tmpfs" && fs != "ramfs", "{} is on {fs}", d.display());
        Scratch(d)
    }
    fn file(&self, name: &str, len: u64) -> PathBuf {
        let p = self.0.join(name);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(13) ^ (i >> 12) as u8)
            .collect();
        std::fs::write(&p, data).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ok(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    o
}

fn snapblk(args: &[&str], paths: &[&Path]) -> Output {
    ok(Command::new(BIN).args(args).args(paths))
}

/// vmtouch's summary of `paths` with `flags`: (files, resident pages, total pages).
fn vmtouch(flags: &[&str], paths: &[&Path]) -> (u64, u64, u64) {
    let o = ok(Command::new("vmtouch").args(flags).args(paths));
    let s = String::from_utf8_lossy(&o.stdout);
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in vmtouch output: {s}"))
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let files = field("Files:").parse().unwrap();
    let pages = field("Resident Pages:");
    let (r, t) = pages.split_once('/').unwrap();
    (files, r.parse().unwrap(), t.parse().unwrap())
}

/// snapblk's residency of `paths` (`-r` plus `extra`): (files, resident pages, total pages),
/// and per file (path, resident pages).
fn residency(extra: &[&str], paths: &[&Path]) -> ((u64, u64, u64), Vec<(String, u64)>) {
    let o = snapblk(&[&["residency", "-r", "--json"], extra].concat(), paths);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let t = &v["total"];
    let files = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["residency"]["resident_pages"].as_u64().unwrap(),
            )
        })
        .collect();
    (
        (
            t["files"].as_u64().unwrap(),
            t["resident_pages"].as_u64().unwrap(),
            t["pages"].as_u64().unwrap(),
        ),
        files,
    )
}

/// Read `(offset, len)` ranges of `p` with readahead off, so exactly those pages come in.
fn read_ranges(p: &Path, ranges: &[(u64, u64)]) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(p).unwrap();
    // SAFETY: an advice call on an open fd.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    assert_eq!(r, 0);
    for &(off, len) in ranges {
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(&mut buf, off).unwrap();
    }
}

/// This host may reclaim pages on its own (proactive reclaim) between two measurements: try a
/// comparison a few times, re-reading first, before calling it a disagreement.
fn agree<T: PartialEq + std::fmt::Debug>(mut once: impl FnMut() -> (T, T)) {
    let mut last = None;
    for _ in 0..5 {
        let (a, b) = once();
        if a == b {
            return;
        }
        last = Some((a, b));
    }
    panic!("snapblk and vmtouch disagree: {last:?}");
}

#[test]
fn per_file_residency_after_a_partial_read_agrees_with_vmtouch_v() {
    let d = Scratch::new("partial");
    let a = d.file("a", 1 << 20);
    let b = d.file("sub/b", (3 << 20) + 123);
    let c = d.file("sub/c", 64 << 10);
    snapblk(&["readahead", "evict", "-r"], &[&d.0]);
    agree(|| {
        read_ranges(&a, &[(0, 40 * PAGE), (100 * PAGE, 3 * PAGE)]);
        read_ranges(&b, &[(PAGE, PAGE), ((3 << 20), 123)]);
        let (total, files) = residency(&[], &[&d.0]);
        let mut per_file: Vec<(String, u64)> = files;
        per_file.sort();
        // vmtouch -v per file: its summary line for each file alone.
        let theirs: Vec<(String, u64)> = [&a, &b, &c]
            .iter()
            .map(|p| (p.display().to_string(), vmtouch(&["-v"], &[p]).1))
            .collect();
        let mut theirs_sorted = theirs.clone();
        theirs_sorted.sort();
        ((total, per_file), (vmtouch(&[], &[&d.0]), theirs_sorted))
    });
    let ((_, resident, pages), _) = residency(&[], &[&d.0]);
    assert!(
        resident >= 40 + 3 + 2 && resident < pages,
        "{resident}/{pages}"
    );
    // The -v bars: one per file, with the file's resident/total pages as vmtouch -v prints them.
    let o = snapblk(&["residency", "-r", "-v"], &[&d.0]);
    let s = String::from_utf8_lossy(&o.stdout);
    for (p, total) in [(&a, 256), (&b, 769), (&c, 16)] {
        let name = p.display().to_string();
        let i = s
            .lines()
            .position(|l| l == name)
            .unwrap_or_else(|| panic!("{name}: {s}"));
        let bar = s.lines().nth(i + 1).unwrap();
        assert!(
            bar.starts_with('[') && bar.contains(&format!("/{total} ")),
            "{bar}"
        );
    }
}

#[test]
fn evict_leaves_nothing_resident_as_vmtouch_reports() {
    let d = Scratch::new("evict");
    let a = d.file("a", 2 << 20);
    let b = d.file("x/b", 300_000);
    ok(Command::new("cat").args([&a, &b]).stdout(Stdio::null()));
    let (_, resident, pages) = vmtouch(&[], &[&d.0]);
    assert!(resident > 0, "{resident}/{pages}");
    let o = snapblk(&["readahead", "evict", "-r", "--json"], &[&d.0]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["remaining_pages"], 0, "{v}");
    assert_eq!(vmtouch(&[], &[&d.0]), (2, 0, 512 + 74));
    // And the other way round: what vmtouch -e evicts, snapblk counts as gone.
    ok(Command::new("cat").arg(&a).stdout(Stdio::null()));
    ok(Command::new("vmtouch").arg("-e").arg(&d.0));
    assert_eq!(residency(&[], &[&d.0]).0, (2, 0, 512 + 74));
}

#[test]
fn follow_symlinks_finds_what_vmtouch_f_finds() {
    let d = Scratch::new("links");
    let outside = Scratch::new("links-target");
    d.file("own", 64 << 10);
    let t = outside.file("t", 256 << 10);
    let tdir = outside.file("dir/u", 32 << 10);
    std::os::unix::fs::symlink(&t, d.0.join("link-to-file")).unwrap();
    std::os::unix::fs::symlink(tdir.parent().unwrap(), d.0.join("link-to-dir")).unwrap();
    std::os::unix::fs::symlink(d.0.join("missing"), d.0.join("dangling")).unwrap();
    agree(|| {
        ok(Command::new("cat").args([&t, &tdir]).stdout(Stdio::null()));
        (residency(&[], &[&d.0]).0, vmtouch(&[], &[&d.0]))
    });
    agree(|| {
        ok(Command::new("cat").args([&t, &tdir]).stdout(Stdio::null()));
        (residency(&["-f"], &[&d.0]).0, vmtouch(&["-f"], &[&d.0]))
    });
    let (files, resident, pages) = residency(&["-f"], &[&d.0]).0;
    assert_eq!((files, pages), (3, 16 + 64 + 8));
    assert!(resident >= 64 + 8, "{resident}");
}

/// VmLck of `pid` in kB.
fn vm_lck_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// The process is gone or a zombie (a detached daemon is reaped by whoever adopted it).
fn wait_gone(pid: u32) {
    let t0 = Instant::now();
    loop {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return,
            Ok(s)
                if s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z')) =>
            {
                return;
            }
            Ok(_) => {}
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{pid} still running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn term(pid: u32) {
    ok(Command::new("kill").args(["-TERM", &pid.to_string()]));
}

#[test]
fn locked_pages_stay_resident_through_eviction_until_sigterm() {
    let d = Scratch::new("lock");
    let a = d.file("a", 4 << 20);
    let b = d.file("s/b", 10_000);
    ok(Command::new("vmtouch").arg("-e").arg(&d.0));
    for (flags, exact) in [(&[][..], true), (&["--mlockall"][..], false)] {
        let mut child = Command::new(BIN)
            .args(["readahead", "lock", "-r"])
            .args(flags)
            .arg(&d.0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("locked 2 files"), "{flags:?}: {line:?}");
        let pid = child.id();
        let want_kb = (1024 + 3) * PAGE / 1024;
        let lck = vm_lck_kb(pid);
        if exact {
            assert_eq!(lck, want_kb, "{flags:?}");
        } else {
            // mlockall also locks the program's own mappings.
            assert!(lck > want_kb, "{flags:?}: {lck}");
        }
        // vmtouch's eviction cannot drop locked pages: everything stays resident.
        ok(Command::new("vmtouch").arg("-e").arg(&d.0));
        assert_eq!(
            vmtouch(&[], &[&a, &b]),
            (2, 1024 + 3, 1024 + 3),
            "{flags:?}"
        );
        term(pid);
        let st = child.wait().unwrap();
        assert!(st.success(), "{flags:?}: {st:?}");
        ok(Command::new("vmtouch").arg("-e").arg(&d.0));
        assert_eq!(
            vmtouch(&[], &[&a, &b]),
            (2, 0, 1024 + 3),
            "{flags:?}: unlocked"
        );
    }
}

#[test]
fn the_lock_daemon_returns_once_locked_and_stops_cleanly_on_sigterm() {
    let d = Scratch::new("daemon");
    let a = d.file("a", 1 << 20);
    let pid_file = d.0.join("lock.pid");
    ok(Command::new("vmtouch").arg("-e").arg(&a));
    let o = snapblk(
        &[
            "readahead",
            "lock",
            "--daemon",
            "--pid-file",
            pid_file.to_str().unwrap(),
        ],
        &[&a],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(out.contains(&format!("(pid {pid})")), "{out}");
    // Locked before the command returned (vmtouch -dw).
    assert_eq!(vm_lck_kb(pid), 1024);
    ok(Command::new("vmtouch").arg("-e").arg(&a));
    assert_eq!(vmtouch(&[], &[&a]), (1, 256, 256));
    term(pid);
    wait_gone(pid);
    assert!(!pid_file.exists(), "the pid file outlived the daemon");
    ok(Command::new("vmtouch").arg("-e").arg(&a));
    assert_eq!(vmtouch(&[], &[&a]), (1, 0, 256));
    // A daemon that cannot lock fails the command with the reason.
    let o = Command::new(BIN)
        .args(["readahead", "lock", "--daemon"])
        .arg(d.0.join("missing"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the lock daemon stopped: 1 path could not be locked"),
        "{err}"
    );
}

/// `--pid-file` naming a file that holds data (here the very file being locked, by its name
/// and through a symbolic link) is refused before anything is locked or written; the file is
/// left as it was. (vmtouch would overwrite it, and remove it at exit.)
#[test]
fn a_pid_file_never_overwrites_a_data_file() {
    // A file the content check alone lets through (empty, or digits): refused as the same
    // file as a locked path, by name and through a link, and still there afterwards.
    let d = Scratch::new("pidfile-same");
    for (name, data) in [("empty", &b""[..]), ("digits", &b"12345\n"[..])] {
        let f = d.0.join(name);
        std::fs::write(&f, data).unwrap();
        let link = d.0.join(format!("{name}.pid"));
        std::os::unix::fs::symlink(&f, &link).unwrap();
        for pid_file in [&f, &link] {
            let o = Command::new(BIN)
                .args(["readahead", "lock", "--daemon", "--pid-file"])
                .arg(pid_file)
                .arg(&f)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            if o.status.success() {
                // The holder runs: stop it (its pid is in the file) before failing.
                let pid = std::fs::read_to_string(pid_file).unwrap_or_default();
                let _ = Command::new("kill").arg(pid.trim()).status();
            }
            assert_eq!(o.status.code(), Some(1), "{}: {err}", pid_file.display());
            assert!(err.contains("is the same file as PATH"), "{err}");
            assert_eq!(std::fs::read(&f).unwrap(), data, "{}", pid_file.display());
        }
    }

    // A data file: the locked one (the same file), or another one (not a pid file).
    let d = Scratch::new("pidfile-alias");
    let a = d.file("a", 64 << 10);
    let b = d.file("b", 4 << 10);
    let before = std::fs::read(&a).unwrap();
    let before_b = std::fs::read(&b).unwrap();
    let link = d.0.join("link.pid");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    for (pid_file, why) in [
        (&a, "is the same file as PATH"),
        (&link, "is the same file as PATH"),
        (&b, "not a pid file"),
    ] {
        let o = Command::new(BIN)
            .args(["readahead", "lock", "--daemon", "--pid-file"])
            .arg(pid_file)
            .arg(&a)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{}: {err}", pid_file.display());
        assert!(err.contains(why), "{err}");
        assert!(std::fs::read(&b).unwrap() == before_b);
        assert!(
            std::fs::read(&a).unwrap() == before,
            "{}",
            pid_file.display()
        );
    }
}
