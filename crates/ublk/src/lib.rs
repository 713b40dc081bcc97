//! ublk export: a snapblk device as a Linux block device (`/dev/ublkbN`).
//!
//! [`serve`] creates (or, after a crash of the previous server, recovers) a ublk device with N
//! queues × depth and serves it until the caller's stop function returns. Each ublk queue runs in
//! its own thread with one device [`Queue`](snapblk_core::Queue) taken from the started
//! [`Blkio`]; READ, WRITE (with FUA), FLUSH, DISCARD and WRITE_ZEROES map onto core requests, so
//! any driver can be exported.
//!
//! Three data paths ([`DataPath`]):
//! * **copy**: the kernel copies request data to/from a per-tag buffer the device reads into.
//! * **user copy** (`UBLK_F_USER_COPY`): the server copies data itself with `pread`/`pwrite` on
//!   `/dev/ublkcN`; no per-tag buffer is pinned.
//! * **zero copy** (`UBLK_F_AUTO_BUF_REG`): the kernel registers each request's pages in the
//!   queue's io_uring as a fixed buffer. A device that knows where its bytes live supplies a
//!   [`ReadPlanner`] (the optimization hook): each file segment of a read becomes one io_uring
//!   `READ_FIXED` from that file straight into the request's pages, zero segments are filled from
//!   `/dev/zero` the same way, so no data passes through userspace. Segments the planner cannot
//!   place (decoded data) and all writes take the generic path plus one copy.
//!
//! Recovery: devices are created with `UBLK_F_USER_RECOVERY | UBLK_F_USER_RECOVERY_REISSUE`. If
//! the server dies, the kernel quiesces the device and keeps `/dev/ublkbN`; serving again with the
//! same [`Config::id`] reattaches (`START_USER_RECOVERY` … `END_USER_RECOVERY`) and the kernel
//! re-issues the requests that were in flight.
//!
//! Modules are private; the read planners are re-exported here.

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod bridge;
mod plan;
mod server;

pub use plan::{FilePlanner, ReadPlanner, Segment, SnapshotPlanner, validate};

use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::{UblkError, UblkFlags, sys};
use snapblk_core::{Blkio, IoStats, State};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// How request data moves between the kernel and the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPath {
    /// The kernel copies data to and from a per-tag buffer of the server (no `UBLK_F_*` data
    /// flag); works on every kernel with ublk.
    Copy,
    /// `UBLK_F_USER_COPY`: the server copies with `pread`/`pwrite` on `/dev/ublkcN`; no buffer
    /// is pinned per tag.
    UserCopy,
    /// `UBLK_F_AUTO_BUF_REG`: reads a [`ReadPlanner`] can place go from file to request pages
    /// by io_uring without passing through userspace; everything else as [`DataPath::UserCopy`].
    ZeroCopy,
}

impl DataPath {
    /// The name used on the command line and in the device's target JSON (`copy`,
    /// `user-copy`, `zero-copy`).
    pub fn name(self) -> &'static str {
        match self {
            DataPath::Copy => "copy",
            DataPath::UserCopy => "user-copy",
            DataPath::ZeroCopy => "zero-copy",
        }
    }
    /// The ublk device flags this path needs.
    fn ctrl_flags(self) -> u64 {
        match self {
            DataPath::Copy => 0,
            DataPath::UserCopy => u64::from(sys::UBLK_F_USER_COPY),
            // USER_COPY too: the generic path (decoded data, writes) copies through /dev/ublkcN.
            DataPath::ZeroCopy => u64::from(
                sys::UBLK_F_AUTO_BUF_REG | sys::UBLK_F_SUPPORT_ZERO_COPY | sys::UBLK_F_USER_COPY,
            ),
        }
    }
    fn from_flags(f: u64) -> Self {
        if f & u64::from(sys::UBLK_F_AUTO_BUF_REG) != 0 {
            DataPath::ZeroCopy
        } else if f & u64::from(sys::UBLK_F_USER_COPY) != 0 {
            DataPath::UserCopy
        } else {
            DataPath::Copy
        }
    }
}

/// Export settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of ublk queues, each served by its own thread with its own device queue.
    pub queues: u16,
    /// Requests in flight per queue (the ublk queue depth, i.e. tags per queue).
    pub depth: u16,
    /// Largest request in bytes (block layer max_sectors).
    pub max_io_bytes: u32,
    /// How request data moves; the kernel must offer the path's flags.
    pub path: DataPath,
    /// Device number: `None` lets the kernel pick. If device `id` exists and is quiesced (its
    /// server died), it is recovered instead of created.
    pub id: Option<u32>,
    /// Where the queues count the requests they serve (`snapblk serve --metrics`).
    pub stats: Arc<IoStats>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            queues: 1,
            depth: 64,
            max_io_bytes: 512 * 1024,
            path: DataPath::Copy,
            id: None,
            stats: Arc::default(),
        }
    }
}

/// What [`serve`] reports once the block device is live.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The ublk device number N.
    pub dev_id: u32,
    /// The block device path, `/dev/ublkbN`.
    pub bdev: String,
    /// The data path in use (for a recovered device: the one it was created with).
    pub path: DataPath,
    /// Number of ublk queues, as the kernel reports them.
    pub queues: u16,
    /// Queue depth, as the kernel reports it.
    pub depth: u16,
    /// Size of the block device in bytes: the device's size rounded down to the logical block
    /// size (a partial last block cannot be addressed through a block device; [`serve`] logs a
    /// warning naming the unreachable tail).
    pub capacity: u64,
    /// Whether an existing quiesced device was recovered rather than a new one added.
    pub recovered: bool,
    /// Whether reads use the planner (zero-copy hook).
    pub planned_reads: bool,
}

/// Errors of the ublk export. The cause of each is its `source`, not part of its message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// libublk failed. Its errors that carry an errno become that OS error (libublk's own
    /// text, "other failure", says nothing more); the others are wrapped whole
    /// (`source.get_ref()` downcasts to [`UblkError`]).
    #[error("ublk: {what}")]
    Ublk {
        /// The control or queue step that failed (e.g. `run device`).
        what: &'static str,
        /// libublk's error, as an OS error where it carries an errno.
        #[source]
        source: std::io::Error,
    },
    /// ublk cannot be used on this host (why: no `/dev/ublk-control`, feature query failed).
    #[error("ublk is not available: {0}")]
    NoUblk(String),
    /// The kernel's ublk driver lacks a feature the configuration needs (its name).
    #[error("the kernel's ublk driver does not offer {0}")]
    Unsupported(&'static str),
    /// The [`Config`] or the device cannot be served as asked (what is wrong).
    #[error("invalid ublk configuration: {0}")]
    Config(String),
    /// The snapblk device failed (connect, start, a property, a queue).
    #[error("device")]
    Device(#[from] snapblk_core::Error),
    /// A ublk queue thread failed: its setup, its event loop or a command of one of its tags.
    /// The server stops, and this is what [`serve`] returns.
    #[error("ublk queue {qid}")]
    Queue {
        /// The ublk queue.
        qid: u16,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
    /// A ublk I/O command of one tag failed.
    #[error("{what} of tag {tag}")]
    Command {
        /// The command.
        what: &'static str,
        /// The tag (request slot) it was for.
        tag: u16,
        /// The OS error (libublk's or the kernel's).
        #[source]
        source: std::io::Error,
    },
    /// A second stop request forced the stop: I/O still in flight failed (the queue threads did
    /// end).
    #[error("the stop was forced by a second stop request")]
    Forced,
    /// A second stop request forced the stop, and the queue threads were still not gone after
    /// this long: [`serve`] returned without them (process exit ends them).
    #[error(
        "the stop was forced by a second stop request; the queue threads did not end within {0:?}"
    )]
    ForcedTimeout(std::time::Duration),
    /// Device `id` waits for recovery, but this server would serve other data or speak another
    /// protocol (`what` differs: the device has `device`, this server `this`). The device stays
    /// waiting for a matching server.
    #[error(
        "ublk device {id} cannot be recovered by this server: its {what} is {device}, this server's is {this}"
    )]
    RecoveryMismatch {
        /// The device number.
        id: u32,
        /// What differs.
        what: &'static str,
        /// The recovered device's value.
        device: String,
        /// This server's value.
        this: String,
    },
    /// A system call outside libublk failed.
    #[error("{what}")]
    Io {
        /// What was being done (e.g. opening `/dev/zero`).
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// libublk's error as an OS error where it carries an errno, else wrapped whole.
pub(crate) fn ublk_io_error(e: UblkError) -> std::io::Error {
    match e {
        UblkError::OtherError(n) | UblkError::UringIOError(n) => {
            std::io::Error::from_raw_os_error(n.abs())
        }
        UblkError::IOError(io) => io,
        e => std::io::Error::other(e),
    }
}

pub(crate) fn ublk_err(what: &'static str) -> impl FnOnce(UblkError) -> Error {
    move |e| Error::Ublk {
        what,
        source: ublk_io_error(e),
    }
}

/// Feature bits of the running kernel's ublk driver (`UBLK_F_*`).
pub fn kernel_features() -> Result<u64, Error> {
    if !std::path::Path::new("/dev/ublk-control").exists() {
        return Err(Error::NoUblk(
            "/dev/ublk-control missing (load the ublk_drv module)".into(),
        ));
    }
    UblkCtrl::get_features().ok_or_else(|| Error::NoUblk("UBLK_U_CMD_GET_FEATURES failed".into()))
}

/// Names of the known feature bits in `f`.
pub fn feature_names(f: u64) -> Vec<&'static str> {
    const NAMES: [&str; 20] = [
        "SUPPORT_ZERO_COPY",
        "URING_CMD_COMP_IN_TASK",
        "NEED_GET_DATA",
        "USER_RECOVERY",
        "USER_RECOVERY_REISSUE",
        "UNPRIVILEGED_DEV",
        "CMD_IOCTL_ENCODE",
        "USER_COPY",
        "ZONED",
        "USER_RECOVERY_FAIL_IO",
        "UPDATE_SIZE",
        "AUTO_BUF_REG",
        "QUIESCE",
        "PER_IO_DAEMON",
        "BUF_REG_OFF_DAEMON",
        "BATCH_IO",
        "INTEGRITY",
        "SAFE_STOP_DEV",
        "NO_AUTO_PART_SCAN",
        "SHMEM_ZC",
    ];
    NAMES
        .iter()
        .enumerate()
        .filter(|(i, _)| f & (1u64 << i) != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// State of device `id` if it exists (`UBLK_S_DEV_*`).
fn existing_state(id: u32) -> Option<u16> {
    let id = i32::try_from(id).ok()?;
    if !std::path::Path::new(&format!("/dev/ublkc{id}")).exists() {
        return None;
    }
    let ctrl = UblkCtrl::new_simple(id).ok()?;
    Some(ctrl.dev_info().state)
}

/// The recovery flags every device is created with (those the kernel offers).
fn recovery_flags(feats: u64) -> u64 {
    u64::from(sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE) & feats
}

/// The `UBLK_F_*` flags that change how a server talks to a device (data path, recovery,
/// command set); a recovered device must have exactly the ones this server would set. Not
/// `UBLK_F_PER_IO_DAEMON`: the kernel sets it on every device it creates (7.2.13 reports 0x2018
/// for a device added with 0x18), and it only relaxes which thread may serve a tag.
const PROTOCOL_FLAGS: u64 = (sys::UBLK_F_SUPPORT_ZERO_COPY
    | sys::UBLK_F_NEED_GET_DATA
    | sys::UBLK_F_USER_RECOVERY
    | sys::UBLK_F_USER_RECOVERY_REISSUE
    | sys::UBLK_F_USER_RECOVERY_FAIL_IO
    | sys::UBLK_F_USER_COPY
    | sys::UBLK_F_ZONED
    | sys::UBLK_F_AUTO_BUF_REG
    | sys::UBLK_F_BATCH_IO
    | sys::UBLK_F_INTEGRITY) as u64;

/// What a ublk device looks like to its server: what a recovered device must share with the
/// server that reattaches to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    /// Block device size in bytes.
    size: u64,
    lbs_shift: u8,
    read_only: bool,
    path: DataPath,
    queues: u16,
    depth: u16,
    /// Its `UBLK_F_*` flags, within [`PROTOCOL_FLAGS`].
    flags: u64,
}

/// Refuse to recover device `id` (`found`) with a server that would have made `this`: other
/// data (size, block size, read-only) or another data path, queue layout or protocol.
fn check_recovery(id: u32, found: &Shape, this: &Shape) -> Result<(), Error> {
    let differ = |what, device: String, this: String| {
        Err(Error::RecoveryMismatch {
            id,
            what,
            device,
            this,
        })
    };
    if found.path != this.path {
        return differ(
            "data path (--ublk-mode)",
            found.path.name().into(),
            this.path.name().into(),
        );
    }
    if found.queues != this.queues {
        return differ(
            "queue count (--ublk-queues)",
            found.queues.to_string(),
            this.queues.to_string(),
        );
    }
    if found.depth != this.depth {
        return differ(
            "queue depth (--ublk-depth)",
            found.depth.to_string(),
            this.depth.to_string(),
        );
    }
    if found.size != this.size {
        return differ(
            "size",
            format!("{} bytes", found.size),
            format!("{} bytes", this.size),
        );
    }
    if found.lbs_shift != this.lbs_shift {
        return differ(
            "logical block size",
            format!("{} bytes", 1u64 << found.lbs_shift),
            format!("{} bytes", 1u64 << this.lbs_shift),
        );
    }
    if found.read_only != this.read_only {
        let ro = |r: bool| if r { "read-only" } else { "writable" }.to_string();
        return differ("access", ro(found.read_only), ro(this.read_only));
    }
    if found.flags != this.flags {
        return differ(
            "flag set",
            format!("{:#x}", found.flags),
            format!("{:#x}", this.flags),
        );
    }
    Ok(())
}

/// The size of the exported block device: `capacity` rounded down to whole logical blocks of
/// `1 << lbs_shift` bytes.
fn export_size(capacity: u64, lbs_shift: u8) -> u64 {
    capacity & !((1u64 << lbs_shift) - 1)
}

fn log2(v: u32) -> u8 {
    (31 - v.max(1).leading_zeros()) as u8
}

/// Serve `dev` as a ublk block device until `stop` reports a stop request, then remove the
/// device (after the kernel drained in-flight I/O). `stop(d)` waits up to `d` for a stop request
/// and returns whether one came (see [`block_stop_signals`]); it is called on the calling thread
/// between looks at the queue threads. `dev` may be connected (it is started with `cfg.queues`
/// queues) or started (queues are added to reach `cfg.queues` when the driver allows it).
/// `planner` enables planned zero-copy reads in [`DataPath::ZeroCopy`]. `on_ready` runs once the
/// block device exists.
///
/// A queue thread that fails (at setup, in its event loop, or in a ublk command) stops the
/// server: the error, [`Error::Queue`], is the result; nothing is only printed.
pub fn serve(
    mut dev: Blkio,
    cfg: &Config,
    planner: Option<Arc<dyn ReadPlanner>>,
    on_ready: impl FnOnce(&Ready),
    mut stop: impl FnMut(std::time::Duration) -> bool,
) -> Result<(), Error> {
    if cfg.queues == 0 || cfg.depth == 0 || cfg.max_io_bytes < 4096 {
        return Err(Error::Config(
            "queues and depth must be >= 1 and the max I/O size >= 4096".into(),
        ));
    }
    let feats = kernel_features()?;
    let recover = cfg
        .id
        .and_then(existing_state)
        .is_some_and(|s| s == sys::UBLK_S_DEV_QUIESCED as u16);
    if let Some(id) = cfg.id
        && !recover
        && existing_state(id).is_some()
    {
        return Err(Error::Config(format!(
            "ublk device {id} exists and is not waiting for recovery"
        )));
    }

    // Device queues: one per ublk queue.
    match dev.state() {
        State::Created => dev.connect()?,
        State::Connected | State::Started => {}
    }
    let read_only = dev.get_bool("read-only")?;
    let capacity = dev.get_u64("capacity")?;
    let req_align = u32::try_from(dev.get_int("request-alignment")?.max(512)).unwrap_or(512);
    let lbs_shift = log2(req_align.next_power_of_two().min(4096));
    // What the block device can reach: whole logical blocks.
    let dev_size = export_size(capacity, lbs_shift);
    if dev_size != capacity {
        log::warn!(
            "the device's size, {capacity} bytes, is not a multiple of the {}-byte logical \
             block size: its last {} bytes (from offset {dev_size}) cannot be read or written \
             through the ublk device",
            1u64 << lbs_shift,
            capacity - dev_size
        );
    }
    let max_transfer = u32::try_from(dev.get_int("max-transfer")?).unwrap_or(0);
    let max_io = match max_transfer {
        0 => cfg.max_io_bytes,
        m => cfg.max_io_bytes.min(m),
    } & !4095;
    if max_io < 4096 {
        return Err(Error::Config(format!(
            "device max-transfer {max_transfer} is below 4096"
        )));
    }
    let mut queues: Vec<Option<Box<dyn snapblk_core::Queue>>> = Vec::new();
    if dev.state() == State::Connected {
        dev.set_int("num-queues", i32::from(cfg.queues))?;
        dev.start()?;
    }
    // Take the queues the device already has, add more if needed.
    let have = usize::try_from(dev.get_int("num-queues")?).unwrap_or(0);
    for i in 0..have.min(usize::from(cfg.queues)) {
        if let Some(q) = dev.take_queue(i, false) {
            queues.push(Some(q));
        }
    }
    while queues.len() < usize::from(cfg.queues) {
        let idx = dev.add_queue(false)?;
        let q = dev
            .take_queue(idx, false)
            .ok_or_else(|| Error::Config("device lost a new queue".into()))?;
        queues.push(Some(q));
    }

    // Flags: the data path, recovery with re-issue of in-flight requests.
    let (ctrl, path) = if recover {
        let id = cfg.id.unwrap_or(0) as i32;
        let ctrl = UblkCtrlBuilder::default()
            .name("snapblk")
            .id(id)
            .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
            .build()
            .map_err(ublk_err("open the device to recover"))?;
        // Reattach only to what this server would have created: the same data, limits and
        // protocol. Before START_USER_RECOVERY: a refused device stays waiting for recovery.
        let info = ctrl.dev_info();
        let mut params = sys::ublk_params::default();
        ctrl.get_params(&mut params)
            .map_err(ublk_err("read the parameters of the device to recover"))?;
        let found = Shape {
            size: (params.basic.dev_sectors) << 9,
            lbs_shift: params.basic.logical_bs_shift,
            read_only: params.basic.attrs & sys::UBLK_ATTR_READ_ONLY != 0,
            path: DataPath::from_flags(info.flags),
            queues: info.nr_hw_queues,
            depth: info.queue_depth,
            flags: info.flags & PROTOCOL_FLAGS,
        };
        let this = Shape {
            size: dev_size,
            lbs_shift,
            read_only,
            path: cfg.path,
            queues: cfg.queues,
            depth: cfg.depth,
            flags: (cfg.path.ctrl_flags() | recovery_flags(feats)) & PROTOCOL_FLAGS,
        };
        check_recovery(info.dev_id, &found, &this)?;
        let path = found.path;
        ctrl.start_user_recover()
            .map_err(ublk_err("START_USER_RECOVERY"))?;
        (ctrl, path)
    } else {
        let want = cfg.path.ctrl_flags();
        if want & feats != want {
            return Err(Error::Unsupported(match cfg.path {
                DataPath::ZeroCopy => {
                    "zero copy (UBLK_F_AUTO_BUF_REG + UBLK_F_SUPPORT_ZERO_COPY + UBLK_F_USER_COPY)"
                }
                _ => "user copy (UBLK_F_USER_COPY)",
            }));
        }
        let rec = recovery_flags(feats);
        let ctrl = UblkCtrlBuilder::default()
            .name("snapblk")
            .id(cfg.id.map_or(-1, |i| i as i32))
            .nr_queues(cfg.queues)
            .depth(cfg.depth)
            .io_buf_bytes(max_io)
            .ctrl_flags(want | rec)
            .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
            .build()
            .map_err(ublk_err("add device"))?;
        (ctrl, cfg.path)
    };

    // A recovered device keeps the request size limit it was created with.
    let max_io = match ctrl.dev_info().max_io_buf_bytes {
        0 => max_io,
        m => m,
    };

    // Files the kernel reads into request pages in zero-copy mode.
    let zero = File::open("/dev/zero").map_err(|source| Error::Io {
        what: "open /dev/zero",
        source,
    })?;
    let planner = if path == DataPath::ZeroCopy {
        planner
    } else {
        None
    };
    let plan_fds = planner.as_ref().map(|p| p.files()).unwrap_or_default();
    if plan_fds.len() > 24 {
        return Err(Error::Config(
            "a read planner may name at most 24 files".into(),
        ));
    }
    let shared = Arc::new(server::Shared {
        queues: std::sync::Mutex::new(queues),
        nplan_files: plan_fds.len(),
        planner,
        path,
        max_io,
        stats: cfg.stats.clone(),
    });
    let planned_reads = shared.planner.is_some();

    let tgt_init = move |d: &mut UblkDev| {
        let cq = server::cq_entries(d.dev_info.queue_depth);
        let t = &mut d.tgt;
        t.dev_size = dev_size;
        t.cq_depth = cq;
        for fd in std::iter::once(zero.as_raw_fd()).chain(plan_fds.iter().copied()) {
            let n = t.nr_fds as usize;
            if n >= t.fds.len() {
                return Err(UblkError::OtherError(-libc::EMFILE));
            }
            t.fds[n] = fd;
            t.nr_fds += 1;
        }
        // /dev/zero and the planner files must outlive the queue rings (they are only dup'ed by
        // registration); the device lives until the process ends or the server stops.
        std::mem::forget(zero);
        let mut attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
        if read_only {
            attrs |= sys::UBLK_ATTR_READ_ONLY;
        }
        let dev_sectors = t.dev_size >> 9;
        t.params = sys::ublk_params {
            types: sys::UBLK_PARAM_TYPE_BASIC
                | if read_only {
                    0
                } else {
                    sys::UBLK_PARAM_TYPE_DISCARD
                },
            basic: sys::ublk_param_basic {
                attrs,
                logical_bs_shift: lbs_shift,
                physical_bs_shift: 12,
                io_opt_shift: 12,
                io_min_shift: lbs_shift,
                max_sectors: max_io >> 9,
                dev_sectors,
                ..Default::default()
            },
            discard: sys::ublk_param_discard {
                discard_granularity: 4096,
                max_discard_sectors: max_io >> 9,
                max_write_zeroes_sectors: max_io >> 9,
                max_discard_segments: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        d.set_target_json(serde_json::json!({"snapblk": {"path": path.name()}}));
        Ok(())
    };
    let nq = ctrl.dev_info().nr_hw_queues;
    let depth = ctrl.dev_info().queue_depth;
    let device_fn = move |c: &UblkCtrl| {
        on_ready(&Ready {
            dev_id: c.dev_info().dev_id,
            bdev: c.get_bdev_path(),
            path,
            queues: nq,
            depth,
            capacity: dev_size,
            recovered: recover,
            planned_reads,
        });
    };
    let udev =
        UblkDev::new(ctrl.get_name(), tgt_init, &ctrl).map_err(ublk_err("set up the device"))?;
    let id = ctrl.dev_info().dev_id;
    let r = server::run_device(
        ctrl,
        udev,
        shared,
        server::Faults::from_env(),
        device_fn,
        &mut stop,
    );
    // A recovered device is not deleted by the control's destructor (only added ones are).
    if recover
        && r.is_ok()
        && let Ok(c) = UblkCtrl::new_simple(id as i32)
    {
        let _ = c.del_dev();
    }
    drop(dev);
    r
}

/// The zero-copy read planner for `dev`, if its driver has one: drivers that read a plain file or
/// block device one-to-one (`io_uring`, `sync`) get a [`FilePlanner`] on their `path`. `None`
/// for other drivers (they are served through the generic path). Read-only snapshots get a
/// [`SnapshotPlanner`].
pub fn planner_for(dev: &Blkio) -> Option<Arc<dyn ReadPlanner>> {
    let ro = dev.get_bool("read-only").unwrap_or(false);
    match dev.driver_name() {
        "io_uring" | "sync" => {
            let path = dev.get_str("path").ok()?;
            Some(Arc::new(
                FilePlanner::open(std::path::Path::new(&path)).ok()?,
            ))
        }
        // Writable snapshots change their block map as they are written, and merging ones as
        // they merge (the planner's own open would keep the block map of its start, and its
        // reads run after the plan): generic path only.
        "snapshot"
            if (ro || !dev.get_bool("writable").unwrap_or(true))
                && !dev.get_bool("merge").unwrap_or(true) =>
        {
            let base = dev.get_str("base").ok()?;
            let cow = dev.get_str("cow").ok()?;
            let record = dev.get_str("cow-record").ok().filter(|s| !s.is_empty());
            let p = plan::SnapshotPlanner::open_with(
                std::path::Path::new(&base),
                std::path::Path::new(&cow),
                dev.get_bool("verify").unwrap_or(true),
                record.as_deref().map(std::path::Path::new),
            )
            .ok()?;
            Some(Arc::new(p))
        }
        _ => None,
    }
}

/// Block SIGINT and SIGTERM in the calling thread (and every thread it starts later), and return
/// the stop source for [`serve`]: a function that waits up to the given time for one of them and
/// says whether one came. Call before [`serve`] so that the queue threads never take the signal.
pub fn block_stop_signals()
-> Result<impl FnMut(std::time::Duration) -> bool + Send + Sync + 'static, Error> {
    // SAFETY: plain sigset manipulation on a local, then pthread_sigmask for this thread.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if r != 0 {
            return Err(Error::Io {
                what: "block SIGINT/SIGTERM",
                source: std::io::Error::from_raw_os_error(r),
            });
        }
        set
    };
    let set = SigSet(set);
    Ok(move |d: std::time::Duration| {
        let ts = libc::timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        };
        // SAFETY: waits for a signal of a valid, blocked set; `ts` lives across the call and a
        // null siginfo pointer is allowed.
        unsafe { libc::sigtimedwait(&set.0, std::ptr::null_mut(), &ts) > 0 }
    })
}

struct SigSet(libc::sigset_t);
// SAFETY: a sigset_t is plain data.
unsafe impl Send for SigSet {}
// SAFETY: as above; only read.
unsafe impl Sync for SigSet {}

#[cfg(test)]
mod size_tests {
    use super::*;

    #[test]
    fn the_export_size_is_whole_logical_blocks() {
        assert_eq!(export_size(1 << 20, 9), 1 << 20);
        assert_eq!(export_size((1 << 20) + 1000, 9), (1 << 20) + 512);
        assert_eq!(export_size((1 << 20) + 1000, 12), 1 << 20);
        assert_eq!(export_size(511, 9), 0);
        assert_eq!(log2(512), 9);
        assert_eq!(log2(4096), 12);
    }
}

#[cfg(test)]
mod recovery_tests {
    use super::*;

    #[test]
    fn recovery_refuses_a_different_device() {
        let a = Shape {
            size: 8 << 20,
            lbs_shift: 9,
            read_only: false,
            path: DataPath::Copy,
            queues: 1,
            depth: 64,
            flags: recovery_flags(u64::MAX) & PROTOCOL_FLAGS,
        };
        assert!(check_recovery(7, &a, &a).is_ok());
        // The kernel adds UBLK_F_PER_IO_DAEMON to every device: not a difference.
        let kernel_flags = u64::from(sys::UBLK_F_PER_IO_DAEMON) | recovery_flags(u64::MAX);
        let found = Shape {
            flags: kernel_flags & PROTOCOL_FLAGS,
            ..a
        };
        assert!(check_recovery(7, &found, &a).is_ok());
        let msg = |b: Shape| match check_recovery(7, &a, &b) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("{b:?} accepted for {a:?}"),
        };
        assert_eq!(
            msg(Shape {
                size: 16 << 20,
                ..a
            }),
            "ublk device 7 cannot be recovered by this server: its size is 8388608 bytes, \
             this server's is 16777216 bytes"
        );
        assert!(
            msg(Shape {
                path: DataPath::ZeroCopy,
                flags: (DataPath::ZeroCopy.ctrl_flags() | recovery_flags(u64::MAX))
                    & PROTOCOL_FLAGS,
                ..a
            })
            .contains("its data path (--ublk-mode) is copy, this server's is zero-copy")
        );
        assert!(msg(Shape { queues: 2, ..a }).contains("queue count"));
        assert!(msg(Shape { depth: 128, ..a }).contains("queue depth"));
        assert!(msg(Shape { lbs_shift: 12, ..a }).contains("logical block size is 512 bytes"));
        assert!(
            msg(Shape {
                read_only: true,
                ..a
            })
            .contains("access is writable, this server's is read-only")
        );
        assert!(
            msg(Shape {
                flags: a.flags | u64::from(sys::UBLK_F_NEED_GET_DATA),
                ..a
            })
            .contains("flag set")
        );
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;
    use snapblk_core::Chain;
    use std::error::Error as _;

    #[test]
    fn errors_keep_their_cause_as_source_only() {
        let cases = [
            ublk_err("add device")(UblkError::OtherError(-libc::EPERM)),
            ublk_err("run device")(UblkError::IOError(std::io::Error::from_raw_os_error(
                libc::ENOENT,
            ))),
            ublk_err("run device")(UblkError::QueueIsDown),
            Error::from(snapblk_core::Error::new(libc::EIO, "short read")),
            Error::Io {
                what: "open /dev/zero",
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            },
            Error::Queue {
                qid: 1,
                source: Box::new(Error::Io {
                    what: "set up the queue",
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                }),
            },
            Error::Command {
                what: "COMMIT_AND_FETCH",
                tag: 3,
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            },
        ];
        for e in &cases {
            let cause = e
                .source()
                .unwrap_or_else(|| panic!("{e:?} has no source"))
                .to_string();
            assert!(!e.to_string().contains(&cause), "{e} repeats {cause}");
            assert_eq!(Chain(e).to_string().matches(&cause).count(), 1);
        }
        // libublk's errno is the OS error, its raw value kept for callers.
        assert_eq!(
            Chain(&cases[0]).to_string(),
            "ublk: add device: Operation not permitted (os error 1)"
        );
        let Error::Ublk { source, .. } = &cases[0] else {
            panic!("{:?}", cases[0]);
        };
        assert_eq!(source.raw_os_error(), Some(libc::EPERM));
        // Other libublk errors stay reachable as themselves.
        let Error::Ublk { source, .. } = &cases[2] else {
            panic!("{:?}", cases[2]);
        };
        assert!(matches!(
            source.get_ref().and_then(|e| e.downcast_ref::<UblkError>()),
            Some(UblkError::QueueIsDown)
        ));
        assert_eq!(
            Chain(&cases[2]).to_string(),
            "ublk: run device: queue down failure"
        );
        assert_eq!(
            Chain(&cases[5]).to_string(),
            "ublk queue 1: set up the queue: Input/output error (os error 5)"
        );
    }
}
