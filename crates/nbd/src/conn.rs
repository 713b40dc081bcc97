//! The transmission phase of one connection.
//!
//! Two threads per connection: the reader parses requests (and reads write payloads) and hands
//! them over a bounded channel; the I/O thread owns the connection's queue, keeps several
//! requests in flight on it, and writes replies as completions arrive. Memory a client can pin
//! is bounded by a byte budget ([`Credits`]) and the channel/slot limits.

use crate::buf::{AlignedBuf, BufPool};
use crate::device::Geometry;
use crate::events::ConnReason;
use crate::net::Stream;
use crate::proto::{self, *};
use crate::server::{Export, ServerConfig};
use snapblk_core::sync::{lock, wait};
use snapblk_core::{Completion, IoDir, IoStats, Op, Queue, ReqFlags, Request};
use std::io::{IoSlice, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// A byte budget shared by the reader (acquire) and the I/O thread (release).
struct Credits {
    state: Mutex<(usize, bool)>, // (bytes in use, closed)
    cv: Condvar,
    max: usize,
}

impl Credits {
    fn new(max: usize) -> Credits {
        Credits {
            state: Mutex::new((0, false)),
            cv: Condvar::new(),
            max,
        }
    }
    /// Wait until `n` bytes fit (one request always fits when nothing else is held).
    fn acquire(&self, n: usize) -> bool {
        let mut g = lock(&self.state);
        while !g.1 && g.0 > 0 && g.0 + n > self.max {
            g = wait(&self.cv, g);
        }
        if g.1 {
            return false;
        }
        g.0 += n;
        true
    }
    fn release(&self, n: usize) {
        let mut g = lock(&self.state);
        g.0 = g.0.saturating_sub(n);
        self.cv.notify_all();
    }
    fn close(&self) {
        lock(&self.state).1 = true;
        self.cv.notify_all();
    }
}

/// What the reader hands the I/O thread.
enum Msg {
    /// A validated request; `buf` holds a write's payload or receives a read's data.
    Io {
        hdr: RequestHeader,
        buf: Option<AlignedBuf>,
        credit: usize,
    },
    /// Reply at once with this error (0 = success with no data).
    Reply { cookie: u64, error: u32 },
}

/// How the reader judged a request header.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Execute it.
    Run,
    /// Reply with this error (after consuming a write payload, if any).
    Fail(u32),
    /// Reply success without touching the device (zero-length requests).
    Noop,
    /// Close the connection (the request stream cannot be trusted or resynchronised).
    Close,
}

/// Judge a request against the export. Pure, so it is unit-tested and fuzzed.
pub(crate) fn judge(h: &RequestHeader, g: &Geometry, read_only: bool, max_request: u32) -> Verdict {
    let allowed = match h.cmd {
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        _ => CMD_FLAG_FUA,
    };
    let len = h.len as u64;
    let end_ok = h.offset.checked_add(len).is_some_and(|e| e <= g.size);
    let aligned =
        h.offset.is_multiple_of(g.min_block as u64) && len.is_multiple_of(g.min_block as u64);
    match h.cmd {
        CMD_WRITE if h.len > max_request => Verdict::Close,
        _ if h.flags & !allowed != 0 => Verdict::Fail(EINVAL),
        CMD_READ => {
            if h.len > max_request || !end_ok || !aligned {
                Verdict::Fail(EINVAL)
            } else if h.len == 0 {
                Verdict::Noop
            } else {
                Verdict::Run
            }
        }
        CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES => {
            if read_only {
                Verdict::Fail(EPERM)
            } else if !end_ok {
                Verdict::Fail(if h.cmd == CMD_TRIM { EINVAL } else { ENOSPC })
            } else if !aligned {
                Verdict::Fail(EINVAL)
            } else if h.len == 0 {
                Verdict::Noop
            } else {
                Verdict::Run
            }
        }
        CMD_FLUSH => Verdict::Run,
        _ => Verdict::Fail(EINVAL),
    }
}

/// Serve requests on an established connection until the client disconnects or the server
/// stops; everything in flight is completed and answered before returning.
/// Returns why the connection ended.
pub(crate) fn transmit(
    stream: Stream,
    ex: &Export,
    cfg: &ServerConfig,
    stop: &AtomicBool,
) -> ConnReason {
    let mut lease = match ex.device.lease(stop) {
        Ok(l) => l,
        Err(e) => return ConnReason::Lease(e),
    };
    let rstream = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => return ConnReason::Io(e),
    };
    let ctl = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => return ConnReason::Io(e),
    };
    let geo = *ex.device.geometry();
    let read_only = ex.read_only || geo.read_only;
    let pool = BufPool::new(geo.buf_align.max(64), cfg.max_inflight_bytes);
    let credits = Credits::new(cfg.max_inflight_bytes);
    let (tx, rx) = sync_channel::<Msg>(cfg.max_inflight);
    let reason = std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("nbd-read".into())
            .spawn_scoped(s, || {
                read_loop(
                    rstream,
                    tx,
                    &geo,
                    read_only,
                    cfg.max_request,
                    &pool,
                    &credits,
                )
            });
        let reader = match reader {
            Ok(r) => r,
            Err(e) => return ConnReason::Spawn(e),
        };
        let mut io = IoLoop {
            q: lease.queue(),
            out: ReplyWriter {
                s: stream,
                buf: Vec::with_capacity(REPLY_BUF),
            },
            pool: &pool,
            credits: &credits,
            geo,
            slots: (0..cfg.max_inflight).map(|_| None).collect(),
            free: (0..cfg.max_inflight).rev().collect(),
            dead: false,
            durable: Durability::default(),
            stats: ex.device.stats(),
        };
        ex.device.stats().connection_opened();
        let failed = io.run(&rx);
        ex.device.stats().connection_closed();
        // Unblock the reader wherever it waits: on the socket, the channel or the budget.
        credits.close();
        drop(rx);
        let _ = ctl.shutdown(Shutdown::Both);
        let ended = reader.join().unwrap_or(ConnReason::ClientClosed);
        failed.unwrap_or(ended)
    });
    match reason {
        // The server shut the socket down itself.
        ConnReason::ClientClosed | ConnReason::Io(_) if stop.load(Ordering::SeqCst) => {
            ConnReason::Stopped
        }
        r => r,
    }
}

/// Why reading from the client ended: EOF and resets are the client leaving.
fn read_failed(e: std::io::Error) -> ConnReason {
    use std::io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => {
            ConnReason::ClientClosed
        }
        _ => ConnReason::Io(e),
    }
}

fn read_loop(
    mut s: Stream,
    tx: SyncSender<Msg>,
    g: &Geometry,
    read_only: bool,
    max_request: u32,
    pool: &BufPool,
    credits: &Credits,
) -> ConnReason {
    let mut hb = [0u8; proto::REQUEST_LEN];
    loop {
        if let Err(e) = s.read_exact(&mut hb) {
            return read_failed(e);
        }
        let h = match RequestHeader::parse(&hb) {
            Ok(h) => h,
            Err(e) => return ConnReason::BadRequest(e),
        };
        if h.cmd == CMD_DISC {
            return ConnReason::Disc;
        }
        let verdict = judge(&h, g, read_only, max_request);
        let len = h.len as usize;
        let has_payload = h.cmd == CMD_WRITE;
        let msg = match verdict {
            Verdict::Close => {
                return ConnReason::WriteTooBig {
                    len: h.len,
                    max: max_request,
                };
            }
            Verdict::Fail(e) => {
                if has_payload && let Err(e) = skip(&mut s, len) {
                    return read_failed(e);
                }
                Msg::Reply {
                    cookie: h.cookie,
                    error: e,
                }
            }
            Verdict::Noop => Msg::Reply {
                cookie: h.cookie,
                error: 0,
            },
            Verdict::Run => {
                let data = matches!(h.cmd, CMD_READ | CMD_WRITE);
                let credit = if data { len } else { 0 };
                if !credits.acquire(credit) {
                    // Only after the I/O side has ended (a failed device queue).
                    return ConnReason::ClientClosed;
                }
                let buf = if data {
                    let mut b = pool.get(len);
                    if has_payload && let Err(e) = s.read_exact(b.slice_mut(len)) {
                        return read_failed(e);
                    }
                    Some(b)
                } else {
                    None
                };
                Msg::Io {
                    hdr: h,
                    buf,
                    credit,
                }
            }
        };
        if tx.send(msg).is_err() {
            return ConnReason::ClientClosed;
        }
    }
}

/// Read and drop `n` payload bytes (bounded by the caller's max request check).
fn skip(s: &mut Stream, mut n: usize) -> std::io::Result<()> {
    let mut b = [0u8; 8192];
    while n > 0 {
        let k = n.min(b.len());
        s.read_exact(&mut b[..k])?;
        n -= k;
    }
    Ok(())
}

/// Small replies are batched in a buffer; a large read reply goes out with whatever is buffered
/// in one `writev`, so it costs one system call and no copy.
const REPLY_BUF: usize = 256 << 10;
const SMALL_DATA: usize = 16 << 10;

struct ReplyWriter {
    s: Stream,
    buf: Vec<u8>,
}

impl ReplyWriter {
    fn reply(&mut self, header: &[u8], data: &[u8]) -> std::io::Result<()> {
        self.buf.extend_from_slice(header);
        if data.len() <= SMALL_DATA {
            self.buf.extend_from_slice(data);
            if self.buf.len() >= REPLY_BUF {
                self.flush()?;
            }
            return Ok(());
        }
        let (mut a, mut b) = (&self.buf[..], data);
        while !a.is_empty() || !b.is_empty() {
            let n = match self.s.write_vectored(&[IoSlice::new(a), IoSlice::new(b)]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let from_a = n.min(a.len());
            a = &a[from_a..];
            b = &b[n - from_a..];
        }
        self.buf.clear();
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let r = self.s.write_all(&self.buf);
            self.buf.clear();
            r?;
        }
        Ok(())
    }
}

/// One request in flight (possibly split into several device requests).
struct Slot {
    cookie: u64,
    buf: Option<AlignedBuf>,
    /// Bytes of data to send back (reads).
    read_len: usize,
    /// Device requests still outstanding.
    parts: u32,
    error: u32,
    credit: usize,
    /// Send a flush once the parts are done (FUA on a TRIM).
    flush_after: bool,
    /// A write, trim or write-zeroes: counted in [`Durability`] when it completes.
    modifies: bool,
    /// A flush: the [`Durability::done`] count it was issued at.
    flush_covers: Option<u64>,
    /// What the request counts as in the export's [`IoStats`], with its bytes.
    dir: IoDir,
    bytes: u64,
    /// When the I/O thread took it up (its latency runs from here to the reply).
    t0: Instant,
}

/// Which completed writes a successful flush has made durable. A flush covers only the writes
/// that had completed when it was issued (a pipelined client may send WRITE then FLUSH without
/// waiting, and the write may finish after the flush), so a per-connection "dirty" flag cleared
/// when a flush is queued would skip the final flush for such a write.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Durability {
    /// Modifying requests completed (successfully or not: a failed one may have changed blocks).
    done: u64,
    /// The highest `done` count a successful flush was issued at.
    flushed: u64,
}

impl Durability {
    fn flush_completed(&mut self, covers: u64) {
        self.flushed = self.flushed.max(covers);
    }
    /// Some completed write is not known to be durable.
    fn needs_flush(&self) -> bool {
        self.done > self.flushed
    }
}

struct IoLoop<'a> {
    q: &'a mut dyn Queue,
    out: ReplyWriter,
    pool: &'a BufPool,
    credits: &'a Credits,
    geo: Geometry,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// The client can no longer be written to; keep draining the device only.
    dead: bool,
    durable: Durability,
    stats: &'a IoStats,
}

impl IoLoop<'_> {
    fn inflight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Returns the device's error if its queue failed.
    fn run(&mut self, rx: &Receiver<Msg>) -> Option<ConnReason> {
        let mut ended = false;
        let mut comps = vec![Completion::default(); self.slots.len().max(1)];
        loop {
            if !ended {
                if self.inflight() == 0 {
                    self.flush_out();
                    match rx.recv() {
                        Ok(m) => self.handle(m),
                        Err(_) => ended = true,
                    }
                }
                while !ended && !self.free.is_empty() {
                    match rx.try_recv() {
                        Ok(m) => self.handle(m),
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => ended = true,
                    }
                }
            }
            if self.inflight() == 0 {
                if ended {
                    break;
                }
                continue;
            }
            self.flush_out();
            let n = match self.q.do_io(&mut comps, 1, None, None) {
                Ok(n) => n,
                Err(e) => {
                    // The queue is broken and still owns our buffers' addresses: leak them rather
                    // than free memory the device might write to, and give up on this client.
                    for s in self.slots.iter_mut() {
                        if let Some(slot) = s.take() {
                            std::mem::forget(slot);
                        }
                    }
                    self.free.clear();
                    return Some(ConnReason::Device(e));
                }
            };
            for c in &comps[..n] {
                self.complete(c);
            }
        }
        self.flush_out();
        if self.durable.needs_flush() {
            // No I/O lost on disconnect or shutdown: make completed writes durable.
            let _ = snapblk_core::QueueExt::flush(self.q);
        }
        None
    }

    fn flush_out(&mut self) {
        if !self.dead && self.out.flush().is_err() {
            self.dead = true;
        }
    }

    fn send(&mut self, error: u32, cookie: u64, data: &[u8]) {
        if !self.dead && self.out.reply(&simple_reply(error, cookie), data).is_err() {
            self.dead = true;
        }
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Reply { cookie, error } => self.send(error, cookie, &[]),
            Msg::Io { hdr, buf, credit } => self.start(hdr, buf, credit),
        }
    }

    fn start(&mut self, h: RequestHeader, mut buf: Option<AlignedBuf>, credit: usize) {
        let Some(idx) = self.free.pop() else {
            // Cannot happen: intake stops when no slot is free. Fail safe anyway.
            self.send(EIO, h.cookie, &[]);
            self.release(credit, buf);
            return;
        };
        let fua = h.flags & CMD_FLAG_FUA != 0;
        let len = h.len as u64;
        // Split into device-sized requests (the device's limits may be below the NBD maximum).
        let mut reqs: Vec<Request> = Vec::new();
        let chunks = |max: u64| -> Vec<(u64, u64)> {
            let step = if max == 0 {
                len
            } else {
                max.max(self.geo.min_block as u64)
            };
            (0..len.div_ceil(step))
                .map(|i| (i * step, step.min(len - i * step)))
                .collect()
        };
        let mut flush_after = false;
        let mut modifies = false;
        let mut flush_covers = None;
        let mut read_len = 0;
        match h.cmd {
            CMD_READ | CMD_WRITE => {
                let base = match buf.as_mut() {
                    Some(b) => b.slice_mut(h.len as usize).as_mut_ptr(),
                    None => std::ptr::null_mut(),
                };
                for (o, l) in chunks(self.geo.max_transfer) {
                    // `o + l <= len <= buf capacity`, so the pointers stay inside the buffer.
                    let p = base.wrapping_add(o as usize);
                    let (op, flags) = if h.cmd == CMD_READ {
                        (
                            Op::Read {
                                offset: h.offset + o,
                                buf: p,
                                len: l as usize,
                            },
                            ReqFlags::NONE,
                        )
                    } else {
                        let f = if fua { ReqFlags::FUA } else { ReqFlags::NONE };
                        (
                            Op::Write {
                                offset: h.offset + o,
                                buf: p,
                                len: l as usize,
                            },
                            f,
                        )
                    };
                    reqs.push(Request::new(op, idx, flags));
                }
                if h.cmd == CMD_READ {
                    read_len = h.len as usize;
                } else {
                    modifies = true;
                }
            }
            CMD_FLUSH => {
                reqs.push(Request::new(Op::Flush, idx, ReqFlags::NONE));
                flush_covers = Some(self.durable.done);
            }
            CMD_TRIM => {
                for (o, l) in chunks(self.geo.max_discard) {
                    reqs.push(Request::new(
                        Op::Discard {
                            offset: h.offset + o,
                            len: l,
                        },
                        idx,
                        ReqFlags::NONE,
                    ));
                }
                flush_after = fua;
                modifies = true;
            }
            CMD_WRITE_ZEROES => {
                let mut f = ReqFlags::NONE;
                if fua {
                    f = f | ReqFlags::FUA;
                }
                if h.flags & CMD_FLAG_NO_HOLE != 0 {
                    f = f | ReqFlags::NO_UNMAP;
                }
                if h.flags & CMD_FLAG_FAST_ZERO != 0 {
                    f = f | ReqFlags::NO_FALLBACK;
                }
                for (o, l) in chunks(self.geo.max_write_zeroes) {
                    reqs.push(Request::new(
                        Op::WriteZeroes {
                            offset: h.offset + o,
                            len: l,
                        },
                        idx,
                        f,
                    ));
                }
                modifies = true;
            }
            _ => {}
        }
        if reqs.is_empty() {
            self.free.push(idx);
            self.send(EINVAL, h.cookie, &[]);
            self.release(credit, buf);
            return;
        }
        self.slots[idx] = Some(Slot {
            cookie: h.cookie,
            buf,
            read_len,
            parts: reqs.len() as u32,
            error: 0,
            credit,
            flush_after,
            modifies,
            flush_covers,
            dir: match h.cmd {
                CMD_READ => IoDir::Read,
                CMD_FLUSH => IoDir::Flush,
                CMD_TRIM => IoDir::Discard,
                _ => IoDir::Write,
            },
            bytes: if h.cmd == CMD_FLUSH { 0 } else { len },
            t0: Instant::now(),
        });
        for r in reqs {
            // SAFETY: data pointers point into the slot's buffer, a heap allocation that stays in
            // `self.slots[idx]` untouched until the slot's last completion has been reaped by
            // `do_io` (slots are only freed in `complete`, or leaked if the queue fails).
            unsafe { self.q.enqueue(r) };
        }
    }

    fn complete(&mut self, c: &Completion) {
        let idx = c.user_data;
        let Some(slot) = self.slots.get_mut(idx).and_then(|s| s.as_mut()) else {
            return;
        };
        if c.ret < 0 && slot.error == 0 {
            slot.error = errno_to_nbd(-c.ret);
        }
        slot.parts = slot.parts.saturating_sub(1);
        if slot.parts > 0 {
            return;
        }
        if slot.flush_after && slot.error == 0 {
            slot.flush_after = false;
            slot.parts = 1;
            // SAFETY: a flush carries no buffers.
            unsafe { self.q.enqueue(Request::new(Op::Flush, idx, ReqFlags::NONE)) };
            return;
        }
        let Some(slot) = self.slots[idx].take() else {
            return;
        };
        self.free.push(idx);
        self.stats
            .record(slot.dir, slot.bytes, slot.t0.elapsed(), slot.error == 0);
        if slot.modifies {
            self.durable.done += 1;
        }
        if let (Some(c), 0) = (slot.flush_covers, slot.error) {
            self.durable.flush_completed(c);
        }
        let data = match (&slot.buf, slot.error) {
            (Some(b), 0) => b.slice(slot.read_len),
            _ => &[][..],
        };
        // Not `send`: `data` borrows the slot, which is already out of `self`.
        if !self.dead
            && self
                .out
                .reply(&simple_reply(slot.error, slot.cookie), data)
                .is_err()
        {
            self.dead = true;
        }
        self.release(slot.credit, slot.buf);
    }

    fn release(&mut self, credit: usize, buf: Option<AlignedBuf>) {
        if let Some(b) = buf {
            self.pool.put(b);
        }
        self.credits.release(credit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            size: 1 << 20,
            read_only: false,
            min_block: 512,
            preferred_block: 4096,
            buf_align: 4096,
            max_transfer: 0,
            max_write_zeroes: 0,
            max_discard: 0,
        }
    }
    fn h(cmd: u16, flags: u16, offset: u64, len: u32) -> RequestHeader {
        RequestHeader {
            flags,
            cmd,
            cookie: 1,
            offset,
            len,
        }
    }

    #[test]
    fn a_flush_covers_only_writes_completed_before_it_was_issued() {
        let mut d = Durability::default();
        assert!(!d.needs_flush());
        // WRITE and FLUSH pipelined: the flush is issued before the write completes.
        let covers = d.done;
        d.done += 1;
        d.flush_completed(covers);
        assert!(
            d.needs_flush(),
            "the write finished after the flush was issued"
        );
        // A flush issued after the write completed covers it.
        let covers = d.done;
        d.flush_completed(covers);
        assert!(!d.needs_flush());
        // An older flush completing late does not undo a newer one.
        d.done += 1;
        let newer = d.done;
        d.flush_completed(newer);
        d.flush_completed(covers);
        assert!(!d.needs_flush());
    }

    #[test]
    fn judge_bounds_and_permissions() {
        let g = geo();
        let max = 32 << 20;
        assert_eq!(
            judge(&h(CMD_READ, 0, 0, 4096), &g, false, max),
            Verdict::Run
        );
        assert_eq!(
            judge(&h(CMD_READ, 0, (1 << 20) - 512, 1024), &g, false, max),
            Verdict::Fail(EINVAL)
        );
        assert_eq!(
            judge(&h(CMD_READ, 0, u64::MAX - 10, 512), &g, false, max),
            Verdict::Fail(EINVAL)
        );
        assert_eq!(
            judge(&h(CMD_READ, 0, 0, max + 512), &g, false, max),
            Verdict::Fail(EINVAL)
        );
        assert_eq!(
            judge(&h(CMD_READ, 0, 1, 512), &g, false, max),
            Verdict::Fail(EINVAL)
        );
        assert_eq!(judge(&h(CMD_READ, 0, 0, 0), &g, false, max), Verdict::Noop);
        assert_eq!(
            judge(&h(CMD_WRITE, 0, 0, max + 512), &g, false, max),
            Verdict::Close
        );
        assert_eq!(
            judge(&h(CMD_WRITE, 0, 0, 512), &g, true, max),
            Verdict::Fail(EPERM)
        );
        assert_eq!(
            judge(&h(CMD_WRITE, 0, 1 << 20, 512), &g, false, max),
            Verdict::Fail(ENOSPC)
        );
        assert_eq!(
            judge(&h(CMD_WRITE, CMD_FLAG_FUA, 512, 512), &g, false, max),
            Verdict::Run
        );
        assert_eq!(
            judge(&h(CMD_WRITE, CMD_FLAG_NO_HOLE, 512, 512), &g, false, max),
            Verdict::Fail(EINVAL)
        );
        assert_eq!(
            judge(&h(CMD_TRIM, 0, 1 << 20, 512), &g, false, max),
            Verdict::Fail(EINVAL)
        );
        assert_eq!(
            judge(
                &h(
                    CMD_WRITE_ZEROES,
                    CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                    0,
                    512
                ),
                &g,
                false,
                max
            ),
            Verdict::Run
        );
        assert_eq!(judge(&h(CMD_FLUSH, 0, 0, 0), &g, true, max), Verdict::Run);
        assert_eq!(
            judge(&h(99, 0, 0, 0), &g, false, max),
            Verdict::Fail(EINVAL)
        );
        assert_eq!(
            judge(&h(CMD_READ, 1 << 15, 0, 512), &g, false, max),
            Verdict::Fail(EINVAL)
        );
    }
}
