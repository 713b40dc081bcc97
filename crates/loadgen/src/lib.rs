//! snapblk-loadgen: a fio/IOzone-class load generator over snapblk devices.
//!
//! * A [`JobSpec`] describes a workload the way fio does (`rw`, `bs`, `iodepth`, `numjobs`,
//!   `size`, `runtime`, `ramp_time`, `verify`), from flags, a TOML job file
//!   ([`parse_job_file`]) or a fio job file ([`parse_fio_job_file`], with fio's
//!   `ioengine`/`filename` mapped to a device spec by [`FioTarget`]); a [`Sweep`] expands sweeps;
//! * write buffers are filled like fio does ([`BufferOpts`]: random, scrambled per write;
//!   optional refill and compressible share);
//! * [`run_workload`] runs a workload on any [`snapblk_core::Queue`]: one queue per job thread,
//!   each keeping `iodepth` requests in flight with `enqueue` + `do_io`, recording every latency
//!   in a mergeable HDR histogram ([`LatHist`]) plus a per-second series; [`run_matrix`] runs
//!   sweeps and repetitions;
//! * a [`Target`] opens what to measure: a snapblk device spec ([`SpecTarget`]), a path
//!   ([`BlkioTarget`]), or any libblkio implementation loaded at run time
//!   ([`LibblkioTarget`]);
//! * [`Document`] and [`ConfigReport`] turn results into a table and a versioned JSON document
//!   (checked by [`validate`]) with the machine's [`Context`] (kernel, scheduler,
//!   read_ahead_kb, cache state, from [`capture`]).
//!
//! Modules are private and the API is re-exported here, except three namespaces whose names
//! read right only under them:
//! * [`fileio`]: the IOzone-style file tests and the ext2-over-flash 1 KiB overwrite test, a
//!   benchmark of its own (its `open`, `evict`, `Cell`, `TestFile`);
//! * [`fgbg`]: the foreground-under-background test (`Background`, `Foreground`,
//!   `emergency_cleanup`);
//! * [`plot`]: SVG charts of results (`write_all`, `Axis`, `Series`).

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod buffer;
mod capi;
mod context;
mod engine;
pub mod fgbg;
pub mod fileio;
mod fio;
mod hist;
mod pattern;
pub mod plot;
mod report;
mod schema;
mod spec;
mod target;
mod verify;

pub use buffer::BufferOpts;
pub use capi::LibblkioTarget;
pub use context::{CacheState, Context, TargetContext, capture};
pub use engine::{DirStats, JobResult, RunOpts, RunResult, Second, run_workload};
pub use fio::{FioJobFile, FioTarget, parse_fio_bs, parse_fio_job_file};
pub use hist::LatHist;
pub use report::{
    ConfigReport, DirReport, Document, LatKind, LatReport, RunReport, SecondReport, Spread,
    Summary, TargetDesc, Tool, fmt_count, noise_warnings, signal_name, text_table, workload_table,
};
pub use schema::{SchemaError, validate};
pub use spec::{
    BatchOpts, Iomem, JobSpec, RwMode, Sweep, fmt_size, number_error, parse_job_file, parse_list,
    parse_secs, parse_size,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
pub use target::{Alignment, BlkioTarget, Device, SpecTarget, Target};

/// Errors of the benchmark engine.
///
/// The cause of an error is its `source`, never part of its message: a one-line report of the
/// chain (`{:#}`) names each cause once. The `String` variants are the engine's own words
/// (what is wrong with a job, why a run cannot go on), never another error's text.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A job that cannot run: a bad flag, value or combination.
    #[error("invalid job: {0}")]
    Spec(String),
    /// A job whose size (`bs`, `size`, `offset`, a file test size) does not parse.
    #[error("invalid job")]
    Size(#[source] snapblk_core::SizeError),
    /// An I/O error outside any file the run names (the source).
    #[error("I/O error")]
    Io(#[from] std::io::Error),
    /// An I/O error on something the run names: `what` is the file, directory or command.
    #[error("{what}")]
    IoOn {
        /// The file, directory or command, as the user named it.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A device call (property, queue, memory region) failed; the device's error is the
    /// source.
    #[error("device error")]
    Dev(#[from] snapblk_core::Error),
    /// The target could not be opened from its device spec.
    #[error("open {spec}")]
    Open {
        /// The device spec as given.
        spec: String,
        /// Why the facade could not open it.
        #[source]
        source: snapblk_core::Error,
    },
    /// A request the target completed with an error.
    #[error("{op} of {len} bytes at offset {offset} failed")]
    Request {
        /// The operation (`read`, `write`).
        op: &'static str,
        /// The request's length in bytes.
        len: u64,
        /// The request's byte offset on the target.
        offset: u64,
        /// The completion's error.
        #[source]
        source: snapblk_core::Error,
    },
    /// Blocks read back are not what the run wrote; `errors` describes the first ones.
    #[error("verify failed: {bad} of {checked} blocks bad in job {job}; {}", .errors.join("; "))]
    Verify {
        /// The job (0-based thread index) that read them.
        job: u32,
        /// Blocks whose contents were wrong.
        bad: u64,
        /// Blocks checked.
        checked: u64,
        /// What was wrong with the first bad blocks (block number and finding).
        errors: Vec<String>,
    },
    /// A job file whose contents are wrong.
    #[error("job file: {0}")]
    JobFile(String),
    /// A job file that is not TOML.
    #[error("job file")]
    JobFileSyntax(#[source] toml::de::Error),
    /// A foreground read list that cannot be read.
    #[error("--fg-list {}", .path.display())]
    List {
        /// The list file.
        path: std::path::PathBuf,
        /// Where and why its parse failed.
        #[source]
        source: snapblk_readahead::ParseError,
    },
    /// A background stream ended while the foreground ran loaded; `how` is "failed" (the error
    /// is the source), "stopped" or "panicked".
    #[error(
        "background stream on {} ended during the loaded cell (after {after_secs:.2} s): {how}",
        .path.display()
    )]
    BackgroundEnded {
        /// The file or device the stream read or wrote.
        path: std::path::PathBuf,
        /// Seconds into the loaded cell when it was found ended.
        after_secs: f64,
        /// `"failed"`, `"stopped"` or `"panicked"`.
        how: &'static str,
        /// The stream's error, when it failed.
        #[source]
        source: Option<Box<Error>>,
    },
    /// A libblkio library that does not do what the engine needs.
    #[error("libblkio: {0}")]
    Lib(String),
    /// A libblkio library that cannot be loaded, or lacks `symbol`.
    #[error("libblkio {}{}", .path.display(), .symbol.map(|s| format!(": missing {s}")).unwrap_or_default())]
    LibLoad {
        /// The shared library's path.
        path: std::path::PathBuf,
        /// The `blkio_*` symbol it lacks; `None` when the library itself did not load.
        symbol: Option<&'static str>,
        /// The loader's error.
        #[source]
        source: libloading::Error,
    },
    /// A libblkio call failed: `msg` is the library's `blkio_get_error_msg()`, the source the
    /// errno it returned.
    #[error("libblkio: {call}: {msg}")]
    LibCall {
        /// The call, without its `blkio_` prefix (e.g. `connect`, `set_int num-queues`).
        call: String,
        /// The library's `blkio_get_error_msg()` after the call (may be empty).
        msg: String,
        /// The errno the call returned.
        #[source]
        source: std::io::Error,
    },
    /// A run that cannot go on, in the engine's words.
    #[error("{0}")]
    Other(String),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

/// Whether every job only reads: no write mode, and no verify (whose read jobs write the
/// region first). Such a run can open its target read-only.
pub fn jobs_read_only(jobs: &[JobSpec]) -> bool {
    jobs.iter()
        .all(|j| j.rw.read_pct(j.rwmixread) == 100 && !j.verify)
}

/// `direct` on a target that cannot honour it ([`target::Target::direct_supported`] false, e.g.
/// `null:` or `snapshot:` specs): the jobs run without O_DIRECT, so they are recorded with
/// `direct: false`, and the returned warning says why. None when nothing changed.
pub fn effective_direct(target: &dyn target::Target, jobs: &mut [JobSpec]) -> Option<String> {
    if target.direct_supported() || !jobs.iter().any(|j| j.direct) {
        return None;
    }
    for j in jobs.iter_mut() {
        j.direct = false;
    }
    Some(format!(
        "--direct ignored: {} has no file of its own to open with O_DIRECT (only targets with \
         a path do); results are recorded as direct: false",
        target.describe()
    ))
}

/// Before any I/O of a sweep: open the target once with O_DIRECT (if any job asks for it) and
/// check every direct job's `bs`, `offset` and `size` against the alignment it reports, so a
/// bad value late in a sweep does not fail it halfway. (Every run checks its own job again
/// when it opens the target.)
pub fn check_direct_alignment(target: &mut dyn target::Target, jobs: &[JobSpec]) -> Result<()> {
    if !jobs.iter().any(|j| j.direct) {
        return Ok(());
    }
    let align = target.open(1, true)?.alignment();
    jobs.iter()
        .filter(|j| j.direct)
        .try_for_each(|j| j.check_alignment(&align))
}

/// Run every configuration `repeat` times, interleaved (rep 1 of all configs, then rep 2, …) so
/// slow drifts of the machine spread over all configurations instead of biasing one; `progress`
/// hears each run start and end ([`RunProgress`]), `on_run` is called after each run (for
/// progress/diagnostics).
///
/// Setting `stop` (e.g. on SIGINT) ends the current run early — its I/Os so far are counted —
/// and runs nothing more; configurations that never ran are left out of the result.
pub fn run_matrix(
    target: &mut dyn target::Target,
    jobs: &[JobSpec],
    repeat: u32,
    progress: Option<&dyn Fn(RunProgress)>,
    stop: Option<Arc<AtomicBool>>,
    on_run: impl FnMut(u32, &JobSpec, &RunResult),
) -> Result<Vec<report::ConfigReport>> {
    let mut t = [Labelled {
        label: None,
        target,
    }];
    run_matrix_on(&mut t, jobs, repeat, progress, stop, on_run)
}

/// A run of a matrix starting or ending, for a progress display (the caller draws it: the
/// CLI shows a spinner with the live IOPS).
pub enum RunProgress {
    /// A run starts: `label` names it (`[rep/repeat] job`), `completed` counts its completed
    /// I/Os while it runs.
    Start {
        /// The run's label.
        label: String,
        /// Completed I/Os of the run so far, updated as they complete.
        completed: Arc<AtomicU64>,
    },
    /// The run has ended (also when it failed).
    End,
}

/// One of several targets compared in one run, e.g. two libblkio implementations.
pub struct Labelled<'a> {
    /// Leads the labels of its configurations (`"LABEL: randread bs=4k …"`); None for a single
    /// unlabelled target.
    pub label: Option<String>,
    /// The target to run every configuration on.
    pub target: &'a mut dyn target::Target,
}

/// The job as run on a labelled target: its label (and name) led by the target's.
fn labelled_job(label: Option<&str>, job: &JobSpec) -> JobSpec {
    let Some(l) = label else { return job.clone() };
    JobSpec {
        name: if job.named {
            format!("{l}: {}", job.name)
        } else {
            l.to_string()
        },
        named: true,
        ..job.clone()
    }
}

/// [`run_matrix`] over several targets: every configuration runs on every target, all
/// interleaved (rep 1 of config 1 on each target, then config 2 on each, …, then rep 2), so
/// the targets are compared under the same machine conditions. Results come per
/// configuration, one per target, labelled by the target's label.
pub fn run_matrix_on(
    targets: &mut [Labelled<'_>],
    jobs: &[JobSpec],
    repeat: u32,
    progress: Option<&dyn Fn(RunProgress)>,
    stop: Option<Arc<AtomicBool>>,
    mut on_run: impl FnMut(u32, &JobSpec, &RunResult),
) -> Result<Vec<report::ConfigReport>> {
    for t in targets.iter_mut() {
        check_direct_alignment(&mut *t.target, jobs)?;
    }
    let stopped = || stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed));
    // (target index, job as run there), grouped by configuration.
    let cells: Vec<(usize, JobSpec)> = jobs
        .iter()
        .flat_map(|j| {
            targets
                .iter()
                .enumerate()
                .map(move |(ti, t)| (ti, labelled_job(t.label.as_deref(), j)))
        })
        .collect();
    let mut runs: Vec<Vec<RunResult>> = cells.iter().map(|_| Vec::new()).collect();
    'reps: for rep in 0..repeat.max(1) {
        for (i, (ti, job)) in cells.iter().enumerate() {
            let target = &mut *targets[*ti].target;
            if stopped() {
                break 'reps;
            }
            let completed = progress.map(|p| {
                let completed = Arc::new(AtomicU64::new(0));
                p(RunProgress::Start {
                    label: format!("[{}/{}] {}", rep + 1, repeat.max(1), job.label()),
                    completed: completed.clone(),
                });
                completed
            });
            let opts = engine::RunOpts {
                progress: completed,
                stop: stop.clone(),
            };
            let r = run_workload(target, job, &opts);
            if let Some(p) = progress {
                p(RunProgress::End);
            }
            let r = r?;
            on_run(rep, job, &r);
            runs[i].push(r);
        }
    }
    Ok(cells
        .iter()
        .zip(&runs)
        .filter(|(_, r)| !r.is_empty())
        .map(|((ti, j), r)| {
            let mut c = report::ConfigReport::of(j, r);
            let t = &targets[*ti];
            if let Some(l) = &t.label {
                c.library = Some(l.clone());
                c.target = Some(report::TargetDesc {
                    spec: t.target.describe(),
                    driver: t.target.driver(),
                });
            }
            c
        })
        .collect())
}

#[cfg(test)]
mod error_tests {
    use super::Error;
    use snapblk_testsupport::errors::{assert_cause_is_source, chain};

    #[test]
    fn every_wrapping_variant_keeps_its_cause_as_source_only() {
        let io = || std::io::Error::from_raw_os_error(libc::ENOENT);
        let dev = || snapblk_core::Error::new(libc::EIO, "short read");
        let toml_err = "x = ".parse::<toml::Table>().unwrap_err();
        let list_err = snapblk_readahead::parse_bytes(b"\n{\n", Default::default()).unwrap_err();
        // SAFETY: the path does not exist, so no library (and none of its initialisers) loads.
        let lib_err = match unsafe { libloading::Library::new("/nonexistent/libblkio.so") } {
            Err(e) => e,
            Ok(_) => panic!("a missing library loaded"),
        };
        let cases = [
            Error::Size(snapblk_core::SizeError::BadNumber("4x".into())),
            Error::from(io()),
            Error::IoOn {
                what: "directory /x".into(),
                source: io(),
            },
            Error::from(dev()),
            Error::Open {
                spec: "null:size=1M".into(),
                source: dev(),
            },
            Error::Request {
                op: "read",
                len: 4096,
                offset: 8192,
                source: dev(),
            },
            Error::JobFileSyntax(toml_err),
            Error::List {
                path: "a.list".into(),
                source: list_err,
            },
            Error::BackgroundEnded {
                path: "/dev/x".into(),
                after_secs: 1.5,
                how: "failed",
                source: Some(Box::new(Error::from(io()))),
            },
            Error::LibLoad {
                path: "/nonexistent/libblkio.so".into(),
                symbol: None,
                source: lib_err,
            },
            Error::LibCall {
                call: "connect".into(),
                msg: "no such device".into(),
                source: io(),
            },
        ];
        for e in &cases {
            assert_cause_is_source(e, None);
        }
        assert_eq!(chain(&cases[0]), "invalid job: bad size \"4x\"");
        assert_eq!(
            chain(&cases[5]),
            "read of 4096 bytes at offset 8192 failed: short read"
        );
        assert_eq!(
            chain(&cases[8]),
            "background stream on /dev/x ended during the loaded cell (after 1.50 s): failed: \
             I/O error: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_verify_failure_keeps_its_counts() {
        let e = Error::Verify {
            job: 2,
            bad: 1,
            checked: 64,
            errors: vec!["block 3: stale".into()],
        };
        assert_eq!(
            e.to_string(),
            "verify failed: 1 of 64 blocks bad in job 2; block 3: stale"
        );
    }
}
