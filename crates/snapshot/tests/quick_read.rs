//! A read of a COPY block goes without the merge view's lock (`Snapshot::read_quick`); when the
//! merge publishes a window and overwrites that block's source while the read is in flight, the
//! read must notice and be redone under the lock.

use snapblk_core::{MemFile, ReadAt, WriteAt};
use snapblk_snapshot::{MergeOptions, MergeStep, SnapshotConfig, merge, open_devs};
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

const BS: usize = 4096;
const BLOCKS: u64 = 64;

#[derive(Default)]
struct Gate {
    /// The thread whose next one-block read of `at` is held.
    armed: Option<(ThreadId, u64)>,
    /// That read is waiting.
    inside: bool,
    /// Let it go on.
    open: bool,
}

/// The base device: memory, with one read that waits at the gate before it copies.
struct GatedBase {
    mem: MemFile,
    gate: Mutex<Gate>,
    cv: Condvar,
}

impl GatedBase {
    fn wait_for(&self, what: impl Fn(&Gate) -> bool, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut g = self.gate.lock().unwrap();
        while !what(&g) {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = self.cv.wait_timeout(g, left).unwrap().0;
        }
        true
    }
}

impl ReadAt for GatedBase {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let me = std::thread::current().id();
        let held = {
            let mut g = self.gate.lock().unwrap();
            if g.armed == Some((me, offset)) && buf.len() == BS {
                g.armed = None;
                g.inside = true;
                self.cv.notify_all();
                true
            } else {
                false
            }
        };
        if held {
            assert!(self.wait_for(|g| g.open, Duration::from_secs(60)));
        }
        self.mem.read_at(offset, buf)
    }
    fn size(&self) -> io::Result<u64> {
        self.mem.size()
    }
}

impl WriteAt for GatedBase {
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.mem.write_all_at(offset, buf)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.mem.sync_data()
    }
}

fn block(b: u64) -> Vec<u8> {
    (0..BS).map(|i| (b as usize * 7 + i / 512) as u8).collect()
}

/// Every block moves down by one (block b of the new image is block b + 1 of the base), all in
/// one window through scratch: the window's writes overwrite the sources of its earlier ops.
fn shift_cow() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shift.cow");
    let file = std::fs::File::create(&path).unwrap();
    let opts = snapblk_cow::WriterOptions {
        op_count_max: BLOCKS + 16,
        ..Default::default()
    };
    let mut w = snapblk_cow::CowWriter::new(&file, opts).unwrap();
    let seq: Vec<u32> = (0..BLOCKS as u32 - 1).collect();
    w.add_sequence_data(&seq).unwrap();
    w.add_copy(0, 1, BLOCKS - 1).unwrap();
    w.finalize().unwrap();
    std::fs::read(&path).unwrap()
}

#[test]
fn a_copy_read_overlapping_a_merge_window_is_redone_under_the_lock() {
    let old: Vec<u8> = (0..BLOCKS).flat_map(block).collect();
    let base = Arc::new(GatedBase {
        mem: MemFile::new(old.clone()),
        gate: Mutex::default(),
        cv: Condvar::new(),
    });
    let cow = Arc::new(MemFile::new(shift_cow()));
    let s = open_devs(base.clone(), cow, SnapshotConfig::default()).unwrap();
    // New block 0 is old block 1, read from the base's block 1 until the merge has written it.
    let want = block(1);
    let written = Mutex::new(false);
    let hook = |st: MergeStep| {
        if let MergeStep::Written { .. } = st {
            *written.lock().unwrap() = true;
        }
    };
    std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let mut buf = vec![0u8; BS];
            s.read(0, &mut buf).map(|()| buf)
        });
        base.gate.lock().unwrap().armed = Some((reader.thread().id(), BS as u64));
        assert!(
            base.wait_for(|g| g.inside, Duration::from_secs(60)),
            "the read reached the base"
        );
        let merger = sc.spawn(|| {
            merge(
                &s,
                MergeOptions {
                    hook: Some(&hook),
                    ..Default::default()
                },
            )
        });
        // The merge publishes the window and writes it while the read is held: base block 1
        // now holds new block 1 (old block 2).
        let deadline = Instant::now() + Duration::from_secs(60);
        while !*written.lock().unwrap() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            *written.lock().unwrap(),
            "the merge waited for a COPY read in flight"
        );
        base.gate.lock().unwrap().open = true;
        base.cv.notify_all();
        let got = reader.join().unwrap().unwrap();
        assert!(got == want, "the read returned the overwritten source");
        merger.join().unwrap().unwrap();
    });
    let mut new = vec![0u8; BS];
    for b in 0..BLOCKS - 1 {
        base.read_exact_at(b * BS as u64, &mut new).unwrap();
        assert!(new == block(b + 1), "merged block {b}");
        s.read(b * BS as u64, &mut new).unwrap();
        assert!(new == block(b + 1), "block {b} after the merge");
    }
}
