//! `snapblk merge COW --base BASE`: merge a COW into its base in place. Resumable: run it again
//! after an interruption (crash, kill, power loss) and it continues from the persisted progress.

use anyhow::Context;
use clap::Args;
use snapblk_snapshot::cowsrc::{OpenMode, open_files};
use snapblk_snapshot::progress::Progress;
use snapblk_snapshot::{MergeOptions, MergeProgress, SnapshotConfig, merge};
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
    /// Only check that the COW can be merged (merge order valid) and report progress so far.
    #[arg(long)]
    check: bool,
}

pub fn run(a: MergeArgs) -> anyhow::Result<()> {
    let mode = OpenMode {
        base_writable: !a.check,
        cow_writable: !a.check,
    };
    let snap = open_files(&a.base, &a.cow, SnapshotConfig::default(), mode)
        .with_context(|| format!("opening {} with base {}", a.cow.display(), a.base.display()))?;
    let (done, total) = snap.merge_progress();
    if a.check {
        snapblk_snapshot::merge::validate_order(&snap)?;
        let mut out = std::io::stdout().lock();
        if a.json {
            writeln!(
                out,
                "{}",
                serde_json::json!({ "merged": done, "total": total, "mergeable": true })
            )?;
        } else {
            writeln!(out, "mergeable: {done}/{total} ops merged")?;
        }
        return Ok(());
    }
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
            writeln!(out, "{}", serde_json::to_string_pretty(&sched)?)?;
        }
    }
    Ok(())
}
