//! The exported functions. All `unsafe` of the C layer lives here: each block dereferences a
//! pointer the C caller passed, under the contract of the libblkio API.
#![allow(non_camel_case_types)]

use libc::{c_char, c_int, iovec, sigset_t, size_t, timespec};
use snapblk_core::sync::lock as lock_mutex;
use snapblk_core::{
    Blkio, Completion, Error, MemRegion, Op, PropValue, Queue, ReqFlags, Request, State, Zone,
    ZoneAction, ZoneOp,
};
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::time::Duration;

/// Size of the per-thread error buffer (messages are truncated to 255 bytes).
const ERRBUF: usize = 256;

thread_local! {
    static ERR: UnsafeCell<[u8; ERRBUF]> = const { UnsafeCell::new([0; ERRBUF]) };
}

fn set_msg(msg: &[u8]) {
    ERR.with(|b| {
        let n = msg.len().min(ERRBUF - 1);
        // SAFETY: the buffer is this thread's own; no reference to it is alive in Rust (C only
        // holds the pointer and must not read it concurrently with a call on the same thread).
        let buf = unsafe { &mut *b.get() };
        buf[..n].copy_from_slice(&msg[..n]);
        buf[n] = 0;
    });
}

fn fail(e: &Error) -> c_int {
    set_msg(e.msg.as_bytes());
    -e.errno.abs()
}

fn einval(msg: &'static str) -> c_int {
    fail(&Error::inval(msg))
}

/// Run `f`, turning a panic into `on_panic` (and an error message) instead of unwinding into C.
fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_msg(b"internal error in libblkio (snapblk): panic");
            on_panic
        }
    }
}

fn guard_int(f: impl FnOnce() -> c_int) -> c_int {
    guard(-libc::EIO, f)
}

/// `struct blkioq`: one queue, used by one thread at a time.
pub struct blkioq {
    q: Box<dyn Queue>,
}

/// `struct blkio`. Control calls are serialised by a mutex (libblkio's callers already do,
/// but nothing may break if they don't); queues live outside it so that I/O never takes it.
pub struct blkio {
    inner: Mutex<Inner>,
}

struct Inner {
    // Declared first: dropped before the instance, whose regions the queues may use.
    queues: Vec<*mut blkioq>,
    poll_queues: Vec<*mut blkioq>,
    b: Blkio,
}

// SAFETY: the queue pointers are owned boxes (see `Inner::drop`); each `blkioq` is `Send`
// (it holds a `Box<dyn Queue>`, and `Queue: Send`).
unsafe impl Send for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        for p in self.queues.drain(..).chain(self.poll_queues.drain(..)) {
            if !p.is_null() {
                // SAFETY: made by Box::into_raw in `adopt` and removed from the list here, so
                // freed exactly once.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

impl Inner {
    fn slots(&mut self, poll: bool) -> &mut Vec<*mut blkioq> {
        if poll {
            &mut self.poll_queues
        } else {
            &mut self.queues
        }
    }
    /// Move a queue from the instance into our slots (lowest free slot first).
    fn adopt(&mut self, q: Box<dyn Queue>, poll: bool) -> usize {
        let p = Box::into_raw(Box::new(blkioq { q }));
        let slots = self.slots(poll);
        match slots.iter().position(|s| s.is_null()) {
            Some(i) => {
                slots[i] = p;
                i
            }
            None => {
                slots.push(p);
                slots.len() - 1
            }
        }
    }
}

/// Lock the instance behind a C pointer.
///
/// # Safety
/// `b` must be null or a pointer returned by `blkio_create` and not yet destroyed.
unsafe fn lock<'a>(b: *mut blkio) -> Option<std::sync::MutexGuard<'a, Inner>> {
    if b.is_null() {
        return None;
    }
    // SAFETY: per the contract, `b` points to a live `blkio`; only shared access is taken.
    let m = unsafe { &(*b).inner };
    Some(lock_mutex(m))
}

/// The common frame of the int-returning calls on an instance: inside `guard_int`, take the
/// lock with `lock` (which wraps the one `unsafe` call, so that `f` stays safe code) and run `f`
/// on the instance; no instance (a NULL `b`) is `-EINVAL`.
fn with_blkio<'a>(
    lock: impl FnOnce() -> Option<std::sync::MutexGuard<'a, Inner>>,
    f: impl FnOnce(&mut Inner) -> c_int,
) -> c_int {
    guard_int(|| match lock() {
        Some(mut g) => f(&mut g),
        None => einval("b must be non-NULL"),
    })
}

/// 0, or the error reported as a negative errno.
fn status(r: Result<(), Error>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// # Safety
/// `s` must be null or a NUL-terminated string.
unsafe fn cstr<'a>(s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    unsafe { CStr::from_ptr(s) }.to_str().ok()
}

// ---------------------------------------------------------------------------------------------
// Error buffer

#[unsafe(no_mangle)]
pub extern "C" fn blkio_get_error_msg() -> *const c_char {
    ERR.with(|b| b.get() as *const c_char)
}

#[unsafe(no_mangle)]
pub extern "C" fn blkio_get_error_msg_() -> *const c_char {
    blkio_get_error_msg()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_set_error_msg_(msg: *const c_char, len: size_t) {
    guard((), || {
        if msg.is_null() {
            return set_msg(b"");
        }
        // SAFETY: the caller passes `len` readable bytes; stop at a NUL like the C helper.
        let s = unsafe { std::slice::from_raw_parts(msg as *const u8, len) };
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        set_msg(&s[..end]);
    })
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_create(driver: *const c_char, bp: *mut *mut blkio) -> c_int {
    guard_int(|| {
        if bp.is_null() {
            return einval("bp must be non-NULL");
        }
        // SAFETY: `bp` is a valid out-pointer per the API.
        unsafe { *bp = std::ptr::null_mut() };
        // SAFETY: `driver` is NULL or a C string per the API.
        let Some(name) = (unsafe { cstr(driver) }) else {
            return einval("Invalid driver name");
        };
        match snapblk::create(name) {
            Ok(b) => {
                let inner = Inner {
                    queues: Vec::new(),
                    poll_queues: Vec::new(),
                    b,
                };
                let p = Box::into_raw(Box::new(blkio {
                    inner: Mutex::new(inner),
                }));
                // SAFETY: as above.
                unsafe { *bp = p };
                0
            }
            Err(e) => fail(&e),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_connect(b: *mut blkio) -> c_int {
    // SAFETY: `b` is NULL or live per the API.
    with_blkio(|| unsafe { lock(b) }, |g| status(g.b.connect()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_start(b: *mut blkio) -> c_int {
    // SAFETY: `b` is NULL or live per the API.
    with_blkio(
        || unsafe { lock(b) },
        |g| {
            let was = g.b.state();
            if let Err(e) = g.b.start() {
                return fail(&e);
            }
            if was == State::Connected {
                let nq = g.b.get_int("num-queues").unwrap_or(0).max(0) as usize;
                let np = g.b.get_int("num-poll-queues").unwrap_or(0).max(0) as usize;
                for (n, poll) in [(nq, false), (np, true)] {
                    for i in 0..n {
                        if let Some(q) = g.b.take_queue(i, poll) {
                            g.adopt(q, poll);
                        }
                    }
                }
            }
            0
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_destroy(bp: *mut *mut blkio) {
    guard((), || {
        if bp.is_null() {
            return;
        }
        // SAFETY: `bp` is a valid pointer to a `blkio *` per the API.
        let p = unsafe { std::ptr::replace(bp, std::ptr::null_mut()) };
        if !p.is_null() {
            // SAFETY: `p` came from `blkio_create` (Box::into_raw) and is destroyed once.
            drop(unsafe { Box::from_raw(p) });
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Properties

/// Common part of the getters: returns the value or the error already reported.
unsafe fn get_prop(
    b: *mut blkio,
    name: *const c_char,
    ty: Option<snapblk_core::PropType>,
) -> Result<PropValue, c_int> {
    // SAFETY: as above.
    let Some(g) = (unsafe { lock(b) }) else {
        return Err(einval("b must be non-NULL"));
    };
    // SAFETY: `name` is NULL or a C string.
    let Some(n) = (unsafe { cstr(name) }) else {
        return Err(einval("Invalid property name"));
    };
    g.b.get(n, ty).map_err(|e| fail(&e))
}

unsafe fn set_prop(b: *mut blkio, name: *const c_char, v: PropValue) -> c_int {
    // SAFETY: `b` is NULL or live per the API.
    with_blkio(
        || unsafe { lock(b) },
        |g| {
            // SAFETY: `name` is NULL or a C string.
            match unsafe { cstr(name) } {
                Some(n) => status(g.b.set(n, v)),
                None => einval("Invalid property name"),
            }
        },
    )
}

/// Store `v` through `out` if it is not NULL.
unsafe fn put<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: a non-NULL out-pointer is valid per the API.
        unsafe { out.write(v) };
    }
}

/// The C types of the typed property calls (`blkio_get_bool`/`blkio_set_bool`, …).
trait CProp: Copy + Default {
    const TYPE: snapblk_core::PropType;
    /// The value if it has this type.
    fn from_prop(v: PropValue) -> Option<Self>;
    fn into_prop(self) -> PropValue;
}

macro_rules! c_prop {
    ($t:ty, $variant:ident) => {
        impl CProp for $t {
            const TYPE: snapblk_core::PropType = snapblk_core::PropType::$variant;
            fn from_prop(v: PropValue) -> Option<Self> {
                match v {
                    PropValue::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn into_prop(self) -> PropValue {
                PropValue::$variant(self)
            }
        }
    };
}
c_prop!(bool, Bool);
c_prop!(c_int, Int);
c_prop!(u64, U64);

/// Body of the typed getters. `*value` is always written when `value` is not NULL (the zero
/// value on error); a value of another type than asked for is `-EIO`.
///
/// # Safety
/// `b`, `name` and `value` as in the libblkio API (each NULL or valid).
unsafe fn get_typed<T: CProp>(b: *mut blkio, name: *const c_char, value: *mut T) -> c_int {
    guard_int(|| {
        // SAFETY: pointers per the API.
        let (v, rc) = match unsafe { get_prop(b, name, Some(T::TYPE)) }.map(T::from_prop) {
            Ok(Some(v)) => (v, 0),
            Ok(None) => (T::default(), -libc::EIO),
            Err(rc) => (T::default(), rc),
        };
        // SAFETY: as above.
        unsafe { put(value, v) };
        if value.is_null() && rc == 0 {
            einval("value must be non-NULL")
        } else {
            rc
        }
    })
}

/// Body of the typed setters.
///
/// # Safety
/// `b` and `name` as in the libblkio API (each NULL or valid).
unsafe fn set_typed<T: CProp>(b: *mut blkio, name: *const c_char, value: T) -> c_int {
    // SAFETY: pointers per the API.
    unsafe { set_prop(b, name, value.into_prop()) }
}

/// The exported getter and setter of one C type: thin skins over `get_typed`/`set_typed`.
/// (`extern "C"` functions cannot be generic, hence one pair per type.)
macro_rules! typed_prop_fns {
    ($($get:ident, $set:ident: $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $get(b: *mut blkio, name: *const c_char, value: *mut $t) -> c_int {
            // SAFETY: the caller's pointers, passed on under the same contract.
            unsafe { get_typed(b, name, value) }
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $set(b: *mut blkio, name: *const c_char, value: $t) -> c_int {
            // SAFETY: as above.
            unsafe { set_typed(b, name, value) }
        }
    )*};
}

typed_prop_fns! {
    blkio_get_bool, blkio_set_bool: bool;
    blkio_get_int, blkio_set_int: c_int;
    blkio_get_uint64, blkio_set_uint64: u64;
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_get_str(
    b: *mut blkio,
    name: *const c_char,
    value: *mut *mut c_char,
) -> c_int {
    guard_int(|| {
        // SAFETY: as above.
        unsafe { put(value, std::ptr::null_mut()) };
        // SAFETY: pointers per the API.
        let s = match unsafe { get_prop(b, name, None) } {
            Ok(v) => v.to_display_string(),
            Err(rc) => return rc,
        };
        if value.is_null() {
            return einval("value must be non-NULL");
        }
        // SAFETY: allocating len+1 bytes; checked for NULL below.
        let p = unsafe { libc::malloc(s.len() + 1) } as *mut u8;
        if p.is_null() {
            return fail(&Error::from_errno(libc::ENOMEM));
        }
        // SAFETY: `p` has room for the bytes and the NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), p, s.len());
            *p.add(s.len()) = 0;
            *value = p as *mut c_char;
        }
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_set_str(
    b: *mut blkio,
    name: *const c_char,
    value: *const c_char,
) -> c_int {
    // SAFETY: `b` is NULL or live per the API.
    with_blkio(
        || unsafe { lock(b) },
        |g| {
            // SAFETY: as above.
            let Some(n) = (unsafe { cstr(name) }) else {
                return einval("Invalid property name");
            };
            // SAFETY: as above.
            let Some(v) = (unsafe { cstr(value) }) else {
                return einval("Invalid value string");
            };
            status(g.b.set_str(n, v))
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Memory regions

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_alloc_mem_region(
    b: *mut blkio,
    region: *mut MemRegion,
    len: size_t,
) -> c_int {
    // SAFETY: `b` is NULL or live per the API.
    with_blkio(
        || unsafe { lock(b) },
        |g| {
            if region.is_null() {
                return einval("region must be non-NULL");
            }
            match g.b.alloc_mem_region(len) {
                Ok(r) => {
                    // SAFETY: `region` is a valid out-pointer per the API.
                    unsafe { region.write(r) };
                    0
                }
                Err(e) => fail(&e),
            }
        },
    )
}

/// Body of the region calls that return nothing: a NULL instance or region does nothing.
///
/// # Safety
/// `b` and `region` as in the libblkio API (each NULL or valid).
unsafe fn with_region(
    b: *mut blkio,
    region: *const MemRegion,
    f: impl FnOnce(&mut Blkio, MemRegion),
) {
    guard((), || {
        // SAFETY: as above.
        let Some(mut g) = (unsafe { lock(b) }) else {
            return;
        };
        if region.is_null() {
            return;
        }
        // SAFETY: a non-NULL region pointer points to a region struct per the API.
        let r = unsafe { region.read() };
        f(&mut g.b, r)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_free_mem_region(b: *mut blkio, region: *const MemRegion) {
    // SAFETY: pointers per the API. Unknown or still-mapped regions are ignored (libblkio
    // aborted the process).
    unsafe {
        with_region(b, region, |b, r| {
            let _ = b.free_mem_region(&r);
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_map_mem_region(b: *mut blkio, region: *const MemRegion) -> c_int {
    // SAFETY: `b` is NULL or live per the API.
    with_blkio(
        || unsafe { lock(b) },
        |g| {
            if region.is_null() {
                return einval("region must be non-NULL");
            }
            // SAFETY: as above.
            let r = unsafe { region.read() };
            status(g.b.map_mem_region(&r))
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_unmap_mem_region(b: *mut blkio, region: *const MemRegion) {
    // SAFETY: pointers per the API.
    unsafe { with_region(b, region, |b, r| b.unmap_mem_region(&r)) }
}

// ---------------------------------------------------------------------------------------------
// Queues

unsafe fn get_queue(b: *mut blkio, index: c_int, poll: bool) -> *mut blkioq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: as above.
        let Some(mut g) = (unsafe { lock(b) }) else {
            return std::ptr::null_mut();
        };
        if index < 0 {
            return std::ptr::null_mut();
        }
        g.slots(poll)
            .get(index as usize)
            .copied()
            .unwrap_or(std::ptr::null_mut())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_get_queue(b: *mut blkio, index: c_int) -> *mut blkioq {
    // SAFETY: pointers per the API.
    unsafe { get_queue(b, index, false) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_get_poll_queue(b: *mut blkio, index: c_int) -> *mut blkioq {
    // SAFETY: pointers per the API.
    unsafe { get_queue(b, index, true) }
}

unsafe fn add_queue(b: *mut blkio, poll: bool) -> c_int {
    // SAFETY: `b` is NULL or live per the API.
    with_blkio(
        || unsafe { lock(b) },
        |g| {
            let idx = match g.b.add_queue(poll) {
                Ok(i) => i,
                Err(e) => return fail(&e),
            };
            match g.b.take_queue(idx, poll) {
                Some(q) => g.adopt(q, poll).min(i32::MAX as usize) as c_int,
                None => fail(&Error::new(libc::EIO, "queue vanished")),
            }
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_add_queue(b: *mut blkio) -> c_int {
    // SAFETY: pointers per the API.
    unsafe { add_queue(b, false) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_add_poll_queue(b: *mut blkio) -> c_int {
    // SAFETY: pointers per the API.
    unsafe { add_queue(b, true) }
}

unsafe fn remove_queue(b: *mut blkio, index: c_int, poll: bool) -> c_int {
    // SAFETY: `b` is NULL or live per the API.
    with_blkio(
        || unsafe { lock(b) },
        |g| {
            let slot = if index >= 0 {
                g.slots(poll).get_mut(index as usize)
            } else {
                None
            };
            match slot {
                Some(p) if !p.is_null() => {
                    let q = std::mem::replace(p, std::ptr::null_mut());
                    // SAFETY: from Box::into_raw in `adopt`; cleared from the slot, so freed once.
                    drop(unsafe { Box::from_raw(q) });
                    0
                }
                _ => fail(&Error::new(
                    libc::ENOENT,
                    format!("no queue with index {index}"),
                )),
            }
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_remove_queue(b: *mut blkio, index: c_int) -> c_int {
    // SAFETY: pointers per the API.
    unsafe { remove_queue(b, index, false) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkio_remove_poll_queue(b: *mut blkio, index: c_int) -> c_int {
    // SAFETY: pointers per the API.
    unsafe { remove_queue(b, index, true) }
}

/// # Safety
/// `q` must be NULL or a live queue used by this thread only.
unsafe fn queue<'a>(q: *mut blkioq) -> Option<&'a mut blkioq> {
    // SAFETY: per the contract.
    unsafe { q.as_mut() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkioq_get_completion_fd(q: *mut blkioq) -> c_int {
    guard(-1, || {
        // SAFETY: pointers per the API.
        unsafe { queue(q) }
            .and_then(|q| q.q.completion_fd())
            .unwrap_or(-1)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkioq_set_completion_fd_enabled(q: *mut blkioq, enable: bool) {
    guard((), || {
        // SAFETY: pointers per the API.
        if let Some(q) = unsafe { queue(q) } {
            q.q.set_completion_fd_enabled(enable)
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Requests

unsafe fn enqueue(q: *mut blkioq, op: Op, user_data: *mut libc::c_void, flags: u32) {
    guard((), || {
        // SAFETY: pointers per the API.
        if let Some(q) = unsafe { queue(q) } {
            // SAFETY: the caller keeps the buffers valid until the completion (libblkio API).
            unsafe {
                q.q.enqueue(Request::new(op, user_data as usize, ReqFlags(flags)))
            }
        }
    })
}

/// A zone management request on the zone at `offset` (`None`: every zone).
fn zone(action: ZoneAction, offset: Option<u64>) -> Op {
    Op::Zone(ZoneOp::Manage { action, offset })
}

/// The request entry points: `NAME(q, ARGS…, user_data, flags)` enqueues the `Op` built from
/// ARGS. Only the C signature and the `Op` differ between them.
macro_rules! request_fns {
    ($($name:ident($($arg:ident: $t:ty),*) => $op:expr;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            q: *mut blkioq,
            $($arg: $t,)*
            user_data: *mut libc::c_void,
            flags: u32,
        ) {
            // SAFETY: forwarded API contract.
            unsafe { enqueue(q, $op, user_data, flags) }
        }
    )*};
}

request_fns! {
    blkioq_read(start: u64, buf: *mut libc::c_void, len: size_t) =>
        Op::Read { offset: start, buf: buf.cast(), len };
    blkioq_write(start: u64, buf: *const libc::c_void, len: size_t) =>
        Op::Write { offset: start, buf: buf.cast(), len };
    blkioq_readv(start: u64, iov: *const iovec, iovcnt: c_int) =>
        Op::Readv { offset: start, iov, iovcnt };
    blkioq_writev(start: u64, iov: *mut iovec, iovcnt: c_int) =>
        Op::Writev { offset: start, iov, iovcnt };
    blkioq_write_zeroes(start: u64, len: u64) => Op::WriteZeroes { offset: start, len };
    blkioq_discard(start: u64, len: u64) => Op::Discard { offset: start, len };
    blkioq_flush() => Op::Flush;
    // Zoned storage: carried out by nvme-io_uring on a zoned namespace, failed by the others.
    blkioq_report_zones(offset: u64, zones: *mut Zone, nr_zones: u32) =>
        Op::Zone(ZoneOp::Report { offset, zones, nr_zones });
    blkioq_close_zone(offset: u64) => zone(ZoneAction::Close, Some(offset));
    blkioq_finish_zone(offset: u64) => zone(ZoneAction::Finish, Some(offset));
    blkioq_open_zone(offset: u64) => zone(ZoneAction::Open, Some(offset));
    blkioq_reset_zone(offset: u64) => zone(ZoneAction::Reset, Some(offset));
    blkioq_close_all_zones() => zone(ZoneAction::Close, None);
    blkioq_finish_all_zones() => zone(ZoneAction::Finish, None);
    blkioq_open_all_zones() => zone(ZoneAction::Open, None);
    blkioq_reset_all_zones() => zone(ZoneAction::Reset, None);
}

// ---------------------------------------------------------------------------------------------
// Completions

unsafe fn do_io(
    q: *mut blkioq,
    completions: *mut Completion,
    min: c_int,
    max: c_int,
    timeout: *mut timespec,
    sig: Option<*const sigset_t>,
) -> c_int {
    guard_int(|| {
        // SAFETY: `timeout` is NULL or valid per the API.
        let mut dur = match unsafe { timeout.as_ref() } {
            None => None,
            Some(t) if t.tv_sec < 0 => return einval("tv_sec cannot be negative"),
            Some(t) if !(0..1_000_000_000).contains(&t.tv_nsec) => {
                return einval("tv_nsec must be less than one second");
            }
            Some(t) => Some(Duration::new(t.tv_sec as u64, t.tv_nsec as u32)),
        };
        if min < 0 {
            return einval("min_completions cannot be negative");
        }
        if max < 0 {
            return einval("max_completions cannot be negative");
        }
        if min > max {
            return einval("min_completions must be less than or equal to max_completions");
        }
        if completions.is_null() && max > 0 {
            return einval("max_completions must be 0 when completions is NULL");
        }
        if let Some(s) = sig
            && s.is_null()
        {
            return einval("sig must be non-NULL");
        }
        // SAFETY: pointers per the API.
        let Some(q) = (unsafe { queue(q) }) else {
            return einval("q must be non-NULL");
        };
        let out: &mut [Completion] = if max == 0 {
            &mut []
        } else {
            // SAFETY: the caller provides room for `max` completions. Zero them first so the
            // slice never exposes uninitialised memory as Rust values.
            unsafe {
                std::ptr::write_bytes(completions, 0, max as usize);
                std::slice::from_raw_parts_mut(completions, max as usize)
            }
        };
        // SAFETY: a non-NULL sigmask pointer is valid per the API.
        let mask = sig.map(|s| unsafe { &*s });
        let r = q.q.do_io(out, min as usize, dur.as_mut(), mask);
        if let (Some(d), false) = (dur, timeout.is_null()) {
            // SAFETY: checked non-NULL and valid above.
            unsafe {
                (*timeout).tv_sec = d.as_secs() as libc::time_t;
                (*timeout).tv_nsec = d.subsec_nanos() as libc::c_long;
            }
        }
        match r {
            Ok(n) => n as c_int,
            Err(e) => fail(&e),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkioq_do_io(
    q: *mut blkioq,
    completions: *mut Completion,
    min_completions: c_int,
    max_completions: c_int,
    timeout: *mut timespec,
) -> c_int {
    // SAFETY: forwarded API contract.
    unsafe {
        do_io(
            q,
            completions,
            min_completions,
            max_completions,
            timeout,
            None,
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkioq_do_io_interruptible(
    q: *mut blkioq,
    completions: *mut Completion,
    min_completions: c_int,
    max_completions: c_int,
    timeout: *mut timespec,
    sig: *const sigset_t,
) -> c_int {
    // SAFETY: forwarded API contract.
    unsafe {
        do_io(
            q,
            completions,
            min_completions,
            max_completions,
            timeout,
            Some(sig),
        )
    }
}
