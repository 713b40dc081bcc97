//! `snapblk residency` and `snapblk readahead {record,replay,warm,evict}`: a thin layer over
//! snapblk-readahead (argument parsing, human/JSON output, `--background`).

use crate::progress::Progress;
use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use snapblk_readahead::list::{self, Extent, Limits, ListEntry, escape_path};
use snapblk_readahead::record::{self, Trigger};
use snapblk_readahead::replay::{self, BackOff, Method, ReplayOptions, ReplayReport};
use snapblk_readahead::residency::Residency;
use snapblk_readahead::sys::IoPrio;
use snapblk_readahead::walk::{WalkError, WalkOptions};
use snapblk_readahead::{evict, scan};
use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The trees `residency`, `readahead warm` and `readahead evict` walk.
#[derive(Args)]
pub struct PathArgs {
    /// Files or directories.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Recurse into directories.
    #[arg(short, long)]
    recursive: bool,
    /// Do not cross filesystem boundaries while recursing.
    #[arg(short = 'x', long)]
    one_file_system: bool,
}

impl PathArgs {
    /// Walk options for these paths; `threads` walkers (default: 2 x CPUs).
    fn walk_opts(&self, threads: Option<usize>) -> WalkOptions {
        let mut w = WalkOptions {
            recursive: self.recursive,
            one_file_system: self.one_file_system,
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
    walk: PathArgs,
    /// Only print the total.
    #[arg(short, long)]
    summary: bool,
    /// Per-file residency bars even when stdout is not a terminal.
    #[arg(short, long)]
    verbose: bool,
    /// Walker threads, 1-256 (default: 2 x CPUs).
    #[arg(long, value_parser = parse_threads)]
    threads: Option<usize>,
    /// One JSON document on stdout.
    #[arg(long)]
    json: bool,
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
}

#[derive(Clone, Copy, ValueEnum)]
enum ListFormat {
    Text,
    Jsonl,
}

#[derive(Args)]
pub struct RecordArgs {
    /// Output list (".jsonl" selects JSON Lines unless --format says otherwise).
    #[arg(short, long)]
    output: PathBuf,
    #[arg(long, value_enum)]
    format: Option<ListFormat>,
    /// Trees to snapshot (repeatable; default "/"; pseudo filesystems are skipped). Made
    /// absolute, so the list does not depend on the working directory; must exist.
    #[arg(long = "scope", value_name = "PATH")]
    scopes: Vec<PathBuf>,
    /// Evict the scope first so the recording starts cold and sees every read. Needs an
    /// explicit --scope (it would otherwise evict every disk filesystem).
    #[arg(long)]
    evict_first: bool,
    /// Also trace the kernel's page-cache insertions during the window (tracefs event
    /// filemap:mm_filemap_add_to_page_cache, as Android's prefetch and iorap do; needs root):
    /// lists pages the residency diff cannot see, e.g. read and reclaimed again where a
    /// shadow entry already was.
    #[arg(long)]
    trace: bool,
    /// Record a time window instead of a command.
    #[arg(long, value_name = "SECS", conflicts_with = "cmd", value_parser = parse_duration)]
    duration: Option<f64>,
    /// Print a JSON summary on stdout; the command's own stdout then goes to stderr, so
    /// stdout is exactly one JSON document.
    #[arg(long)]
    json: bool,
    /// The command to run (after --).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    cmd: Vec<std::ffi::OsString>,
}

#[derive(Args, Clone)]
pub struct ReplayOpts {
    /// readahead (readahead(2)), fadvise (WILLNEED), pread (synchronous reads) or uring
    /// (io_uring reads; completion = resident, no settle wait).
    #[arg(long, value_enum, default_value = "readahead")]
    method: MethodArg,
    /// Bytes per request (K/M/G suffixes); keep it below the kernel's readahead clip.
    /// (default 2M; 512K with --background)
    #[arg(long, value_parser = parse_chunk)]
    chunk: Option<u64>,
    /// Requests issued concurrently: submitter threads for readahead/fadvise/pread, reads in
    /// flight per thread for uring.
    #[arg(long, short = 'q', default_value_t = 4, value_parser = parse_threads)]
    queue_depth: usize,
    /// Submitter threads (default: the queue depth, or 2 for uring).
    #[arg(long, value_parser = parse_threads)]
    threads: Option<usize>,
    /// readahead/fadvise: chunks per thread allowed in flight before waiting for the oldest to
    /// complete (0 = unbounded; default 0, or 1 with --background so the foreground is not
    /// queued behind the replay).
    #[arg(long)]
    max_inflight: Option<usize>,
    /// Issue ranges even when already resident.
    #[arg(long)]
    no_skip_resident: bool,
    /// I/O priority: idle, be[:0-7], rt[:0-7] or none (inherit).
    #[arg(long, default_value = "idle", value_parser = parse_ioprio)]
    ioprio: IoPrioArg,
    /// Nice value for the replay threads, or "none".
    #[arg(long, default_value = "10", value_parser = parse_nice)]
    nice: NiceArg,
    /// Pause issuing while other tasks' I/O stall exceeds this percentage: the system-wide
    /// "some" stall (/proc/pressure/io, sampled every 50 ms), all of it when others read from
    /// the replayed files' disks meanwhile, else minus the replay threads' own; 0 disables. A pause lasts until the stall drops, at most 5 s; then each submitter
    /// issues one request and checks again, so under sustained pressure the replay crawls
    /// (about one request per thread every 5 s). The progress bar and the report say how
    /// often and how long it paused.
    #[arg(long, default_value_t = 60.0, value_parser = parse_pct)]
    psi_threshold: f64,
    /// Longest wait for in-flight reads to finish before verifying, in seconds (at most 3600).
    #[arg(long, default_value_t = 10.0, value_parser = parse_settle)]
    settle_timeout: f64,
    /// Extra passes for ranges still missing at verification (0-100).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=100))]
    retries: u32,
    /// Also replay entries whose file identity changed (they are reported either way).
    #[arg(long)]
    allow_stale: bool,
    /// Show /proc/diskstats of the devices holding the files, before and after the replay,
    /// and the difference (reads, sectors read, read ms, in flight, writes).
    #[arg(long)]
    diskstats: bool,
    /// Exit non-zero unless at least this percentage (0-100) of the requested bytes ends up
    /// resident and of the entries was replayed; a replay with nothing verifiable always fails.
    #[arg(long, value_name = "PCT", value_parser = parse_pct)]
    require: Option<f64>,
    /// Detach and return at once (like an init service); the report goes to --log.
    #[arg(long)]
    background: bool,
    /// Where a --background replay writes its report (default: discarded).
    #[arg(long, requires = "background")]
    log: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    // Hidden, for tests: stand-ins for the kernel files the pressure back-off reads, so an
    // end-to-end test can show the back-off a fake stall without loading the machine.
    /// For tests: a file in /proc/pressure/io format, read instead of it.
    #[arg(long, hide = true, value_name = "PATH")]
    psi_file: Option<PathBuf>,
    /// For tests: a file in /proc/diskstats format, read by the back-off instead of it.
    #[arg(long, hide = true, value_name = "PATH")]
    diskstats_file: Option<PathBuf>,
    /// For tests: a file in /proc/self/io format, read by the back-off instead of it.
    #[arg(long, hide = true, value_name = "PATH")]
    self_io_file: Option<PathBuf>,
}

#[derive(Args)]
pub struct ReplayArgs {
    /// The list (text v1, JSON Lines or classic block list; "-" for stdin).
    list: PathBuf,
    #[command(flatten)]
    opts: ReplayOpts,
}

#[derive(Args)]
pub struct WarmArgs {
    #[command(flatten)]
    walk: PathArgs,
    #[command(flatten)]
    opts: ReplayOpts,
}

#[derive(Args)]
pub struct EvictArgs {
    #[command(flatten)]
    walk: PathArgs,
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum MethodArg {
    Readahead,
    Fadvise,
    Pread,
    Uring,
}

#[derive(Clone, Copy)]
struct IoPrioArg(Option<IoPrio>);
#[derive(Clone, Copy)]
struct NiceArg(Option<i32>);

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches("iB").trim_end_matches('B');
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let v = n
        .checked_mul(mul)
        .ok_or_else(|| format!("size {s:?} too large"))?;
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

/// Files a walk could not read: one line each on stderr (the run goes on without them).
fn print_walk_errors(errors: &[WalkError]) -> std::io::Result<()> {
    for e in errors {
        errln!("snapblk: {}: {}", escape_path(&e.path), e.error)?;
    }
    Ok(())
}

/// Files a walk could not read, for a JSON report.
fn walk_errors_json(errors: &[WalkError]) -> Vec<serde_json::Value> {
    errors
        .iter()
        .map(|e| serde_json::json!({"path": escape_path(&e.path), "error": e.error}))
        .collect()
}

fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// `a` of `b` in percent with `prec` decimals, or "n/a" when there is nothing to measure
/// (0 of 0 is not 100 %).
fn pct(a: u64, b: u64, prec: usize) -> String {
    if b == 0 {
        "n/a".into()
    } else {
        format!("{:.prec$}%", a as f64 * 100.0 / b as f64)
    }
}

/// Fails a command whose paths could not all be read (like `evict`), after its report.
fn fail_on_walk_errors(errors: &[WalkError]) -> anyhow::Result<()> {
    match errors.len() {
        0 => Ok(()),
        1 => bail!("1 path could not be read"),
        n => bail!("{n} paths could not be read"),
    }
}

/// Columns of a residency bar (like vmtouch -v).
const BAR_WIDTH: usize = 40;

pub fn run_residency(a: ResidencyArgs) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let bars = !a.json && !a.summary && (a.verbose || std::io::stdout().is_terminal());
    let spin = Progress::spinner("measuring residency");
    let rep = scan::scan(
        &a.walk.paths,
        &a.walk.walk_opts(a.threads),
        if bars { BAR_WIDTH as u64 } else { 0 },
    );
    spin.finish();
    let elapsed = t0.elapsed().as_secs_f64();
    let t = rep.totals();
    let mut out = std::io::BufWriter::new(crate::out::stdout());
    if a.json {
        let doc = serde_json::json!({
            "schema": "snapblk.residency.v1",
            "page_size": rep.page_size,
            "files": if a.summary { serde_json::Value::Array(vec![]) } else { serde_json::to_value(&rep.files)? },
            "total": t,
            "errors": walk_errors_json(&rep.errors),
            "elapsed_secs": elapsed,
        });
        serde_json::to_writer(&mut out, &doc)?;
        writeln!(out)?;
        out.flush()?;
        return fail_on_walk_errors(&rep.errors);
    }
    if !a.summary {
        for f in &rep.files {
            let p = escape_path(&f.path);
            match &f.residency {
                Residency::Known { resident_pages, .. } => {
                    let r = (*resident_pages).min(f.pages);
                    if bars {
                        writeln!(
                            out,
                            "{p}\n[{}] {r}/{}  {}",
                            scan::render_bar(&f.buckets, BAR_WIDTH),
                            f.pages,
                            pct(r, f.pages, 1)
                        )?;
                    } else {
                        writeln!(out, "{p}\t{r}/{}\t{}", f.pages, pct(r, f.pages, 1))?;
                    }
                }
                Residency::Unknown { reason } => writeln!(out, "{p}\tunknown\t{reason}")?,
            }
        }
    }
    print_walk_errors(&rep.errors)?;
    let ps = rep.page_size;
    writeln!(out, "           Files: {}", t.files)?;
    writeln!(
        out,
        "  Resident Pages: {}/{}  {}/{}  {}",
        t.resident_pages,
        t.known_pages,
        human(t.resident_pages * ps),
        human(t.known_pages * ps),
        pct(t.resident_pages, t.known_pages, 3)
    )?;
    if t.unknown_files > 0 {
        writeln!(
            out,
            "         Unknown: {} files, {} pages (residency cannot be measured; see per-file reasons)",
            t.unknown_files, t.unknown_pages
        )?;
    }
    if t.dirty_pages + t.writeback_pages > 0 {
        writeln!(
            out,
            "           Dirty: {} pages, writeback {} pages",
            t.dirty_pages, t.writeback_pages
        )?;
    }
    writeln!(out, "         Elapsed: {elapsed:.3} s")?;
    out.flush()?;
    fail_on_walk_errors(&rep.errors)
}

pub fn run(c: ReadaheadCmd) -> anyhow::Result<()> {
    match c {
        ReadaheadCmd::Record(a) => run_record(a),
        ReadaheadCmd::Replay(a) => {
            if a.opts.background && std::env::var_os(CHILD_ENV).is_none() {
                return spawn_replay_background(&a);
            }
            let entries = read_list(&a.list)?;
            run_replay(entries, &a.opts)
        }
        ReadaheadCmd::Warm(a) => {
            if a.opts.background && std::env::var_os(CHILD_ENV).is_none() {
                return spawn_background(&a.opts, None);
            }
            // The walk feeds the submitters directly (no list to build and sort first), so the
            // first requests go out with the first files found.
            let w = a.walk.walk_opts(None);
            let opts = replay_options(&a.opts);
            let bar = Progress::spinner("warm");
            let progress = |d: u64, _t: u64| bar.set(d);
            let watch = |b: BackOff| bar.message(backoff_message("warm", b));
            let watch = bar.visible().then_some(&watch as replay::BackOffWatch<'_>);
            let (rep, errors) =
                replay::warm_tree_watched(&a.walk.paths, &w, &opts, Some(&progress), watch);
            bar.finish();
            print_walk_errors(&errors)?;
            report_replay(&rep, &a.opts, &errors)?;
            fail_on_walk_errors(&errors)?;
            if rep.entries_failed > 0 {
                bail!("{} files could not be read", rep.entries_failed);
            }
            Ok(())
        }
        ReadaheadCmd::Evict(a) => run_evict(a),
    }
}

fn read_list(p: &PathBuf) -> anyhow::Result<Vec<ListEntry>> {
    // The background child of `replay - --background` reads the copy of stdin its parent made,
    // and deletes it once parsed.
    if p.as_os_str() == "-"
        && std::env::var_os(CHILD_ENV).is_some()
        && let Some(copy) = std::env::var_os(STDIN_COPY_ENV)
    {
        let copy = PathBuf::from(copy);
        let r = std::fs::File::open(&copy)
            .map(std::io::BufReader::new)
            .with_context(|| format!("stdin copy {}", copy.display()));
        let _ = std::fs::remove_file(&copy);
        return list::parse_reader(r?, Limits::default()).context("-");
    }
    let r: Box<dyn std::io::BufRead> = if p.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(p).with_context(|| format!("{}", p.display()))?,
        ))
    };
    list::parse_reader(r, Limits::default()).with_context(|| format!("{}", p.display()))
}

/// Written files named in `record`'s text summary and in its JSON `written` array (the
/// count, `written_files`, is always complete).
const WRITTEN_SHOWN_TEXT: usize = 10;
const WRITTEN_SHOWN_JSON: usize = 100;

/// The temporary file a list is written to before it is renamed to `output`: same directory,
/// the whole file name (list.txt and list.jsonl must not share one) plus the pid.
fn list_temp_path(output: &std::path::Path) -> anyhow::Result<PathBuf> {
    let Some(name) = output.file_name() else {
        bail!(
            "cannot write the list {}: not a file name",
            output.display()
        );
    };
    if output.is_dir() {
        bail!("cannot write the list {}: Is a directory", output.display());
    }
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".{}.tmp~", std::process::id()));
    Ok(output.with_file_name(tmp_name))
}

/// Fails now, before anything is evicted or recorded, if the list could not be written: the
/// temporary file is created and removed again (before the first snapshot, so it is not seen
/// as a file written during the recording). Errors name the output path, not the temporary.
fn check_list_writable(output: &std::path::Path) -> anyhow::Result<()> {
    let tmp = list_temp_path(output)?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .with_context(|| format!("cannot write the list {}", output.display()))?;
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

/// Writes the list atomically (temporary file, then rename), so a replay never sees a
/// half-written list; on failure the temporary file is removed and the error names `output`.
fn write_list(output: &std::path::Path, entries: &[ListEntry], jsonl: bool) -> anyhow::Result<()> {
    let tmp = list_temp_path(output)?;
    let written = (|| -> std::io::Result<()> {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        if jsonl {
            list::write_jsonl(&mut w, entries)?;
        } else {
            list::write_text(&mut w, entries)?;
        }
        w.flush()?;
        std::fs::rename(&tmp, output)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("cannot write the list {}", output.display()))
}

fn run_record(a: RecordArgs) -> anyhow::Result<()> {
    check_list_writable(&a.output)?;
    let scopes = if a.scopes.is_empty() {
        if a.evict_first {
            bail!(
                "--evict-first without --scope would evict every file on the machine (the \
                 default scope is /); name the trees to evict with --scope PATH (--scope / if \
                 you really mean all of them)"
            );
        }
        vec![PathBuf::from("/")]
    } else {
        a.scopes.clone()
    };
    let w = WalkOptions {
        recursive: true,
        ..Default::default()
    };
    let mut cmd;
    let trigger = match (a.duration, a.cmd.split_first()) {
        // Bounded by parse_duration, so the conversion cannot panic.
        (Some(d), _) => Trigger::Duration(Duration::from_secs_f64(d)),
        (None, Some((prog, args))) => {
            cmd = std::process::Command::new(prog);
            cmd.args(args);
            if a.json {
                // stdout is exactly one JSON document: the command's output goes to stderr
                // (like time(1) keeps its own report apart from the command's).
                let err = std::io::stderr()
                    .as_fd()
                    .try_clone_to_owned()
                    .context("duplicating stderr for the command's output")?;
                cmd.stdout(err);
            }
            Trigger::Command(&mut cmd)
        }
        (None, None) => bail!("give a command (after --) or --duration SECS"),
    };
    let rec = record::record(&scopes, &w, a.evict_first, a.trace, trigger)?;
    let jsonl = match a.format {
        Some(ListFormat::Jsonl) => true,
        Some(ListFormat::Text) => false,
        None => a
            .output
            .extension()
            .is_some_and(|e| e == "jsonl" || e == "json"),
    };
    write_list(&a.output, &rec.entries, jsonl)?;
    let bytes: u64 = rec
        .entries
        .iter()
        .map(|e| match &e.extent {
            Extent::Ranges(r) => r.total_bytes(),
            Extent::Whole => e.identity.map_or(0, |i| i.size),
        })
        .sum();
    if a.json {
        let doc = serde_json::json!({
            "schema": "snapblk.record.v1",
            "list": a.output.display().to_string(),
            "files": rec.entries.len(),
            "bytes": bytes,
            "files_scanned": rec.files_scanned,
            "unknown_files": rec.unknown.len(),
            "written_files": rec.written.len(),
            "written": rec.written.iter().take(WRITTEN_SHOWN_JSON).map(|w| serde_json::json!({
                "path": escape_path(&w.path),
                "reason": w.reason,
            })).collect::<Vec<_>>(),
            "exit_status": rec.status.and_then(|s| s.code()),
            "evict_remaining_pages": rec.evicted_remaining_pages,
            "reclaimed_bytes": rec.reclaimed_bytes,
            "trace": rec.trace.map(|t| serde_json::json!({
                "events": t.events,
                "lost_events": t.lost_events,
                "traced_only_bytes": t.traced_only_bytes,
                "untraceable_files": t.untraceable_files,
            })),
            "elapsed_secs": rec.elapsed.as_secs_f64(),
        });
        outln!("{doc}")?;
    } else {
        outln!(
            "recorded {} files, {} in {:.3} s ({} files scanned) -> {}",
            rec.entries.len(),
            human(bytes),
            rec.elapsed.as_secs_f64(),
            rec.files_scanned,
            a.output.display()
        )?;
        if rec.reclaimed_bytes > 0 {
            outln!(
                "{} of it was read and then reclaimed by the kernel during the recording \
                 (found as shadow entries; listed all the same)",
                human(rec.reclaimed_bytes)
            )?;
        }
        if let Some(t) = rec.trace {
            outln!(
                "trace: {} page-cache insertions seen; {} of the list found only by the trace",
                t.events,
                human(t.traced_only_bytes)
            )?;
        }
        if !rec.written.is_empty() {
            outln!(
                "left out {} files written during the recording (their entries would be \
                 stale at the next replay):",
                rec.written.len()
            )?;
            for w in rec.written.iter().take(WRITTEN_SHOWN_TEXT) {
                outln!("written: {}: {}", escape_path(&w.path), w.reason)?;
            }
            if rec.written.len() > WRITTEN_SHOWN_TEXT {
                outln!(
                    "written: ... and {} more (--json lists up to {WRITTEN_SHOWN_JSON})",
                    rec.written.len() - WRITTEN_SHOWN_TEXT
                )?;
            }
        }
        if !rec.unknown.is_empty() {
            outln!(
                "{} files with unknown residency were not recorded, e.g. {}: {}",
                rec.unknown.len(),
                escape_path(&rec.unknown[0].0),
                rec.unknown[0].1
            )?;
        }
    }
    if let Some(t) = rec.trace
        && t.lost_events > 0
    {
        errln!(
            "snapblk: warning: the kernel dropped {} page-cache trace events (its trace \
             buffer filled faster than it was read): the trace part of the list may be \
             incomplete",
            t.lost_events
        )?;
    }
    if let Some(t) = rec.trace
        && t.untraceable_files > 0
    {
        errln!(
            "snapblk: warning: {} files are on btrfs or overlayfs, whose files the page-cache \
             trace cannot name (its device and inode are not the ones stat reports): their \
             entries come from the residency diff alone",
            t.untraceable_files
        )?;
    }
    if let Some(st) = rec.status
        && !st.success()
    {
        bail!("recorded command failed: {st}");
    }
    Ok(())
}

const CHILD_ENV: &str = "SNAPBLK_READAHEAD_BACKGROUND_CHILD";
/// Where the parent of `replay - --background` left its copy of stdin for the child.
const STDIN_COPY_ENV: &str = "SNAPBLK_READAHEAD_STDIN_LIST";

/// `replay --background`: the list is parsed here, so a bad list is an error now rather than
/// in a log. A list on stdin cannot be re-read by the detached child (its stdin is /dev/null),
/// so it is copied to a private temporary file (mode 0600, O_EXCL) that the child reads and
/// deletes.
fn spawn_replay_background(a: &ReplayArgs) -> anyhow::Result<()> {
    if a.list.as_os_str() != "-" {
        read_list(&a.list)?;
        return spawn_background(&a.opts, None);
    }
    let (path, mut f) = private_temp_file("snapblk-replay", "list")?;
    let copied = std::io::copy(&mut std::io::stdin().lock(), &mut f)
        .and_then(|_| f.sync_all())
        .context("copying the list from stdin")
        .and_then(|_| read_list(&path).context("-"));
    let spawned = copied.and_then(|_| spawn_background(&a.opts, Some(&path)));
    if spawned.is_err() {
        let _ = std::fs::remove_file(&path);
    }
    spawned
}

/// Creates a new file only this user can read in the temp directory (tempfile: 0600,
/// O_EXCL), kept on disk for the background child.
fn private_temp_file(prefix: &str, ext: &str) -> anyhow::Result<(PathBuf, std::fs::File)> {
    let dir = std::env::temp_dir();
    let t = tempfile::Builder::new()
        .prefix(&format!("{prefix}-"))
        .suffix(&format!(".{ext}"))
        .tempfile_in(&dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    let (f, path) = t.keep().context("keeping the temporary list")?;
    Ok((path, f))
}

/// Re-executes this command detached (new process group, stdio to the log) and returns.
/// `stdin_copy`: the list the child is to read instead of its stdin.
fn spawn_background(o: &ReplayOpts, stdin_copy: Option<&std::path::Path>) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let log = match &o.log {
        Some(p) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .with_context(|| format!("{}", p.display()))?,
        None => std::fs::File::create("/dev/null")?,
    };
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(exe);
    if let Some(p) = stdin_copy {
        cmd.env(STDIN_COPY_ENV, p);
    }
    let child = cmd
        .args(args)
        .env(CHILD_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("cannot start the background replay")?;
    outln!("{}", child.id())?;
    Ok(())
}

fn replay_options(o: &ReplayOpts) -> ReplayOptions {
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
            .unwrap_or_else(|| PathBuf::from(snapblk_readahead::sysstat::PSI_IO)),
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

fn run_replay(entries: Vec<ListEntry>, o: &ReplayOpts) -> anyhow::Result<()> {
    let opts = replay_options(o);
    let bar = Progress::new(entries.len() as u64, "replay");
    let progress = |d: u64, _t: u64| bar.set(d);
    let watch = |b: BackOff| bar.message(backoff_message("replay", b));
    let watch = bar.visible().then_some(&watch as replay::BackOffWatch<'_>);
    let rep = replay::replay_watched(&entries, &opts, Some(&progress), watch);
    bar.finish();
    report_replay(&rep, o, &[])
}

/// The progress bar's label while the pressure back-off holds the replay: under sustained
/// outside I/O pressure it crawls (one request per thread per 5 s pause), and a bar that just
/// stops would look hung.
fn backoff_message(what: &str, b: BackOff) -> String {
    if b.paused {
        format!(
            "{what}: paused for other tasks' I/O pressure ({} pauses, {:.1} s so far)",
            b.pauses, b.paused_secs
        )
    } else if b.pauses > 0 {
        format!(
            "{what} (paused {} times, {:.1} s, for I/O pressure)",
            b.pauses, b.paused_secs
        )
    } else {
        what.to_string()
    }
}

/// The report's account of the pressure back-off.
fn pressure_text(r: &ReplayReport, psi_threshold: f64) -> String {
    if r.psi_pauses > 0 {
        format!(
            "paused {} times ({:.3} s) for other tasks' I/O pressure above {psi_threshold}%",
            r.psi_pauses, r.psi_paused_secs
        )
    } else if psi_threshold > 0.0 {
        "no pauses for I/O pressure".to_string()
    } else {
        "I/O pressure back-off disabled".to_string()
    }
}

/// Prints the report (`walk_errors`: paths a `warm` could not walk, also put in the JSON).
fn report_replay(
    rep: &ReplayReport,
    o: &ReplayOpts,
    walk_errors: &[WalkError],
) -> anyhow::Result<()> {
    if o.json {
        let mut v = serde_json::to_value(rep)?;
        if let Some(m) = v.as_object_mut() {
            m.insert("schema".into(), "snapblk.replay.v1".into());
            m.insert("walk_errors".into(), walk_errors_json(walk_errors).into());
        }
        outln!("{v}")?;
    } else {
        print_replay(rep, o.psi_threshold)?;
    }
    for w in &rep.warnings {
        errln!("snapblk: warning: {w}")?;
    }
    if let Some(req) = o.require
        && let Err(e) = rep.check_require(req)
    {
        bail!("{e}");
    }
    Ok(())
}

fn print_replay(r: &ReplayReport, psi_threshold: f64) -> std::io::Result<()> {
    for n in &r.notes {
        outln!("note: {n}")?;
    }
    for s in &r.stale {
        outln!("stale: {}: {}", escape_path(&s.path), s.reason)?;
    }
    for s in &r.errors {
        outln!("error: {}: {}", escape_path(&s.path), s.reason)?;
    }
    outln!(
        "entries {} (replayed {}, stale {}, missing {}, failed {}{}); method {} chunk {} depth {} threads {}",
        r.entries,
        r.files_replayed,
        r.entries_stale,
        r.entries_missing,
        r.entries_failed,
        if r.entries_duplicate > 0 {
            format!(", duplicates {}", r.entries_duplicate)
        } else {
            String::new()
        },
        r.method,
        human(r.chunk),
        r.queue_depth,
        r.threads
    )?;
    outln!(
        "requested {}, resident before {}, issued {} in {} requests",
        human(r.bytes_requested),
        human(r.bytes_resident_before),
        human(r.bytes_issued),
        r.requests_issued
    )?;
    outln!(
        "verified: {} of {} resident ({}){} after {} pass(es)",
        human(r.bytes_resident_after),
        human(r.bytes_requested.saturating_sub(r.bytes_unverifiable)),
        r.resident_fraction
            .map_or("n/a".to_string(), |f| format!("{:.3}%", f * 100.0)),
        if r.bytes_unverifiable > 0 {
            format!(
                ", {} unverifiable (residency unknown)",
                human(r.bytes_unverifiable)
            )
        } else {
            String::new()
        },
        r.passes
    )?;
    outln!(
        "time: issue {:.3} s, settle {:.3} s{}, total {:.3} s; {}",
        r.issue_secs,
        r.settle_secs,
        if r.settled {
            ""
        } else {
            " (reads still in flight at timeout)"
        },
        r.total_secs,
        pressure_text(r, psi_threshold)
    )?;
    for c in r.diskstats.iter().flatten() {
        out!("{}", diskstats_table(c))?;
    }
    Ok(())
}

/// `--diskstats` for one device: the counters before and after the replay and the difference.
fn diskstats_table(c: &snapblk_readahead::sysstat::DiskStatsChange) -> String {
    let (b, a, d) = (&c.before.totals, &c.after.totals, &c.delta.totals);
    let rows: [(&str, u64, u64, String); 6] = [
        ("reads", b.reads, a.reads, format!("+{}", d.reads)),
        (
            "sectors read",
            b.sectors_read,
            a.sectors_read,
            format!(
                "+{} ({})",
                d.sectors_read,
                human(d.sectors_read.saturating_mul(512))
            ),
        ),
        ("read ms", b.read_ms, a.read_ms, format!("+{}", d.read_ms)),
        (
            "in flight",
            c.before.in_flight,
            c.after.in_flight,
            format!("{:+}", c.delta.in_flight),
        ),
        ("writes", b.writes, a.writes, format!("+{}", d.writes)),
        (
            "sectors written",
            b.sectors_written,
            a.sectors_written,
            format!("+{}", d.sectors_written),
        ),
    ];
    let mut out = format!(
        "diskstats {} ({}:{}):\n  {:<16} {:>14} {:>14}  delta\n",
        c.name, c.major, c.minor, "", "before", "after"
    );
    for (what, before, after, delta) in rows {
        out.push_str(&format!("  {what:<16} {before:>14} {after:>14}  {delta}\n"));
    }
    out
}

fn run_evict(a: EvictArgs) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let rep = evict::evict(&a.walk.paths, &a.walk.walk_opts(None));
    let elapsed = t0.elapsed().as_secs_f64();
    if a.json {
        let remaining: Vec<_> = rep
            .remaining
            .iter()
            .map(|r| serde_json::json!({"path": escape_path(&r.path), "pages": r.pages, "residency": r.residency}))
            .collect();
        outln!(
            "{}",
            serde_json::json!({
                "schema": "snapblk.evict.v1",
                "files": rep.files,
                "pages": rep.pages,
                "remaining_pages": rep.remaining_pages(),
                "unknown_files": rep.unknown_files(),
                "remaining": remaining,
                "errors": walk_errors_json(&rep.errors),
                "elapsed_secs": elapsed,
            })
        )?;
    } else {
        for r in &rep.remaining {
            match &r.residency {
                Residency::Known { resident_pages, .. } => outln!(
                    "still resident: {}: {}/{} pages",
                    escape_path(&r.path),
                    resident_pages,
                    r.pages
                )?,
                Residency::Unknown { reason } => {
                    outln!("unknown: {}: {reason}", escape_path(&r.path))?
                }
            }
        }
        print_walk_errors(&rep.errors)?;
        let unknown = rep.unknown_files();
        outln!(
            "evicted {} files ({} pages); {} pages remain resident{}; {:.3} s",
            rep.files,
            rep.pages,
            rep.remaining_pages(),
            if unknown > 0 {
                format!(
                    " in the {} files that could be checked, {unknown} files unknown \
                     (residency cannot be measured)",
                    rep.files.saturating_sub(unknown)
                )
            } else {
                String::new()
            },
            elapsed
        )?;
    }
    if !rep.errors.is_empty() {
        bail!("{} files could not be evicted", rep.errors.len());
    }
    Ok(())
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
    fn diskstats_table_shows_before_after_and_delta() {
        use snapblk_readahead::sysstat::{diskstats_change, parse_diskstats};
        let before = parse_diskstats(" 254 0 vda 100 0 800 50 10 0 80 5 2 60 70 0 0 0 0\n");
        let after = parse_diskstats(" 254 0 vda 131 0 2848 292 10 0 80 5 0 60 70 0 0 0 0\n");
        let c = diskstats_change(&before, &after, &[(254, 0)]).remove(0);
        let t = diskstats_table(&c);
        let lines: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0], ["diskstats", "vda", "(254:0):"]);
        assert_eq!(lines[1], ["before", "after", "delta"]);
        assert_eq!(lines[2], ["reads", "100", "131", "+31"]);
        assert_eq!(
            lines[3],
            ["sectors", "read", "800", "2848", "+2048", "(1.00", "MiB)"]
        );
        assert_eq!(lines[4], ["read", "ms", "50", "292", "+242"]);
        assert_eq!(lines[5], ["in", "flight", "2", "0", "-2"]);
        assert_eq!(lines.len(), 8);
    }

    #[test]
    fn back_off_shows_on_the_bar_and_in_the_report() {
        let b = |paused, pauses, paused_secs| BackOff {
            paused,
            pauses,
            paused_secs,
        };
        assert_eq!(backoff_message("replay", b(false, 0, 0.0)), "replay");
        assert_eq!(
            backoff_message("replay", b(true, 3, 10.04)),
            "replay: paused for other tasks' I/O pressure (3 pauses, 10.0 s so far)"
        );
        assert_eq!(
            backoff_message("warm", b(false, 3, 12.5)),
            "warm (paused 3 times, 12.5 s, for I/O pressure)"
        );
        let mut r = ReplayReport {
            psi_pauses: 84,
            psi_paused_secs: 417.25,
            ..Default::default()
        };
        assert_eq!(
            pressure_text(&r, 60.0),
            "paused 84 times (417.250 s) for other tasks' I/O pressure above 60%"
        );
        r.psi_pauses = 0;
        assert_eq!(pressure_text(&r, 60.0), "no pauses for I/O pressure");
        assert_eq!(pressure_text(&r, 0.0), "I/O pressure back-off disabled");
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
