//! System I/O signals: pressure stall information (/proc/pressure/io), /proc/diskstats and the
//! per-device in-flight counters in sysfs.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where the kernel publishes I/O pressure (CONFIG_PSI).
pub const PSI_IO: &str = "/proc/pressure/io";

/// Samples the cumulative "some" I/O stall time and turns it into a stall fraction between
/// samples. avg10 is too slow to react to a foreground burst, so the raw counter is used.
pub(crate) struct PsiSampler {
    path: PathBuf,
    last: Option<(u64, Instant)>,
}

fn read_psi_some_total(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let line = s.lines().find(|l| l.starts_with("some "))?;
    line.split(' ')
        .find_map(|kv| kv.strip_prefix("total="))?
        .parse()
        .ok()
}

impl PsiSampler {
    /// Samples a pressure file in the /proc/pressure format at `path` (tests use a fake one);
    /// `None` if it cannot be read or has no "some" total.
    pub(crate) fn open(path: &Path) -> Option<PsiSampler> {
        let t = read_psi_some_total(path)?;
        Some(PsiSampler {
            path: path.to_path_buf(),
            last: Some((t, Instant::now())),
        })
    }

    /// Fraction of wall time (0..=1) during which some task stalled on I/O since the last call.
    pub(crate) fn sample(&mut self) -> Option<f64> {
        let now_total = read_psi_some_total(&self.path)?;
        let now = Instant::now();
        let frac = self.last.and_then(|(t, at)| {
            let us = now.duration_since(at).as_micros() as f64;
            (us > 0.0).then(|| (now_total.saturating_sub(t) as f64 / us).min(1.0))
        });
        self.last = Some((now_total, now));
        frac
    }
}

/// One line of /proc/diskstats (the fields used here): the device and its counters. In JSON
/// the counters are fields of the line itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DiskStat {
    /// Device name as in /proc/diskstats (e.g. `nvme0n1`, `sda2`).
    pub name: String,
    /// Device major number.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
    /// The device's counters from that line.
    #[serde(flatten)]
    pub counters: DiskCounters,
}

/// A device's cumulative I/O totals (everything in a [`DiskCounters`] but the in-flight gauge).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IoTotals {
    /// Reads completed (field 4 of /proc/diskstats).
    pub reads: u64,
    /// 512-byte sectors read (field 6), whatever the device's block size.
    pub sectors_read: u64,
    /// Milliseconds spent reading (field 7), summed over all reads.
    pub read_ms: u64,
    /// Writes completed (field 8).
    pub writes: u64,
    /// 512-byte sectors written (field 10).
    pub sectors_written: u64,
}

impl IoTotals {
    /// `self - before`, per field; a total that went backwards (a device re-created in
    /// between) gives 0.
    pub fn since(&self, before: &IoTotals) -> IoTotals {
        IoTotals {
            reads: self.reads.saturating_sub(before.reads),
            sectors_read: self.sectors_read.saturating_sub(before.sectors_read),
            read_ms: self.read_ms.saturating_sub(before.read_ms),
            writes: self.writes.saturating_sub(before.writes),
            sectors_written: self.sectors_written.saturating_sub(before.sectors_written),
        }
    }
}

/// A device's counters at one moment ([`DiskStat::counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DiskCounters {
    /// The cumulative totals.
    #[serde(flatten)]
    pub totals: IoTotals,
    /// I/Os in flight (a gauge, not a counter).
    pub in_flight: u64,
}

/// `after - before` of [`DiskCounters`]; `in_flight` is signed since it is a gauge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DiskDelta {
    /// Differences of the cumulative totals.
    #[serde(flatten)]
    pub totals: IoTotals,
    /// Change of the in-flight gauge (may be negative).
    pub in_flight: i64,
}

/// Parses /proc/diskstats text; malformed lines are skipped.
pub fn parse_diskstats(s: &str) -> Vec<DiskStat> {
    s.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
            Some(DiskStat {
                major: f.first()?.parse().ok()?,
                minor: f.get(1)?.parse().ok()?,
                name: f.get(2)?.to_string(),
                counters: DiskCounters {
                    totals: IoTotals {
                        reads: n(3)?,
                        sectors_read: n(5)?,
                        read_ms: n(6)?,
                        writes: n(7)?,
                        sectors_written: n(9)?,
                    },
                    in_flight: n(11)?,
                },
            })
        })
        .collect()
}

/// Current /proc/diskstats (empty if unreadable).
pub(crate) fn diskstats() -> Vec<DiskStat> {
    std::fs::read_to_string("/proc/diskstats")
        .map(|s| parse_diskstats(&s))
        .unwrap_or_default()
}

/// Per-device difference `after - before` for the devices in `devs` (major, minor), in the
/// older flat shape (`in_flight` is the level after): [`diskstats_change`] projected.
pub(crate) fn diskstats_delta(
    before: &[DiskStat],
    after: &[DiskStat],
    devs: &[(u32, u32)],
) -> Vec<DiskStat> {
    diskstats_change(before, after, devs)
        .into_iter()
        .map(|c| DiskStat {
            name: c.name,
            major: c.major,
            minor: c.minor,
            counters: DiskCounters {
                totals: c.delta.totals,
                in_flight: c.after.in_flight,
            },
        })
        .collect()
}

/// One device's /proc/diskstats before and after an operation, and the difference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskStatsChange {
    /// Device name as in /proc/diskstats.
    pub name: String,
    /// Device major number.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
    /// Counters before the operation.
    pub before: DiskCounters,
    /// Counters after the operation.
    pub after: DiskCounters,
    /// `after - before` (totals saturating at 0, see [`IoTotals::since`]).
    pub delta: DiskDelta,
}

/// Before, after and `after - before` for the devices in `devs` (major, minor) that have a
/// line in both snapshots. Counters that went backwards (a device re-created in between) give
/// a delta of 0.
pub fn diskstats_change(
    before: &[DiskStat],
    after: &[DiskStat],
    devs: &[(u32, u32)],
) -> Vec<DiskStatsChange> {
    after
        .iter()
        .filter(|a| devs.contains(&(a.major, a.minor)))
        .filter_map(|a| {
            let b = before
                .iter()
                .find(|b| (b.major, b.minor) == (a.major, a.minor))?;
            let (was, now) = (b.counters, a.counters);
            let in_flight = i64::try_from(now.in_flight)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(was.in_flight).unwrap_or(i64::MAX));
            Some(DiskStatsChange {
                name: a.name.clone(),
                major: a.major,
                minor: a.minor,
                before: was,
                after: now,
                delta: DiskDelta {
                    totals: now.totals.since(&was.totals),
                    in_flight,
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diskstats_parse_and_delta() {
        let a = " 254       0 vda 100 0 800 50 10 0 80 5 2 60 70 0 0 0 0\nbad line\n";
        let b = " 254       0 vda 150 0 1800 70 10 0 80 5 0 60 70 0 0 0 0\n";
        let pa = parse_diskstats(a);
        assert_eq!(pa.len(), 1);
        assert_eq!(pa[0].counters.in_flight, 2);
        let d = diskstats_delta(&pa, &parse_diskstats(b), &[(254, 0)]);
        assert_eq!(d[0].counters.totals.reads, 50);
        assert_eq!(d[0].counters.totals.sectors_read, 1000);
        assert!(diskstats_delta(&pa, &parse_diskstats(b), &[(8, 0)]).is_empty());
    }

    #[test]
    fn diskstats_before_after_and_delta() {
        let a = " 254 0 vda 100 0 800 50 10 0 80 5 2 60 70 0 0 0 0\n\
                   254 1 vda1 9 0 9 9 9 0 9 9 0 9 9 0 0 0 0\n";
        let b = " 254 0 vda 150 0 1800 70 12 0 96 5 1 60 70 0 0 0 0\n\
                   254 1 vda1 5 0 9 9 9 0 9 9 0 9 9 0 0 0 0\n\
                   7 0 loop0 1 0 8 1 0 0 0 0 0 1 1 0 0 0 0\n";
        let c = diskstats_change(
            &parse_diskstats(a),
            &parse_diskstats(b),
            &[(254, 0), (254, 1), (7, 0)],
        );
        // loop0 has no "before" line, so it is left out.
        assert_eq!(c.len(), 2);
        let vda = &c[0];
        assert_eq!((vda.name.as_str(), vda.major, vda.minor), ("vda", 254, 0));
        assert_eq!(
            vda.before,
            DiskCounters {
                totals: IoTotals {
                    reads: 100,
                    sectors_read: 800,
                    read_ms: 50,
                    writes: 10,
                    sectors_written: 80,
                },
                in_flight: 2
            }
        );
        assert_eq!(vda.after.totals.reads, 150);
        assert_eq!(vda.after.in_flight, 1);
        assert_eq!(
            vda.delta,
            DiskDelta {
                totals: IoTotals {
                    reads: 50,
                    sectors_read: 1000,
                    read_ms: 20,
                    writes: 2,
                    sectors_written: 16,
                },
                in_flight: -1
            }
        );
        // A counter that went backwards gives 0, not a wrapped number.
        assert_eq!(c[1].delta.totals.reads, 0);
    }

    #[test]
    fn json_shapes_of_both_diskstats_fields_are_stable() {
        // The --diskstats JSON (`diskstats` and the older flat `diskstats_delta`), field for
        // field and in order, as scripts read it.
        let a = parse_diskstats(" 254 0 vda 100 0 800 50 10 0 80 5 2 60 70 0 0 0 0\n");
        let b = parse_diskstats(" 254 0 vda 150 0 1800 70 12 0 96 5 1 60 70 0 0 0 0\n");
        let change = serde_json::to_string(&diskstats_change(&a, &b, &[(254, 0)])).unwrap();
        assert_eq!(
            change,
            r#"[{"name":"vda","major":254,"minor":0,"#.to_owned()
                + r#""before":{"reads":100,"sectors_read":800,"read_ms":50,"writes":10,"sectors_written":80,"in_flight":2},"#
                + r#""after":{"reads":150,"sectors_read":1800,"read_ms":70,"writes":12,"sectors_written":96,"in_flight":1},"#
                + r#""delta":{"reads":50,"sectors_read":1000,"read_ms":20,"writes":2,"sectors_written":16,"in_flight":-1}}]"#
        );
        let delta = serde_json::to_string(&diskstats_delta(&a, &b, &[(254, 0)])).unwrap();
        assert_eq!(
            delta,
            r#"[{"name":"vda","major":254,"minor":0,"reads":50,"sectors_read":1000,"#.to_owned()
                + r#""read_ms":20,"writes":2,"sectors_written":16,"in_flight":1}]"#
        );
        // Through serde_json::Value, as the CLI prints a report, too.
        let v = serde_json::to_value(diskstats_delta(&a, &b, &[(254, 0)])).unwrap();
        assert_eq!(v[0]["in_flight"], 1);
        assert_eq!(v[0]["name"], "vda");
    }
}
