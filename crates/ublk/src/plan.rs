//! The zero-copy hook: a device that knows where its bytes live (a plain file, the base image of a
//! snapshot) describes a read as a list of segments, and the server turns each file segment into
//! one io_uring read straight into the ublk request's pages. Segments it cannot describe that way
//! go through the generic path (the device's own queue, then one copy into the request).

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

/// One piece of a planned read, in request order; the lengths add up to the request length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// Bytes `[offset, offset+len)` of the planner's file number `file` (index into
    /// [`ReadPlanner::files`]).
    File {
        /// Index into [`ReadPlanner::files`].
        file: u16,
        /// Byte offset in that file.
        offset: u64,
        /// Length in bytes.
        len: u32,
    },
    /// Zeros.
    Zero {
        /// Length in bytes.
        len: u32,
    },
    /// Read these bytes through the device queue (data that must be decoded in userspace, e.g.
    /// compressed REPLACE or XOR blocks of a snapshot). `offset` is the device offset.
    Device {
        /// Byte offset on the device.
        offset: u64,
        /// Length in bytes.
        len: u32,
    },
}

impl Segment {
    /// Length of the segment in bytes.
    pub fn len(&self) -> u32 {
        match *self {
            Segment::File { len, .. } | Segment::Zero { len } | Segment::Device { len, .. } => len,
        }
    }
    /// Whether the segment covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Optional per-device read planner (the zero-copy optimization hook). Implementations must be
/// cheap: `plan` runs on the I/O path of every read in zero-copy mode.
pub trait ReadPlanner: Send + Sync {
    /// Files the segments refer to. Registered once in every queue's io_uring.
    fn files(&self) -> Vec<RawFd>;
    /// Describe device bytes `[offset, offset+len)`. `out` is empty on entry. Returning an error
    /// fails the request with that errno.
    fn plan(&self, offset: u64, len: u32, out: &mut Vec<Segment>) -> snapblk_core::Result<()>;
    /// Whether a read of file `file` past its end yields zeros (`true`) or fails the request
    /// with EIO (`false`, the default). It must say what the device's own read does there, so
    /// that a planned read never returns other bytes than the generic path: the file drivers
    /// zero-fill past the end of a regular file and fail on a block device; a snapshot's reads
    /// of its base and COW must be whole.
    fn zeros_past_eof(&self, file: u16) -> bool {
        let _ = file;
        false
    }
}

/// Planner for a device that is a plain file (or block device) read one-to-one: every read is a
/// single file segment. Reads past the end of a regular file come back as zeros, past the end
/// of a block device as EIO (as the `io_uring` and `sync` drivers read them).
pub struct FilePlanner {
    file: File,
    regular: bool,
}

impl FilePlanner {
    /// Open `path` read-only for planned reads (writes still go through the device queue).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        let regular = file.metadata()?.is_file();
        Ok(FilePlanner { file, regular })
    }
}

impl ReadPlanner for FilePlanner {
    fn files(&self) -> Vec<RawFd> {
        vec![self.file.as_raw_fd()]
    }
    fn zeros_past_eof(&self, _file: u16) -> bool {
        self.regular
    }
    fn plan(&self, offset: u64, len: u32, out: &mut Vec<Segment>) -> snapblk_core::Result<()> {
        out.push(Segment::File {
            file: 0,
            offset,
            len,
        });
        Ok(())
    }
}

/// Check that a plan covers exactly `len` bytes and only names known files; a planner bug must
/// fail one request with EIO, not corrupt memory or hang.
pub fn validate(plan: &[Segment], len: u32, nfiles: usize) -> bool {
    let mut total: u64 = 0;
    for s in plan {
        if let Segment::File { file, .. } = s
            && usize::from(*file) >= nfiles
        {
            return false;
        }
        total += u64::from(s.len());
    }
    total == u64::from(len)
}

/// Planner for a read-only snapshot (base + COW): unchanged blocks and COPY sources are read from
/// the base's file, uncompressed COW data from the COW's file, zeros are zero-filled, all by the
/// kernel into the request's pages; compressed REPLACE and XOR blocks are decoded through the
/// device queue. The files are those behind the planner's own snapshot's devices
/// ([`ReadAt::as_file`](snapblk_core::ReadAt::as_file)); a device without one (an in-memory
/// or network source) has its ranges read through the device queue too. The planner's snapshot
/// is its own read-only view of the same base and COW, which is exact as long as the served
/// snapshot is not written or merged while served (writable snapshots get no planner).
pub struct SnapshotPlanner {
    snap: snapblk_snapshot::Snapshot,
    /// The base's and the COW's descriptors, where their devices have one.
    files: Vec<RawFd>,
    /// Index into `files` of the base's descriptor, if it has one.
    base: Option<u16>,
    /// Index into `files` of the COW's descriptor, if it has one.
    cow: Option<u16>,
}

impl SnapshotPlanner {
    /// A planner for a snapshot that checks blocks against the COW record beside the COW.
    pub fn open(base: &Path, cow: &Path) -> snapblk_core::Result<Self> {
        Self::open_with(base, cow, true, None)
    }

    /// A planner for a snapshot opened with the driver's `verify` and `cow-record` settings:
    /// ranges with a block not yet checked against the record are left to the device (which
    /// checks them), so zero copy serves only verified bytes.
    pub fn open_with(
        base: &Path,
        cow: &Path,
        verify: bool,
        record: Option<&Path>,
    ) -> snapblk_core::Result<Self> {
        use snapblk_snapshot::{OpenMode, open_files};
        let err = snapblk_core::Error::from;
        let verifier = if verify {
            snapblk_snapshot::load_verifier(base, cow, record, false).map_err(err)?
        } else {
            None
        };
        let snap = open_files(
            base,
            cow,
            snapblk_snapshot::SnapshotConfig::default(),
            OpenMode::default(),
        )
        .map_err(err)?;
        if let Some(v) = verifier {
            snap.attach_verifier(v).map_err(err)?;
        }
        Ok(Self::new(snap))
    }

    /// A planner over an open read-only snapshot, reading the files behind its devices where
    /// they have one.
    pub fn new(snap: snapblk_snapshot::Snapshot) -> Self {
        use snapblk_snapshot::Dev;
        let mut files = Vec::new();
        let mut fd_of = |d: Dev| {
            let f = snap.device(d).as_file()?;
            files.push(f.as_raw_fd());
            Some((files.len() - 1) as u16)
        };
        let (base, cow) = (fd_of(Dev::Base), fd_of(Dev::Cow));
        SnapshotPlanner {
            snap,
            files,
            base,
            cow,
        }
    }
}

impl ReadPlanner for SnapshotPlanner {
    fn files(&self) -> Vec<RawFd> {
        self.files.clone()
    }
    fn plan(&self, offset: u64, len: u32, out: &mut Vec<Segment>) -> snapblk_core::Result<()> {
        use snapblk_snapshot::Segment as S;
        if self.snap.needs_verification(offset, u64::from(len)) {
            out.push(Segment::Device { offset, len });
            return Ok(());
        }
        let r = self.snap.with_plan(offset, u64::from(len), |segs, _view| {
            let mut pos = offset;
            for s in segs {
                // Segment lengths are bounded by the request length (u32).
                let l = s.len() as u32;
                let file = |file: Option<u16>, at: u64| match file {
                    Some(file) => Segment::File {
                        file,
                        offset: at,
                        len: l,
                    },
                    None => Segment::Device {
                        offset: pos,
                        len: l,
                    },
                };
                out.push(match *s {
                    S::Base { base_offset, .. } => file(self.base, base_offset),
                    S::Cow { cow_offset, .. } => file(self.cow, cow_offset),
                    S::Zero { .. } => Segment::Zero { len: l },
                    _ => Segment::Device {
                        offset: pos,
                        len: l,
                    },
                });
                pos += s.len();
            }
        });
        r.map_err(snapblk_core::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_checks_length_and_files() {
        let p = [
            Segment::File {
                file: 0,
                offset: 0,
                len: 4096,
            },
            Segment::Zero { len: 4096 },
        ];
        assert!(validate(&p, 8192, 1));
        assert!(!validate(&p, 4096, 1));
        assert!(!validate(&p, 8192, 0));
        assert!(validate(&[], 0, 0));
    }

    #[test]
    fn file_planner_is_one_segment() {
        let f = std::env::temp_dir().join(format!("snapblk-ublk-plan-{}", std::process::id()));
        std::fs::write(&f, [1u8; 8192]).unwrap();
        let p = FilePlanner::open(&f).unwrap();
        let mut out = Vec::new();
        p.plan(4096, 4096, &mut out).unwrap();
        assert_eq!(
            out,
            vec![Segment::File {
                file: 0,
                offset: 4096,
                len: 4096
            }]
        );
        assert_eq!(p.files().len(), 1);
        // As the file drivers read them: zeros past the end of a regular file, EIO otherwise.
        assert!(p.zeros_past_eof(0));
        assert!(
            !FilePlanner::open(Path::new("/dev/null"))
                .unwrap()
                .zeros_past_eof(0)
        );
        std::fs::remove_file(&f).unwrap();
    }
}
