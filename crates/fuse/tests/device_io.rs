//! The FUSE export's byte-granular I/O layer over a strict in-test driver: the driver rejects
//! any request not aligned to 4 KiB (offset, length and buffer address) or longer than 8 KiB, so
//! every read/write/zero of arbitrary size must be split, aligned and read-modify-written
//! correctly. Checked against a plain in-memory model with many random operations, from
//! several threads at once.

use snapblk_core::{
    Blkio, Completion, DeviceInfo, Driver, Error, Op, PropValue, Queue, Request, State,
};
use snapblk_fuse::Device;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

const ALIGN: usize = 4096;
const MAX_T: usize = 8192;

struct Strict {
    mem: Arc<Mutex<Vec<u8>>>,
    read_only: bool,
    hooks: Arc<Hooks>,
}

struct StrictQ {
    mem: Arc<Mutex<Vec<u8>>>,
    done: Vec<Completion>,
    hooks: Arc<Hooks>,
}

/// Holds requests of one kind inside the driver while closed (the calling thread blocks).
#[derive(Default)]
struct Gate {
    /// (closed, threads inside)
    s: Mutex<(bool, usize)>,
    cv: Condvar,
}

impl Gate {
    fn close(&self) {
        self.s.lock().unwrap().0 = true;
    }
    fn open(&self) {
        self.s.lock().unwrap().0 = false;
        self.cv.notify_all();
    }
    fn pass(&self) {
        let mut s = self.s.lock().unwrap();
        s.1 += 1;
        self.cv.notify_all();
        while s.0 {
            s = self.cv.wait(s).unwrap();
        }
        s.1 -= 1;
    }
    /// Wait until a request is held at the gate.
    fn wait_held(&self) {
        let mut s = self.s.lock().unwrap();
        while s.1 == 0 {
            s = self.cv.wait(s).unwrap();
        }
    }
}

#[derive(Default)]
struct Hooks {
    writes: Gate,
    flushes: Gate,
    /// Flushes that reached the driver.
    flushed: AtomicUsize,
}

fn aligned(off: u64, len: usize, ptr: usize) -> bool {
    (off as usize).is_multiple_of(ALIGN)
        && len.is_multiple_of(ALIGN)
        && ptr.is_multiple_of(ALIGN)
        && len <= MAX_T
}

impl Queue for StrictQ {
    unsafe fn enqueue(&mut self, req: Request) {
        match req.op {
            Op::Write { .. } => self.hooks.writes.pass(),
            Op::Flush => {
                self.hooks.flushes.pass();
                self.hooks.flushed.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        let mut m = self.mem.lock().unwrap();
        let ok = match req.op {
            Op::Read { offset, buf, len }
                if aligned(offset, len, buf as usize) && offset as usize + len <= m.len() =>
            {
                // SAFETY: the caller guarantees `buf` is valid for `len` bytes until completion.
                unsafe { std::ptr::copy_nonoverlapping(m.as_ptr().add(offset as usize), buf, len) };
                true
            }
            Op::Write { offset, buf, len }
                if aligned(offset, len, buf as usize) && offset as usize + len <= m.len() =>
            {
                // SAFETY: as above, for reading `len` bytes from `buf`.
                unsafe {
                    std::ptr::copy_nonoverlapping(buf, m.as_mut_ptr().add(offset as usize), len)
                };
                true
            }
            Op::WriteZeroes { offset, len }
                if (offset as usize).is_multiple_of(ALIGN)
                    && (len as usize).is_multiple_of(ALIGN) =>
            {
                m[offset as usize..(offset + len) as usize].fill(0);
                true
            }
            Op::Flush => true,
            _ => false,
        };
        self.done.push(if ok {
            Completion::ok(req.user_data)
        } else {
            Completion::os_err(req.user_data, libc::EINVAL)
        });
    }
    fn do_io(
        &mut self,
        out: &mut [Completion],
        _min: usize,
        _t: Option<&mut Duration>,
        _s: Option<&libc::sigset_t>,
    ) -> snapblk_core::Result<usize> {
        let n = out.len().min(self.done.len());
        for (o, c) in out.iter_mut().zip(self.done.drain(..n)) {
            *o = c;
        }
        Ok(n)
    }
    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn set_completion_fd_enabled(&mut self, _e: bool) {}
    fn outstanding(&self) -> usize {
        self.done.len()
    }
}

impl Driver for Strict {
    fn name(&self) -> &str {
        "strict"
    }
    fn get_prop(&self, _n: &str, _s: State) -> snapblk_core::Result<PropValue> {
        Err(Error::new(libc::ENOENT, "Unknown property name"))
    }
    fn set_prop(&mut self, _n: &str, _v: PropValue, _s: State) -> snapblk_core::Result<()> {
        Err(Error::new(libc::ENOENT, "Unknown property name"))
    }
    fn connect(&mut self, _ro: bool) -> snapblk_core::Result<DeviceInfo> {
        Ok(DeviceInfo {
            read_only: self.read_only,
            request_alignment: ALIGN as i32,
            buf_alignment: ALIGN as i32,
            max_transfer: MAX_T as i32,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> snapblk_core::Result<u64> {
        Ok(self.mem.lock().unwrap().len() as u64)
    }
    fn create_queue(&mut self, _poll: bool) -> snapblk_core::Result<Box<dyn Queue>> {
        Ok(Box::new(StrictQ {
            mem: self.mem.clone(),
            done: Vec::new(),
            hooks: self.hooks.clone(),
        }))
    }
}

fn device(size: usize, read_only: bool) -> (Device, Arc<Mutex<Vec<u8>>>) {
    let (d, mem, _) = device_with_hooks(size, read_only);
    (d, mem)
}

fn device_with_hooks(size: usize, read_only: bool) -> (Device, Arc<Mutex<Vec<u8>>>, Arc<Hooks>) {
    let mem = Arc::new(Mutex::new(
        (0..size).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>(),
    ));
    let hooks = Arc::new(Hooks::default());
    let mut b = Blkio::new(Box::new(Strict {
        mem: mem.clone(),
        read_only,
        hooks: hooks.clone(),
    }));
    b.connect().unwrap();
    b.start().unwrap();
    (Device::new(b).unwrap(), mem, hooks)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn unaligned_io_matches_a_byte_model() {
    let size = 256 << 10;
    let (dev, mem) = device(size, false);
    let mut model = mem.lock().unwrap().clone();
    let mut rng = Rng(0x5eed);
    let mut buf = Vec::new();
    for i in 0..2000u64 {
        let off = rng.next() % size as u64;
        let len = (rng.next() % 20_000) as usize;
        match rng.next() % 3 {
            0 => {
                dev.read(off, len, &mut buf).unwrap();
                let end = (off as usize + len).min(size);
                assert!(
                    buf[..] == model[off as usize..end],
                    "read {off}+{len} (op {i})"
                );
            }
            1 => {
                let data: Vec<u8> = (0..len).map(|k| (k as u64 ^ i) as u8).collect();
                let n = dev.write(off, &data).unwrap();
                assert_eq!(n, len.min(size - off as usize));
                model[off as usize..off as usize + n].copy_from_slice(&data[..n]);
            }
            _ => {
                dev.zero(off, len as u64, rng.next().is_multiple_of(2))
                    .unwrap();
                let end = (off as usize + len).min(size);
                model[off as usize..end].fill(0);
            }
        }
    }
    dev.flush().unwrap();
    assert!(
        *mem.lock().unwrap() == model,
        "device content diverged from the model"
    );
    assert_eq!(
        dev.write(size as u64, b"x").unwrap_err().errno,
        libc::ENOSPC
    );
}

#[test]
fn concurrent_disjoint_unaligned_writers() {
    let size = 512 << 10;
    let (dev, mem) = device(size, false);
    let dev = Arc::new(dev);
    // Each thread owns every 8th 1000-byte stripe; stripes share 4 KiB blocks with neighbours,
    // so a read-modify-write that is not exclusive would lose other threads' bytes.
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let mut s = t as usize;
                while (s + 1) * 1000 <= size {
                    dev.write((s * 1000) as u64, &[t + 1; 1000]).unwrap();
                    s += 8;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let m = mem.lock().unwrap();
    for s in 0..size / 1000 {
        assert!(
            m[s * 1000..(s + 1) * 1000]
                .iter()
                .all(|&b| b == (s % 8) as u8 + 1),
            "stripe {s} lost writes"
        );
    }
}

#[test]
fn read_only_device_refuses_writes() {
    let (dev, _) = device(64 << 10, true);
    assert!(dev.read_only);
    assert_eq!(dev.write(0, b"abc").unwrap_err().errno, libc::EROFS);
    assert_eq!(dev.zero(0, 4096, true).unwrap_err().errno, libc::EROFS);
    let mut b = Vec::new();
    dev.read(100, 50, &mut b).unwrap();
    assert_eq!(b.len(), 50);
}

#[test]
fn a_write_that_finishes_during_a_flush_is_flushed_by_the_next_fsync() {
    let (dev, _, h) = device_with_hooks(64 << 10, false);
    let dev = Arc::new(dev);
    h.writes.close();
    let w = {
        let dev = dev.clone();
        std::thread::spawn(move || dev.write(0, &[1; 4096]).unwrap())
    };
    h.writes.wait_held();
    // An fsync (or a close's FLUSH) while the write is in flight does not cover it.
    dev.flush().unwrap();
    let before = h.flushed.load(Ordering::SeqCst);
    h.writes.open();
    w.join().unwrap();
    dev.flush().unwrap();
    assert_eq!(
        h.flushed.load(Ordering::SeqCst),
        before + 1,
        "fsync after a completed write did not flush"
    );
    // Nothing written since: the next one has nothing to do.
    dev.flush().unwrap();
    assert_eq!(h.flushed.load(Ordering::SeqCst), before + 1);
}

#[test]
fn an_fsync_waits_for_the_flush_in_progress_that_covers_its_write() {
    let (dev, _, h) = device_with_hooks(64 << 10, false);
    let dev = Arc::new(dev);
    dev.write(0, &[1; 4096]).unwrap();
    h.flushes.close();
    let a = {
        let dev = dev.clone();
        std::thread::spawn(move || dev.flush().unwrap())
    };
    h.flushes.wait_held();
    let (tx, rx) = std::sync::mpsc::channel();
    let b = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            dev.flush().unwrap();
            tx.send(()).unwrap();
        })
    };
    // While the flush covering the write is held in the driver, the second fsync must not
    // report the write durable.
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "fsync returned while the flush covering its write was still in progress"
    );
    h.flushes.open();
    a.join().unwrap();
    rx.recv().unwrap();
    b.join().unwrap();
    // The waiting fsync was covered by the flush it waited for: one flush in all.
    assert_eq!(h.flushed.load(Ordering::SeqCst), 1);
}

/// An O_DIRECT file whose size is not a multiple of the logical block size: its last partial
/// block cannot be written with aligned I/O without growing the file, so such a write fails
/// (EINVAL) and the file keeps its size and contents; it reads back (the whole last block is
/// read, and the part inside the file returned).
#[test]
fn a_write_into_a_partial_last_block_fails_instead_of_growing_the_file() {
    let dir = std::env::temp_dir().join(format!("fuse-tail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("odd.img");
    let size = (64 << 10) + 1000;
    let orig: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
    std::fs::write(&f, &orig).unwrap();
    let spec = format!("io_uring:path={},direct=true", f.display());
    let dev = Device::new(snapblk::open(&spec, 1).unwrap()).unwrap();
    assert_eq!(dev.size, size as u64);
    let e = dev.write(size as u64 - 100, &[9; 100]).unwrap_err();
    assert_eq!(e.errno, libc::EINVAL, "{}", e.msg);
    let mut got = Vec::new();
    dev.read(size as u64 - 100, 4096, &mut got).unwrap();
    assert!(got == orig[size - 100..], "the tail reads back");
    // Aligned blocks before the tail still work.
    dev.write(4096, &[7; 512]).unwrap();
    dev.flush().unwrap();
    drop(dev);
    let now = std::fs::read(&f).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(now.len(), size, "the file grew");
    assert_eq!(&now[4096..4608], &[7; 512][..]);
    assert_eq!(now[size - 100..], orig[size - 100..]);
}
