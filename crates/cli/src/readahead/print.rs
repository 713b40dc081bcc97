//! The output of `snapblk residency` and `snapblk readahead`: human text on stdout, one JSON
//! document with `--json`, warnings on stderr. Nothing here decides what to do.

use super::args::ReplayOpts;
use anyhow::bail;
use snapblk_readahead::{
    self as ra, BackOff, EvictReport, Extent, Recording, ReplayReport, Residency, WalkError,
    escape_path,
};
use std::io::Write;
use std::path::Path;

/// Files a walk could not read: one line each on stderr (the run goes on without them).
pub(super) fn print_walk_errors(errors: &[WalkError]) -> std::io::Result<()> {
    for e in errors {
        errln!("snapblk: {}: {}", escape_path(&e.path), e.error)?;
    }
    Ok(())
}

/// Files a walk could not read, for a JSON report.
pub(super) fn walk_errors_json(errors: &[WalkError]) -> Vec<serde_json::Value> {
    errors
        .iter()
        .map(|e| serde_json::json!({"path": escape_path(&e.path), "error": e.error}))
        .collect()
}

pub(super) use crate::human::bytes as human;

/// `a` of `b` in percent with `prec` decimals, or "n/a" when there is nothing to measure
/// (0 of 0 is not 100 %).
pub(super) fn pct(a: u64, b: u64, prec: usize) -> String {
    if b == 0 {
        "n/a".into()
    } else {
        format!("{:.prec$}%", a as f64 * 100.0 / b as f64)
    }
}

/// Columns of a residency bar (like vmtouch -v).
pub(super) const BAR_WIDTH: usize = 40;

/// The report of `snapblk residency` (files unless `summary`, with `bars` of residency when
/// asked, then totals; or one JSON document), and the paths the walk could not read.
pub(super) fn residency(
    rep: &ra::Report,
    json: bool,
    summary: bool,
    bars: bool,
    elapsed: f64,
) -> anyhow::Result<()> {
    let t = rep.totals();
    let mut out = std::io::BufWriter::new(crate::out::stdout());
    if json {
        let doc = serde_json::json!({
            "schema": "snapblk.residency.v1",
            "page_size": rep.page_size,
            "files": if summary { serde_json::Value::Array(vec![]) } else { serde_json::to_value(&rep.files)? },
            "total": t,
            "errors": walk_errors_json(&rep.errors),
            "elapsed_secs": elapsed,
        });
        serde_json::to_writer(&mut out, &doc)?;
        writeln!(out)?;
        out.flush()?;
        return Ok(());
    }
    if !summary {
        for f in &rep.files {
            let p = escape_path(&f.path);
            match &f.residency {
                Residency::Known { resident_pages, .. } => {
                    let r = (*resident_pages).min(f.pages);
                    if bars {
                        writeln!(
                            out,
                            "{p}\n[{}] {r}/{}  {}",
                            ra::render_bar(&f.buckets, BAR_WIDTH),
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
    Ok(())
}

/// Written files named in `record`'s text summary and in its JSON `written` array (the
/// count, `written_files`, is always complete).
const WRITTEN_SHOWN_TEXT: usize = 10;
const WRITTEN_SHOWN_JSON: usize = 100;

/// The summary of `snapblk readahead record` for the list written to `output` (text or one
/// JSON document), and warnings about an incomplete trace on stderr.
pub(super) fn record(rec: &Recording, output: &Path, json: bool) -> anyhow::Result<()> {
    let bytes: u64 = rec
        .entries
        .iter()
        .map(|e| match &e.extent {
            Extent::Ranges(r) => r.total_bytes(),
            Extent::Whole => e.identity.map_or(0, |i| i.size),
        })
        .sum();
    if json {
        let doc = serde_json::json!({
            "schema": "snapblk.record.v1",
            "list": output.display().to_string(),
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
            "trace": rec.trace.as_ref().map(|t| serde_json::json!({
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
            output.display()
        )?;
        if rec.reclaimed_bytes > 0 {
            outln!(
                "{} of it was read and then reclaimed by the kernel during the recording \
                 (found as shadow entries; listed all the same)",
                human(rec.reclaimed_bytes)
            )?;
        }
        if let Some(t) = &rec.trace {
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
    if let Some(t) = &rec.trace
        && t.lost_events > 0
    {
        errln!(
            "snapblk: warning: the kernel dropped {} page-cache trace events (its trace \
             buffer filled faster than it was read): the trace part of the list may be \
             incomplete",
            t.lost_events
        )?;
    }
    if let Some(t) = &rec.trace
        && t.untraceable_files > 0
    {
        errln!(
            "snapblk: warning: {} files are on btrfs or overlayfs, whose files the page-cache \
             trace cannot name (its device and inode are not the ones stat reports): their \
             entries come from the residency diff alone",
            t.untraceable_files
        )?;
    }
    Ok(())
}

/// The progress bar's label while the pressure back-off holds the replay: under sustained
/// outside I/O pressure it crawls (one request per thread per 5 s pause), and a bar that just
/// stops would look hung.
pub(super) fn backoff_message(what: &str, b: BackOff) -> String {
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
pub(super) fn report_replay(
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
fn diskstats_table(c: &ra::DiskStatsChange) -> String {
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

/// The report of `snapblk readahead evict` (files still resident, then totals; or one JSON
/// document).
pub(super) fn evict(rep: &EvictReport, json: bool, elapsed: f64) -> anyhow::Result<()> {
    if json {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diskstats_table_shows_before_after_and_delta() {
        use ra::{diskstats_change, parse_diskstats};
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
}
