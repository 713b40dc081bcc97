//! The arguments of `snapblk residency` and `snapblk readahead`: clap definitions, the value
//! parsers of their options, and [`ReplayOpts::options`], which turns them into the library's
//! [`ReplayOptions`].

use clap::{Args, Subcommand, ValueEnum};
use snapblk_readahead::{IoPrio, Method, ReplayOptions, WalkOptions};
use std::path::PathBuf;
use std::time::Duration;

/// The trees `residency`, `readahead warm` and `readahead evict` walk.
#[derive(Args)]
pub struct PathArgs {
    /// Files or directories.
    #[arg(required = true)]
    pub(super) paths: Vec<PathBuf>,
    /// Recurse into directories.
    #[arg(short, long)]
    pub(super) recursive: bool,
    /// Do not cross filesystem boundaries while recursing.
    #[arg(short = 'x', long)]
    pub(super) one_file_system: bool,
    /// Follow symlinks inside directories to files and directories (vmtouch -f); each
    /// directory is entered once, dangling links are skipped. Named paths are always followed.
    #[arg(short = 'f', long)]
    pub(super) follow_symlinks: bool,
}

impl PathArgs {
    /// Walk options for these paths; `threads` walkers (default: 2 x CPUs).
    pub(super) fn walk_opts(&self, threads: Option<usize>) -> WalkOptions {
        let mut w = WalkOptions {
            recursive: self.recursive,
            one_file_system: self.one_file_system,
            follow_symlinks: self.follow_symlinks,
            ..Default::default()
        };
        if let Some(t) = threads {
            w.threads = t.max(1);
        }
        w
    }
}

#[derive(Args)]
pub struct ResidencyArgs {
    #[command(flatten)]
    pub(super) walk: PathArgs,
    /// Only print the total.
    #[arg(short, long)]
    pub(super) summary: bool,
    /// Per-file residency bars even when stdout is not a terminal.
    #[arg(short, long)]
    pub(super) verbose: bool,
    /// Walker threads, 1-256 (default: 2 x CPUs).
    #[arg(long, value_parser = parse_threads)]
    pub(super) threads: Option<usize>,
    /// One JSON document on stdout.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Subcommand)]
pub enum ReadaheadCmd {
    /// Record what a command (or a time window) brings into the page cache, as a list.
    Record(RecordArgs),
    /// Bring the ranges of a list into the page cache and verify they are resident.
    Replay(ReplayArgs),
    /// Like replay, for whole files under PATHs (no list needed).
    Warm(WarmArgs),
    /// Drop files from the page cache (fdatasync, then POSIX_FADV_DONTNEED).
    Evict(EvictArgs),
    /// Lock files' pages in memory (mlock, like vmtouch -l) until SIGTERM or SIGINT.
    Lock(LockArgs),
}

#[derive(Clone, Copy, ValueEnum)]
pub(super) enum ListFormat {
    Text,
    Jsonl,
}

#[derive(Args)]
pub struct RecordArgs {
    /// Output list (".jsonl" selects JSON Lines unless --format says otherwise).
    #[arg(short, long)]
    pub(super) output: PathBuf,
    /// List format: text (one file and its ranges per line) or jsonl (JSON Lines).
    #[arg(long, value_enum)]
    pub(super) format: Option<ListFormat>,
    /// Trees to snapshot (repeatable; default "/"; pseudo filesystems are skipped). Made
    /// absolute, so the list does not depend on the working directory; must exist.
    #[arg(long = "scope", value_name = "PATH")]
    pub(super) scopes: Vec<PathBuf>,
    /// Evict the scope first so the recording starts cold and sees every read. Needs an
    /// explicit --scope (it would otherwise evict every disk filesystem).
    #[arg(long)]
    pub(super) evict_first: bool,
    /// Also trace the kernel's page-cache insertions during the window (tracefs event
    /// filemap:mm_filemap_add_to_page_cache, as Android's prefetch and iorap do; needs root):
    /// lists pages the residency diff cannot see, e.g. read and reclaimed again where a
    /// shadow entry already was. Files on btrfs or overlayfs cannot be matched to the trace
    /// (its events name another device and inode than stat does): their entries come from the
    /// diff alone, counted in the JSON's trace.untraceable_files and in a warning.
    #[arg(long)]
    pub(super) trace: bool,
    /// Record a time window instead of a command.
    #[arg(long, value_name = "SECS", conflicts_with = "cmd", value_parser = parse_duration)]
    pub(super) duration: Option<f64>,
    /// Print a JSON summary on stdout; the command's own stdout then goes to stderr, so
    /// stdout is exactly one JSON document.
    #[arg(long)]
    pub(super) json: bool,
    /// The command to run (after --).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub(super) cmd: Vec<std::ffi::OsString>,
}

#[derive(Args, Clone)]
pub struct ReplayOpts {
    /// readahead (readahead(2)), fadvise (WILLNEED), pread (synchronous reads) or uring
    /// (io_uring reads; completion = resident, no settle wait).
    #[arg(long, value_enum, default_value = "readahead")]
    pub(super) method: MethodArg,
    /// Bytes per request (K/M/G suffixes); keep it below the kernel's readahead clip.
    /// (default 2M; 512K with --background)
    #[arg(long, value_parser = parse_chunk)]
    pub(super) chunk: Option<u64>,
    /// Requests issued concurrently: submitter threads for readahead/fadvise/pread, reads in
    /// flight per thread for uring.
    #[arg(long, short = 'q', default_value_t = 4, value_parser = parse_threads)]
    pub(super) queue_depth: usize,
    /// Submitter threads (default: the queue depth, or 2 for uring).
    #[arg(long, value_parser = parse_threads)]
    pub(super) threads: Option<usize>,
    /// readahead/fadvise: chunks per thread allowed in flight before waiting for the oldest to
    /// complete (0 = unbounded; default 0, or 1 with --background so the foreground is not
    /// queued behind the replay).
    #[arg(long)]
    pub(super) max_inflight: Option<usize>,
    /// Issue ranges even when already resident.
    #[arg(long)]
    pub(super) no_skip_resident: bool,
    /// I/O priority: idle, be[:0-7], rt[:0-7] or none (inherit).
    #[arg(long, default_value = "idle", value_parser = parse_ioprio)]
    pub(super) ioprio: IoPrioArg,
    /// Nice value for the replay threads, or "none".
    #[arg(long, default_value = "10", value_parser = parse_nice)]
    pub(super) nice: NiceArg,
    /// Pause issuing while other tasks' I/O stall exceeds this percentage: the system-wide
    /// "some" stall (/proc/pressure/io, sampled every 50 ms), all of it when others read from
    /// the replayed files' disks meanwhile, else minus the replay threads' own; 0 disables. A pause lasts until the stall drops, at most 5 s; then each submitter
    /// issues one request and checks again, so under sustained pressure the replay crawls
    /// (about one request per thread every 5 s). The progress bar and the report say how
    /// often and how long it paused.
    #[arg(long, default_value_t = 60.0, value_parser = parse_pct)]
    pub(super) psi_threshold: f64,
    /// Longest wait for in-flight reads to finish before verifying, in seconds (at most 3600).
    #[arg(long, default_value_t = 10.0, value_parser = parse_settle)]
    pub(super) settle_timeout: f64,
    /// Extra passes for ranges still missing at verification (0-100).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub(super) retries: u32,
    /// Also replay entries whose file identity changed (they are reported either way).
    #[arg(long)]
    pub(super) allow_stale: bool,
    /// Show /proc/diskstats of the devices holding the files, before and after the replay,
    /// and the difference (reads, sectors read, read ms, in flight, writes).
    #[arg(long)]
    pub(super) diskstats: bool,
    /// Exit non-zero unless at least this percentage (0-100) of the requested bytes ends up
    /// resident and of the entries was replayed; a replay with nothing verifiable always fails.
    #[arg(long, value_name = "PCT", value_parser = parse_pct)]
    pub(super) require: Option<f64>,
    /// Detach and return at once (like an init service); the report goes to --log.
    #[arg(long)]
    pub(super) background: bool,
    /// Where a --background replay writes its report (default: discarded).
    #[arg(long, requires = "background")]
    pub(super) log: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(super) json: bool,
    // Hidden, for tests: stand-ins for the kernel files the pressure back-off reads, so an
    // end-to-end test can show the back-off a fake stall without loading the machine.
    /// For tests: a file in /proc/pressure/io format, read instead of it.
    #[arg(long, hide = true, value_name = "PATH")]
    pub(super) psi_file: Option<PathBuf>,
    /// For tests: a file in /proc/diskstats format, read by the back-off instead of it.
    #[arg(long, hide = true, value_name = "PATH")]
    pub(super) diskstats_file: Option<PathBuf>,
    /// For tests: a file in /proc/self/io format, read by the back-off instead of it.
    #[arg(long, hide = true, value_name = "PATH")]
    pub(super) self_io_file: Option<PathBuf>,
}

#[derive(Args)]
pub struct ReplayArgs {
    /// The list (text v1, JSON Lines or classic block list; "-" for stdin).
    pub(super) list: PathBuf,
    #[command(flatten)]
    pub(super) opts: ReplayOpts,
}

#[derive(Args)]
pub struct WarmArgs {
    #[command(flatten)]
    pub(super) walk: PathArgs,
    #[command(flatten)]
    pub(super) opts: ReplayOpts,
}

#[derive(Args)]
pub struct EvictArgs {
    #[command(flatten)]
    pub(super) walk: PathArgs,
    /// One JSON document on stdout.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args)]
pub struct LockArgs {
    #[command(flatten)]
    pub(super) walk: PathArgs,
    /// Lock with one mlockall(2) after mapping every file (vmtouch -L) instead of an mlock(2)
    /// per file (vmtouch -l).
    #[arg(long)]
    pub(super) mlockall: bool,
    /// Return once the pages are locked, leaving a detached process holding them (vmtouch -d
    /// with -w); it prints its pid. Stop it with SIGTERM.
    #[arg(long)]
    pub(super) daemon: bool,
    /// Write the pid of the process holding the lock to FILE (vmtouch -P); removed when it
    /// stops.
    #[arg(long, value_name = "FILE")]
    pub(super) pid_file: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
pub(super) enum MethodArg {
    Readahead,
    Fadvise,
    Pread,
    Uring,
}

#[derive(Clone, Copy)]
pub(super) struct IoPrioArg(pub(super) Option<IoPrio>);

#[derive(Clone, Copy)]
pub(super) struct NiceArg(pub(super) Option<i32>);

/// A size in the grammar every snapblk command shares (`snapblk_core::parse_size`), at least 4 KiB.
fn parse_size(s: &str) -> Result<u64, String> {
    let v = snapblk_core::parse_size(s).map_err(|e| e.to_string())?;
    if v < 4096 {
        return Err("size must be at least 4K".into());
    }
    Ok(v)
}

fn parse_chunk(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    // Buffers of this size are allocated per in-flight read (pread, uring).
    if v > 256 << 20 {
        return Err("chunk must be at most 256M".into());
    }
    Ok(v)
}

/// A finite number in `0..=max` (`what` names it in the error).
fn parse_bounded(s: &str, max: f64, what: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !v.is_finite() || !(0.0..=max).contains(&v) {
        return Err(format!("{what} must be between 0 and {max}"));
    }
    Ok(v)
}

fn parse_pct(s: &str) -> Result<f64, String> {
    parse_bounded(s, 100.0, "a percentage")
}

fn parse_settle(s: &str) -> Result<f64, String> {
    parse_bounded(s, 3600.0, "seconds")
}

/// A recording window: up to a week.
fn parse_duration(s: &str) -> Result<f64, String> {
    parse_bounded(s, 7.0 * 86400.0, "seconds")
}

/// Threads and queue depths: 1-256 (the submitters and io_uring slots are capped there).
fn parse_threads(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=256).contains(&n) => Ok(n),
        _ => Err("expected a number from 1 to 256".into()),
    }
}

fn parse_ioprio(s: &str) -> Result<IoPrioArg, String> {
    let (class, level) = s.split_once(':').unwrap_or((s, "4"));
    let level: u8 = level
        .parse()
        .ok()
        .filter(|l| *l <= 7)
        .ok_or("level must be 0-7")?;
    Ok(IoPrioArg(match class {
        "idle" => Some(IoPrio::Idle),
        "be" => Some(IoPrio::BestEffort(level)),
        "rt" => Some(IoPrio::RealTime(level)),
        "none" => None,
        _ => return Err("expected idle, be[:N], rt[:N] or none".into()),
    }))
}

fn parse_nice(s: &str) -> Result<NiceArg, String> {
    if s == "none" {
        return Ok(NiceArg(None));
    }
    let n: i32 = s.parse().map_err(|_| "expected -20..19 or none")?;
    if !(-20..=19).contains(&n) {
        return Err("nice must be -20..19".into());
    }
    Ok(NiceArg(Some(n)))
}

impl ReplayOpts {
    /// The library's options for these arguments.
    pub fn options(&self) -> ReplayOptions {
        let o = self;
        ReplayOptions {
            method: match o.method {
                MethodArg::Readahead => Method::Readahead,
                MethodArg::Fadvise => Method::Fadvise,
                MethodArg::Pread => Method::Pread,
                MethodArg::Uring => Method::Uring,
            },
            chunk: o
                .chunk
                .unwrap_or(if o.background { 512 << 10 } else { 2 << 20 }),
            queue_depth: o.queue_depth.max(1),
            threads: o.threads.map(|t| t.max(1)),
            max_inflight: Some(o.max_inflight.unwrap_or(if o.background { 1 } else { 0 }))
                .filter(|n| *n > 0),
            skip_resident: !o.no_skip_resident,
            ioprio: o.ioprio.0,
            nice: o.nice.0,
            psi_threshold: (o.psi_threshold > 0.0).then_some(o.psi_threshold / 100.0),
            psi_path: o
                .psi_file
                .clone()
                .unwrap_or_else(|| PathBuf::from(snapblk_readahead::PSI_IO)),
            diskstats_path: o
                .diskstats_file
                .clone()
                .unwrap_or_else(|| PathBuf::from("/proc/diskstats")),
            self_io_path: o
                .self_io_file
                .clone()
                .unwrap_or_else(|| PathBuf::from("/proc/self/io")),
            // Bounded by parse_settle; the clamp also maps a NaN that bypassed it to 0 rather
            // than letting from_secs_f64 panic.
            settle_timeout: Duration::try_from_secs_f64(o.settle_timeout.clamp(0.0, 3600.0))
                .unwrap_or_default(),
            retries: o.retries,
            allow_stale: o.allow_stale,
            diskstats: o.diskstats,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_priorities() {
        assert_eq!(parse_size("2M").unwrap(), 2 << 20);
        assert_eq!(parse_size("512KiB").unwrap(), 512 << 10);
        assert_eq!(parse_size("8192").unwrap(), 8192);
        assert!(parse_size("1").is_err());
        assert!(parse_size("x").is_err());
        assert!(matches!(
            parse_ioprio("idle").unwrap().0,
            Some(IoPrio::Idle)
        ));
        assert!(matches!(
            parse_ioprio("be:2").unwrap().0,
            Some(IoPrio::BestEffort(2))
        ));
        assert!(parse_ioprio("be:9").is_err());
        assert!(parse_nice("none").unwrap().0.is_none());
        assert!(parse_nice("25").is_err());
    }

    #[test]
    fn float_options_are_finite_and_in_range() {
        for bad in ["nan", "NaN", "inf", "-inf", "1e300", "-1", "x", ""] {
            assert!(parse_settle(bad).is_err(), "{bad}");
            assert!(parse_duration(bad).is_err(), "{bad}");
            assert!(parse_pct(bad).is_err(), "{bad}");
        }
        assert!(parse_pct("150").is_err());
        assert!(parse_pct("100.5").is_err());
        assert_eq!(parse_pct("99.5"), Ok(99.5));
        assert_eq!(parse_pct("0"), Ok(0.0));
        assert_eq!(parse_settle("3600"), Ok(3600.0));
        assert!(parse_settle("3601").is_err());
        assert_eq!(parse_duration("1.5"), Ok(1.5));
        assert!(parse_duration("604801").is_err());
        assert_eq!(parse_threads("256"), Ok(256));
        for bad in ["0", "257", "-1", "99999999999999999999999"] {
            assert!(parse_threads(bad).is_err(), "{bad}");
        }
    }
}
