//! The driver conformance suite (`crates/conformance`), run against every driver and target: a
//! regular file (buffered and O_DIRECT on ext4), tmpfs with O_DIRECT (/dev/shm), a loop block
//! device (needs root and losetup; a skip is printed, and the test then fails unless
//! SNAPBLK_ALLOW_SKIP=1) and the null driver; then driver-specific tests.

use snapblk_conformance::{Expect, Options};
use snapblk_core::{Blkio, Completion, Driver, Op, Queue, QueueExt, ReqFlags, Request};
use snapblk_drivers::{NullDriver, SyncDriver, UringDriver};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

struct TempDir(PathBuf);
impl TempDir {
    fn new(base: &str, tag: &str) -> TempDir {
        let p = Path::new(base).join(format!("snapblk-drv-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn driver(name: &str) -> Box<dyn Driver> {
    match name {
        "sync" => Box::new(SyncDriver::new()),
        "io_uring" => Box::new(UringDriver::new()),
        _ => Box::new(NullDriver::new()),
    }
}

fn open(drv: &str, path: &Path, direct: bool, queues: i32) -> Blkio {
    let mut b = Blkio::new(driver(drv));
    b.set_str("path", path.to_str().unwrap()).unwrap();
    b.set_bool("direct", direct).unwrap();
    b.connect().unwrap();
    b.set_int("num-queues", queues).unwrap();
    if drv == "io_uring" {
        b.set_int("num-entries", 4).unwrap();
    }
    b.start().unwrap();
    b
}

/// Page-aligned buffer from a mem region (so O_DIRECT works everywhere).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn run_one(q: &mut dyn Queue, req: Request) -> Completion {
    // SAFETY: callers pass buffers that outlive this call, which waits for the completion.
    unsafe { q.enqueue(req) };
    let mut c = [Completion::default()];
    assert_eq!(q.do_io(&mut c, 1, None, None).unwrap(), 1);
    c[0]
}

/// Run the driver conformance suite (`snapblk-conformance`) on a file-backed target. `blk`:
/// the target is a block device (it cannot grow, and a discard need not read back as zeros).
/// Every check must pass; `unaligned` is skipped only where `request-alignment` is 1 (buffered
/// I/O) and `can-grow` only on block devices.
fn conformance(drv: &str, path: &Path, direct: bool, blk: bool) {
    let b = open(drv, path, direct, 2);
    let cap = b.get_u64("capacity").unwrap();
    assert!(cap >= 1 << 20);
    let opts = Options {
        expect: Expect {
            capacity: Some(cap),
            direct: Some(direct),
            can_grow: Some(!blk),
            read_only: Some(false),
            discard_zeroes: !blk,
            write_zeroes_no_fallback: true,
        },
        ..Options::default()
    };
    let report = snapblk_conformance::run(b, &opts);
    println!("{drv} {} direct={direct}:\n{report}", path.display());
    assert!(
        report.passed(),
        "{drv} failed {:?}:\n{report}",
        report.failed()
    );
    let mut skips = Vec::new();
    if report.target.contains("request-alignment=1,") {
        skips.push("unaligned");
    }
    if blk {
        skips.push("can-grow");
    }
    assert_eq!(report.skipped(), skips, "{drv}:\n{report}");
}

fn read_eventfd(fd: i32) -> Option<u64> {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into a live u64.
    let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    (n == 8).then_some(v)
}

fn make_file(dir: &Path, len: usize) -> PathBuf {
    let p = dir.join("img");
    std::fs::write(&p, pattern(len, 3)).unwrap();
    p
}

#[test]
fn file_buffered() {
    let d = TempDir::new("/tmp", "buf");
    for drv in ["sync", "io_uring"] {
        conformance(drv, &make_file(&d.0, 4 << 20), false, false);
    }
}

#[test]
fn file_direct_ext4() {
    let d = TempDir::new("/var/tmp", "direct");
    for drv in ["sync", "io_uring"] {
        conformance(drv, &make_file(&d.0, 4 << 20), true, false);
    }
}

#[test]
fn tmpfs_direct() {
    let d = TempDir::new("/dev/shm", "shm");
    for drv in ["sync", "io_uring"] {
        conformance(drv, &make_file(&d.0, 4 << 20), true, false);
    }
}

/// A loop device over a file, detached on drop.
struct Loop(String);
impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

fn skip_or_fail(why: &str) {
    eprintln!("SKIPPED: loop-device test: {why}");
    if std::env::var("SNAPBLK_ALLOW_SKIP").as_deref() != Ok("1") {
        panic!("loop-device test cannot run ({why}); set SNAPBLK_ALLOW_SKIP=1 to skip explicitly");
    }
}

#[test]
fn loop_block_device() {
    // SAFETY: plain libc call.
    if unsafe { libc::geteuid() } != 0 {
        return skip_or_fail("not root");
    }
    let d = TempDir::new("/var/tmp", "loop");
    let f = make_file(&d.0, 8 << 20);
    let out = match Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&f)
        .output()
    {
        Ok(o) if o.status.success() => o,
        Ok(o) => return skip_or_fail(&String::from_utf8_lossy(&o.stderr)),
        Err(e) => return skip_or_fail(&e.to_string()),
    };
    let dev = Loop(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    for drv in ["sync", "io_uring"] {
        for direct in [false, true] {
            conformance(drv, Path::new(&dev.0), direct, true);
        }
    }
    let b = open("io_uring", Path::new(&dev.0), true, 1);
    assert_eq!(b.get_int("request-alignment").unwrap(), 512);
    // Loop devices have no poll queues: the probe must say so (libblkio's said yes).
    assert!(!b.get_bool("supports-poll-queues").unwrap());
}

#[test]
fn null_driver() {
    let mut b = Blkio::new(Box::new(NullDriver::new()));
    b.set_u64("size", 1 << 20).unwrap();
    b.connect().unwrap();
    assert_eq!(b.get_u64("capacity").unwrap(), 1 << 20);
    assert!(b.set_u64("size", 5).is_err());
    b.set_int("num-poll-queues", 1).unwrap();
    b.start().unwrap();
    let q = b.queue(0, false).unwrap();
    let mut buf = vec![9u8; 8192];
    q.read_at(4096, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 0));
    q.write_at(0, &buf, true).unwrap();
    assert_eq!(
        q.read_at((1 << 20) - 4096, &mut buf).unwrap_err().errno,
        libc::EIO
    );
    let p = b.queue(0, true).unwrap();
    assert!(p.is_poll() && p.completion_fd().is_none());
    assert_eq!(p.flush().unwrap_err().errno, libc::ENOTSUP);
    p.read_at(0, &mut buf).unwrap();
}

#[test]
fn null_driver_passes_the_suite() {
    let mut b = Blkio::new(Box::new(NullDriver::new()));
    b.set_u64("size", 64 << 20).unwrap();
    b.connect().unwrap();
    let report = snapblk_conformance::run(b, &Options::default());
    println!("{report}");
    assert!(report.passed(), "{report}");
    // Byte-granular and fixed-size; it stores nothing, so reads are checked to return zeros.
    assert_eq!(
        report.skipped(),
        ["expectations", "unaligned", "can-grow"],
        "{report}"
    );
}

#[test]
fn uring_properties_and_errors() {
    let d = TempDir::new("/tmp", "props");
    let f = make_file(&d.0, 1 << 20);
    let mut b = Blkio::new(Box::new(UringDriver::new()));
    assert_eq!(b.get_int("num-entries").unwrap(), 128);
    assert_eq!(
        b.connect().unwrap_err().msg,
        "One of path and fd must be set"
    );
    b.set_str("path", d.0.to_str().unwrap()).unwrap();
    b.set_bool("read-only", true).unwrap();
    assert_eq!(
        b.connect().unwrap_err().msg,
        "The file must be a block device or a regular file"
    );
    // libblkio left a stale fd here; we don't
    assert_eq!(b.get_int("fd").unwrap(), -1);
    b.set_str("path", f.to_str().unwrap()).unwrap();
    b.connect().unwrap();
    assert!(b.get_bool("read-only").unwrap());
    assert!(b.get_int("fd").unwrap() >= 0);
    assert_eq!(b.set_int("num-entries", 0).unwrap_err().errno, libc::EINVAL);
    b.set_int("num-entries", 8).unwrap();
    assert_eq!(b.start().map(|_| ()), Ok(()));
    let q = b.queue(0, false).unwrap();
    let buf = vec![0u8; 4096];
    assert_eq!(q.write_at(0, &buf, false).unwrap_err().errno, libc::EBADF);
    let mut r = vec![0u8; 4096];
    q.read_at(0, &mut r).unwrap();
    assert_eq!(r, pattern(1 << 20, 3)[..4096]);
}

#[test]
fn uring_completion_fd_can_be_disabled() {
    let d = TempDir::new("/tmp", "efd");
    let f = make_file(&d.0, 1 << 20);
    let mut b = open("io_uring", &f, false, 1);
    let q = b.queue(0, false).unwrap();
    let fd = q.completion_fd().unwrap();
    q.set_completion_fd_enabled(false);
    let mut buf = vec![0u8; 4096];
    q.read_at(0, &mut buf).unwrap();
    assert_eq!(
        read_eventfd(fd),
        None,
        "disabled fd must stay quiet (libblkio ignored the flag)"
    );
    q.set_completion_fd_enabled(true);
    q.read_at(0, &mut buf).unwrap();
    assert!(read_eventfd(fd).is_some());
}

#[test]
fn uring_completion_fd_asked_for_late_still_signals() {
    // The eventfd stays silent until someone asks for it; a caller who asks only after its
    // request completed must still find the fd readable.
    let d = TempDir::new("/tmp", "efdlate");
    let f = make_file(&d.0, 1 << 20);
    let mut b = open("io_uring", &f, false, 1);
    let q = b.queue(0, false).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` outlives the request, which is reaped below.
    unsafe {
        q.enqueue(Request::new(
            Op::Read {
                offset: 0,
                buf: buf.as_mut_ptr(),
                len: 4096,
            },
            7,
            ReqFlags::NONE,
        ))
    };
    let mut cs = [Completion::default(); 1];
    // Submit only; the completion lands in the CQ without anyone watching.
    assert_eq!(q.do_io(&mut cs[..0], 0, None, None).unwrap(), 0);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let fd = q.completion_fd().unwrap();
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let ready = unsafe { libc::poll(&mut p, 1, 1000) };
    assert_eq!(ready, 1, "fd must be readable");
    assert_eq!(q.do_io(&mut cs, 1, None, None).unwrap(), 1);
    assert_eq!((cs[0].user_data, cs[0].ret), (7, 0));
    while read_eventfd(fd).is_some() {}
    // From now on the kernel signals it for every completion.
    q.read_at(0, &mut buf).unwrap();
    assert!(read_eventfd(fd).is_some());
}

#[test]
fn uring_queue_moves_between_threads() {
    // Rings are SINGLE_ISSUER where the kernel allows: the first thread that submits owns the
    // ring, and an idle queue handed to another thread gets a ring of its own there.
    let d = TempDir::new("/tmp", "threads");
    let f = make_file(&d.0, 1 << 20);
    let mut b = open("io_uring", &f, false, 1);
    let mem = b.alloc_mem_region(8192).unwrap();
    b.map_mem_region(&mem).unwrap();
    let addr = mem.addr as usize;
    let mut q = b.take_queue(0, false).unwrap();
    fn check(q: &mut Box<dyn Queue>, addr: usize, off: usize, ud: usize) {
        let c = run_one(
            &mut **q,
            Request::new(
                Op::Read {
                    offset: off as u64,
                    buf: addr as *mut u8,
                    len: 4096,
                },
                ud,
                ReqFlags::NONE,
            ),
        );
        assert_eq!((c.user_data, c.ret), (ud, 0));
        // SAFETY: the read completed; the region is live.
        let got = unsafe { std::slice::from_raw_parts(addr as *const u8, 4096) };
        assert_eq!(got, &pattern(1 << 20, 3)[off..off + 4096]);
    }
    // Created on this thread, used first on another, then on a third, then back here.
    q = std::thread::spawn(move || {
        check(&mut q, addr, 4096, 1);
        q
    })
    .join()
    .unwrap();
    q = std::thread::spawn(move || {
        check(&mut q, addr, 8192, 2);
        // A request enqueued here but submitted by the next thread also works.
        // SAFETY: the region is live and only this request uses its second half.
        unsafe {
            q.enqueue(Request::new(
                Op::Read {
                    offset: 0,
                    buf: (addr + 4096) as *mut u8,
                    len: 4096,
                },
                3,
                ReqFlags::NONE,
            ))
        };
        q
    })
    .join()
    .unwrap();
    let mut c = [Completion::default()];
    assert_eq!(q.do_io(&mut c, 1, None, None).unwrap(), 1);
    assert_eq!((c[0].user_data, c[0].ret), (3, 0));
    // SAFETY: completed read into the live region.
    let got = unsafe { std::slice::from_raw_parts((addr + 4096) as *const u8, 4096) };
    assert_eq!(got, &pattern(1 << 20, 3)[..4096]);
    check(&mut q, addr, 12288, 4);
    drop(q);
    b.unmap_mem_region(&mem);
    b.free_mem_region(&mem).unwrap();
}

#[test]
fn uring_completion_fd_in_use_is_not_signalled_twice() {
    // After the fd is handed out, one completion makes it readable once: a do_io after
    // draining it leaves it empty (no spurious second signal).
    let d = TempDir::new("/tmp", "efdonce");
    let f = make_file(&d.0, 1 << 20);
    let mut b = open("io_uring", &f, false, 1);
    let q = b.queue(0, false).unwrap();
    let mut buf = vec![0u8; 4096];
    q.read_at(0, &mut buf).unwrap();
    let fd = q.completion_fd().unwrap();
    for round in 0..3 {
        while read_eventfd(fd).is_some() {}
        // SAFETY: `buf` outlives the request, which is reaped below.
        unsafe {
            q.enqueue(Request::new(
                Op::Read {
                    offset: 4096,
                    buf: buf.as_mut_ptr(),
                    len: 4096,
                },
                9,
                ReqFlags::NONE,
            ))
        };
        let mut cs = [Completion::default(); 1];
        assert_eq!(q.do_io(&mut cs[..0], 0, None, None).unwrap(), 0);
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1, "round {round}");
        assert!(read_eventfd(fd).is_some());
        assert_eq!(q.do_io(&mut cs, 1, None, None).unwrap(), 1);
        assert_eq!(read_eventfd(fd), None, "round {round}: signalled twice");
    }
}

#[test]
fn uring_region_mapped_after_another_thread_started_the_queue() {
    // The kernel refuses buffer registration on a SINGLE_ISSUER ring from a foreign thread:
    // the region must then simply work unregistered.
    let d = TempDir::new("/tmp", "latemap");
    let f = make_file(&d.0, 1 << 20);
    let mut b = open("io_uring", &f, false, 1);
    let mut q = b.take_queue(0, false).unwrap();
    let mut tmp = vec![0u8; 4096];
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let worker = std::thread::spawn(move || {
        q.read_at(0, &mut tmp).unwrap();
        for addr in rx {
            let c = run_one(
                &mut *q,
                Request::new(
                    Op::Read {
                        offset: 8192,
                        buf: addr as *mut u8,
                        len: 4096,
                    },
                    1,
                    ReqFlags::NONE,
                ),
            );
            assert_eq!(c.ret, 0);
            // SAFETY: the read completed into the live region.
            let got = unsafe { std::slice::from_raw_parts(addr as *const u8, 4096) };
            done_tx.send(got.to_vec()).unwrap();
        }
        q
    });
    let mem = b.alloc_mem_region(4096).unwrap();
    b.map_mem_region(&mem).unwrap();
    tx.send(mem.addr as usize).unwrap();
    let got = done_rx.recv().unwrap();
    assert_eq!(got, pattern(1 << 20, 3)[8192..12288]);
    drop(tx);
    drop(worker.join().unwrap());
    b.unmap_mem_region(&mem);
    b.free_mem_region(&mem).unwrap();
}

/// One request on `q`, reading or writing `len` bytes of `buf` at `offset`.
fn rw(write: bool, offset: u64, buf: *mut u8, len: usize, ud: usize) -> Request {
    let op = if write {
        Op::Write { offset, buf, len }
    } else {
        Op::Read { offset, buf, len }
    };
    Request::new(op, ud, ReqFlags::NONE)
}

#[test]
fn offsets_past_the_kernels_off_t_fail_with_einval_and_write_nothing() {
    // io_uring takes offset -1 (2^64 - 1) as "the file's current position": passed through,
    // such a write would land at offset 0 and succeed.
    let d = TempDir::new("/tmp", "offsets");
    for drv in ["sync", "io_uring", "null"] {
        let f = make_file(&d.0, 1 << 20);
        let mut b = if drv == "null" {
            let mut b = Blkio::new(driver(drv));
            b.set_u64("size", 1 << 20).unwrap();
            b.connect().unwrap();
            b.start().unwrap();
            b
        } else {
            open(drv, &f, false, 1)
        };
        let mut q = b.take_queue(0, false).unwrap();
        let mut buf = vec![0x55u8; 4096];
        for (i, off) in [u64::MAX, 1 << 63, u64::MAX - 4095].into_iter().enumerate() {
            for write in [true, false] {
                let c = run_one(&mut *q, rw(write, off, buf.as_mut_ptr(), 4096, i));
                assert_eq!(c.ret, -libc::EINVAL, "{drv} write={write} offset {off}");
            }
        }
        drop(q);
        assert_eq!(
            std::fs::read(&f).unwrap(),
            pattern(1 << 20, 3),
            "{drv}: the file changed"
        );
    }
}

#[test]
fn polling_with_a_zero_timeout_still_submits() {
    // do_io guarantees submission; the timeout only bounds the wait. A caller that polls with
    // a zero timeout must see its request complete eventually.
    let d = TempDir::new("/tmp", "zerot");
    for drv in ["sync", "io_uring"] {
        let f = make_file(&d.0, 1 << 20);
        let mut b = open(drv, &f, false, 1);
        let mut q = b.take_queue(0, false).unwrap();
        let mut buf = vec![0u8; 4096];
        // SAFETY: buf outlives the loop below, which reaps the completion.
        unsafe { q.enqueue(rw(false, 8192, buf.as_mut_ptr(), 4096, 7)) };
        let mut c = [Completion::default()];
        let mut polls = 0;
        loop {
            polls += 1;
            assert!(polls < 10_000, "{drv}: never completed");
            let mut t = Duration::ZERO;
            match q.do_io(&mut c, 1, Some(&mut t), None) {
                Ok(1) => break,
                Err(e) if e.errno == libc::ETIME => std::thread::sleep(Duration::from_millis(1)),
                r => panic!("{drv}: {r:?}"),
            }
        }
        assert_eq!((c[0].user_data, c[0].ret), (7, 0), "{drv}");
        assert_eq!(buf, pattern(1 << 20, 3)[8192..12288], "{drv}");
    }
}

#[test]
fn uring_queue_with_requests_in_another_threads_ring_fails_with_ebusy() {
    // With SINGLE_ISSUER and DEFER_TASKRUN, only the thread whose ring holds the requests can
    // collect their completions: another thread's do_io must say so, not spin until its
    // timeout (or forever).
    let d = TempDir::new("/var/tmp", "ebusy");
    let f = make_file(&d.0, 1 << 20);
    let mut b = open("io_uring", &f, true, 1);
    let mem = b.alloc_mem_region(4096).unwrap();
    b.map_mem_region(&mem).unwrap();
    let addr = mem.addr as usize;
    let mut q = b.take_queue(0, false).unwrap();
    // SAFETY: the region outlives the request, which is reaped below.
    unsafe { q.enqueue(rw(false, 4096, addr as *mut u8, 4096, 9)) };
    let mut c = [Completion::default()];
    // Submitted here; its completion is posted only when this thread enters the kernel again.
    assert_eq!(q.do_io(&mut c, 0, None, None).unwrap(), 0);
    let (q2, err) = std::thread::spawn(move || {
        let mut c = [Completion::default()];
        let mut t = Duration::from_secs(2);
        let r = q.do_io(&mut c, 1, Some(&mut t), None);
        (q, r.err())
    })
    .join()
    .unwrap();
    q = q2;
    let e = err.expect("do_io in another thread succeeded");
    assert_eq!(e.errno, libc::EBUSY, "{e}");
    // Back on the owning thread, the completion is there.
    assert_eq!(q.do_io(&mut c, 1, None, None).unwrap(), 1);
    assert_eq!((c[0].user_data, c[0].ret), (9, 0));
    // SAFETY: the read completed; the region is live.
    let got = unsafe { std::slice::from_raw_parts(addr as *const u8, 4096) };
    assert_eq!(got, &pattern(1 << 20, 3)[4096..8192]);
    drop(q);
    b.unmap_mem_region(&mem);
    b.free_mem_region(&mem).unwrap();
}

#[test]
fn uring_region_that_a_later_ring_cannot_register_still_works() {
    // The kernel charges a ring's registered buffers to RLIMIT_MEMLOCK per ring (without
    // CAP_IPC_LOCK). A 6 MiB region under an 8 MiB limit registers in the first queue's ring
    // but not in a second one, nor in the ring a queue switches to when its completion fd is
    // asked for; those rings must do the region's I/O unregistered, not fail it with EFAULT.
    // The scenario runs in a child without CAP_IPC_LOCK and with an 8 MiB limit.
    const CHILD: &str = "SNAPBLK_MEMLOCK_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let me = std::env::current_exe().unwrap();
        let out = Command::new("setpriv")
            .args(["--bounding-set", "-ipc_lock", "--inh-caps", "-ipc_lock"])
            .args(["prlimit", "--memlock=8388608:8388608"])
            .arg(&me)
            .args([
                "--exact",
                "uring_region_that_a_later_ring_cannot_register_still_works",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .expect("setpriv and prlimit (util-linux)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "the child ran nothing: {text}");
        return;
    }
    let d = TempDir::new("/tmp", "memlock");
    let f = make_file(&d.0, 1 << 20);
    let mut b = open("io_uring", &f, false, 1);
    let mem = b.alloc_mem_region(6 << 20).unwrap();
    b.map_mem_region(&mem).unwrap();
    let second = b.add_queue(false).unwrap();
    for (qi, off) in [(0, 0usize), (second, 4096)] {
        let q = b.queue(qi, false).unwrap();
        // SAFETY: the region is mapped and outlives the read.
        let buf = unsafe { std::slice::from_raw_parts_mut(mem.addr, 4096) };
        q.read_at(off as u64, buf)
            .unwrap_or_else(|e| panic!("queue {qi}: {e}"));
        assert_eq!(buf, &pattern(1 << 20, 3)[off..off + 4096], "queue {qi}");
    }
    // The first queue moves to a plain ring once its completion fd is handed out.
    let q = b.queue(0, false).unwrap();
    let _fd = q.completion_fd();
    // SAFETY: as above.
    let buf = unsafe { std::slice::from_raw_parts_mut(mem.addr, 4096) };
    q.read_at(8192, buf)
        .unwrap_or_else(|e| panic!("after completion_fd: {e}"));
    assert_eq!(buf, &pattern(1 << 20, 3)[8192..12288]);
    b.unmap_mem_region(&mem);
    b.free_mem_region(&mem).unwrap();
}
