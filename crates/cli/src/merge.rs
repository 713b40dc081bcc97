//! `snapblk merge COW --base BASE`: merge a COW into its base in place. Resumable: run it again
//! after an interruption (crash, kill, power loss) and it continues from the persisted progress.

use anyhow::Context;
use clap::Args;
use snapblk_snapshot::cowsrc::{OpenMode, open_files};
use snapblk_snapshot::progress::Progress;
use snapblk_snapshot::{
    MergeOptions, MergeProgress, PrecheckReport, SnapError, SnapshotConfig, merge, precheck,
};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct MergeArgs {
    /// The COW file (its merge progress is updated in place).
    cow: PathBuf,
    /// The base image or block device, overwritten in place with the new image.
    #[arg(long)]
    base: PathBuf,
    /// Show a progress bar (on a terminal).
    #[arg(long)]
    progress: bool,
    /// Print the result (and scheduler statistics) as JSON.
    #[arg(long)]
    json: bool,
    /// Print I/O scheduler statistics.
    #[arg(long)]
    stats: bool,
    /// Only run the pre-merge check (bounds of every op, every payload still to merge decoded,
    /// merge order, windows without scratch) and report progress so far; writes nothing.
    #[arg(long)]
    check: bool,
}

/// Open errors that name the base themselves need no "opening … with base …" in front.
fn open_context(e: SnapError, a: &MergeArgs) -> anyhow::Error {
    match e {
        SnapError::BaseTooShort { .. }
        | SnapError::BaseSmallerThanNewImage { .. }
        | SnapError::IsDirectory { .. } => e.into(),
        e => anyhow::Error::new(e).context(format!(
            "opening {} with base {}",
            a.cow.display(),
            a.base.display()
        )),
    }
}

pub fn run(a: MergeArgs) -> anyhow::Result<()> {
    if a.check {
        return check(&a);
    }
    let mode = OpenMode {
        base_writable: true,
        cow_writable: true,
    };
    let snap = open_files(&a.base, &a.cow, SnapshotConfig::default(), mode)
        .map_err(|e| open_context(e, &a))?;
    let (done, total) = snap.merge_progress();
    let bar = Progress::new(total as u64, a.progress);
    bar.set(done as u64);
    let on_progress = |p: MergeProgress| bar.set(p.merged as u64);
    let t0 = Instant::now();
    let report = merge(
        &snap,
        MergeOptions {
            progress: Some(&on_progress),
            ..Default::default()
        },
    );
    bar.finish();
    let report = report.with_context(|| format!("merging {}", a.cow.display()))?;
    let secs = t0.elapsed().as_secs_f64();
    let bytes = report.blocks_written * snap.map().block_size();
    let sched = snap.sched_stats();
    let mut out = std::io::stdout().lock();
    if a.json {
        let v = serde_json::json!({
            "merged": report.total_ops,
            "total": report.total_ops,
            "report": report,
            "seconds": secs,
            "bytes_written": bytes,
            "mib_per_s": bytes as f64 / (1 << 20) as f64 / secs.max(1e-9),
            "scheduler": sched,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        let resumed = match (report.resumed_at, report.resumed_from_scratch) {
            (0, false) => "from the start".to_owned(),
            (n, false) => format!("resumed at op {n}"),
            (n, true) => format!("resumed at op {n}, staged window redone from scratch"),
        };
        writeln!(
            out,
            "merged {} ops ({resumed}), {} blocks written, {} overlay blocks, {secs:.3}s",
            report.total_ops, report.blocks_written, report.overlay_blocks
        )?;
        if a.stats {
            writeln!(
                out,
                "{} ordered windows ({} staged in scratch, {} self-safe without scratch), {} replace batches",
                report.ordered_windows,
                report.scratch_windows,
                report.self_safe_windows,
                report.replace_batches
            )?;
            writeln!(out, "pre-merge check: {}", describe(&report.precheck))?;
            writeln!(out, "{}", serde_json::to_string_pretty(&sched)?)?;
        }
    }
    Ok(())
}

/// One line saying what the pre-merge check covered.
fn describe(r: &PrecheckReport) -> String {
    let windows = if r.scratch {
        "scratch area present".to_owned()
    } else {
        format!(
            "no scratch area: {} self-safe windows, no op reads its own destination",
            r.self_safe_windows
        )
    };
    format!(
        "{} ops from op {} inside the device ({} blocks) and the base ({} bytes); {} payloads decoded ({} -> {} bytes), {} raw payloads in bounds; merge order valid (all COPY/XOR first, none reads a block an earlier op overwrites); {windows}; {:.3}s",
        r.ops_checked,
        r.from_op,
        r.device_blocks,
        r.base_bytes,
        r.payloads_decoded,
        r.payload_bytes,
        r.decoded_bytes,
        r.raw_payloads,
        r.seconds
    )
}

/// `--check`: the pre-merge check `merge` runs, read-only. A refusal prints the same message
/// `merge` would, and with `--json` a verdict on stdout as well.
fn check(a: &MergeArgs) -> anyhow::Result<()> {
    let res = open_files(
        &a.base,
        &a.cow,
        SnapshotConfig::default(),
        OpenMode::default(),
    )
    .map_err(|e| open_context(e, a))
    .and_then(|snap| {
        let (done, total) = snap.merge_progress();
        precheck(&snap, &MergeOptions::default())
            .map(|r| (done, total, r))
            .with_context(|| format!("merging {}", a.cow.display()))
    });
    let mut out = std::io::stdout().lock();
    match res {
        Ok((done, total, r)) => {
            if a.json {
                let v = serde_json::json!({
                    "mergeable": true, "merged": done, "total": total, "checked": r,
                });
                writeln!(out, "{v}")?;
            } else {
                writeln!(out, "mergeable: {done}/{total} ops merged")?;
                writeln!(out, "checked: {}", describe(&r))?;
            }
            Ok(())
        }
        Err(e) => {
            if a.json {
                let v = serde_json::json!({ "mergeable": false, "error": format!("{e:#}") });
                writeln!(out, "{v}")?;
            }
            Err(e)
        }
    }
}
