//! Helpers shared by the `snapblk serve` tests (included with `#[path]`): a running server
//! process with its readiness line, temp dirs, external tools (missing tool = failure), and
//! deterministic test images.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_snapblk")
}

pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/aosp-cow")
}

/// Every golden case (a directory with base.img, snapshot.cow, target.img).
pub fn golden_cases() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("golden data present")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("snapshot.cow").exists())
        .collect();
    v.sort();
    assert!(
        v.len() >= 16,
        "expected the 16 golden cases, found {}",
        v.len()
    );
    v
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("snapblk-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
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

/// Position-dependent deterministic bytes.
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

pub fn tool(cmd: &str, args: &[&str]) -> std::process::Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} is required (scripts/install-deps.sh installs it): {e}"))
}

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

/// A running `snapblk serve … --json`.
pub struct Serve {
    child: Option<Child>,
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

impl Serve {
    /// Start `snapblk serve ARGS --json` and wait for its readiness line.
    pub fn start(args: &[&str]) -> Serve {
        Self::try_start(args).unwrap_or_else(|e| panic!("snapblk serve {args:?}: {e}"))
    }

    pub fn try_start(args: &[&str]) -> Result<Serve, String> {
        let mut child = Command::new(bin())
            .arg("serve")
            .args(args)
            .arg("--json")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let lines = read_lines(child.stdout.take().unwrap());
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => {
                let ready: serde_json::Value =
                    serde_json::from_str(&l).map_err(|e| format!("{e}: {l}"))?;
                if ready["event"] != "ready" {
                    return Err(format!("unexpected first line {l}"));
                }
                Ok(Serve {
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

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

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

    pub fn wait(&mut self) -> (ExitStatus, Vec<String>, String) {
        let mut child = self.child.take().unwrap();
        let end = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > end {
                let _ = child.kill();
                panic!("snapblk serve did not exit within 60 s of SIGTERM");
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

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
