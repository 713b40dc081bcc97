//! `snapblk ctl PATH COMMAND`: the client of `snapblk serve --control PATH`.

use crate::serve_ops::CONTROL_VERSION;
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

/// The longest reply line read (a server's replies are a few hundred bytes).
const MAX_REPLY: u64 = 1 << 20;

/// A control request.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CtlCmd {
    /// The export, its size and uptime, and the merge's state.
    Status,
    /// Request/byte counters per direction, connections, merge, scheduler and cache counters.
    Stats,
    /// Start a merge that waits for it (serve --merge --merge-wait).
    MergeStart,
    /// Pause the merge at its next durable step (returns once it stopped there).
    MergePause,
    /// Resume a paused merge from where it stopped.
    MergeResume,
}

/// Talk to a server's control socket.
#[derive(Args)]
pub struct CtlArgs {
    /// The socket given to `snapblk serve --control`.
    path: PathBuf,
    /// The request.
    #[arg(value_enum)]
    cmd: CtlCmd,
    /// Print the server's JSON reply as is (one line).
    #[arg(long)]
    json: bool,
}

pub fn run(a: CtlArgs) -> anyhow::Result<()> {
    let name = a
        .cmd
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default();
    let mut s = UnixStream::connect(&a.path)
        .with_context(|| format!("connecting to {}", a.path.display()))?;
    let req = serde_json::json!({"v": CONTROL_VERSION, "cmd": name});
    writeln!(s, "{req}").context("sending the request")?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut line = String::new();
    BufReader::new((&s).take(MAX_REPLY + 1))
        .read_line(&mut line)
        .context("reading the reply")?;
    if line.len() as u64 > MAX_REPLY {
        bail!(
            "reply longer than {MAX_REPLY} bytes: is {} a snapblk control socket?",
            a.path.display()
        );
    }
    let reply: serde_json::Value =
        serde_json::from_str(line.trim_end()).context("the server's reply is not JSON")?;
    if reply["ok"] != true {
        bail!(
            "{name}: {}",
            reply["error"]
                .as_str()
                .unwrap_or("refused (no reason given)")
        );
    }
    if a.json {
        outln!("{reply}")?;
        return Ok(());
    }
    let merge = &reply["merge"];
    let merge_line = || {
        if merge.is_null() {
            "merge: none".to_owned()
        } else {
            format!(
                "merge: {} ({} of {} ops)",
                merge["state"].as_str().unwrap_or("?"),
                merge["merged"],
                merge["total"]
            )
        }
    };
    match a.cmd {
        CtlCmd::Status => {
            outln!(
                "{} export, {} bytes, up {:.1} s, {} client connection(s)",
                reply["export"].as_str().unwrap_or("?"),
                reply["size"],
                reply["uptime_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
                reply["connections_active"]
            )?;
            outln!("{}", merge_line())?;
        }
        CtlCmd::Stats => {
            for d in ["read", "write", "flush", "discard"] {
                let v = &reply["io"][d];
                outln!(
                    "{d}: {} requests, {} bytes, {} errors",
                    v["requests"],
                    v["bytes"],
                    v["errors"]
                )?;
            }
            outln!("{}", merge_line())?;
            if let Some(c) = reply["cache"].as_object() {
                outln!("cache: {} hits, {} misses", c["hits"], c["misses"])?;
            }
        }
        CtlCmd::MergeStart | CtlCmd::MergePause | CtlCmd::MergeResume => {
            outln!("{}", merge_line())?;
        }
    }
    Ok(())
}
