//! Results as a versioned JSON document (always valid, written apart from diagnostics) and as a
//! readable table; repetitions are summarised with their spread and noise warnings.

use crate::context::Context;
use crate::engine::{DirStats, RunResult};
use crate::hist::{LatHist, PERCENTILES};
use crate::spec::JobSpec;
use serde::Serialize;
use std::collections::BTreeMap;

/// Bumped on incompatible changes of the JSON layout (see crates/loadgen/schema.json).
pub(crate) const SCHEMA_VERSION: u32 = 2;

/// Coefficient of variation of IOPS across repetitions above which a run is called noisy.
pub(crate) const NOISY_CV: f64 = 0.10;

/// The top-level JSON document.
#[derive(Debug, Serialize)]
pub struct Document {
    /// The layout's version (crates/loadgen/schema.json), bumped on incompatible changes.
    pub schema_version: u32,
    /// What wrote the document.
    pub tool: Tool,
    /// "workload", "file" or "fgbg".
    pub kind: String,
    /// Unix time (seconds) when the run started.
    pub started_at: u64,
    /// The command line (`argv`) of the run.
    pub command: Vec<String>,
    /// The machine and target the run measured.
    pub context: Context,
    /// The target, for workload runs.
    pub target: Option<TargetDesc>,
    /// Workload results, one per configuration.
    pub results: Vec<ConfigReport>,
    /// File-level (IOzone-style) results.
    pub file_tests: Option<serde_json::Value>,
    /// Foreground-under-background results.
    pub fgbg: Option<serde_json::Value>,
    /// Problems that did not stop the run (e.g. an ignored `--direct`).
    pub warnings: Vec<String>,
    /// Set when the run failed; the document is still complete and valid.
    pub error: Option<String>,
    /// The signal (`SIGINT`, `SIGTERM`) that stopped the run early; `results` then hold what
    /// was measured until then (and `error` says so).
    pub interrupted: Option<String>,
}

/// The program that wrote a [`Document`].
#[derive(Debug, Serialize)]
pub struct Tool {
    /// `snapblk bench`.
    pub name: String,
    /// The crate version.
    pub version: String,
}

/// What a workload ran on.
#[derive(Debug, Clone, Serialize)]
pub struct TargetDesc {
    /// The target as given: a device spec, a path or a library (several joined by `; `).
    pub spec: String,
    /// The driver name (`io_uring`, `null`, `libblkio`, ...).
    pub driver: String,
}

impl Document {
    /// An empty document of `kind` (`workload`, `file`, `fgbg`), started now by this process's
    /// command line.
    pub fn new(kind: &str, context: Context, target: Option<TargetDesc>) -> Document {
        Document {
            schema_version: SCHEMA_VERSION,
            tool: Tool {
                name: "snapblk bench".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            },
            kind: kind.into(),
            started_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            command: std::env::args().collect(),
            context,
            target,
            results: Vec::new(),
            file_tests: None,
            fgbg: None,
            warnings: Vec::new(),
            error: None,
            interrupted: None,
        }
    }

    /// Pretty JSON. Serialising these plain structs cannot fail; the fallback still parses.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| {
            format!(
                "{{\"schema_version\":{SCHEMA_VERSION},\"error\":{:?}}}",
                e.to_string()
            )
        })
    }
}

/// The name of a termination signal, for [`Document::interrupted`].
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}

/// Latency summary in nanoseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LatReport {
    /// Latencies recorded.
    pub samples: u64,
    /// The smallest.
    pub min: u64,
    /// The largest.
    pub max: u64,
    /// Their mean.
    pub mean: f64,
    /// Their standard deviation.
    pub stdev: f64,
    /// `p1` … `p99.99`.
    pub percentiles: BTreeMap<String, u64>,
    /// The full histogram: HdrHistogram V2 compressed encoding, base64.
    pub histogram: String,
}

pub(crate) fn pct_key(p: f64) -> String {
    format!("p{p}")
}

impl LatReport {
    /// The summary of `h`.
    pub fn of(h: &LatHist) -> LatReport {
        LatReport {
            samples: h.count(),
            min: h.min(),
            max: h.max(),
            mean: h.mean(),
            stdev: h.stdev(),
            percentiles: PERCENTILES
                .iter()
                .map(|&p| (pct_key(p), h.percentile(p)))
                .collect(),
            histogram: h.to_base64(),
        }
    }
}

/// One direction of one run (or of all repetitions merged).
#[derive(Debug, Clone, Serialize)]
pub struct DirReport {
    /// Completed I/Os.
    pub ios: u64,
    /// Bytes they moved.
    pub bytes: u64,
    /// I/Os per second over the measured time.
    pub iops: f64,
    /// Bytes per second over the measured time.
    pub bw_bytes: f64,
    /// Total latency: from the request being made to its completion being handled (fio's `lat`).
    pub lat_ns: LatReport,
    /// Submission latency: until the call that submitted the request returned (fio's `slat`).
    pub slat_ns: LatReport,
    /// Completion latency: from then to the completion being handled (fio's `clat`).
    pub clat_ns: LatReport,
}

impl DirReport {
    fn of(d: &DirStats, seconds: f64) -> DirReport {
        let per = |x: u64| {
            if seconds > 0.0 {
                x as f64 / seconds
            } else {
                0.0
            }
        };
        DirReport {
            ios: d.ios,
            bytes: d.bytes,
            iops: per(d.ios),
            bw_bytes: per(d.bytes),
            lat_ns: LatReport::of(&d.lat),
            slat_ns: LatReport::of(&d.slat),
            clat_ns: LatReport::of(&d.clat),
        }
    }
}

/// One second of a run. Rates are per second of the bucket's real length: the last bucket of a
/// run is usually partial (a 2.5 s run has buckets of 1, 1 and 0.5 s), and its count alone
/// would read as a false drop.
#[derive(Debug, Clone, Serialize)]
pub struct SecondReport {
    /// Start of the bucket, seconds after measurement began.
    pub t: u64,
    /// Length of the bucket in seconds: 1, or less for the last one.
    pub seconds: f64,
    /// I/Os completed in the bucket.
    pub ios: u64,
    /// I/Os per second in the bucket.
    pub iops: u64,
    /// Reads per second in the bucket.
    pub read_iops: u64,
    /// Writes per second in the bucket.
    pub write_iops: u64,
    /// Bytes per second in the bucket.
    pub bw_bytes: u64,
    /// Median latency of the bucket's I/Os, ns.
    pub lat_p50_ns: u64,
    /// 99th percentile latency of the bucket's I/Os, ns.
    pub lat_p99_ns: u64,
}

/// One repetition of one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The repetition, 0-based.
    pub rep: u32,
    /// Measured seconds.
    pub seconds: f64,
    /// I/Os per second, both directions.
    pub iops: f64,
    /// Bytes per second, both directions.
    pub bw_bytes: f64,
    /// The reads.
    pub read: DirReport,
    /// The writes.
    pub write: DirReport,
    /// Per-second buckets.
    pub series: Vec<SecondReport>,
    /// Blocks whose content was checked (verify mode).
    pub verified_blocks: u64,
}

impl RunReport {
    /// The report of repetition `rep` (0-based) from its result.
    pub fn of(rep: u32, r: &RunResult) -> RunReport {
        let series = r
            .series
            .iter()
            .enumerate()
            .map(|(t, s)| {
                let mut h = LatHist::with_sigfig(2);
                for &(v, c) in &s.lat {
                    h.record_n(v, c);
                }
                let len = bucket_len(r.seconds, t);
                let rate = |n: u64| (n as f64 / len).round() as u64;
                SecondReport {
                    t: t as u64,
                    seconds: len,
                    ios: s.read_ios + s.write_ios,
                    iops: rate(s.read_ios + s.write_ios),
                    read_iops: rate(s.read_ios),
                    write_iops: rate(s.write_ios),
                    bw_bytes: rate(s.read_bytes + s.write_bytes),
                    lat_p50_ns: h.percentile(50.0),
                    lat_p99_ns: h.percentile(99.0),
                }
            })
            .collect();
        RunReport {
            rep,
            seconds: r.seconds,
            iops: r.iops(),
            bw_bytes: r.bw_bytes(),
            read: DirReport::of(&r.read, r.seconds),
            write: DirReport::of(&r.write, r.seconds),
            series,
            verified_blocks: r.jobs.iter().map(|j| j.verified_blocks).sum(),
        }
    }
}

/// Length of per-second bucket `t` of a run that measured `seconds`: 1 s, or what is left of
/// the run in the last bucket (a bucket with nothing left of the run counts as a whole second).
fn bucket_len(seconds: f64, t: usize) -> f64 {
    let left = seconds - t as f64;
    if left > 0.0 { left.min(1.0) } else { 1.0 }
}

/// Mean and spread of a value across repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    /// The mean.
    pub mean: f64,
    /// The standard deviation.
    pub stdev: f64,
    /// Coefficient of variation (stdev / mean).
    pub cv: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `v` (all 0 when empty).
    pub fn of(v: &[f64]) -> Spread {
        if v.is_empty() {
            return Spread {
                mean: 0.0,
                stdev: 0.0,
                cv: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = if v.len() > 1 {
            v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        let stdev = var.sqrt();
        Spread {
            mean,
            stdev,
            cv: if mean > 0.0 { stdev / mean } else { 0.0 },
            min: v.iter().cloned().fold(f64::INFINITY, f64::min),
            max: v.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// The median of `v` (of an even count, the midpoint of the two middle values); None when empty.
pub(crate) fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(s[n / 2]),
        _ => Some((s[n / 2 - 1] + s[n / 2]) / 2.0),
    }
}

/// Summary over repetitions: spreads, and both directions with all repetitions' histograms merged.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// IOPS of the repetitions.
    pub iops: Spread,
    /// Bytes per second of the repetitions.
    pub bw_bytes: Spread,
    /// Mean total latency of the repetitions, ns.
    pub lat_mean_ns: Spread,
    /// The reads of all repetitions, over their summed time.
    pub read: DirReport,
    /// The writes of all repetitions, over their summed time.
    pub write: DirReport,
    /// Both directions merged.
    pub lat_ns: LatReport,
    /// Completion latency, both directions merged (what fio's text output shows percentiles of).
    pub clat_ns: LatReport,
    /// Submission latency, both directions merged.
    pub slat_ns: LatReport,
}

/// All repetitions of one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigReport {
    /// The configuration's label (`randread bs=4k iodepth=32 …`, led by the target's label with
    /// several targets).
    pub label: String,
    /// With several targets in one run (repeated `--libblkio`): which one, by its label; the
    /// label also leads `label`. Absent with a single target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
    /// That target's description, with several targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetDesc>,
    /// The configuration.
    pub config: JobSpec,
    /// The target's capacity in bytes.
    pub capacity: u64,
    /// Each repetition.
    pub runs: Vec<RunReport>,
    /// Over all repetitions.
    pub summary: Summary,
}

impl ConfigReport {
    /// Build from the repetitions of one configuration (at least one).
    pub fn of(spec: &JobSpec, runs: &[RunResult]) -> ConfigReport {
        let reports: Vec<RunReport> = runs
            .iter()
            .enumerate()
            .map(|(i, r)| RunReport::of(i as u32, r))
            .collect();
        let mut read = DirStats::default();
        let mut write = DirStats::default();
        let mut secs = 0.0;
        for r in runs {
            read.merge(&r.read);
            write.merge(&r.write);
            secs += r.seconds;
        }
        let both = |r: &LatHist, w: &LatHist| {
            let mut h = r.clone();
            h.merge(w);
            LatReport::of(&h)
        };
        let summary = Summary {
            iops: Spread::of(&runs.iter().map(|r| r.iops()).collect::<Vec<_>>()),
            bw_bytes: Spread::of(&runs.iter().map(|r| r.bw_bytes()).collect::<Vec<_>>()),
            lat_mean_ns: Spread::of(&runs.iter().map(|r| r.lat().mean()).collect::<Vec<_>>()),
            read: DirReport::of(&read, secs),
            write: DirReport::of(&write, secs),
            lat_ns: both(&read.lat, &write.lat),
            clat_ns: both(&read.clat, &write.clat),
            slat_ns: both(&read.slat, &write.slat),
        };
        ConfigReport {
            label: spec.label(),
            library: None,
            target: None,
            config: spec.clone(),
            capacity: runs.first().map(|r| r.capacity).unwrap_or(0),
            runs: reports,
            summary,
        }
    }

    /// The merged latency histogram (both directions, all repetitions).
    pub fn merged_hist(&self) -> LatHist {
        LatHist::from_base64(&self.summary.lat_ns.histogram).unwrap_or_default()
    }
}

/// Noise warnings: spread across repetitions and host load.
pub fn noise_warnings(results: &[ConfigReport], ctx: &Context) -> Vec<String> {
    let mut w = Vec::new();
    for r in results {
        if r.runs.len() > 1 && r.summary.iops.cv > NOISY_CV {
            w.push(format!(
                "noisy machine: IOPS of {:?} vary by {:.1}% (CV) across {} repetitions (threshold {:.0}%)",
                r.label,
                r.summary.iops.cv * 100.0,
                r.runs.len(),
                NOISY_CV * 100.0
            ));
        }
    }
    if ctx.loadavg[0] > ctx.cpus as f64 * 0.5 {
        w.push(format!(
            "host busy at start: load average {:.2} on {} CPUs",
            ctx.loadavg[0], ctx.cpus
        ));
    }
    if let Some(p) = ctx.cpu_pressure_avg10
        && p > 10.0
    {
        w.push(format!("CPU pressure at start: some avg10 = {p:.1}%"));
    }
    if let Some(cs) = ctx.clocksource.as_deref()
        && cs != "tsc"
    {
        w.push(format!(
            "the kernel's clocksource is {cs}, not tsc: latencies are timed with the CPU's time \
             stamp counter, which this kernel does not use as its clock"
        ));
    }
    w
}

/// Human latency: `850ns`, `12.3µs`, `4.56ms`, `1.20s`.
pub(crate) fn fmt_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0}ns")
    } else if ns < 1e6 {
        format!("{:.1}µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
    }
}

/// Human rate: `1.23M`, `45.6k`, `789`.
pub fn fmt_count(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e4 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// Render rows as an aligned text table (first row is the header).
pub fn text_table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, s)| {
                let pad = width[c] - s.chars().count();
                if c == 0 {
                    format!("{s}{}", " ".repeat(pad))
                } else {
                    format!("{}{s}", " ".repeat(pad))
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
        if i == 0 {
            out.push_str(
                &width
                    .iter()
                    .map(|w| "-".repeat(*w))
                    .collect::<Vec<_>>()
                    .join("  "),
            );
            out.push('\n');
        }
    }
    out
}

/// Which latency the table shows percentiles of (fio's `clat_percentiles`, `lat_percentiles`,
/// `slat_percentiles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatKind {
    /// Completion latency: fio's default (`clat_percentiles=1`).
    Clat,
    /// Total latency, request made to completion handled.
    Lat,
    /// Submission latency.
    Slat,
}

impl LatKind {
    fn name(self) -> &'static str {
        match self {
            LatKind::Clat => "clat",
            LatKind::Lat => "lat",
            LatKind::Slat => "slat",
        }
    }

    fn of(self, s: &Summary) -> &LatReport {
        match self {
            LatKind::Clat => &s.clat_ns,
            LatKind::Lat => &s.lat_ns,
            LatKind::Slat => &s.slat_ns,
        }
    }
}

/// Percentiles shown in the table, per latency kind.
const TABLE_PERCENTILES: [f64; 4] = [50.0, 99.0, 99.9, 99.99];

/// The workload results table: throughput, mean total latency, and percentiles of each latency
/// in `pcts` (fio's text output shows `clat` percentiles unless told otherwise: pass
/// `&[LatKind::Clat]` for the same view). Percentile columns are named for their latency.
pub fn workload_table(results: &[ConfigReport], pcts: &[LatKind]) -> String {
    let mut header: Vec<String> = ["config", "reps", "IOPS", "±CV", "MiB/s", "lat mean"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for k in pcts {
        for p in TABLE_PERCENTILES {
            header.push(format!("{} p{p}", k.name()));
        }
    }
    let mut rows = vec![header];
    for r in results {
        let s = &r.summary;
        let mut row = vec![
            r.label.clone(),
            r.runs.len().to_string(),
            fmt_count(s.iops.mean),
            // One repetition has no spread: `-`, not a misleading 0.0%.
            if r.runs.len() > 1 {
                format!("{:.1}%", s.iops.cv * 100.0)
            } else {
                "-".into()
            },
            format!("{:.1}", s.bw_bytes.mean / 1048576.0),
            fmt_ns(s.lat_ns.mean),
        ];
        for k in pcts {
            let l = k.of(s);
            for p in TABLE_PERCENTILES {
                row.push(fmt_ns(
                    l.percentiles.get(&pct_key(p)).copied().unwrap_or(0) as f64
                ));
            }
        }
        rows.push(row);
    }
    text_table(&rows)
}

/// Synthetic results for the unit tests here and in [`crate::plot`].
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A per-second bucket of `n` 4 KiB reads.
    pub(crate) fn sec(n: u64) -> crate::engine::Second {
        crate::engine::Second {
            read_ios: n,
            read_bytes: n * 4096,
            ..Default::default()
        }
    }

    /// 2.5 s of reads at 1000 IOPS: per-second buckets of 1000, 1000 and (half a second) 500.
    pub(crate) fn two_and_a_half_seconds() -> RunResult {
        RunResult {
            seconds: 2.5,
            series: vec![sec(1000), sec(1000), sec(500)],
            ..one_second(2500)
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[1.0, 10.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn last_partial_second_is_scaled_to_a_rate() {
        let r = two_and_a_half_seconds();
        let rep = RunReport::of(0, &r);
        let got: Vec<(u64, f64, u64, u64)> = rep
            .series
            .iter()
            .map(|s| (s.ios, s.seconds, s.iops, s.bw_bytes))
            .collect();
        assert_eq!(
            got,
            [
                (1000, 1.0, 1000, 1000 * 4096),
                (1000, 1.0, 1000, 1000 * 4096),
                (500, 0.5, 1000, 1000 * 4096)
            ]
        );
        assert_eq!(rep.iops, 1000.0);
        // A run shorter than a second: one partial bucket, at the run's rate.
        let short = RunResult {
            seconds: 0.25,
            series: vec![sec(250)],
            ..r
        };
        let s = &RunReport::of(0, &short).series[0];
        assert_eq!((s.seconds, s.iops), (0.25, 1000));
    }

    /// A run of `ios` reads in one second.
    pub(crate) fn one_second(ios: u64) -> RunResult {
        RunResult {
            spec: JobSpec::default(),
            capacity: 1 << 30,
            jobs: Vec::new(),
            read: DirStats {
                ios,
                bytes: ios * 4096,
                ..Default::default()
            },
            write: DirStats::default(),
            seconds: 1.0,
            series: Vec::new(),
        }
    }

    #[test]
    fn series_buckets_carry_their_start_and_length_and_the_schema_requires_both() {
        let mut doc = Document::new("workload", quiet_host(0.1, None), None);
        doc.results = vec![ConfigReport::of(
            &JobSpec::default(),
            &[two_and_a_half_seconds()],
        )];
        let v: serde_json::Value = serde_json::from_str(&doc.to_json()).unwrap();
        crate::schema::validate(&v).unwrap();
        let series = v["results"][0]["runs"][0]["series"].as_array().unwrap();
        let spans: Vec<(u64, f64)> = series
            .iter()
            .map(|s| (s["t"].as_u64().unwrap(), s["seconds"].as_f64().unwrap()))
            .collect();
        assert_eq!(spans, [(0, 1.0), (1, 1.0), (2, 0.5)]);
        // A consumer may rely on both: a bucket without either is not a valid document.
        for key in ["t", "seconds", "ios"] {
            let mut bad = v.clone();
            bad["results"][0]["runs"][0]["series"][2]
                .as_object_mut()
                .unwrap()
                .remove(key);
            assert!(crate::schema::validate(&bad).is_err(), "{key} optional");
        }
    }

    fn quiet_host(loadavg: f64, cpu_pressure: Option<f64>) -> Context {
        Context {
            hostname: "h".into(),
            kernel: "Linux".into(),
            kernel_version: "6.1".into(),
            cpu_model: "cpu".into(),
            cpus: 2,
            mem_total_kb: 1,
            loadavg: [loadavg, 0.0, 0.0],
            cpu_pressure_avg10: cpu_pressure,
            io_pressure_avg10: None,
            clocksource: Some("tsc".into()),
            target: None,
        }
    }

    #[test]
    fn noisy_repetitions_and_a_busy_host_are_warned_about() {
        let steady = ConfigReport::of(
            &JobSpec::default(),
            &[one_second(1000), one_second(1010), one_second(990)],
        );
        let noisy_job = JobSpec {
            iodepth: 16,
            ..Default::default()
        };
        let noisy = ConfigReport::of(&noisy_job, &[one_second(1000), one_second(1500)]);
        // A single repetition has no spread to judge.
        let single = ConfigReport::of(&noisy_job, &[one_second(1)]);
        let all = [steady.clone(), noisy, single];
        assert_eq!(
            noise_warnings(&all, &quiet_host(0.1, None)),
            [format!(
                "noisy machine: IOPS of \"read bs=4k qd=16 jobs=1\" vary by 28.3% (CV) across 2 \
                 repetitions (threshold {:.0}%)",
                NOISY_CV * 100.0
            )]
        );
        assert!(
            noise_warnings(std::slice::from_ref(&steady), &quiet_host(0.1, Some(1.0))).is_empty()
        );
        assert_eq!(
            noise_warnings(std::slice::from_ref(&steady), &quiet_host(1.5, Some(25.0))),
            [
                "host busy at start: load average 1.50 on 2 CPUs",
                "CPU pressure at start: some avg10 = 25.0%"
            ]
        );
        // A kernel that does not use the TSC as its clock is named; an unknown one is not.
        let mut kvm = quiet_host(0.1, None);
        kvm.clocksource = Some("kvm-clock".into());
        assert_eq!(
            noise_warnings(std::slice::from_ref(&steady), &kvm),
            [
                "the kernel's clocksource is kvm-clock, not tsc: latencies are timed with the CPU's \
              time stamp counter, which this kernel does not use as its clock"
            ]
        );
        kvm.clocksource = None;
        assert!(noise_warnings(std::slice::from_ref(&steady), &kvm).is_empty());
    }

    #[test]
    fn cv_column_is_a_dash_for_one_repetition() {
        let one = ConfigReport::of(&JobSpec::default(), &[one_second(1000)]);
        let two = ConfigReport::of(&JobSpec::default(), &[one_second(900), one_second(1100)]);
        let t = workload_table(&[one, two], &[LatKind::Clat]);
        let cv: Vec<&str> = t
            .lines()
            .skip(2)
            .map(|l| l.split_whitespace().nth(6).unwrap())
            .collect();
        assert_eq!(cv, ["-", "14.1%"], "{t}");
    }

    #[test]
    fn table_shows_percentiles_of_the_latencies_asked_for_and_names_them() {
        // Reads with slat 1 µs, clat 10 µs, lat 11 µs; writes with clat 30 µs: the merged
        // clat percentiles span both directions.
        let mut r = one_second(3);
        for _ in 0..3 {
            r.read.slat.record(1_000);
            r.read.clat.record(10_000);
            r.read.lat.record(11_000);
        }
        r.write.ios = 1;
        r.write.clat.record(30_000);
        r.write.slat.record(1_000);
        r.write.lat.record(31_000);
        let c = ConfigReport::of(&JobSpec::default(), &[r]);
        let cells = |t: &str, line: usize| -> Vec<String> {
            t.lines()
                .nth(line)
                .unwrap()
                .split("  ")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        };
        let t = workload_table(std::slice::from_ref(&c), &[LatKind::Clat]);
        let h = cells(&t, 0);
        assert_eq!(
            h[5..],
            [
                "lat mean",
                "clat p50",
                "clat p99",
                "clat p99.9",
                "clat p99.99"
            ],
            "{t}"
        );
        let v = cells(&t, 2);
        assert_eq!(v[6..], ["10.0µs", "30.0µs", "30.0µs", "30.0µs"], "{t}");
        let t = workload_table(std::slice::from_ref(&c), &[LatKind::Lat, LatKind::Slat]);
        assert_eq!(cells(&t, 0)[6], "lat p50", "{t}");
        assert_eq!(cells(&t, 0)[10], "slat p50", "{t}");
        let v = cells(&t, 2);
        assert_eq!(v[6..8], ["11.0µs", "31.0µs"], "{t}");
        assert_eq!(v[10..], ["1.0µs"; 4], "{t}");
        // No percentiles asked for: no percentile columns.
        let t = workload_table(std::slice::from_ref(&c), &[]);
        assert_eq!(cells(&t, 0).len(), 6, "{t}");
    }

    #[test]
    fn spread_and_formatting() {
        let s = Spread::of(&[90.0, 110.0]);
        assert_eq!(s.mean, 100.0);
        assert!((s.cv - 0.1414).abs() < 0.001);
        assert_eq!(Spread::of(&[5.0]).cv, 0.0);
        assert_eq!(fmt_ns(850.0), "850ns");
        assert_eq!(fmt_ns(12_345.0), "12.3µs");
        assert_eq!(fmt_count(123_456.0), "123.5k");
        let t = text_table(&[
            vec!["a".into(), "bb".into()],
            vec!["ccc".into(), "d".into()],
        ]);
        assert_eq!(t, "a    bb\n---  --\nccc   d\n");
    }
}
