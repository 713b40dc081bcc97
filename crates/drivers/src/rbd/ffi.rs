//! librados/librbd's C API, loaded at run time with `dlopen` (so machines without Ceph build and
//! run everything else), and the handles the driver keeps: a cluster connection, an I/O context
//! and an open image, closed in that order's reverse when the last user drops them.
//!
//! Every `unsafe` of the driver that calls into librbd lives here or names the function pointer
//! it calls from [`Lib`].

use super::lease::{LOCK_SECS, Lease};
use snapblk_core::{Error, Result};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// `rados_t`, `rados_ioctx_t`, `rbd_image_t`, `rbd_completion_t`: opaque pointers.
pub(super) type Handle = *mut c_void;
/// `rbd_callback_t`.
pub(super) type Callback = unsafe extern "C" fn(c: Handle, arg: *mut c_void);

/// `RBD_WRITE_ZEROES_FLAG_THICK_PROVISION`: a zeroed extent stays allocated (`BLKIO_REQ_NO_UNMAP`).
pub(super) const WRITE_ZEROES_THICK: c_int = 1;

/// `rbd_image_info_t` (librbd.h).
#[repr(C)]
pub(super) struct ImageInfo {
    pub(super) size: u64,
    pub(super) obj_size: u64,
    num_objs: u64,
    order: c_int,
    block_name_prefix: [c_char; 24],
    parent_pool: i64,
    parent_name: [c_char; 96],
}

/// The functions the driver calls, resolved once per process.
pub(super) struct Lib {
    pub(super) rados_create2:
        unsafe extern "C" fn(*mut Handle, *const c_char, *const c_char, u64) -> c_int,
    pub(super) rados_conf_read_file: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    pub(super) rados_conf_set: unsafe extern "C" fn(Handle, *const c_char, *const c_char) -> c_int,
    pub(super) rados_conf_get:
        unsafe extern "C" fn(Handle, *const c_char, *mut c_char, usize) -> c_int,
    pub(super) rados_connect: unsafe extern "C" fn(Handle) -> c_int,
    pub(super) rados_shutdown: unsafe extern "C" fn(Handle),
    pub(super) rados_ioctx_create:
        unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> c_int,
    pub(super) rados_ioctx_set_namespace: unsafe extern "C" fn(Handle, *const c_char),
    pub(super) rados_ioctx_destroy: unsafe extern "C" fn(Handle),
    pub(super) rbd_open:
        unsafe extern "C" fn(Handle, *const c_char, *mut Handle, *const c_char) -> c_int,
    pub(super) rbd_open_read_only:
        unsafe extern "C" fn(Handle, *const c_char, *mut Handle, *const c_char) -> c_int,
    pub(super) rbd_close: unsafe extern "C" fn(Handle) -> c_int,
    pub(super) rbd_flush: unsafe extern "C" fn(Handle) -> c_int,
    pub(super) rbd_get_size: unsafe extern "C" fn(Handle, *mut u64) -> c_int,
    pub(super) rbd_resize: unsafe extern "C" fn(Handle, u64) -> c_int,
    pub(super) rbd_stat: unsafe extern "C" fn(Handle, *mut ImageInfo, usize) -> c_int,
    pub(super) rbd_get_id: unsafe extern "C" fn(Handle, *mut c_char, usize) -> c_int,
    pub(super) rados_lock_exclusive: unsafe extern "C" fn(
        Handle,
        *const c_char,
        *const c_char,
        *const c_char,
        *const c_char,
        *mut libc::timeval,
        u8,
    ) -> c_int,
    pub(super) rados_lock_shared: unsafe extern "C" fn(
        Handle,
        *const c_char,
        *const c_char,
        *const c_char,
        *const c_char,
        *const c_char,
        *mut libc::timeval,
        u8,
    ) -> c_int,
    pub(super) rados_unlock:
        unsafe extern "C" fn(Handle, *const c_char, *const c_char, *const c_char) -> c_int,
    pub(super) rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, Callback, *mut Handle) -> c_int,
    pub(super) rbd_aio_get_return_value: unsafe extern "C" fn(Handle) -> isize,
    pub(super) rbd_aio_release: unsafe extern "C" fn(Handle),
    pub(super) rbd_aio_readv:
        unsafe extern "C" fn(Handle, *const libc::iovec, c_int, u64, Handle) -> c_int,
    pub(super) rbd_aio_writev:
        unsafe extern "C" fn(Handle, *const libc::iovec, c_int, u64, Handle) -> c_int,
    pub(super) rbd_aio_flush: unsafe extern "C" fn(Handle, Handle) -> c_int,
    pub(super) rbd_aio_discard: unsafe extern "C" fn(Handle, u64, u64, Handle) -> c_int,
    pub(super) rbd_aio_write_zeroes:
        unsafe extern "C" fn(Handle, u64, usize, Handle, c_int, c_int) -> c_int,
}

/// The shared objects, overridable for tests and unusual installs.
const RADOS_SO: &str = "librados.so.2";
const RBD_SO: &str = "librbd.so.1";

static LIB: OnceLock<std::result::Result<Lib, String>> = OnceLock::new();

/// The loaded library, or ENOENT saying what is missing and how to get it.
pub(super) fn lib() -> Result<&'static Lib> {
    LIB.get_or_init(load).as_ref().map_err(|m| {
        Error::new(
            libc::ENOENT,
            format!("rbd: {m} (install librbd1, e.g. apt-get install librbd1)"),
        )
    })
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn open_so(var: &str, default: &str) -> std::result::Result<*mut c_void, String> {
    let name = std::env::var(var).unwrap_or_else(|_| default.to_owned());
    let c = CString::new(name.clone()).map_err(|_| format!("{var}: NUL in the name"))?;
    // SAFETY: a valid C string; the handle is kept for the life of the process (never closed:
    // completions may call into the library until the last image is closed).
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // dlerror names the file itself ("NAME: cannot open shared object file: ...").
        let why = dlerror();
        let why = why.strip_prefix(&format!("{name}: ")).unwrap_or(&why);
        return Err(format!("cannot load {name}: {why}"));
    }
    Ok(h)
}

// The target type of each transmute is the `Lib` field it initialises (its C prototype).
#[allow(clippy::missing_transmute_annotations)]
fn load() -> std::result::Result<Lib, String> {
    let rados = open_so("SNAPBLK_LIBRADOS", RADOS_SO)?;
    let rbd = open_so("SNAPBLK_LIBRBD", RBD_SO)?;
    macro_rules! sym {
        ($h:expr, $name:ident) => {{
            let n = concat!(stringify!($name), "\0");
            // SAFETY: a NUL-terminated name and a live handle.
            let p = unsafe { libc::dlsym($h, n.as_ptr().cast()) };
            if p.is_null() {
                return Err(format!("librbd/librados lack {}", stringify!($name)));
            }
            // SAFETY: the symbol is the C function of that name, whose prototype in librbd.h /
            // librados.h (Ceph 16 and later) is the field's type.
            unsafe { std::mem::transmute::<*mut c_void, _>(p) }
        }};
    }
    Ok(Lib {
        rados_create2: sym!(rados, rados_create2),
        rados_conf_read_file: sym!(rados, rados_conf_read_file),
        rados_conf_set: sym!(rados, rados_conf_set),
        rados_conf_get: sym!(rados, rados_conf_get),
        rados_connect: sym!(rados, rados_connect),
        rados_shutdown: sym!(rados, rados_shutdown),
        rados_ioctx_create: sym!(rados, rados_ioctx_create),
        rados_ioctx_set_namespace: sym!(rados, rados_ioctx_set_namespace),
        rados_ioctx_destroy: sym!(rados, rados_ioctx_destroy),
        rbd_open: sym!(rbd, rbd_open),
        rbd_open_read_only: sym!(rbd, rbd_open_read_only),
        rbd_close: sym!(rbd, rbd_close),
        rbd_flush: sym!(rbd, rbd_flush),
        rbd_get_size: sym!(rbd, rbd_get_size),
        rbd_resize: sym!(rbd, rbd_resize),
        rbd_stat: sym!(rbd, rbd_stat),
        rbd_get_id: sym!(rbd, rbd_get_id),
        rados_lock_exclusive: sym!(rados, rados_lock_exclusive),
        rados_lock_shared: sym!(rados, rados_lock_shared),
        rados_unlock: sym!(rados, rados_unlock),
        rbd_aio_create_completion: sym!(rbd, rbd_aio_create_completion),
        rbd_aio_get_return_value: sym!(rbd, rbd_aio_get_return_value),
        rbd_aio_release: sym!(rbd, rbd_aio_release),
        rbd_aio_readv: sym!(rbd, rbd_aio_readv),
        rbd_aio_writev: sym!(rbd, rbd_aio_writev),
        rbd_aio_flush: sym!(rbd, rbd_aio_flush),
        rbd_aio_discard: sym!(rbd, rbd_aio_discard),
        rbd_aio_write_zeroes: sym!(rbd, rbd_aio_write_zeroes),
    })
}

/// A C string from a property value (a NUL inside is refused).
pub(super) fn cstr(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::inval(format!("rbd: {what} contains a NUL byte")))
}

/// `strerror` of a negative librados/librbd return value.
pub(super) fn os_msg(ret: c_int) -> String {
    std::io::Error::from_raw_os_error(-ret).to_string()
}

/// A connected cluster handle and one pool's I/O context.
pub(super) struct Cluster {
    lib: &'static Lib,
    cluster: Handle,
    ioctx: Handle,
}

/// What [`Cluster::connect`] needs: names and the settings applied before connecting.
pub(super) struct ConnectArgs<'a> {
    pub(super) id: &'a str,
    /// `None`: the default search path, silently skipped when absent; `Some("")`: none.
    pub(super) conf: Option<&'a str>,
    pub(super) settings: Vec<(&'static str, String)>,
    pub(super) pool: &'a str,
    pub(super) namespace: &'a str,
}

impl Cluster {
    /// Create, configure and connect, then open the pool (and namespace).
    pub(super) fn connect(a: &ConnectArgs<'_>) -> Result<Cluster> {
        let lib = lib()?;
        let name = cstr("id", &format!("client.{}", a.id))?;
        let mut cluster: Handle = std::ptr::null_mut();
        // SAFETY: valid out pointer and C strings.
        let r = unsafe { (lib.rados_create2)(&mut cluster, c"ceph".as_ptr(), name.as_ptr(), 0) };
        if r < 0 {
            return Err(Error::new(-r, format!("rbd: rados_create2: {}", os_msg(r))));
        }
        // From here on the handle is shut down by Drop.
        let mut c = Cluster {
            lib,
            cluster,
            ioctx: std::ptr::null_mut(),
        };
        match a.conf {
            None => {
                // SAFETY: a created handle; NULL means the default search path.
                unsafe { (lib.rados_conf_read_file)(cluster, std::ptr::null()) };
            }
            Some("") => {}
            Some(p) => {
                let cp = cstr("conf", p)?;
                // SAFETY: a created handle and a C string.
                let r = unsafe { (lib.rados_conf_read_file)(cluster, cp.as_ptr()) };
                if r < 0 {
                    return Err(Error::new(
                        -r,
                        format!("rbd: reading conf {p}: {}", os_msg(r)),
                    ));
                }
            }
        }
        for (k, v) in &a.settings {
            let (ck, cv) = (cstr(k, k)?, cstr(k, v)?);
            // SAFETY: a created, not yet connected handle and C strings.
            let r = unsafe { (lib.rados_conf_set)(cluster, ck.as_ptr(), cv.as_ptr()) };
            if r < 0 {
                return Err(Error::new(
                    -r,
                    format!("rbd: setting {k}={v}: {}", os_msg(r)),
                ));
            }
        }
        // SAFETY: a configured handle. Bounded by client_mount_timeout.
        let r = unsafe { (lib.rados_connect)(cluster) };
        if r < 0 {
            let hint = if r == -libc::ETIMEDOUT {
                c.why_timed_out(a.id)
            } else {
                String::new()
            };
            return Err(Error::new(
                -r,
                format!(
                    "rbd: connecting to the cluster as client.{}: {}{hint}",
                    a.id,
                    os_msg(r)
                ),
            ));
        }
        let pool = cstr("pool", a.pool)?;
        // SAFETY: a connected handle, a C string, a valid out pointer.
        let r = unsafe { (lib.rados_ioctx_create)(cluster, pool.as_ptr(), &mut c.ioctx) };
        if r < 0 {
            c.ioctx = std::ptr::null_mut();
            return Err(Error::new(
                -r,
                format!("rbd: pool '{}': {}", a.pool, os_msg(r)),
            ));
        }
        if !a.namespace.is_empty() {
            let ns = cstr("namespace", a.namespace)?;
            // SAFETY: a live I/O context and a C string (copied by librados).
            unsafe { (lib.rados_ioctx_set_namespace)(c.ioctx, ns.as_ptr()) };
        }
        Ok(c)
    }

    /// A configuration value of the handle (`None` if unset or unreadable).
    fn conf_get(&self, key: &CStr) -> Option<String> {
        let mut buf = vec![0u8; 4096];
        // SAFETY: a created handle, a C string, and a buffer of the length given.
        let r = unsafe {
            (self.lib.rados_conf_get)(
                self.cluster,
                key.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if r < 0 {
            return None;
        }
        let s = CStr::from_bytes_until_nul(&buf).ok()?.to_str().ok()?;
        (!s.is_empty()).then(|| s.to_string())
    }

    /// What a connect that timed out is told, after asking the configured monitors directly
    /// ([`super::monitors`]): whether one of them answers (so it did not let `client.ID` in)
    /// or none does.
    fn why_timed_out(&self, id: &str) -> String {
        use super::monitors::{Probe, addresses, probe};
        let host = self.conf_get(c"mon_host").unwrap_or_default();
        // The value librados waited, read back from it: what the user set, or the default.
        let within = match self.conf_get(c"client_mount_timeout") {
            Some(t) => format!("within client-mount-timeout ({t} s)"),
            None => "within client-mount-timeout".to_string(),
        };
        match probe(&addresses(&host), std::time::Duration::from_secs(1)) {
            Probe::Answers(m) => format!(
                " (the monitor at {m} answers but did not let client.{id} in {within}: \
                 a wrong key, a user the cluster does not know, or \
                 monitors without quorum)"
            ),
            Probe::Silent { asked, .. } if asked.is_empty() => format!(
                " (no monitor answered {within}, or the cluster did not accept the key; \
                 mon_host {host:?} names no address to ask)"
            ),
            Probe::Silent { asked, skipped } => format!(
                " (no monitor answered at {}{} {within})",
                asked.join(", "),
                if skipped > 0 {
                    format!(" ({skipped} more not asked)")
                } else {
                    String::new()
                }
            ),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.ioctx.is_null() {
            // SAFETY: created by rados_ioctx_create; every image on it is closed already
            // (an Image holds its Cluster).
            unsafe { (self.lib.rados_ioctx_destroy)(self.ioctx) };
        }
        // SAFETY: created by rados_create2; nothing uses it any more.
        unsafe { (self.lib.rados_shutdown)(self.cluster) };
    }
}

/// An open image and the lock held on it, if any.
pub(super) struct Image {
    pub(super) lib: &'static Lib,
    pub(super) image: Handle,
    lock: Option<LockHolder>,
    cluster: Cluster,
}

// SAFETY: librbd image handles, completions and cluster handles are thread-safe (librbd
// serialises internally; QEMU and fio drive one image from several threads).
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

/// How the image is locked against other snapblk users (RBD advisory locks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LockMode {
    None,
    Shared,
    Exclusive,
}

/// The tag every snapblk shared lock carries (shared locks coexist only with the same tag).
const LOCK_TAG: &CStr = c"snapblk";
/// The lock's name on the image's header object. Not librbd's own (`rbd_lock`, which its
/// exclusive-lock feature takes for every writer): a second lock of that name would stall
/// the holder's own writes.
const LOCK_NAME: &CStr = c"snapblk";
/// The holder renews its lock this often (it lasts [`LOCK_SECS`]).
const LOCK_RENEW: std::time::Duration = std::time::Duration::from_secs(10);

/// A raw pointer that a renewal thread may carry (the I/O context outlives the thread).
struct SendPtr(Handle);
// SAFETY: librados I/O contexts are thread-safe; the holder joins the thread before the
// context is destroyed.
unsafe impl Send for SendPtr {}

/// A cls lock on the image's header object (`rados_lock_*`), renewed by a thread and released
/// on drop.
struct LockHolder {
    lib: &'static Lib,
    ioctx: Handle,
    oid: CString,
    cookie: CString,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Whether writes may still go out (exclusive locks only).
    lease: Option<Arc<Lease>>,
}

impl LockHolder {
    /// One lock (or renewal) call.
    fn call(
        lib: &Lib,
        io: Handle,
        oid: &CStr,
        cookie: &CStr,
        mode: LockMode,
        renew: bool,
    ) -> c_int {
        let mut d = libc::timeval {
            tv_sec: LOCK_SECS as libc::time_t,
            tv_usec: 0,
        };
        // An exclusive lock renews with LIBRADOS_LOCK_FLAG_MUST_RENEW: the renewal fails
        // (ENOENT) when the lock is no longer ours (broken, or expired and maybe taken and
        // released meanwhile) instead of taking it afresh as MAY_RENEW would, hiding that
        // another client may have written. A reader's shared lock is simply taken again
        // (MAY_RENEW): it changes nothing, and it keeps a merge out again.
        let flags = match (renew, mode) {
            (false, _) => 0,
            (true, LockMode::Exclusive) => 2,
            (true, _) => 1,
        };
        let desc = c"snapblk rbd driver";
        match mode {
            // SAFETY: a live I/O context, C strings and a timeval that outlive the call.
            LockMode::Exclusive => unsafe {
                (lib.rados_lock_exclusive)(
                    io,
                    oid.as_ptr(),
                    LOCK_NAME.as_ptr(),
                    cookie.as_ptr(),
                    desc.as_ptr(),
                    &mut d,
                    flags,
                )
            },
            // SAFETY: as above.
            LockMode::Shared => unsafe {
                (lib.rados_lock_shared)(
                    io,
                    oid.as_ptr(),
                    LOCK_NAME.as_ptr(),
                    cookie.as_ptr(),
                    LOCK_TAG.as_ptr(),
                    desc.as_ptr(),
                    &mut d,
                    flags,
                )
            },
            LockMode::None => 0,
        }
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: a live I/O context and the names we locked with.
        unsafe {
            (self.lib.rados_unlock)(
                self.ioctx,
                self.oid.as_ptr(),
                LOCK_NAME.as_ptr(),
                self.cookie.as_ptr(),
            )
        };
    }
}

impl Image {
    /// Open `name` (at `snap` when given) read-only or read-write.
    pub(super) fn open(
        cluster: Cluster,
        name: &str,
        snap: Option<&str>,
        read_only: bool,
    ) -> Result<Image> {
        let lib = cluster.lib;
        let cname = cstr("image", name)?;
        let csnap = snap.map(|s| cstr("snapshot", s)).transpose()?;
        let snap_ptr = csnap.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        let mut image: Handle = std::ptr::null_mut();
        let open = if read_only {
            lib.rbd_open_read_only
        } else {
            lib.rbd_open
        };
        // SAFETY: a live I/O context, C strings, a valid out pointer.
        let r = unsafe { open(cluster.ioctx, cname.as_ptr(), &mut image, snap_ptr) };
        if r < 0 {
            let what = match snap {
                Some(s) => format!("image '{name}@{s}'"),
                None => format!("image '{name}'"),
            };
            let hint = if r == -libc::EPERM && !read_only {
                " (opening it writable needs write caps on the image; a user without them \
                 opens it with read-only=true,lock=none)"
            } else {
                ""
            };
            return Err(Error::new(-r, format!("rbd: {what}: {}{hint}", os_msg(r))));
        }
        Ok(Image {
            lib,
            image,
            lock: None,
            cluster,
        })
    }

    /// Flush the image (`rbd_flush`, blocking). On a fresh handle with librbd's cache on, this
    /// is the flush that moves the cache out of `rbd_cache_writethrough_until_flush`'s
    /// write-through start.
    pub(super) fn flush(&self) -> Result<()> {
        // SAFETY: an open image.
        let r = unsafe { (self.lib.rbd_flush)(self.image) };
        if r < 0 {
            return Err(Error::new(-r, format!("rbd: flush: {}", os_msg(r))));
        }
        Ok(())
    }

    /// The image's size in bytes.
    pub(super) fn size(&self) -> Result<u64> {
        let mut n = 0u64;
        // SAFETY: an open image and a valid out pointer.
        let r = unsafe { (self.lib.rbd_get_size)(self.image, &mut n) };
        if r < 0 {
            return Err(Error::new(-r, format!("rbd: image size: {}", os_msg(r))));
        }
        Ok(n)
    }

    /// Set the image's size in bytes (`rbd_resize`, blocking): a shrink discards what lies past
    /// the new end, a grow reads as zeros.
    pub(super) fn resize(&self, size: u64) -> Result<()> {
        // SAFETY: an open image.
        let r = unsafe { (self.lib.rbd_resize)(self.image, size) };
        if r < 0 {
            return Err(Error::new(
                -r,
                format!("rbd: resize to {size} bytes: {}", os_msg(r)),
            ));
        }
        Ok(())
    }

    /// The image's object size in bytes.
    pub(super) fn object_size(&self) -> Result<u64> {
        // SAFETY: all-zero bytes are a valid ImageInfo (integers and char arrays).
        let mut info: ImageInfo = unsafe { std::mem::zeroed() };
        // SAFETY: an open image, and an out pointer to a struct of the size passed.
        let r =
            unsafe { (self.lib.rbd_stat)(self.image, &mut info, std::mem::size_of::<ImageInfo>()) };
        if r < 0 {
            return Err(Error::new(-r, format!("rbd: image stat: {}", os_msg(r))));
        }
        Ok(info.obj_size)
    }

    /// Take a lock on the image: shared locks coexist, an exclusive one excludes every
    /// other. EBUSY when another client holds a conflicting one. The lock lasts
    /// [`LOCK_SECS`] unless renewed; a thread renews it while the image is open.
    pub(super) fn lock(&mut self, mode: LockMode, what: &str) -> Result<()> {
        if mode == LockMode::None {
            return Ok(());
        }
        let mut id = [0 as c_char; 64];
        // SAFETY: an open image and a buffer of the length passed.
        let r = unsafe { (self.lib.rbd_get_id)(self.image, id.as_mut_ptr(), id.len()) };
        if r < 0 {
            return Err(Error::new(
                -r,
                format!("rbd: image id of '{what}': {}", os_msg(r)),
            ));
        }
        // SAFETY: rbd_get_id wrote a NUL-terminated id into the buffer.
        let id = unsafe { CStr::from_ptr(id.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let oid = cstr("image id", &format!("rbd_header.{id}"))?;
        let cookie = cstr(
            "lock cookie",
            &format!(
                "snapblk-{}-{:x}",
                std::process::id(),
                std::ptr::from_ref(self) as usize ^ nanos()
            ),
        )?;
        let (lib, io) = (self.lib, self.cluster.ioctx);
        let sent = Instant::now();
        let r = LockHolder::call(lib, io, &oid, &cookie, mode, false);
        if r == -libc::EBUSY || r == -libc::EEXIST {
            return Err(Error::new(
                libc::EBUSY,
                format!(
                    "rbd: image '{what}' is in use by another client ({}); \
                     `rados -p POOL lock info rbd_header.{id} snapblk` shows the holder",
                    match mode {
                        LockMode::Exclusive =>
                            "a snapblk serving or merging it; writing needs it alone",
                        _ => "a snapblk merge or writable server of it",
                    }
                ),
            ));
        }
        if r == -libc::EPERM {
            // The lock is a write to the image's header object: a user with read-only caps
            // (`profile rbd-read-only`) may read the image but not lock it, not even shared.
            return Err(Error::new(
                libc::EPERM,
                match mode {
                    LockMode::Exclusive => format!(
                        "rbd: image '{what}': this user may not take snapblk's exclusive lock \
                         on it (no write caps on the image); give the user write caps \
                         (`profile rbd`), or open the image read-only with lock=none"
                    ),
                    _ => format!(
                        "rbd: image '{what}': this user may not take snapblk's shared lock on \
                         it (no write caps on the image); give the user write caps, or open it \
                         with lock=none, which does not keep a merge of the image out"
                    ),
                },
            ));
        }
        if r < 0 {
            return Err(Error::new(
                -r,
                format!("rbd: locking image '{what}': {}", os_msg(r)),
            ));
        }
        let lease = (mode == LockMode::Exclusive).then(|| Arc::new(Lease::new(sent, what)));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (io_p, oid2, cookie2, lease2) =
            (SendPtr(io), oid.clone(), cookie.clone(), lease.clone());
        let thread = std::thread::Builder::new()
            .name("rbd-lock".into())
            .spawn(move || {
                let io = io_p;
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    rx.recv_timeout(LOCK_RENEW)
                {
                    let sent = Instant::now();
                    let r = LockHolder::call(lib, io.0, &oid2, &cookie2, mode, true);
                    match &lease2 {
                        Some(l) => {
                            l.renewal(sent, r);
                            // Sets the lost state if the lease ran out meanwhile.
                            if l.check(Instant::now()).is_err() {
                                break; // lost for good: nothing left to renew
                            }
                        }
                        None if r < 0 => {
                            log::warn!("rbd: renewing the image lock: {}", os_msg(r));
                        }
                        None => {}
                    }
                }
            })
            .map_err(|e| Error::new(libc::EAGAIN, format!("rbd: lock thread: {e}")))?;
        self.lock = Some(LockHolder {
            lib,
            ioctx: io,
            oid,
            cookie,
            stop: Some(tx),
            thread: Some(thread),
            lease,
        });
        Ok(())
    }

    /// The lease of the exclusive lock this handle holds, if it holds one: writes check it
    /// before going out.
    pub(super) fn lease(&self) -> Option<&Lease> {
        self.lock.as_ref().and_then(|l| l.lease.as_deref())
    }
}

fn nanos() -> usize {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize)
}

impl Drop for Image {
    fn drop(&mut self) {
        drop(self.lock.take());
        // SAFETY: opened by rbd_open*; every queue (and so every completion) is gone, since
        // they hold the Image. rbd_close waits for librbd's own in-flight work.
        unsafe { (self.lib.rbd_close)(self.image) };
    }
}
