//! `snapblk serve`: export a device over ublk, FUSE or NBD until SIGINT/SIGTERM.

use crate::serve_ublk;
use anyhow::{Context, bail};
use clap::{ArgGroup, Args};
use snapblk_nbd::signals::TermSignals;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
#[command(group(ArgGroup::new("export").required(true).multiple(false).args(["ublk", "fuse", "nbd"])))]
pub struct ServeArgs {
    /// Device spec: a file or block device (io_uring driver) or DRIVER:key=value,...
    /// (e.g. null:size=1G, sync:path=disk.img). Omit it when giving --base/--cow.
    #[arg(required_unless_present = "base", conflicts_with = "base")]
    device: Option<String>,
    /// Snapshot base image (with --cow): serves snapshot:base=B,cow=C.
    #[arg(long, requires = "cow", value_name = "B")]
    base: Option<PathBuf>,
    /// Snapshot COW file (with --base).
    #[arg(long, requires = "base", value_name = "C")]
    cow: Option<PathBuf>,
    /// Make the snapshot writable (writes go to an overlay, the base is never modified).
    #[arg(long, requires = "base")]
    writable: bool,
    /// Open the device read-only and export it read-only.
    #[arg(long)]
    read_only: bool,
    /// Queues opened with the device (more are added per NBD connection / FUSE thread when the
    /// driver allows it).
    #[arg(long, default_value_t = 1, value_name = "N")]
    queues: i32,
    /// Print one JSON line on stdout when clients may connect, and one when stopped.
    #[arg(long)]
    json: bool,

    /// Export through ublk as /dev/ublkbN.
    #[arg(long)]
    ublk: bool,
    /// Export through FUSE: mount DIR holding one file that is the device.
    #[arg(long, value_name = "DIR")]
    fuse: Option<PathBuf>,
    /// Export over NBD on ADDR: PORT or :PORT (loopback), HOST:PORT, or unix:/path.
    #[arg(long, value_name = "ADDR")]
    nbd: Option<String>,

    /// NBD export name (the empty name always selects it too).
    #[arg(long, default_value = "", value_name = "NAME")]
    nbd_name: String,
    /// NBD: maximum concurrent connections.
    #[arg(long, default_value_t = 64, value_name = "N")]
    nbd_max_connections: usize,
    /// NBD: never advertise multi-conn (by default it is advertised for read-only exports and
    /// for file, null and snapshot drivers, whose flush covers every connection).
    #[arg(long)]
    nbd_no_multi_conn: bool,

    /// FUSE: name of the device file in DIR.
    #[arg(long, default_value = "disk.img", value_name = "NAME")]
    fuse_file: String,
    /// FUSE: bypass the page cache (direct_io) on every open.
    #[arg(long)]
    fuse_direct_io: bool,
    /// FUSE: worker threads.
    #[arg(long, default_value_t = 4, value_name = "N")]
    fuse_threads: usize,
    /// FUSE: allow other users to access the file (allow_other).
    #[arg(long)]
    fuse_allow_other: bool,

    #[command(flatten)]
    ublk_args: serve_ublk::UblkArgs,
}

/// The device spec to open, from DEVICE or --base/--cow.
fn spec(a: &ServeArgs) -> anyhow::Result<String> {
    if let (Some(b), Some(c)) = (&a.base, &a.cow) {
        let (b, c) = (b.display().to_string(), c.display().to_string());
        if b.contains(',') || c.contains(',') {
            bail!("--base/--cow paths cannot contain ','");
        }
        let mut s = format!("snapshot:base={b},cow={c}");
        if a.writable && !a.read_only {
            s.push_str(",writable=true");
        }
        return Ok(s);
    }
    let Some(d) = &a.device else {
        bail!("a DEVICE or --base/--cow is required")
    };
    if !a.read_only {
        return Ok(d.clone());
    }
    let parsed = snapblk::parse_spec(d).map_err(|e| anyhow::anyhow!("{e}"))?;
    if d.starts_with(&format!("{}:", parsed.driver)) {
        Ok(format!("{d},read-only=true"))
    } else if d.contains(',') {
        bail!("--read-only with a path containing ',': use io_uring:path=...,read-only=true")
    } else {
        Ok(format!("io_uring:path={d},read-only=true"))
    }
}

fn emit(json: bool, v: serde_json::Value) {
    if json {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{v}");
        let _ = o.flush();
    }
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let spec = spec(&a)?;
    if a.ublk {
        let dev = snapblk::open(&spec, a.queues.max(1))
            .map_err(|e| anyhow::anyhow!("opening {spec}: {e}"))?;
        return serve_ublk::run(dev, &a.ublk_args, a.json);
    }
    // Before any thread exists, so every thread inherits the mask and only we see the signals.
    let sigs = TermSignals::block().context("blocking SIGINT/SIGTERM")?;
    let dev = snapblk::open(&spec, a.queues.max(1))
        .map_err(|e| anyhow::anyhow!("opening {spec}: {e}"))?;
    if let Some(addr) = &a.nbd {
        serve_nbd(dev, addr, &a, sigs)
    } else if let Some(dir) = &a.fuse {
        serve_fuse(dev, dir, &a, sigs)
    } else {
        bail!("one of --ublk, --fuse, --nbd is required")
    }
}

fn serve_nbd(
    dev: snapblk::Blkio,
    addr: &str,
    a: &ServeArgs,
    sigs: TermSignals,
) -> anyhow::Result<()> {
    use snapblk_nbd::{Export, Listener, Server, ServerConfig, SharedDevice};
    let driver = dev.driver_name().to_owned();
    let dev = Arc::new(SharedDevice::new(dev)?);
    let read_only = a.read_only || dev.geometry().read_only;
    // These drivers flush device-wide state (the file, or the snapshot shared by all queues).
    let flush_is_global = matches!(driver.as_str(), "io_uring" | "sync" | "null" | "snapshot");
    let export = Export {
        name: a.nbd_name.clone(),
        description: format!("snapblk {driver} device"),
        device: dev.clone(),
        read_only,
        multi_conn: !a.nbd_no_multi_conn && (read_only || flush_is_global),
    };
    let cfg = ServerConfig {
        max_connections: a.nbd_max_connections.max(1),
        ..ServerConfig::default()
    };
    let server = Server::new(vec![export], cfg)?;
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
    emit(
        a.json,
        serde_json::json!({
            "event": "ready",
            "export": "nbd",
            "address": listener.address(),
            "uri": listener.uri(&a.nbd_name),
            "name": a.nbd_name,
            "size": dev.geometry().size,
            "read_only": read_only,
        }),
    );
    if !a.json {
        eprintln!(
            "snapblk: serving {} bytes over NBD at {}",
            dev.geometry().size,
            listener.uri(&a.nbd_name)
        );
    }
    let r = server.run(&listener);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = watcher.join();
    drop(listener);
    r.context("NBD server")?;
    // Connections flush on close; one more device-wide flush covers anything else.
    let never = std::sync::atomic::AtomicBool::new(false);
    if !read_only {
        dev.flush(&never)
            .map_err(|e| anyhow::anyhow!("final flush: {e}"))?;
    }
    emit(
        a.json,
        serde_json::json!({"event": "stopped", "export": "nbd"}),
    );
    Ok(())
}

fn serve_fuse(
    dev: snapblk::Blkio,
    dir: &std::path::Path,
    a: &ServeArgs,
    sigs: TermSignals,
) -> anyhow::Result<()> {
    let opts = snapblk_fuse::FuseOptions {
        file_name: a.fuse_file.clone(),
        read_only: a.read_only,
        direct_io: a.fuse_direct_io,
        threads: a.fuse_threads.max(1),
        allow_other: a.fuse_allow_other,
    };
    let mut m = snapblk_fuse::mount(dev, dir, &opts)?;
    emit(
        a.json,
        serde_json::json!({
            "event": "ready",
            "export": "fuse",
            "mountpoint": dir.display().to_string(),
            "path": m.file().display().to_string(),
            "size": m.size(),
            "read_only": m.read_only(),
        }),
    );
    if !a.json {
        eprintln!(
            "snapblk: serving {} bytes as {}",
            m.size(),
            m.file().display()
        );
    }
    let mut signalled = 0;
    loop {
        if m.is_finished() {
            // Unmounted from outside (`umount DIR`): nothing left to serve.
            m.try_unmount()?;
            break;
        }
        if sigs.wait(Duration::from_millis(200)).is_none() {
            continue;
        }
        signalled += 1;
        match m.try_unmount() {
            Ok(()) => break,
            Err(snapblk_fuse::FuseError::Busy(p)) if signalled >= 2 => {
                eprintln!(
                    "snapblk: {} still busy at the second signal: detaching it lazily",
                    p.display()
                );
                m.unmount_lazy()?;
                break;
            }
            Err(snapblk_fuse::FuseError::Busy(p)) => {
                eprintln!(
                    "snapblk: {} is busy (detach loop devices / close files first); still serving, signal again to detach lazily",
                    p.display()
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    emit(
        a.json,
        serde_json::json!({"event": "stopped", "export": "fuse"}),
    );
    Ok(())
}
