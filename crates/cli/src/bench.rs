//! `snapblk bench`: fio-style workloads (default), IOzone-style file tests (`file`), the 1 KiB
//! overwrite micro-benchmark (`overwrite`) and foreground-under-background (`fgbg`).
//! Results go to stdout as a table, or as one JSON document with `--json` (to `--output FILE`
//! if given); diagnostics and progress go to stderr.

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use snapblk_loadgen::{
    ConfigReport, Document, JobSpec, LatKind, LibblkioTarget, RwMode, SpecTarget, Sweep, Target,
    TargetDesc, fgbg, fileio, fmt_size, noise_warnings, parse_list, parse_secs, parse_size, plot,
    signal_name, workload_table,
};
use snapblk_nbd::TermSignals;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

#[derive(Args)]
// Repeated options override (as in fio, whose command lines repeat them per job).
#[command(args_conflicts_with_subcommands = true, args_override_self = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    cmd: Option<Box<BenchCmd>>,
    // Boxed: keeps `snapblk`'s top-level command enum small.
    #[command(flatten)]
    w: Box<WorkloadArgs>,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// IOzone-style file tests: write, rewrite, read, reread, randread, randwrite over a
    /// file-size x record-size sweep.
    File(FileArgs),
    /// Create an N MiB file, then overwrite it in 1 KiB units, with and without fsync (MiB/s).
    Overwrite(OverwriteArgs),
    /// Foreground start-up time and latency under background streams, vs idle, per scheduler.
    Fgbg(Box<FgBgArgs>),
}

#[derive(Args, Clone)]
struct OutArgs {
    /// Write a JSON document (schema: crates/loadgen/schema.json) instead of the table.
    #[arg(long)]
    json: bool,
    /// Write the JSON document to FILE (the table still goes to stdout).
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(Args)]
struct WorkloadArgs {
    /// A path (file or block device, io_uring driver) or a snapblk device spec
    /// (e.g. `null:size=1G`, `sync:path=F`), or a fio job file (`*.fio`). With --libblkio: the
    /// value of its `path` property. A file named like a subcommand (file, overwrite, fgbg) is
    /// `./file`, or goes after `--`.
    target: Option<String>,
    /// fio's filename: the target, as TARGET (a path, or a device spec without --ioengine).
    #[arg(long, value_name = "PATH")]
    filename: Option<String>,
    /// fio's ioengine, mapped to a snapblk driver: io_uring; libaio (runs on io_uring);
    /// sync, psync, vsync, pvsync, pvsync2 (the sync driver); null (needs --size); libblkio
    /// (with --libblkio_driver). Other engines are refused.
    #[arg(long, value_name = "ENGINE")]
    ioengine: Option<String>,
    /// fio's libblkio_driver (with --ioengine=libblkio): which snapblk driver to use.
    #[arg(long = "libblkio_driver", value_name = "DRIVER")]
    libblkio_driver: Option<String>,
    /// fio's job name: leads the configuration's label in tables, plots and JSON. Several
    /// --name start several jobs, as in fio (options before the first are global, options
    /// then take fio's --key=value form); they run one after the other.
    #[arg(long)]
    name: Vec<String>,
    /// fio's output format: normal (the table) or json (as --json); json+ is written as json.
    #[arg(long = "output-format", value_name = "FORMAT",
        value_parser = ["normal", "json", "json+"])]
    output_format: Option<String>,
    /// Accepted for fio command lines: snapblk always reports the jobs of a configuration as
    /// one group.
    #[arg(long = "group_reporting", hide = true, num_args = 0..=1, require_equals = true)]
    group_reporting: Option<Option<String>>,
    /// Accepted for fio command lines: snapblk's jobs are always threads.
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true)]
    thread: Option<Option<String>>,
    /// fio's norandommap: ignored, with a warning (random offsets cover every block once
    /// per pass).
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true)]
    norandommap: Option<Option<String>>,
    /// fio's randrepeat: ignored, with a warning (offsets always repeat for a --seed).
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true)]
    randrepeat: Option<Option<String>>,
    /// Load this libblkio implementation (shared library) instead of snapblk's drivers.
    /// Repeat to compare implementations in one interleaved run: every configuration runs on
    /// each, and results are labelled LABEL (from `LABEL=PATH.so`, else the path).
    #[arg(long, value_name = "[LABEL=]PATH.so", requires = "driver")]
    libblkio: Vec<String>,
    /// libblkio driver name (with --libblkio), e.g. io_uring.
    #[arg(long, requires = "libblkio")]
    driver: Option<String>,
    /// Extra libblkio property KEY=VALUE set before connect (repeatable; with --libblkio).
    #[arg(long = "prop", value_name = "KEY=VALUE", requires = "libblkio")]
    props: Vec<String>,
    /// Job file: fio's INI format (`[global]` + one section per job, run one after the other;
    /// options snapblk does not support are named in warnings), or snapblk's TOML (`[global]`
    /// + `[[job]]` tables; lists mean sweeps; flags give the defaults).
    #[arg(long = "job-file", alias = "jobfile", value_name = "FILE")]
    job_file: Option<PathBuf>,
    /// Access pattern(s): read, write, randread, randwrite, rw, randrw (comma list = sweep).
    #[arg(long, default_value = "randread")]
    rw: String,
    /// Block size, e.g. 4k (fio's `4k,4k` form is accepted when the sizes agree).
    #[arg(long, default_value = "4k")]
    bs: String,
    /// Block sizes to sweep, e.g. 4k,64k,1M: one configuration each (instead of --bs).
    #[arg(long = "sweep-bs", value_name = "LIST", conflicts_with = "bs")]
    sweep_bs: Option<String>,
    /// Requests in flight per job (list = sweep).
    #[arg(long, default_value = "1")]
    iodepth: String,
    /// Job threads, one queue each; as in fio every job covers --size bytes from
    /// --offset + job x --offset_increment (list = sweep).
    #[arg(long, default_value = "1")]
    numjobs: String,
    /// Read percentage for rw/randrw.
    #[arg(long, default_value_t = 50)]
    rwmixread: u32,
    /// Bytes each job covers, as fio's size (default: from its offset to the end of the target).
    #[arg(long)]
    size: Option<String>,
    /// Start offset of the first job's region.
    #[arg(long, default_value = "0")]
    offset: String,
    /// Distance between the starts of consecutive jobs' regions (fio's; default 0: all jobs
    /// share one region).
    #[arg(
        long = "offset_increment",
        alias = "offset-increment",
        default_value = "0"
    )]
    offset_increment: String,
    /// Seconds to measure at most; without --time_based a job also ends after one pass over
    /// its region, as in fio.
    #[arg(long)]
    runtime: Option<String>,
    /// Seconds to run before measuring.
    #[arg(long = "ramp_time", alias = "ramp-time", default_value = "0")]
    ramp_time: String,
    /// Loop over the region until --runtime has passed (fio's time_based; `--time_based` alone
    /// or `--time_based=1`).
    #[arg(long = "time_based", alias = "time-based", num_args = 0..=1, default_value = "0",
        default_missing_value = "1", require_equals = true, value_parser = parse_flag)]
    time_based: bool,
    /// O_DIRECT (`--direct` alone, or fio's `--direct=1`).
    #[arg(long, num_args = 0..=1, default_value = "0", default_missing_value = "1",
        require_equals = true, value_parser = parse_flag)]
    direct: bool,
    /// Write a verifiable pattern (offset + seed + generation) and check every read.
    #[arg(long)]
    verify: bool,
    /// Seed for random offsets and verify data.
    #[arg(long, alias = "randseed", default_value_t = 0x5eed_b10c)]
    seed: u64,
    /// Percentage of every 512-byte segment of write buffers that is zeros (fio's; default 0:
    /// incompressible random data).
    #[arg(
        long = "buffer_compress_percentage",
        alias = "buffer-compress-percentage",
        default_value_t = 0
    )]
    buffer_compress_percentage: u32,
    /// Refill write buffers with new random data before every write (fio's refill_buffers).
    #[arg(long = "refill_buffers", alias = "refill-buffers")]
    refill_buffers: bool,
    /// Stamp offset and time into every sector of every write, as fio does by default
    /// (scramble_buffers=1); `--scramble_buffers 0` reuses buffers unchanged.
    #[arg(long = "scramble_buffers", alias = "scramble-buffers", default_value = "1", action = clap::ArgAction::Set,
        value_parser = parse_flag)]
    scramble_buffers: bool,
    /// Submit when this many requests are queued (fio's iodepth_batch_submit: default 1, each
    /// request submitted on its own; 0 = iodepth).
    #[arg(
        long = "iodepth_batch_submit",
        visible_alias = "iodepth_batch",
        alias = "iodepth-batch-submit",
        default_value_t = 1
    )]
    iodepth_batch_submit: u32,
    /// With the queue full, wait for at least this many completions (fio's default 1).
    #[arg(
        long = "iodepth_batch_complete_min",
        visible_alias = "iodepth_batch_complete",
        alias = "iodepth-batch-complete-min",
        default_value_t = 1
    )]
    iodepth_batch_complete_min: u32,
    /// Handle at most this many completions per reap, the rest when the loop comes back (fio's;
    /// default 1, i.e. iodepth_batch_complete_min; 0 = iodepth).
    #[arg(
        long = "iodepth_batch_complete_max",
        alias = "iodepth-batch-complete-max",
        default_value_t = 1
    )]
    iodepth_batch_complete_max: u32,
    /// Never submit on its own: queued requests go to the driver with the next wait (one do_io
    /// per refill, as libblkio applications usually do; lets the io_uring driver run QD1
    /// requests inline). Overrides --iodepth_batch_submit.
    #[arg(long = "submit_with_wait", alias = "submit-with-wait")]
    submit_with_wait: bool,
    /// Drop the target's page cache for the covered region before each run (fio's invalidate,
    /// default 1; files: fadvise DONTNEED, block devices: BLKFLSBUF).
    #[arg(long, default_value = "1", action = clap::ArgAction::Set, value_parser = parse_flag)]
    invalidate: bool,
    /// Where I/O buffers come from (fio's iomem): malloc = private anonymous memory (fio's
    /// default); memfd = the device's shared alloc_mem_region memory, as libblkio applications
    /// use (its pages cost more to pin per O_DIRECT system call).
    #[arg(long, alias = "mem", default_value = "malloc", value_parser = parse_iomem)]
    iomem: snapblk_loadgen::Iomem,
    /// Show completion-latency percentiles in the table (fio's clat_percentiles, default 1).
    #[arg(long = "clat_percentiles", alias = "clat-percentiles", default_value = "1",
        action = clap::ArgAction::Set, value_parser = parse_flag)]
    clat_percentiles: bool,
    /// Show total-latency percentiles in the table (fio's lat_percentiles, default 0).
    #[arg(long = "lat_percentiles", alias = "lat-percentiles", default_value = "0",
        action = clap::ArgAction::Set, value_parser = parse_flag)]
    lat_percentiles: bool,
    /// Show submission-latency percentiles in the table (fio's slat_percentiles, default 0).
    #[arg(long = "slat_percentiles", alias = "slat-percentiles", default_value = "0",
        action = clap::ArgAction::Set, value_parser = parse_flag)]
    slat_percentiles: bool,
    /// Run every configuration N times, interleaved, and report the spread.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Write SVG charts (latency CDF, IOPS vs iodepth, time series) into DIR.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    #[command(flatten)]
    out: OutArgs,
}

#[derive(Args)]
struct FileArgs {
    /// Directory for the test file.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// File sizes (list).
    #[arg(long = "file-size", short = 's', default_value = "1M,16M")]
    file_size: String,
    /// Record sizes (list). IOzone's -r; no short flag here, as -r means --recursive in
    /// every snapblk command that has it.
    #[arg(long = "record-size", default_value = "4k,64k,1M")]
    record_size: String,
    /// Tests (list of write, rewrite, read, reread, randread, randwrite).
    #[arg(long, default_value = "write,rewrite,read,reread,randread,randwrite")]
    tests: String,
    /// Include fsync in write timings (IOzone -e).
    #[arg(long)]
    fsync: bool,
    /// O_DIRECT (IOzone -I).
    #[arg(long)]
    direct: bool,
    /// Evict the file from the page cache before read and randread.
    #[arg(long)]
    drop_cache: bool,
    #[command(flatten)]
    out: OutArgs,
}

#[derive(Args)]
struct OverwriteArgs {
    /// Directory for the test file.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// File size in MiB.
    #[arg(long, default_value_t = 16)]
    mb: u64,
    /// Overwrite unit.
    #[arg(long, default_value = "1k")]
    unit: String,
    /// Only the fsync variant (default: both, without then with).
    #[arg(long, conflicts_with = "no_fsync")]
    fsync: bool,
    /// Only the variant without fsync.
    #[arg(long)]
    no_fsync: bool,
    #[command(flatten)]
    out: OutArgs,
}

#[derive(Args)]
struct FgBgArgs {
    /// Background sequential reader on PATH (repeat for N streams).
    #[arg(long = "bg-read", value_name = "PATH")]
    bg_read: Vec<PathBuf>,
    /// Background sequential writer on PATH (repeat for N streams), over --bg-size bytes.
    #[arg(long = "bg-write", value_name = "PATH")]
    bg_write: Vec<PathBuf>,
    /// Bytes each background writer writes (K/M/G suffixes).
    #[arg(long = "bg-size", default_value = "256M")]
    bg_size: String,
    /// Background shell command (e.g. a `snapblk merge` or `snapblk readahead replay`), repeatable.
    #[arg(long = "bg-cmd", value_name = "CMD")]
    bg_cmd: Vec<String>,
    /// O_DIRECT for background readers/writers.
    #[arg(long)]
    bg_direct: bool,
    /// Foreground: a shell command whose wall time is the start-up time.
    #[arg(long = "fg-cmd", value_name = "CMD", group = "fg")]
    fg_cmd: Option<String>,
    /// Foreground: replay a snapblk readahead list as reads (files evicted first).
    #[arg(long = "fg-list", value_name = "LIST", group = "fg")]
    fg_list: Option<PathBuf>,
    /// Foreground: a workload on TARGET (uses --rw/--bs/--iodepth/--size).
    #[arg(long = "fg-target", value_name = "TARGET", group = "fg")]
    fg_target: Option<String>,
    /// Foreground workload (--fg-target): access pattern.
    #[arg(long, default_value = "randread")]
    rw: String,
    /// Foreground workload (--fg-target): block size.
    #[arg(long, default_value = "4k")]
    bs: String,
    /// Foreground workload (--fg-target): requests in flight.
    #[arg(long, default_value_t = 1)]
    iodepth: u32,
    /// Foreground workload (--fg-target): bytes it covers.
    #[arg(long, default_value = "16M")]
    size: String,
    /// Foreground workload (--fg-target): O_DIRECT.
    #[arg(long)]
    direct: bool,
    /// Foreground runs per cell.
    #[arg(long, default_value_t = 5)]
    iterations: u32,
    /// Seconds the background runs before the first foreground run.
    #[arg(long, default_value = "2")]
    warmup: String,
    /// Seconds between foreground runs.
    #[arg(long, default_value = "0.5")]
    pause: String,
    /// Drop all caches before every foreground run (root).
    #[arg(long)]
    drop_caches: bool,
    /// Schedulers to compare (e.g. mq-deadline,bfq,none); needs --device.
    #[arg(long)]
    schedulers: Option<String>,
    /// Block device whose scheduler is switched (e.g. /dev/vda).
    #[arg(long)]
    device: Option<PathBuf>,
    /// Give up on a foreground command (--fg-cmd) after this many seconds; the run then fails.
    #[arg(long = "fg-timeout", default_value = "120")]
    fg_timeout: String,
    #[command(flatten)]
    out: OutArgs,
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    match a.cmd.map(|c| *c) {
        None => run_workload(*a.w),
        Some(BenchCmd::File(f)) => run_file(f),
        Some(BenchCmd::Overwrite(o)) => run_overwrite(o),
        Some(BenchCmd::Fgbg(f)) => run_fgbg(*f),
    }
}

impl OutArgs {
    /// Fail before running when `--output` cannot be written (not after a long run), or is
    /// the same file as one of `inputs` (the target, a job file: the document would replace
    /// it). The file is created (not truncated) here and written when the run ends.
    fn check(&self, inputs: &[(&str, &Path)]) -> anyhow::Result<()> {
        if let Some(p) = &self.output {
            crate::outfile::refuse_alias("--output", p, inputs)?;
            refuse_non_json(p)?;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .with_context(|| format!("--output {}", p.display()))?;
        }
        Ok(())
    }
}

/// Refuse an `--output` that is a regular file holding anything but a JSON document (an
/// earlier result) or nothing: a mistyped `--output disk.img` would replace the image.
fn refuse_non_json(p: &Path) -> anyhow::Result<()> {
    use std::io::Read as _;
    let Ok(m) = std::fs::metadata(p) else {
        return Ok(());
    };
    if !m.is_file() || m.len() == 0 {
        return Ok(());
    }
    let mut head = Vec::with_capacity(64);
    std::fs::File::open(p)
        .and_then(|f| f.take(64).read_to_end(&mut head))
        .with_context(|| format!("--output {}", p.display()))?;
    if head.trim_ascii_start().first() != Some(&b'{') {
        bail!(
            "--output {} exists and is not a JSON document; refusing to overwrite it (remove it first or choose another name)",
            p.display()
        );
    }
    Ok(())
}

/// Write `--output`: a regular file (or a new one) is replaced atomically, so a reader never
/// sees half a document and a failed write leaves the old one; a FIFO or a terminal
/// (`/dev/stdout`) is written directly.
fn write_output(p: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    if std::fs::metadata(p).is_ok_and(|m| !m.is_file()) {
        return std::fs::write(p, text).with_context(|| format!("write {}", p.display()));
    }
    let f = crate::outfile::AtomicFile::create(p)?;
    f.file()
        .write_all(text.as_bytes())
        .with_context(|| format!("write {}", p.display()))?;
    f.commit()
}

/// Emit `doc` per the output flags: JSON to --output and/or stdout, table to stdout otherwise.
/// The document is always written, also when the run failed (then with `error` set).
fn emit(out: &OutArgs, doc: &Document, table: Option<String>) -> anyhow::Result<()> {
    let json = doc.to_json();
    // Never hand out a document that breaks its own schema; say so loudly instead.
    let invalid: Option<anyhow::Error> = match serde_json::from_str::<serde_json::Value>(&json) {
        Ok(v) => snapblk_loadgen::validate(&v).err().map(Into::into),
        Err(e) => Some(e.into()),
    };
    if let Some(p) = &out.output {
        write_output(p, &format!("{json}\n"))?;
    }
    // A stdout that cannot take the document (closed, full) fails the command: a caller
    // reading the JSON must not see exit 0 with nothing or half a document.
    if out.json && out.output.is_none() {
        outln!("{json}")?;
    } else if let Some(t) = table {
        out!("{t}")?;
    }
    for w in &doc.warnings {
        errln!("warning: {w}")?;
    }
    if let Some(e) = invalid {
        return Err(
            e.context("internal error: result document violates crates/loadgen/schema.json")
        );
    }
    Ok(())
}

fn finish(
    out: &OutArgs,
    mut doc: Document,
    res: anyhow::Result<Option<String>>,
) -> anyhow::Result<()> {
    match res {
        Ok(table) => emit(out, &doc, table),
        Err(e) => {
            doc.error = Some(format!("{e:#}"));
            if out.json || out.output.is_some() {
                emit(out, &doc, None)?;
            }
            Err(e)
        }
    }
}

fn lists(w: &WorkloadArgs) -> anyhow::Result<(JobSpec, Sweep)> {
    let sweep = Sweep {
        rw: parse_list(&w.rw, RwMode::parse)?,
        bs: match &w.sweep_bs {
            Some(l) => parse_list(l, parse_size)?,
            None => vec![snapblk_loadgen::parse_fio_bs(&w.bs)?],
        },
        iodepth: parse_list(&w.iodepth, |s| s.parse().map_err(|_| num_err("iodepth", s)))?,
        numjobs: parse_list(&w.numjobs, |s| s.parse().map_err(|_| num_err("numjobs", s)))?,
    };
    let base = JobSpec {
        name: w.name.first().cloned().unwrap_or_else(|| "cli".into()),
        named: !w.name.is_empty(),
        rw: *sweep.rw.first().unwrap_or(&RwMode::RandRead),
        rwmixread: w.rwmixread,
        bs: *sweep.bs.first().unwrap_or(&4096),
        iodepth: *sweep.iodepth.first().unwrap_or(&1),
        numjobs: *sweep.numjobs.first().unwrap_or(&1),
        size: w.size.as_deref().map(parse_size).transpose()?,
        offset: parse_size(&w.offset)?,
        offset_increment: parse_size(&w.offset_increment)?,
        runtime: w.runtime.as_deref().map(parse_secs).transpose()?,
        time_based: w.time_based,
        ramp_time: parse_secs(&w.ramp_time)?,
        direct: w.direct,
        verify: w.verify,
        seed: w.seed,
        buffers: snapblk_loadgen::BufferOpts {
            compress_percentage: w.buffer_compress_percentage,
            refill: w.refill_buffers,
            scramble: w.scramble_buffers,
        },
        batch: snapblk_loadgen::BatchOpts {
            iodepth_batch_submit: w.iodepth_batch_submit,
            iodepth_batch_complete_min: w.iodepth_batch_complete_min,
            iodepth_batch_complete_max: w.iodepth_batch_complete_max,
            submit_with_wait: w.submit_with_wait,
        },
        invalidate: w.invalidate,
        iomem: w.iomem,
    };
    Ok((base, sweep))
}

fn parse_iomem(s: &str) -> Result<snapblk_loadgen::Iomem, String> {
    snapblk_loadgen::Iomem::parse(s).map_err(|e| e.to_string())
}

/// fio-style boolean option values: 1/0, true/false, yes/no, on/off.
fn parse_flag(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("expected 0 or 1, got {s:?}")),
    }
}

fn num_err(what: &str, s: &str) -> snapblk_loadgen::Error {
    snapblk_loadgen::number_error(what, s)
}

/// What a workload run does, decided before any target is opened: the jobs, the target (a
/// path or device spec, after fio's --filename/--ioengine), and warnings about fio options
/// that are ignored.
struct Plan {
    jobs: Vec<JobSpec>,
    target: Option<String>,
    warnings: Vec<String>,
}

/// fio's environment expansion in job files: `${NAME}` is the variable's value; an unset
/// variable is an error (fio would use the text as it is, e.g. as a file name).
fn expand_env(text: &str) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(end) = after.find('}') else {
            bail!("unterminated ${{ in the job file");
        };
        let name = &after[..end];
        let v = std::env::var(name)
            .with_context(|| format!("the job file uses ${{{name}}}, which is not set"))?;
        out.push_str(&v);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Options of `snapblk bench` that are not fio's: left out when a command line with several
/// `--name` is read as a job file (`true`: takes a separate value, as `-o FILE`).
const SNAPBLK_OUTPUT_OPTS: &[(&str, bool)] = &[
    ("--json", false),
    ("--output-format", false),
    ("--output", true),
    ("-o", true),
    ("--plot", true),
    ("--repeat", true),
];

/// fio's multi-job command line (`--name=a ... --name=b ...`) as the job file fio reads it
/// as: options before the first `--name` in `[global]`, each `--name` a section; `--key=value`
/// is `key=value`, a bare `--key` a boolean, a bare word the target.
fn cmdline_job_file(args: &[String]) -> anyhow::Result<String> {
    let mut text = String::from("[global]\n");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (key, value) = match a.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (a.as_str(), None),
        };
        if let Some(&(_, takes)) = SNAPBLK_OUTPUT_OPTS.iter().find(|(o, _)| *o == key) {
            if takes && value.is_none() {
                it.next();
            }
            continue;
        }
        let Some(k) = key.strip_prefix("--") else {
            if key.starts_with('-') {
                bail!("{a}: with several --name, give fio's long options (--key=value)");
            }
            text.push_str(&format!("filename={a}\n"));
            continue;
        };
        if k == "name" {
            let v = match value {
                Some(v) => v.to_string(),
                None => it.next().cloned().context("--name needs a value")?,
            };
            text.push_str(&format!("[{v}]\n"));
            continue;
        }
        match value {
            Some(v) => text.push_str(&format!("{k}={v}\n")),
            None => text.push_str(&format!("{k}\n")),
        }
    }
    Ok(text)
}

/// A fio job file: not a snapblk TOML job file (no `[[job]]` table).
/// The longest job file read (fio's are a few KiB; `/dev/zero` would be read for ever).
const MAX_JOB_FILE: u64 = 16 << 20;

/// The text of `--job-file`, at most [`MAX_JOB_FILE`] bytes.
fn read_job_file(p: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(p).with_context(|| format!("read {}", p.display()))?;
    let mut text = String::new();
    f.take(MAX_JOB_FILE + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("read {}", p.display()))?;
    if text.len() as u64 > MAX_JOB_FILE {
        anyhow::bail!(
            "{}: longer than {} MiB; not a job file",
            p.display(),
            MAX_JOB_FILE >> 20
        );
    }
    Ok(text)
}

fn is_fio_job_file(text: &str) -> bool {
    !text.lines().any(|l| l.trim_start().starts_with("[["))
}

fn plan(w: &WorkloadArgs) -> anyhow::Result<Plan> {
    let mut warnings = Vec::new();
    if w.name.len() > 1 {
        return plan_cmdline_jobs(w, warnings);
    }
    for (name, v) in [
        ("norandommap", &w.norandommap),
        ("randrepeat", &w.randrepeat),
    ] {
        if v.is_some() {
            warnings.push(format!(
                "ignored fio option --{name} (not supported by snapblk)"
            ));
        }
    }
    if w.output_format.as_deref() == Some("json+") {
        warnings.push("--output-format=json+ is written as json".into());
    }
    // `snapblk bench JOBS.fio`: fio's own way of naming a job file.
    let (job_file, cli_target) = match (&w.job_file, &w.target) {
        (None, Some(t)) if t.ends_with(".fio") && Path::new(t).is_file() => {
            (Some(PathBuf::from(t)), None)
        }
        (j, t) => (j.clone(), t.clone()),
    };
    if cli_target.is_some() && w.filename.is_some() {
        bail!("give the target once: as TARGET or as --filename");
    }
    let (base, sweep) = lists(w)?;
    let mut fio = snapblk_loadgen::FioTarget {
        filename: w.filename.clone().or(cli_target),
        ioengine: w.ioengine.clone(),
        libblkio_driver: w.libblkio_driver.clone(),
        ..Default::default()
    };
    let jobs = match &job_file {
        Some(p) => {
            let text = read_job_file(p)?;
            if is_fio_job_file(&text) {
                let text = expand_env(&text).with_context(|| format!("{}", p.display()))?;
                let f = snapblk_loadgen::parse_fio_job_file(&text, &base)
                    .with_context(|| format!("fio job file {}", p.display()))?;
                // The command line wins over the file, as fio's does.
                fio.filename = fio.filename.or(f.target.filename);
                fio.ioengine = fio.ioengine.or(f.target.ioengine);
                fio.libblkio_driver = fio.libblkio_driver.or(f.target.libblkio_driver);
                fio.libblkio_path = f.target.libblkio_path;
                fio.libblkio_props = f.target.libblkio_props;
                warnings.extend(
                    f.warnings
                        .into_iter()
                        .map(|w| format!("{}: {w}", p.display())),
                );
                f.jobs
            } else {
                snapblk_loadgen::parse_job_file(&text, &base)?
            }
        }
        None => {
            base.validate()?;
            sweep.expand(&base)
        }
    };
    let target = if !w.libblkio.is_empty() {
        if let Some(e) = fio.ioengine.as_deref().filter(|e| *e != "libblkio") {
            bail!("--ioengine={e} and --libblkio: the library is the engine");
        }
        fio.filename
    } else if fio.ioengine.is_none() && fio.libblkio_driver.is_none() {
        fio.filename
    } else {
        if fio.ioengine.is_none() {
            fio.ioengine = Some("libblkio".into());
        }
        let (spec, warn) = fio.device_spec(null_reach(&jobs))?;
        warnings.extend(warn);
        Some(spec)
    };
    Ok(Plan {
        jobs,
        target,
        warnings,
    })
}

/// A fio command line with several `--name`: its jobs, read as fio reads them (see
/// [`cmdline_job_file`]), on the target its options name.
fn plan_cmdline_jobs(w: &WorkloadArgs, mut warnings: Vec<String>) -> anyhow::Result<Plan> {
    if w.job_file.is_some() || !w.libblkio.is_empty() {
        bail!("several --name: no --job-file or --libblkio");
    }
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .skip_while(|a| a != "bench")
        .skip(1)
        .collect();
    let text = cmdline_job_file(&args)?;
    let f = snapblk_loadgen::parse_fio_job_file(&text, &JobSpec::default())
        .context("the command line's jobs")?;
    // The job file's line numbers mean nothing to whoever typed the command line.
    warnings.extend(f.warnings.into_iter().map(|w| match w.split_once(": ") {
        Some((l, rest)) if l.starts_with("line ") => rest.to_string(),
        _ => w,
    }));
    let (spec, warn) = f.target.device_spec(null_reach(&f.jobs))?;
    warnings.extend(warn);
    Ok(Plan {
        jobs: f.jobs,
        target: Some(spec),
        warnings,
    })
}

/// What fio's null engine would be sized to: the furthest any job reaches.
fn null_reach(jobs: &[JobSpec]) -> Option<u64> {
    jobs.iter()
        .filter_map(|j| {
            // Saturating: an absurd offset_increment is refused by the run, not here.
            let last = u64::from(j.numjobs.saturating_sub(1)).saturating_mul(j.offset_increment);
            Some(j.offset.saturating_add(last).saturating_add(j.size?))
        })
        .max()
}

/// `[LABEL=]PATH.so` of `--libblkio`: a label is a leading word without `/` before `=`.
fn lib_arg(s: &str) -> (Option<&str>, &str) {
    match s.split_once('=') {
        Some((l, p)) if !l.is_empty() && !l.contains('/') => (Some(l), p),
        _ => (None, s),
    }
}

/// A benchmark target and its label (with several targets).
type LabelledTarget = (Option<String>, Box<dyn Target>);

/// The benchmark targets, labelled when there are several (repeated `--libblkio`).
fn open_targets(w: &WorkloadArgs, target: Option<&str>) -> anyhow::Result<Vec<LabelledTarget>> {
    if w.libblkio.len() <= 1 {
        return Ok(vec![(
            None,
            open_target(w, target, w.libblkio.first().map(|s| lib_arg(s).1))?,
        )]);
    }
    let mut out: Vec<LabelledTarget> = Vec::new();
    for a in &w.libblkio {
        let (label, path) = lib_arg(a);
        let label = label.unwrap_or(path).to_string();
        if out.iter().any(|(l, _)| l.as_deref() == Some(&label)) {
            bail!("--libblkio {label:?} given twice: label them, e.g. --libblkio mine={path}");
        }
        out.push((Some(label), open_target(w, target, Some(path))?));
    }
    Ok(out)
}

fn open_target(
    w: &WorkloadArgs,
    target: Option<&str>,
    lib: Option<&str>,
) -> anyhow::Result<Box<dyn Target>> {
    if let Some(lib) = lib {
        let lib = Path::new(lib);
        let driver = w.driver.as_deref().unwrap_or_default();
        let mut props = Vec::new();
        for p in &w.props {
            let (k, v) = p
                .split_once('=')
                .with_context(|| format!("--prop {p:?}: expected KEY=VALUE"))?;
            props.push((k.to_string(), v.to_string()));
        }
        if let Some(t) = target
            && !props.iter().any(|(k, _)| k == "path")
        {
            props.insert(0, ("path".into(), t.to_string()));
        }
        return Ok(Box::new(LibblkioTarget::new(lib, driver, props)?));
    }
    let Some(t) = target else {
        bail!("bench: give a TARGET (path or device spec), --filename or --libblkio")
    };
    Ok(Box::new(SpecTarget::new(t)))
}

/// A repeated SIGINT/SIGTERM sooner than this after the first is the same interrupt delivered
/// twice (e.g. by `timeout`), not a request to quit at once.
const QUIT_AFTER: Duration = Duration::from_secs(1);

/// SIGINT/SIGTERM during any bench mode: the first one raises the stop flag (workload job
/// threads finish their in-flight I/Os, file tests stop and remove their file, fgbg kills and
/// reaps its commands and streams and restores the scheduler) and what was measured is
/// reported; another one at least [`QUIT_AFTER`] later exits at once, in case a device hangs
/// (fgbg's commands are still killed and reaped and its scheduler restored first). The exit
/// status is 128 + the first signal.
struct Interrupts {
    stop: Arc<AtomicBool>,
    signal: Arc<AtomicI32>,
}

impl Interrupts {
    /// Must run before any thread is started: the signals are blocked in this thread and in
    /// every thread started later, and taken by a watcher thread (child processes get a clean
    /// signal mask from `std::process::Command`).
    fn catch() -> anyhow::Result<Interrupts> {
        let sigs = TermSignals::block().context("blocking SIGINT/SIGTERM")?;
        let stop = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicI32::new(0));
        let (st, sg) = (stop.clone(), signal.clone());
        std::thread::spawn(move || {
            let mut first: Option<std::time::Instant> = None;
            loop {
                let Some(s) = sigs.wait(Duration::from_secs(3600)) else {
                    continue;
                };
                match first {
                    None => {
                        first = Some(std::time::Instant::now());
                        sg.store(s, Ordering::SeqCst);
                        // Nobody to report a failure to in this thread.
                        let _ = errln!(
                            "snapblk: {}: stopping, partial results follow (again to quit at once)",
                            signal_name(s)
                        );
                        st.store(true, Ordering::SeqCst);
                    }
                    // One logical interrupt often arrives twice: GNU timeout signals its child
                    // and then its whole process group, a terminal's Ctrl-C reaches every
                    // process of the foreground group. Only a repeat a person could have
                    // sent deliberately means "quit now".
                    Some(t) if t.elapsed() < QUIT_AFTER => {}
                    Some(_) => {
                        let _ = errln!("snapblk: {}: giving up at once", signal_name(s));
                        // Children killed and reaped, the scheduler put back: an impatient
                        // user must not be left with a changed device or stray commands.
                        fgbg::emergency_cleanup();
                        std::process::exit(128 + sg.load(Ordering::SeqCst));
                    }
                }
            }
        });
        Ok(Interrupts { stop, signal })
    }

    fn signal(&self) -> Option<i32> {
        Some(self.signal.load(Ordering::SeqCst)).filter(|&s| s != 0)
    }

    /// Like [`finish`], but after an interrupt: the partial results (table, or a complete,
    /// valid document marked `interrupted`), then exit 128 + the signal number. `parts`
    /// describes what the partial results hold, e.g. "3 runs".
    fn conclude(
        &self,
        out: &OutArgs,
        mut doc: Document,
        res: anyhow::Result<Option<String>>,
        parts: &str,
    ) -> anyhow::Result<()> {
        let Some(sig) = self.signal() else {
            return finish(out, doc, res);
        };
        let name = signal_name(sig);
        let msg = format!("interrupted by {name}: partial results ({parts})");
        doc.interrupted = Some(name.into());
        doc.error = Some(match &res {
            Ok(_) => msg.clone(),
            Err(e) => format!("{msg}; {e:#}"),
        });
        emit(out, &doc, res.ok().flatten())?;
        // The exit status says it already if stderr is gone.
        let _ = errln!("snapblk: {msg}");
        std::process::exit(128 + sig);
    }
}

fn run_workload(mut w: WorkloadArgs) -> anyhow::Result<()> {
    if matches!(w.output_format.as_deref(), Some("json" | "json+")) {
        w.out.json = true;
    }
    let named = [
        ("--job-file", w.job_file.as_deref()),
        ("TARGET", w.target.as_deref().map(Path::new)),
        ("--filename", w.filename.as_deref().map(Path::new)),
    ];
    let inputs: Vec<(&str, &Path)> = named
        .iter()
        .filter_map(|(f, p)| p.map(|p| (*f, p)))
        .collect();
    w.out.check(&inputs)?;
    let intr = Interrupts::catch()?;
    let planned = plan(&w)
        .and_then(|p| open_targets(&w, p.target.as_deref()).map(|t| (p.jobs, p.warnings, t)));
    let targets = planned.as_ref().map(|(_, _, t)| t);
    let (desc, path) = match targets.map(Vec::as_slice) {
        Ok([(_, t), ..]) => (
            Some(TargetDesc {
                // Several libraries: all of them (each result names its own).
                spec: targets
                    .into_iter()
                    .flatten()
                    .map(|(_, t)| t.describe())
                    .collect::<Vec<_>>()
                    .join("; "),
                driver: t.driver(),
            }),
            t.path(),
        ),
        _ => (None, None),
    };
    let ctx = snapblk_loadgen::capture(path.as_deref());
    let doc = Document::new("workload", ctx, desc);
    let mut results: Vec<ConfigReport> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    let res = (|| -> anyhow::Result<Option<String>> {
        let (mut jobs, plan_warnings, mut targets) = planned?;
        warnings.extend(plan_warnings);
        // Before the run, not after it: a long run must not end in "cannot write the plots".
        if let Some(dir) = &w.plot {
            std::fs::create_dir_all(dir).with_context(|| format!("--plot {}", dir.display()))?;
        }
        for (_, t) in &mut targets {
            warnings.extend(snapblk_loadgen::effective_direct(&**t, &mut jobs));
            t.set_read_only(snapblk_loadgen::jobs_read_only(&jobs));
        }
        let mut labelled: Vec<snapblk_loadgen::Labelled> = targets
            .iter_mut()
            .map(|(l, t)| snapblk_loadgen::Labelled {
                label: l.clone(),
                target: &mut **t,
            })
            .collect();
        let tty = std::io::stderr().is_terminal();
        let n_targets = labelled.len();
        let spinner = std::cell::RefCell::new(None);
        let on_progress = |ev: snapblk_loadgen::RunProgress| {
            *spinner.borrow_mut() = match ev {
                snapblk_loadgen::RunProgress::Start { label, completed } => {
                    Some(crate::progress::RunSpinner::start(label, completed))
                }
                snapblk_loadgen::RunProgress::End => None,
            };
        };
        results = snapblk_loadgen::run_matrix_on(
            &mut labelled,
            &jobs,
            w.repeat,
            tty.then_some(&on_progress as &dyn Fn(snapblk_loadgen::RunProgress)),
            Some(intr.stop.clone()),
            |rep, job, r| {
                if !tty && (jobs.len() * n_targets > 1 || w.repeat > 1) {
                    crate::out::errln_deferred(format_args!(
                        "rep {} {}: {:.0} IOPS",
                        rep + 1,
                        job.label(),
                        r.iops()
                    ));
                }
            },
        )?;
        if let Some(dir) = &w.plot {
            // The measurements stand without their charts: a failure here is a warning.
            match plot::write_all(dir, &results) {
                Ok(files) => {
                    for f in files {
                        errln!("wrote {}", f.display())?;
                    }
                }
                Err(e) => warnings.push(format!("plots in {}: {e}", dir.display())),
            }
        }
        // fio's order: slat, clat, lat.
        let pcts: Vec<LatKind> = [
            (w.slat_percentiles, LatKind::Slat),
            (w.clat_percentiles, LatKind::Clat),
            (w.lat_percentiles, LatKind::Lat),
        ]
        .into_iter()
        .filter_map(|(on, k)| on.then_some(k))
        .collect();
        Ok(Some(workload_table(&results, &pcts)))
    })();
    let mut doc = doc;
    warnings.extend(noise_warnings(&results, &doc.context));
    doc.warnings = warnings;
    doc.results = results;
    let runs: usize = doc.results.iter().map(|r| r.runs.len()).sum();
    intr.conclude(&w.out, doc, res, &format!("{runs} runs"))
}

fn run_file(f: FileArgs) -> anyhow::Result<()> {
    f.out.check(&[])?;
    let intr = Interrupts::catch()?;
    let ctx = snapblk_loadgen::capture(Some(&f.dir));
    let mut doc = Document::new("file", ctx, None);
    let res = (|| -> anyhow::Result<Option<String>> {
        let spec = fileio::FileTestSpec {
            dir: f.dir.clone(),
            file_sizes: parse_list(&f.file_size, parse_size)?,
            record_sizes: parse_list(&f.record_size, parse_size)?,
            tests: f
                .tests
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            fsync: f.fsync,
            direct: f.direct,
            drop_cache: f.drop_cache,
            seed: 1,
        };
        let r = fileio::run_file_tests(&spec, Some(&intr.stop), |c| {
            if !std::io::stderr().is_terminal() {
                return;
            }
            crate::out::err_deferred(format_args!(
                "\r{} {} {}: {:.1} MiB/s   ",
                fmt_size(c.file_size),
                fmt_size(c.record_size),
                c.test,
                c.mib_s
            ));
        })?;
        if std::io::stderr().is_terminal() {
            errln!()?;
        }
        let t = fileio::file_table(&r);
        doc.file_tests = Some(serde_json::to_value(&r)?);
        Ok(Some(t))
    })();
    let cells = doc
        .file_tests
        .as_ref()
        .and_then(|v| v["cells"].as_array())
        .map_or(0, Vec::len);
    intr.conclude(&f.out, doc, res, &format!("{cells} cells"))
}

fn run_overwrite(o: OverwriteArgs) -> anyhow::Result<()> {
    o.out.check(&[])?;
    let intr = Interrupts::catch()?;
    let ctx = snapblk_loadgen::capture(Some(&o.dir));
    let mut doc = Document::new("file", ctx, None);
    let res = (|| -> anyhow::Result<Option<String>> {
        let unit = parse_size(&o.unit)?;
        let variants: Vec<bool> = if o.fsync {
            vec![true]
        } else if o.no_fsync {
            vec![false]
        } else {
            vec![false, true]
        };
        let mut reps = Vec::new();
        let mut rows = vec![
            [
                "size",
                "unit",
                "fsync",
                "create MiB/s",
                "overwrite MiB/s",
                "op mean",
                "op p99",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
        ];
        for fs in variants {
            // 1 KiB writes with fdatasync over a large file take minutes: show how far it is
            // (drawn only on a terminal, cleared before the table).
            let mut bar = crate::progress::BytesProgress::start();
            let fsync = if fs { "with fsync" } else { "no fsync" };
            let r = fileio::overwrite_test_with(
                &o.dir,
                &fileio::RealIo,
                o.mb << 20,
                unit,
                fs,
                Some(&intr.stop),
                &mut |phase, done, total| bar.set(&format!("{phase} ({fsync})"), done, total),
            )?;
            drop(bar);
            let Some(r) = r else {
                break; // interrupted: the variant in progress measured only part of the file
            };
            rows.push(vec![
                fmt_size(r.size),
                fmt_size(r.unit),
                if fs { "yes" } else { "no" }.into(),
                format!("{:.1}", r.create_mib_s),
                format!("{:.2}", r.overwrite_mib_s),
                format!("{:.1}µs", r.op_mean_us),
                format!("{:.1}µs", r.op_p99_us),
            ]);
            reps.push(r);
        }
        // The schema wants at least one variant; an interrupt before the first leaves none.
        if !reps.is_empty() {
            doc.file_tests = Some(serde_json::json!({ "overwrite": reps }));
        }
        Ok(Some(snapblk_loadgen::text_table(&rows)))
    })();
    let variants = doc
        .file_tests
        .as_ref()
        .and_then(|v| v["overwrite"].as_array())
        .map_or(0, Vec::len);
    intr.conclude(&o.out, doc, res, &format!("{variants} variants"))
}

fn run_fgbg(f: FgBgArgs) -> anyhow::Result<()> {
    // A panic anywhere must not leave the device's scheduler switched or background commands
    // running (dropping a Child does not kill it).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        fgbg::emergency_cleanup();
        default_hook(info);
    }));
    let mut inputs: Vec<(&str, &Path)> = Vec::new();
    inputs.extend(f.bg_read.iter().map(|p| ("--bg-read", p.as_path())));
    inputs.extend(f.bg_write.iter().map(|p| ("--bg-write", p.as_path())));
    inputs.extend(f.fg_list.iter().map(|p| ("--fg-list", p.as_path())));
    inputs.extend(f.fg_target.iter().map(|t| ("--fg-target", Path::new(t))));
    f.out.check(&inputs)?;
    let intr = Interrupts::catch()?;
    let ctx = snapblk_loadgen::capture(f.device.as_deref().or(f.bg_read.first().map(Path::new)));
    let mut doc = Document::new("fgbg", ctx, None);
    let res = (|| -> anyhow::Result<Option<String>> {
        let bg_size = parse_size(&f.bg_size)?;
        let mut background: Vec<fgbg::Background> = f
            .bg_read
            .iter()
            .map(|p| fgbg::Background::Read { path: p.clone() })
            .collect();
        background.extend(f.bg_write.iter().map(|p| fgbg::Background::Write {
            path: p.clone(),
            size: bg_size,
        }));
        background.extend(
            f.bg_cmd
                .iter()
                .map(|c| fgbg::Background::Cmd { cmd: c.clone() }),
        );
        if background.is_empty() {
            bail!("fgbg: give at least one --bg-read, --bg-write or --bg-cmd");
        }
        let mut target: Option<Box<dyn Target>> = None;
        let foreground = if let Some(c) = &f.fg_cmd {
            fgbg::Foreground::Cmd { cmd: c.clone() }
        } else if let Some(l) = &f.fg_list {
            fgbg::Foreground::ReadList { list: l.clone() }
        } else if let Some(t) = &f.fg_target {
            let mut tgt = SpecTarget::new(t.clone());
            let mut job = JobSpec {
                name: "foreground".into(),
                rw: RwMode::parse(&f.rw)?,
                bs: parse_size(&f.bs)?,
                iodepth: f.iodepth,
                size: Some(parse_size(&f.size)?),
                direct: f.direct,
                // fgbg decides about caches itself (--drop-caches).
                invalidate: false,
                ..Default::default()
            };
            job.validate()?;
            doc.warnings.extend(snapblk_loadgen::effective_direct(
                &tgt,
                std::slice::from_mut(&mut job),
            ));
            tgt.set_read_only(snapblk_loadgen::jobs_read_only(std::slice::from_ref(&job)));
            target = Some(Box::new(tgt));
            fgbg::Foreground::Workload { job }
        } else {
            bail!("fgbg: give --fg-cmd, --fg-list or --fg-target");
        };
        let spec = fgbg::FgBgSpec {
            background,
            foreground,
            iterations: f.iterations,
            warmup: parse_secs(&f.warmup)?,
            pause: parse_secs(&f.pause)?,
            bg_direct: f.bg_direct,
            drop_caches: f.drop_caches,
            schedulers: f
                .schedulers
                .as_deref()
                .map(|s| parse_list(s, |x| Ok(x.to_string())))
                .transpose()?
                .unwrap_or_default(),
            device: f.device.clone(),
            fg_timeout: parse_secs(&f.fg_timeout)?,
        };
        let t: Option<&mut dyn Target> = match target.as_mut() {
            Some(b) => Some(&mut **b),
            None => None,
        };
        let r = fgbg::run_fgbg(&spec, t, Some(intr.stop.clone()), |m| {
            crate::out::errln_deferred(format_args!("{m}"))
        })?;
        let table = fgbg::fgbg_table(&r);
        doc.fgbg = Some(serde_json::to_value(&r)?);
        doc.warnings.extend(r.warnings);
        Ok(Some(table))
    })();
    let cells = doc
        .fgbg
        .as_ref()
        .and_then(|v| v["cells"].as_array())
        .map_or(0, Vec::len);
    intr.conclude(&f.out, doc, res, &format!("{cells} cells"))
}
