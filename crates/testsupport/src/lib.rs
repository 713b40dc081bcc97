//! Helpers shared by snapblk's integration tests (a dev-dependency only, never published):
//! temporary directories, deterministic test images, external tools that fail the test when
//! missing, a server child process that announces readiness with a JSON line (killed on drop),
//! NBD client tools ([`nbd`]), the AOSP golden COW cases with their README facts ([`golden`]),
//! which mapping holds an address ([`mapping_of`]), checks of the error convention
//! ([`errors`]), and keys and signatures made by the `openssl` tool ([`openssl`]).
//!
//! Everything here panics on failure: it runs inside tests, where a panic is the failure report.

pub mod errors;
pub mod ext4;
pub mod golden;
pub mod nbd;
pub mod openssl;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The mapping of this process holding `addr`, as /proc/self/maps shows it: "PERMS PATH",
/// e.g. "rw-p " for private anonymous memory or "rw-s /memfd:NAME (deleted)"; panics if
/// `addr` is not mapped.
pub fn mapping_of(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    for l in maps.lines() {
        let mut f = l.split_whitespace();
        let Some((lo, hi)) = f.next().and_then(|r| r.split_once('-')) else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if (lo..hi).contains(&addr) {
            let perms = f.next().unwrap_or("");
            let path: Vec<&str> = f.skip(3).collect();
            return format!("{perms} {}", path.join(" "));
        }
    }
    panic!("{addr:#x} is not mapped");
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh, empty directory under the system temp dir; `tag` names it for debugging.
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("snapblk-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p)
            .unwrap_or_else(|e| panic!("create temp dir {}: {e}", p.display()));
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, s: &str) -> PathBuf {
        self.0.join(s)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic, position-dependent content: every 8-byte word encodes its offset and a seed,
/// so data read from the wrong place (or from another image) never matches.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut i = 0u64;
    while v.len() < len {
        let mut x = (i * 8) ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 31;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 29;
        v.extend_from_slice(&x.to_le_bytes());
        i += 1;
    }
    v.truncate(len);
    v
}

/// Write `pattern(len, seed)` to `dir/name`; returns the path and the bytes written.
pub fn write_image(dir: &Path, name: &str, len: usize, seed: u64) -> (PathBuf, Vec<u8>) {
    let p = dir.join(name);
    let d = pattern(len, seed);
    std::fs::write(&p, &d).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    (p, d)
}

/// Assert that the file at `path` holds exactly `expect` (without printing megabytes of bytes).
pub fn assert_file_eq(path: &Path, expect: &[u8], what: &str) {
    let got =
        std::fs::read(path).unwrap_or_else(|e| panic!("{what}: read {}: {e}", path.display()));
    if got != expect {
        let first = got.iter().zip(expect).position(|(a, b)| a != b);
        panic!(
            "{what}: {} differs ({} bytes, expected {}; first difference at {first:?})",
            path.display(),
            got.len(),
            expect.len()
        );
    }
}

/// The names in `dir`, sorted (what a command left in its output directory).
pub fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Path as `&str` (test paths are always UTF-8).
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// Waits for `child` (spawned with piped stdout/stderr) and collects its output; kills it and
/// fails the test, naming `what`, if it is still running after `limit`.
pub fn output_within(child: Child, limit: Duration, what: &str) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => o.unwrap_or_else(|e| panic!("{what}: {e}")),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{what}: still running after {limit:?}");
        }
    }
}

/// Run an external tool; a missing tool is a test failure, not a skip.
pub fn tool(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} is required (scripts/install-deps.sh installs it): {e}"))
}

/// Run an external tool that must succeed; returns its stdout.
pub fn tool_ok(cmd: &str, args: &[&str]) -> String {
    let out = tool(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A server child process whose first stdout line is a JSON object with `"event":"ready"`
/// (what `snapblk serve --json` prints). Killed and reaped on drop.
pub struct ReadyProcess {
    child: Option<Child>,
    /// The readiness line.
    pub ready: serde_json::Value,
    lines: mpsc::Receiver<String>,
}

fn read_lines(out: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

impl ReadyProcess {
    /// Spawn `cmd` (stdout and stderr piped) and wait up to 60 s for its readiness line. On
    /// failure the process is killed and the error carries its exit status and stderr.
    pub fn spawn(cmd: &mut Command) -> Result<ReadyProcess, String> {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let lines = read_lines(child.stdout.take().expect("stdout is piped"));
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => {
                let ready: serde_json::Value =
                    serde_json::from_str(&l).map_err(|e| format!("{e}: {l}"))?;
                if ready["event"] != "ready" {
                    return Err(format!("unexpected first line {l}"));
                }
                Ok(ReadyProcess {
                    child: Some(child),
                    ready,
                    lines,
                })
            }
            Err(_) => {
                let _ = child.kill();
                let out = child.wait_with_output().map_err(|e| e.to_string())?;
                Err(format!(
                    "no readiness line; {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ))
            }
        }
    }

    /// A string field of the readiness line (panics if it is missing).
    pub fn ready_str(&self, key: &str) -> String {
        self.ready[key]
            .as_str()
            .unwrap_or_else(|| panic!("readiness line has no string {key:?}: {}", self.ready))
            .to_owned()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Read stdout lines until a JSON line with `"event": event` (at most `timeout`): returns it
    /// and the lines before it. The lines read are gone from what [`ReadyProcess::wait`]
    /// returns.
    pub fn wait_event(
        &mut self,
        event: &str,
        timeout: Duration,
    ) -> Result<(serde_json::Value, Vec<String>), String> {
        let end = Instant::now() + timeout;
        let mut before = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l)
                        && v["event"] == event
                    {
                        return Ok((v, before));
                    }
                    before.push(l);
                }
                Err(e) => return Err(format!("no {event:?} line ({e}); before it: {before:?}")),
            }
        }
    }

    /// Send a signal by name (`TERM`, `INT`, …) with kill(1).
    pub fn signal(&self, sig: &str) {
        tool_ok("kill", &[&format!("-{sig}"), &self.pid().to_string()]);
    }

    /// Whether the process is still running after `wait`.
    pub fn running_after(&mut self, wait: Duration) -> bool {
        let end = Instant::now() + wait;
        while Instant::now() < end {
            if let Some(c) = self.child.as_mut()
                && c.try_wait().unwrap().is_some()
            {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// SIGTERM, then wait for exit: returns the status, later stdout lines and stderr.
    pub fn stop(mut self) -> (ExitStatus, Vec<String>, String) {
        self.signal("TERM");
        self.wait()
    }

    /// Wait (at most 60 s, then kill and fail) for the process to exit: returns the status,
    /// the stdout lines after the readiness line, and stderr.
    pub fn wait(&mut self) -> (ExitStatus, Vec<String>, String) {
        let mut child = self.child.take().expect("process already waited for");
        let end = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > end {
                let _ = child.kill();
                panic!("server process did not exit within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let mut rest = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            rest.push(l);
        }
        (status, rest, err)
    }
}

impl Drop for ReadyProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An old/new image pair of `new_blocks` 4 KiB blocks (at least 256) written as `old.img` and
/// `new.img` in `dir`, whose difference a COW expresses with every op type: shifted runs
/// (COPY, in both directions), a one-byte edit (XOR), zeroed blocks (ZERO) and fresh data
/// (REPLACE). The old image is 256 blocks; a different `new_blocks` makes a growing or
/// shrinking update (blocks past 256 are fresh data).
pub fn image_pair(dir: &Path, new_blocks: usize) -> (PathBuf, PathBuf) {
    let bs = 4096;
    let n = 256;
    let mut old = vec![0u8; n * bs];
    for (i, b) in old.iter_mut().enumerate() {
        let blk = i / bs;
        *b = if blk % 5 == 4 {
            0
        } else {
            ((i * 7 + blk * 13) % 251) as u8 ^ (blk as u8)
        };
    }
    let mut new = old.clone();
    new.copy_within(10 * bs..60 * bs, 12 * bs); // shift up
    new.copy_within(100 * bs..120 * bs, 98 * bs); // shift down
    new[150 * bs + 3] ^= 0xff; // small edit -> XOR
    new[200 * bs..205 * bs].fill(0);
    for (i, b) in new[220 * bs..230 * bs].iter_mut().enumerate() {
        *b = (i as u64).wrapping_mul(0x9e37_79b9) as u8;
    }
    new.resize(new_blocks.max(231) * bs, 0);
    if new_blocks > n {
        new[n * bs..].copy_from_slice(&pattern((new_blocks - n) * bs, 77));
    }
    let (o, nw) = (dir.join("old.img"), dir.join("new.img"));
    std::fs::write(&o, &old).unwrap();
    std::fs::write(&nw, &new).unwrap();
    (o, nw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_seed_and_position() {
        let a = pattern(4096, 1);
        assert_eq!(a.len(), 4096);
        assert_eq!(a, pattern(4096, 1));
        assert_ne!(a, pattern(4096, 2));
        assert_ne!(a[..8], a[8..16]);
        assert_eq!(pattern(13, 1), a[..13]);
    }

    #[test]
    fn temp_dir_is_removed_on_drop() {
        let d = TempDir::new("testsupport");
        let (p, data) = write_image(d.path(), "x", 100, 3);
        assert_file_eq(&p, &data, "image");
        let kept = d.0.clone();
        drop(d);
        assert!(!kept.exists());
    }

    #[test]
    #[should_panic(expected = "first difference at Some(0)")]
    fn assert_file_eq_fails_on_difference() {
        let d = TempDir::new("testsupport-eq");
        let (p, _) = write_image(d.path(), "x", 100, 3);
        assert_file_eq(&p, &pattern(100, 4), "image");
    }

    #[test]
    fn missing_tool_fails() {
        let r = std::panic::catch_unwind(|| tool("snapblk-no-such-tool", &[]));
        assert!(r.is_err());
    }

    #[test]
    fn ready_process_reads_the_ready_line_and_stops() {
        let mut sh = Command::new("sh");
        sh.args([
            "-c",
            r#"trap 'echo "{\"event\":\"stopped\"}"; exit 0' TERM; echo '{"event":"ready","uri":"x"}'; while :; do sleep 0.05; done"#,
        ]);
        let p = ReadyProcess::spawn(&mut sh).unwrap();
        assert_eq!(p.ready_str("uri"), "x");
        let (st, rest, _) = p.stop();
        assert!(st.success());
        assert_eq!(rest, vec![r#"{"event":"stopped"}"#.to_owned()]);
    }

    #[test]
    fn ready_process_rejects_other_first_lines() {
        let mut sh = Command::new("sh");
        sh.args(["-c", r#"echo '{"event":"error"}'"#]);
        let e = ReadyProcess::spawn(&mut sh).err().unwrap();
        assert!(e.contains("unexpected first line"), "{e}");
        let mut sh = Command::new("sh");
        sh.args(["-c", "echo oops >&2; exit 3"]);
        let e = ReadyProcess::spawn(&mut sh).err().unwrap();
        assert!(e.contains("oops"), "{e}");
    }
}
