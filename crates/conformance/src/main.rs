//! `snapblk-conformance SPEC [--allow-destructive] [--drop-unreaped N]`: run the driver
//! conformance suite against a device spec and print one line per check. Exit status: 0 when no check failed, 1 when one
//! did, 2 when the target could not be opened or the arguments are wrong.

use snapblk_conformance::{OpenError, Options};
use std::process::ExitCode;

const USAGE: &str = "usage: snapblk-conformance SPEC [--allow-destructive] [--drop-unreaped N]

Runs the driver conformance suite against SPEC, a device spec such as
  io_uring:path=/dev/shm/x.img,direct=true   sync:path=disk.img   null:size=64M
and prints one line per check (PASS, FAIL or SKIP) and a count.

The write checks destroy the target's data (and grow a growable file by a few KiB), so
without --allow-destructive the target is opened read-only and only reads, and the
refusal of writes, are checked. A spec with read-only=false then is refused.
Set num-queues in SPEC to choose the queues; otherwise min(max-queues, 4) are used.

--drop-unreaped N opens SPEC N more times (after 3 warm-up opens), drops each instance
with reads submitted and not reaped, and checks that the process's open files do not grow
(check drop-unreaped).";

fn main() -> ExitCode {
    let mut spec = None;
    let mut destructive = false;
    let mut drops = 0usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--allow-destructive" => destructive = true,
            "--drop-unreaped" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => drops = n,
                None => {
                    eprintln!("snapblk-conformance: --drop-unreaped needs a count\n\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ if a.starts_with('-') || spec.is_some() => {
                eprintln!("snapblk-conformance: unexpected argument {a:?}\n\n{USAGE}");
                return ExitCode::from(2);
            }
            _ => spec = Some(a),
        }
    }
    let Some(spec) = spec else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let mut b = match snapblk_conformance::open_spec(&spec, destructive) {
        Ok(b) => b,
        Err(e) => {
            let mut msg = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                msg += &format!(": {c}");
                cause = c.source();
            }
            if let OpenError::Destructive { .. } = e {
                msg += " (pass --allow-destructive to run the write checks)";
            }
            eprintln!("snapblk-conformance: {msg}");
            return ExitCode::from(2);
        }
    };
    if !destructive {
        println!("read-only run: pass --allow-destructive to run the write checks (destroys data)");
    }
    // A spec that sets num-queues keeps it: start here, so the suite does not choose.
    let has_queues = snapblk::parse_spec(&spec).is_ok_and(|s| s.has("num-queues"));
    if has_queues && let Err(e) = b.start() {
        eprintln!("snapblk-conformance: cannot start {spec}: {e}");
        return ExitCode::from(2);
    }
    let mut report = snapblk_conformance::run(b, &Options::default());
    if drops > 0 {
        // Fresh instances of the same spec, each dropped with reads not reaped.
        let mut open = || {
            snapblk_conformance::open_spec(&spec, destructive).map_err(|e| match e {
                OpenError::Open { source, .. } => source,
                other => snapblk_core::Error::inval(other.to_string()),
            })
        };
        let outcome = snapblk_conformance::drop_unreaped(&mut open, drops);
        report.push("drop-unreaped", outcome);
    }
    println!("{report}");
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
