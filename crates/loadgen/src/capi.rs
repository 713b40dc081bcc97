//! Run against any libblkio implementation loaded at run time (`--libblkio PATH.so --driver
//! NAME`): the real libblkio and snapblk's libblkio.so expose the same C ABI, so both can be
//! measured by the same engine in one run. This module is the only FFI in the crate.

use crate::spec::Iomem;
use crate::target::{Alignment, Device, PrivateBufs, Target};
use crate::{Error, Result};
use snapblk_core::{Completion, MemRegion, Op, Queue, Request};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

type Blk = c_void;
type Blkq = c_void;

/// The libblkio entry points used here, resolved once.
struct Lib {
    _lib: libloading::Library,
    create: unsafe extern "C" fn(*const c_char, *mut *mut Blk) -> c_int,
    connect: unsafe extern "C" fn(*mut Blk) -> c_int,
    start: unsafe extern "C" fn(*mut Blk) -> c_int,
    destroy: unsafe extern "C" fn(*mut *mut Blk),
    set_str: unsafe extern "C" fn(*mut Blk, *const c_char, *const c_char) -> c_int,
    get_uint64: unsafe extern "C" fn(*mut Blk, *const c_char, *mut u64) -> c_int,
    get_int: unsafe extern "C" fn(*mut Blk, *const c_char, *mut c_int) -> c_int,
    get_bool: unsafe extern "C" fn(*mut Blk, *const c_char, *mut bool) -> c_int,
    get_queue: unsafe extern "C" fn(*mut Blk, c_int) -> *mut Blkq,
    read: unsafe extern "C" fn(*mut Blkq, u64, *mut c_void, usize, *mut c_void, u32),
    write: unsafe extern "C" fn(*mut Blkq, u64, *const c_void, usize, *mut c_void, u32),
    flush: unsafe extern "C" fn(*mut Blkq, *mut c_void, u32),
    do_io: unsafe extern "C" fn(
        *mut Blkq,
        *mut Completion,
        c_int,
        c_int,
        *mut libc::timespec,
    ) -> c_int,
    error_msg: unsafe extern "C" fn() -> *const c_char,
    alloc_mem_region: unsafe extern "C" fn(*mut Blk, *mut MemRegion, usize) -> c_int,
    free_mem_region: unsafe extern "C" fn(*mut Blk, *const MemRegion),
    map_mem_region: unsafe extern "C" fn(*mut Blk, *const MemRegion) -> c_int,
    unmap_mem_region: unsafe extern "C" fn(*mut Blk, *const MemRegion),
}

impl Lib {
    fn load(path: &Path) -> Result<Lib> {
        // SAFETY: loading a shared library runs its initialisers; the user chose to run this
        // library (that is the point of the option).
        let lib = unsafe { libloading::Library::new(path) }.map_err(|source| Error::LibLoad {
            path: path.to_owned(),
            symbol: None,
            source,
        })?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is a libblkio 1.x function with exactly the signature of the
                // field it is stored in; the Library is kept alive alongside the pointer.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|source| {
                    Error::LibLoad {
                        path: path.to_owned(),
                        symbol: Some($name),
                        source,
                    }
                })?
            };
        }
        Ok(Lib {
            create: sym!("blkio_create"),
            connect: sym!("blkio_connect"),
            start: sym!("blkio_start"),
            destroy: sym!("blkio_destroy"),
            set_str: sym!("blkio_set_str"),
            get_uint64: sym!("blkio_get_uint64"),
            get_int: sym!("blkio_get_int"),
            get_bool: sym!("blkio_get_bool"),
            get_queue: sym!("blkio_get_queue"),
            read: sym!("blkioq_read"),
            write: sym!("blkioq_write"),
            flush: sym!("blkioq_flush"),
            do_io: sym!("blkioq_do_io"),
            error_msg: sym!("blkio_get_error_msg"),
            alloc_mem_region: sym!("blkio_alloc_mem_region"),
            free_mem_region: sym!("blkio_free_mem_region"),
            map_mem_region: sym!("blkio_map_mem_region"),
            unmap_mem_region: sym!("blkio_unmap_mem_region"),
            _lib: lib,
        })
    }

    fn err(&self, what: &str, ret: c_int) -> Error {
        // SAFETY: libblkio returns a thread-local NUL-terminated string (never null).
        let msg = unsafe {
            let p = (self.error_msg)();
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Error::LibCall {
            call: what.to_owned(),
            msg,
            source: std::io::Error::from_raw_os_error(-ret),
        }
    }
}

fn cstr(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Spec(format!("NUL byte in {s:?}")))
}

/// A libblkio library + driver name + properties, opened per configuration.
pub struct LibblkioTarget {
    lib: Arc<Lib>,
    lib_path: PathBuf,
    driver: String,
    /// Properties set before connect, in order (e.g. `path`).
    props: Vec<(String, String)>,
    /// Set `read-only=true` on file targets ([`Target::set_read_only`]).
    read_only: bool,
}

impl LibblkioTarget {
    /// Load `lib_path`; `props` are set on every instance before connect (add `path=...`).
    pub fn new(
        lib_path: &Path,
        driver: &str,
        props: Vec<(String, String)>,
    ) -> Result<LibblkioTarget> {
        Ok(LibblkioTarget {
            lib: Arc::new(Lib::load(lib_path)?),
            lib_path: lib_path.into(),
            driver: driver.into(),
            props,
            read_only: false,
        })
    }
}

struct LibDevice {
    lib: Arc<Lib>,
    b: *mut Blk,
    capacity: u64,
    alignment: Alignment,
    nq: usize,
    /// Regions mapped on the instance, each with whether the instance also allocated it
    /// (false: one of `private`).
    regions: Vec<(MemRegion, bool)>,
    /// After the instance is destroyed (in `drop`): its private buffers.
    private: PrivateBufs,
}

// SAFETY: a libblkio instance may be used from any thread, one at a time (we never share it).
unsafe impl Send for LibDevice {}

impl LibDevice {
    fn set(&mut self, k: &str, v: &str) -> Result<()> {
        let (kc, vc) = (cstr(k)?, cstr(v)?);
        // SAFETY: valid instance and NUL-terminated strings.
        let r = unsafe { (self.lib.set_str)(self.b, kc.as_ptr(), vc.as_ptr()) };
        if r < 0 {
            Err(self.lib.err(&format!("set {k}={v}"), r))
        } else {
            Ok(())
        }
    }
    fn check(&self, what: &str, r: c_int) -> Result<()> {
        if r < 0 {
            Err(self.lib.err(what, r))
        } else {
            Ok(())
        }
    }
    fn get_int(&self, k: &str) -> Result<c_int> {
        let kc = cstr(k)?;
        let mut v: c_int = 0;
        // SAFETY: valid instance, NUL-terminated name and out-pointer.
        let r = unsafe { (self.lib.get_int)(self.b, kc.as_ptr(), &mut v) };
        self.check(&format!("get {k}"), r)?;
        Ok(v)
    }
    fn get_bool(&self, k: &str) -> Result<bool> {
        let kc = cstr(k)?;
        let mut v = false;
        // SAFETY: valid instance, NUL-terminated name and out-pointer (C `bool`).
        let r = unsafe { (self.lib.get_bool)(self.b, kc.as_ptr(), &mut v) };
        self.check(&format!("get {k}"), r)?;
        Ok(v)
    }
}

impl Drop for LibDevice {
    fn drop(&mut self) {
        for (r, allocated) in std::mem::take(&mut self.regions) {
            // SAFETY: regions were mapped (and, if `allocated`, allocated) on this instance;
            // queues are gone.
            unsafe {
                (self.lib.unmap_mem_region)(self.b, &r);
                if allocated {
                    (self.lib.free_mem_region)(self.b, &r);
                }
            }
        }
        // SAFETY: `b` is the live instance; destroy also frees its queues.
        unsafe { (self.lib.destroy)(&mut self.b) };
        // The private buffers (the `private` field) are unmapped after this.
    }
}

impl Device for LibDevice {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn read_only(&self) -> bool {
        self.get_bool("read-only").unwrap_or(false)
    }
    fn alignment(&self) -> Alignment {
        self.alignment
    }
    fn take_queues(&mut self) -> Vec<Box<dyn Queue>> {
        (0..self.nq)
            .filter_map(|i| {
                // SAFETY: started instance, index below num-queues.
                let q = unsafe { (self.lib.get_queue)(self.b, i as c_int) };
                (!q.is_null()).then(|| {
                    Box::new(LibQueue {
                        lib: self.lib.clone(),
                        q,
                        outstanding: 0,
                        rejected: Vec::new(),
                    }) as Box<dyn Queue>
                })
            })
            .collect()
    }
    fn alloc_buf(&mut self, len: usize, iomem: Iomem) -> Result<MemRegion> {
        let a = self.alignment.buf.max(4096) as usize;
        let len = len.div_ceil(a) * a;
        let r = match iomem {
            Iomem::Memfd => {
                let mut r = MemRegion {
                    addr: std::ptr::null_mut(),
                    len: 0,
                    iova: 0,
                    fd_offset: 0,
                    fd: -1,
                    flags: 0,
                };
                // SAFETY: `r` is a valid out-pointer laid out as struct blkio_mem_region.
                let ret = unsafe { (self.lib.alloc_mem_region)(self.b, &mut r, len) };
                self.check("alloc_mem_region", ret)?;
                r
            }
            Iomem::Malloc => {
                let needs_fd = self.get_bool("needs-mem-region-fd")?;
                self.private.alloc(len, needs_fd)?
            }
        };
        let allocated = iomem == Iomem::Memfd;
        // SAFETY: `r` is live memory of `len` bytes (allocated by this instance or private to
        // this device, which outlives the instance).
        let ret = unsafe { (self.lib.map_mem_region)(self.b, &r) };
        if ret < 0 {
            if allocated {
                // SAFETY: allocated above, not mapped.
                unsafe { (self.lib.free_mem_region)(self.b, &r) };
            }
            return Err(self.lib.err("map_mem_region", ret));
        }
        self.regions.push((r, allocated));
        if !(r.addr as u64).is_multiple_of(self.alignment.buf) {
            return Err(Error::Lib(format!(
                "mem region at {:p} violates buf-alignment {}",
                r.addr, self.alignment.buf
            )));
        }
        Ok(r)
    }
}

impl Target for LibblkioTarget {
    fn open(&mut self, num_queues: usize, direct: bool) -> Result<Box<dyn Device>> {
        let drv = cstr(&self.driver)?;
        let mut b: *mut Blk = std::ptr::null_mut();
        // SAFETY: valid C string and out-pointer.
        let r = unsafe { (self.lib.create)(drv.as_ptr(), &mut b) };
        if r < 0 || b.is_null() {
            return Err(self.lib.err(&format!("blkio_create({})", self.driver), r));
        }
        let mut d = LibDevice {
            lib: self.lib.clone(),
            b,
            capacity: 0,
            alignment: Alignment::default(),
            nq: num_queues,
            regions: Vec::new(),
            private: PrivateBufs::default(),
        };
        for (k, v) in &self.props {
            d.set(k, v)?;
        }
        let has = |key: &str| self.props.iter().any(|(k, _)| k == key);
        if direct && !has("direct") {
            d.set("direct", "true")?;
        }
        // Only for targets with a file: `read-only` matters there, and drivers without files
        // need not know it.
        if self.read_only && has("path") && !has("read-only") {
            d.set("read-only", "true")?;
        }
        // SAFETY: valid instance.
        let r = unsafe { (d.lib.connect)(d.b) };
        d.check("connect", r)?;
        d.set("num-queues", &num_queues.to_string())?;
        // SAFETY: valid instance.
        let r = unsafe { (d.lib.start)(d.b) };
        d.check("start", r)?;
        let name = cstr("capacity")?;
        let mut cap = 0u64;
        // SAFETY: valid instance, name and out-pointer.
        let r = unsafe { (d.lib.get_uint64)(d.b, name.as_ptr(), &mut cap) };
        d.check("get capacity", r)?;
        d.capacity = cap;
        d.alignment = Alignment::of(
            d.get_int("request-alignment")?.into(),
            d.get_int("buf-alignment")?.into(),
        );
        Ok(Box::new(d))
    }
    fn describe(&self) -> String {
        format!(
            "libblkio {} driver {}",
            self.lib_path.display(),
            self.driver
        )
    }
    fn driver(&self) -> String {
        self.driver.clone()
    }
    fn set_read_only(&mut self, read_only: bool) {
        self.read_only = read_only;
    }
    fn path(&self) -> Option<PathBuf> {
        self.props
            .iter()
            .find(|(k, _)| k == "path")
            .map(|(_, v)| PathBuf::from(v))
    }
}

/// A `struct blkioq` as a [`Queue`].
struct LibQueue {
    lib: Arc<Lib>,
    q: *mut Blkq,
    outstanding: usize,
    rejected: Vec<Completion>,
}

// SAFETY: a libblkio queue may move between threads; it is used by one thread at a time.
unsafe impl Send for LibQueue {}

impl Queue for LibQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        let ud = req.user_data as *mut c_void;
        // SAFETY: the caller guarantees the buffers (per `Queue::enqueue`); the queue is live
        // while the device (which owns the Lib) is.
        unsafe {
            match req.op {
                Op::Read { offset, buf, len } => {
                    (self.lib.read)(self.q, offset, buf.cast(), len, ud, req.flags.0)
                }
                Op::Write { offset, buf, len } => {
                    (self.lib.write)(self.q, offset, buf.cast(), len, ud, req.flags.0)
                }
                Op::Flush => (self.lib.flush)(self.q, ud, req.flags.0),
                _ => {
                    self.rejected.push(Completion::err(
                        req.user_data,
                        libc::ENOTSUP,
                        c"not supported by the bench adapter",
                    ));
                    return;
                }
            }
        }
        self.outstanding += 1;
    }

    fn do_io(
        &mut self,
        out: &mut [Completion],
        min: usize,
        timeout: Option<&mut Duration>,
        _sigmask: Option<&libc::sigset_t>,
    ) -> snapblk_core::Result<usize> {
        let mut n = 0;
        while n < out.len()
            && let Some(c) = self.rejected.pop()
        {
            out[n] = c;
            n += 1;
        }
        let min = min.saturating_sub(n);
        let max = out.len() - n;
        if max == 0 || (self.outstanding == 0 && min == 0) {
            return Ok(n);
        }
        let mut ts = timeout.as_ref().map(|d| libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        let tsp = ts
            .as_mut()
            .map_or(std::ptr::null_mut(), |t| t as *mut libc::timespec);
        let (mi, ma) = (
            min.min(c_int::MAX as usize) as c_int,
            max.min(c_int::MAX as usize) as c_int,
        );
        // SAFETY: `out[n..]` has room for `max` completions laid out as struct blkio_completion.
        let r = unsafe { (self.lib.do_io)(self.q, out[n..].as_mut_ptr(), mi, ma, tsp) };
        if r < 0 {
            return Err(snapblk_core::Error::from_errno(-r));
        }
        self.outstanding -= (r as usize).min(self.outstanding);
        Ok(n + r as usize)
    }
    fn completion_fd(&self) -> Option<RawFd> {
        None
    }
    fn set_completion_fd_enabled(&mut self, _enabled: bool) {}
    fn outstanding(&self) -> usize {
        self.outstanding + self.rejected.len()
    }
}
