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

/// Schema of `snapblk ctl --json` documents (schemas/snapblk.ctl.v1.json): the server's reply
/// with `schema` and the request's `cmd` added.
const CTL_SCHEMA: &str = "snapblk.ctl.v1";

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
    let mut reply: serde_json::Value =
        serde_json::from_str(line.trim_end()).context("the server's reply is not JSON")?;
    if a.json
        && let Some(m) = reply.as_object_mut()
    {
        m.insert("schema".into(), CTL_SCHEMA.into());
        m.insert("cmd".into(), name.clone().into());
        // A refusal is printed too (as other commands' `ok: false` documents), then reported.
        outln!("{reply}")?;
    }
    if reply["ok"] != true {
        bail!(
            "{name}: {}",
            reply["error"]
                .as_str()
                .unwrap_or("refused (no reason given)")
        );
    }
    if a.json {
        return Ok(());
    }
    for l in text(a.cmd, &reply) {
        outln!("{l}")?;
    }
    Ok(())
}

/// A JSON number as u64 (0 when absent).
fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The merge's line: state, ops done and the share of the total.
fn merge_line(merge: &serde_json::Value, rate: Option<f64>) -> String {
    if merge.is_null() {
        return "merge: none".to_owned();
    }
    let (done, total) = (n(&merge["merged"]), n(&merge["total"]));
    let pct = if total > 0 {
        100.0 * done as f64 / total as f64
    } else {
        100.0
    };
    let mut l = format!(
        "merge: {}, {done} of {total} ops ({pct:.1} %)",
        merge["state"].as_str().unwrap_or("?")
    );
    if merge["started"] == false {
        l.push_str(", waiting for merge-start");
    }
    if let Some(r) = rate.filter(|r| *r > 0.0) {
        l.push_str(&format!(", {r:.0} ops/s"));
    }
    l
}

/// The human-readable text of a reply: sizes and rates in binary units, counts as integers
/// (`--json` keeps the exact numbers).
fn text(cmd: CtlCmd, reply: &serde_json::Value) -> Vec<String> {
    use crate::human::{bytes, bytes_exact, rate};
    let secs = n(&reply["uptime_ms"]) as f64 / 1000.0;
    let mut out = Vec::new();
    match cmd {
        CtlCmd::Status => {
            out.push(format!(
                "{} export, {}, up {secs:.1} s, {} client connection(s)",
                reply["export"].as_str().unwrap_or("?"),
                bytes_exact(n(&reply["size"])),
                n(&reply["connections_active"])
            ));
            out.push(merge_line(&reply["merge"], None));
        }
        CtlCmd::Stats => {
            for d in ["read", "write", "flush", "discard"] {
                let v = &reply["io"][d];
                let (reqs, b) = (n(&v["requests"]), n(&v["bytes"]));
                let mut l = format!("{d}: {reqs} requests");
                if d == "read" || d == "write" || b > 0 {
                    l.push_str(&format!(", {} ({} average)", bytes(b), rate(b, secs)));
                }
                l.push_str(&format!(", {} errors", n(&v["errors"])));
                if reqs > 0 {
                    let us = n(&v["latency_sum_ns"]) as f64 / reqs as f64 / 1000.0;
                    l.push_str(&format!(", mean latency {us:.1} us"));
                }
                out.push(l);
            }
            out.push(format!(
                "connections: {} active, {} in all; up {secs:.1} s",
                n(&reply["connections_active"]),
                n(&reply["connections_total"])
            ));
            out.push(merge_line(
                &reply["merge"],
                reply["merge_ops_per_second"].as_f64(),
            ));
            if let Some(sc) = reply["sched"].as_object() {
                let mut l = "scheduler:".to_owned();
                for c in ["foreground", "merge", "readahead"] {
                    let v = &sc[c];
                    l.push_str(&format!(
                        " {c} {} requests, {}, waited {:.3} s;",
                        n(&v["requests"]),
                        bytes(n(&v["bytes"])),
                        n(&v["wait_ns"]) as f64 / 1e9
                    ));
                }
                l.push_str(&format!(
                    " budget cut {} times, grown {}",
                    n(&sc["budget_shrinks"]),
                    n(&sc["budget_grows"])
                ));
                out.push(l);
            }
            if let Some(c) = reply["cache"].as_object() {
                out.push(format!(
                    "cache: {} hits, {} misses, {} of {} held",
                    n(&c["hits"]),
                    n(&c["misses"]),
                    bytes(n(&c["bytes"])),
                    bytes(n(&c["capacity"]))
                ));
            }
        }
        CtlCmd::MergeStart | CtlCmd::MergePause | CtlCmd::MergeResume => {
            out.push(merge_line(&reply["merge"], None));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stats_text_is_human() {
        let r = json!({
            "ok": true, "uptime_ms": 2000, "connections_active": 1, "connections_total": 3,
            "io": {
                "read": {"requests": 4, "bytes": 4u64 << 20, "errors": 0, "latency_sum_ns": 8000},
                "write": {"requests": 0, "bytes": 0, "errors": 0, "latency_sum_ns": 0},
                "flush": {"requests": 1, "bytes": 0, "errors": 0, "latency_sum_ns": 500},
                "discard": {"requests": 0, "bytes": 0, "errors": 0, "latency_sum_ns": 0},
            },
            "merge": {"state": "paused", "merged": 1, "total": 4, "started": true},
            "merge_ops_per_second": 12.4,
            "cache": {"hits": 5, "misses": 1, "bytes": 1536, "capacity": 64u64 << 20},
        });
        let t = text(CtlCmd::Stats, &r);
        assert_eq!(
            t[0],
            "read: 4 requests, 4.00 MiB (2.00 MiB/s average), 0 errors, mean latency 2.0 us"
        );
        assert_eq!(t[2], "flush: 1 requests, 0 errors, mean latency 0.5 us");
        assert_eq!(t[4], "connections: 1 active, 3 in all; up 2.0 s");
        assert_eq!(t[5], "merge: paused, 1 of 4 ops (25.0 %), 12 ops/s");
        assert_eq!(t[6], "cache: 5 hits, 1 misses, 1.50 KiB of 64.00 MiB held");
    }

    #[test]
    fn status_text_is_human() {
        let r = json!({
            "ok": true, "export": "nbd", "size": 4u64 << 20, "uptime_ms": 1500,
            "connections_active": 0,
            "merge": {"state": "paused", "merged": 0, "total": 8, "started": false},
        });
        assert_eq!(
            text(CtlCmd::Status, &r),
            [
                "nbd export, 4.00 MiB (4194304 bytes), up 1.5 s, 0 client connection(s)",
                "merge: paused, 0 of 8 ops (0.0 %), waiting for merge-start"
            ]
        );
    }
}
