//! Block-level record and replay inside the snapshot device (driver properties `record`,
//! `record-secs` and `readahead`).
//!
//! *Record*: every read the device serves to its clients (foreground reads through its queues;
//! never the merge's or the replay's own reads) is noted while a window that opens at connect is
//! open. The hot path pays one relaxed atomic load when not recording; the [`BlockRecorder`]
//! sits behind a mutex taken only while recording. When the window ends (a timer thread wakes at
//! the deadline) or when the device is closed, whichever comes first, the ranges are written as a
//! [`BlockFile`] — atomically: a temporary file in the same directory, fsync, rename, fsync of the
//! directory — so a reader sees either no list or a complete one.
//!
//! *Replay*: at connect, a background thread reads the listed ranges in chunks of
//! [`REPLAY_CHUNK`] bytes through [`Snapshot::read_background`] with [`IoClass::Readahead`], so
//! the scheduler keeps it behind client I/O (and it never waits for its budget while holding the
//! merge view). That warms the base's page cache for COPY and unchanged
//! blocks, the COW's for raw payloads, and the decoded-unit cache for compressed ones.
//!
//! *Binding*: a recorded list carries `#@ capacity=`, `#@ block-size=` and `#@ cow-id=` metadata
//! ([`Binding`]); `cow-id` is a 64-bit FNV-1a fingerprint of the COW's operations (target block,
//! kind, source, payload location, size and codec), so merge progress and overlay writes do not
//! change it but a different COW does. A list whose binding does not match the device is
//! *refused*: nothing is replayed, the reason is in [`ReadaheadStats::refused`], and the device
//! still connects (a stale hint must not stop a device from coming up). A list without binding
//! metadata (hand-written) is accepted. Ranges past the end of the device are clipped and
//! counted. An unreadable or malformed list is a connect error ([`RecordError`]).
//!
//! Exports that read the base and COW themselves (the ublk zero-copy planner) bypass the queues,
//! so their reads are not recorded; `snapblk serve --record` turns that planner off.

use crate::io::CacheStats;
use crate::map::{Codec, OpKind, SnapshotMap};
use crate::merge_task::MergeTask;
use crate::sched::{IoClass, SchedStats};
use crate::snapshot::Snapshot;
use serde::Serialize;
use snapblk_blocklist::{BLOCK_HEADER, BlockFile, BlockRecorder, Limits, ParseError, Range};
use snapblk_core::sync::lock;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Default recording window: long enough to cover a boot up to the first screen on typical
/// devices, short enough that the list stays about start-up rather than everything ever read.
pub const DEFAULT_RECORD_SECS: u64 = 30;
/// Most distinct ranges a recording keeps (memory bound: 16 bytes each); beyond it the
/// lowest-offset ranges are kept.
pub(crate) const MAX_RECORD_RANGES: usize = 1 << 20;
/// Replay reads at most this many bytes per request.
pub(crate) const REPLAY_CHUNK: u64 = 1 << 20;
/// Bounds applied when parsing a list given to `readahead` (untrusted input).
pub(crate) const LIST_LIMITS: Limits = Limits {
    max_line: 4096,
    max_entries: 4 << 20,
};

/// A recording or replay that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The readahead list could not be read.
    #[error("readahead list {path}")]
    Read {
        /// The `readahead` list's path.
        path: PathBuf,
        /// The OS error (its errno is what the C ABI returns).
        #[source]
        source: std::io::Error,
    },
    /// The readahead list is malformed.
    #[error("readahead list {path}")]
    Parse {
        /// The `readahead` list's path.
        path: PathBuf,
        /// What is wrong with it, with its line.
        #[source]
        source: ParseError,
    },
    /// The record list cannot be created where asked.
    #[error("record list {path}: {msg}")]
    Target {
        /// The `record` path asked for.
        path: PathBuf,
        /// Why it cannot be created (not a file name, its directory is not a directory, it is a
        /// directory).
        msg: String,
    },
    /// The directory of the record list cannot be looked at.
    #[error("record list {path}: {dir}")]
    TargetDir {
        /// The `record` path asked for.
        path: PathBuf,
        /// The directory it would be created in.
        dir: PathBuf,
        /// Why that directory could not be looked at.
        #[source]
        source: std::io::Error,
    },
    /// A worker thread could not be started.
    #[error("starting the {0} thread")]
    Thread(&'static str, #[source] std::io::Error),
}

impl From<RecordError> for snapblk_core::Error {
    fn from(e: RecordError) -> Self {
        let errno = match &e {
            RecordError::Read { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            RecordError::Thread(_, source) => source.raw_os_error().unwrap_or(libc::EAGAIN),
            RecordError::Parse { .. }
            | RecordError::Target { .. }
            | RecordError::TargetDir { .. } => libc::EINVAL,
        };
        snapblk_core::Error::from_chain(errno, &e)
    }
}

/// What a recorded list is bound to: the device it was recorded on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Binding {
    /// Device size in bytes.
    pub capacity: u64,
    /// The COW's block size in bytes.
    pub block_size: u64,
    /// 16 hex digits: FNV-1a 64 of the COW's operations.
    pub cow_id: String,
}

impl Binding {
    /// The binding of a snapshot's block map.
    pub(crate) fn of(map: &SnapshotMap) -> Binding {
        let mut h = Fnv::new();
        h.u64(map.block_size());
        h.u64(map.ops().len() as u64);
        for op in map.ops() {
            h.u64(op.new_block);
            h.u64(op.file_rank as u64);
            let payload = |h: &mut Fnv, p: &crate::map::Payload| {
                h.u64(p.offset);
                h.u64(p.stored_len as u64);
                h.u64(p.unit_len as u64);
                h.u64(match p.codec {
                    Codec::None => 0,
                    Codec::Gz => 1,
                    Codec::Brotli => 2,
                    Codec::Lz4 => 3,
                    Codec::Zstd => 4,
                });
            };
            match op.kind {
                OpKind::Copy { src } => {
                    h.u64(1);
                    h.u64(src);
                }
                OpKind::Xor {
                    src_byte,
                    payload: p,
                } => {
                    h.u64(2);
                    h.u64(src_byte);
                    payload(&mut h, &p);
                }
                OpKind::Replace { payload: p, blocks } => {
                    h.u64(3);
                    h.u64(blocks as u64);
                    payload(&mut h, &p);
                }
                OpKind::Zero => h.u64(4),
            }
        }
        Binding {
            capacity: map.capacity(),
            block_size: map.block_size(),
            cow_id: format!("{:016x}", h.0),
        }
    }

    /// Metadata lines for a recorded list.
    pub(crate) fn meta(&self) -> Vec<(String, String)> {
        vec![
            ("device".into(), "snapshot".into()),
            ("capacity".into(), self.capacity.to_string()),
            ("block-size".into(), self.block_size.to_string()),
            ("cow-id".into(), self.cow_id.clone()),
        ]
    }

    /// Why `file` does not belong to this device (`None`: it does, or it names no device).
    pub(crate) fn mismatch(&self, file: &BlockFile) -> Option<String> {
        let mut why = Vec::new();
        let mut check = |key: &str, mine: String| {
            if let Some(v) = file.get(key)
                && v != mine
            {
                why.push(format!("{key} {v} (device: {mine})"));
            }
        };
        check("capacity", self.capacity.to_string());
        check("block-size", self.block_size.to_string());
        check("cow-id", self.cow_id.clone());
        (!why.is_empty()).then(|| format!("recorded on another device: {}", why.join(", ")))
    }
}

/// FNV-1a 64: stable across builds and platforms (lists outlive the binary that wrote them).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn u64(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// Recording counters.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RecordStats {
    /// The list being recorded ("" when not recording).
    pub path: String,
    /// The window in ms (0: until the device is closed).
    pub window_ms: u64,
    /// Still inside the window.
    pub recording: bool,
    /// Reads noted.
    pub reads: u64,
    /// Ranges in the written list (after merging overlapping and adjacent reads).
    pub ranges: u64,
    /// Bytes those ranges cover.
    pub bytes: u64,
    /// The list has been written.
    pub written: bool,
    /// Why writing the list failed.
    pub error: Option<String>,
}

/// Where a replay is.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ReplayState {
    /// No `readahead` list was given.
    #[default]
    Off,
    /// The replay thread is reading the listed ranges.
    Running,
    /// Every listed range was read (read errors are counted in [`ReadaheadStats::errors`], they
    /// do not stop the replay).
    Done,
    /// The device was closed before the replay finished.
    Stopped,
    /// The list belongs to another device (see [`ReadaheadStats::refused`]).
    Refused,
}

/// Replay counters.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ReadaheadStats {
    /// The `readahead` list being replayed ("" when none).
    pub path: String,
    /// Where the replay is.
    pub state: ReplayState,
    /// Why the list was refused: how its binding (capacity, block size, COW id) differs from
    /// this device's.
    pub refused: Option<String>,
    /// Ranges in the list.
    pub listed_ranges: u64,
    /// Bytes the listed ranges cover.
    pub listed_bytes: u64,
    /// Listed ranges (partly) past the end of the device.
    pub clipped_ranges: u64,
    /// Bytes dropped from those ranges.
    pub clipped_bytes: u64,
    /// Ranges finished (errors included).
    pub ranges: u64,
    /// Bytes read so far (errors included).
    pub bytes: u64,
    /// Read requests issued (a range is read in several chunks).
    pub chunks: u64,
    /// Read requests that failed.
    pub errors: u64,
    /// The first failed read's error; later ones are only counted.
    pub first_error: Option<String>,
    /// Time from connect to the end of the replay (or so far).
    pub elapsed_us: u64,
}

struct RecState {
    recorder: Option<BlockRecorder>,
    path: PathBuf,
    meta: Vec<(String, String)>,
    stats: RecordStats,
}

/// Record, replay and background-merge state of one snapshot device, shared by the driver, its
/// queues, its worker threads and in-process observers (which find it with [`Activity::of`]).
pub struct Activity {
    id: u64,
    recording: AtomicBool,
    rec: Mutex<RecState>,
    replay: Mutex<ReadaheadStats>,
    replay_cv: Condvar,
    stopped: Mutex<bool>,
    stop_cv: Condvar,
    merge: Arc<MergeTask>,
    /// The snapshot served, once connected (weak: the device owns it).
    snap: Mutex<Weak<Snapshot>>,
}

static REGISTRY: Mutex<Vec<Weak<Activity>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Activity {
    /// A new, idle activity, registered so that [`Activity::find`] sees it.
    pub fn new() -> Arc<Activity> {
        let a = Arc::new(Activity {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            recording: AtomicBool::new(false),
            rec: Mutex::new(RecState {
                recorder: None,
                path: PathBuf::new(),
                meta: Vec::new(),
                stats: RecordStats::default(),
            }),
            replay: Mutex::new(ReadaheadStats::default()),
            replay_cv: Condvar::new(),
            stopped: Mutex::new(false),
            stop_cv: Condvar::new(),
            merge: Arc::default(),
            snap: Mutex::new(Weak::new()),
        });
        let mut r = lock(&REGISTRY);
        r.retain(|w| w.strong_count() > 0);
        r.push(Arc::downgrade(&a));
        a
    }

    /// Process-unique id (the driver's `activity-id` property).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The live activity with this id.
    pub fn find(id: u64) -> Option<Arc<Activity>> {
        lock(&REGISTRY)
            .iter()
            .filter_map(Weak::upgrade)
            .find(|a| a.id == id)
    }

    /// The activity of a connected snapshot device (`None` for other drivers). The handle stays
    /// valid after the device is closed, with the final counters.
    pub fn of(dev: &snapblk_core::Blkio) -> Option<Arc<Activity>> {
        if dev.driver_name() != "snapshot" {
            return None;
        }
        Self::find(dev.get_u64("activity-id").ok()?)
    }

    /// Start recording into `path` for `window` (`None`: until [`Activity::finish_record`]).
    /// Returns the timer thread that ends the window, if any.
    pub(crate) fn start_record(
        self: &Arc<Self>,
        path: &Path,
        window: Option<Duration>,
        binding: &Binding,
    ) -> Result<Option<JoinHandle<()>>, RecordError> {
        let target = |msg: String| RecordError::Target {
            path: path.to_owned(),
            msg,
        };
        path.file_name()
            .ok_or_else(|| target("not a file name".into()))?;
        let dir = dir_of(path);
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(target(format!("{} is not a directory", dir.display()))),
            Err(source) => {
                return Err(RecordError::TargetDir {
                    path: path.to_owned(),
                    dir: dir.to_owned(),
                    source,
                });
            }
        }
        if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            return Err(target("is a directory".into()));
        }
        // The list replaces what is at `path` when the window ends: a mistyped `record=` that
        // names an image (even the base) must not be replaced by a list.
        if !replaceable_list(path) {
            return Err(target(
                "exists and is not a block list; refusing to overwrite it (remove it first or choose another name)"
                    .into(),
            ));
        }
        let mut meta = binding.meta();
        let window_ms = window.map_or(0, |w| w.as_millis().min(u64::MAX as u128) as u64);
        meta.push(("window-ms".into(), window_ms.to_string()));
        {
            let mut g = lock(&self.rec);
            g.recorder = Some(BlockRecorder::new(
                window.unwrap_or(Duration::MAX),
                MAX_RECORD_RANGES,
            ));
            g.path = path.to_owned();
            g.meta = meta;
            g.stats = RecordStats {
                path: path.display().to_string(),
                window_ms,
                recording: true,
                ..RecordStats::default()
            };
        }
        self.recording.store(true, Ordering::Release);
        let Some(window) = window else {
            return Ok(None);
        };
        let me = self.clone();
        let deadline = Instant::now() + window;
        std::thread::Builder::new()
            .name("snap-record".into())
            .spawn(move || {
                let mut stopped = lock(&me.stopped);
                while !*stopped {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    stopped = me
                        .stop_cv
                        .wait_timeout(stopped, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                drop(stopped);
                me.finish_record();
            })
            .map(Some)
            .map_err(|e| RecordError::Thread("record timer", e))
    }

    /// Note a read served to a client. Costs one relaxed load unless recording.
    #[inline]
    pub fn note_read(&self, offset: u64, len: u64) {
        if self.recording.load(Ordering::Relaxed) {
            self.note_slow(offset, len);
        }
    }

    #[cold]
    fn note_slow(&self, offset: u64, len: u64) {
        let mut g = lock(&self.rec);
        let RecState {
            recorder, stats, ..
        } = &mut *g;
        let inside = recorder.as_mut().is_some_and(|r| r.note_read(offset, len));
        if inside {
            stats.reads += 1;
        } else {
            // Window over: stop paying for the lock; the timer writes the list.
            self.recording.store(false, Ordering::Relaxed);
        }
    }

    /// End the recording now and write the list, if a recording is pending (idempotent; the
    /// timer calls it at the deadline, the driver at close). Returns the counters.
    pub fn finish_record(&self) -> RecordStats {
        let mut g = lock(&self.rec);
        self.recording.store(false, Ordering::Relaxed);
        if let Some(r) = g.recorder.take() {
            let file = BlockFile {
                meta: g.meta.clone(),
                list: r.finish(),
            };
            g.stats.recording = false;
            g.stats.ranges = file.list.ranges.ranges().len() as u64;
            g.stats.bytes = file.list.ranges.total_bytes();
            // Holding the lock: a concurrent caller (timer vs close) waits until the file exists.
            match write_atomic(&g.path, &file) {
                Ok(()) => g.stats.written = true,
                Err(e) => g.stats.error = Some(format!("writing {}: {e}", g.path.display())),
            }
        }
        g.stats.clone()
    }

    /// Recording counters.
    pub(crate) fn record_stats(&self) -> RecordStats {
        lock(&self.rec).stats.clone()
    }

    /// Load `path` and, unless it belongs to another device, replay it on a background thread.
    /// Returns that thread; a refused list returns `None` (see [`Activity::readahead_stats`]).
    pub(crate) fn start_replay(
        self: &Arc<Self>,
        snap: Arc<Snapshot>,
        path: &Path,
    ) -> Result<Option<JoinHandle<()>>, RecordError> {
        let file = load_list(path)?;
        let t0 = Instant::now();
        let cap = snap.capacity();
        let mut st = ReadaheadStats {
            path: path.display().to_string(),
            listed_ranges: file.list.ranges.ranges().len() as u64,
            listed_bytes: file.list.ranges.total_bytes(),
            ..ReadaheadStats::default()
        };
        if let Some(why) = Binding::of(snap.map()).mismatch(&file) {
            st.state = ReplayState::Refused;
            st.refused = Some(why);
            *lock(&self.replay) = st;
            self.replay_cv.notify_all();
            return Ok(None);
        }
        let mut todo = Vec::with_capacity(file.list.ranges.ranges().len());
        for r in file.list.ranges.ranges() {
            match r.clip(cap) {
                Some(c) => {
                    if c.len < r.len {
                        st.clipped_ranges += 1;
                        st.clipped_bytes += r.len - c.len;
                    }
                    todo.push(c);
                }
                None => {
                    st.clipped_ranges += 1;
                    st.clipped_bytes += r.len;
                }
            }
        }
        st.state = ReplayState::Running;
        *lock(&self.replay) = st;
        let me = self.clone();
        std::thread::Builder::new()
            .name("snap-readahead".into())
            .spawn(move || me.replay(&snap, &todo, t0))
            .map(Some)
            .map_err(|e| RecordError::Thread("readahead", e))
    }

    fn replay(&self, snap: &Snapshot, todo: &[Range], t0: Instant) {
        let mut buf = vec![0u8; REPLAY_CHUNK as usize];
        let mut state = ReplayState::Done;
        'all: for r in todo {
            for c in r.chunks(REPLAY_CHUNK) {
                if *lock(&self.stopped) {
                    state = ReplayState::Stopped;
                    break 'all;
                }
                let res =
                    snap.read_background(IoClass::Readahead, c.offset, &mut buf[..c.len as usize]);
                let mut s = lock(&self.replay);
                s.chunks += 1;
                s.bytes += c.len;
                if let Err(e) = res {
                    s.errors += 1;
                    s.first_error
                        .get_or_insert_with(|| format!("offset {}: {e}", c.offset));
                }
                s.elapsed_us = t0.elapsed().as_micros() as u64;
            }
            lock(&self.replay).ranges += 1;
        }
        let mut s = lock(&self.replay);
        s.state = state;
        s.elapsed_us = t0.elapsed().as_micros() as u64;
        drop(s);
        self.replay_cv.notify_all();
    }

    /// Replay counters.
    pub fn readahead_stats(&self) -> ReadaheadStats {
        lock(&self.replay).clone()
    }

    /// Wait until the replay is no longer running (returns at once when there is none), at most
    /// `timeout`. Returns the counters.
    pub fn wait_replay(&self, timeout: Duration) -> ReadaheadStats {
        let g = lock(&self.replay);
        let (g, _) = self
            .replay_cv
            .wait_timeout_while(g, timeout, |s| s.state == ReplayState::Running)
            .unwrap_or_else(|e| e.into_inner());
        g.clone()
    }

    /// Remember the snapshot the device serves, for [`Activity::sched_stats`] and
    /// [`Activity::cache_stats`].
    pub(crate) fn attach(&self, snap: &Arc<Snapshot>) {
        *lock(&self.snap) = Arc::downgrade(snap);
    }

    /// The scheduler's counters of the connected device (`None` once it is closed).
    pub fn sched_stats(&self) -> Option<SchedStats> {
        lock(&self.snap).upgrade().map(|s| s.sched_stats())
    }

    /// The scheduler's background budget now, in bytes, of the connected device (`None` once
    /// it is closed, or with the scheduler off).
    pub fn sched_budget(&self) -> Option<u64> {
        let b = lock(&self.snap).upgrade()?.sched_budget();
        (b != u64::MAX).then_some(b)
    }

    /// The decoded-unit cache's counters of the connected device (`None` once it is closed).
    pub fn cache_stats(&self) -> Option<CacheStats> {
        lock(&self.snap).upgrade().map(|s| s.cache_stats())
    }

    /// The device's background merge (state `off` unless the driver's `merge` property was set).
    pub fn merge(&self) -> &Arc<MergeTask> {
        &self.merge
    }

    /// Ask the worker threads to stop (the replay stops between chunks, the timer ends the
    /// window early, a merge at its next durable step). Does not write the list: see
    /// [`Activity::finish_record`].
    pub fn stop(&self) {
        *lock(&self.stopped) = true;
        self.stop_cv.notify_all();
        self.merge.stop();
    }
}

/// Whether `path` may be replaced by a block list: it does not exist, is empty, or holds one.
fn replaceable_list(path: &Path) -> bool {
    use std::io::Read;
    let Ok(f) = std::fs::File::open(path) else {
        // Missing (or unreadable: then writing beside it fails on its own).
        return true;
    };
    let mut head = Vec::with_capacity(BLOCK_HEADER.len());
    if f.take(BLOCK_HEADER.len() as u64)
        .read_to_end(&mut head)
        .is_err()
    {
        return false;
    }
    head.is_empty() || head == BLOCK_HEADER.as_bytes()
}

fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Read and parse a block list.
pub(crate) fn load_list(path: &Path) -> Result<BlockFile, RecordError> {
    let f = std::fs::File::open(path).map_err(|source| RecordError::Read {
        path: path.to_owned(),
        source,
    })?;
    BlockFile::parse(std::io::BufReader::new(f), LIST_LIMITS).map_err(|source| RecordError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// Write `file` to `path` so that readers see the old content or the complete new one.
fn write_atomic(path: &Path, file: &BlockFile) -> std::io::Result<()> {
    let dir = dir_of(path);
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let res = (|| {
        let f = std::fs::File::create(&tmp)?;
        let mut w = std::io::BufWriter::new(&f);
        file.write(&mut w)?;
        w.flush()?;
        drop(w);
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself must survive a power cut.
        std::fs::File::open(dir)?.sync_all()
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::SnapshotDriver;
    use snapblk_blocklist::{BlockList, RangeSet};
    use snapblk_core::PropValue;
    use snapblk_core::{Driver, QueueExt, State};
    use snapblk_cow::{Codec as CowCodec, Compression, CowWriter, WriterOptions};

    const BS: u64 = 4096;
    /// Device: 256 blocks. Blocks 0..16 COPY from base 100..116; 32..64 compressed REPLACE
    /// (lz4, one-block units); 64..68 ZERO; everything else unchanged base blocks.
    const BLOCKS: u64 = 256;

    struct Case {
        dir: tempfile::TempDir,
        base: PathBuf,
        cow: PathBuf,
    }

    impl Case {
        fn new(copy_src: u64) -> Case {
            let dir = tempfile::tempdir().unwrap();
            let base = dir.path().join("base.img");
            let cow = dir.path().join("snap.cow");
            let mut b = vec![0u8; (BLOCKS * BS) as usize];
            for (i, x) in b.iter_mut().enumerate() {
                *x = (i / 4096 * 7 + i % 251) as u8;
            }
            std::fs::write(&base, &b).unwrap();
            let f = std::fs::File::create(&cow).unwrap();
            let mut w = CowWriter::new(
                &f,
                WriterOptions {
                    codec: CowCodec::new(Compression::Lz4),
                    op_count_max: BLOCKS,
                    ..WriterOptions::default()
                },
            )
            .unwrap();
            w.add_copy(0, copy_src, 16).unwrap();
            // Compressible: each block one repeated byte.
            let data: Vec<u8> = (0..32 * BS).map(|i| (i / BS) as u8 ^ 0x5a).collect();
            w.add_raw_blocks(32, &data).unwrap();
            w.add_zero_blocks(64, 4).unwrap();
            w.finalize().unwrap();
            Case { dir, base, cow }
        }
        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }
        fn driver(&self, props: &[(&str, PropValue)]) -> SnapshotDriver {
            let mut d = SnapshotDriver::new();
            let s = |p: &Path| PropValue::Str(p.display().to_string());
            d.set_prop("base", s(&self.base), State::Created).unwrap();
            d.set_prop("cow", s(&self.cow), State::Created).unwrap();
            for (k, v) in props {
                d.set_prop(k, v.clone(), State::Created).unwrap();
            }
            d
        }
    }

    fn s(p: &Path) -> PropValue {
        PropValue::Str(p.display().to_string())
    }

    fn ranges(v: &[(u64, u64)]) -> RangeSet {
        RangeSet::from_ranges(v.iter().map(|&(o, l)| Range::new(o, l).unwrap()).collect())
    }

    fn write_list(path: &Path, meta: Vec<(String, String)>, v: &[(u64, u64)]) {
        let f = BlockFile {
            meta,
            list: BlockList { ranges: ranges(v) },
        };
        let mut out = Vec::new();
        f.write(&mut out).unwrap();
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn records_exactly_the_client_reads_and_writes_the_list_at_close() {
        let c = Case::new(100);
        let list = c.path("rec.blocks");
        let ra = c.path("ra.blocks");
        // A replay running at the same time must not end up in the recording.
        write_list(&ra, vec![], &[(200 * BS, 8 * BS)]);
        let mut d = c.driver(&[
            ("record", s(&list)),
            ("record-secs", PropValue::U64(0)),
            ("readahead", s(&ra)),
        ]);
        d.connect(false).unwrap();
        let act = d.activity();
        assert_eq!(
            act.wait_replay(Duration::from_secs(30)).state,
            ReplayState::Done
        );
        let mut q = d.create_queue(false).unwrap();
        let mut buf = vec![0u8; 65536];
        for &(o, l) in &[
            (0u64, 4096usize), // COPY
            (4096, 4096),      // adjacent: merged with the previous one
            (32 * BS + 100, 50),
            (120 * BS, 65536),
            (0, 512), // overlap: adds nothing
        ] {
            q.read_at(o, &mut buf[..l]).unwrap();
        }
        assert!(!list.exists(), "no list before the window ends");
        let st = act.record_stats();
        assert!(st.recording);
        assert_eq!(st.reads, 5);
        drop(q);
        drop(d);
        let st = act.record_stats();
        assert!(st.written && !st.recording, "{st:?}");
        assert_eq!((st.ranges, st.bytes), (3, 8192 + 50 + 65536));
        let f = load_list(&list).unwrap();
        assert_eq!(
            f.list.ranges,
            ranges(&[(0, 8192), (32 * BS + 100, 50), (120 * BS, 65536)])
        );
        assert_eq!(f.get("capacity"), Some(&*(BLOCKS * BS).to_string()));
        assert_eq!(f.get("window-ms"), Some("0"));
        assert!(f.get("cow-id").is_some_and(|v| v.len() == 16));
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(c.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp.")), "{names:?}");
    }

    #[test]
    fn window_end_writes_the_list_and_later_reads_are_not_recorded() {
        let c = Case::new(100);
        let list = c.path("rec.blocks");
        let mut d = c.driver(&[("record", s(&list)), ("record-secs", PropValue::U64(1))]);
        d.connect(false).unwrap();
        let mut q = d.create_queue(false).unwrap();
        let mut buf = vec![0u8; 4096];
        q.read_at(8 * BS, &mut buf).unwrap();
        // Written by the timer while the device is still open.
        let t0 = Instant::now();
        while !list.exists() {
            assert!(t0.elapsed() < Duration::from_secs(30), "list not written");
            std::thread::sleep(Duration::from_millis(20));
        }
        q.read_at(9 * BS, &mut buf).unwrap();
        let PropValue::Str(j) = d.get_prop("record-stats", State::Started).unwrap() else {
            panic!()
        };
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["written"], true);
        assert_eq!(v["reads"], 1);
        assert_eq!(v["window_ms"], 1000);
        drop(q);
        drop(d);
        let f = load_list(&list).unwrap();
        assert_eq!(f.list.ranges, ranges(&[(8 * BS, BS)]));
        assert_eq!(f.get("window-ms"), Some("1000"));
    }

    #[test]
    fn a_throttled_background_read_waits_with_the_merge_view_free() {
        // Background I/O over budget (a merge holding 4 MiB in flight) throttles readahead. It
        // must wait for its budget without the view read lock: a merge commit waits for the
        // write lock, and client reads queue behind the commit (the lock prefers writers).
        let c = Case::new(100);
        let mut d = c.driver(&[]);
        d.connect(false).unwrap();
        let snap = d.snapshot().unwrap();
        let mut expect = vec![0u8; 256 << 10];
        snap.read(0, &mut expect).unwrap();
        let merge_io = snap.io.sched.admit(IoClass::Merge, 4 << 20);
        std::thread::scope(|sc| {
            let reader = sc.spawn(|| {
                let mut buf = vec![0u8; 256 << 10];
                snap.read_background(IoClass::Readahead, 0, &mut buf)
                    .map(|()| buf)
            });
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(2));
                assert!(
                    snap.view.try_write().is_ok(),
                    "a throttled readahead holds the merge view"
                );
            }
            assert!(!reader.is_finished(), "readahead ran over the budget");
            drop(merge_io);
            assert!(reader.join().unwrap().unwrap() == expect);
        });
        let ra = snap.sched_stats().readahead;
        assert!(ra.throttled >= 1 && ra.wait_ns > 0, "{ra:?}");
    }

    #[test]
    fn replay_reads_through_the_readahead_class_and_warms_the_caches() {
        let c = Case::new(100);
        let ra = c.path("ra.blocks");
        // COPY and unchanged blocks only: the base bytes read equal the listed bytes.
        let copy_and_plain = [(0, 16 * BS), (150 * BS, 3 * BS + 7)];
        write_list(&ra, vec![], &copy_and_plain);
        let mut d = c.driver(&[("readahead", s(&ra))]);
        d.connect(false).unwrap();
        let st = d.activity().wait_replay(Duration::from_secs(30));
        let listed = 16 * BS + 3 * BS + 7;
        assert_eq!(st.state, ReplayState::Done);
        assert_eq!((st.listed_ranges, st.listed_bytes), (2, listed));
        assert_eq!((st.ranges, st.bytes, st.errors), (2, listed, 0));
        assert_eq!(st.clipped_ranges, 0);
        let snap = d.snapshot().unwrap();
        let ss = snap.sched_stats();
        assert_eq!(ss.readahead.bytes, listed);
        // The replay added no foreground I/O: same counters as a device opened without it (the
        // open itself reads the COW header in the foreground class).
        let mut d0 = c.driver(&[]);
        d0.connect(false).unwrap();
        let fg0 = d0.snapshot().unwrap().sched_stats().foreground;
        assert_eq!(
            (ss.foreground.requests, ss.foreground.bytes),
            (fg0.requests, fg0.bytes)
        );
        drop(d);

        // Compressed blocks: the decoded units land in the cache, so client reads hit it.
        let ra2 = c.path("ra2.blocks");
        write_list(&ra2, vec![], &[(32 * BS, 32 * BS)]);
        let mut d = c.driver(&[("readahead", s(&ra2))]);
        d.connect(false).unwrap();
        assert_eq!(
            d.activity().wait_replay(Duration::from_secs(30)).state,
            ReplayState::Done
        );
        let snap = d.snapshot().unwrap();
        let before = snap.cache_stats();
        let fg_before = snap.sched_stats().foreground.bytes;
        assert!(before.bytes >= 32 * BS, "{before:?}");
        assert!(snap.sched_stats().readahead.bytes > 0);
        let mut q = d.create_queue(false).unwrap();
        let mut buf = vec![0u8; (32 * BS) as usize];
        for b in 0..32 {
            q.read_at((32 + b) * BS, &mut buf[..BS as usize]).unwrap();
            assert!(buf[..BS as usize].iter().all(|&x| x == b as u8 ^ 0x5a));
        }
        let after = snap.cache_stats();
        assert_eq!(
            after.misses, before.misses,
            "every client read hit the cache"
        );
        assert!(after.hits >= before.hits + 8, "{before:?} {after:?}");
        assert_eq!(
            snap.sched_stats().foreground.bytes,
            fg_before,
            "no client read reached the COW"
        );
    }

    #[test]
    fn list_from_another_device_is_refused_but_the_device_connects() {
        let a = Case::new(100);
        let b = Case::new(101); // same shape, different COPY sources: another COW
        let list = a.path("rec.blocks");
        let mut d = a.driver(&[("record", s(&list)), ("record-secs", PropValue::U64(0))]);
        d.connect(false).unwrap();
        let mut q = d.create_queue(false).unwrap();
        q.read_at(0, &mut [0u8; 4096]).unwrap();
        drop(q);
        drop(d);
        // The same device accepts it...
        let mut d = a.driver(&[("readahead", s(&list))]);
        d.connect(false).unwrap();
        let st = d.activity().wait_replay(Duration::from_secs(30));
        assert_eq!((st.state, st.bytes), (ReplayState::Done, 4096));
        drop(d);
        // ...another COW refuses it.
        let mut d = b.driver(&[("readahead", s(&list))]);
        d.connect(false).unwrap();
        let st = d.activity().wait_replay(Duration::from_secs(30));
        assert_eq!(st.state, ReplayState::Refused);
        let why = st.refused.unwrap();
        assert!(why.contains("cow-id"), "{why}");
        assert!(!why.contains("capacity"), "{why}");
        assert_eq!(st.bytes, 0);
        assert_eq!(d.snapshot().unwrap().sched_stats().readahead.bytes, 0);
        // A capacity mismatch is named too.
        let l2 = a.path("cap.blocks");
        write_list(&l2, vec![("capacity".into(), "12345".into())], &[(0, 1)]);
        let mut d = a.driver(&[("readahead", s(&l2))]);
        d.connect(false).unwrap();
        let st = d.activity().wait_replay(Duration::from_secs(30));
        assert_eq!(st.state, ReplayState::Refused);
        assert!(st.refused.unwrap().contains("capacity 12345"));
    }

    #[test]
    fn ranges_past_the_end_are_clipped_and_counted() {
        let c = Case::new(100);
        let ra = c.path("ra.blocks");
        let cap = BLOCKS * BS;
        write_list(
            &ra,
            vec![],
            &[(cap - 4096, 8192), (cap + 8192, 100), (1 << 40, 5)],
        );
        let mut d = c.driver(&[("readahead", s(&ra))]);
        d.connect(false).unwrap();
        let st = d.activity().wait_replay(Duration::from_secs(30));
        assert_eq!(st.state, ReplayState::Done);
        assert_eq!((st.clipped_ranges, st.clipped_bytes), (3, 4096 + 100 + 5));
        assert_eq!((st.ranges, st.bytes, st.errors), (1, 4096, 0));
    }

    #[test]
    fn malformed_or_missing_lists_and_bad_record_targets_fail_connect() {
        let c = Case::new(100);
        let bad = c.path("bad.blocks");
        std::fs::write(&bad, "# snapblk-block-list v1\n0:4096\n12:abc\n").unwrap();
        let e = c
            .driver(&[("readahead", s(&bad))])
            .connect(false)
            .unwrap_err();
        assert_eq!(e.errno, libc::EINVAL);
        assert!(
            e.msg.contains("bad.blocks") && e.msg.contains("line 3"),
            "{}",
            e.msg
        );
        let e = c
            .driver(&[("readahead", s(&c.path("missing")))])
            .connect(false)
            .unwrap_err();
        assert_eq!(e.errno, libc::ENOENT, "{}", e.msg);
        let e = c
            .driver(&[("record", s(&c.path("no/such/dir/x.blocks")))])
            .connect(false)
            .unwrap_err();
        assert_eq!(e.errno, libc::EINVAL);
        assert!(e.msg.contains("record list"), "{}", e.msg);
        // A file that is not a block list (an image, the base itself) is never replaced.
        let image = c.path("image.img");
        std::fs::write(&image, [0x5a; 8192]).unwrap();
        let e = c
            .driver(&[("record", s(&image))])
            .connect(false)
            .unwrap_err();
        assert!(e.msg.contains("not a block list"), "{}", e.msg);
        assert_eq!(std::fs::read(&image).unwrap(), [0x5a; 8192]);
        // Typed error underneath.
        assert!(matches!(
            load_list(&bad),
            Err(RecordError::Parse { source, .. }) if source.line == 3
        ));
    }

    #[test]
    fn record_errors_keep_their_cause_as_source_only() {
        let io = || std::io::Error::from_raw_os_error(libc::ENOENT);
        let parse = ParseError {
            line: 3,
            kind: snapblk_blocklist::ParseErrorKind::EmptyPath,
        };
        let cases = [
            RecordError::Read {
                path: "a.blocks".into(),
                source: io(),
            },
            RecordError::Parse {
                path: "a.blocks".into(),
                source: parse,
            },
            RecordError::TargetDir {
                path: "d/x.blocks".into(),
                dir: "d".into(),
                source: io(),
            },
            RecordError::Thread("readahead", io()),
        ];
        for e in cases {
            let line = snapblk_testsupport::errors::assert_cause_is_source(&e, None);
            // The C ABI's one message is the whole chain.
            assert_eq!(snapblk_core::Error::from(e).msg, line);
        }
    }

    #[test]
    fn activity_is_found_through_blkio_and_outlives_the_device() {
        let c = Case::new(100);
        let list = c.path("rec.blocks");
        let mut b = snapblk_core::Blkio::new(Box::new(SnapshotDriver::new()));
        b.set_str("base", &c.base.display().to_string()).unwrap();
        b.set_str("cow", &c.cow.display().to_string()).unwrap();
        b.set_str("record", &list.display().to_string()).unwrap();
        assert_eq!(b.get_u64("record-secs").unwrap(), DEFAULT_RECORD_SECS);
        assert!(b.get_u64("activity-id").is_err(), "needs connect");
        b.connect().unwrap();
        b.start().unwrap();
        let act = Activity::of(&b).unwrap();
        assert!(act.record_stats().recording);
        b.queue(0, false)
            .unwrap()
            .read_at(4096, &mut [0u8; 4096])
            .unwrap();
        drop(b);
        let st = act.record_stats();
        assert!(st.written, "{st:?}");
        assert_eq!(st.bytes, 4096);
        assert!(list.exists());
    }
}
