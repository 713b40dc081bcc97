//! `snapblk merge COW --base BASE`: merge a COW into its base in place. Resumable: run it again
//! after an interruption (crash, kill, power loss) and it continues from the persisted progress.

use crate::progress::Progress;
use anyhow::Context;
use clap::Args;
use snapblk_cow::record::MergeVerdict;
use snapblk_snapshot::{
    BlkioDev, BlockDev, Dev, GrownView, MergeOptions, MergeProgress, OpenMode, PrecheckReport,
    SnapError, Snapshot, SnapshotConfig, Stash, load_verifier, load_verifier_dev, merge,
    open_dev_base, open_files_sized, precheck,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// An image argument (`--base`, `--old`) as a device spec: text that starts with a known
/// driver's name and a colon (`rbd:pool=p,image=i`), parsed by the device-spec grammar; `None`
/// for a path.
pub(crate) fn device_spec(base: &Path) -> anyhow::Result<Option<snapblk::Spec>> {
    let Some(text) = base.to_str() else {
        return Ok(None);
    };
    match text.split_once(':') {
        Some((drv, _)) if snapblk::DRIVERS.contains(&drv) => snapblk::parse_spec(text)
            .map(Some)
            .with_context(|| format!("device spec {text}")),
        _ => Ok(None),
    }
}

#[derive(Args)]
pub struct MergeArgs {
    /// The COW file (its merge progress is updated in place).
    cow: PathBuf,
    /// The base image or block device, overwritten in place with the new image: a path, or a
    /// device spec of a known driver (`rbd:pool=p,image=i,...`), written through the driver
    /// (flushes for the durable checkpoints, its lock for mutual exclusion).
    #[arg(long)]
    base: PathBuf,
    /// `--base` as a device spec, when it is one (set by `run`).
    #[arg(skip)]
    base_dev: Option<snapblk::Spec>,
    /// Show the progress bar on a terminal even with --quiet (it is shown by default).
    #[arg(long)]
    progress: bool,
    /// Print the result (and scheduler statistics) as JSON.
    #[arg(long)]
    json: bool,
    /// Print I/O scheduler statistics.
    #[arg(long)]
    stats: bool,
    /// Only run the pre-merge check (bounds of every op, every payload still to merge decoded,
    /// merge order, windows without scratch, and with a COW record the base and every new
    /// block) and report progress so far; writes nothing.
    #[arg(long, conflicts_with_all = ["status", "reset_progress", "progress", "stats"])]
    check: bool,
    /// Show the merge state: ops merged, the COW record, and (with a record) what the base is
    /// for this COW: not started, in progress, complete, progress of another file, already
    /// updated, or the wrong base. Writes nothing.
    #[arg(long, conflicts_with_all = ["reset_progress", "progress", "stats"])]
    status: bool,
    /// Set the COW's merge progress back to zero, when the COW record shows that the progress
    /// was made on another file and this base is untouched. Writes only the COW's header.
    #[arg(long, conflicts_with_all = ["progress", "stats"])]
    reset_progress: bool,
    /// The COW record (default: COW.snapblk beside the COW, when present).
    #[arg(long, value_name = "FILE", conflicts_with = "no_record")]
    record: Option<PathBuf>,
    /// Ignore the COW record: the base cannot be verified.
    #[arg(long)]
    no_record: bool,
    /// Also check the SHA-256 of the whole base against the record before a merge that has
    /// not started (reads the whole base).
    #[arg(long, conflicts_with = "no_record")]
    verify_base: bool,
    /// For a COW without a scratch area: a journal file that makes its XOR ops that read their
    /// own destination crash-safe (created when first needed, removed when the merge
    /// completes; give the same file to resume). Android's snapuserd merges such ops without
    /// one and cannot resume them safely.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["status", "reset_progress"])]
    stash: Option<PathBuf>,
    /// The SHA-256 the whole base must have before a merge that has not started (as
    /// update_engine's `old_partition_info.hash`); for COWs without a record.
    #[arg(long, value_name = "HEX", conflicts_with_all = ["status", "reset_progress"])]
    base_sha256: Option<String>,
    /// The SHA-256 the merged image must have, checked over the new image before the first
    /// write (as `new_partition_info.hash`); for COWs without a record.
    #[arg(long, value_name = "HEX", conflicts_with_all = ["status", "reset_progress"])]
    expect_sha256: Option<String>,
}

/// `--stash FILE`, never one of the merge's own files.
fn stash_of(a: &MergeArgs) -> anyhow::Result<Option<Stash>> {
    let Some(p) = &a.stash else {
        return Ok(None);
    };
    let rec = a
        .record
        .clone()
        .unwrap_or_else(|| snapblk_cow::record::sidecar_path(&a.cow));
    let mut inputs: Vec<(&str, &Path)> = vec![("the COW", &a.cow), ("the record", &rec)];
    if a.base_dev.is_none() {
        inputs.push(("--base", &a.base));
    }
    crate::outfile::refuse_alias("--stash", p, &inputs)?;
    let st = Stash::new(p);
    // With --expect-sha256 the whole new image is checked before the first write, which also
    // covers a merge whose stash is gone.
    Ok(Some(if a.expect_sha256.is_some() {
        st.with_verified_view()
    } else {
        st
    }))
}

/// A COW with a scratch area stages its windows there: a stash would never be used.
fn refuse_stash_with_scratch(a: &MergeArgs, snap: &Snapshot) -> anyhow::Result<()> {
    if a.stash.is_some() && snap.layout().scratch().is_some() {
        anyhow::bail!(
            "--stash: {} has a scratch area, which makes its merge crash-safe without one",
            a.cow.display()
        );
    }
    Ok(())
}

/// The whole-image digests given on the command line.
struct Digests {
    base: Option<[u8; 32]>,
    expect: Option<[u8; 32]>,
}

impl Digests {
    fn parse(a: &MergeArgs) -> anyhow::Result<Digests> {
        Ok(Digests {
            base: crate::cow::parse_hex("--base-sha256", &a.base_sha256)?,
            expect: crate::cow::parse_hex("--expect-sha256", &a.expect_sha256)?,
        })
    }

    /// Check the base (only before a merge starts: after that it is no longer the old image)
    /// and the image the merge will produce (the snapshot's read view), before any write.
    fn check(&self, a: &MergeArgs, snap: &Snapshot) -> anyhow::Result<()> {
        use snapblk_cow::record::{hex, sha256_of_first};
        let (done, total) = snap.merge_progress();
        if let Some(want) = self.base {
            if done > 0 || snap.merge_staged() {
                anyhow::bail!(
                    "--base-sha256: the merge has started ({done} of {total} ops merged), so {} is no longer the old image; leave it out to resume",
                    a.base.display()
                );
            }
            // A base grown for this merge holds the old image in the record's base_size bytes.
            let base = snap.device(Dev::Base);
            let len = base.size().context("sizing the base")?;
            let len = snap
                .verifier()
                .map_or(len, |v| len.min(v.record().base_size));
            let got = sha256_of_first(base, len).context("hashing the base")?;
            if got != want {
                anyhow::bail!(
                    "base {} has SHA-256 {}, not the --base-sha256 given (a merge into it that stopped before its first commit changes it too: leave out --base-sha256 to resume one); nothing written",
                    a.base.display(),
                    hex(&got)
                );
            }
        }
        if let Some(want) = self.expect {
            let got = view_sha256(snap).context("hashing the new image")?;
            if got != want {
                anyhow::bail!(
                    "the merge would give an image with SHA-256 {}, not the --expect-sha256 given; nothing written",
                    hex(&got)
                );
            }
        }
        Ok(())
    }
}

/// SHA-256 of the new image as the snapshot serves it.
fn view_sha256(snap: &Snapshot) -> anyhow::Result<[u8; 32]> {
    let len = snap.capacity();
    let mut h = snapblk_cow::record::Sha256Stream::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        snap.read(off, &mut buf[..n])?;
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(h.finish())
}

/// Open the snapshot with the record attached (or warn, once, that there is none).
fn open_checked(a: &MergeArgs, mode: OpenMode) -> anyhow::Result<(Snapshot, bool)> {
    open_checked_dev(a, mode).map(|o| (o.snap, o.has_record))
}

/// A snapshot opened for `merge` and its modes.
struct Opened {
    snap: Snapshot,
    /// A COW record is attached.
    has_record: bool,
    /// The base device when `--base` is a device spec (for the resize at a shrinking merge's
    /// end).
    dev: Option<Arc<BlkioDev>>,
    /// Opened read-only for a growing update into a device that can resize: the sizes a merge
    /// grows it from and to (the snapshot sees it grown, zeros past its end).
    grows: Option<(u64, u64)>,
}

/// [`open_checked`], with what a device base adds.
fn open_checked_dev(a: &MergeArgs, mode: OpenMode) -> anyhow::Result<Opened> {
    let by_hand = a.base_sha256.is_some() || a.expect_sha256.is_some();
    let (snap, verifier, dev, grows) = match &a.base_dev {
        None => {
            let verifier = if a.no_record {
                None
            } else {
                load_verifier(&a.base, &a.cow, a.record.as_deref(), a.verify_base)
                    .map_err(|e| open_context(e, a))?
            };
            let size = verifier.as_ref().map(|v| v.record().target_size);
            let snap = open_files_sized(&a.base, &a.cow, SnapshotConfig::default(), mode, size)
                .map_err(|e| open_context(e, a))?;
            (snap, verifier, None, None)
        }
        Some(spec) => open_dev_checked(a, spec, mode)?,
    };
    let has_record = verifier.is_some();
    if let Some(v) = verifier {
        snap.attach_verifier(v)?;
    } else if !by_hand {
        crate::out::errln_deferred(format_args!(
            "snapblk: warning: no COW record for {} ({}): the base cannot be verified; a merge into the wrong file is not detected (--base-sha256 and --expect-sha256 check it by hand)",
            a.cow.display(),
            if a.no_record {
                "--no-record"
            } else {
                "none beside it"
            }
        ));
    }
    Ok(Opened {
        snap,
        has_record,
        dev,
        grows,
    })
}

/// [`open_checked`] for a device base: the device is opened first (read-write for a merge,
/// which takes its lock: the `rbd` driver's exclusive lock keeps servers of the image out, and
/// a server's lock keeps the merge out), then the record is checked reading the base through it.
/// For a merge of a growing update (the record's new image is larger than the base) the device
/// is grown to the new image's size once the whole pre-merge check has passed on it seen grown
/// and the blocks the COW reads match the record: the first change to the base, and one a
/// resume accepts (a base of the old or the new size). Opened
/// read-only (`--check`, `--status`), a device that can resize is seen as grown instead
/// ([`GrownView`]), so the check covers what the merge will do.
#[allow(clippy::type_complexity)]
fn open_dev_checked(
    a: &MergeArgs,
    spec: &snapblk::Spec,
    mode: OpenMode,
) -> anyhow::Result<(
    Snapshot,
    Option<Arc<snapblk_cow::record::Verifier>>,
    Option<Arc<BlkioDev>>,
    Option<(u64, u64)>,
)> {
    use snapblk_cow::ReadAt;
    let name = a.base.display().to_string();
    let dev = snapblk::open_child(&spec.driver, &spec.props, mode.base_writable)
        .and_then(BlkioDev::new)
        .with_context(|| format!("opening base {name}"))?;
    let base = Arc::new(dev);
    let verifier = if a.no_record {
        None
    } else {
        load_verifier_dev(&*base, &name, &a.cow, a.record.as_deref(), a.verify_base)
            .map_err(|e| open_context(e, a))?
    };
    let size = verifier.as_ref().map(|v| v.record().target_size);
    // A growing update into a device that can resize: its sizes before and after.
    let have = base.size()?;
    let grows = size
        .filter(|&want| have < want && base.can_resize())
        .map(|want| (have, want));
    if let Some(v) = &verifier
        && mode.base_writable
        && mode.cow_writable
    {
        if let Some((_, want)) = grows {
            // The whole pre-merge check first, on the base as it will be grown.
            precheck_grown(a, &base, v, want)?;
        }
        grow_dev_base(a, &base, v.record())?;
    }
    let (view, grows): (Arc<dyn BlockDev>, _) = match grows {
        Some((_, want)) if !mode.base_writable => {
            (Arc::new(GrownView::new(base.clone(), want)?), grows)
        }
        _ => (base.clone(), None),
    };
    let snap = open_dev_base(view, &a.cow, SnapshotConfig::default(), mode, size)
        .map_err(|e| open_context(e, a))?;
    Ok((snap, verifier, Some(base), grows))
}

/// The pre-merge check of a growing update into `base`, seen grown to `want` bytes
/// ([`GrownView`], read-only), before the merge grows it.
fn precheck_grown(
    a: &MergeArgs,
    base: &Arc<BlkioDev>,
    v: &Arc<snapblk_cow::record::Verifier>,
    want: u64,
) -> anyhow::Result<()> {
    let view: Arc<dyn BlockDev> = Arc::new(GrownView::new(base.clone(), want)?);
    let cfg = SnapshotConfig::default();
    let probe = open_dev_base(view, &a.cow, cfg, OpenMode::default(), Some(want))
        .map_err(|e| open_context(e, a))?;
    probe.attach_verifier(v.clone())?;
    let stash = attach_stash(a, &probe)?;
    precheck_with(a, &probe, stash.as_ref())?;
    Ok(())
}

/// `--stash`, refused for a COW with scratch, attached to `snap`.
fn attach_stash(a: &MergeArgs, snap: &Snapshot) -> anyhow::Result<Option<Stash>> {
    let stash = stash_of(a)?;
    refuse_stash_with_scratch(a, snap)?;
    if let Some(st) = &stash {
        snap.attach_stash(st)?;
    }
    Ok(stash)
}

/// The pre-merge check `merge` runs first, on `snap` with `stash` attached.
fn precheck_with(
    a: &MergeArgs,
    snap: &Snapshot,
    stash: Option<&Stash>,
) -> anyhow::Result<PrecheckReport> {
    let opts = MergeOptions {
        stash,
        ..Default::default()
    };
    precheck(snap, &opts).with_context(|| format!("merging {}", a.cow.display()))
}

/// Grow a device base smaller than the record's new image to that size, after checking the
/// blocks the COW reads against the record (nothing is changed when they differ).
fn grow_dev_base(
    a: &MergeArgs,
    base: &BlkioDev,
    rec: &snapblk_cow::record::Record,
) -> anyhow::Result<()> {
    use snapblk_cow::ReadAt;
    let have = base.size()?;
    if have >= rec.target_size {
        return Ok(());
    }
    let mut check = snapblk_cow::record::RecordCheck::default();
    snapblk_cow::record::check_base(rec, base, &mut check)
        .with_context(|| format!("checking base {}", a.base.display()))?;
    if !check.base_mismatches.is_empty() {
        anyhow::bail!(
            "base {} is not the image this COW was made for: {} of the {} blocks it reads differ from the record; nothing written",
            a.base.display(),
            check.base_mismatches.len(),
            check.base_blocks_checked
        );
    }
    base.resize(rec.target_size).with_context(|| {
        format!(
            "growing base {} from {have} to {} bytes (the new image's size)",
            a.base.display(),
            rec.target_size
        )
    })
}

/// Open errors that name the base themselves need no "opening … with base …" in front.
fn open_context(e: SnapError, a: &MergeArgs) -> anyhow::Error {
    match e {
        SnapError::BaseTooShort { .. }
        | SnapError::BaseSmallerThanNewImage { .. }
        | SnapError::IsDirectory { .. }
        | SnapError::WrongBase(_)
        | SnapError::Record { .. } => e.into(),
        e => anyhow::Error::new(e).context(format!(
            "opening {} with base {}",
            a.cow.display(),
            a.base.display()
        )),
    }
}

pub fn run(a: MergeArgs) -> anyhow::Result<()> {
    if a.check {
        // Its verdict says `mergeable: false` for any refusal, early ones included.
        let json = a.json;
        return crate::out::json_on_error(json, run_cmd(a), |e| {
            let v = serde_json::json!({
                "schema": "snapblk.merge-check.v1",
                "mergeable": false, "error": format!("{e:#}"),
            });
            v.to_string()
        });
    }
    // `--reset-progress` prints no JSON.
    let schema = match (a.status, a.reset_progress) {
        (true, _) => Some("snapblk.merge-status.v1"),
        (false, false) => Some("snapblk.merge.v1"),
        _ => None,
    };
    let json = a.json && schema.is_some();
    crate::out::json_verdict(json, schema.unwrap_or_default(), run_cmd(a))
}

fn run_cmd(mut a: MergeArgs) -> anyhow::Result<()> {
    a.base_dev = device_spec(&a.base)?;
    if a.base_dev.is_none() {
        crate::outfile::refuse_same(("--base", &a.base), ("the COW", &a.cow))?;
    }
    if a.check {
        return check(&a);
    }
    if a.status {
        return status(&a);
    }
    if a.reset_progress {
        return reset_progress(&a);
    }
    let digests = Digests::parse(&a)?;
    let stash = stash_of(&a)?;
    if let Some(ops) = finished_shrink(&a)? {
        return report_finished(&a, ops);
    }
    let mode = OpenMode {
        base_writable: true,
        cow_writable: true,
    };
    let Opened { snap, dev, .. } = open_checked_dev(&a, mode)?;
    refuse_stash_with_scratch(&a, &snap)?;
    if let Some(st) = &stash {
        snap.attach_stash(st)?;
    }
    digests.check(&a, &snap)?;
    let (done, total) = snap.merge_progress();
    // Every op writes one block: the bar counts the blocks' bytes.
    let bs = snap.map().block_size();
    let bar = Progress::bytes_forced(total as u64 * bs, "merge", a.progress);
    bar.set(done as u64 * bs);
    let on_progress = |p: MergeProgress| bar.set(p.merged as u64 * bs);
    let t0 = Instant::now();
    let report = merge(
        &snap,
        MergeOptions {
            progress: Some(&on_progress),
            stash: stash.as_ref(),
            pipeline: true,
            keep_decoded: snapblk_snapshot::KEEP_DECODED,
            ..Default::default()
        },
    );
    bar.finish();
    let report = report.with_context(|| format!("merging {}", a.cow.display()))?;
    if let Some(st) = &stash {
        st.remove()?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let shrunk = shrink_base(&a, &snap, dev.as_deref())?;
    let bytes = report.blocks_written * snap.map().block_size();
    let sched = snap.sched_stats();
    let mut out = crate::out::stdout();
    if a.json {
        let v = serde_json::json!({
            "schema": "snapblk.merge.v1",
            "ok": true, "error": null,
            "merged": report.total_ops,
            "total": report.total_ops,
            "report": report,
            "seconds": secs,
            "bytes_written": bytes,
            "mib_per_s": bytes as f64 / (1 << 20) as f64 / secs.max(1e-9),
            "scheduler": sched,
            "base_truncated_to": shrunk,
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
            "merged {} ops ({resumed}), {} blocks written ({}, {}), {} overlay blocks, {secs:.3}s",
            report.total_ops,
            report.blocks_written,
            crate::human::bytes(bytes),
            crate::human::rate(bytes, secs),
            report.overlay_blocks
        )?;
        if let Some(n) = shrunk {
            writeln!(
                out,
                "base {} truncated to {}: the new image is smaller than the old",
                a.base.display(),
                crate::human::bytes_exact(n)
            )?;
        }
        if a.stats {
            writeln!(
                out,
                "{} ordered windows ({} staged in scratch, {} self-safe without scratch), {} replace batches, {} decoded units taken from the pre-merge check",
                report.ordered_windows,
                report.scratch_windows,
                report.self_safe_windows,
                report.replace_batches,
                report.units_from_check
            )?;
            writeln!(
                out,
                "pre-merge check: {}",
                describe(&report.precheck, a.stash.is_some())
            )?;
            writeln!(out, "{}", serde_json::to_string_pretty(&sched)?)?;
        }
    }
    Ok(())
}

/// One line saying what the pre-merge check covered.
fn describe(r: &PrecheckReport, stash: bool) -> String {
    let windows = if r.scratch {
        "scratch area present".to_owned()
    } else if stash {
        format!(
            "no scratch area: {} windows, self-safe or one op reading its own destination through the stash",
            r.self_safe_windows
        )
    } else {
        format!(
            "no scratch area: {} self-safe windows, no op reads its own destination",
            r.self_safe_windows
        )
    };
    format!(
        "{} ops from op {} inside the device ({} blocks) and the base ({}); {} payloads decoded ({} -> {}), {} raw payloads in bounds; merge order valid (all COPY/XOR first, none reads a block an earlier op overwrites); {windows}; {:.3}s",
        r.ops_checked,
        r.from_op,
        r.device_blocks,
        crate::human::bytes(r.base_bytes),
        r.payloads_decoded,
        crate::human::bytes(r.payload_bytes),
        crate::human::bytes(r.decoded_bytes),
        r.raw_payloads,
        r.seconds
    )
}

/// `--check`: the pre-merge check `merge` runs, read-only. A refusal prints the same message
/// `merge` would, and with `--json` a verdict on stdout as well.
fn check(a: &MergeArgs) -> anyhow::Result<()> {
    let res = open_checked_dev(a, OpenMode::default()).and_then(|o| {
        let snap = o.snap;
        let stash = attach_stash(a, &snap)?;
        Digests::parse(a)?.check(a, &snap)?;
        let (done, total) = snap.merge_progress();
        precheck_with(a, &snap, stash.as_ref()).map(|r| (done, total, r, o.grows))
    });
    let mut out = crate::out::stdout();
    // A refusal's verdict is printed by `run`.
    let (done, total, r, grows) = res?;
    if a.json {
        let v = serde_json::json!({
            "schema": "snapblk.merge-check.v1",
            "mergeable": true, "merged": done, "total": total, "checked": r,
            "base_grown_to": grows.map(|g| g.1),
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "mergeable: {done}/{total} ops merged")?;
        if let Some((have, want)) = grows {
            writeln!(
                out,
                "the merge grows base {} from {have} to {want} bytes (the new image's size) after this check, before its first write",
                a.base.display()
            )?;
        }
        writeln!(out, "checked: {}", describe(&r, a.stash.is_some()))?;
    }
    Ok(())
}

/// After a successful merge of a shrinking update (the record's new image is smaller than the
/// base): truncate a regular-file base to the new size, or resize a device given by a spec (an
/// RBD image) through its driver. A block device keeps its size. The merge's completion is in
/// the COW before this runs, so a merge stopped before or during it ends here on the next run
/// (the record accepts a base of the old or the new size).
fn shrink_base(
    a: &MergeArgs,
    snap: &Snapshot,
    dev: Option<&BlkioDev>,
) -> anyhow::Result<Option<u64>> {
    let Some(v) = snap.verifier() else {
        return Ok(None);
    };
    let want = v.record().target_size;
    if let Some(dev) = dev {
        use snapblk_cow::ReadAt;
        if dev.size()? <= want {
            return Ok(None);
        }
        dev.resize(want)
            .with_context(|| format!("shrinking {} to {want} bytes", a.base.display()))?;
        return Ok(Some(want));
    }
    if a.base_dev.is_some() {
        return Ok(None);
    }
    let m = std::fs::metadata(&a.base)?;
    if !m.is_file() || m.len() <= want {
        return Ok(None);
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&a.base)
        .with_context(|| format!("open {}", a.base.display()))?;
    f.set_len(want)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("truncate {} to {want} bytes", a.base.display()))?;
    Ok(Some(want))
}

/// A shrinking update whose merge is complete and whose base was already cut to the new
/// size (a run stopped after the truncate or resize, run again): the COW's sources past the
/// new end no longer fit the base, so the snapshot is not opened. The number of ops when the
/// record is bound to the COW, every op is merged, the base is the new image's size and its
/// SHA-256 is the record's new image's; `None` otherwise (the merge opens as usual and says
/// what is wrong).
fn finished_shrink(a: &MergeArgs) -> anyhow::Result<Option<u64>> {
    use snapblk_cow::ReadAt;
    if a.no_record {
        return Ok(None);
    }
    let rp = a
        .record
        .clone()
        .unwrap_or_else(|| snapblk_cow::record::sidecar_path(&a.cow));
    let Ok(Some(rec)) = snapblk_cow::record::Record::load(&rp) else {
        return Ok(None);
    };
    if rec.target_size >= rec.base_size {
        return Ok(None);
    }
    let Ok(f) = std::fs::File::open(&a.cow) else {
        return Ok(None);
    };
    let Ok(cow) = snapblk_cow::CowReader::open(f) else {
        return Ok(None);
    };
    if rec.check_binding(&cow).is_err() {
        return Ok(None);
    }
    let ops = cow.merge_len();
    if cow.header().num_merge_ops < ops {
        return Ok(None);
    }
    let base: Box<dyn ReadAt> = match &a.base_dev {
        Some(spec) => Box::new(
            snapblk::open_child(&spec.driver, &spec.props, false)
                .and_then(BlkioDev::new)
                .with_context(|| format!("opening base {}", a.base.display()))?,
        ),
        None => Box::new(
            std::fs::File::open(&a.base).with_context(|| format!("open {}", a.base.display()))?,
        ),
    };
    if base.size()? != rec.target_size {
        return Ok(None);
    }
    let got = snapblk_cow::record::sha256_of(&*base).context("hashing the base")?;
    Ok((got == rec.target_sha256).then_some(ops))
}

/// The report of a run that found [`finished_shrink`]'s state: nothing to do.
fn report_finished(a: &MergeArgs, ops: u64) -> anyhow::Result<()> {
    let mut out = crate::out::stdout();
    if a.json {
        // A resumed merge with nothing left, as the engine reports one.
        let v = serde_json::json!({
            "schema": "snapblk.merge.v1",
            "ok": true, "error": null,
            "merged": ops, "total": ops,
            "report": {
                "total_ops": ops, "blocks_written": 0, "overlay_blocks": 0,
                "resumed_at": ops, "resumed_from_scratch": false,
                "precheck": {
                    "total_ops": ops, "ops_checked": 0, "from_op": ops,
                    "order_valid": true, "payloads_decoded": 0,
                },
            },
            "seconds": 0.0, "bytes_written": 0, "mib_per_s": 0.0,
            "scheduler": {}, "base_truncated_to": null,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(
            out,
            "merged {ops} ops (already complete): base {} is the new image (its size and SHA-256 are the record's)",
            a.base.display()
        )?;
    }
    Ok(())
}

/// `--status`: merge progress and, with a record, what the base is for this COW.
fn status(a: &MergeArgs) -> anyhow::Result<()> {
    let (snap, has_record) = open_checked(a, OpenMode::default())?;
    let (done, total) = snap.merge_progress();
    let binding = snap.check_merge_base()?;
    let mut out = crate::out::stdout();
    if a.json {
        let v = serde_json::json!({
            "schema": "snapblk.merge-status.v1",
            "ok": true, "error": null,
            "merged": done, "total": total, "record": has_record,
            "base": binding.as_ref().map(|b| b.verdict),
            "check": binding,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    writeln!(out, "merged: {done}/{total} ops")?;
    match &binding {
        None => writeln!(out, "base: unknown (no COW record)")?,
        Some(b) => {
            let what = match b.verdict {
                MergeVerdict::NotStarted => "the old image: the merge has not started",
                MergeVerdict::InProgress => "this merge's base, in progress",
                MergeVerdict::Complete => "the new image: the merge is complete",
                MergeVerdict::ProgressOfAnotherFile => {
                    "untouched, but the COW's progress was made on another file (see --reset-progress)"
                }
                MergeVerdict::AlreadyUpdated => "already the new image, and the COW not merged",
                MergeVerdict::WrongBase => "NOT this COW's base",
            };
            writeln!(
                out,
                "base: {what} ({} merged and {} old blocks checked, {} and {} differ)",
                b.merged_blocks_checked,
                b.source_blocks_checked,
                b.merged_mismatches.len(),
                b.source_mismatches.len()
            )?;
        }
    }
    Ok(())
}

/// `--reset-progress`: back to "not started", only when the record proves this base untouched.
fn reset_progress(a: &MergeArgs) -> anyhow::Result<()> {
    if a.no_record {
        anyhow::bail!(
            "--reset-progress needs the COW record to prove the base untouched (make one with `snapblk cow record`)"
        );
    }
    let mode = OpenMode {
        base_writable: false,
        cow_writable: true,
    };
    let (snap, has_record) = open_checked(a, mode)?;
    if !has_record {
        anyhow::bail!(
            "--reset-progress needs the COW record to prove the base untouched (make one with `snapblk cow record`)"
        );
    }
    let (done, _) = snap.merge_progress();
    let b = snap.check_merge_base()?.context("no COW record attached")?;
    match b.verdict {
        MergeVerdict::ProgressOfAnotherFile => {}
        MergeVerdict::NotStarted => {
            writeln!(
                crate::out::stdout(),
                "nothing to reset: the merge has not started"
            )?;
            return Ok(());
        }
        v => anyhow::bail!(
            "refusing to reset the progress ({done} ops merged): the base is {}",
            serde_json::to_value(v)?.as_str().unwrap_or("not untouched")
        ),
    }
    snap.reset_merge_progress()
        .with_context(|| format!("resetting {}", a.cow.display()))?;
    writeln!(
        crate::out::stdout(),
        "reset the merge progress of {} ({done} ops counted on another file); the merge starts over on {}",
        a.cow.display(),
        a.base.display()
    )?;
    Ok(())
}
