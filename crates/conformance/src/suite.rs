//! The machinery the checks share: the device's properties, the suite's buffers, and
//! requests that wait with a timeout.

use crate::{DataModel, Options, Outcome};
use snapblk_core::{Blkio, Completion, MemRegion, Op, Queue, ReqFlags, Request};
use std::time::Duration;

/// Why a check stopped early.
pub(crate) enum Stop {
    /// The check failed; the suite goes on.
    Fail(String),
    /// The suite cannot go on: a request never completed (its buffers may still be in use), or
    /// the buffers could not be set up.
    Fatal(String),
}

pub(crate) type Res = Result<Outcome, Stop>;

macro_rules! fail {
    ($($t:tt)*) => { return Err(Stop::Fail(format!($($t)*))) };
}
macro_rules! ensure {
    ($c:expr, $($t:tt)*) => { if !$c { fail!($($t)*) } };
}

pub(crate) fn pass() -> Res {
    Ok(Outcome::Pass(String::new()))
}

/// The device's properties, read once.
pub(crate) struct Props {
    /// Every property the suite reads, as text, for messages.
    pub(crate) all: Vec<(&'static str, String)>,
    pub(crate) driver: String,
    pub(crate) capacity: u64,
    pub(crate) read_only: bool,
    pub(crate) needs_mem_regions: bool,
    pub(crate) needs_mem_region_fd: bool,
    pub(crate) mem_region_alignment: u64,
    pub(crate) request_alignment: u64,
    pub(crate) buf_alignment: u64,
    pub(crate) optimal_buf_alignment: u64,
    pub(crate) optimal_io_size: u64,
    pub(crate) max_transfer: u64,
    pub(crate) max_segments: usize,
    pub(crate) max_segment_len: u64,
    pub(crate) max_write_zeroes_len: u64,
    pub(crate) max_discard_len: u64,
    pub(crate) discard_alignment: u64,
    pub(crate) can_grow: bool,
    pub(crate) max_queues: i32,
    pub(crate) num_queues: i32,
    pub(crate) supports_poll_queues: bool,
    pub(crate) can_add_queues: bool,
}

pub(crate) const SHOWN: &[&str] = &[
    "driver",
    "capacity",
    "read-only",
    "direct",
    "needs-mem-regions",
    "needs-mem-region-fd",
    "mem-region-alignment",
    "request-alignment",
    "buf-alignment",
    "optimal-buf-alignment",
    "optimal-io-size",
    "max-transfer",
    "max-segments",
    "max-segment-len",
    "max-write-zeroes-len",
    "max-discard-len",
    "discard-alignment",
    "supports-fua-natively",
    "can-grow",
    "max-queues",
    "num-queues",
    "supports-poll-queues",
    "can-add-queues",
];

impl Props {
    pub(crate) fn read(b: &Blkio) -> Result<Props, String> {
        let mut all = Vec::new();
        for &name in SHOWN {
            match b.get_str(name) {
                Ok(v) => all.push((name, v)),
                // `direct` is a file-backed driver's property; the others are common ones.
                Err(_) if name == "direct" => {}
                Err(e) => return Err(format!("cannot read property {name}: {e}")),
            }
        }
        let get = |name: &str| -> Result<&str, String> {
            all.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
                .ok_or_else(|| format!("property {name} missing"))
        };
        let num = |name: &str| -> Result<u64, String> {
            let v = get(name)?;
            v.parse::<i64>()
                .ok()
                .and_then(|n| u64::try_from(n).ok())
                .or_else(|| v.parse::<u64>().ok())
                .ok_or_else(|| format!("property {name}={v} is not a non-negative number"))
        };
        let flag = |name: &str| -> Result<bool, String> {
            match get(name)? {
                "true" => Ok(true),
                "false" => Ok(false),
                v => Err(format!("property {name}={v} is not a bool")),
            }
        };
        let int = |name: &str| -> Result<i32, String> {
            get(name)?
                .parse()
                .map_err(|_| format!("property {name} is not an int"))
        };
        Ok(Props {
            driver: get("driver")?.to_owned(),
            capacity: num("capacity")?,
            read_only: flag("read-only")?,
            needs_mem_regions: flag("needs-mem-regions")?,
            needs_mem_region_fd: flag("needs-mem-region-fd")?,
            mem_region_alignment: num("mem-region-alignment")?,
            request_alignment: num("request-alignment")?,
            buf_alignment: num("buf-alignment")?,
            optimal_buf_alignment: num("optimal-buf-alignment")?,
            optimal_io_size: num("optimal-io-size")?,
            max_transfer: num("max-transfer")?,
            max_segments: num("max-segments")? as usize,
            max_segment_len: num("max-segment-len")?,
            max_write_zeroes_len: num("max-write-zeroes-len")?,
            max_discard_len: num("max-discard-len")?,
            discard_alignment: num("discard-alignment")?,
            can_grow: flag("can-grow")?,
            max_queues: int("max-queues")?,
            num_queues: int("num-queues")?,
            supports_poll_queues: flag("supports-poll-queues")?,
            can_add_queues: flag("can-add-queues")?,
            all,
        })
    }

    /// `name=value, ...` for the named properties (those the device has).
    pub(crate) fn show(&self, names: &[&str]) -> String {
        names
            .iter()
            .filter_map(|n| {
                self.all
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(k, v)| format!("{k}={v}"))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Which memory a data check uses.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mem {
    /// A region from `alloc_mem_region`, mapped.
    Mapped,
    /// A region from `alloc_mem_region`, never mapped.
    Unmapped,
    /// Private anonymous memory, no fd (what `malloc` gives).
    Plain,
}

/// A suite run: the instance, its properties and the suite's buffers.
pub(crate) struct Suite {
    pub(crate) b: Blkio,
    pub(crate) p: Props,
    pub(crate) opts: Options,
    pub(crate) model: DataModel,
    /// The suite's block: every offset and length is a multiple of it.
    pub(crate) u: usize,
    /// Length of each buffer region (128 blocks, a multiple of `mem-region-alignment`).
    pub(crate) rlen: usize,
    pub(crate) mapped: Option<MemRegion>,
    pub(crate) unmapped: Option<MemRegion>,
    pub(crate) plain: Option<MemRegion>,
    /// What the device holds at [`Suite::A`]..+4 blocks (written, or read on a read-only one).
    pub(crate) at_a: Vec<u8>,
}

pub(crate) fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a.max(1)) * a.max(1)
}

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 9) as u8))
        .collect()
}

pub(crate) fn errno_name(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// `ret=-22 (Invalid argument (os error 22): message)`.
pub(crate) fn describe(c: &Completion) -> String {
    if c.ret == 0 {
        return "ret=0 (success)".into();
    }
    let msg = c
        .error_msg()
        .map(|m| format!(": {}", m.to_string_lossy()))
        .unwrap_or_default();
    format!("ret={} ({}{msg})", c.ret, errno_name(-c.ret))
}

/// Where two buffers first differ.
pub(crate) fn diff(got: &[u8], want: &[u8]) -> String {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(i) => format!(
            "first difference at byte {i}: got {:#04x}, want {:#04x}",
            got[i], want[i]
        ),
        None => format!("lengths differ: got {}, want {}", got.len(), want.len()),
    }
}

/// Reap at least `min` completions into `out`, waiting at most `timeout` in all.
pub(crate) fn wait(
    q: &mut dyn Queue,
    out: &mut [Completion],
    min: usize,
    timeout: Duration,
) -> Result<usize, Stop> {
    let mut left = timeout;
    let mut n = 0;
    while n < min {
        match q.do_io(&mut out[n..], min - n, Some(&mut left), None) {
            Ok(k) => n += k,
            Err(e) if e.errno == libc::EINTR => {}
            Err(e) if e.errno == libc::ETIME => {
                return Err(Stop::Fatal(format!(
                    "only {n} of {min} requests completed within {timeout:?}"
                )));
            }
            Err(e) => fail!("do_io failed: {e} (errno {})", e.errno),
        }
    }
    Ok(n)
}

/// Enqueue one request on `q` and wait for its completion.
///
/// # Safety
/// The request's buffers and iovec array must stay valid until this returns (or, if it returns
/// [`Stop::Fatal`], forever).
pub(crate) unsafe fn submit(
    q: &mut dyn Queue,
    req: Request,
    timeout: Duration,
) -> Result<Completion, Stop> {
    // SAFETY: forwarded from the caller.
    unsafe { q.enqueue(req) };
    let mut c = [Completion::default()];
    wait(q, &mut c, 1, timeout)?;
    ensure!(
        c[0].user_data == req.user_data,
        "completion carries user_data {}, the request had {}",
        c[0].user_data,
        req.user_data
    );
    Ok(c[0])
}

pub(crate) fn read_eventfd(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd; a zero timeout does not block.
    if unsafe { libc::poll(&mut p, 1, 0) } != 1 {
        return false;
    }
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into a live u64; the fd is readable, so this does not block.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) == 8 }
}

impl Suite {
    /// Offsets (in blocks) of the areas the checks use.
    pub(crate) const A: u64 = 2;
    pub(crate) const A2: u64 = 8;
    pub(crate) const B: u64 = 16;
    pub(crate) const C: u64 = 32;
    /// Blocks the suite needs on the device.
    pub(crate) const NEEDED: u64 = 128;

    pub(crate) fn off(&self, blocks: u64) -> u64 {
        blocks * self.u as u64
    }

    pub(crate) fn base(&self, m: Mem) -> *mut u8 {
        let r = match m {
            Mem::Mapped => self.mapped,
            Mem::Unmapped => self.unmapped,
            Mem::Plain => self.plain,
        };
        r.map_or(std::ptr::null_mut(), |r| r.addr)
    }

    /// The suite's memory `m` as a slice.
    ///
    /// # Safety
    /// No request may be using the memory, and the slice must be dropped before the next one.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn mem(&self, m: Mem) -> &mut [u8] {
        // SAFETY: the region is live (allocated in `setup`, freed in `release`) and `rlen`
        // long; exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.base(m), self.rlen) }
    }

    /// What a read returns after `written` was written.
    pub(crate) fn stored(&self, written: &[u8]) -> Vec<u8> {
        match self.model {
            DataModel::Stored => written.to_vec(),
            DataModel::Zeroes => vec![0; written.len()],
        }
    }

    /// How many regular queues the queue checks use: those started, at most `opts.queues`.
    pub(crate) fn regular_queues(&self) -> usize {
        (self.p.num_queues.max(0) as usize)
            .min(self.opts.queues.max(1) as usize)
            .min(64)
    }

    pub(crate) fn q0(&mut self) -> Result<&mut dyn Queue, Stop> {
        match self.b.queue(0, false) {
            Some(q) => Ok(&mut **q),
            None => fail!(
                "the instance has no queue 0 ({})",
                self.p.show(&["num-queues"])
            ),
        }
    }

    /// One request on queue 0 whose buffers are the suite's memory (or none).
    pub(crate) fn io(&mut self, op: Op, flags: ReqFlags, ud: usize) -> Result<Completion, Stop> {
        let t = self.opts.timeout;
        let q = self.q0()?;
        // SAFETY: the buffers are the suite's regions, live until `release` (and leaked if a
        // request hangs); iovec arrays are passed through `iov_io`, which keeps them alive.
        unsafe { submit(q, Request::new(op, ud, flags), t) }
    }

    pub(crate) fn rw(
        &mut self,
        write: bool,
        off: u64,
        m: Mem,
        at: usize,
        len: usize,
    ) -> Result<Completion, Stop> {
        self.rw_flags(write, off, m, at, len, ReqFlags::NONE)
    }

    pub(crate) fn rw_flags(
        &mut self,
        write: bool,
        offset: u64,
        m: Mem,
        at: usize,
        len: usize,
        flags: ReqFlags,
    ) -> Result<Completion, Stop> {
        // SAFETY: `at + len` stays inside the region (callers use offsets below `rlen`).
        let buf = unsafe { self.base(m).add(at) };
        let op = if write {
            Op::Write { offset, buf, len }
        } else {
            Op::Read { offset, buf, len }
        };
        self.io(op, flags, 1)
    }

    /// Read or write `iov` (pointing into the suite's memory) at `offset`.
    pub(crate) fn iov_io(
        &mut self,
        write: bool,
        offset: u64,
        iov: &[libc::iovec],
        flags: ReqFlags,
        ud: usize,
    ) -> Result<Completion, Stop> {
        let (iov, iovcnt) = (iov.as_ptr(), iov.len() as i32);
        let op = if write {
            Op::Writev {
                offset,
                iov,
                iovcnt,
            }
        } else {
            Op::Readv {
                offset,
                iov,
                iovcnt,
            }
        };
        // `iov` outlives the call, which waits for the completion.
        self.io(op, flags, ud)
    }

    pub(crate) fn iovecs(&self, m: Mem, at: &[usize], len: usize) -> Vec<libc::iovec> {
        at.iter()
            .map(|&a| libc::iovec {
                // SAFETY: inside the region (callers keep `a + len <= rlen`).
                iov_base: unsafe { self.base(m).add(a) }.cast(),
                iov_len: len,
            })
            .collect()
    }

    pub(crate) fn ok(&self, c: Completion, what: &str, props: &[&str]) -> Result<(), Stop> {
        ensure!(
            c.ret == 0,
            "{what}: {} [{}]",
            describe(&c),
            self.p.show(props)
        );
        Ok(())
    }

    /// `e` with what was being done and the property values behind it.
    pub(crate) fn ctx(&self, e: Stop, what: &str, props: &[&str]) -> Stop {
        let add = |m: String| format!("{what}: {m} [{}]", self.p.show(props));
        match e {
            Stop::Fail(m) => Stop::Fail(add(m)),
            Stop::Fatal(m) => Stop::Fatal(add(m)),
        }
    }

    pub(crate) fn want_err(
        &self,
        c: Completion,
        errno: i32,
        what: &str,
        props: &[&str],
    ) -> Result<(), Stop> {
        ensure!(
            c.ret == -errno,
            "{what}: expected -{errno} ({}), got {} [{}]",
            errno_name(errno),
            describe(&c),
            self.p.show(props)
        );
        Ok(())
    }

    /// Compare `len` bytes of memory `m` at `at` with `want`.
    pub(crate) fn same(
        &self,
        m: Mem,
        at: usize,
        want: &[u8],
        what: &str,
        props: &[&str],
    ) -> Result<(), Stop> {
        // SAFETY: no request is in flight between the suite's requests.
        let got = &unsafe { self.mem(m) }[at..at + want.len()];
        ensure!(
            got == want,
            "{what}: {} [{}]",
            diff(got, want),
            self.p.show(props)
        );
        Ok(())
    }

    pub(crate) fn fill(&self, m: Mem, at: usize, data: &[u8]) {
        // SAFETY: no request is in flight between the suite's requests.
        let mem = unsafe { self.mem(m) };
        mem[at..at + data.len()].copy_from_slice(data);
    }

    /// The data-check length: four blocks, within `max-transfer`.
    pub(crate) fn dlen(&self) -> usize {
        let mut len = 4 * self.u as u64;
        if self.p.max_transfer > 0 {
            len = len.min(self.p.max_transfer / self.u as u64 * self.u as u64);
        }
        len.max(self.u as u64) as usize
    }

    /// What the device holds at [`Suite::A`], as the read-write check left it.
    pub(crate) fn reference(&self, len: usize) -> Result<Vec<u8>, Stop> {
        ensure!(
            self.at_a.len() >= len,
            "no reference data: the read-write (or read) check did not complete"
        );
        Ok(self.at_a[..len].to_vec())
    }

    /// Wait for everything still outstanding on queue 0 (after a check failed half-way).
    pub(crate) fn drain(&mut self) -> Result<(), Stop> {
        let t = self.opts.timeout;
        let Some(q) = self.b.queue(0, false) else {
            return Ok(());
        };
        let n = q.outstanding();
        if n > 0 {
            let mut cs = vec![Completion::default(); n];
            wait(&mut **q, &mut cs, n, t)?;
        }
        Ok(())
    }
}
