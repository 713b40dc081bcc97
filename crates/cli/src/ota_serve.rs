//! `snapblk ota serve`: every partition an OTA updates, served as the device would see it
//! after the update — the partitions with a COW estimate as snapshots (old image + the COW `ota
//! cow` writes, checked by its record), the others built by `apply` into the work directory and
//! served read-only. NBD: one server, one export per partition, named after it; FUSE: one mount
//! per partition; ublk: one block device per partition, each served by its own thread.
//! `--merge` merges each COW into its old image while serving, as `snapblk serve --merge`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use snapblk_nbd::{Export, Listener, Server, ServerConfig, SharedDevice, TermSignals};
use snapblk_ota::DeviceProfile;
use snapblk_snapshot::{Activity, MergeState, MergeStats};

use super::cow::{Job, make};

/// Schema of every `ota serve --json` line (schemas/snapblk.ota-serve-event.v1.json).
const OTA_SERVE_SCHEMA: &str = "snapblk.ota-serve-event.v1";

#[derive(Args)]
#[command(group(clap::ArgGroup::new("export").required(true).multiple(false).args(["fuse", "nbd", "ublk"])))]
pub struct ServeArgs {
    /// The OTA: a zip with payload.bin, or a bare payload.bin.
    ota: PathBuf,
    /// Directory of the old images, OLDDIR/<partition>.img (with --merge, merged into in
    /// place).
    #[arg(long, value_name = "OLDDIR")]
    source: PathBuf,
    /// Work directory for the COWs, their records and the partitions served without a COW
    /// (created with mode 0700 if missing; never the source directory; refused when owned by
    /// another user).
    /// Default: a new directory in $TMPDIR with a random name and mode 0700, removed at exit.
    #[arg(long, value_name = "DIR")]
    work: Option<PathBuf>,
    /// Export over NBD on ADDR: PORT or :PORT (loopback), HOST:PORT, or unix:/path; the
    /// export names are the partition names.
    #[arg(long, value_name = "ADDR")]
    nbd: Option<String>,
    /// Export through FUSE: mount DIR/<partition>/ holding one file <partition>.img per
    /// partition (DIR/<partition> created if missing).
    #[arg(long, value_name = "DIR")]
    fuse: Option<PathBuf>,
    /// Export each partition as a ublk block device /dev/ublkbN (Linux ublk driver; copy data
    /// path, one queue, depth 64); the --json readiness line names each partition's device.
    #[arg(long)]
    ublk: bool,
    /// Only these partitions (comma-separated names).
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    partitions: Vec<String>,
    /// The device the COWs are for (as `ota cow --profile`).
    #[arg(long, default_value = "current", value_parser = super::cow::parse_profile)]
    profile: DeviceProfile,
    /// Merge each COW into its old image (OLDDIR/<partition>.img) while serving, as `snapblk
    /// serve --merge`; needs --work, where the COWs keep the merge's progress, so a stopped
    /// merge resumes with the next run over the same directory.
    #[arg(long, requires = "work")]
    merge: bool,
    /// Refuse the payload unless its signatures verify with this X.509 certificate or public
    /// key (as `ota apply --key`). Repeatable.
    #[arg(long = "key", value_name = "FILE")]
    keys: Vec<PathBuf>,
    /// Print one JSON line on stdout when clients may connect, and one when stopped.
    #[arg(long)]
    json: bool,
}

/// A partition name and its file.
type Named = (String, PathBuf);

/// The default --work: a new directory in $TMPDIR with a random name, created (never found)
/// with mode 0700, so no other user can plant files or links in it; removed when dropped.
fn temp_work() -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = std::env::temp_dir();
    tempfile::Builder::new()
        .prefix("snapblk-ota-serve-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(&tmp)
        .with_context(|| format!("creating a work directory in {}", tmp.display()))
}

/// Refuse a --work that exists and belongs to another user: its owner could swap the files
/// written there (COWs, built images) for links between our writes and our reads.
fn refuse_foreign(work: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::metadata(work) {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if m.uid() != me {
            bail!(
                "--work {}: owned by user {}, not by this one ({me}); use a directory of your own",
                work.display(),
                m.uid()
            );
        }
    }
    Ok(())
}

fn spec_path(p: &Path) -> Result<String> {
    let s = p.display().to_string();
    if s.contains(',') {
        bail!("{s}: paths served cannot contain ','");
    }
    Ok(s)
}

pub(super) fn run(a: &ServeArgs) -> Result<()> {
    let (work, _temp) = match &a.work {
        Some(w) => {
            refuse_foreign(w)?;
            (w.clone(), None)
        }
        None => {
            let t = temp_work()?;
            (t.path().to_owned(), Some(t))
        }
    };
    // A COW of a previous run over this --work whose merge has begun is merge state: resume
    // it rather than write the COW again.
    let job = Job {
        ota: &a.ota,
        source: &a.source,
        out: &work,
        partitions: &a.partitions,
        all_partitions: false,
        keep_raw: true,
        private_out: true,
        profile: a.profile,
        verify: false,
        verify_merge: false,
        keys: &a.keys,
        threads: None,
    };
    let existing: Vec<PathBuf> = std::fs::read_dir(&work)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "cow"))
                .collect()
        })
        .unwrap_or_default();
    let started = existing.iter().any(|p| {
        std::fs::File::open(p)
            .ok()
            .and_then(|f| snapblk_cow::read_num_merge_ops(&f).ok())
            .is_some_and(|n| n > 0)
    });
    if started && !a.merge {
        bail!(
            "{} holds COWs whose merge has begun: their old images are partly merged; serve them with --merge to finish",
            work.display()
        );
    }
    let mut bases: Vec<Named> = Vec::new();
    let (cows, raw): (Vec<Named>, Vec<Named>) = if started {
        let mut cows = Vec::new();
        for p in existing {
            let name = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            cows.push((name, p));
        }
        resumed_from(&a.ota, &cows)?;
        let raw = std::fs::read_dir(&work)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "img"))
            // Grown bases of a run without --merge are not partitions.
            .filter(|p| !p.to_string_lossy().ends_with(".base.img"))
            .map(|p| {
                let n = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                (n, p)
            })
            .collect();
        (cows, raw)
    } else {
        let made = make(&job)?;
        // A partition that grows is served over a copy of its old image extended to the new
        // size (a merge grows the old image itself; the driver says how when it is short).
        for c in made.cows.iter().filter(|_| !a.merge) {
            let old = a.source.join(format!("{}.img", c.partition));
            let len = std::fs::metadata(&old).map_or(0, |m| m.len());
            if len < c.new_size {
                let grown = work.join(format!("{}.base.img", c.partition));
                // A new file, never one found at that name: a link there (symbolic or hard)
                // to the old image would have it truncated.
                match std::fs::remove_file(&grown) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(e).with_context(|| format!("remove {}", grown.display()));
                    }
                    _ => {}
                }
                let mut f = std::fs::OpenOptions::new()
                    .create_new(true)
                    .write(true)
                    .open(&grown)
                    .with_context(|| format!("create {}", grown.display()))?;
                if len > 0 {
                    let mut from = std::fs::File::open(&old)
                        .with_context(|| format!("open {}", old.display()))?;
                    std::io::copy(&mut from, &mut f)
                        .with_context(|| format!("copy {}", old.display()))?;
                }
                f.set_len(c.new_size)?;
                bases.push((c.partition.clone(), grown));
            }
        }
        (
            made.cows
                .into_iter()
                .map(|c| (c.partition, c.cow))
                .collect(),
            made.raw,
        )
    };
    // Before any thread exists, so every thread inherits the mask and only we see the signals.
    let sigs = TermSignals::block().context("blocking SIGINT/SIGTERM")?;
    // (name, device, what it is) per partition: snapshots first, then built images.
    let mut devs = Vec::new();
    for (name, cow) in &cows {
        let base = bases
            .iter()
            .find(|(n, _)| n == name)
            .map_or_else(|| a.source.join(format!("{name}.img")), |(_, p)| p.clone());
        let mut spec = format!(
            "snapshot:base={},cow={}",
            spec_path(&base)?,
            spec_path(cow)?
        );
        if a.merge {
            spec.push_str(",merge=true");
        }
        let dev = snapblk::open(&spec, 1).map_err(|e| anyhow::anyhow!("opening {spec}: {e}"))?;
        devs.push((name.clone(), dev, serde_json::json!({"cow": cow})));
    }
    for (name, img) in &raw {
        let spec = format!("io_uring:path={},read-only=true", spec_path(img)?);
        let dev = snapblk::open(&spec, 1).map_err(|e| anyhow::anyhow!("opening {spec}: {e}"))?;
        devs.push((name.clone(), dev, serde_json::json!({"image": img})));
    }
    let merges = Merges::of(a, &devs);
    if let Some(dir) = &a.fuse {
        return serve_fuse(a, dir, devs, sigs, &work, &merges);
    }
    if a.ublk {
        return serve_ublk(a, devs, sigs, &work, &merges);
    }
    let Some(addr) = &a.nbd else {
        bail!("one of --nbd, --fuse, --ublk is required");
    };
    let mut exports = Vec::new();
    let mut listed = Vec::new();
    for (name, dev, what) in devs {
        let dev = Arc::new(SharedDevice::new(dev)?);
        let mut e = serde_json::json!({"name": name, "size": dev.geometry().size});
        e.as_object_mut()
            .into_iter()
            .for_each(|o| o.extend(what.as_object().cloned().unwrap_or_default()));
        listed.push(e);
        exports.push(Export {
            name: name.clone(),
            description: format!("snapblk: partition {name}"),
            device: dev,
            read_only: true,
            multi_conn: true,
        });
    }
    let server = Server::new(exports, ServerConfig::default())?;
    let listener = Listener::bind(addr).with_context(|| format!("binding NBD address {addr}"))?;
    let stop = server.stop_handle();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (stop, done) = (stop.clone(), done.clone());
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    if sigs.wait(Duration::from_millis(200)).is_some() {
                        stop.stop();
                        return;
                    }
                }
            })?
    };
    let uris: Vec<String> = listed
        .iter()
        .map(|e| listener.uri(e["name"].as_str().unwrap_or("")))
        .collect();
    if a.json {
        let v = serde_json::json!({
            "schema": OTA_SERVE_SCHEMA,
            "event": "ready",
            "export": "nbd",
            "address": listener.address(),
            "uri": uris.first(),
            "uris": uris,
            "partitions": listed,
            "work": work,
            "merge": a.merge,
        });
        say!("{v}");
    } else {
        for u in &uris {
            eprintln!("snapblk: serving {u}");
        }
    }
    merges.watch("nbd");
    let r = server.run(&listener);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = watcher.join();
    drop(listener);
    let stats = merges.finish();
    r.context("NBD server")?;
    if a.json {
        say!("{}", stopped_line("nbd", stats));
    }
    Ok(())
}

/// Refuse to resume the COWs of a work directory with an OTA that did not make them: each
/// must be one of its partitions, with a record whose target SHA-256 is that partition's
/// `new_partition_info` hash.
fn resumed_from(ota: &Path, cows: &[Named]) -> Result<()> {
    let (ota_file, _remote) = super::open(ota)?;
    let manifest = ota_file.payload().manifest();
    for (name, cow) in cows {
        let another = || {
            format!(
                "{} was written for another OTA than {}; finish its merge with the OTA that made it",
                cow.display(),
                ota.display()
            )
        };
        let Some(p) = manifest
            .partitions
            .iter()
            .find(|p| &p.partition_name == name)
        else {
            bail!("{} (it has no partition {name:?})", another());
        };
        let rec = snapblk_cow::record::Record::load(&snapblk_cow::record::sidecar_path(cow))
            .with_context(|| format!("the record of {}", cow.display()))?
            .with_context(|| format!("{} has no record; it cannot be resumed", cow.display()))?;
        let want = p
            .new_partition_info
            .as_ref()
            .and_then(|i| i.hash.as_deref());
        if want.is_some_and(|h| h != rec.target_sha256) {
            bail!("{} (its new image is not partition {name}'s)", another());
        }
    }
    Ok(())
}

/// One FUSE mount per partition, DIR/<partition>/<partition>.img, until SIGINT/SIGTERM.
fn serve_fuse(
    a: &ServeArgs,
    dir: &Path,
    devs: Vec<(String, snapblk::Blkio, serde_json::Value)>,
    sigs: TermSignals,
    work: &Path,
    merges: &Merges,
) -> Result<()> {
    let mut mounts = Vec::new();
    let mut listed = Vec::new();
    for (name, dev, what) in devs {
        let sub = dir.join(&name);
        std::fs::create_dir_all(&sub).with_context(|| format!("create {}", sub.display()))?;
        let opts = snapblk_fuse::FuseOptions {
            file_name: format!("{name}.img"),
            read_only: true,
            direct_io: false,
            threads: 2,
            allow_other: false,
            nonempty: false,
        };
        let m = snapblk_fuse::mount(dev, &sub, &opts)
            .with_context(|| format!("mounting {}", sub.display()))?;
        let mut e = serde_json::json!({
            "name": name,
            "size": m.size(),
            "path": m.file().display().to_string(),
        });
        e.as_object_mut()
            .into_iter()
            .for_each(|o| o.extend(what.as_object().cloned().unwrap_or_default()));
        listed.push(e);
        mounts.push(m);
    }
    if a.json {
        let v = serde_json::json!({
            "schema": OTA_SERVE_SCHEMA,
            "event": "ready",
            "export": "fuse",
            "mountpoint": dir.display().to_string(),
            "partitions": listed,
            "work": work,
            "merge": a.merge,
        });
        say!("{v}");
    } else {
        for e in &listed {
            eprintln!("snapblk: serving {}", e["path"].as_str().unwrap_or(""));
        }
    }
    merges.watch("fuse");
    // Until a signal (or every mount is unmounted from outside); then unmount each, lazily
    // when it is busy, so the users still holding it finish.
    while !mounts.iter().all(|m| m.is_finished()) {
        if sigs.wait(Duration::from_millis(200)).is_some() {
            break;
        }
    }
    for mut m in mounts {
        if m.is_finished() {
            let _ = m.try_unmount();
            continue;
        }
        match m.try_unmount() {
            Ok(()) => {}
            Err(snapblk_fuse::FuseError::Busy(p)) => {
                eprintln!("snapblk: {} is busy: detached it lazily", p.display());
                m.detach_lazy();
            }
            Err(e) => return Err(e.into()),
        }
    }
    let stats = merges.finish();
    if a.json {
        say!("{}", stopped_line("fuse", stats));
    }
    Ok(())
}

/// One ublk block device per partition, each served by its own thread, until SIGINT/SIGTERM
/// (or until one of them fails: then every device is removed and the error is the result).
fn serve_ublk(
    a: &ServeArgs,
    devs: Vec<(String, snapblk::Blkio, serde_json::Value)>,
    sigs: TermSignals,
    work: &Path,
    merges: &Merges,
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Result<snapblk_ublk::Ready, String>)>();
    let mut threads = Vec::new();
    let mut listed: Vec<serde_json::Value> = Vec::new();
    for (i, (name, dev, what)) in devs.into_iter().enumerate() {
        let mut e = serde_json::json!({ "name": name });
        e.as_object_mut()
            .into_iter()
            .for_each(|o| o.extend(what.as_object().cloned().unwrap_or_default()));
        listed.push(e);
        let (stop, tx) = (stop.clone(), tx.clone());
        let t = std::thread::Builder::new()
            .name(format!("ublk-{name}"))
            .spawn(move || {
                let planner = snapblk_ublk::planner_for(&dev);
                let ready_tx = tx.clone();
                let r = snapblk_ublk::serve(
                    dev,
                    &snapblk_ublk::Config::default(),
                    planner,
                    |r| {
                        let _ = ready_tx.send((i, Ok(r.clone())));
                    },
                    // One stop request per server: a second one would force the stop
                    // without waiting for the kernel to drain.
                    {
                        let mut told = false;
                        move |d| {
                            if !told && stop.load(Ordering::Relaxed) {
                                told = true;
                                return true;
                            }
                            std::thread::sleep(d.min(Duration::from_millis(100)));
                            if !told && stop.load(Ordering::Relaxed) {
                                told = true;
                                return true;
                            }
                            false
                        }
                    },
                );
                // A server that ends without a stop request failed (or never came up).
                if let Err(e) = &r {
                    let mut msg = e.to_string();
                    let mut src = std::error::Error::source(e);
                    while let Some(c) = src {
                        msg.push_str(&format!(": {c}"));
                        src = c.source();
                    }
                    let _ = tx.send((i, Err(msg)));
                }
                r
            })?;
        threads.push(t);
    }
    drop(tx);
    // Every device up, or the first failure.
    let mut up = 0;
    let mut failure = None;
    while up < listed.len() && failure.is_none() {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok((i, Ok(r))) => {
                if let Some(o) = listed[i].as_object_mut() {
                    o.insert("dev".into(), r.bdev.clone().into());
                    o.insert("size".into(), r.capacity.into());
                }
                up += 1;
            }
            Ok((i, Err(e))) => {
                failure = Some(format!(
                    "partition {}: {e}",
                    listed[i]["name"].as_str().unwrap_or("")
                ))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if sigs.wait(Duration::ZERO).is_some() {
                    failure = Some("stopped by a signal before every device was up".into());
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                failure = Some("a ublk server ended before its device was up".into());
            }
        }
    }
    if failure.is_none() {
        if a.json {
            let v = serde_json::json!({
                "event": "ready",
                "export": "ublk",
                "partitions": listed,
                "work": work,
                "merge": a.merge,
            });
            say!("{v}");
        } else {
            for e in &listed {
                eprintln!(
                    "snapblk: serving {} as {}",
                    e["name"].as_str().unwrap_or(""),
                    e["dev"].as_str().unwrap_or("")
                );
            }
        }
        merges.watch("ublk");
        // Until a signal or a server failure.
        loop {
            if sigs.wait(Duration::from_millis(200)).is_some() {
                break;
            }
            if let Ok((i, Err(e))) = rx.try_recv() {
                failure = Some(format!(
                    "partition {}: {e}",
                    listed[i]["name"].as_str().unwrap_or("")
                ));
                break;
            }
        }
    }
    let stats = merges.finish();
    stop.store(true, Ordering::Relaxed);
    let mut first_err = None;
    for (t, e) in threads.into_iter().zip(&listed) {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                first_err.get_or_insert_with(|| {
                    anyhow::Error::new(err).context(format!(
                        "ublk export of {}",
                        e["name"].as_str().unwrap_or("")
                    ))
                });
            }
            Err(_) => {
                first_err.get_or_insert_with(|| anyhow::anyhow!("a ublk server thread panicked"));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if let Some(f) = failure {
        bail!("{f}");
    }
    if a.json {
        say!("{}", stopped_line("ublk", stats));
    }
    Ok(())
}

/// The `stopped` line: with `--merge`, each partition's merge counters under `merges`.
fn stopped_line(export: &str, merges: Option<serde_json::Value>) -> serde_json::Value {
    let mut v =
        serde_json::json!({"schema": OTA_SERVE_SCHEMA, "event": "stopped", "export": export});
    if let (Some(m), Some(o)) = (merges, v.as_object_mut()) {
        o.insert("merges".into(), m);
    }
    v
}

/// The merges `ota serve --merge` runs, one per partition with a COW: a `merge` line (or a
/// line on stderr) when one ends while serving, and at the stop each one stopped at its next
/// durable step and its counters returned for the `stopped` line. No `merge` line follows
/// `stopped`.
struct Merges {
    acts: Vec<(String, Arc<Activity>)>,
    json: bool,
    /// Set once the stop began: the watchers print nothing more.
    closed: Arc<Mutex<bool>>,
}

impl Merges {
    fn of(a: &ServeArgs, devs: &[(String, snapblk::Blkio, serde_json::Value)]) -> Merges {
        let acts = devs
            .iter()
            .filter(|_| a.merge)
            .filter_map(|(name, dev, _)| Activity::of(dev).map(|act| (name.clone(), act)))
            .filter(|(_, act)| act.merge().stats().state != MergeState::Off)
            .collect();
        Merges {
            acts,
            json: a.json,
            closed: Arc::default(),
        }
    }

    /// After the `ready` line: a thread per merge that reports its end.
    fn watch(&self, export: &'static str) {
        for (name, act) in &self.acts {
            let (name, act, closed, json) =
                (name.clone(), act.clone(), self.closed.clone(), self.json);
            let _ = std::thread::Builder::new()
                .name("merge-watch".into())
                .spawn(move || {
                    let task = act.merge();
                    let mut shown = task.stats().merged;
                    loop {
                        let st = task.wait_progress(shown, Duration::from_secs(3600));
                        if matches!(st.state, MergeState::Running | MergeState::Paused) {
                            shown = st.merged;
                            continue;
                        }
                        let closed = closed.lock().unwrap_or_else(|e| e.into_inner());
                        if !*closed {
                            report_merge(json, export, &name, &st);
                        }
                        return;
                    }
                });
        }
    }

    /// Stop every merge at its next durable step (bounded by one merge window's I/O) and
    /// return their counters by partition; `None` without `--merge`.
    fn finish(&self) -> Option<serde_json::Value> {
        *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = true;
        if self.acts.is_empty() {
            return None;
        }
        let mut all = serde_json::Map::new();
        for (name, act) in &self.acts {
            let task = act.merge();
            task.stop();
            let st = task.wait(Duration::from_secs(3600));
            if st.state == MergeState::Stopped && !self.json {
                eprintln!(
                    "snapblk: merge of {name} stopped at {} of {} ops (run --merge again to resume)",
                    st.merged, st.total
                );
            }
            all.insert(name.clone(), serde_json::json!(st));
        }
        Some(serde_json::Value::Object(all))
    }
}

/// One partition's merge ended while serving: a JSON line, or a line on stderr.
fn report_merge(json: bool, export: &str, name: &str, st: &MergeStats) {
    if json {
        use std::io::Write;
        let v = serde_json::json!({"schema": OTA_SERVE_SCHEMA, "event": "merge", "export": export,
            "partition": name, "stats": st});
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{v}");
        let _ = o.flush();
        return;
    }
    match &st.error {
        None => eprintln!(
            "snapblk: merge of {name} {}: {} of {} ops in {} ms",
            serde_json::json!(st.state).as_str().unwrap_or("?"),
            st.merged,
            st.total,
            st.elapsed_us / 1000
        ),
        Some(e) => eprintln!("snapblk: merge of {name} failed: {e}"),
    }
}
