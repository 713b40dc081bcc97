//! The replay's own share of the system's I/O stall.
//!
//! PSI's "some" figure counts the time during which *any* task is stalled on I/O, the replay's
//! own submitters included. A warm-up from a truly cold cache (dentries and inodes dropped)
//! stalls on synchronous metadata reads almost all the time, so a back-off on the raw figure
//! throttles the replay on its own stalls (measured: 8.3–8.8 s instead of 5.9–6.9 s for
//! /usr/lib). What the back-off should react to is everyone else's stall.
//!
//! Each submitter thread enrolls itself; the sampler reads, per interval, how long each was
//! neither running, nor waiting for a CPU, nor idle on purpose (sleeps and work-queue waits it
//! reports through [`idle`] / [`nap`]): that is the time it was blocked in the kernel, mostly
//! on I/O. Measured on a cold /usr/lib warm-up, the threads block together (each one's share
//! is close to the system's figure, often above it: lock waits count too), so the replay's own
//! share is taken as the largest single one.
//!
//! Subtracting that share cannot see a foreground that stalls *while* the replay does: with
//! the replay's threads 95 % blocked, a system figure of 99 % may be the replay alone or the
//! replay plus someone else. The second signal tells them apart: reads on the devices holding
//! the replayed files that this process did not cause ([`ForeignReads`]: the devices' read
//! sectors minus this process's `read_bytes`, which counts data and metadata reads alike).
//! When someone else reads from those devices, the whole system figure is taken as theirs.
//! See [`others`].

use crate::sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static NEXT_RUN: AtomicU64 = AtomicU64::new(1);

struct Slot {
    tid: i32,
    run: u64,
    /// Nanoseconds this thread spent idle on purpose (sleeping, waiting for work), not
    /// counting the current idle spell.
    idle_ns: AtomicU64,
    /// When the current idle spell began ([`mono_ns`]), 0 if the thread is not idle: the
    /// sampler counts a long sleep while it lasts, not only once it is over.
    idle_since: AtomicU64,
}

/// Nanoseconds since the first call in this process, plus one (0 means "not idle").
fn mono_ns() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Slot>>> = const { RefCell::new(None) };
}

/// The set of threads whose stall counts as the replay's own.
pub(crate) struct OwnStall {
    run: u64,
    slots: Mutex<Vec<Arc<Slot>>>,
    /// A thread that never counts (the one driving the replay: it waits for the submitters).
    ignored: AtomicI32,
}

impl Default for OwnStall {
    fn default() -> Self {
        OwnStall {
            run: NEXT_RUN.fetch_add(1, Relaxed),
            slots: Mutex::new(Vec::new()),
            ignored: AtomicI32::new(0),
        }
    }
}

impl OwnStall {
    /// The calling thread will never count as one of the replay's own, even if it enrolls
    /// (it does some submitter work, then mostly waits for the submitters).
    pub(crate) fn ignore_current(&self) {
        self.ignored.store(sys::gettid(), Relaxed);
    }

    /// Counts the calling thread as one of the replay's own (idempotent per thread and run).
    pub(crate) fn enroll(&self) {
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            if c.as_ref().is_some_and(|s| s.run == self.run)
                || self.ignored.load(Relaxed) == sys::gettid()
            {
                return;
            }
            let slot = Arc::new(Slot {
                tid: sys::gettid(),
                run: self.run,
                idle_ns: AtomicU64::new(0),
                idle_since: AtomicU64::new(0),
            });
            if let Ok(mut v) = self.slots.lock() {
                v.push(slot.clone());
            }
            *c = Some(slot);
        });
    }

    /// Threads enrolled so far (exited ones included until a sample notices).
    #[cfg(test)]
    pub(crate) fn threads(&self) -> usize {
        self.slots.lock().map(|v| v.len()).unwrap_or(0)
    }
}

/// Marks the calling thread idle on purpose until the guard is dropped (a no-op on threads
/// that are not enrolled). Wrap waits for work or timers, never I/O.
pub(crate) fn idle() -> IdleGuard {
    IdleGuard(CURRENT.with(|c| {
        let slot = c.borrow().clone()?;
        slot.idle_since.store(mono_ns(), Relaxed);
        Some(slot)
    }))
}

/// See [`idle`].
pub(crate) struct IdleGuard(Option<Arc<Slot>>);

impl Drop for IdleGuard {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            let since = s.idle_since.swap(0, Relaxed);
            if since != 0 {
                s.idle_ns
                    .fetch_add(mono_ns().saturating_sub(since), Relaxed);
            }
        }
    }
}

/// Sleeps for `d`, counted as idle time of the calling thread.
pub(crate) fn nap(d: Duration) {
    let _idle = idle();
    std::thread::sleep(d);
}

/// Turns per-thread counters into the fraction of wall time the enrolled threads were stalled.
#[derive(Default)]
pub(crate) struct Sampler {
    last: HashMap<i32, (u64, u64, Instant)>,
}

/// Nanoseconds a thread has run and waited for a CPU (`None` once it has exited).
fn busy_ns(tid: i32) -> Option<u64> {
    let run = sys::thread_cpu_ns(tid)?;
    let sched = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let wait: u64 = sched.split_whitespace().nth(1)?.parse().ok()?;
    Some(run.saturating_add(wait))
}

impl Sampler {
    /// Estimated fraction (0..=1) of the time since the previous call during which at least
    /// one enrolled thread was stalled. Threads seen for the first time only set a baseline.
    /// `None` if no enrolled thread could be measured (e.g. schedstat unavailable).
    pub(crate) fn sample(&mut self, own: &OwnStall) -> Option<Vec<f64>> {
        let slots: Vec<Arc<Slot>> = own.slots.lock().ok()?.clone();
        let now = Instant::now();
        let mut shares = Vec::new();
        let mut measured = false;
        let mut gone = Vec::new();
        for s in &slots {
            let Some(busy) = busy_ns(s.tid) else {
                gone.push(s.tid);
                continue;
            };
            let since = s.idle_since.load(Relaxed);
            let ongoing = if since == 0 {
                0
            } else {
                mono_ns().saturating_sub(since)
            };
            let idle = s.idle_ns.load(Relaxed) + ongoing;
            if let Some((b0, i0, t0)) = self.last.insert(s.tid, (busy, idle, now)) {
                measured = true;
                let wall = now.duration_since(t0).as_nanos() as f64;
                if wall > 0.0 {
                    let off = busy.saturating_sub(b0) as f64 + idle.saturating_sub(i0) as f64;
                    shares.push(stall_share(wall, off));
                }
            }
        }
        if !gone.is_empty() {
            for t in &gone {
                self.last.remove(t);
            }
            if let Ok(mut v) = own.slots.lock() {
                v.retain(|s| !gone.contains(&s.tid));
            }
        }
        measured.then_some(shares)
    }
}

/// Share of `wall` a thread was stalled, given the time it was running, waiting for a CPU or
/// idle on purpose (`off`); clamped to 0..=1 (the counters are read at slightly different
/// instants).
fn stall_share(wall: f64, off: f64) -> f64 {
    ((wall - off) / wall).clamp(0.0, 1.0)
}

/// Reads by others below this many bytes per sample are noise (skew between the counters).
pub(crate) const FOREIGN_MIN: u64 = 1 << 20;

/// The pressure the replay should react to, from the system-wide stall fraction `psi`, the
/// replay threads' own stall shares (`own`, see [`Sampler`]) and the bytes others read from the
/// replay's devices in the same interval (`foreign`, see [`ForeignReads`]):
/// * others read at least [`FOREIGN_MIN`]: all of `psi` — their stall cannot be told apart
///   from the replay's, and backing off is what they need;
/// * otherwise `psi` minus the largest own share, never below zero: the stall is the replay's
///   own (a cold warm-up blocks on its metadata reads nearly all the time) or on other devices.
pub(crate) fn others(psi: f64, own: Option<&[f64]>, foreign: Option<u64>) -> f64 {
    if foreign.is_some_and(|b| b >= FOREIGN_MIN) {
        return psi;
    }
    let own = own.map_or(0.0, |v| v.iter().copied().fold(0.0, f64::max));
    (psi - own).max(0.0)
}

/// Bytes read from given devices by anyone but this process, between calls.
///
/// This process's reads are counted when submitted, the devices' when completed, and a 2 MiB
/// readahead may wait behind hundreds of others: per interval the two counters differ by
/// tens of MB either way (measured). So the balance `device reads - own reads` since a
/// baseline taken *before the replay issues anything* is tracked instead: without other
/// readers it stays at or below zero (minus the replay's bytes in flight); reads by others
/// raise it, and only a rise above its previous peak counts, so the replay's own backlog
/// completing is never mistaken for them. (A baseline taken mid-run would count reads already
/// in flight then as others': measured, one false pause per run.)
pub(crate) struct ForeignReads {
    diskstats: PathBuf,
    self_io: PathBuf,
    base: Option<Baseline>,
    /// The balance's peak since the baseline.
    peak: i128,
}

/// Every device's read bytes and this process's, when sampling began.
struct Baseline {
    devices: Vec<((u32, u32), u64)>,
    own_bytes: u64,
}

/// Read bytes (sectors × 512) of every device in a /proc/diskstats file.
fn device_read_bytes(path: &Path) -> Option<Vec<((u32, u32), u64)>> {
    let s = std::fs::read_to_string(path).ok()?;
    Some(
        crate::sysstat::parse_diskstats(&s)
            .iter()
            .map(|d| {
                (
                    (d.major, d.minor),
                    d.counters.totals.sectors_read.saturating_mul(512),
                )
            })
            .collect(),
    )
}

/// `read_bytes` of a /proc/PID/io file: bytes this process caused to be read from storage.
fn self_read_bytes(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))?
        .trim()
        .parse()
        .ok()
}

impl ForeignReads {
    /// Takes the baseline now, from /proc/diskstats and /proc/self/io or the given stand-ins
    /// (tests): call it before issuing anything.
    pub(crate) fn new(diskstats: &Path, self_io: &Path) -> Self {
        let mut f = ForeignReads {
            diskstats: diskstats.to_path_buf(),
            self_io: self_io.to_path_buf(),
            base: None,
            peak: 0,
        };
        f.base = f.read_base();
        f
    }

    fn read_base(&self) -> Option<Baseline> {
        Some(Baseline {
            devices: device_read_bytes(&self.diskstats)?,
            own_bytes: self_read_bytes(&self.self_io)?,
        })
    }

    /// Bytes others read from `devs` since the previous call (a device that joins `devs`
    /// brings its reads since the baseline); `None` if a file cannot be read (then the
    /// baseline is retried on the next call).
    pub(crate) fn sample(&mut self, devs: &[(u32, u32)]) -> Option<u64> {
        let Some(base) = &self.base else {
            self.base = self.read_base();
            return None;
        };
        let now = device_read_bytes(&self.diskstats)?;
        let mine = self_read_bytes(&self.self_io)?;
        let dev: i128 = now
            .iter()
            .filter(|(d, _)| devs.contains(d))
            .map(|(d, b)| {
                let b0 = base
                    .devices
                    .iter()
                    .find(|(d0, _)| d0 == d)
                    .map_or(0, |x| x.1);
                *b as i128 - b0 as i128
            })
            .sum();
        let balance = dev - (mine as i128 - base.own_bytes as i128);
        let rise = (balance - self.peak).max(0);
        self.peak = self.peak.max(balance);
        Some(rise as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn arithmetic() {
        assert_eq!(stall_share(100.0, 25.0), 0.75);
        assert_eq!(stall_share(100.0, 130.0), 0.0);
        // The replay's own stall (the largest thread share) is discounted...
        assert_eq!(others(0.9, Some(&[0.5, 0.85]), Some(0)), 0.9 - 0.85);
        assert_eq!(others(0.3, Some(&[0.8]), None), 0.0);
        assert_eq!(others(0.7, None, None), 0.7);
        // ... unless others read from the same devices meanwhile.
        assert_eq!(others(0.97, Some(&[0.9]), Some(FOREIGN_MIN)), 0.97);
        assert_eq!(
            others(0.97, Some(&[0.9]), Some(FOREIGN_MIN - 1)),
            0.97 - 0.9
        );
    }

    /// Runs `work` on an enrolled thread for ~300 ms and returns the sampled own-stall share.
    fn measure(work: impl Fn(&AtomicBool) + Send + Sync) -> f64 {
        let own = OwnStall::default();
        let stop = AtomicBool::new(false);
        let enrolled = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                own.enroll();
                enrolled.store(true, Relaxed);
                work(&stop);
            });
            while !enrolled.load(Relaxed) {
                std::thread::yield_now();
            }
            let mut sampler = Sampler::default();
            assert_eq!(sampler.sample(&own), None, "first sample is a baseline");
            std::thread::sleep(Duration::from_millis(300));
            let share = sampler
                .sample(&own)
                .expect("an enrolled live thread is measured")
                .into_iter()
                .fold(0.0, f64::max);
            stop.store(true, Relaxed);
            share
        })
    }

    #[test]
    fn a_thread_blocked_in_the_kernel_counts_as_stalled() {
        let (r, w) = std::io::pipe().unwrap();
        let share = std::thread::scope(|s| {
            let h = s.spawn(|| measure(|_| drop((&r).read(&mut [0u8; 1]))));
            std::thread::sleep(Duration::from_millis(600));
            drop(w);
            h.join().unwrap()
        });
        assert!(share > 0.8, "blocked in read(2): {share}");
    }

    #[test]
    fn running_and_napping_threads_do_not() {
        let spin = measure(|stop| {
            while !stop.load(Relaxed) {
                std::hint::spin_loop();
            }
        });
        assert!(spin < 0.2, "spinning: {spin}");
        let napping = measure(|stop| {
            while !stop.load(Relaxed) {
                nap(Duration::from_millis(5));
            }
        });
        assert!(napping < 0.2, "napping: {napping}");
        // One long sleep counts while it lasts (the sample falls in the middle of it).
        let long_nap = measure(|_| nap(Duration::from_millis(500)));
        assert!(long_nap < 0.2, "one long nap: {long_nap}");
    }

    #[test]
    fn foreign_reads_are_device_reads_minus_this_process_reads() {
        let dir = std::env::temp_dir().join(format!("snapblk-foreign-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ds, io) = (dir.join("diskstats"), dir.join("io"));
        let write = |sda: u64, sdb: u64, mine: u64| {
            std::fs::write(
                &ds,
                format!(
                    "   8 0 sda 10 0 {sda} 5 0 0 0 0 0 0 0\n   8 16 sdb 10 0 {sdb} 5 0 0 0 0 0 0 0\n"
                ),
            )
            .unwrap();
            std::fs::write(
                &io,
                format!("rchar: 1\nread_bytes: {mine}\nwrite_bytes: 0\n"),
            )
            .unwrap();
        };
        const MIB: u64 = 2048; // sectors
        let sda = [(8, 0)];
        write(1000, 500, 0);
        // The baseline is taken here, before the replay issues anything.
        let mut f = ForeignReads::new(&ds, &io);
        // sda read 4 MiB, 3 MiB of it ours; sdb's reads do not count.
        write(1000 + 4 * MIB, 500 + MIB, 3 << 20);
        assert_eq!(f.sample(&sda), Some(1 << 20));
        // Only our own reads: nothing foreign.
        write(1000 + 8 * MIB, 500 + MIB, 7 << 20);
        assert_eq!(f.sample(&sda), Some(0));
        // We submit 10 MiB that the device has not completed yet, then it completes them:
        // our backlog, not someone else's reads.
        write(1000 + 8 * MIB, 500 + MIB, 17 << 20);
        assert_eq!(f.sample(&sda), Some(0));
        write(1000 + 18 * MIB, 500 + MIB, 17 << 20);
        assert_eq!(f.sample(&sda), Some(0));
        // Someone else reads 5 MiB.
        write(1000 + 23 * MIB, 500 + MIB, 17 << 20);
        assert_eq!(f.sample(&sda), Some(5 << 20));
        // A device joins the set: its reads since the baseline are others'.
        assert_eq!(f.sample(&[(8, 0), (8, 16)]), Some(1 << 20));
        assert_eq!(f.sample(&[(8, 0), (8, 16)]), Some(0));
        // Unreadable files: no answer.
        std::fs::remove_file(&io).unwrap();
        assert_eq!(f.sample(&sda), None);
        // Unreadable at the start: the first call that can read them takes the baseline.
        let mut late = ForeignReads::new(&ds, &io);
        assert_eq!(late.sample(&sda), None);
        write(1000 + 23 * MIB, 500 + MIB, 17 << 20);
        assert_eq!(late.sample(&sda), None, "baseline");
        write(1000 + 24 * MIB, 500 + MIB, 17 << 20);
        assert_eq!(late.sample(&sda), Some(1 << 20));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn exited_threads_are_dropped_and_unenrolled_threads_ignored() {
        let own = OwnStall::default();
        std::thread::scope(|s| {
            s.spawn(|| own.enroll());
        });
        own.enroll();
        own.enroll();
        assert_eq!(own.threads(), 2, "enrolling twice counts once");
        let other = OwnStall::default();
        other.ignore_current();
        other.enroll();
        assert_eq!(other.threads(), 0, "the ignored thread never enrolls");
        let mut sampler = Sampler::default();
        assert_eq!(sampler.sample(&own), None);
        // The kernel may still hold the joined thread for a moment.
        let t = Instant::now();
        while own.threads() > 1 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
            sampler.sample(&own);
        }
        assert_eq!(own.threads(), 1, "the exited thread is forgotten");
        // A thread that never enrolled: idle() and nap() are no-ops there.
        std::thread::spawn(|| {
            drop(idle());
            nap(Duration::from_millis(1));
        })
        .join()
        .unwrap();
    }
}
