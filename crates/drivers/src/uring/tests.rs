//! Tests of the io_uring driver: the NOWAIT probe, the inline-QD1 path and ring ownership.

use super::queue::UringQueue;
use super::*;
use crate::file::Target;
use snapblk_core::{Completion, Op, QueueExt, ReqFlags, Request};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A file of `len` patterned bytes under `dir`, removed on drop.
struct TmpFile(PathBuf);
impl TmpFile {
    fn new(dir: &str, tag: &str, len: usize) -> TmpFile {
        let p = Path::new(dir).join(format!("snapblk-uring-{tag}-{}", std::process::id()));
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        std::fs::write(&p, data).unwrap();
        TmpFile(p)
    }
}
impl Drop for TmpFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn driver(f: &TmpFile, direct: bool) -> UringDriver {
    let mut d = UringDriver::new();
    d.set_prop(
        "path",
        PropValue::Str(f.0.to_str().unwrap().into()),
        State::Created,
    )
    .unwrap();
    d.set_prop("direct", PropValue::Bool(direct), State::Created)
        .unwrap();
    d.connect(false).unwrap();
    d
}

fn queue(d: &UringDriver, inline: bool) -> UringQueue {
    let q = UringQueue::new(d.target.clone().unwrap(), d.bufs.clone(), 8, false, inline).unwrap();
    assert!(
        q.eng.ring.defer,
        "these tests need a kernel with DEFER_TASKRUN"
    );
    q
}

fn read_req(buf: &mut [u8], offset: u64, ud: usize) -> Request {
    Request::new(
        Op::Read {
            offset,
            buf: buf.as_mut_ptr(),
            len: buf.len(),
        },
        ud,
        ReqFlags::NONE,
    )
}

/// Queues start with a disabled `SINGLE_ISSUER` ring, enabled (owner set) by the first
/// `io_uring_enter` or replaced by a plain ring there (completion fd handed out): a
/// disabled ring means the kernel never saw a request of this queue.
fn ring_used(q: &UringQueue) -> bool {
    q.eng.ring.owner != 0 || !q.eng.ring.defer
}

/// `got` holds the file's pattern from `off`.
fn expect(off: usize, got: &[u8]) {
    let want: Vec<u8> = (off..off + got.len()).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(got, &want[..]);
}

#[test]
fn probe_says_tmpfs_has_no_nowait_and_ext4_has() {
    let shm = TmpFile::new("/dev/shm", "probe", 1 << 16);
    // Tests run on ext4 or xfs here (`stat -f /var/tmp`); the probe must say yes there.
    let st = nix_statfs("/var/tmp");
    assert!(
        st == 0xEF53 || st == 0x5846_5342,
        "/var/tmp must be ext4 or xfs for this test (f_type {st:#x})"
    );
    let disk = TmpFile::new("/var/tmp", "probe", 1 << 16);
    for direct in [false, true] {
        assert!(!driver(&shm, direct).nowait, "tmpfs direct={direct}");
        assert!(driver(&disk, direct).nowait, "ext4 direct={direct}");
    }
    // An empty file: the flag is checked before the read.
    let empty = TmpFile::new("/dev/shm", "probe0", 0);
    assert!(!driver(&empty, false).nowait);
}

fn nix_statfs(p: &str) -> i64 {
    let c = std::ffi::CString::new(p).unwrap();
    // SAFETY: zeroed statfs is valid; statfs fills it from a valid C string path.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut s) }, 0);
    s.f_type as i64
}

#[test]
fn nowait_and_inline_properties() {
    let shm = TmpFile::new("/dev/shm", "props", 4096);
    let mut d = UringDriver::new();
    assert_eq!(
        d.get_prop("nowait", State::Created).unwrap_err().errno,
        libc::ENODEV
    );
    assert_eq!(
        d.get_prop("inline-qd1", State::Created).unwrap(),
        PropValue::Bool(true)
    );
    d.set_prop("inline-qd1", PropValue::Bool(false), State::Created)
        .unwrap();
    d.set_prop(
        "path",
        PropValue::Str(shm.0.to_str().unwrap().into()),
        State::Created,
    )
    .unwrap();
    d.connect(false).unwrap();
    assert_eq!(
        d.get_prop("nowait", State::Connected).unwrap(),
        PropValue::Bool(false)
    );
    assert_eq!(
        d.get_prop("inline-qd1", State::Connected).unwrap(),
        PropValue::Bool(false)
    );
}

#[test]
fn qd1_on_tmpfs_runs_inline_and_ring_only_when_disabled() {
    let shm = TmpFile::new("/dev/shm", "qd1", 1 << 16);
    let d = driver(&shm, false);
    for inline in [true, false] {
        let mut q = queue(&d, inline);
        let mut buf = vec![0u8; 4096];
        for off in [0usize, 4096, 12345] {
            q.read_at(off as u64, &mut buf).unwrap();
            expect(off, &buf);
        }
        assert_eq!(ring_used(&q), !inline, "inline={inline}");
    }
    // On ext4 (NOWAIT) the driver never asks for the inline path.
    let disk = TmpFile::new("/var/tmp", "qd1", 1 << 16);
    let d = driver(&disk, false);
    let mut q = d.create_queue_inner(false).unwrap();
    assert!(!q.eng.inline);
    let mut buf = vec![0u8; 4096];
    q.read_at(0, &mut buf).unwrap();
    assert!(ring_used(&q));
}

#[test]
fn inline_only_when_the_caller_waits_for_everything() {
    let shm = TmpFile::new("/dev/shm", "mix", 1 << 16);
    let d = driver(&shm, false);
    let mut bufs = vec![vec![0u8; 4096]; 3];
    let mut cs = [Completion::default(); 3];

    // QD2 waiting for 1: the ring.
    let mut q = queue(&d, true);
    for (i, b) in bufs.iter_mut().enumerate().take(2) {
        // SAFETY: the buffers outlive the requests, reaped below.
        unsafe { q.enqueue(read_req(b, (i * 4096) as u64, i)) };
    }
    let mut got = q.do_io(&mut cs, 1, None, None).unwrap();
    assert!(ring_used(&q));
    while got < 2 {
        got += q.do_io(&mut cs[got..], 1, None, None).unwrap();
    }
    let mut uds: Vec<usize> = cs[..2].iter().map(|c| c.user_data).collect();
    uds.sort();
    assert_eq!(uds, [0, 1]);

    // QD2 waiting for both: inline, in submission order.
    let mut q = queue(&d, true);
    for (i, b) in bufs.iter_mut().enumerate().take(2) {
        // SAFETY: as above.
        unsafe { q.enqueue(read_req(b, (i * 4096) as u64, 10 + i)) };
    }
    assert_eq!(q.do_io(&mut cs, 2, None, None).unwrap(), 2);
    assert!(!ring_used(&q));
    assert_eq!((cs[0].user_data, cs[1].user_data), (10, 11));
    expect(4096, &bufs[1]);

    // A completion fd in use does not matter; a sigmask (interruptible wait) does.
    // SAFETY: an empty, initialised signal set.
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::sigemptyset(&mut mask) };
    let mut q = queue(&d, true);
    // SAFETY: as above.
    unsafe { q.enqueue(read_req(&mut bufs[0], 0, 1)) };
    assert_eq!(q.do_io(&mut cs, 1, None, Some(&mask)).unwrap(), 1);
    assert!(ring_used(&q));

    // An expired timeout: never inline (the caller must not block), so the request goes to
    // the ring. The kernel may finish it within the submitting enter (io-wq is fast on
    // tmpfs), so either it is reaped at once, or ETIME keeps it outstanding and the next
    // call reaps it; both end with the right completion.
    let mut q = queue(&d, true);
    // SAFETY: as above.
    unsafe { q.enqueue(read_req(&mut bufs[0], 0, 2)) };
    let mut t = Duration::ZERO;
    match q.do_io(&mut cs, 1, Some(&mut t), None) {
        Ok(n) => assert_eq!(n, 1),
        Err(e) => {
            assert_eq!(e.errno, libc::ETIME);
            assert_eq!(q.outstanding(), 1);
            assert_eq!(q.do_io(&mut cs, 1, None, None).unwrap(), 1);
        }
    }
    assert!(ring_used(&q));
    assert_eq!(t, Duration::ZERO);
    assert_eq!((cs[0].user_data, cs[0].ret), (2, 0));
    expect(0, &bufs[0]);

    // A non-zero timeout: inline, and the time left is written back.
    let mut q = queue(&d, true);
    // SAFETY: as above.
    unsafe { q.enqueue(read_req(&mut bufs[0], 0, 3)) };
    let mut t = Duration::from_secs(5);
    assert_eq!(q.do_io(&mut cs, 1, Some(&mut t), None).unwrap(), 1);
    assert!(!ring_used(&q));
    assert!(t <= Duration::from_secs(5) && t > Duration::from_secs(1));
}

#[test]
fn request_in_the_kernel_keeps_later_ones_on_the_ring() {
    let shm = TmpFile::new("/dev/shm", "inflight", 1 << 16);
    let d = driver(&shm, false);
    let mut q = queue(&d, true);
    let mut a = vec![0u8; 4096];
    let mut b = vec![0u8; 4096];
    // SAFETY: the buffers outlive the requests, reaped below.
    unsafe { q.enqueue(read_req(&mut a, 0, 1)) };
    let mut cs = [Completion::default(); 2];
    // Submit only: the request goes to the kernel; let its CQE arrive.
    assert_eq!(q.do_io(&mut cs, 0, None, None).unwrap(), 0);
    assert_eq!(q.eng.in_kernel, 1);
    std::thread::sleep(Duration::from_millis(20));
    // SAFETY: as above.
    unsafe { q.enqueue(read_req(&mut b, 8192, 2)) };
    // Not held back: something is in the kernel, so it goes straight to the SQ.
    assert_eq!(q.eng.in_kernel, 2);
    let mut got = 0;
    while got < 2 {
        got += q.do_io(&mut cs[got..], 2 - got, None, None).unwrap();
    }
    assert_eq!((cs[0].user_data, cs[1].user_data), (1, 2));
    expect(0, &a);
    expect(8192, &b);
    // Idle again: the next QD1 request runs inline (the ring stays as it is).
    let before = q.eng.ring.owner;
    q.read_at(4096, &mut a).unwrap();
    expect(4096, &a);
    assert_eq!(q.eng.ring.owner, before);
    assert_eq!(q.eng.in_kernel, 0);
}

fn read_eventfd(fd: RawFd) -> Option<u64> {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into a live u64.
    let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    (n == 8).then_some(v)
}

#[test]
fn inline_completions_signal_the_completion_fd_like_the_ring() {
    let shm = TmpFile::new("/dev/shm", "efd", 1 << 16);
    let d = driver(&shm, false);
    let mut counts = Vec::new();
    for inline in [true, false] {
        let mut q = queue(&d, inline);
        let mut buf = vec![0u8; 4096];
        // Not handed out yet: silent on both paths.
        q.read_at(0, &mut buf).unwrap();
        let fd = q.completion_fd().unwrap();
        assert_eq!(read_eventfd(fd), None, "inline={inline}: silent before");
        q.read_at(0, &mut buf).unwrap();
        counts.push(read_eventfd(fd));
        q.set_completion_fd_enabled(false);
        q.read_at(0, &mut buf).unwrap();
        assert_eq!(read_eventfd(fd), None, "inline={inline}: disabled");
        q.set_completion_fd_enabled(true);
        assert_eq!(ring_used(&q), !inline);
    }
    assert_eq!(counts, [Some(1), Some(1)]);
}

#[test]
fn poll_queues_never_run_inline() {
    let shm = TmpFile::new("/dev/shm", "poll", 4096);
    let mut d = driver(&shm, false);
    assert!(d.inline_for(false));
    assert!(!d.inline_for(true));
    d.inline_qd1 = false;
    assert!(!d.inline_for(false));
}

/// A queue dropped by a thread that does not own its `SINGLE_ISSUER` ring, with a pipe read
/// still in the kernel: the drop must not return before the kernel is done with the read's
/// buffer. The buffer is an mmap the test keeps (standing for memory the caller frees after
/// the drop), poisoned, and a write into the pipe after the drop must leave it untouched —
/// and the written bytes must still be in the pipe (the read was cancelled, not served late).
/// Recent kernels (6.18 here) also refuse such a late poll-driven read of a closed ring by
/// themselves; the io-wq case below is the one no kernel cancels.
#[test]
fn drop_from_another_thread_waits_for_the_kernel() {
    use std::sync::mpsc;
    const POISON: u8 = 0xA5;
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just created and are owned here only.
    let (rd, wr) = unsafe {
        use std::os::fd::FromRawFd;
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    // A second read end, so that the pipe stays open after the queue closes its target.
    let rd2 = rd.try_clone().unwrap();
    let t = Arc::new(Target {
        fd: rd,
        is_blk: false,
        direct: false,
        read_only: true,
        blk_write_zeroes: false,
    });
    let buf = MemRegion::alloc_private(4096).unwrap();
    // SAFETY: the region is 4096 bytes, mapped and ours.
    unsafe { std::ptr::write_bytes(buf.addr, POISON, 4096) };
    let addr = buf.addr as usize;

    // The owner: submits the read, hands the queue over, and stays alive (returning to user
    // space often, so task work queued for it runs) until told to stop.
    let (qtx, qrx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let bufs = Arc::new(bufs::Buffers::default());
    let owner = std::thread::spawn(move || {
        let mut q = UringQueue::new(t, bufs, 8, false, false).unwrap();
        assert!(
            q.eng.ring.defer,
            "this test needs a kernel with DEFER_TASKRUN"
        );
        let req = Request::new(
            Op::Read {
                offset: 0,
                buf: addr as *mut u8,
                len: 4096,
            },
            1,
            ReqFlags::NONE,
        );
        // SAFETY: the mapping outlives the queue (it is only unmapped at the test's end).
        unsafe { q.enqueue(req) };
        let mut cs = [Completion::default(); 1];
        assert_eq!(q.do_io(&mut cs, 0, None, None).unwrap(), 0);
        assert_eq!(q.eng.in_kernel, 1);
        qtx.send(q).unwrap();
        while let Err(mpsc::RecvTimeoutError::Timeout) =
            stop_rx.recv_timeout(Duration::from_millis(5))
        {}
    });
    let q = qrx.recv().unwrap();
    // Let the read arm its poll on the empty pipe.
    std::thread::sleep(Duration::from_millis(20));
    drop(q);
    let msg = b"written after the drop";
    // SAFETY: writes `msg` to the pipe's write end, which is ours.
    let n = unsafe { libc::write(wr.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
    assert_eq!(n, msg.len() as isize);
    // Give a late read every chance to land: the owner keeps running task work meanwhile.
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: the mapping is still ours and 4096 bytes long.
    let seen = unsafe { std::slice::from_raw_parts(buf.addr, 4096) };
    let touched = seen.iter().filter(|&&b| b != POISON).count();
    assert_eq!(
        touched, 0,
        "the dropped queue's read wrote {touched} bytes after the drop"
    );
    let mut back = [0u8; 64];
    // SAFETY: reads into a live local buffer from our read end of the pipe (which holds data,
    // so this does not block).
    let n = unsafe { libc::read(rd2.as_raw_fd(), back.as_mut_ptr().cast(), back.len()) };
    assert_eq!(
        &back[..n.max(0) as usize],
        msg,
        "the bytes stayed in the pipe"
    );
    stop_tx.send(()).unwrap();
    owner.join().unwrap();
    // SAFETY: nothing references the mapping any more.
    unsafe { buf.free() };
}

/// The same with a read an io-wq worker is busy with (tmpfs has no NOWAIT, so io_uring hands
/// the read to a worker thread, which copies into the buffer whatever the ring's state): the
/// drop must wait for the worker. After the drop the test reuses the memory (fills it with a
/// second poison); the worker must not write into it afterwards.
#[test]
fn drop_from_another_thread_waits_for_an_io_worker() {
    use std::sync::mpsc;
    const LEN: usize = 64 << 20;
    let shm = TmpFile::new("/dev/shm", "dropwq", LEN);
    let d = driver(&shm, false);
    let t = d.target.clone().unwrap();
    let buf = MemRegion::alloc_private(LEN).unwrap();
    // SAFETY: the region is LEN bytes, mapped and ours.
    unsafe { std::ptr::write_bytes(buf.addr, 0xA5, LEN) };
    let addr = buf.addr as usize;
    let (qtx, qrx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let bufs = d.bufs.clone();
    let owner = std::thread::spawn(move || {
        let mut q = UringQueue::new(t, bufs, 8, false, false).unwrap();
        assert!(
            q.eng.ring.defer,
            "this test needs a kernel with DEFER_TASKRUN"
        );
        let req = Request::new(
            Op::Read {
                offset: 0,
                buf: addr as *mut u8,
                len: LEN,
            },
            1,
            ReqFlags::NONE,
        );
        // SAFETY: the mapping outlives the queue (it is only unmapped at the test's end).
        unsafe { q.enqueue(req) };
        let mut cs = [Completion::default(); 1];
        assert_eq!(q.do_io(&mut cs, 0, None, None).unwrap(), 0);
        qtx.send(q).unwrap();
        while let Err(mpsc::RecvTimeoutError::Timeout) =
            stop_rx.recv_timeout(Duration::from_millis(5))
        {}
    });
    let q = qrx.recv().unwrap();
    drop(q);
    // The memory is the caller's again: reuse it.
    // SAFETY: as above.
    unsafe { std::ptr::write_bytes(buf.addr, 0x5A, LEN) };
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: as above.
    let seen = unsafe { std::slice::from_raw_parts(buf.addr, LEN) };
    let touched = seen.iter().filter(|&&b| b != 0x5A).count();
    stop_tx.send(()).unwrap();
    owner.join().unwrap();
    // SAFETY: nothing references the mapping any more.
    unsafe { buf.free() };
    assert_eq!(
        touched, 0,
        "the dropped queue's read wrote {touched} bytes after the drop"
    );
}
