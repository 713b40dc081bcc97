//! The driver conformance suite: every check a snapblk driver must pass, run against one started
//! (or connected) [`Blkio`] instance, deciding what to check and how from the device's own
//! properties rather than from what the target is assumed to be.
//!
//! * Buffers are aligned to `request-alignment`, `buf-alignment`, `optimal-buf-alignment` and
//!   `mem-region-alignment`, and allocated with the instance's memory-region API
//!   ([`Blkio::alloc_mem_region`] + [`Blkio::map_mem_region`], as `blkio_alloc_mem_region` /
//!   `blkio_map_mem_region`). The data checks always run once with buffers inside a mapped
//!   region (`/mapped`) and, when `needs-mem-regions` is false, once more with plain private
//!   memory (`/plain`).
//! * `needs-mem-regions = true`: a request whose buffer lies outside every mapped region must
//!   complete at once with `-EFAULT` (libblkio's vhost-user driver hangs instead; the shared
//!   notes on libblkio drivers recommend failing fast), and the device data stays unchanged.
//! * `request-alignment > 1`: an unaligned offset or length fails with `-EINVAL`, or, when the
//!   device is more lenient than it says (tmpfs with O_DIRECT), moves exactly the right bytes.
//! * `read-only = true`: the write checks are replaced by write-refusal checks (`-EBADF`).
//! * `can-grow`: a read across the capacity zero-fills past it (true) or fails with `-EIO`
//!   (false); a growing device must grow when written past its end.
//! * write-zeroes and discard must work, except that `-ENOTSUP` is accepted where
//!   `max-write-zeroes-len` / `max-discard-len` is 0 (the check is then reported as skipped).
//! * multiple queues up to `max-queues` (at most [`Options::queues`]), each from its own thread;
//!   queues added and removed when `can-add-queues`, poll queues when `supports-poll-queues`.
//! * vectored I/O up to `max-segments` iovecs (at most 64), the completion fd, `do_io`'s
//!   argument checks and a backlog of 200 requests, and library-side request errors.
//!
//! Every request waits at most [`Options::timeout`]: a driver that never completes one fails
//! the suite instead of hanging it (the remaining checks are then not run, and the instance and
//! its buffers are leaked, since a request may still use them). Each failure message names the
//! property values that led to it.
//!
//! The suite writes: it destroys the data of the target. [`open_spec`] refuses a writable
//! instance unless told otherwise; the `snapblk-conformance` binary is the command-line face of
//! it.
//!
//! Everything is at the root, except `toy`: an in-memory driver that requires memory regions,
//! to test the suite itself. It is test scaffolding, public only with the `test-utils` feature
//! (which this crate's tests turn on), and keeps its own namespace since its constants (`NAME`,
//! `ALIGN`, `DEFAULT_SIZE`) describe the toy device, not the suite.
#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

#[macro_use]
mod suite;
mod checks;
mod reopen;
#[cfg(any(test, feature = "test-utils"))]
pub mod toy;

pub use reopen::drop_unreaped;
use snapblk_core::Blkio;
use std::fmt;
use std::time::Duration;

/// What the device does with written data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataModel {
    /// Reads return what was written (every real device).
    Stored,
    /// Writes are dropped and reads return zeros (the `null` driver).
    Zeroes,
}

/// Facts the caller knows about the target, checked in addition to the property-driven checks
/// (`None` / `false`: not checked).
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// The `capacity` property.
    pub capacity: Option<u64>,
    /// The `direct` property (file-backed drivers).
    pub direct: Option<bool>,
    /// The `can-grow` property.
    pub can_grow: Option<bool>,
    /// The `read-only` property.
    pub read_only: Option<bool>,
    /// A discarded range reads back as zeros (regular files punch holes).
    pub discard_zeroes: bool,
    /// Write-zeroes with `BLKIO_REQ_NO_FALLBACK` succeeds (rather than failing with ENOTSUP).
    pub write_zeroes_no_fallback: bool,
}

/// How the suite runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The longest wait for any one request.
    pub timeout: Duration,
    /// What the device does with data; `None`: [`DataModel::Zeroes`] for the `null` driver,
    /// [`DataModel::Stored`] for every other.
    pub data: Option<DataModel>,
    /// Caller-known facts about the target.
    pub expect: Expect,
    /// The most queues the suite starts (on a connected instance) and drives from threads.
    pub queues: i32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_secs(10),
            data: None,
            expect: Expect::default(),
            queues: 4,
        }
    }
}

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Passed; the text (possibly empty) says how, where the device had a choice.
    Pass(String),
    /// Failed, with the reason and the property values that led to it.
    Fail(String),
    /// Not applicable to this device, with the property values that say so.
    Skip(String),
}

/// The results of a suite run, in check order.
#[derive(Debug, Clone)]
pub struct Report {
    /// The device's driver and main properties, as one line.
    pub target: String,
    /// `(check name, outcome)` in the order the checks ran.
    pub checks: Vec<(&'static str, Outcome)>,
}

impl Report {
    /// True when no check failed.
    pub fn passed(&self) -> bool {
        self.failed().is_empty()
    }
    /// The names of the failed checks.
    pub fn failed(&self) -> Vec<&'static str> {
        self.names(|o| matches!(o, Outcome::Fail(_)))
    }
    /// The names of the skipped checks.
    pub fn skipped(&self) -> Vec<&'static str> {
        self.names(|o| matches!(o, Outcome::Skip(_)))
    }
    /// Add the outcome of a check run outside [`run`] (such as [`drop_unreaped`]).
    pub fn push(&mut self, name: &'static str, outcome: Outcome) {
        self.checks.push((name, outcome));
    }
    /// The outcome of check `name`, if it is in the report.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.checks.iter().find(|(n, _)| *n == name).map(|(_, o)| o)
    }
    fn names(&self, f: impl Fn(&Outcome) -> bool) -> Vec<&'static str> {
        self.checks
            .iter()
            .filter(|(_, o)| f(o))
            .map(|(n, _)| *n)
            .collect()
    }
}

impl fmt::Display for Report {
    /// `target: ...`, one line per check (`PASS`, `FAIL` or `SKIP`), then a count.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "target: {}", self.target)?;
        let (mut p, mut x, mut s) = (0, 0, 0);
        for (name, o) in &self.checks {
            match o {
                Outcome::Pass(how) if how.is_empty() => {
                    p += 1;
                    writeln!(f, "PASS {name}")?
                }
                Outcome::Pass(how) => {
                    p += 1;
                    writeln!(f, "PASS {name}: {how}")?
                }
                Outcome::Fail(why) => {
                    x += 1;
                    writeln!(f, "FAIL {name}: {why}")?
                }
                Outcome::Skip(why) => {
                    s += 1;
                    writeln!(f, "SKIP {name}: {why}")?
                }
            }
        }
        write!(f, "{p} passed, {x} failed, {s} skipped")
    }
}

/// Run every check against `b`, which must be connected or started. A connected instance is
/// started with `min(max-queues, opts.queues)` queues first.
pub fn run(b: Blkio, opts: &Options) -> Report {
    checks::run(b, opts)
}

/// Why [`open_spec`] did not give an instance.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The spec asks for a writable instance and destructive runs were not allowed.
    #[error("{spec} is writable (read-only=false) and the suite would destroy its data")]
    Destructive {
        /// The device spec.
        spec: String,
    },
    /// Parsing the spec, or creating, configuring or connecting the instance failed.
    #[error("cannot open {spec}")]
    Open {
        /// The device spec.
        spec: String,
        /// What failed.
        #[source]
        source: snapblk_core::Error,
    },
}

/// Open a device spec (the `snapblk` facade's grammar) for the suite, connected but not
/// started. Unless `allow_destructive`, the instance is opened read-only (`read-only=true` is
/// added), and a spec that sets `read-only=false` is refused: the write checks destroy data.
pub fn open_spec(spec: &str, allow_destructive: bool) -> Result<Blkio, OpenError> {
    let open_err = |source| OpenError::Open {
        spec: spec.to_owned(),
        source,
    };
    let mut s = snapblk::parse_spec(spec).map_err(open_err)?;
    if !allow_destructive {
        let ro = s.props.iter().find(|(k, _)| k == "read-only");
        match ro.map(|(_, v)| v.as_str()) {
            None => s.props.push(("read-only".into(), "true".into())),
            Some("true" | "1" | "yes" | "on") => {}
            Some(_) => {
                return Err(OpenError::Destructive {
                    spec: spec.to_owned(),
                });
            }
        }
    }
    snapblk::connect_spec(&s).map_err(open_err)
}
