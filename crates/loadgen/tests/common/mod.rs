//! A recording in-memory driver for engine tests: logs every request (queue, direction, offset,
//! length), serves data from RAM, and can corrupt or misplace chosen blocks.
#![allow(dead_code)]

use snapblk_core::{Blkio, Completion, DeviceInfo, Driver, Op, PropValue, Queue, Request, State};
use snapblk_loadgen::BlkioTarget;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rec {
    pub queue: usize,
    pub write: bool,
    pub offset: u64,
    pub len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoIo {
    pub submitted: usize,
    pub min: usize,
    pub max: usize,
    pub returned: usize,
}

#[derive(Default)]
pub struct Shared {
    pub data: Vec<u8>,
    pub log: Vec<Rec>,
    /// Flip a byte in what reads of this offset return.
    pub corrupt_read_at: Option<u64>,
    /// Writes to `.0` land at `.1` instead.
    pub misdirect_write: Option<(u64, u64)>,
    /// Writes complete successfully but change nothing (lost writes).
    pub drop_writes: bool,
    /// Highest number of requests seen outstanding per queue.
    pub max_outstanding: Vec<usize>,
    /// Every `do_io` call: requests it submitted, `min`, room for completions (`out.len()`),
    /// completions returned.
    pub calls: Vec<DoIo>,
    /// The `direct` argument of every open of the target, in order.
    pub opened_direct: Vec<bool>,
    /// `request-alignment` and `buf-alignment` the device reports (0: the default, 1).
    pub request_alignment: i32,
    pub buf_alignment: i32,
    /// Requests whose buffer address was not a multiple of `buf_alignment`.
    pub misaligned_bufs: usize,
    /// Record, per `do_io` with requests, the mapping of its first request's buffer
    /// (`map_bufs` on): /proc/self/maps' permissions and path, e.g. "rw-p " for private
    /// anonymous memory.
    pub map_bufs: bool,
    pub buf_maps: Vec<String>,
    /// Slept by every `enqueue`.
    pub enqueue_delay: std::time::Duration,
    /// Slept by every `do_io` that submits requests, before it submits them.
    pub submit_delay: std::time::Duration,
    /// Slept by every `do_io` that waits (`min > 0`), after it submitted.
    pub wait_delay: std::time::Duration,
    next_queue: usize,
}

pub struct RecDriver {
    pub shared: Arc<Mutex<Shared>>,
}

struct RecQueue {
    id: usize,
    shared: Arc<Mutex<Shared>>,
    pending: Vec<Request>,
    ready: Vec<Completion>,
}

impl Driver for RecDriver {
    fn name(&self) -> &str {
        "recording"
    }
    fn get_prop(&self, _: &str, _: State) -> snapblk_core::Result<PropValue> {
        Err(snapblk_core::Error::new(libc::ENOENT, "no such property"))
    }
    fn set_prop(&mut self, _: &str, _: PropValue, _: State) -> snapblk_core::Result<()> {
        Err(snapblk_core::Error::new(libc::ENOENT, "no such property"))
    }
    fn connect(&mut self, _: bool) -> snapblk_core::Result<DeviceInfo> {
        let s = self.shared.lock().unwrap();
        Ok(DeviceInfo {
            request_alignment: s.request_alignment.max(1),
            buf_alignment: s.buf_alignment.max(1),
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> snapblk_core::Result<u64> {
        Ok(self.shared.lock().unwrap().data.len() as u64)
    }
    fn create_queue(&mut self, _: bool) -> snapblk_core::Result<Box<dyn Queue>> {
        let mut s = self.shared.lock().unwrap();
        let id = s.next_queue;
        s.next_queue += 1;
        s.max_outstanding.push(0);
        Ok(Box::new(RecQueue {
            id,
            shared: self.shared.clone(),
            pending: Vec::new(),
            ready: Vec::new(),
        }))
    }
}

impl Queue for RecQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        let delay = self.shared.lock().unwrap().enqueue_delay;
        std::thread::sleep(delay);
        self.pending.push(req);
        let out = self.outstanding();
        let mut s = self.shared.lock().unwrap();
        let m = &mut s.max_outstanding[self.id];
        *m = (*m).max(out);
    }
    fn do_io(
        &mut self,
        out: &mut [Completion],
        min: usize,
        _timeout: Option<&mut std::time::Duration>,
        _sigmask: Option<&libc::sigset_t>,
    ) -> snapblk_core::Result<usize> {
        if min > out.len() || min > self.outstanding() {
            return Err(snapblk_core::Error::inval("bad min"));
        }
        let (submit_delay, wait_delay) = {
            let s = self.shared.lock().unwrap();
            (s.submit_delay, s.wait_delay)
        };
        if !self.pending.is_empty() {
            std::thread::sleep(submit_delay);
        }
        let mut s = self.shared.lock().unwrap();
        let submitted = self.pending.len();
        let balign = s.buf_alignment.max(1) as usize;
        for r in &self.pending {
            let addr = match r.op {
                Op::Read { buf, .. } => buf as usize,
                Op::Write { buf, .. } => buf as usize,
                _ => 0,
            };
            if addr % balign != 0 {
                s.misaligned_bufs += 1;
            }
        }
        if s.map_bufs && !self.pending.is_empty() {
            let addr = match self.pending[0].op {
                Op::Read { buf, .. } => buf as usize,
                Op::Write { buf, .. } => buf as usize,
                _ => 0,
            };
            let m = snapblk_testsupport::mapping_of(addr);
            s.buf_maps.push(m);
        }
        for r in self.pending.drain(..) {
            match r.op {
                Op::Read { offset, buf, len } => {
                    s.log.push(Rec {
                        queue: self.id,
                        write: false,
                        offset,
                        len,
                    });
                    let o = offset as usize;
                    // SAFETY: the engine guarantees buf is valid for len bytes until completion.
                    let dst = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                    dst.copy_from_slice(&s.data[o..o + len]);
                    if s.corrupt_read_at == Some(offset) {
                        dst[len / 2] ^= 0xff;
                    }
                }
                Op::Write { offset, buf, len } => {
                    s.log.push(Rec {
                        queue: self.id,
                        write: true,
                        offset,
                        len,
                    });
                    let dest = match s.misdirect_write {
                        Some((from, to)) if from == offset => to,
                        _ => offset,
                    } as usize;
                    // SAFETY: as above.
                    let src = unsafe { std::slice::from_raw_parts(buf, len) };
                    if !s.drop_writes {
                        s.data[dest..dest + len].copy_from_slice(src);
                    }
                }
                _ => {}
            }
            self.ready.push(Completion::ok(r.user_data));
        }
        if min > 0 {
            drop(s);
            std::thread::sleep(wait_delay);
            s = self.shared.lock().unwrap();
        }
        let n = self.ready.len().min(out.len());
        for (i, c) in self.ready.drain(..n).enumerate() {
            out[i] = c;
        }
        s.calls.push(DoIo {
            submitted,
            min,
            max: out.len(),
            returned: n,
        });
        Ok(n)
    }
    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn set_completion_fd_enabled(&mut self, _: bool) {}
    fn outstanding(&self) -> usize {
        self.pending.len() + self.ready.len()
    }
}

/// A target over a fresh recording device of `size` bytes; returns the shared state too.
pub fn recording_target(size: usize) -> (BlkioTarget, Arc<Mutex<Shared>>) {
    let shared = Arc::new(Mutex::new(Shared {
        data: vec![0; size],
        ..Default::default()
    }));
    let sh = shared.clone();
    let t = BlkioTarget::new("recording", move |n, direct| {
        {
            let mut s = sh.lock().unwrap();
            s.opened_direct.push(direct);
            s.log.clear();
            s.max_outstanding.clear();
            s.calls.clear();
            s.next_queue = 0;
        }
        let mut b = Blkio::new(Box::new(RecDriver { shared: sh.clone() }));
        b.connect()?;
        b.set_int("num-queues", n as i32)?;
        b.start()?;
        Ok(b)
    });
    (t, shared)
}
