//! `snapblk info DEVICE [--json]`: open a device spec (see the `snapblk` crate docs) and print
//! every property with its value, or the error that reading it gives. The device is opened
//! read-only unless the spec sets `read-only` (or `writable`) itself.

use clap::Args;
use std::fmt::Write as _;

#[derive(Args)]
pub struct InfoArgs {
    /// Device spec: PATH, or DRIVER:key=value,... (e.g. null:size=1G, io_uring:path=/dev/zram0,direct=true)
    device: String,
    /// Print a JSON object {property: value, "schema": "snapblk.info.v1"} instead of a table.
    #[arg(long)]
    json: bool,
}

/// Properties that are sizes in bytes: the table shows them as `1.00 GiB (1073741824 bytes)`
/// (0, "no limit" for most, stays 0).
const SIZES: &[&str] = &[
    "capacity",
    "size",
    "max-transfer",
    "optimal-io-size",
    "max-segment-len",
    "max-discard-len",
    "max-write-zeroes-len",
];

pub fn run(a: InfoArgs) -> anyhow::Result<()> {
    let json = a.json;
    crate::out::json_verdict(json, "snapblk.info.v1", run_cmd(a))
}

fn run_cmd(a: InfoArgs) -> anyhow::Result<()> {
    let fail = |e: snapblk::Error| anyhow::anyhow!("{}: {}", a.device, e);
    let mut spec = snapblk::parse_spec(&a.device).map_err(fail)?;
    // Only reads: open read-only (a 0444 file, a read-only mount) unless the spec says how.
    if !spec.has("read-only") && !spec.has("writable") {
        spec.props.push(("read-only".into(), "true".into()));
    }
    let b = snapblk::open_spec(&spec, 1).map_err(fail)?;
    let mut rows = Vec::new();
    for spec in b.prop_specs() {
        rows.push((spec.name, b.get(spec.name, None)));
    }
    let mut out = String::new();
    if a.json {
        // Versioned like every --json document (schemas/snapblk.info.v1.json).
        let mut m = serde_json::Map::new();
        m.insert("schema".into(), "snapblk.info.v1".into());
        m.insert("ok".into(), true.into());
        m.insert("error".into(), serde_json::Value::Null);
        for (name, v) in rows {
            let j = match v {
                Ok(snapblk_core::PropValue::Bool(x)) => serde_json::Value::from(x),
                Ok(snapblk_core::PropValue::Int(x)) => serde_json::Value::from(x),
                Ok(snapblk_core::PropValue::U64(x)) => serde_json::Value::from(x),
                Ok(snapblk_core::PropValue::Str(x)) => serde_json::Value::from(x),
                Err(_) => serde_json::Value::Null,
            };
            m.insert(name.to_owned(), j);
        }
        out = serde_json::to_string_pretty(&m)? + "\n";
    } else {
        let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        for (name, v) in rows {
            match v {
                // Sizes human-readable with the exact count (alignments stay plain numbers).
                Ok(snapblk_core::PropValue::U64(x)) if SIZES.contains(&name) && x > 0 => {
                    writeln!(out, "{name:<w$}  {}", crate::human::bytes_exact(x))?
                }
                Ok(snapblk_core::PropValue::Int(x)) if SIZES.contains(&name) && x > 0 => {
                    writeln!(out, "{name:<w$}  {}", crate::human::bytes_exact(x as u64))?
                }
                Ok(v) => writeln!(out, "{name:<w$}  {}", v.to_display_string())?,
                Err(e) => writeln!(out, "{name:<w$}  <{e}>")?,
            }
        }
    }
    // A closed or full stdout fails the command (main: quiet 141 for a closed pipe).
    out!("{out}")?;
    Ok(())
}
