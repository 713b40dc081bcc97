//! The `virtio-blk-vhost-user` driver against a real backend: `qemu-storage-daemon --export
//! type=vhost-user-blk` (Debian `qemu-system-common`, installed by scripts/install-deps.sh) on
//! a file in a temporary directory. One daemon per test, stopped by pid when the test ends
//! (also when it fails); data is checked in the file after the daemon has exited.

use snapblk_conformance::{Expect, Options};
use snapblk_core::{Blkio, Completion, MemRegion, Op, Queue, ReqFlags, Request};
use snapblk_drivers::VhostUserDriver;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const QSD: &str = "/usr/bin/qemu-storage-daemon";
const SIZE: usize = 64 << 20;

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("snapblk-vu-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One qemu-storage-daemon exporting `disk.img` of `dir` as `vhost.sock`; killed by pid on drop.
struct Daemon {
    child: Option<Child>,
    sock: PathBuf,
    img: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, queues: u32, writable: bool) -> Daemon {
        let img = dir.join("disk.img");
        if !img.exists() {
            let f = std::fs::File::create(&img).unwrap();
            f.set_len(SIZE as u64).unwrap();
        }
        let sock = dir.join("vhost.sock");
        let child = Command::new(QSD)
            .arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=file0,filename={}",
                img.display()
            ))
            .arg("--export")
            .arg(format!(
                "type=vhost-user-blk,id=exp0,addr.type=unix,addr.path={},node-name=file0,writable={},num-queues={queues}",
                sock.display(),
                if writable { "on" } else { "off" }
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{QSD} (install qemu-system-common): {e}"));
        let mut d = Daemon {
            child: Some(child),
            sock,
            img,
        };
        let t = Instant::now();
        while !d.sock.exists() {
            if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("qemu-storage-daemon exited early: {st}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "no socket after 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }
    fn path(&self) -> &str {
        self.sock.to_str().unwrap()
    }
    /// Stop (SIGSTOP) the daemon: requests sent now stay on the rings, unserved.
    fn freeze(&self) {
        let pid = self.child.as_ref().unwrap().id();
        let st = Command::new("kill")
            .arg("-STOP")
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(st.success());
    }
    /// Kill the daemon and wait for it; the file is then final.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

fn connect(path: &str) -> Blkio {
    let mut b = Blkio::new(Box::new(VhostUserDriver::new()));
    b.set_str("path", path).unwrap();
    b.connect().unwrap();
    b
}

fn run_one(q: &mut dyn Queue, req: Request) -> Completion {
    // SAFETY: callers pass buffers inside regions that outlive this call, which waits for the
    // completion.
    unsafe { q.enqueue(req) };
    let mut c = [Completion::default()];
    let mut t = Duration::from_secs(20);
    assert_eq!(q.do_io(&mut c, 1, Some(&mut t), None).unwrap(), 1);
    c[0]
}

fn rw(write: bool, offset: u64, buf: *mut u8, len: usize, flags: ReqFlags) -> Request {
    let op = if write {
        Op::Write { offset, buf, len }
    } else {
        Op::Read { offset, buf, len }
    };
    Request::new(op, offset as usize, flags)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn properties_follow_libblkio_in_every_state() {
    let dir = TempDir::new("props");
    let d = Daemon::start(&dir.0, 2, true);
    let mut b = Blkio::new(Box::new(VhostUserDriver::new()));
    // Created: libblkio 1.5's values (shared notes, vhost-user probe).
    for p in ["capacity", "max-queues", "max-mem-regions"] {
        let e = b.get_str(p).unwrap_err();
        assert_eq!(
            (e.errno, &*e.msg),
            (libc::ENODEV, "Device must be connected"),
            "{p}"
        );
    }
    let created = [
        ("fd", "-1"),
        ("mem-region-alignment", "1"),
        ("needs-mem-regions", "true"),
        ("needs-mem-region-fd", "true"),
        ("may-pin-mem-regions", "true"),
        ("request-alignment", "512"),
        ("optimal-io-alignment", "512"),
        ("optimal-io-size", "0"),
        ("max-segments", "1"),
        ("max-transfer", "0"),
        ("discard-alignment", "512"),
        ("flush-needed", "true"),
        ("supports-poll-queues", "true"),
        ("can-add-queues", "false"),
        ("queue-size", "256"),
        ("max-queue-size", "32768"),
        ("reconnect", "false"),
    ];
    for (p, v) in created {
        assert_eq!(b.get_str(p).unwrap(), v, "{p} when created");
    }
    for p in ["num-entries", "direct"] {
        assert_eq!(b.get_str(p).unwrap_err().errno, libc::ENOENT, "{p}");
    }
    // QEMU's probe: `fd` exists, reads -1, and setting it fails, so QEMU uses `path`.
    let e = b.set_int("fd", 5).unwrap_err();
    assert_eq!(
        (e.errno, &*e.msg),
        (libc::ENOENT, "fd property not supported")
    );
    assert_eq!(b.set_int("queue-size", 64).unwrap_err().errno, libc::ENODEV);
    let e = b.connect().unwrap_err();
    assert_eq!(
        (e.errno, &*e.msg),
        (libc::EINVAL, "One of path and fd must be set")
    );
    b.set_bool("reconnect", true).unwrap();
    assert!(b.get_bool("reconnect").unwrap());
    b.set_str("path", d.path()).unwrap();
    b.connect().unwrap();
    assert!(b.get_bool("reconnect").unwrap());
    assert_eq!(
        b.set_bool("reconnect", false).unwrap_err().errno,
        libc::EBUSY
    );
    let connected = [
        ("capacity", "67108864"),
        ("max-queues", "2"),
        ("max-mem-regions", "32"),
        ("optimal-io-size", "512"),
        ("max-segments", "126"),
        ("max-write-zeroes-len", "16777216"),
        ("max-discard-len", "16777216"),
        ("flush-needed", "false"),
    ];
    for (p, v) in connected {
        assert_eq!(b.get_str(p).unwrap(), v, "{p} when connected");
    }
    let e = b.set_int("queue-size", 100).unwrap_err();
    assert_eq!(
        (e.errno, &*e.msg),
        (libc::EINVAL, "queue_size must be a power of two")
    );
    let e = b.set_int("queue-size", 65536).unwrap_err();
    assert_eq!(&*e.msg, "queue_size must be smaller than 32768");
    b.set_int("num-queues", 3).unwrap();
    let e = b.start().unwrap_err();
    assert_eq!(
        (e.errno, &*e.msg),
        (
            libc::EINVAL,
            "num_queues + num_poll_queues must not be greater than 2"
        )
    );
}

#[test]
fn data_reaches_the_file_through_every_request_type() {
    let dir = TempDir::new("data");
    let mut d = Daemon::start(&dir.0, 2, true);
    let mut b = connect(d.path());
    b.set_int("num-queues", 1).unwrap();
    b.set_int("num-poll-queues", 1).unwrap();
    b.start().unwrap();
    let r = b.alloc_mem_region(1 << 20).unwrap();
    b.map_mem_region(&r).unwrap();
    let mut expect = vec![0u8; SIZE];
    let a = pattern(65536, 1);
    let bpat = pattern(65536, 2);
    {
        let q = b.queue(0, false).unwrap();
        assert!(q.completion_fd().is_some());
        // SAFETY: region is live and not in use.
        let s = unsafe { r.as_mut_slice() };
        s[..65536].copy_from_slice(&a);
        let c = run_one(&mut **q, rw(true, 0, r.addr, 65536, ReqFlags::NONE));
        assert_eq!(c.ret, 0, "{:?}", c.error_msg());
        expect[..65536].copy_from_slice(&a);
        s[65536..131072].copy_from_slice(&bpat);
        // SAFETY: inside the region.
        let p2 = unsafe { r.addr.add(65536) };
        let c = run_one(&mut **q, rw(true, 1 << 20, p2, 65536, ReqFlags::FUA));
        assert_eq!(c.ret, 0, "FUA write: {:?}", c.error_msg());
        expect[1 << 20..(1 << 20) + 65536].copy_from_slice(&bpat);
        // Read back into another part of the region.
        // SAFETY: inside the region.
        let p3 = unsafe { r.addr.add(262144) };
        let c = run_one(&mut **q, rw(false, 0, p3, 65536, ReqFlags::NONE));
        assert_eq!(c.ret, 0);
        // SAFETY: no request in flight.
        assert_eq!(&unsafe { r.as_slice() }[262144..262144 + 65536], &a[..]);
        // Readv of three segments.
        let iov: Vec<libc::iovec> = (0..3)
            .map(|i| libc::iovec {
                // SAFETY: inside the region.
                iov_base: unsafe { r.addr.add(524288 + i * 8192) }.cast(),
                iov_len: 4096,
            })
            .collect();
        let req = Request::new(
            Op::Readv {
                offset: 1 << 20,
                iov: iov.as_ptr(),
                iovcnt: 3,
            },
            7,
            ReqFlags::NONE,
        );
        assert_eq!(run_one(&mut **q, req).ret, 0);
        for i in 0..3 {
            // SAFETY: no request in flight.
            let got = &unsafe { r.as_slice() }[524288 + i * 8192..][..4096];
            assert_eq!(got, &bpat[i * 4096..(i + 1) * 4096], "segment {i}");
        }
        let wz = Request::new(
            Op::WriteZeroes {
                offset: 4096,
                len: 8192,
            },
            1,
            ReqFlags::FUA,
        );
        assert_eq!(run_one(&mut **q, wz).ret, 0);
        expect[4096..12288].fill(0);
        let wz = Request::new(
            Op::WriteZeroes {
                offset: 1 << 20,
                len: 4096,
            },
            2,
            ReqFlags::NO_UNMAP,
        );
        assert_eq!(run_one(&mut **q, wz).ret, 0);
        expect[1 << 20..(1 << 20) + 4096].fill(0);
        let c = run_one(
            &mut **q,
            Request::new(
                Op::Discard {
                    offset: 8 << 20,
                    len: 65536,
                },
                3,
                ReqFlags::NONE,
            ),
        );
        assert_eq!(c.ret, 0);
        assert_eq!(
            run_one(&mut **q, Request::new(Op::Flush, 4, ReqFlags::NONE)).ret,
            0
        );
        // Misaligned offset and a read past the end: libblkio's errors.
        let c = run_one(&mut **q, rw(false, 1, p3, 512, ReqFlags::NONE));
        assert_eq!(c.ret, -libc::EINVAL);
        assert_eq!(
            c.error_msg().unwrap().to_str().unwrap(),
            "invalid start offset"
        );
        let c = run_one(&mut **q, rw(false, SIZE as u64, p3, 512, ReqFlags::NONE));
        assert_eq!(c.ret, -libc::EIO);
        let c = run_one(
            &mut **q,
            Request::new(
                Op::Zone(snapblk_core::ZoneOp::Report {
                    offset: 0,
                    zones: std::ptr::null_mut(),
                    nr_zones: 0,
                }),
                5,
                ReqFlags::NONE,
            ),
        );
        assert_eq!(c.ret, -libc::ENOTSUP);
    }
    {
        // The poll queue: no completion fd, same data.
        let q = b.queue(0, true).unwrap();
        assert!(q.completion_fd().is_none());
        // SAFETY: inside the region.
        let p = unsafe { r.addr.add(655360) };
        assert_eq!(
            run_one(&mut **q, rw(false, 0, p, 4096, ReqFlags::NONE)).ret,
            0
        );
        // SAFETY: no request in flight.
        let got = unsafe { r.as_slice() };
        assert_eq!(&got[655360..655360 + 4096], &expect[..4096]);
    }
    drop(b);
    d.stop();
    let got = std::fs::read(&d.img).unwrap();
    assert_eq!(got.len(), SIZE);
    // The discarded range is unspecified; everything else must match.
    let mut got = got;
    got[8 << 20..(8 << 20) + 65536].fill(0);
    assert!(got == expect, "file contents differ from what was written");
}

#[test]
fn many_requests_in_flight_on_two_queues_from_two_threads() {
    let dir = TempDir::new("mq");
    let mut d = Daemon::start(&dir.0, 2, true);
    let mut b = connect(d.path());
    b.set_int("num-queues", 2).unwrap();
    b.set_int("queue-size", 16).unwrap();
    b.start().unwrap();
    let r = b.alloc_mem_region(2 << 20).unwrap();
    b.map_mem_region(&r).unwrap();
    // SAFETY: fresh region, no I/O yet.
    let s = unsafe { r.as_mut_slice() };
    let data = pattern(2 << 20, 9);
    s.copy_from_slice(&data);
    let qs: Vec<Box<dyn Queue>> = (0..2).map(|i| b.take_queue(i, false).unwrap()).collect();
    let addr = r.addr as usize;
    let hs: Vec<_> = qs
        .into_iter()
        .enumerate()
        .map(|(qi, mut q)| {
            std::thread::spawn(move || {
                // 128 writes of 8 KiB per queue, more than the 16-entry ring holds at once.
                for i in 0..128usize {
                    let off = (qi * 128 + i) * 8192;
                    let req = rw(
                        true,
                        off as u64,
                        (addr + off) as *mut u8,
                        8192,
                        ReqFlags::NONE,
                    );
                    // SAFETY: the region outlives the threads (joined below) and is only read.
                    unsafe { q.enqueue(req) };
                }
                let mut c = vec![Completion::default(); 256];
                let mut got = 0;
                while got < 128 {
                    let mut t = Duration::from_secs(20);
                    let n = q.do_io(&mut c, 1, Some(&mut t), None).unwrap();
                    for x in &c[..n] {
                        assert_eq!(x.ret, 0);
                    }
                    got += n;
                }
                q
            })
        })
        .collect();
    let qs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    drop(qs);
    drop(b);
    d.stop();
    let got = std::fs::read(&d.img).unwrap();
    assert!(got[..2 << 20] == data[..], "file differs");
}

#[test]
fn the_conformance_suite_passes_on_vhost_user() {
    let dir = TempDir::new("conf");
    let d = Daemon::start(&dir.0, 2, true);
    let b = connect(d.path());
    let opts = Options {
        expect: Expect {
            capacity: Some(SIZE as u64),
            read_only: Some(false),
            ..Expect::default()
        },
        queues: 2,
        ..Options::default()
    };
    let rep = snapblk_conformance::run(b, &opts);
    for (n, o) in &rep.checks {
        eprintln!("{n}: {o:?}");
    }
    assert!(rep.passed(), "failed: {:?}", rep.failed());
}

#[test]
fn bad_buffers_and_regions_fail_at_once_and_the_backend_keeps_serving() {
    let dir = TempDir::new("bad");
    let d = Daemon::start(&dir.0, 1, true);
    let mut b = connect(d.path());
    b.start().unwrap();
    let anon = MemRegion::alloc_private(4096).unwrap();
    let e = b.map_mem_region(&anon).unwrap_err();
    assert_eq!(
        (e.errno, &*e.msg),
        (libc::EIO, "Bad file descriptor (os error 9)")
    );
    let r = b.alloc_mem_region(65536).unwrap();
    b.map_mem_region(&r).unwrap();
    let q = b.queue(0, false).unwrap();
    let c = run_one(&mut **q, rw(true, 0, anon.addr, 4096, ReqFlags::NONE));
    assert_eq!(c.ret, -libc::EFAULT);
    assert_eq!(
        c.error_msg().unwrap().to_str().unwrap(),
        "buffer is not inside a mapped memory region"
    );
    // A buffer that starts inside the region and runs past its end.
    // SAFETY: the pointer is only passed, never dereferenced by the refused request.
    let tail = unsafe { r.addr.add(61440) };
    assert_eq!(
        run_one(&mut **q, rw(false, 0, tail, 8192, ReqFlags::NONE)).ret,
        -libc::EFAULT
    );
    let c = run_one(&mut **q, rw(false, 0, r.addr, 100, ReqFlags::NONE));
    assert_eq!(c.ret, -libc::EINVAL);
    // The backend still serves the device.
    assert_eq!(
        run_one(&mut **q, rw(false, 0, r.addr, 4096, ReqFlags::NONE)).ret,
        0
    );
    b.unmap_mem_region(&r);
    let q = b.queue(0, false).unwrap();
    assert_eq!(
        run_one(&mut **q, rw(false, 0, r.addr, 4096, ReqFlags::NONE)).ret,
        -libc::EFAULT
    );
    // SAFETY: allocated above, never used by a request that is still in flight.
    unsafe { anon.free() };
}

#[test]
fn a_socket_that_is_not_vhost_user_is_a_clear_error() {
    let dir = TempDir::new("notvu");
    let path = dir.0.join("other.sock");
    let l = UnixListener::bind(&path).unwrap();
    // A peer that greets with text (as an NBD or SSH server would) and then stays silent.
    let h = std::thread::spawn(move || {
        use std::io::Write;
        let (mut s, _) = l.accept().unwrap();
        s.write_all(b"NBDMAGICIHAVEOPT and some more bytes\n")
            .unwrap();
        std::thread::sleep(Duration::from_secs(1));
    });
    let mut b = Blkio::new(Box::new(VhostUserDriver::new()));
    b.set_str("path", path.to_str().unwrap()).unwrap();
    let e = b.connect().unwrap_err();
    assert_eq!(e.errno, libc::EIO);
    assert!(e.msg.contains("not vhost-user"), "{}", e.msg);
    h.join().unwrap();
    let e = {
        let mut b = Blkio::new(Box::new(VhostUserDriver::new()));
        b.set_str("path", dir.0.join("missing.sock").to_str().unwrap())
            .unwrap();
        b.connect().unwrap_err()
    };
    assert_eq!(e.errno, libc::ENOENT, "{}", e.msg);
}

#[test]
fn a_backend_killed_mid_io_fails_pending_and_new_requests_promptly() {
    let dir = TempDir::new("kill");
    let mut d = Daemon::start(&dir.0, 1, true);
    let mut b = connect(d.path());
    b.start().unwrap();
    let r = b.alloc_mem_region(1 << 20).unwrap();
    b.map_mem_region(&r).unwrap();
    let q = b.queue(0, false).unwrap();
    for i in 0..64u64 {
        // SAFETY: inside the region, which outlives the requests.
        let p = unsafe { r.addr.add((i as usize % 64) * 16384) };
        // SAFETY: the region outlives every completion (reaped below).
        unsafe { q.enqueue(rw(true, i * 16384, p, 16384, ReqFlags::NONE)) };
    }
    d.stop();
    let mut c = vec![Completion::default(); 64];
    let mut done = 0;
    let mut failed = 0;
    while done < 64 {
        let mut t = Duration::from_secs(20);
        let n = q
            .do_io(&mut c, 1, Some(&mut t), None)
            .expect("do_io must not time out");
        failed += c[..n].iter().filter(|x| x.ret == -libc::EIO).count();
        done += n;
    }
    assert!(failed > 0, "the writes after the kill must fail");
    let c = run_one(&mut **q, rw(false, 0, r.addr, 4096, ReqFlags::NONE));
    assert_eq!(c.ret, -libc::EIO);
    assert_eq!(
        c.error_msg().unwrap().to_str().unwrap(),
        "vhost-user backend disconnected"
    );
}

#[test]
fn the_completion_fd_fires_once_enabled_and_stays_quiet_before() {
    let dir = TempDir::new("cfd");
    let d = Daemon::start(&dir.0, 2, true);
    let mut b = connect(d.path());
    b.set_int("num-poll-queues", 1).unwrap();
    b.start().unwrap();
    let r = b.alloc_mem_region(65536).unwrap();
    b.map_mem_region(&r).unwrap();
    let pq = b.queue(0, true).unwrap();
    assert_eq!(
        run_one(&mut **pq, rw(false, 0, r.addr, 4096, ReqFlags::NONE)).ret,
        0
    );
    let q = b.queue(0, false).unwrap();
    let fd = q.completion_fd().unwrap();
    let readable = |ms: i32| {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    };
    for round in 0..3 {
        // A few requests through `do_io` first, as a program does before it turns to the fd.
        for _ in 0..3 {
            assert_eq!(
                run_one(&mut **q, rw(false, 0, r.addr, 4096, ReqFlags::NONE)).ret,
                0
            );
        }
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 (resets the eventfd).
        unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
        q.set_completion_fd_enabled(true);
        // SAFETY: inside the mapped region, which outlives the request.
        unsafe { q.enqueue(rw(false, 4096, r.addr, 4096, ReqFlags::NONE)) };
        assert_eq!(q.do_io(&mut [], 0, None, None).unwrap(), 0);
        assert!(
            readable(5000),
            "round {round}: the completion fd did not fire"
        );
        let c = run_one_reaped(&mut **q);
        assert_eq!(c.ret, 0);
        q.set_completion_fd_enabled(false);
    }
}

fn run_one_reaped(q: &mut dyn Queue) -> Completion {
    let mut c = [Completion::default()];
    let mut t = Duration::from_secs(20);
    assert_eq!(q.do_io(&mut c, 1, Some(&mut t), None).unwrap(), 1);
    c[0]
}

#[test]
fn more_iovecs_than_max_segments_are_refused() {
    let dir = TempDir::new("segs");
    let d = Daemon::start(&dir.0, 1, true);
    let mut b = connect(d.path());
    let max = b.get_int("max-segments").unwrap() as usize;
    assert_eq!(max, 126, "qemu-storage-daemon 7.2's seg_max");
    b.start().unwrap();
    let r = b.alloc_mem_region((max + 1) * 512).unwrap();
    b.map_mem_region(&r).unwrap();
    let iov: Vec<libc::iovec> = (0..=max)
        .map(|i| libc::iovec {
            // SAFETY: inside the region.
            iov_base: unsafe { r.addr.add(i * 512) }.cast(),
            iov_len: 512,
        })
        .collect();
    let q = b.queue(0, false).unwrap();
    for (n, want) in [(max, 0), (max + 1, -libc::EINVAL)] {
        let req = Request::new(
            Op::Readv {
                offset: 0,
                iov: iov.as_ptr(),
                iovcnt: n as i32,
            },
            n,
            ReqFlags::NONE,
        );
        assert_eq!(run_one(&mut **q, req).ret, want, "{n} iovecs");
    }
}

#[test]
fn a_poll_queue_notices_a_dead_backend_too() {
    let dir = TempDir::new("killpoll");
    let mut d = Daemon::start(&dir.0, 2, true);
    let mut b = connect(d.path());
    b.set_int("num-queues", 0).unwrap();
    b.set_int("num-poll-queues", 1).unwrap();
    b.start().unwrap();
    let r = b.alloc_mem_region(65536).unwrap();
    b.map_mem_region(&r).unwrap();
    let q = b.queue(0, true).unwrap();
    assert_eq!(
        run_one(&mut **q, rw(false, 0, r.addr, 4096, ReqFlags::NONE)).ret,
        0
    );
    d.stop();
    let c = run_one(&mut **q, rw(false, 0, r.addr, 4096, ReqFlags::NONE));
    assert_eq!(c.ret, -libc::EIO);
    assert_eq!(
        c.error_msg().unwrap().to_str().unwrap(),
        "vhost-user backend disconnected"
    );
}

/// A device with `reconnect` on, started with two queues, a 1 MiB region holding a pattern,
/// three reads per queue (the ring indexes move), and 32 writes of 16 KiB per queue sent to a
/// frozen daemon (so all of them are on the rings), which is then killed.
fn writes_in_flight_when_the_backend_dies(d: &mut Daemon) -> (Blkio, MemRegion, Vec<u8>) {
    let mut b = Blkio::new(Box::new(VhostUserDriver::new()));
    b.set_str("path", d.path()).unwrap();
    b.set_bool("reconnect", true).unwrap();
    b.connect().unwrap();
    b.set_int("num-queues", 2).unwrap();
    b.start().unwrap();
    let r = b.alloc_mem_region(2 << 20).unwrap();
    b.map_mem_region(&r).unwrap();
    let data = pattern(1 << 20, 5);
    // SAFETY: fresh region, no I/O yet.
    let s = unsafe { r.as_mut_slice() };
    s[..1 << 20].copy_from_slice(&data);
    // Some I/O first, so that the ring indexes are not at zero when the backend dies.
    for qi in 0..2 {
        let q = b.queue(qi, false).unwrap();
        for _ in 0..3 {
            // SAFETY: inside the region, which outlives the request.
            let p = unsafe { r.addr.add(1 << 20) };
            let c = run_one(&mut **q, rw(false, 0, p, 4096, ReqFlags::NONE));
            assert_eq!(c.ret, 0);
        }
    }
    d.freeze();
    for qi in 0..2 {
        let q = b.queue(qi, false).unwrap();
        for i in 0..32usize {
            let off = (qi * 32 + i) * 16384;
            // SAFETY: inside the region, which outlives the requests.
            let p = unsafe { r.addr.add(off) };
            // SAFETY: the region outlives every completion (reaped by the callers).
            unsafe { q.enqueue(rw(true, off as u64, p, 16384, ReqFlags::NONE)) };
        }
        let mut c = [Completion::default()];
        assert_eq!(
            q.do_io(&mut c, 0, None, None).unwrap(),
            0,
            "daemon is frozen"
        );
        assert_eq!(q.outstanding(), 32);
    }
    d.stop();
    (b, r, data)
}

/// Reap `n` completions of `q`, however long reconnecting takes (at most its 10 s limit).
fn reap_all(q: &mut dyn Queue, n: usize) -> Vec<Completion> {
    let mut all = Vec::new();
    let mut c = vec![Completion::default(); n];
    while all.len() < n {
        let mut t = Duration::from_secs(60);
        let k = q
            .do_io(&mut c, 1, Some(&mut t), None)
            .expect("do_io must not time out");
        all.extend_from_slice(&c[..k]);
    }
    all
}

#[test]
fn with_reconnect_a_restarted_backend_gets_the_requests_in_flight_again() {
    let dir = TempDir::new("reconnect");
    let mut d = Daemon::start(&dir.0, 2, true);
    let (mut b, r, data) = writes_in_flight_when_the_backend_dies(&mut d);
    // A new daemon on the same socket path and image file.
    std::fs::remove_file(&d.sock).unwrap();
    let mut d2 = Daemon::start(&dir.0, 2, true);
    for qi in 0..2 {
        let q = b.queue(qi, false).unwrap();
        for c in reap_all(&mut **q, 32) {
            assert_eq!(c.ret, 0, "queue {qi}: {:?}", c.error_msg());
        }
    }
    // Later requests on both queues: read everything back into the region's second half.
    for qi in 0..2 {
        let q = b.queue(qi, false).unwrap();
        let off = qi * (512 << 10);
        // SAFETY: inside the region, which outlives the request.
        let p = unsafe { r.addr.add((1 << 20) + off) };
        let c = run_one(
            &mut **q,
            rw(false, off as u64, p, 512 << 10, ReqFlags::NONE),
        );
        assert_eq!(c.ret, 0);
    }
    // SAFETY: no request in flight any more.
    let back = unsafe { r.as_mut_slice() }[1 << 20..].to_vec();
    assert!(back == data, "data read after the reconnect differs");
    drop(b);
    d2.stop();
    let got = std::fs::read(&d2.img).unwrap();
    assert!(got[..1 << 20] == data[..], "file differs");
    assert!(got[1 << 20..].iter().all(|&x| x == 0), "beyond the writes");
}

#[test]
fn with_reconnect_and_no_restart_requests_fail_with_eio_after_the_limit() {
    let dir = TempDir::new("noreconnect");
    let mut d = Daemon::start(&dir.0, 2, true);
    let (mut b, r, _) = writes_in_flight_when_the_backend_dies(&mut d);
    std::fs::remove_file(&d.sock).unwrap();
    let msg = "vhost-user backend disconnected and reconnecting failed";
    for qi in 0..2 {
        let q = b.queue(qi, false).unwrap();
        for c in reap_all(&mut **q, 32) {
            assert_eq!(c.ret, -libc::EIO);
            assert_eq!(c.error_msg().unwrap().to_str().unwrap(), msg);
        }
        // Later requests fail at once.
        let c = run_one(&mut **q, rw(false, 0, r.addr, 4096, ReqFlags::NONE));
        assert_eq!(c.ret, -libc::EIO);
    }
}

#[test]
fn with_reconnect_a_poll_queue_reconnects_too() {
    let dir = TempDir::new("pollreconnect");
    let mut d = Daemon::start(&dir.0, 2, true);
    let mut b = Blkio::new(Box::new(VhostUserDriver::new()));
    b.set_str("path", d.path()).unwrap();
    b.set_bool("reconnect", true).unwrap();
    b.connect().unwrap();
    b.set_int("num-queues", 0).unwrap();
    b.set_int("num-poll-queues", 1).unwrap();
    b.start().unwrap();
    let r = b.alloc_mem_region(1 << 20).unwrap();
    b.map_mem_region(&r).unwrap();
    let data = pattern(65536, 77);
    // SAFETY: fresh region, no I/O yet.
    let s = unsafe { r.as_mut_slice() };
    s[..65536].copy_from_slice(&data);
    d.stop();
    std::fs::remove_file(&d.sock).unwrap();
    let mut d2 = Daemon::start(&dir.0, 2, true);
    let q = b.queue(0, true).unwrap();
    let c = run_one(&mut **q, rw(true, 4 << 20, r.addr, 65536, ReqFlags::NONE));
    assert_eq!(c.ret, 0, "{:?}", c.error_msg());
    // SAFETY: inside the region.
    let p = unsafe { r.addr.add(65536) };
    let c = run_one(&mut **q, rw(false, 4 << 20, p, 65536, ReqFlags::NONE));
    assert_eq!(c.ret, 0);
    // SAFETY: no request in flight.
    assert!(unsafe { r.as_mut_slice() }[65536..131072] == data[..]);
    drop(b);
    d2.stop();
    let got = std::fs::read(&d2.img).unwrap();
    assert!(got[4 << 20..(4 << 20) + 65536] == data[..], "file differs");
}
