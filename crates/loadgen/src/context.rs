//! Run context captured with every result: kernel, CPU, load, and for the target's block device
//! the I/O scheduler with its tunables, `read_ahead_kb` and queue limits, plus the target file's
//! page-cache state (through snapblk-readahead's honest residency measurement).

use serde::Serialize;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Host facts.
#[derive(Debug, Clone, Serialize)]
pub struct Context {
    /// `/proc/sys/kernel/hostname`.
    pub hostname: String,
    /// The kernel release (`/proc/sys/kernel/osrelease`, e.g. `6.8.0-45-generic`).
    pub kernel: String,
    /// The kernel build string (`/proc/sys/kernel/version`).
    pub kernel_version: String,
    /// The first `model name` of `/proc/cpuinfo` (empty where there is none).
    pub cpu_model: String,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// `MemTotal` of `/proc/meminfo`, in KiB.
    pub mem_total_kb: u64,
    /// The 1/5/15-minute load averages when the context was captured.
    pub loadavg: [f64; 3],
    /// `/proc/pressure/cpu` "some avg10" (None when PSI is unavailable).
    pub cpu_pressure_avg10: Option<f64>,
    /// `/proc/pressure/io` "some avg10".
    pub io_pressure_avg10: Option<f64>,
    /// The kernel's current clocksource (`tsc`, `kvm-clock`, …). The bench times I/O with the
    /// TSC; a kernel that does not use it may have found it unreliable here.
    pub clocksource: Option<String>,
    /// The target's context, when [`capture`] was given a path.
    pub target: Option<TargetContext>,
}

/// Facts about the target path and the block device under it.
#[derive(Debug, Clone, Serialize)]
pub struct TargetContext {
    /// The target path as given.
    pub path: String,
    /// "block", "file", or "other".
    pub kind: String,
    /// Filesystem type for files (from /proc/mounts), None for block devices.
    pub fs_type: Option<String>,
    /// Kernel name of the block device whose queue serves the I/O (e.g. `vda`, `zram0`).
    pub block_device: Option<String>,
    /// The device queue's active I/O scheduler (`queue/scheduler`), None without a device.
    pub scheduler: Option<String>,
    /// The active scheduler's tunables (`queue/iosched/*`), empty for `none`.
    pub scheduler_tunables: BTreeMap<String, String>,
    /// `queue/read_ahead_kb` of the device.
    pub read_ahead_kb: Option<u64>,
    /// `queue/nr_requests` of the device.
    pub nr_requests: Option<u64>,
    /// `queue/max_sectors_kb` of the device.
    pub max_sectors_kb: Option<u64>,
    /// `queue/rotational` of the device.
    pub rotational: Option<bool>,
    /// Page-cache residency of the target when the run started.
    pub cache: Option<CacheState>,
}

/// Page-cache state of the target file.
#[derive(Debug, Clone, Serialize)]
pub struct CacheState {
    /// The target's size in 4 KiB pages (rounded up).
    pub total_pages: u64,
    /// None when residency cannot be known (see `note`).
    pub resident_pages: Option<u64>,
    /// Why residency cannot be known, when it cannot.
    pub note: Option<String>,
}

fn read_trim(p: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn psi(kind: &str) -> Option<f64> {
    let s = fs::read_to_string(format!("/proc/pressure/{kind}")).ok()?;
    let line = s.lines().find(|l| l.starts_with("some"))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("avg10="))
        .and_then(|v| v.parse().ok())
}

/// Capture the host context and, when given, the target's.
pub fn capture(target: Option<&Path>) -> Context {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mem_total_kb = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .map(str::to_string)
        })
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0);
    Context {
        hostname: read_trim("/proc/sys/kernel/hostname").unwrap_or_default(),
        kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_default(),
        kernel_version: read_trim("/proc/sys/kernel/version").unwrap_or_default(),
        cpu_model,
        cpus,
        mem_total_kb,
        loadavg: loadavg(),
        cpu_pressure_avg10: psi("cpu"),
        io_pressure_avg10: psi("io"),
        clocksource: read_trim("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        target: target.map(target_context),
    }
}

/// The 1/5/15-minute load averages.
pub(crate) fn loadavg() -> [f64; 3] {
    let s = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = s.split_whitespace().map(|v| v.parse().unwrap_or(0.0));
    [
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
    ]
}

/// The `/sys/block/NAME` directory whose `queue/` serves device `dev` (partitions map to their
/// parent disk).
pub(crate) fn sys_block_dir(dev: u64) -> Option<PathBuf> {
    let (ma, mi) = (libc::major(dev), libc::minor(dev));
    if ma == 0 {
        return None; // tmpfs, overlay, …: no block device
    }
    let p = fs::canonicalize(format!("/sys/dev/block/{ma}:{mi}")).ok()?;
    if p.join("queue").is_dir() {
        return Some(p);
    }
    let parent = p.parent()?.to_path_buf();
    parent.join("queue").is_dir().then_some(parent)
}

/// The block device directory for a path (the device itself, or the one its filesystem is on).
pub(crate) fn block_dir_for(path: &Path) -> Option<PathBuf> {
    let m = fs::metadata(path).ok()?;
    if m.file_type().is_block_device() {
        sys_block_dir(m.rdev())
    } else {
        sys_block_dir(m.dev())
    }
}

/// The active scheduler of `/sys/block/X` (the bracketed entry) and all offered ones.
pub(crate) fn scheduler(dir: &Path) -> (Option<String>, Vec<String>) {
    let Some(s) = read_trim(dir.join("queue/scheduler")) else {
        return (None, Vec::new());
    };
    let mut active = None;
    let all = s
        .split_whitespace()
        .map(|w| {
            if let Some(x) = w.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
                active = Some(x.to_string());
                x.to_string()
            } else {
                w.to_string()
            }
        })
        .collect();
    (active, all)
}

fn fs_type(path: &Path) -> Option<String> {
    let canon = fs::canonicalize(path).ok()?;
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, mnt, ty) = (f.next()?, f.next()?, f.next()?);
            canon.starts_with(mnt).then(|| (mnt.len(), ty.to_string()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, t)| t)
}

fn cache_state(path: &Path) -> Option<CacheState> {
    let f = fs::File::open(path).ok()?;
    let meta = f.metadata().ok()?;
    let size = if meta.file_type().is_block_device() {
        use std::io::Seek;
        let mut g = &f;
        g.seek(std::io::SeekFrom::End(0)).ok()?
    } else {
        meta.len()
    };
    let total_pages = size.div_ceil(4096);
    let r = snapblk_readahead::measure(&f, path, &meta, None);
    let note = match &r {
        snapblk_readahead::Residency::Unknown { reason } => Some(reason.clone()),
        _ => None,
    };
    Some(CacheState {
        total_pages,
        resident_pages: r.resident_pages(),
        note,
    })
}

/// Context of a target path.
pub(crate) fn target_context(path: &Path) -> TargetContext {
    let meta = fs::metadata(path).ok();
    let kind = match &meta {
        Some(m) if m.file_type().is_block_device() => "block",
        Some(m) if m.is_file() => "file",
        _ => "other",
    };
    let dir = block_dir_for(path);
    let q = |n: &str| {
        dir.as_ref()
            .and_then(|d| read_trim(d.join("queue").join(n)))
    };
    let (scheduler, _) = dir.as_deref().map(scheduler).unwrap_or((None, Vec::new()));
    let scheduler_tunables = dir.as_deref().map(scheduler_tunables).unwrap_or_default();
    TargetContext {
        path: path.display().to_string(),
        kind: kind.into(),
        fs_type: if kind == "file" { fs_type(path) } else { None },
        block_device: dir
            .as_ref()
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned()),
        scheduler,
        scheduler_tunables,
        read_ahead_kb: q("read_ahead_kb").and_then(|v| v.parse().ok()),
        nr_requests: q("nr_requests").and_then(|v| v.parse().ok()),
        max_sectors_kb: q("max_sectors_kb").and_then(|v| v.parse().ok()),
        rotational: q("rotational").map(|v| v == "1"),
        cache: if kind == "other" {
            None
        } else {
            cache_state(path)
        },
    }
}

/// The tunables of the active scheduler of `/sys/block/X`: every readable file in
/// `queue/iosched/` with its trimmed content. Empty when the scheduler has none (`none` has no
/// `iosched` directory).
pub(crate) fn scheduler_tunables(dir: &Path) -> BTreeMap<String, String> {
    let mut t = BTreeMap::new();
    if let Ok(rd) = fs::read_dir(dir.join("queue/iosched")) {
        for e in rd.flatten() {
            if let Some(v) = read_trim(e.path()) {
                t.insert(e.file_name().to_string_lossy().into_owned(), v);
            }
        }
    }
    t
}

/// Set the scheduler of `/sys/block/X` (root only).
pub(crate) fn set_scheduler(dir: &Path, name: &str) -> std::io::Result<()> {
    fs::write(dir.join("queue/scheduler"), name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_host_and_file() {
        let c = capture(Some(Path::new("/proc/self/exe")));
        assert!(!c.kernel.is_empty());
        assert!(c.cpus >= 1);
        let t = c.target.unwrap();
        assert_eq!(t.kind, "file");
    }

    #[test]
    fn tunables_come_from_the_iosched_directory() {
        let d = std::env::temp_dir().join(format!("snapblk-fake-sysfs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let iosched = d.join("queue/iosched");
        fs::create_dir_all(&iosched).unwrap();
        fs::write(d.join("queue/scheduler"), "none [mq-deadline] kyber bfq\n").unwrap();
        fs::write(iosched.join("fifo_batch"), "16\n").unwrap();
        fs::write(iosched.join("read_expire"), "500\n").unwrap();
        assert_eq!(scheduler(&d).0.as_deref(), Some("mq-deadline"));
        let t = scheduler_tunables(&d);
        assert_eq!(
            t.into_iter().collect::<Vec<_>>(),
            [
                ("fifo_batch".to_string(), "16".to_string()),
                ("read_expire".to_string(), "500".to_string())
            ]
        );
        // `none`: no iosched directory, no tunables (an empty map, not an error).
        fs::remove_dir_all(&iosched).unwrap();
        fs::write(d.join("queue/scheduler"), "[none] mq-deadline\n").unwrap();
        assert!(scheduler_tunables(&d).is_empty());
        fs::remove_dir_all(&d).unwrap();
    }
}
