//! The `snapshot` driver: a snapblk-core [`Driver`] serving a [`Snapshot`].
//!
//! Properties (set before connect): `base` and `cow` (paths), `writable` (accept writes into the
//! overlay journal; default false → writes fail with EROFS), `cache-size` (bytes of decoded
//! compressed units, default 32 MiB), `scheduler` (default true), and block-level readahead
//! ([`crate::record`]): `record` (path of a block list to record the reads served into),
//! `record-secs` (recording window from connect, default 30; 0 = until close), `readahead` (path
//! of a block list to replay in the background at connect), `merge` (merge the COW into the
//! base on a background thread while serving: [`crate::merge_task`]; opens both files for
//! writing, not with `writable`), `merge-held` (with `merge`: the merge waits for
//! [`crate::MergeTask::start_merge`]). The COW record ([`crate::cowrecord`]): `cow-record` (its path;
//! default `COW.snapblk` when that file exists), `verify` (default true: check every block of
//! the new image the record has a digest for before serving it, EIO when it differs; false
//! ignores the record), `verify-base` (check the base against the record at connect: every
//! block the COW reads and the SHA-256 of the whole base; default false, so serving starts at
//! once). With `merge`, a base the record says the merge does not belong to fails connect.
//! Instead of a path, the base can be any device, given by dotted keys as in QEMU:
//! `base.driver=rbd,base.pool=p,base.image=i` (every `base.NAME=VALUE` becomes property `NAME`
//! of that driver, opened read-only unless `merge`; it needs an opener, which
//! `snapblk::create` gives: [`SnapshotDriver::with_opener`]). The COW record (`cow-record`,
//! `verify-base`, a `COW.snapblk` beside the COW) is checked over a device base as over a file,
//! reading the base through the device. The base or the COW may
//! also be a URL (`base=s3://bucket/base.img`, `cow=https://host/update.cow`): read-only
//! through the opener's `s3` / `http` driver (ranged GETs into a block cache; docs/remote.md).
//! A remote COW's record is the object `URL.snapblk` (or `cow-record`, a path or a URL),
//! fetched whole and checked as a local one. Read-only, once connected: `record-stats`, `readahead-stats`
//! and `merge-stats` (JSON), `activity-id` (for [`Activity::find`]). Spec example:
//! `snapshot:base=system.img,cow=system.cow,writable=true,record=boot.blocks`.

use crate::childdev::{BlkioDev, DeviceOpener};
use crate::cowsrc::{OpenMode, open_dev_base, open_devs_sized, open_files_sized};
use crate::dev::{BlockDev, FileDev, Hold};
use crate::queue::{Backend, SyncQueue};
use crate::record::{Activity, Binding, DEFAULT_RECORD_SECS};
use crate::sched::FgLane;
use crate::snapshot::{Snapshot, SnapshotConfig};
use snapblk_core::{
    Access, DeviceInfo, Driver, Error, PropSpec, PropType, PropValue, Queue, ReadAt, State,
};
use snapblk_cow::record::{Record, Verifier};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const PROPS: &[PropSpec] = &[
    PropSpec::new("base", PropType::Str, Access::RwCreated, false),
    PropSpec::new("cow", PropType::Str, Access::RwCreated, false),
    PropSpec::new("writable", PropType::Bool, Access::RwCreated, false),
    PropSpec::new("cache-size", PropType::U64, Access::RwCreated, false),
    PropSpec::new("scheduler", PropType::Bool, Access::RwCreated, false),
    PropSpec::new("record", PropType::Str, Access::RwCreated, false),
    PropSpec::new("record-secs", PropType::U64, Access::RwCreated, false),
    PropSpec::new("readahead", PropType::Str, Access::RwCreated, false),
    PropSpec::new("merge", PropType::Bool, Access::RwCreated, false),
    PropSpec::new("merge-held", PropType::Bool, Access::RwCreated, false),
    PropSpec::new("cow-record", PropType::Str, Access::RwCreated, false),
    PropSpec::new("verify", PropType::Bool, Access::RwCreated, false),
    PropSpec::new("verify-base", PropType::Bool, Access::RwCreated, false),
    PropSpec::new("merge-stats", PropType::Str, Access::ReadOnly, true),
    PropSpec::new("record-stats", PropType::Str, Access::ReadOnly, true),
    PropSpec::new("readahead-stats", PropType::Str, Access::ReadOnly, true),
    PropSpec::new("activity-id", PropType::U64, Access::ReadOnly, true),
];

/// The driver.
pub struct SnapshotDriver {
    base: Option<PathBuf>,
    cow: Option<PathBuf>,
    cfg: SnapshotConfig,
    snap: Option<Arc<Snapshot>>,
    record: Option<PathBuf>,
    record_secs: u64,
    readahead: Option<PathBuf>,
    merge: bool,
    /// With `merge`: the merge waits for [`crate::MergeTask::start_merge`].
    merge_held: bool,
    cow_record: Option<PathBuf>,
    verify: bool,
    verify_base: bool,
    activity: Arc<Activity>,
    threads: Vec<JoinHandle<()>>,
    /// `base.NAME` properties, prefix removed, in the order set.
    base_spec: Vec<(String, String)>,
    opener: Option<DeviceOpener>,
}

impl Default for SnapshotDriver {
    fn default() -> Self {
        SnapshotDriver {
            base: None,
            cow: None,
            cfg: SnapshotConfig::default(),
            snap: None,
            record: None,
            record_secs: DEFAULT_RECORD_SECS,
            readahead: None,
            merge: false,
            merge_held: false,
            cow_record: None,
            verify: true,
            verify_base: false,
            activity: Activity::new(),
            threads: Vec::new(),
            base_spec: Vec::new(),
            opener: None,
        }
    }
}

impl SnapshotDriver {
    /// A driver with default settings.
    pub fn new() -> Self {
        Self::default()
    }
    /// A driver that can open a base given as a device spec (`base.driver=...`) with `opener`.
    pub fn with_opener(opener: DeviceOpener) -> Self {
        let mut d = Self::default();
        d.opener = Some(opener);
        d
    }
    /// The snapshot (after connect), for in-process users such as a merge running alongside.
    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.snap.clone()
    }
    /// Record/replay state and counters (valid before connect and after close).
    pub fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }
}

impl Drop for SnapshotDriver {
    fn drop(&mut self) {
        // Closing the device ends the recording window: the list is written before we return.
        self.activity.stop();
        self.activity.finish_record();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A queue's backend: the snapshot, the device's activity counters, and the queue's own
/// foreground lane of the scheduler (its reads count there without atomic read-modify-writes).
struct SnapBackend(Arc<Snapshot>, Arc<Activity>, FgLane);

impl Backend for SnapBackend {
    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        if let Err(e) = self.0.read_in(&self.2, offset, buf) {
            return Err(read_failed(e));
        }
        // Client reads only: merge and replay reads do not come through queues.
        self.1.note_read(offset, buf.len() as u64);
        Ok(())
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> snapblk_core::Result<()> {
        Ok(self.0.write(offset, buf, fua)?)
    }
    fn flush(&self) -> snapblk_core::Result<()> {
        Ok(self.0.flush()?)
    }
}

/// Open a snapshot sized by the COW record's target size, when there is a record, and attach
/// its verifier: the same steps for a file base and a device base.
fn open_verified(
    verifier: Option<Arc<Verifier>>,
    open: impl FnOnce(Option<u64>) -> crate::Result<Snapshot>,
) -> crate::Result<Arc<Snapshot>> {
    let size = verifier.as_ref().map(|v| v.record().target_size);
    let snap = Arc::new(open(size)?);
    if let Some(v) = verifier {
        snap.attach_verifier(v)?;
    }
    Ok(snap)
}

/// A failed read's error for the C ABI, out of the read's way.
#[cold]
#[inline(never)]
fn read_failed(e: crate::SnapError) -> Error {
    e.into()
}

impl Driver for SnapshotDriver {
    fn name(&self) -> &str {
        "snapshot"
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn child_devices(&self) -> &'static [&'static str] {
        &["base"]
    }
    fn get_prop(&self, name: &str, _state: State) -> snapblk_core::Result<PropValue> {
        if let Some(key) = name.strip_prefix("base.") {
            return self
                .base_spec
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| PropValue::Str(v.clone()))
                .ok_or_else(|| Error::new(libc::ENOENT, "Unknown property name"));
        }
        let path = |p: &Option<PathBuf>| {
            PropValue::Str(
                p.as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            )
        };
        Ok(match name {
            "base" => path(&self.base),
            "cow" => path(&self.cow),
            "writable" => PropValue::Bool(self.cfg.writable),
            "cache-size" => PropValue::U64(self.cfg.cache_bytes),
            "scheduler" => PropValue::Bool(self.cfg.sched.enabled),
            "record" => path(&self.record),
            "record-secs" => PropValue::U64(self.record_secs),
            "readahead" => path(&self.readahead),
            "record-stats" => json(&self.activity.record_stats()),
            "readahead-stats" => json(&self.activity.readahead_stats()),
            "merge" => PropValue::Bool(self.merge),
            "merge-held" => PropValue::Bool(self.merge_held),
            "cow-record" => path(&self.cow_record),
            "verify" => PropValue::Bool(self.verify),
            "verify-base" => PropValue::Bool(self.verify_base),
            "merge-stats" => json(&self.activity.merge().stats()),
            "activity-id" => PropValue::U64(self.activity.id()),
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        })
    }
    fn set_prop(
        &mut self,
        name: &str,
        value: PropValue,
        _state: State,
    ) -> snapblk_core::Result<()> {
        match (name, value) {
            (n, PropValue::Str(s)) if n.starts_with("base.") => {
                let key = &n["base.".len()..];
                match self.base_spec.iter_mut().find(|(k, _)| k == key) {
                    Some(kv) => kv.1 = s,
                    None => self.base_spec.push((key.to_owned(), s)),
                }
            }
            ("base", PropValue::Str(s)) => self.base = Some(s.into()),
            ("cow", PropValue::Str(s)) => self.cow = Some(s.into()),
            ("writable", PropValue::Bool(b)) => self.cfg.writable = b,
            ("cache-size", PropValue::U64(n)) => self.cfg.cache_bytes = n,
            ("scheduler", PropValue::Bool(b)) => self.cfg.sched.enabled = b,
            ("record", PropValue::Str(s)) => self.record = (!s.is_empty()).then(|| s.into()),
            ("record-secs", PropValue::U64(n)) => self.record_secs = n,
            ("readahead", PropValue::Str(s)) => self.readahead = (!s.is_empty()).then(|| s.into()),
            ("merge", PropValue::Bool(b)) => self.merge = b,
            ("merge-held", PropValue::Bool(b)) => self.merge_held = b,
            ("cow-record", PropValue::Str(s)) => {
                self.cow_record = (!s.is_empty()).then(|| s.into())
            }
            ("verify", PropValue::Bool(b)) => self.verify = b,
            ("verify-base", PropValue::Bool(b)) => self.verify_base = b,
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        }
        Ok(())
    }
    fn connect(&mut self, read_only: bool) -> snapblk_core::Result<DeviceInfo> {
        // A local COW's record is a file: a URL there would only be looked for as a path.
        if self.cow_record.as_deref().and_then(remote_url).is_some()
            && self.cow.as_deref().and_then(remote_url).is_none()
        {
            return Err(Error::inval(
                "snapshot: cow-record may be a URL only for a COW given as a URL",
            ));
        }
        if !self.verify && (self.cow_record.is_some() || self.verify_base) {
            return Err(Error::inval(
                "snapshot: cow-record and verify-base need verify=true",
            ));
        }
        if !self.base_spec.is_empty() {
            return self.connect_dev_base(read_only);
        }
        if [&self.base, &self.cow]
            .into_iter()
            .any(|p| p.as_deref().and_then(remote_url).is_some())
        {
            return self.connect_remote(read_only);
        }
        let (Some(base), Some(cow)) = (&self.base, &self.cow) else {
            return Err(Error::inval(
                "snapshot: properties base and cow must be set",
            ));
        };
        let mut cfg = self.cfg;
        cfg.writable &= !read_only;
        if self.merge && cfg.writable {
            // Client writes go to the overlay journal, which the merge folds into the base
            // once, at its end: writes after that would be lost to the base.
            return Err(Error::inval(
                "snapshot: merge and writable cannot be combined (merge serves read-only)",
            ));
        }
        let mode = OpenMode {
            base_writable: self.merge,
            cow_writable: self.merge,
        };
        let verifier = if self.verify {
            crate::cowrecord::load_verifier(
                base,
                cow,
                self.cow_record.as_deref(),
                self.verify_base,
            )?
        } else {
            None
        };
        let snap = open_verified(verifier, |size| {
            open_files_sized(base, cow, cfg, mode, size)
        })?;
        if self.merge {
            // An unmergeable COW, or a base the merge does not belong to, fails connect before
            // anything starts or is written.
            crate::merge::validate_order(&snap)?;
            if let Some(b) = snap.check_merge_base()?
                && let Some(e) = crate::cowrecord::merge_refusal(&b, snap.merge_progress().0)
            {
                return Err(e.into());
            }
        }
        self.finish_connect(snap)
    }
    fn capacity(&self) -> snapblk_core::Result<u64> {
        self.snap
            .as_ref()
            .map(|s| s.capacity())
            .ok_or_else(|| Error::new(libc::ENODEV, "Device must be connected"))
    }
    fn create_queue(&mut self, _poll: bool) -> snapblk_core::Result<Box<dyn Queue>> {
        let snap = self
            .snap
            .clone()
            .ok_or_else(|| Error::new(libc::ENODEV, "Device must be connected"))?;
        let lane = snap.fg_lane();
        Ok(Box::new(SyncQueue::new(SnapBackend(
            snap,
            self.activity.clone(),
            lane,
        ))?))
    }
}

impl SnapshotDriver {
    /// Connect over a base given by `base.*` properties (a device, opened through the opener).
    fn connect_dev_base(&mut self, read_only: bool) -> snapblk_core::Result<DeviceInfo> {
        if self.base.is_some() {
            return Err(Error::inval(
                "snapshot: base and base.* properties cannot both be set",
            ));
        }
        let Some(cow) = &self.cow else {
            return Err(Error::inval(
                "snapshot: properties base and cow must be set",
            ));
        };
        let Some((_, driver)) = self.base_spec.iter().find(|(k, _)| k == "driver") else {
            return Err(Error::inval(
                "snapshot: base.driver must be set with base.* properties",
            ));
        };
        let Some(opener) = self.opener else {
            return Err(Error::inval(
                "snapshot: this driver instance cannot open a base device (no opener)",
            ));
        };
        let mut cfg = self.cfg;
        cfg.writable &= !read_only;
        if self.merge && cfg.writable {
            return Err(Error::inval(
                "snapshot: merge and writable cannot be combined (merge serves read-only)",
            ));
        }
        let props: Vec<(String, String)> = self
            .base_spec
            .iter()
            .filter(|(k, _)| k != "driver")
            .cloned()
            .collect();
        let dev = opener(driver, &props, self.merge)
            .map_err(|e| Error::new(e.errno, format!("snapshot base ({driver}): {}", e.msg)))?;
        let base = Arc::new(BlkioDev::new(dev)?);
        let mode = OpenMode {
            base_writable: self.merge,
            cow_writable: self.merge,
        };
        let snap = match remote_url(cow) {
            None => {
                // The record is checked as for a file base, every base block read through the
                // device.
                let verifier = if self.verify {
                    crate::cowrecord::load_verifier_dev(
                        &*base,
                        &dev_name(driver, &props),
                        cow,
                        self.cow_record.as_deref(),
                        self.verify_base,
                    )?
                } else {
                    None
                };
                open_verified(verifier, |size| open_dev_base(base, cow, cfg, mode, size))?
            }
            Some(url) => {
                if self.merge || cfg.writable {
                    return Err(Error::inval(
                        "snapshot: a COW given as a URL is read-only (no merge, no writable)",
                    ));
                }
                let cow_dev = open_url(opener, url, "COW")?;
                let verifier = if self.verify {
                    self.fetched_verifier(
                        opener,
                        url,
                        &*base,
                        &dev_name(driver, &props),
                        &*cow_dev,
                    )?
                } else {
                    None
                };
                open_verified(verifier, |size| open_devs_sized(base, cow_dev, cfg, size))?
            }
        };
        if self.merge {
            crate::merge::validate_order(&snap)?;
            if let Some(b) = snap.check_merge_base()?
                && let Some(e) = crate::cowrecord::merge_refusal(&b, snap.merge_progress().0)
            {
                return Err(e.into());
            }
        }
        self.finish_connect(snap)
    }

    /// Connect where the base or the COW (or both) is a URL (`s3://`, `http(s)://`): each URL is
    /// opened read-only through the opener as the registry's `s3` / `http` driver (`url=URL`),
    /// each path as a file. A remote COW cannot take writes (`writable` is refused) and neither
    /// remote side can be merged. The COW record is checked as for files: a remote COW's is
    /// fetched ([`fetch_record`]), a remote base is read through its driver.
    fn connect_remote(&mut self, read_only: bool) -> snapblk_core::Result<DeviceInfo> {
        let (Some(base), Some(cow)) = (self.base.clone(), self.cow.clone()) else {
            return Err(Error::inval(
                "snapshot: properties base and cow must be set",
            ));
        };
        if self.merge {
            return Err(Error::inval(
                "snapshot: merge needs a local base and COW (remote objects are read-only)",
            ));
        }
        let mut cfg = self.cfg;
        cfg.writable &= !read_only;
        let opener = self.opener;
        let open = |p: &std::path::Path, what: &str| -> snapblk_core::Result<Arc<dyn BlockDev>> {
            let Some(url) = remote_url(p) else {
                return Ok(Arc::new(FileDev::open_held(p, false, Hold::Shared)?));
            };
            let Some(opener) = opener else {
                return Err(Error::inval(format!(
                    "snapshot: this driver instance cannot open the {what} URL (no opener)"
                )));
            };
            Ok(open_url(opener, url, what)?)
        };
        if cfg.writable && remote_url(&cow).is_some() {
            return Err(Error::inval(
                "snapshot: writable needs a local COW (the overlay journal is written into it)",
            ));
        }
        let base_dev = open(&base, "base")?;
        let cow_dev: Arc<dyn BlockDev> = if cfg.writable {
            Arc::new(FileDev::open_held(&cow, true, Hold::Exclusive)?)
        } else {
            open(&cow, "COW")?
        };
        let verifier = match (self.verify, remote_url(&cow), opener) {
            (false, _, _) => None,
            (true, Some(url), Some(opener)) => self.fetched_verifier(
                opener,
                url,
                &*base_dev,
                &base.display().to_string(),
                &*cow_dev,
            )?,
            // A local COW (over a remote base): its record, read from beside it.
            _ => crate::cowrecord::load_verifier_dev(
                &*base_dev,
                &base.display().to_string(),
                &cow,
                self.cow_record.as_deref(),
                self.verify_base,
            )?,
        };
        let snap = open_verified(verifier, |size| {
            open_devs_sized(base_dev, cow_dev, cfg, size)
        })?;
        self.finish_connect(snap)
    }

    /// The verifier of the COW at `url` (read as `cow`) over `base`: its record fetched
    /// ([`fetch_record`]) and checked as a local one.
    fn fetched_verifier(
        &self,
        opener: DeviceOpener,
        url: &str,
        base: &dyn ReadAt,
        base_name: &str,
        cow: &dyn ReadAt,
    ) -> snapblk_core::Result<Option<Arc<Verifier>>> {
        let (rec, name) = fetch_record(opener, url, self.cow_record.as_deref())?;
        Ok(crate::cowrecord::load_verifier_fetched(
            base,
            base_name,
            cow,
            rec,
            &name,
            self.verify_base,
        )?)
    }

    /// Start readahead, recording and the merge as configured, and keep the snapshot.
    fn finish_connect(&mut self, snap: Arc<Snapshot>) -> snapblk_core::Result<DeviceInfo> {
        let writable = snap.writable();
        // The list is parsed (and a malformed one refused) before recording starts, so a failed
        // connect leaves no recording behind.
        if let Some(p) = &self.readahead
            && let Some(t) = self.activity.start_replay(snap.clone(), p)?
        {
            self.threads.push(t);
        }
        if let Some(p) = &self.record {
            let window = (self.record_secs > 0).then(|| Duration::from_secs(self.record_secs));
            if let Some(t) = self
                .activity
                .start_record(p, window, &Binding::of(snap.map()))?
            {
                self.threads.push(t);
            }
        }
        if self.merge {
            match self.activity.merge().start(snap.clone(), self.merge_held) {
                Ok(t) => self.threads.push(t),
                Err(e) => {
                    self.activity.stop();
                    for t in self.threads.drain(..) {
                        let _ = t.join();
                    }
                    return Err(e.into());
                }
            }
        }
        self.activity.attach(&snap);
        self.snap = Some(snap);
        Ok(DeviceInfo {
            read_only: !writable,
            request_alignment: 1,
            optimal_io_alignment: 4096,
            optimal_buf_alignment: 4096,
            flush_needed: writable,
            ..DeviceInfo::default()
        })
    }
}

/// A device base in messages: `DRIVER:` and the properties that say which device it is
/// (`pool`, `namespace`, `image`, `snapshot`, `path`, `url`), all of them when it has none of
/// those.
pub(crate) fn dev_name(driver: &str, props: &[(String, String)]) -> String {
    const NAMING: [&str; 6] = ["pool", "namespace", "image", "snapshot", "path", "url"];
    let naming: Vec<_> = props
        .iter()
        .filter(|(k, _)| NAMING.contains(&k.as_str()))
        .collect();
    let shown = if naming.is_empty() {
        props.iter().collect()
    } else {
        naming
    };
    let kv: Vec<String> = shown.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{driver}:{}", kv.join(","))
}

/// The registry driver that reads `url`: `s3` for `s3://`, else `http`.
fn url_driver(url: &str) -> &'static str {
    if url.starts_with("s3://") {
        "s3"
    } else {
        "http"
    }
}

/// Open `url` read-only through the opener's `s3` / `http` driver; `what` names it in errors.
fn open_url(opener: DeviceOpener, url: &str, what: &str) -> snapblk_core::Result<Arc<BlkioDev>> {
    let dev = opener(
        url_driver(url),
        &[("url".to_owned(), url.to_owned())],
        false,
    )
    .map_err(|e| Error::new(e.errno, format!("snapshot {what}: {}", e.msg)))?;
    Ok(Arc::new(BlkioDev::new(dev)?))
}

/// The most bytes a fetched record may have (a record of a fully rewritten 16 GiB image is
/// 256 MiB); a larger object is refused rather than held in memory.
const MAX_FETCHED_RECORD: u64 = 1 << 30;

/// The record of the COW at URL `cow`, fetched whole and parsed, and where it was looked for:
/// `cow-record` when set (a path, or a URL read through the opener; it must exist), else the
/// object `COW.snapblk` beside it. `None` when that object does not exist (any other failure
/// to read it is an error), and for an `http(s)` URL with a query (a presigned URL's signature
/// covers its path, so no name beside it can be derived; an `s3://` key may hold `?`).
fn fetch_record(
    opener: DeviceOpener,
    cow: &str,
    cow_record: Option<&std::path::Path>,
) -> snapblk_core::Result<(Option<Record>, String)> {
    let parse_err = |path: &str, source| {
        Error::from(crate::SnapError::Record {
            path: path.into(),
            source,
        })
    };
    let (url, implicit) = match cow_record {
        Some(p) => match remote_url(p) {
            Some(u) => (u.to_owned(), false),
            None => {
                let name = p.display().to_string();
                return match Record::load(p) {
                    Ok(Some(r)) => Ok((Some(r), name)),
                    Ok(None) => Err(Error::new(
                        libc::ENOENT,
                        format!("snapshot: COW record {name} does not exist"),
                    )),
                    Err(e) => Err(parse_err(&name, e)),
                };
            }
        },
        None if !cow.starts_with("s3://") && cow.contains('?') => {
            return Ok((None, format!("beside {cow}: a URL with a query has none")));
        }
        None => (format!("{cow}.snapblk"), true),
    };
    // Every failure past a missing object fails connect; without cow-record the user may
    // choose to serve unchecked (an S3 user without list permission gets 403 for a missing
    // key, too).
    let hint = if implicit {
        " (verify=false serves the COW without checking a record)"
    } else {
        ""
    };
    let fail = |e: Error| {
        Error::new(
            e.errno,
            format!("snapshot COW record {url}: {}{hint}", e.msg),
        )
    };
    let dev = match opener(url_driver(&url), &[("url".to_owned(), url.clone())], false) {
        Ok(d) => d,
        Err(e) if implicit && e.errno == libc::ENOENT => return Ok((None, url)),
        Err(e) => return Err(fail(e)),
    };
    let dev = BlkioDev::new(dev).map_err(fail)?;
    let len = dev.size().map_err(|e| fail(Error::from_io(e)))?;
    if len > MAX_FETCHED_RECORD {
        return Err(fail(Error::new(
            libc::EFBIG,
            format!("{len} bytes, more than a fetched record may have ({MAX_FETCHED_RECORD})"),
        )));
    }
    // Read in pieces: memory follows the bytes that arrive, not the size the server claims.
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 4 << 20];
    while (buf.len() as u64) < len {
        let n = chunk.len().min((len - buf.len() as u64) as usize);
        dev.read_exact_at(buf.len() as u64, &mut chunk[..n])
            .map_err(|e| fail(Error::from_io(e)))?;
        buf.extend_from_slice(&chunk[..n]);
    }
    let rec = Record::decode(&buf).map_err(|e| parse_err(&url, e))?;
    Ok((Some(rec), url))
}

/// `p` as a URL the remote drivers read (`s3://`, `http://`, `https://`, lower-case scheme).
fn remote_url(p: &std::path::Path) -> Option<&str> {
    p.to_str().filter(|s| {
        ["s3://", "http://", "https://"]
            .iter()
            .any(|x| s.starts_with(x))
    })
}

fn json<T: serde::Serialize>(v: &T) -> PropValue {
    PropValue::Str(serde_json::to_string(v).unwrap_or_default())
}
