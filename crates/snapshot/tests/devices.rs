//! Devices of the positional I/O family behind a snapshot: a source without a file descriptor
//! works end to end (open, read, merge) through the trait methods, and a plain file is read by a
//! direct `pread` of its descriptor, never through the device.

use snapblk_core::{MemFile, ReadAt, WriteAt};
use snapblk_snapshot::synth::{SynthCase, SynthSpec, generate, merge_reference, write_cow};
use snapblk_snapshot::{
    BlockDev, FileDev, MergeOptions, Snapshot, SnapshotConfig, merge, open_devs,
};
use std::fs::File;
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A device that counts the reads made through it and forwards everything, the descriptor
/// capability included, to `inner`.
struct Counting<D> {
    inner: D,
    reads: AtomicU64,
}

impl<D> Counting<D> {
    fn new(inner: D) -> Arc<Self> {
        Arc::new(Counting {
            inner,
            reads: AtomicU64::new(0),
        })
    }
    fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

impl<D: ReadAt> ReadAt for Counting<D> {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read_at(off, buf)
    }
    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }
    fn read_exact_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read_exact_at(off, buf)
    }
    fn as_file(&self) -> Option<&File> {
        self.inner.as_file()
    }
}

impl<D: WriteAt> WriteAt for Counting<D> {
    fn write_all_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_all_at(off, buf)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
}

/// A synthetic case and its COW written as a real Android COW file.
fn case() -> (SynthCase, Vec<u8>) {
    let case = generate(&SynthSpec::default(), 77);
    let cow = write_cow(&case, snapblk_cow::WriterOptions::default()).unwrap();
    (case, cow)
}

fn read_all(s: &Snapshot) -> Vec<u8> {
    let mut out = vec![0u8; s.capacity() as usize];
    for (i, chunk) in out.chunks_mut(12288).enumerate() {
        s.read(i as u64 * 12288, chunk).unwrap();
    }
    out
}

/// An unlinked temporary file holding `bytes`.
fn temp_file(bytes: &[u8]) -> File {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    f.write_all(bytes).unwrap();
    f
}

#[test]
fn a_base_and_cow_without_descriptors_serve_and_merge() {
    let (case, cow) = case();
    let base = Counting::new(MemFile::new(case.base.clone()));
    let cow = Counting::new(MemFile::new(cow));
    assert!(base.as_file().is_none() && cow.as_file().is_none());
    let s = open_devs(
        base.clone() as Arc<dyn BlockDev>,
        cow.clone() as Arc<dyn BlockDev>,
        SnapshotConfig::default(),
    )
    .unwrap();
    let before = base.reads();
    assert_eq!(read_all(&s), case.target, "reads of the new image");
    assert!(
        base.reads() > before,
        "without a descriptor, base reads go through the device"
    );
    merge(&s, MergeOptions::default()).unwrap();
    drop(s);
    let merged = base.inner.contents();
    assert_eq!(merged, merge_reference(&case), "the merged base");
    assert_eq!(&merged[..case.target.len()], &case.target[..]);
}

#[test]
fn a_file_base_is_read_by_pread_of_its_descriptor() {
    let (case, cow) = case();
    let base = Counting::new(FileDev::new(temp_file(&case.base)));
    assert!(base.as_file().is_some());
    // The COW in memory: a snapshot may mix devices with and without a descriptor.
    let cow = Counting::new(MemFile::new(cow));
    let s = open_devs(
        base.clone() as Arc<dyn BlockDev>,
        cow.clone() as Arc<dyn BlockDev>,
        SnapshotConfig::default(),
    )
    .unwrap();
    let (base_before, cow_before) = (base.reads(), cow.reads());
    assert_eq!(read_all(&s), case.target, "reads of the new image");
    assert_eq!(
        base.reads(),
        base_before,
        "foreground reads of a file base are a pread of its descriptor, not a device call"
    );
    assert!(cow.reads() > cow_before, "the COW has no descriptor");
}
