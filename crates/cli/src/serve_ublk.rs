//! `snapblk serve --ublk` options and runner (owned by the ublk export).

use clap::{Args, ValueEnum};
use snapblk_ublk::{Config, DataPath};
use std::io::Write;

/// Data path of the ublk export.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum UblkMode {
    /// The kernel copies request data to/from a per-request server buffer.
    #[default]
    Copy,
    /// The server copies data itself through /dev/ublkcN (UBLK_F_USER_COPY).
    UserCopy,
    /// Request pages are registered in the server's io_uring (UBLK_F_AUTO_BUF_REG); reads of
    /// file data (plain files, snapshot base blocks) go from the file straight into them.
    ZeroCopy,
}

/// Options of the ublk export.
#[derive(Args, Debug, Default)]
pub struct UblkArgs {
    // No clap defaults: `snapblk serve` refuses these options without --ublk, so it must see
    // whether they were given (the defaults are the methods below).
    /// ublk: hardware queues (one server thread each); default: the device's queue count.
    #[arg(long, value_name = "N")]
    pub ublk_queues: Option<u16>,
    /// ublk: requests in flight per queue [default: 64].
    #[arg(long, value_name = "N")]
    pub ublk_depth: Option<u16>,
    /// ublk: data path [default: copy].
    #[arg(long, value_enum)]
    pub ublk_mode: Option<UblkMode>,
    /// ublk: largest request in KiB [default: 512].
    #[arg(long, value_name = "KIB")]
    pub ublk_max_io_kib: Option<u32>,
    /// ublk: device number. If /dev/ublkcN exists and its server died, reattach to it (user
    /// recovery: the block device and anything mounted on it stay); otherwise create it.
    #[arg(long, value_name = "N")]
    pub ublk_id: Option<u32>,
    /// ublk: do not use the zero-copy read planner even in zero-copy mode (for comparisons;
    /// only with --ublk-mode zero-copy).
    #[arg(long)]
    pub ublk_no_plan: bool,
}

impl UblkArgs {
    pub fn depth(&self) -> u16 {
        self.ublk_depth.unwrap_or(64)
    }
    pub fn mode(&self) -> UblkMode {
        self.ublk_mode.unwrap_or_default()
    }
    pub fn max_io_kib(&self) -> u32 {
        self.ublk_max_io_kib.unwrap_or(512)
    }
}

/// Serve `dev` as /dev/ublkbN until SIGINT/SIGTERM.
/// `stop(d)` waits up to `d` for a stop request: the stop source of
/// [`snapblk_ublk::block_stop_signals`], called before the device was opened so that no thread
/// of the device (readahead, merge) takes SIGINT/SIGTERM with its default action. `after_ready`
/// runs once the device is up and the "ready" line is out. The caller prints the "stopped" line.
/// `observe`: where the queues count requests, and fields the "ready" line adds.
pub fn run(
    dev: snapblk_core::Blkio,
    args: &UblkArgs,
    observe: (
        std::sync::Arc<snapblk_core::IoStats>,
        serde_json::Map<String, serde_json::Value>,
    ),
    json: bool,
    stop: impl FnMut(std::time::Duration) -> bool,
    after_ready: impl FnOnce(),
) -> anyhow::Result<()> {
    let queues = match args.ublk_queues {
        Some(n) => n,
        None => u16::try_from(dev.get_int("num-queues").unwrap_or(1).max(1)).unwrap_or(1),
    };
    let path = match args.mode() {
        UblkMode::Copy => DataPath::Copy,
        UblkMode::UserCopy => DataPath::UserCopy,
        UblkMode::ZeroCopy => DataPath::ZeroCopy,
    };
    let planner = if args.ublk_no_plan {
        None
    } else {
        snapblk_ublk::planner_for(&dev)
    };
    let cfg = Config {
        queues,
        depth: args.depth(),
        max_io_bytes: args.max_io_kib().saturating_mul(1024),
        path,
        id: args.ublk_id,
        stats: observe.0,
    };
    let extra = observe.1;
    snapblk_ublk::serve(
        dev,
        &cfg,
        planner,
        move |r| {
            if json {
                let mut v = serde_json::json!({
                    "event": "ready",
                    "export": "ublk",
                    "dev": r.bdev,
                    "id": r.dev_id,
                    "mode": r.path.name(),
                    "queues": r.queues,
                    "depth": r.depth,
                    "capacity": r.capacity,
                    "recovered": r.recovered,
                    "planned_reads": r.planned_reads,
                });
                v["schema"] = "snapblk.serve-event.v1".into();
                if let Some(o) = v.as_object_mut() {
                    o.extend(extra);
                }
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{v}");
                let _ = o.flush();
            } else {
                eprintln!(
                    "snapblk: serving {} ({}, {} mode{}, {} queue(s) x {}){}",
                    r.bdev,
                    crate::human::bytes_exact(r.capacity),
                    r.path.name(),
                    if r.planned_reads {
                        ", planned zero-copy reads"
                    } else {
                        ""
                    },
                    r.queues,
                    r.depth,
                    if r.recovered { ", recovered" } else { "" }
                );
            }
            after_ready();
        },
        stop,
    )?;
    Ok(())
}
