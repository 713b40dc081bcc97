//! The driver's queues against a local HTTP server whose GETs wait behind a gate the test opens:
//! submission returns while the server holds a read, the completion arrives on the completion
//! fd once it answers, reads reach the server at once, and a queue dropped with reads in
//! flight returns and its workers end. No timing assertions: every wait is for an event the
//! server or the queue reports (bounded only so a broken build fails instead of hanging).

use crate::config::READ_WORKERS;
use crate::driver::RemoteDriver;
use snapblk_core::sync::{lock, wait};
use snapblk_core::{Completion, Driver, Op, PropValue, Queue, ReqFlags, Request, State};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Object size: 64 blocks of 4 KiB.
const LEN: usize = 64 * 4096;

fn byte(i: usize) -> u8 {
    ((i * 7 + 1) % 251) as u8
}

/// What the server does with a GET.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Wait for the gate, then answer 206 with the bytes.
    Serve,
    /// Wait for the gate, then answer 412 (the object changed).
    Changed,
}

#[derive(Default)]
struct Counts {
    /// The gate is open: GETs are answered.
    open: bool,
    /// GETs received and not yet answered.
    active: usize,
    /// The most GETs waiting at once.
    max_active: usize,
    /// GETs received in all.
    gets: usize,
    /// Connections open now.
    conns: usize,
}

struct State2 {
    counts: Mutex<Counts>,
    cv: Condvar,
    mode: Mutex<Mode>,
    stop: AtomicBool,
}

/// A local HTTP/1.1 server (keep-alive, one thread per connection) of one object with an ETag.
struct Server {
    st: Arc<State2>,
    port: u16,
}

impl Server {
    fn start(mode: Mode) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let st = Arc::new(State2 {
            counts: Mutex::new(Counts::default()),
            cv: Condvar::new(),
            mode: Mutex::new(mode),
            stop: AtomicBool::new(false),
        });
        let st2 = st.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                if st2.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(c) = c else { continue };
                let st3 = st2.clone();
                std::thread::spawn(move || serve_conn(c, &st3));
            }
        });
        Server { st, port }
    }
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/obj.bin", self.port)
    }
    fn set_gate(&self, open: bool) {
        lock(&self.st.counts).open = open;
        self.st.cv.notify_all();
    }
    fn counts<T>(&self, f: impl Fn(&Counts) -> T) -> T {
        f(&lock(&self.st.counts))
    }
    /// Block until `cond` holds of the counts (a minute at most: then the test fails).
    fn wait_for(&self, what: &str, cond: impl Fn(&Counts) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut c = lock(&self.st.counts);
        while !cond(&c) {
            assert!(Instant::now() < deadline, "the server never saw: {what}");
            c = self
                .st
                .cv
                .wait_timeout(c, Duration::from_millis(100))
                .unwrap()
                .0;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.st.stop.store(true, Ordering::SeqCst);
        self.set_gate(true);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve_conn(c: TcpStream, st: &State2) {
    lock(&st.counts).conns += 1;
    let _ = serve_requests(c, st);
    lock(&st.counts).conns -= 1;
    st.cv.notify_all();
}

fn serve_requests(c: TcpStream, st: &State2) -> std::io::Result<()> {
    let mut r = BufReader::new(c.try_clone()?);
    let mut w = c;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let method = line.split_whitespace().next().unwrap_or("").to_owned();
        let mut range = None;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                let (a, b) = v.split_once('-').unwrap();
                range = Some((a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()));
            }
        }
        if method == "HEAD" {
            write!(
                w,
                "HTTP/1.1 200 OK\r\nContent-Length: {LEN}\r\nETag: \"v1\"\r\n\r\n"
            )?;
            continue;
        }
        let (a, b) = range.unwrap_or((0, LEN - 1));
        {
            let mut k = lock(&st.counts);
            k.active += 1;
            k.gets += 1;
            k.max_active = k.max_active.max(k.active);
            st.cv.notify_all();
            while !k.open {
                k = wait(&st.cv, k);
            }
        }
        if *lock(&st.mode) == Mode::Changed {
            write!(
                w,
                "HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n"
            )?;
        } else {
            let body: Vec<u8> = (a..=b).map(byte).collect();
            write!(
                w,
                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {a}-{b}/{LEN}\r\nETag: \"v1\"\r\n\r\n",
                body.len()
            )?;
            w.write_all(&body)?;
        }
        w.flush()?;
        let mut k = lock(&st.counts);
        k.active -= 1;
        st.cv.notify_all();
    }
}

/// The `http` driver on the server's object: 4 KiB blocks, 1 MiB cache, no readahead, no
/// retries, a timeout far beyond any stall here.
fn open(s: &Server) -> (RemoteDriver, Box<dyn Queue>) {
    open_with_timeout(s, 60)
}

/// [`open`] with another `timeout`, in seconds.
fn open_with_timeout(s: &Server, timeout: u64) -> (RemoteDriver, Box<dyn Queue>) {
    let mut d = RemoteDriver::new("http");
    let set = |d: &mut RemoteDriver, k: &str, v: PropValue| {
        d.set_prop(k, v, State::Created).unwrap();
    };
    set(&mut d, "url", PropValue::Str(s.url()));
    set(&mut d, "block-size", PropValue::U64(4096));
    set(&mut d, "cache-size", PropValue::U64(1 << 20));
    set(&mut d, "readahead", PropValue::U64(0));
    set(&mut d, "retries", PropValue::U64(0));
    set(&mut d, "timeout", PropValue::U64(timeout));
    d.connect(true).unwrap();
    let q = d.create_queue(false).unwrap();
    (d, q)
}

fn read(q: &mut dyn Queue, offset: u64, buf: &mut [u8], ud: usize) {
    let op = Op::Read {
        offset,
        buf: buf.as_mut_ptr(),
        len: buf.len(),
    };
    // SAFETY: every test keeps its buffers alive until the completion is reaped or the queue
    // is dropped.
    unsafe { q.enqueue(Request::new(op, ud, ReqFlags::NONE)) };
}

fn expect(offset: u64, buf: &[u8]) -> bool {
    buf.iter()
        .enumerate()
        .all(|(i, &b)| b == byte(offset as usize + i))
}

/// Whether `fd` becomes readable within `ms` milliseconds (-1: wait for it).
fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

fn drain(fd: i32) {
    let mut v = 0u64;
    while readable(fd, 0) {
        // SAFETY: an 8-byte read of an eventfd into a u64.
        unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    }
}

#[test]
fn submit_with_min_zero_returns_while_the_server_stalls_and_the_fd_brings_the_completion() {
    let s = Server::start(Mode::Serve);
    let (_d, mut q) = open(&s);
    let fd = q.completion_fd().unwrap();
    drain(fd);
    let mut buf = vec![0u8; 5000];
    read(&mut *q, 10_000, &mut buf, 7);
    let mut out = [Completion::default(); 4];
    // The gate is shut: the server cannot answer, yet do_io(min 0) returns.
    assert_eq!(q.do_io(&mut out, 0, None, None).unwrap(), 0);
    s.wait_for("the GET", |c| c.active == 1);
    assert_eq!(q.do_io(&mut out, 0, None, None).unwrap(), 0);
    assert!(
        !readable(fd, 0),
        "the fd stays quiet while the server holds the read"
    );
    assert_eq!(q.outstanding(), 1);
    s.set_gate(true);
    assert!(readable(fd, -1));
    drain(fd);
    assert_eq!(q.do_io(&mut out, 0, None, None).unwrap(), 1);
    assert_eq!((out[0].user_data, out[0].ret), (7, 0));
    assert!(expect(10_000, &buf), "the bytes are the server's");
    assert_eq!(q.outstanding(), 0);
    // A readv across blocks that are not cached yet: the worker scatters into the segments.
    s.set_gate(false);
    let (mut a, mut b) = (vec![0u8; 3000], vec![0u8; 9000]);
    let iov = [
        libc::iovec {
            iov_base: a.as_mut_ptr().cast(),
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        },
    ];
    let op = Op::Readv {
        offset: 100_000,
        iov: iov.as_ptr(),
        iovcnt: 2,
    };
    // SAFETY: the buffers and the iovec array outlive the completion.
    unsafe { q.enqueue(Request::new(op, 8, ReqFlags::NONE)) };
    assert_eq!(q.do_io(&mut out, 0, None, None).unwrap(), 0);
    s.wait_for("the readv's GET", |c| c.active == 1);
    s.set_gate(true);
    assert_eq!(q.do_io(&mut out, 1, None, None).unwrap(), 1);
    assert_eq!((out[0].user_data, out[0].ret), (8, 0));
    assert!(expect(100_000, &a) && expect(103_000, &b));
}

#[test]
fn min_completions_waits_for_the_server_and_a_timeout_gives_etime() {
    let s = Server::start(Mode::Serve);
    let (_d, mut q) = open(&s);
    let mut buf = vec![0u8; 4096];
    read(&mut *q, 0, &mut buf, 1);
    let mut out = [Completion::default(); 2];
    s.wait_for("the GET", |c| c.active == 1);
    let mut t = Duration::from_millis(50);
    let e = q.do_io(&mut out, 1, Some(&mut t), None).unwrap_err();
    assert_eq!(
        e.errno,
        libc::ETIME,
        "the server holds the read: the wait times out"
    );
    assert_eq!(t, Duration::ZERO);
    assert_eq!(q.outstanding(), 1);
    s.set_gate(true);
    assert_eq!(q.do_io(&mut out, 1, None, None).unwrap(), 1);
    assert_eq!(out[0].ret, 0);
    assert!(expect(0, &buf));
    // Now cached: with the gate shut again, the same read completes without the server.
    s.set_gate(false);
    let gets = s.counts(|c| c.gets);
    buf.fill(0);
    read(&mut *q, 0, &mut buf, 2);
    assert_eq!(q.do_io(&mut out, 1, None, None).unwrap(), 1);
    assert_eq!((out[0].user_data, out[0].ret), (2, 0));
    assert!(expect(0, &buf));
    assert_eq!(s.counts(|c| c.gets), gets, "a cache hit sends no GET");
}

#[test]
fn reads_in_flight_reach_the_server_at_once() {
    let s = Server::start(Mode::Serve);
    let (d, mut q) = open(&s);
    let n = READ_WORKERS;
    // Every other block: no two reads share a block or continue one another.
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 4096]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        read(&mut *q, (2 * i * 4096) as u64, b, i + 1);
    }
    let mut out = vec![Completion::default(); n];
    assert_eq!(q.do_io(&mut out, 0, None, None).unwrap(), 0);
    s.wait_for("all reads at once", |c| c.active == n);
    assert!(
        s.counts(|c| c.conns) >= n,
        "each read on its own connection"
    );
    assert_eq!(d.pool_watch().unwrap().threads(), n);
    s.set_gate(true);
    assert_eq!(q.do_io(&mut out, n, None, None).unwrap(), n);
    let mut seen: Vec<usize> = out.iter().map(|c| c.user_data).collect();
    seen.sort();
    assert_eq!(seen, (1..=n).collect::<Vec<_>>());
    assert!(out.iter().all(|c| c.ret == 0));
    for (i, b) in bufs.iter().enumerate() {
        assert!(expect((2 * i * 4096) as u64, b), "read {i}");
    }
    assert_eq!(s.counts(|c| c.max_active), n);
    // Twice as many reads as workers: all complete, the pool does not grow.
    s.set_gate(false);
    let mut more: Vec<Vec<u8>> = (0..2 * n).map(|_| vec![0u8; 4096]).collect();
    for (i, b) in more.iter_mut().enumerate() {
        read(&mut *q, ((2 * i + 1) * 4096) as u64, b, i);
    }
    s.wait_for("a full pool of reads", |c| c.active == n);
    s.set_gate(true);
    let mut out = vec![Completion::default(); 2 * n];
    assert_eq!(q.do_io(&mut out, 2 * n, None, None).unwrap(), 2 * n);
    assert!(out.iter().all(|c| c.ret == 0));
    for (i, b) in more.iter().enumerate() {
        assert!(expect(((2 * i + 1) * 4096) as u64, b), "read {i}");
    }
    assert_eq!(d.pool_watch().unwrap().threads(), n);
    assert_eq!(s.counts(|c| c.max_active), n);
}

#[test]
fn reads_of_one_block_share_its_get() {
    let s = Server::start(Mode::Serve);
    let (d, mut q) = open(&s);
    let (mut a, mut b) = (vec![0u8; 1000], vec![0u8; 1000]);
    let (oa, ob) = (5 * 4096 + 100, 5 * 4096 + 2000);
    read(&mut *q, oa, &mut a, 1);
    s.wait_for("the first read's GET", |c| c.active == 1);
    read(&mut *q, ob, &mut b, 2);
    // The second read finds block 5 on its way and waits for that GET.
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.waited() == 0 {
        assert!(Instant::now() < deadline, "the second read never waited");
        std::thread::sleep(Duration::from_millis(5));
    }
    s.set_gate(true);
    let mut out = [Completion::default(); 2];
    assert_eq!(q.do_io(&mut out, 2, None, None).unwrap(), 2);
    assert!(out.iter().all(|c| c.ret == 0));
    assert!(expect(oa, &a) && expect(ob, &b));
    assert_eq!(s.counts(|c| c.gets), 1, "one GET for both reads");
}

#[test]
fn dropping_queue_and_device_with_reads_in_flight_returns_and_the_workers_end() {
    let s = Server::start(Mode::Serve);
    let (d, mut q) = open(&s);
    let watch = d.pool_watch().unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..3).map(|_| vec![0xaau8; 4096]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        read(&mut *q, (2 * i * 4096) as u64, b, i);
    }
    s.wait_for("three reads", |c| c.active == 3);
    // The server holds all three: the drops must not wait for it.
    drop(q);
    drop(d);
    s.set_gate(true);
    let deadline = Instant::now() + Duration::from_secs(60);
    while watch.threads() > 0 {
        assert!(Instant::now() < deadline, "the workers never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        bufs.iter().all(|b| b.iter().all(|&x| x == 0xaa)),
        "no worker wrote into a dropped queue's buffers"
    );
}

#[test]
fn a_failed_read_completes_with_its_errno() {
    let s = Server::start(Mode::Changed);
    let (_d, mut q) = open(&s);
    s.set_gate(true);
    let mut buf = vec![0u8; 4096];
    read(&mut *q, 8192, &mut buf, 3);
    let mut out = [Completion::default(); 1];
    assert_eq!(q.do_io(&mut out, 1, None, None).unwrap(), 1);
    assert_eq!(
        (out[0].user_data, out[0].ret),
        (3, -libc::ESTALE),
        "a replaced object (HTTP 412) fails the read with ESTALE"
    );
    // Requests the driver refuses complete at once, as before.
    read(&mut *q, LEN as u64 - 10, &mut buf, 4);
    let op = Op::Write {
        offset: 0,
        buf: buf.as_ptr(),
        len: 512,
    };
    // SAFETY: `buf` outlives the completion.
    unsafe { q.enqueue(Request::new(op, 5, ReqFlags::NONE)) };
    let mut out = [Completion::default(); 2];
    assert_eq!(q.do_io(&mut out, 2, None, None).unwrap(), 2);
    assert_eq!((out[0].user_data, out[0].ret), (4, -libc::EIO));
    assert_eq!((out[1].user_data, out[1].ret), (5, -libc::EBADF));
}

#[test]
fn a_read_the_server_never_answers_on_a_kept_alive_connection_times_out() {
    let s = Server::start(Mode::Serve);
    let (_d, mut q) = open_with_timeout(&s, 1);
    let mut out = [Completion::default(); 2];
    // A first read, answered: its connection goes back to the client's pool.
    s.set_gate(true);
    let mut buf = vec![0u8; 4096];
    read(&mut *q, 0, &mut buf, 1);
    assert_eq!(q.do_io(&mut out, 1, None, None).unwrap(), 1);
    assert_eq!(out[0].ret, 0);
    // The next GET goes out on a kept-alive connection, and the server never answers it.
    s.set_gate(false);
    read(&mut *q, 8 * 4096, &mut buf, 2);
    s.wait_for("the held GET", |c| c.active == 1);
    assert_eq!(
        s.counts(|c| c.conns),
        1,
        "the held GET came on the kept-alive connection"
    );
    // It fails after its bound (1 s + 4 KiB at the slowest rate) instead of waiting for the
    // server. A minute is only this test's own guard against a hang.
    let mut t = Duration::from_secs(60);
    let n = q.do_io(&mut out, 1, Some(&mut t), None);
    assert_eq!(n.ok(), Some(1), "the held read completes with an error");
    assert_eq!(out[0].user_data, 2);
    assert_eq!(
        out[0].ret,
        -libc::EHOSTUNREACH,
        "a timeout is a transport error"
    );
}
