//! Workload descriptions: fio-named parameters, sweeps, TOML job files.

use crate::{Error, Result};
use serde::Serialize;
use std::fmt;

/// The access pattern (fio's `rw=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RwMode {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential mix of reads and writes (`rwmixread` percent reads).
    Rw,
    /// Random mix.
    RandRw,
}

impl RwMode {
    /// Parses fio's name of a mode (`read`, `write`, `randread`, `randwrite`, `rw` or
    /// `readwrite`, `randrw`; any case).
    pub fn parse(s: &str) -> Result<RwMode> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "read" => RwMode::Read,
            "write" => RwMode::Write,
            "randread" => RwMode::RandRead,
            "randwrite" => RwMode::RandWrite,
            "rw" | "readwrite" => RwMode::Rw,
            "randrw" => RwMode::RandRw,
            o => {
                return Err(Error::Spec(format!(
                    "unknown rw mode {o:?} (read, write, randread, randwrite, rw, randrw)"
                )));
            }
        })
    }
    /// Whether offsets are random.
    pub fn is_random(self) -> bool {
        matches!(self, RwMode::RandRead | RwMode::RandWrite | RwMode::RandRw)
    }
    /// Percentage of reads for this mode given `rwmixread`.
    pub fn read_pct(self, rwmixread: u32) -> u32 {
        match self {
            RwMode::Read | RwMode::RandRead => 100,
            RwMode::Write | RwMode::RandWrite => 0,
            RwMode::Rw | RwMode::RandRw => rwmixread.min(100),
        }
    }
    /// fio's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
            RwMode::RandRead => "randread",
            RwMode::RandWrite => "randwrite",
            RwMode::Rw => "rw",
            RwMode::RandRw => "randrw",
        }
    }
}

impl fmt::Display for RwMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where I/O buffers come from (fio's `iomem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Iomem {
    /// Private anonymous memory, as `malloc` gives (fio's default). Registered with the
    /// driver all the same, so io_uring still uses fixed buffers.
    #[default]
    Malloc,
    /// Shared memfd memory from the device's `alloc_mem_region`, as libblkio applications
    /// (fio's libblkio engine, QEMU with vhost-user) use. Pinning its pages costs more on every
    /// O_DIRECT system call that is not served from registered buffers.
    Memfd,
}

impl Iomem {
    /// Parses `malloc` or `memfd` (any case).
    pub fn parse(s: &str) -> Result<Iomem> {
        match s.trim().to_ascii_lowercase().as_str() {
            "malloc" => Ok(Iomem::Malloc),
            "memfd" => Ok(Iomem::Memfd),
            o => Err(Error::Spec(format!("unknown iomem {o:?} (malloc, memfd)"))),
        }
    }
}

/// Longest runtime or ramp accepted, in seconds (about 31 years: far beyond any real run, and
/// far from where adding it to a clock reading could overflow).
pub(crate) const MAX_SECS: f64 = 1e9;

/// One workload configuration (one cell of a sweep).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobSpec {
    /// The job's name (`job` unless given).
    pub name: String,
    /// `name` was given (a job file's `name` key): tables, plots and labels show it.
    #[serde(skip)]
    pub named: bool,
    /// The access pattern.
    pub rw: RwMode,
    /// Percentage of reads in `rw`/`randrw`.
    pub rwmixread: u32,
    /// Block size in bytes.
    pub bs: u64,
    /// Requests kept in flight per job.
    pub iodepth: u32,
    /// Job threads, each with its own queue. As in fio, every job covers `size` bytes from
    /// `offset + job * offset_increment` (with the default increment 0 all jobs share one region).
    pub numjobs: u32,
    /// Bytes each job covers (fio's `size`); `None`: from its start to the end of the target.
    pub size: Option<u64>,
    /// Start of the first job's region.
    pub offset: u64,
    /// Distance between the starts of consecutive jobs' regions (fio's `offset_increment`).
    pub offset_increment: u64,
    /// Seconds of measurement at most; `None`: until the pass over the region is done.
    pub runtime: Option<f64>,
    /// Loop over the region until `runtime` has passed (fio's `time_based`); without it a job
    /// stops after one pass or at `runtime`, whichever comes first, as fio does.
    pub time_based: bool,
    /// Seconds run before measurement starts.
    pub ramp_time: f64,
    /// O_DIRECT (when the target honours it).
    pub direct: bool,
    /// Check read data against what was written (the region is written first).
    pub verify: bool,
    /// Seed of random offsets and verify patterns.
    pub seed: u64,
    /// Write-buffer contents outside verify mode (fio's `buffer_compress_percentage`,
    /// `refill_buffers`, `scramble_buffers`; flattened into the JSON spec under those names).
    #[serde(flatten)]
    pub buffers: crate::buffer::BufferOpts,
    /// How requests are submitted and reaped (fio's `iodepth_batch_*`; flattened into the
    /// JSON spec under those names).
    #[serde(flatten)]
    pub batch: BatchOpts,
    /// Drop the target file's page cache for the covered region before the run (fio's
    /// `invalidate`, default on; block devices: `BLKFLSBUF`, as fio).
    pub invalidate: bool,
    /// Where the I/O buffers come from (fio's `iomem`).
    pub iomem: Iomem,
}

/// Submission and completion batching, with fio's names, meanings and defaults. They decide how
/// many `io_uring_enter` calls a run makes per I/O, which matters wherever the submitting thread
/// competes for a CPU with the kernel's io-wq workers or the device (2-CPU machines, tmpfs and
/// zram, which punt every request to io-wq).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BatchOpts {
    /// Submit when this many requests are queued (fio `iodepth_batch_submit`, default 1: every
    /// request is submitted as soon as it is queued, one `do_io` each). 0 means `iodepth`.
    pub iodepth_batch_submit: u32,
    /// When the queue is full, wait for at least this many completions (fio
    /// `iodepth_batch_complete_min`, default 1; 0 behaves as 1 when the queue is full).
    pub iodepth_batch_complete_min: u32,
    /// Handle at most this many completions per reap (fio `iodepth_batch_complete_max`; fio's
    /// default is `iodepth_batch_complete_min`, i.e. 1). Further completions wait, counted as
    /// in flight, until a later reap takes them — as CQEs left in fio's ring do — so their
    /// latency ends when the tool sees them. 0 means `iodepth`.
    pub iodepth_batch_complete_max: u32,
    /// snapblk's own: never submit separately; queued requests reach the driver with the next
    /// wait for completions (one `do_io` per refill, as libblkio applications usually do). This
    /// is what lets the io_uring driver run QD1 requests inline (`inline-qd1`), which it only
    /// does when the caller waits for everything it submits. Overrides `iodepth_batch_submit`.
    pub submit_with_wait: bool,
}

impl Default for BatchOpts {
    fn default() -> Self {
        BatchOpts {
            iodepth_batch_submit: 1,
            iodepth_batch_complete_min: 1,
            iodepth_batch_complete_max: 1,
            submit_with_wait: false,
        }
    }
}

impl BatchOpts {
    /// Requests queued before a submission, for `iodepth` (fio: 0 or more than iodepth means
    /// iodepth; `submit_with_wait`: never).
    pub fn submit_batch(&self, iodepth: u32) -> usize {
        if self.submit_with_wait {
            return usize::MAX;
        }
        let b = self.iodepth_batch_submit;
        (if b == 0 || b > iodepth { iodepth } else { b }) as usize
    }

    /// `(min, max)` completions to reap when the queue is full with `inflight` requests (fio's
    /// `wait_for_completions` + `td_io_getevents`: at least one, at most what is in flight).
    pub fn reap_range(&self, inflight: usize) -> (usize, usize) {
        let cmin = self.iodepth_batch_complete_min as usize;
        let min = cmin.min(inflight).max(1);
        let cmax = match self.iodepth_batch_complete_max as usize {
            0 => inflight,
            m => m.max(cmin),
        };
        (min, cmax.min(inflight).max(min))
    }
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            name: "job".into(),
            named: false,
            rw: RwMode::Read,
            rwmixread: 50,
            bs: 4096,
            iodepth: 1,
            numjobs: 1,
            size: None,
            offset: 0,
            offset_increment: 0,
            runtime: None,
            time_based: false,
            ramp_time: 0.0,
            direct: false,
            verify: false,
            seed: 0x5eed_b10c,
            buffers: crate::buffer::BufferOpts::default(),
            batch: BatchOpts::default(),
            invalidate: true,
            iomem: Iomem::Malloc,
        }
    }
}

impl JobSpec {
    /// Check the parameters that do not depend on the target.
    pub fn validate(&self) -> Result<()> {
        if self.bs == 0 || self.bs > (64 << 20) {
            return Err(Error::Spec(format!("bs {} must be in 1..=64MiB", self.bs)));
        }
        if self.iodepth == 0 || self.iodepth > 4096 {
            return Err(Error::Spec(format!(
                "iodepth {} must be in 1..=4096",
                self.iodepth
            )));
        }
        if self.numjobs == 0 || self.numjobs > 256 {
            return Err(Error::Spec(format!(
                "numjobs {} must be in 1..=256",
                self.numjobs
            )));
        }
        if self.buffers.compress_percentage > 100 {
            return Err(Error::Spec(
                "buffer_compress_percentage must be 0..=100".into(),
            ));
        }
        if self.rwmixread > 100 {
            return Err(Error::Spec("rwmixread must be 0..=100".into()));
        }
        if let Some(r) = self.runtime
            && (!r.is_finite() || r <= 0.0 || r > MAX_SECS)
        {
            return Err(Error::Spec(format!(
                "runtime must be > 0 and at most {MAX_SECS} seconds"
            )));
        }
        if self.time_based && self.runtime.is_none() {
            return Err(Error::Spec("time_based needs a runtime".into()));
        }
        if !self.ramp_time.is_finite() || self.ramp_time < 0.0 || self.ramp_time > MAX_SECS {
            return Err(Error::Spec(format!(
                "ramp_time must be >= 0 and at most {MAX_SECS} seconds"
            )));
        }
        Ok(())
    }

    /// Check `bs`, `offset` and `size` (when given) against the alignment the opened target
    /// requires, so that a misaligned job fails before any I/O with a message naming the
    /// option, not mid-run with EINVAL. The regions jobs cover are then aligned as well (they
    /// start at `offset` and are cut to multiples of `bs`).
    pub fn check_alignment(&self, a: &crate::target::Alignment) -> Result<()> {
        let what = if self.direct {
            "direct I/O alignment"
        } else {
            "I/O alignment"
        };
        let opts = [
            ("bs", Some(self.bs)),
            ("offset", Some(self.offset)),
            ("offset_increment", Some(self.offset_increment)),
            ("size", self.size),
        ];
        for (name, v) in opts {
            if let Some(v) = v
                && !v.is_multiple_of(a.request)
            {
                return Err(Error::Spec(format!(
                    "--{name} {v} is not a multiple of the target's {}-byte {what}",
                    a.request
                )));
            }
        }
        Ok(())
    }

    /// Short label used in tables and plots, e.g. `randread bs=4k qd=32 jobs=1`, after the
    /// job's name if it has one (`seq: read bs=1M qd=1 jobs=1`).
    pub fn label(&self) -> String {
        format!(
            "{}{} bs={} qd={} jobs={}",
            self.name_prefix(),
            self.rw,
            fmt_size(self.bs),
            self.iodepth,
            self.numjobs
        )
    }

    /// A job that writes (a write mode, a read/write mix, or `verify`, which writes its region
    /// first) on a target opened read-only: refused before the first I/O.
    pub fn check_writable(&self, target_read_only: bool) -> Result<()> {
        if !target_read_only {
            return Ok(());
        }
        let what = if self.rw.read_pct(self.rwmixread) < 100 {
            format!("--rw {} writes", self.rw.name())
        } else if self.verify {
            "--verify writes the region first".to_string()
        } else {
            return Ok(());
        };
        Err(Error::Spec(format!(
            "{}{what}, but the target is read-only (read-only=true in its spec, or a snapshot \
             without writable=true)",
            self.name_prefix()
        )))
    }

    /// `"name: "` for a named job, else empty.
    pub fn name_prefix(&self) -> String {
        if self.named {
            format!("{}: ", self.name)
        } else {
            String::new()
        }
    }

    /// The per-job regions `(start, len)` for a target of `capacity` bytes, as fio lays them
    /// out on one file: job `j` starts at `offset + j * offset_increment` and covers `size`
    /// bytes (default: up to the end of the target), rounded down to whole blocks.
    pub fn regions(&self, capacity: u64) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::with_capacity(self.numjobs as usize);
        for j in 0..u64::from(self.numjobs) {
            let start = j
                .checked_mul(self.offset_increment)
                .and_then(|d| d.checked_add(self.offset))
                .filter(|&s| s < capacity)
                .ok_or_else(|| {
                    Error::Spec(if j == 0 {
                        format!(
                            "offset {} is past the end of the target (capacity {capacity})",
                            self.offset
                        )
                    } else {
                        format!(
                            "job {j}'s offset {} + {j} x offset_increment {} is past the end of \
                             the target (capacity {capacity})",
                            self.offset, self.offset_increment
                        )
                    })
                })?;
            let avail = capacity - start;
            let size = self.size.unwrap_or(avail);
            if size > avail {
                return Err(Error::Spec(format!(
                    "size {size} + offset {start} (job {j}) exceeds the target's capacity {capacity}"
                )));
            }
            let len = size / self.bs * self.bs;
            if len == 0 {
                return Err(Error::Spec(format!(
                    "size {size} is smaller than bs {}",
                    self.bs
                )));
            }
            out.push((start, len));
        }
        Ok(out)
    }

    /// Whether some jobs' regions overlap (numjobs > 1 with an offset_increment below the
    /// region size): fine for reads and plain writes, not for verify.
    pub fn regions_overlap(regions: &[(u64, u64)]) -> bool {
        let mut r = regions.to_vec();
        r.sort_unstable();
        r.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0)
    }
}

/// Lists of values to combine with a base job: every `rw × bs × iodepth × numjobs` cell.
#[derive(Debug, Clone, Default)]
pub struct Sweep {
    /// Access patterns.
    pub rw: Vec<RwMode>,
    /// Block sizes, bytes.
    pub bs: Vec<u64>,
    /// Requests in flight per job.
    pub iodepth: Vec<u32>,
    /// Job threads.
    pub numjobs: Vec<u32>,
}

impl Sweep {
    /// Expand into concrete jobs (empty lists keep the base value).
    pub fn expand(&self, base: &JobSpec) -> Vec<JobSpec> {
        fn or<T: Clone>(v: &[T], d: T) -> Vec<T> {
            if v.is_empty() { vec![d] } else { v.to_vec() }
        }
        let (rws, bss, qds, njs) = (
            or(&self.rw, base.rw),
            or(&self.bs, base.bs),
            or(&self.iodepth, base.iodepth),
            or(&self.numjobs, base.numjobs),
        );
        let mut out = Vec::new();
        for &rw in &rws {
            for &bs in &bss {
                for &qd in &qds {
                    for &nj in &njs {
                        out.push(JobSpec {
                            rw,
                            bs,
                            iodepth: qd,
                            numjobs: nj,
                            ..base.clone()
                        });
                    }
                }
            }
        }
        out
    }
}

/// Parse a fio-style size: `4096`, `4k`, `4K`, `4KiB`, `64m`, `1G`, `2t` (binary units; the
/// grammar is [`snapblk_core::parse_size`]'s, shared with device specs).
pub fn parse_size(s: &str) -> Result<u64> {
    snapblk_core::parse_size(s).map_err(Error::Size)
}

/// The error for a number that does not parse: a range error for a negative one (`-1` for a
/// count), else "bad number".
pub fn number_error(what: &str, s: &str) -> Error {
    match s.trim().parse::<i64>() {
        Ok(n) if n < 0 => Error::Spec(format!("{what} {n} is out of range: it cannot be negative")),
        _ => Error::Spec(format!("{what}: bad number {s:?}")),
    }
}

/// Format a byte count compactly with binary units (`4k`, `1M`, `1536`).
pub fn fmt_size(n: u64) -> String {
    for (shift, u) in [(40, "T"), (30, "G"), (20, "M"), (10, "k")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{u}", n >> shift);
        }
    }
    n.to_string()
}

/// Parse a comma-separated list with `f` (`4k,64k`).
pub fn parse_list<T>(s: &str, f: impl Fn(&str) -> Result<T>) -> Result<Vec<T>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| f(p.trim()))
        .collect()
}

/// Parse a duration in seconds: `10`, `10s`, `500ms`, `2m`.
pub fn parse_secs(s: &str) -> Result<f64> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t.as_str(), 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| Error::Spec(format!("bad duration {s:?}")))?;
    if v < 0.0 && v.is_finite() {
        return Err(Error::Spec(format!(
            "duration {} is out of range: it cannot be negative",
            s.trim()
        )));
    }
    if !v.is_finite() || v < 0.0 {
        return Err(Error::Spec(format!("bad duration {s:?}")));
    }
    Ok(v * mult)
}

/// Parse a TOML job file into concrete jobs. Layout (fio-like, with lists meaning sweeps):
///
/// ```toml
/// [global]
/// size = "256M"
/// runtime = 5
/// [[job]]
/// name = "rand"
/// rw = "randread"
/// bs = ["4k", "64k"]
/// iodepth = [1, 32]
/// ```
///
/// Each `[[job]]` table overrides `[global]`, which overrides `base`.
pub fn parse_job_file(text: &str, base: &JobSpec) -> Result<Vec<JobSpec>> {
    let doc: toml::Table = text.parse().map_err(Error::JobFileSyntax)?;
    for k in doc.keys() {
        if k != "global" && k != "job" {
            return Err(Error::JobFile(format!(
                "unknown top-level key {k:?} (expected [global] and [[job]])"
            )));
        }
    }
    let empty = toml::Table::new();
    let global = match doc.get("global") {
        None => &empty,
        Some(toml::Value::Table(t)) => t,
        Some(_) => return Err(Error::JobFile("[global] must be a table".into())),
    };
    let jobs = match doc.get("job") {
        Some(toml::Value::Array(a)) => a.clone(),
        None => return Err(Error::JobFile("no [[job]] sections".into())),
        Some(_) => {
            return Err(Error::JobFile(
                "job must be an array of tables ([[job]])".into(),
            ));
        }
    };
    let mut out = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let toml::Value::Table(jt) = j else {
            return Err(Error::JobFile(format!("job #{i} is not a table")));
        };
        let mut spec = base.clone();
        spec.name = format!("job{i}");
        let mut sweep = Sweep::default();
        for t in [global, jt] {
            apply_table(t, &mut spec, &mut sweep)?;
        }
        spec.validate()?;
        for s in sweep.expand(&spec) {
            s.validate()?;
            out.push(s);
        }
    }
    Ok(out)
}

fn apply_table(t: &toml::Table, spec: &mut JobSpec, sweep: &mut Sweep) -> Result<()> {
    fn as_str(k: &str, v: &toml::Value) -> Result<String> {
        match v {
            toml::Value::String(s) => Ok(s.clone()),
            toml::Value::Integer(i) => Ok(i.to_string()),
            toml::Value::Float(f) => Ok(f.to_string()),
            toml::Value::Boolean(b) => Ok(b.to_string()),
            _ => Err(Error::JobFile(format!("{k}: expected a scalar"))),
        }
    }
    fn list(k: &str, v: &toml::Value) -> Result<Vec<String>> {
        match v {
            toml::Value::Array(a) => a.iter().map(|x| as_str(k, x)).collect(),
            _ => Ok(vec![as_str(k, v)?]),
        }
    }
    fn num<T: std::str::FromStr>(k: &str, s: &str) -> Result<T> {
        s.parse()
            .map_err(|_| Error::JobFile(format!("{k}: bad number {s:?}")))
    }
    fn boolean(k: &str, s: &str) -> Result<bool> {
        match s {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err(Error::JobFile(format!("{k}: expected a boolean"))),
        }
    }
    for (k, v) in t {
        let vals = list(k, v)?;
        if vals.is_empty() {
            return Err(Error::JobFile(format!("{k}: an empty list")));
        }
        let one = || -> Result<&String> {
            match vals.as_slice() {
                [x] => Ok(x),
                _ => Err(Error::JobFile(format!(
                    "{k}: only rw, bs, iodepth and numjobs may be lists"
                ))),
            }
        };
        match k.as_str() {
            "name" => {
                spec.name = one()?.clone();
                spec.named = true;
            }
            "rw" | "readwrite" => {
                sweep.rw = vals
                    .iter()
                    .map(|s| RwMode::parse(s))
                    .collect::<Result<_>>()?;
                spec.rw = sweep.rw[0];
            }
            "bs" | "blocksize" => {
                sweep.bs = vals.iter().map(|s| parse_size(s)).collect::<Result<_>>()?;
                spec.bs = sweep.bs[0];
            }
            "iodepth" => {
                sweep.iodepth = vals.iter().map(|s| num(k, s)).collect::<Result<_>>()?;
                spec.iodepth = sweep.iodepth[0];
            }
            "numjobs" => {
                sweep.numjobs = vals.iter().map(|s| num(k, s)).collect::<Result<_>>()?;
                spec.numjobs = sweep.numjobs[0];
            }
            "rwmixread" => spec.rwmixread = num(k, one()?)?,
            "size" => spec.size = Some(parse_size(one()?)?),
            "offset" => spec.offset = parse_size(one()?)?,
            "offset_increment" => spec.offset_increment = parse_size(one()?)?,
            "runtime" => spec.runtime = Some(parse_secs(one()?)?),
            "ramp_time" | "ramp-time" => spec.ramp_time = parse_secs(one()?)?,
            "direct" => spec.direct = boolean(k, one()?)?,
            "verify" => spec.verify = boolean(k, one()?)?,
            "seed" | "randseed" => spec.seed = num(k, one()?)?,
            "buffer_compress_percentage" => spec.buffers.compress_percentage = num(k, one()?)?,
            "refill_buffers" => spec.buffers.refill = boolean(k, one()?)?,
            "scramble_buffers" => spec.buffers.scramble = boolean(k, one()?)?,
            "iodepth_batch_submit" | "iodepth_batch" => {
                spec.batch.iodepth_batch_submit = num(k, one()?)?
            }
            "iodepth_batch_complete_min" | "iodepth_batch_complete" => {
                spec.batch.iodepth_batch_complete_min = num(k, one()?)?
            }
            "iodepth_batch_complete_max" => spec.batch.iodepth_batch_complete_max = num(k, one()?)?,
            "submit_with_wait" => spec.batch.submit_with_wait = boolean(k, one()?)?,
            "invalidate" => spec.invalidate = boolean(k, one()?)?,
            "iomem" | "mem" => spec.iomem = Iomem::parse(one()?)?,
            "time_based" => spec.time_based = boolean(k, one()?)?,
            other => return Err(Error::JobFile(format!("unknown key {other:?}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writing_jobs_need_a_writable_target() {
        let mut j = JobSpec {
            rw: RwMode::RandWrite,
            ..JobSpec::default()
        };
        assert!(j.check_writable(false).is_ok());
        let e = j.check_writable(true).unwrap_err().to_string();
        assert!(
            e.contains("--rw randwrite writes, but the target is read-only"),
            "{e}"
        );
        j.rw = RwMode::Read;
        assert!(j.check_writable(true).is_ok());
        j.verify = true;
        let e = j.check_writable(true).unwrap_err().to_string();
        assert!(e.contains("--verify writes the region first"), "{e}");
        j.verify = false;
        j.rw = RwMode::RandRw;
        j.rwmixread = 100;
        assert!(
            j.check_writable(true).is_ok(),
            "randrw with 100 % reads only reads"
        );
    }

    #[test]
    fn negative_values_are_range_errors() {
        let msg = |r: Result<u64>| snapblk_core::Chain(&r.unwrap_err()).to_string();
        assert!(msg(parse_size("-1")).contains("size -1 is out of range"));
        assert!(msg(parse_size("-4k")).contains("size -4k is out of range"));
        assert!(msg(parse_size("-x")).contains("bad size"));
        let e = parse_secs("-1").unwrap_err().to_string();
        assert!(e.contains("duration -1 is out of range"), "{e}");
        assert!(
            parse_secs("nan")
                .unwrap_err()
                .to_string()
                .contains("bad duration")
        );
        let e = number_error("iodepth", "-1").to_string();
        assert!(
            e.contains("iodepth -1 is out of range: it cannot be negative"),
            "{e}"
        );
        assert!(
            number_error("iodepth", "x")
                .to_string()
                .contains("bad number")
        );
    }

    #[test]
    fn empty_lists_and_endless_times_are_refused() {
        let base = JobSpec::default();
        for k in ["bs", "rw", "iodepth", "numjobs", "size"] {
            let e = parse_job_file(&format!("[[job]]\n{k} = []\n"), &base).unwrap_err();
            assert!(e.to_string().contains("an empty list"), "{k}: {e}");
        }
        for (k, v) in [("runtime", "1e308"), ("ramp_time", "2e9")] {
            let e = parse_job_file(&format!("[[job]]\n{k} = {v}\n"), &base).unwrap_err();
            assert!(e.to_string().contains("at most"), "{k}: {e}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert!(parse_size("4x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999t").is_err());
        assert_eq!(fmt_size(65536), "64k");
        assert_eq!(fmt_size(1 << 20), "1M");
        assert_eq!(fmt_size(1000), "1000");
        assert_eq!(parse_secs("500ms").unwrap(), 0.5);
        assert_eq!(parse_secs("2m").unwrap(), 120.0);
    }

    #[test]
    fn sweep_is_cartesian() {
        let s = Sweep {
            bs: vec![4096, 65536],
            iodepth: vec![1, 32],
            ..Default::default()
        };
        let jobs = s.expand(&JobSpec::default());
        assert_eq!(jobs.len(), 4);
        assert_eq!((jobs[1].bs, jobs[1].iodepth), (4096, 32));
        assert_eq!((jobs[2].bs, jobs[2].iodepth), (65536, 1));
    }

    #[test]
    fn regions_follow_fio_size_per_job_and_offset_increment() {
        // fio: every job covers `size` from offset + job * offset_increment.
        let j = JobSpec {
            numjobs: 3,
            bs: 4096,
            size: Some(1 << 20),
            offset: 8192,
            ..Default::default()
        };
        let r = j.regions(2 << 20).unwrap();
        assert_eq!(
            r,
            vec![(8192, 1 << 20); 3],
            "shared region without an increment"
        );
        assert!(JobSpec::regions_overlap(&r));
        let inc = JobSpec {
            offset_increment: 1 << 20,
            size: Some(512 << 10),
            ..j.clone()
        };
        let r = inc.regions(4 << 20).unwrap();
        assert_eq!(
            r,
            vec![
                (8192, 512 << 10),
                (8192 + (1 << 20), 512 << 10),
                (8192 + (2 << 20), 512 << 10)
            ]
        );
        assert!(!JobSpec::regions_overlap(&r));
        // The third job's region ends past 2 MiB + 8 KiB.
        assert!(inc.regions((2 << 20) + 8192).is_err());
        // No size: each job runs to the end of the target.
        let whole = JobSpec {
            size: None,
            offset_increment: 4096,
            offset: 0,
            ..j.clone()
        };
        let r = whole.regions(64 << 10).unwrap();
        assert_eq!(r, vec![(0, 64 << 10), (4096, 60 << 10), (8192, 56 << 10)]);
        assert!(j.regions(512 << 10).is_err());
        let past = JobSpec {
            offset: 2 << 20,
            ..j
        };
        let e = past.regions(2 << 20).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid job: offset 2097152 is past the end of the target (capacity 2097152)"
        );
    }

    #[test]
    fn time_based_needs_a_runtime() {
        let j = JobSpec {
            time_based: true,
            ..Default::default()
        };
        assert!(
            j.validate()
                .unwrap_err()
                .to_string()
                .contains("time_based needs a runtime")
        );
        let text = "[[job]]\nruntime = 1\ntime_based = 1\noffset_increment = \"1M\"\n";
        let jobs = parse_job_file(text, &JobSpec::default()).unwrap();
        assert!(jobs[0].time_based && jobs[0].offset_increment == 1 << 20);
    }

    #[test]
    fn job_file() {
        let text = r#"
[global]
size = "1M"
runtime = "2s"
direct = true
[[job]]
name = "a"
rw = "randread"
bs = ["4k", "64k"]
iodepth = [1, 8]
[[job]]
rw = "write"
"#;
        let jobs = parse_job_file(text, &JobSpec::default()).unwrap();
        assert_eq!(jobs.len(), 5);
        assert!(
            jobs.iter()
                .all(|j| j.direct && j.size == Some(1 << 20) && j.runtime == Some(2.0))
        );
        assert_eq!(jobs[4].rw, RwMode::Write);
        // A job's name leads its label; unnamed jobs keep the plain label.
        assert_eq!(jobs[0].label(), "a: randread bs=4k qd=1 jobs=1");
        assert_eq!(jobs[3].label(), "a: randread bs=64k qd=8 jobs=1");
        assert_eq!(jobs[4].label(), "write bs=4k qd=1 jobs=1");
        assert_eq!(jobs[4].name, "job1");
        assert!(parse_job_file("[[job]]\nfoo = 1", &JobSpec::default()).is_err());
        assert!(parse_job_file("[[job]]\nsize = [\"1M\", \"2M\"]", &JobSpec::default()).is_err());
        assert!(parse_job_file("x = 1", &JobSpec::default()).is_err());
    }

    #[test]
    fn buffer_keys_in_job_files() {
        let d = JobSpec::default();
        assert_eq!(d.buffers, crate::buffer::BufferOpts::default());
        assert!(d.buffers.scramble && !d.buffers.refill);
        let text = "[global]\nbuffer_compress_percentage = 30\n[[job]]\nrefill_buffers = true\nscramble_buffers = 0\n";
        let j = &parse_job_file(text, &d).unwrap()[0];
        assert_eq!(j.buffers.compress_percentage, 30);
        assert!(j.buffers.refill && !j.buffers.scramble);
        let bad = "[[job]]\nbuffer_compress_percentage = 101\n";
        assert!(parse_job_file(bad, &d).is_err());
    }

    #[test]
    fn batch_and_invalidate_keys_in_job_files() {
        let d = JobSpec::default();
        assert!(d.invalidate);
        let text = "[global]\niodepth_batch = 4\niodepth_batch_complete = 2\n[[job]]\niodepth_batch_complete_max = 0\ninvalidate = 0\nsubmit_with_wait = true\n";
        let j = &parse_job_file(text, &d).unwrap()[0];
        assert_eq!(
            j.batch,
            BatchOpts {
                iodepth_batch_submit: 4,
                iodepth_batch_complete_min: 2,
                iodepth_batch_complete_max: 0,
                submit_with_wait: true,
            }
        );
        assert!(!j.invalidate);
        // The JSON spec carries the buffer and batch options under fio's names.
        let v = serde_json::to_value(j).unwrap();
        for k in [
            "buffer_compress_percentage",
            "refill_buffers",
            "scramble_buffers",
            "iodepth_batch_submit",
            "iodepth_batch_complete_min",
            "iodepth_batch_complete_max",
            "submit_with_wait",
            "invalidate",
        ] {
            assert!(v.get(k).is_some(), "{k} missing in {v}");
        }
        assert_eq!(v["iodepth_batch_submit"], 4);
        assert_eq!(v["scramble_buffers"], true);
    }

    #[test]
    fn iomem_defaults_to_malloc_and_is_read_from_job_files() {
        let d = JobSpec::default();
        assert_eq!(d.iomem, Iomem::Malloc);
        let text = "[global]\niomem = \"memfd\"\n[[job]]\n[[job]]\nmem = \"malloc\"\n";
        let jobs = parse_job_file(text, &d).unwrap();
        assert_eq!(jobs[0].iomem, Iomem::Memfd);
        assert_eq!(jobs[1].iomem, Iomem::Malloc);
        assert_eq!(serde_json::to_value(&jobs[0]).unwrap()["iomem"], "memfd");
        let e = parse_job_file("[[job]]\niomem = \"shm\"\n", &d).unwrap_err();
        assert!(e.to_string().contains("malloc, memfd"), "{e}");
    }
}
