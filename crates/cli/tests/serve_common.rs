//! Helpers shared by the `snapblk serve` tests (included with `#[path]`): the generic ones come
//! from snapblk-testsupport (re-exported, so `use common::*` sees them); this file adds only what
//! needs the `snapblk` binary path, which Cargo gives to this crate's tests alone.

#![allow(dead_code)]

pub use snapblk_testsupport::*;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_snapblk")
}

pub fn golden_dir() -> PathBuf {
    golden::dir()
}

/// Every golden case directory (base.img, snapshot.cow, target.img).
pub fn golden_cases() -> Vec<PathBuf> {
    golden::cases().into_iter().map(|c| c.dir).collect()
}

/// A running `snapblk serve … --json` (the readiness line in `ready`; killed on drop).
pub struct Serve(ReadyProcess);

impl Serve {
    /// Start `snapblk serve ARGS --json` and wait for its readiness line.
    pub fn start(args: &[&str]) -> Serve {
        Self::try_start(args).unwrap_or_else(|e| panic!("snapblk serve {args:?}: {e}"))
    }

    pub fn try_start(args: &[&str]) -> Result<Serve, String> {
        ReadyProcess::spawn(Command::new(bin()).arg("serve").args(args).arg("--json")).map(Serve)
    }

    /// SIGTERM, then wait for exit: returns the status, later stdout lines and stderr.
    pub fn stop(self) -> (ExitStatus, Vec<String>, String) {
        self.0.stop()
    }
}

impl std::ops::Deref for Serve {
    type Target = ReadyProcess;
    fn deref(&self) -> &ReadyProcess {
        &self.0
    }
}

impl std::ops::DerefMut for Serve {
    fn deref_mut(&mut self) -> &mut ReadyProcess {
        &mut self.0
    }
}
