//! Flush bookkeeping against a pipelining client: a FLUSH covers only the writes that had
//! completed when it was issued, so a write that completes after a FLUSH sent right behind it
//! must still be flushed when the client disconnects. The device is an in-memory test driver
//! that holds writes back on request and logs what completes, in order.

mod common;
use common::*;
use snapblk_core::{
    Blkio, Completion, DeviceInfo, Driver, Error, Op, PropValue, Queue, Request, State,
};
use snapblk_nbd::ServerConfig;
use snapblk_nbd::proto::*;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Write,
    Flush,
}

#[derive(Default)]
struct St {
    mem: Vec<u8>,
    hold_writes: bool,
    log: Vec<Ev>,
}

#[derive(Default)]
struct Shared {
    st: Mutex<St>,
    cv: Condvar,
}

struct Held(Arc<Shared>);

struct HeldQ {
    sh: Arc<Shared>,
    pending: Vec<Request>,
}

impl Queue for HeldQ {
    unsafe fn enqueue(&mut self, req: Request) {
        self.pending.push(req);
    }

    fn do_io(
        &mut self,
        out: &mut [Completion],
        min: usize,
        _t: Option<&mut Duration>,
        _s: Option<&libc::sigset_t>,
    ) -> snapblk_core::Result<usize> {
        let mut n = 0;
        let mut waited = false;
        let mut st = self.sh.st.lock().unwrap();
        loop {
            let mut i = 0;
            while i < self.pending.len() && n < out.len() {
                let r = self.pending[i];
                let ok = match r.op {
                    Op::Write { .. } if st.hold_writes => {
                        i += 1;
                        continue;
                    }
                    Op::Write { offset, buf, len } => {
                        let o = offset as usize;
                        // SAFETY: the server keeps `buf` valid for `len` bytes until completion.
                        let src = unsafe { std::slice::from_raw_parts(buf, len) };
                        st.mem[o..o + len].copy_from_slice(src);
                        st.log.push(Ev::Write);
                        true
                    }
                    Op::Read { offset, buf, len } => {
                        let o = offset as usize;
                        // SAFETY: as above, for writing `len` bytes into `buf`.
                        let dst = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                        dst.copy_from_slice(&st.mem[o..o + len]);
                        true
                    }
                    Op::Flush => {
                        st.log.push(Ev::Flush);
                        true
                    }
                    _ => false,
                };
                self.pending.remove(i);
                out[n] = if ok {
                    Completion::ok(r.user_data)
                } else {
                    Completion::os_err(r.user_data, libc::EOPNOTSUPP)
                };
                n += 1;
            }
            // After one short wait, return even with fewer than `min` (as a timed wait would):
            // the server then looks for new requests, so one sent behind a held write gets in.
            if n >= min.min(self.pending.len() + n) || waited {
                return Ok(n);
            }
            waited = true;
            st = self
                .sh
                .cv
                .wait_timeout(st, Duration::from_millis(20))
                .unwrap()
                .0;
        }
    }

    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn set_completion_fd_enabled(&mut self, _e: bool) {}
    fn outstanding(&self) -> usize {
        self.pending.len()
    }
}

impl Driver for Held {
    fn name(&self) -> &str {
        "held"
    }
    fn get_prop(&self, _n: &str, _s: State) -> snapblk_core::Result<PropValue> {
        Err(Error::new(libc::ENOENT, "Unknown property name"))
    }
    fn set_prop(&mut self, _n: &str, _v: PropValue, _s: State) -> snapblk_core::Result<()> {
        Err(Error::new(libc::ENOENT, "Unknown property name"))
    }
    fn connect(&mut self, _ro: bool) -> snapblk_core::Result<DeviceInfo> {
        Ok(DeviceInfo {
            request_alignment: 512,
            flush_needed: true,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> snapblk_core::Result<u64> {
        Ok(self.0.st.lock().unwrap().mem.len() as u64)
    }
    fn create_queue(&mut self, _poll: bool) -> snapblk_core::Result<Box<dyn Queue>> {
        Ok(Box::new(HeldQ {
            sh: self.0.clone(),
            pending: Vec::new(),
        }))
    }
}

/// A 1 MiB held-writes device served as export `disk`, and a client connected to it.
fn serve_held() -> (Arc<Shared>, TestServer, Client) {
    let sh = Arc::new(Shared::default());
    sh.st.lock().unwrap().mem = vec![0; 1 << 20];
    let mut dev = Blkio::new(Box::new(Held(sh.clone())));
    dev.connect().unwrap();
    dev.start().unwrap();
    let srv = TestServer::start_device(dev, false, "127.0.0.1:0", ServerConfig::default());
    let c = Client::connect(&srv.addr, "disk");
    (sh, srv, c)
}

#[test]
fn a_write_completing_after_a_pipelined_flush_is_flushed_at_disconnect() {
    let (sh, srv, mut c) = serve_held();

    sh.st.lock().unwrap().hold_writes = true;
    c.send(CMD_WRITE, 0, 1, 4096, 4096, &[0xab; 4096]);
    c.send(CMD_FLUSH, 0, 2, 0, 0, &[]);
    // The flush overtakes the held write (NBD allows it: it covers completed writes only).
    assert_eq!(c.reply().unwrap(), (0, 2));
    {
        let mut st = sh.st.lock().unwrap();
        assert_eq!(st.log, [Ev::Flush]);
        st.hold_writes = false;
    }
    sh.cv.notify_all();
    assert_eq!(c.reply().unwrap(), (0, 1));
    c.send(CMD_DISC, 0, 3, 0, 0, &[]);
    assert!(c.closed());
    srv.stop();

    let st = sh.st.lock().unwrap();
    assert_eq!(&st.mem[4096..8192], &[0xab; 4096][..]);
    assert_eq!(
        st.log,
        [Ev::Flush, Ev::Write, Ev::Flush],
        "the write that completed after the client's flush was never flushed"
    );
}

#[test]
fn no_final_flush_when_every_completed_write_was_flushed() {
    let (sh, srv, mut c) = serve_held();
    assert_eq!(c.simple(CMD_WRITE, 0, 0, 512, &[1; 512]), 0);
    assert_eq!(c.simple(CMD_FLUSH, 0, 0, 0, &[]), 0);
    assert_eq!(c.read(0, 512).unwrap(), [1; 512]);
    c.send(CMD_DISC, 0, 3, 0, 0, &[]);
    assert!(c.closed());
    srv.stop();
    assert_eq!(sh.st.lock().unwrap().log, [Ev::Write, Ev::Flush]);
}
