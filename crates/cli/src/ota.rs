//! `snapblk ota ...`: Android OTA payloads (update_engine's `payload.bin`, bare or in an OTA
//! zip). Thin layer over `snapblk-ota`.

use crate::human::bytes as human;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use snapblk_ota::{
    Check, Container, ExtentSummary, ExtractOptions, ExtractProgress, Ota, Output,
    PropertiesOrigin, PropertiesReport, Summary, VeritySummary,
};

use crate::outfile::{AtomicFile, refuse_alias};
use crate::progress::Progress;

/// Print a line to stdout; a write error is the command's error.
macro_rules! say {
    ($($t:tt)*) => {{
        $crate::out::write($crate::out::Stream::Stdout, format_args!($($t)*), true)?;
    }};
}

/// Schema of `ota info --json` documents.
const INFO_SCHEMA: &str = "snapblk.ota-info.v1";
/// Schema of `ota extract --json` documents.
const EXTRACT_SCHEMA: &str = "snapblk.ota-extract.v1";

#[derive(Subcommand)]
pub enum OtaCmd {
    /// Show an OTA's payload: header, manifest settings (minor version, Virtual A/B), and per
    /// partition its size, hash, operation histogram and whether `ota extract` can write it.
    Info {
        /// The OTA: a zip with payload.bin, or a bare payload.bin.
        ota: PathBuf,
        /// Also check FILE_HASH of payload_properties.txt (reads the whole payload).
        #[arg(long)]
        verify_file_hash: bool,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the partitions of a full OTA to DIR/<partition>.img, each checked against the
    /// payload's hashes before it appears under its name.
    Extract {
        /// The OTA: a zip with payload.bin, or a bare payload.bin.
        ota: PathBuf,
        /// Output directory (created if missing).
        #[arg(short = 'o', long = "output", value_name = "DIR")]
        out: PathBuf,
        /// Only these partitions (comma-separated names).
        #[arg(long, value_delimiter = ',', value_name = "A,B")]
        partitions: Vec<String>,
        /// Worker threads, 1..=256 (default: all cores).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
        threads: Option<u16>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(c: OtaCmd) -> Result<()> {
    match c {
        OtaCmd::Info {
            ota,
            verify_file_hash,
            json,
        } => verdict(json, INFO_SCHEMA, info(&ota, verify_file_hash, json)),
        OtaCmd::Extract {
            ota,
            out,
            partitions,
            threads,
            json,
        } => {
            let r = extract(&ota, &out, &partitions, threads, json);
            verdict(json, EXTRACT_SCHEMA, r)
        }
    }
}

/// With `--json`, a command that fails still prints a JSON document on stdout:
/// `{"schema": ..., "ok": false, "error": "..."}` (the error also goes to stderr, as always).
fn verdict(json: bool, schema: &str, r: Result<()>) -> Result<()> {
    if let (true, Err(e)) = (json, &r)
        && e.downcast_ref::<std::io::Error>().is_none()
    {
        let doc = serde_json::json!({ "schema": schema, "ok": false, "error": format!("{e:#}") });
        say!("{}", serde_json::to_string_pretty(&doc)?);
    }
    r
}

fn open(path: &Path) -> Result<Ota> {
    Ota::open(path).with_context(|| format!("{}", path.display()))
}

/// Check payload_properties.txt's sizes and metadata hash (and the file hash with `full`).
fn check_properties(ota: &Ota, full: bool) -> Result<Option<PropertiesReport>> {
    let Some((props, _)) = ota.properties() else {
        return Ok(None);
    };
    let mut r = props.check_metadata(ota.payload())?;
    if full {
        r.file_hash = props.check_file_hash(ota.payload(), &mut |_| {})?;
    }
    Ok(Some(r))
}

fn check_word(c: Check) -> &'static str {
    match c {
        Check::Matched => "matches",
        Check::Absent => "absent",
        Check::NotChecked => "not checked",
    }
}

fn info(path: &Path, verify_file_hash: bool, json: bool) -> Result<()> {
    let ota = open(path)?;
    let props = check_properties(&ota, verify_file_hash)?;
    let s = ota.payload().summary();
    let origin = ota.properties().map(|(_, o)| o.clone());
    if json {
        let mut v = serde_json::to_value(&s)?;
        v["schema"] = INFO_SCHEMA.into();
        v["ok"] = true.into();
        v["container"] = serde_json::to_value(ota.container())?;
        v["properties"] = serde_json::json!({ "origin": origin, "checks": props });
        say!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_info(&ota, &s, props.as_ref(), origin.as_ref())
}

fn print_info(
    ota: &Ota,
    s: &Summary,
    props: Option<&PropertiesReport>,
    origin: Option<&PropertiesOrigin>,
) -> Result<()> {
    let where_ = match ota.container() {
        Container::Bare => "bare payload".to_string(),
        Container::Zip { payload_offset } => format!("zip, payload.bin at offset {payload_offset}"),
    };
    say!("Payload: {} bytes ({where_})", s.payload_size);
    say!(
        "Header: major version {}, manifest {} bytes, metadata signature {} bytes, data at offset {}",
        s.header.major_version,
        s.header.manifest_size,
        s.header.metadata_signature_size,
        s.data_start
    );
    say!(
        "Kind: {} (minor version {}), block size {}",
        s.kind,
        s.minor_version,
        s.block_size
    );
    let sig = &s.signatures;
    match (sig.metadata_signature_size, sig.payload_signature) {
        (0, None) => say!("Signatures: none (unsigned)"),
        (m, p) => say!(
            "Signatures: metadata {m} bytes, payload {} (not verified by this build)",
            p.map_or("none".into(), |(o, n)| format!("{n} bytes at offset {o}"))
        ),
    }
    match (props, origin) {
        (Some(r), Some(o)) => {
            let from = match o {
                PropertiesOrigin::Zip => "in the zip".to_string(),
                PropertiesOrigin::File { path } => path.display().to_string(),
            };
            say!(
                "payload_properties.txt ({from}): FILE_SIZE {}, METADATA_SIZE {}, METADATA_HASH {}, FILE_HASH {}",
                check_word(r.file_size),
                check_word(r.metadata_size),
                check_word(r.metadata_hash),
                check_word(r.file_hash)
            );
        }
        _ => say!("payload_properties.txt: none"),
    }
    if let Some(t) = s.max_timestamp {
        say!("Max timestamp: {t}");
    }
    if let Some(l) = &s.security_patch_level {
        say!("Security patch level: {l}");
    }
    if s.partial_update {
        say!("Partial update: yes");
    }
    if let Some(d) = &s.dynamic_partitions {
        for (name, size, parts) in &d.groups {
            say!(
                "Group {name}: {} [{}]",
                size.map_or("no size".into(), human),
                parts.join(" ")
            );
        }
        let opt = |o: Option<String>| o.unwrap_or_else(|| "unset".into());
        say!(
            "Virtual A/B: snapshots {}, compression {} ({}), COW version {}, compression factor {}, threaded {}, batch writes {}, ublk {}",
            d.snapshot_enabled,
            d.vabc_enabled,
            opt(d.vabc_compression_param.clone()),
            opt(d.cow_version.map(|v| v.to_string())),
            opt(d.compression_factor.map(|v| v.to_string())),
            opt(d.threaded.map(|v| v.to_string())),
            opt(d.batch_writes.map(|v| v.to_string())),
            match d.disable_ublk {
                Some(true) => "disabled",
                _ => "allowed",
            }
        );
    }
    if !s.apex.is_empty() {
        say!("APEX packages: {}", s.apex.len());
    }
    say!("Partitions: {}", s.partitions.len());
    for p in &s.partitions {
        let hist = p
            .op_counts
            .iter()
            .map(|(t, n)| format!("{t} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        say!(
            "  {}: {} ({}), {} ops ({hist}), data {}",
            p.name.escape_debug(),
            p.size.map_or("no size".into(), human),
            p.size.map_or("-".into(), |n| format!("{n} bytes")),
            p.ops,
            human(p.data_bytes)
        );
        say!("    sha256 {}", p.sha256.as_deref().unwrap_or("none"));
        if let Some(old) = &p.old_sha256 {
            say!(
                "    old: {} sha256 {old}",
                p.old_size
                    .map_or("no size".into(), |n| format!("{n} bytes"))
            );
        }
        if p.estimate_cow_size.is_some() || p.merge_ops != (0, 0, 0) {
            say!(
                "    COW estimate {}, op count max {}, merge ops: {} copy, {} xor, {} other",
                p.estimate_cow_size.map_or("none".into(), human),
                p.estimate_op_count_max
                    .map_or("none".into(), |n| n.to_string()),
                p.merge_ops.0,
                p.merge_ops.1,
                p.merge_ops.2
            );
        }
        if let Some(v) = &p.verity {
            print_verity(v)?;
        }
        if p.extractable {
            say!("    extract: yes");
        } else if !p.blocked_by.is_empty() {
            say!(
                "    extract: no ({} not supported)",
                p.blocked_by.join(", ")
            );
        } else if let Some(why) = p.name_problem {
            say!("    extract: no (partition name: {why})");
        } else if let Some(why) = p.verity.as_ref().and_then(|v| v.problem.as_ref()) {
            say!("    extract: no (verity: {why})");
        } else {
            say!("    extract: no (new_partition_info lacks a size or a SHA-256)");
        }
    }
    Ok(())
}

/// The dm-verity fields of a partition: what the tree and the FEC cover and where they go.
fn print_verity(v: &VeritySummary) -> Result<()> {
    let ext = |e: Option<ExtentSummary>| {
        e.map_or("none".into(), |e| {
            format!("blocks {}+{}", e.start_block, e.num_blocks)
        })
    };
    if v.hash_tree_extent.is_some_and(|e| e.num_blocks > 0) || v.hash_tree_algorithm.is_some() {
        say!(
            "    hash tree: {} of {} at {}, salt {}",
            v.hash_tree_algorithm
                .as_deref()
                .unwrap_or("no algorithm")
                .escape_debug(),
            ext(v.hash_tree_data_extent),
            ext(v.hash_tree_extent),
            v.hash_tree_salt.as_deref().unwrap_or("none")
        );
    }
    if v.fec_extent.is_some_and(|e| e.num_blocks > 0) || v.fec_data_extent.is_some() {
        say!(
            "    FEC: {} roots over {} at {}",
            v.fec_roots,
            ext(v.fec_data_extent),
            ext(v.fec_extent)
        );
    }
    Ok(())
}

fn extract(
    path: &Path,
    dir: &Path,
    partitions: &[String],
    threads: Option<u16>,
    json: bool,
) -> Result<()> {
    let ota = open(path)?;
    let props = check_properties(&ota, false)?;
    let payload = ota.payload();
    let names = (!partitions.is_empty()).then_some(partitions);
    // Everything about the payload is checked before the output directory is touched.
    let plan = payload.plan_extract(names)?;
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => bail!("-o {} is not a directory", dir.display()),
        Ok(_) => {}
        Err(_) => std::fs::create_dir_all(dir)
            .with_context(|| format!("create directory {}", dir.display()))?,
    }
    let mut inputs: Vec<(&str, &Path)> = vec![("OTA", path)];
    if let Some((_, PropertiesOrigin::File { path: p })) = ota.properties() {
        inputs.push(("payload_properties.txt", p));
    }
    let mut files = Vec::with_capacity(plan.partitions().len());
    for p in plan.partitions() {
        let target = dir.join(format!("{}.img", p.name));
        refuse_alias("-o", &target, &inputs)?;
        files.push((AtomicFile::create(&target)?, target));
    }
    let outputs: Vec<&dyn Output> = files.iter().map(|(f, _)| f.file() as &dyn Output).collect();
    let bar = Progress::bytes(plan.dst_bytes(), "extract");
    let on = |e: ExtractProgress| {
        if let ExtractProgress::Advance { bytes } = e {
            bar.inc(bytes);
        }
    };
    let opts = ExtractOptions {
        threads: threads.map_or(0, usize::from),
        progress: Some(&on),
    };
    // FILE_HASH is checked by a reader beside the workers; nothing is named before it passes.
    let (report, file_hash) = std::thread::scope(|s| {
        let h = s.spawn(|| match ota.properties() {
            Some((p, _)) => p.check_file_hash(payload, &mut |_| {}).map(Some),
            None => Ok(None),
        });
        let r = plan.run(&outputs, &opts);
        (r, h.join())
    });
    bar.finish();
    let report = report?;
    let file_hash = file_hash.map_err(|_| anyhow::anyhow!("the FILE_HASH reader panicked"))??;
    drop(outputs);
    for (f, target) in files {
        f.commit()
            .with_context(|| format!("naming {}", target.display()))?;
    }
    let props = props.map(|mut r| {
        if let Some(c) = file_hash {
            r.file_hash = c;
        }
        r
    });
    if json {
        let doc = serde_json::json!({
            "schema": EXTRACT_SCHEMA,
            "ok": true,
            "output_dir": dir,
            "threads": report.threads,
            "properties": props,
            "partitions": report.partitions,
        });
        say!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    for p in &report.partitions {
        let verity = match &p.verity {
            None => String::new(),
            Some(v) => {
                let mut parts = Vec::new();
                if let (Some(a), Some(r)) = (v.hash_algorithm, &v.root_digest) {
                    parts.push(format!("hash tree ({} root {r})", a.name()));
                }
                if let Some(r) = v.fec_roots {
                    parts.push(format!("FEC ({r} roots)"));
                }
                format!(", {} recomputed", parts.join(" and "))
            }
        };
        say!(
            "{}.img: {} bytes, {} ops{verity}, sha256 {} verified",
            p.name,
            p.size,
            p.ops,
            p.sha256
        );
    }
    say!(
        "{} partitions written to {}",
        report.partitions.len(),
        dir.display()
    );
    Ok(())
}
