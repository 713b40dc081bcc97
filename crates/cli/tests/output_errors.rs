//! A closed or full stdout/stderr ends a command quietly with a non-zero status, never a panic
//! (issue 19, C1/W3/item 8). Convention (crates/cli/src/out.rs): a closed pipe (EPIPE) on stdout
//! or stderr exits 141 (128 + SIGPIPE) with nothing printed; any other output error (a full
//! stdout) prints `snapblk: writing to stdout: <cause>` once and exits 1.

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_snapblk");
const CLOSED_PIPE: i32 = 141;

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("outerr-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The write end of a pipe whose read end is already closed: every write gets EPIPE.
fn closed_pipe() -> Stdio {
    let mut fds = [0i32; 2];
    // Close-on-exec: a child another test thread spawns meanwhile must not inherit the read
    // end, which would keep the pipe open for reading (the child's stdout is dup2'ed anyway).
    // SAFETY: `fds` is a valid array of two ints for pipe2(2) to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe: {}", std::io::Error::last_os_error());
    // SAFETY: pipe(2) succeeded, so both descriptors are open and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(r);
    Stdio::from(w)
}

fn dev_full() -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap(),
    )
}

/// Runs `args` with the given stdout and stderr; returns (status code, stderr text when
/// captured).
fn run(args: &[&str], stdout: Stdio, stderr: Option<Stdio>) -> (Option<i32>, String) {
    let captured = stderr.is_none();
    let o = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr.unwrap_or_else(Stdio::piped))
        .output()
        .unwrap();
    let err = if captured {
        String::from_utf8_lossy(&o.stderr).into_owned()
    } else {
        String::new()
    };
    (o.status.code(), err)
}

/// Commands that print on stdout, with a list and a tree to work on.
fn commands(d: &Path) -> Vec<Vec<String>> {
    let tree = d.join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    for i in 0..3 {
        std::fs::write(tree.join(format!("f{i}")), vec![i as u8; 64 << 10]).unwrap();
    }
    let list = d.join("tree.list");
    let t = tree.display().to_string();
    let l = list.display().to_string();
    let rec = d.join("rec.list").display().to_string();
    let o = Command::new(BIN)
        .args([
            "readahead",
            "record",
            "-o",
            &l,
            "--scope",
            &t,
            "--duration",
            "0",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        v(&["readahead", "replay", &l]),
        v(&["readahead", "replay", &l, "--json"]),
        v(&["readahead", "warm", "-r", &t]),
        v(&["readahead", "evict", "-r", &t]),
        v(&["readahead", "evict", "-r", &t, "--json"]),
        v(&[
            "readahead",
            "record",
            "-o",
            &rec,
            "--scope",
            &t,
            "--duration",
            "0",
        ]),
        v(&[
            "readahead",
            "record",
            "-o",
            &rec,
            "--scope",
            &t,
            "--duration",
            "0",
            "--json",
        ]),
        v(&["residency", "-r", &t]),
        v(&["info", "null:size=1M"]),
        v(&["info", "null:size=1M", "--json"]),
        v(&["bench", "null:size=1M", "--runtime", "0.05"]),
        v(&["bench", "null:size=1M", "--runtime", "0.05", "--json"]),
    ]
    .into_iter()
    .chain(cow_commands(d))
    .collect()
}

/// `cow` and `merge` commands over a small image pair (their own output paths).
fn cow_commands(d: &Path) -> Vec<Vec<String>> {
    let (old, new) = snapblk_testsupport::image_pair(d, 256);
    let cow = d.join("u.cow");
    let s = |p: &Path| p.display().to_string();
    let o = Command::new(BIN)
        .args([
            "cow",
            "create",
            "--old",
            &s(&old),
            "--new",
            &s(&new),
            "-o",
            &s(&cow),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (old, new, cow, c2) = (s(&old), s(&new), s(&cow), s(&d.join("c2.cow")));
    let v = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        v(&[
            "cow", "create", "--old", &old, "--new", &new, "-o", &c2, "--json",
        ]),
        v(&["cow", "inspect", &cow]),
        v(&["cow", "inspect", &cow, "--json"]),
        v(&["cow", "verify", &cow, "--base", &old]),
        v(&["cow", "verify", &cow, "--base", &old, "--json"]),
        v(&["merge", "--status", &cow, "--base", &old]),
        v(&["merge", "--check", &cow, "--base", &old, "--json"]),
    ]
}

#[test]
fn closed_stdout_exits_141_quietly() {
    let d = scratch("stdout");
    for c in commands(&d) {
        let a: Vec<&str> = c.iter().map(String::as_str).collect();
        let (code, err) = run(&a, closed_pipe(), None);
        assert!(!err.contains("panicked"), "{a:?} panicked: {err}");
        assert_eq!(code, Some(CLOSED_PIPE), "{a:?}: stderr {err:?}");
        assert_eq!(err, "", "{a:?}: a closed stdout is not reported");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn full_stdout_is_one_line_and_exit_1() {
    let d = scratch("full");
    for c in commands(&d) {
        let a: Vec<&str> = c.iter().map(String::as_str).collect();
        let (code, err) = run(&a, dev_full(), None);
        assert!(!err.contains("panicked"), "{a:?} panicked: {err}");
        assert_eq!(code, Some(1), "{a:?}: stderr {err:?}");
        let last = err.lines().last().unwrap_or_default();
        assert_eq!(
            last, "snapblk: writing to stdout: No space left on device (os error 28)",
            "{a:?}"
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// `bench` writes warnings and progress to stderr; a closed stderr ended in a panic (101).
#[test]
fn closed_stderr_exits_141_not_a_panic() {
    for json in [false, true] {
        let mut a = vec![
            "bench",
            "null:size=1M",
            "--runtime",
            "0.05",
            "--repeat",
            "2",
        ];
        if json {
            a.push("--json");
        }
        let (code, _) = run(&a, Stdio::null(), Some(closed_pipe()));
        assert_eq!(code, Some(CLOSED_PIPE), "{a:?}");
    }
}

/// A command that fails with `--json` and cannot print its `"ok": false` document (stdout
/// closed or full) still reports its own error on stderr and exits 1: the failed write of the
/// document used to replace the error (exit 141, nothing said).
#[test]
fn a_failure_document_that_cannot_be_written_keeps_the_error() {
    let d = scratch("verdict");
    let missing = d.join("missing.cow");
    let m = missing.to_str().unwrap();
    for args in [
        vec!["merge", m, "--base", m, "--json"],
        vec!["info", "nosuchdriver:x=1", "--json"],
        vec!["cow", "inspect", m, "--json"],
    ] {
        for (how, out) in [("closed", closed_pipe()), ("full", dev_full())] {
            let (code, err) = run(&args, out, None);
            assert_eq!(code, Some(1), "{args:?} ({how} stdout): {err}");
            assert!(err.starts_with("snapblk: "), "{args:?} ({how}): {err}");
            assert!(!err.contains("stdout"), "{args:?} ({how}): {err}");
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}
