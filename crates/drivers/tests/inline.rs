//! The io_uring driver's inline QD1 path (`inline-qd1`, taken on targets without NOWAIT such
//! as tmpfs) must be indistinguishable from the ring: the same randomized request mix runs on
//! two copies of one file on /dev/shm, one device with the inline path (default) and one
//! without (`inline-qd1=false`), and every completion (user_data, ret, message), every read
//! buffer and the final file contents must be identical.

use proptest::prelude::*;
use snapblk_core::{Blkio, Completion, MemRegion, Op, Queue, ReqFlags, Request};
use snapblk_drivers::UringDriver;
use std::path::{Path, PathBuf};
use std::time::Duration;

const FILE: usize = 256 * 1024;
/// Offsets reach this far: past the end of the file, so reads zero-fill and writes extend it.
const SPAN: u64 = FILE as u64 + 64 * 1024;
const REGION: usize = 1 << 20;

struct TmpFile(PathBuf);
impl Drop for TmpFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn make_file(tag: &str, data: &[u8]) -> TmpFile {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let p = Path::new("/dev/shm").join(format!("snapblk-inline-{tag}-{}-{n}", std::process::id()));
    std::fs::write(&p, data).unwrap();
    TmpFile(p)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

struct Dev {
    b: Blkio,
    mem: MemRegion,
}

impl Dev {
    fn open(path: &Path, direct: bool, inline: bool, read_only: bool) -> Dev {
        let mut b = Blkio::new(Box::new(UringDriver::new()));
        b.set_str("path", path.to_str().unwrap()).unwrap();
        b.set_bool("direct", direct).unwrap();
        b.set_bool("read-only", read_only).unwrap();
        b.set_bool("inline-qd1", inline).unwrap();
        b.connect().unwrap();
        assert!(!b.get_bool("nowait").unwrap(), "tmpfs must lack NOWAIT");
        b.start().unwrap();
        let mem = b.alloc_mem_region(REGION).unwrap();
        b.map_mem_region(&mem).unwrap();
        Dev { b, mem }
    }
    fn q(&mut self) -> &mut dyn Queue {
        &mut **self.b.queue(0, false).unwrap()
    }
    fn mem(&mut self) -> &mut [u8] {
        // SAFETY: the region is live until drop; requests using it are reaped before access.
        unsafe { self.mem.as_mut_slice() }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let m = self.mem;
        self.b.unmap_mem_region(&m);
        let _ = self.b.free_mem_region(&m);
    }
}

#[derive(Debug, Clone)]
enum Step {
    Read {
        off: u64,
        len: usize,
    },
    Write {
        off: u64,
        len: usize,
        fua: bool,
        seed: u8,
    },
    Readv {
        off: u64,
        lens: Vec<usize>,
    },
    Writev {
        off: u64,
        lens: Vec<usize>,
        fua: bool,
        seed: u8,
    },
    Flush,
    WriteZeroes {
        off: u64,
        len: u64,
        flags: u32,
    },
    Discard {
        off: u64,
        len: u64,
    },
    /// FUA on a read: rejected by the library.
    BadFlags,
    Zone,
    /// Several reads, then one do_io waiting for all of them.
    Batch {
        offs: Vec<u64>,
    },
}

/// Offsets/lengths in units of `g` bytes (1 for buffered I/O, 512 for O_DIRECT).
fn step(g: u64) -> impl Strategy<Value = Step> {
    let off = move || (0..SPAN / g).prop_map(move |o| o * g);
    let len = move || (1..=(64 * 1024 / g) as usize).prop_map(move |l| l * g as usize);
    let lens = move || {
        prop::collection::vec(1..=(16 * 1024 / g) as usize, 1..5)
            .prop_map(move |v| v.into_iter().map(|l| l * g as usize).collect::<Vec<_>>())
    };
    prop_oneof![
        4 => (off(), len()).prop_map(|(off, len)| Step::Read { off, len }),
        3 => (off(), len(), any::<bool>(), any::<u8>())
            .prop_map(|(off, len, fua, seed)| Step::Write { off, len, fua, seed }),
        2 => (off(), lens()).prop_map(|(off, lens)| Step::Readv { off, lens }),
        2 => (off(), lens(), any::<bool>(), any::<u8>())
            .prop_map(|(off, lens, fua, seed)| Step::Writev { off, lens, fua, seed }),
        1 => Just(Step::Flush),
        1 => (off(), len(), 0u32..8)
            .prop_map(|(off, len, flags)| Step::WriteZeroes { off, len: len as u64, flags }),
        1 => (off(), len()).prop_map(|(off, len)| Step::Discard { off, len: len as u64 }),
        1 => Just(Step::BadFlags),
        1 => Just(Step::Zone),
        2 => prop::collection::vec(off(), 2..6).prop_map(|offs| Step::Batch { offs }),
    ]
}

/// What a completion says, comparable across devices.
type Seen = (usize, i32, Option<String>);

fn seen(c: &Completion) -> Seen {
    (
        c.user_data,
        c.ret,
        c.error_msg().map(|m| m.to_string_lossy().into_owned()),
    )
}

/// Enqueue the step's requests and wait for all of them; returns the completions (sorted by
/// user_data for batches, whose ring completion order is the kernel's) and the bytes of the
/// region the step read into.
fn run(d: &mut Dev, s: &Step, ud: usize, timed: bool) -> (Vec<Seen>, Vec<u8>) {
    let base = d.mem.addr;
    let mem = d.mem();
    mem.fill(0xEE);
    let mut iovs: Vec<libc::iovec> = Vec::new();
    let mut reqs = Vec::new();
    let mut read_len = 0;
    let mut chain = |lens: &[usize]| {
        let mut at = 0;
        for &l in lens {
            iovs.push(libc::iovec {
                // SAFETY: `at + l` stays within the 1 MiB region (at most 4 x 16 KiB).
                iov_base: unsafe { base.add(at) }.cast(),
                iov_len: l,
            });
            at += l;
        }
        at
    };
    match s {
        Step::Read { off, len } => {
            read_len = *len;
            reqs.push(Request::new(
                Op::Read {
                    offset: *off,
                    buf: base,
                    len: *len,
                },
                ud,
                ReqFlags::NONE,
            ));
        }
        Step::Write {
            off,
            len,
            fua,
            seed,
        } => {
            mem[..*len].copy_from_slice(&pattern(*len, *seed));
            let f = if *fua { ReqFlags::FUA } else { ReqFlags::NONE };
            reqs.push(Request::new(
                Op::Write {
                    offset: *off,
                    buf: base,
                    len: *len,
                },
                ud,
                f,
            ));
        }
        Step::Readv { off, lens } | Step::Writev { off, lens, .. } => {
            let total = chain(lens);
            let (write, f) = match s {
                Step::Writev { fua, seed, .. } => {
                    mem[..total].copy_from_slice(&pattern(total, *seed));
                    (true, if *fua { ReqFlags::FUA } else { ReqFlags::NONE })
                }
                _ => {
                    read_len = total;
                    (false, ReqFlags::NONE)
                }
            };
            let (iov, iovcnt) = (iovs.as_ptr(), iovs.len() as i32);
            let op = if write {
                Op::Writev {
                    offset: *off,
                    iov,
                    iovcnt,
                }
            } else {
                Op::Readv {
                    offset: *off,
                    iov,
                    iovcnt,
                }
            };
            reqs.push(Request::new(op, ud, f));
        }
        Step::Flush => reqs.push(Request::new(Op::Flush, ud, ReqFlags::NONE)),
        Step::WriteZeroes { off, len, flags } => reqs.push(Request::new(
            Op::WriteZeroes {
                offset: *off,
                len: *len,
            },
            ud,
            ReqFlags(*flags),
        )),
        Step::Discard { off, len } => reqs.push(Request::new(
            Op::Discard {
                offset: *off,
                len: *len,
            },
            ud,
            ReqFlags::NONE,
        )),
        Step::BadFlags => reqs.push(Request::new(
            Op::Read {
                offset: 0,
                buf: base,
                len: 4096,
            },
            ud,
            ReqFlags::FUA,
        )),
        Step::Zone => reqs.push(Request::new(
            Op::Zone(snapblk_core::ZoneOp::Report {
                offset: 0,
                zones: std::ptr::null_mut(),
                nr_zones: 0,
            }),
            ud,
            ReqFlags::NONE,
        )),
        Step::Batch { offs } => {
            read_len = offs.len() * 4096;
            for (i, off) in offs.iter().enumerate() {
                reqs.push(Request::new(
                    Op::Read {
                        offset: *off,
                        // SAFETY: at most 6 x 4 KiB inside the region.
                        buf: unsafe { base.add(i * 4096) },
                        len: 4096,
                    },
                    ud + i,
                    ReqFlags::NONE,
                ));
            }
        }
    }
    let n = reqs.len();
    let q = d.q();
    for r in reqs {
        // SAFETY: the buffers (region, `iovs`) outlive the do_io below, which reaps them all.
        unsafe { q.enqueue(r) };
    }
    let mut cs = vec![Completion::default(); n];
    let mut t = Duration::from_secs(10);
    let got = q
        .do_io(&mut cs, n, timed.then_some(&mut t), None)
        .expect("do_io");
    assert_eq!(got, n);
    assert_eq!(q.outstanding(), 0);
    let mut out: Vec<Seen> = cs.iter().map(seen).collect();
    out.sort();
    let data = d.mem()[..read_len].to_vec();
    (out, data)
}

fn compare(direct: bool, steps: &[(Step, bool)]) {
    let init = pattern(FILE, 7);
    let (fa, fb) = (make_file("in", &init), make_file("ring", &init));
    let mut inline = Dev::open(&fa.0, direct, true, false);
    let mut ring = Dev::open(&fb.0, direct, false, false);
    for (i, (s, timed)) in steps.iter().enumerate() {
        let ud = 100 * i;
        let a = run(&mut inline, s, ud, *timed);
        let b = run(&mut ring, s, ud, *timed);
        assert_eq!(a.0, b.0, "completions of step {i}: {s:?}");
        assert!(a.1 == b.1, "read data of step {i}: {s:?}");
    }
    drop((inline, ring));
    let (a, b) = (std::fs::read(&fa.0).unwrap(), std::fs::read(&fb.0).unwrap());
    assert_eq!(a.len(), b.len(), "file sizes");
    assert!(a == b, "file contents differ");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn inline_matches_ring_buffered(steps in prop::collection::vec((step(1), any::<bool>()), 1..24)) {
        compare(false, &steps);
    }

    #[test]
    fn inline_matches_ring_direct(steps in prop::collection::vec((step(512), any::<bool>()), 1..24)) {
        compare(true, &steps);
    }
}

#[test]
fn eof_semantics_are_the_rings() {
    // A read across the end of a file zero-fills the rest; one wholly past it reads zeros.
    let steps = [
        (
            Step::Read {
                off: FILE as u64 - 100,
                len: 4096,
            },
            false,
        ),
        (
            Step::Read {
                off: FILE as u64 + 4096,
                len: 8192,
            },
            false,
        ),
        (
            Step::Readv {
                off: FILE as u64 - 10,
                lens: vec![5, 4096, 7],
            },
            false,
        ),
        (
            Step::Write {
                off: FILE as u64 + 1000,
                len: 10,
                fua: true,
                seed: 1,
            },
            false,
        ),
        (
            Step::Read {
                off: FILE as u64,
                len: 2000,
            },
            false,
        ),
    ];
    compare(false, &steps);
    let init = pattern(FILE, 7);
    let f = make_file("eof", &init);
    let mut d = Dev::open(&f.0, false, true, false);
    let (c, data) = run(&mut d, &steps[0].0, 1, false);
    assert_eq!(c, [(1, 0, None)]);
    assert_eq!(&data[..100], &init[FILE - 100..]);
    assert!(data[100..].iter().all(|&x| x == 0));
}

#[test]
fn errors_come_back_in_the_completion_like_the_ring() {
    // Writes to a read-only target fail with EBADF (from pwritev2 / fallocate); offsets the
    // kernel rejects (negative as loff_t) give EINVAL; all in the completion, as on the ring.
    let init = pattern(FILE, 7);
    let f = make_file("err", &init);
    let steps = [
        Step::Write {
            off: 0,
            len: 4096,
            fua: false,
            seed: 1,
        },
        Step::Writev {
            off: 0,
            lens: vec![100, 200],
            fua: true,
            seed: 1,
        },
        Step::WriteZeroes {
            off: 0,
            len: 4096,
            flags: 0,
        },
        Step::Discard { off: 0, len: 4096 },
        Step::Read { off: 0, len: 4096 },
    ];
    let mut results = Vec::new();
    for inline in [true, false] {
        let mut d = Dev::open(&f.0, false, inline, true);
        let r: Vec<Vec<Seen>> = steps.iter().map(|s| run(&mut d, s, 5, false).0).collect();
        results.push(r);
    }
    assert_eq!(results[0], results[1]);
    for r in &results[0][..4] {
        assert_eq!(r[0].1, -libc::EBADF, "{r:?}");
    }
    assert_eq!(results[0][4], [(5, 0, None)]);

    let bad = [
        Step::Read {
            off: 1 << 63,
            len: 4096,
        },
        Step::Readv {
            off: 1 << 63,
            lens: vec![10, 20],
        },
        Step::WriteZeroes {
            off: 1 << 63,
            len: 4096,
            flags: 0,
        },
        Step::Write {
            off: 1 << 63,
            len: 4096,
            fua: true,
            seed: 1,
        },
    ];
    let mut results = Vec::new();
    for inline in [true, false] {
        let mut d = Dev::open(&f.0, false, inline, false);
        let r: Vec<Vec<Seen>> = bad.iter().map(|s| run(&mut d, s, 9, false).0).collect();
        results.push(r);
    }
    assert_eq!(results[0], results[1]);
    for r in &results[0] {
        assert_eq!(r[0].1, -libc::EINVAL, "{r:?}");
    }
}
