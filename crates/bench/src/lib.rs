//! snapblk-bench: a fio/IOzone-class load generator over snapblk devices.
//!
//! * [`spec`] describes workloads the way fio does (`rw`, `bs`, `iodepth`, `numjobs`, `size`,
//!   `runtime`, `ramp_time`, `verify`), from flags or a TOML job file, and expands sweeps;
//! * [`engine`] runs a workload on any [`snapblk_core::Queue`]: one queue per job thread, each
//!   keeping `iodepth` requests in flight with `enqueue` + `do_io`, recording every latency in a
//!   mergeable HDR histogram plus a per-second series;
//! * [`target`] opens what to measure: a snapblk device spec, a path, or any libblkio
//!   implementation loaded at run time ([`capi`]);
//! * [`fileio`] holds IOzone-style file tests and the ext2-over-flash 1 KiB overwrite test,
//!   [`fgbg`] the foreground-under-background test;
//! * [`report`] turns results into a table and a versioned JSON document (with [`context`]:
//!   kernel, scheduler, read_ahead_kb, cache state), [`plot`] into SVG charts.

pub mod capi;
pub mod context;
pub mod engine;
pub mod fgbg;
pub mod fileio;
pub mod hist;
pub mod pattern;
pub mod plot;
pub mod report;
pub mod rng;
pub mod spec;
pub mod target;
pub mod verify;

pub use engine::{JobResult, RunResult, run_workload};
pub use spec::{JobSpec, RwMode, Sweep};

/// Errors of the benchmark engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid job: {0}")]
    Spec(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("device error: {0}")]
    Dev(#[from] snapblk_core::Error),
    #[error("{0}")]
    Verify(String),
    #[error("job file: {0}")]
    JobFile(String),
    #[error("libblkio: {0}")]
    Lib(String),
    #[error("{0}")]
    Other(String),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;
