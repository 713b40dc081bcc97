//! `snapblk ota ...`: Android OTA payloads (update_engine's `payload.bin`, bare or in an OTA
//! zip). Thin layer over `snapblk-ota`.

use crate::human::bytes as human;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use snapblk_core::ReadAt;
use snapblk_ota::{
    Check, Container, ExtentSummary, ExtractOptions, ExtractProgress, ExtractReport, Ota, Output,
    PropertiesOrigin, PropertiesReport, Summary, VeritySummary, check_partition_name,
};
use snapblk_remote::{RemoteConfig, RemoteObject};

use crate::ota_sig::{self, Keys, Reported};
use crate::outfile::{AtomicFile, refuse_alias, same_file};
use crate::progress::Progress;

/// Print a line to stdout; a write error is the command's error.
macro_rules! say {
    ($($t:tt)*) => {{
        $crate::out::write($crate::out::Stream::Stdout, format_args!($($t)*), true)?;
    }};
}

// `ota cow` lives in its own file and uses this module's helpers.
#[path = "ota_cow.rs"]
mod cow;
#[path = "ota_serve.rs"]
mod serve;

/// Schema of `ota info --json` documents.
const INFO_SCHEMA: &str = "snapblk.ota-info.v1";
/// Schema of `ota extract --json` documents.
const EXTRACT_SCHEMA: &str = "snapblk.ota-extract.v1";
/// Schema of `ota apply --json` documents.
const APPLY_SCHEMA: &str = "snapblk.ota-apply.v1";

#[derive(Subcommand)]
pub enum OtaCmd {
    /// Show an OTA's payload: header, manifest settings (minor version, Virtual A/B), and per
    /// partition its size, hash, operation histogram and whether `ota extract` can write it.
    Info {
        /// The OTA: a zip with payload.bin, or a bare payload.bin; a path, or s3://BUCKET/KEY or
        /// an http(s) URL read by range (docs/remote.md).
        ota: PathBuf,
        /// Also check FILE_HASH of payload_properties.txt (reads the whole payload).
        #[arg(long)]
        verify_file_hash: bool,
        /// Check the payload's signatures (reads the whole payload) with this X.509 certificate or public key (PEM or
        /// DER, or a zip of them such as otacerts.zip; RSA 2048 to 4096 bits or ECDSA P-256).
        /// Repeatable: a signature set passes when one of its signatures verifies with one of
        /// the keys.
        #[arg(long = "key", value_name = "FILE")]
        keys: Vec<PathBuf>,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the partitions of a full OTA to DIR/<partition>.img, each checked against the
    /// payload's hashes before it appears under its name.
    Extract {
        /// The OTA: a zip with payload.bin, or a bare payload.bin; a path, or s3://BUCKET/KEY or
        /// an http(s) URL read by range (docs/remote.md).
        ota: PathBuf,
        /// Output directory (created if missing).
        #[arg(short = 'o', long = "output", value_name = "DIR")]
        out: PathBuf,
        /// Only these partitions (comma-separated names).
        #[arg(long, value_delimiter = ',', value_name = "A,B")]
        partitions: Vec<String>,
        /// Refuse the payload unless its signatures verify with this X.509 certificate or public key (PEM or
        /// DER, or a zip of them such as otacerts.zip; RSA 2048 to 4096 bits or ECDSA P-256).
        /// Repeatable: a signature set passes when one of its signatures verifies with one of
        /// the keys.
        #[arg(long = "key", value_name = "FILE")]
        keys: Vec<PathBuf>,
        /// Worker threads, 1..=256 (default: all cores).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
        threads: Option<u16>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Build the partitions of an incremental OTA from their old images: reads
    /// OLDDIR/<partition>.img, writes DIR/<partition>.img, each old image checked against the
    /// payload before anything is written and each new image against the payload's hashes
    /// before it appears under its name.
    Apply {
        /// The OTA: a zip with payload.bin, or a bare payload.bin; a path, or s3://BUCKET/KEY or
        /// an http(s) URL read by range (docs/remote.md).
        ota: PathBuf,
        /// Directory of the old images, OLDDIR/<partition>.img.
        #[arg(long, value_name = "OLDDIR")]
        source: PathBuf,
        /// Output directory (created if missing; never the source directory).
        #[arg(short = 'o', long = "output", value_name = "DIR")]
        out: PathBuf,
        /// Only these partitions (comma-separated names).
        #[arg(long, value_delimiter = ',', value_name = "A,B")]
        partitions: Vec<String>,
        /// Refuse the payload unless its signatures verify with this X.509 certificate or public key (PEM or
        /// DER, or a zip of them such as otacerts.zip; RSA 2048 to 4096 bits or ECDSA P-256).
        /// Repeatable: a signature set passes when one of its signatures verifies with one of
        /// the keys.
        #[arg(long = "key", value_name = "FILE")]
        keys: Vec<PathBuf>,
        /// Leave out the partitions this build cannot build (ZUCCHINI, LZ4DIFF or unknown
        /// operations) and build the rest.
        #[arg(long)]
        skip_unsupported: bool,
        /// Worker threads, 1..=256 (default: all cores).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
        threads: Option<u16>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the Virtual A/B COW files update_engine would write on a device:
    /// DIR/<partition>.cow (and its record) for every partition with a COW estimate, from the
    /// old images OLDDIR/<partition>.img; each COW checked against the size the payload
    /// reserves for it before it appears under its name.
    Cow(Box<cow::CowArgs>),
    /// Serve every partition the OTA updates over NBD (export names = partition names): those
    /// with a COW estimate as snapshots of their old image and the COW `ota cow` writes, the
    /// others built and served read-only; --merge merges the COWs while serving.
    Serve(Box<serve::ServeArgs>),
    /// Write an OTA payload from partition images: incremental with --source (SOURCE_COPY,
    /// ZERO, REPLACE, REPLACE_XZ, BROTLI_BSDIFF or SOURCE_BSDIFF; Virtual A/B merge
    /// operations and COW estimates), full without.
    Generate(crate::ota_gen::GenerateArgs),
}

pub fn run(c: OtaCmd) -> Result<()> {
    match c {
        OtaCmd::Info {
            ota,
            verify_file_hash,
            keys,
            json,
        } => verdict(json, INFO_SCHEMA, info(&ota, verify_file_hash, &keys, json)),
        OtaCmd::Extract {
            ota,
            out,
            partitions,
            keys,
            threads,
            json,
        } => {
            let r = extract(&ota, &out, &partitions, &keys, threads, json);
            verdict(json, EXTRACT_SCHEMA, r)
        }
        OtaCmd::Apply {
            ota,
            source,
            out,
            partitions,
            keys,
            skip_unsupported,
            threads,
            json,
        } => {
            let a = ApplyArgs {
                ota: &ota,
                source: &source,
                out: &out,
                partitions: &partitions,
                keys: &keys,
                skip_unsupported,
                threads,
                json,
            };
            verdict(json, APPLY_SCHEMA, apply(&a))
        }
        OtaCmd::Cow(a) => verdict(a.json(), cow::COW_SCHEMA, cow::run(&a)),
        OtaCmd::Serve(a) => serve::run(&a),
        OtaCmd::Generate(a) => crate::ota_gen::run(a),
    }
}

/// [`crate::out::json_verdict`], except for an error whose verdict document is already out.
fn verdict(json: bool, schema: &str, r: Result<()>) -> Result<()> {
    match &r {
        Err(e) if e.downcast_ref::<Reported>().is_some() => r,
        _ => crate::out::json_verdict(json, schema, r),
    }
}

/// An OTA from a local path, or from `s3://BUCKET/KEY` / `http(s)://…` read by ranged GETs
/// (the [`RemoteObject`] comes back for its counters: [`fetched`]).
fn open(path: &Path) -> Result<(Ota, Option<Arc<RemoteObject>>)> {
    if let Some(url) = path.to_str().filter(|s| snapblk_remote::is_remote(s)) {
        let obj = Arc::new(RemoteObject::open(url, &RemoteConfig::from_env()?)?);
        let ota = Ota::open_reader(obj.clone()).with_context(|| url.to_owned())?;
        return Ok((ota, Some(obj)));
    }
    let ota = Ota::open(path).with_context(|| format!("{}", path.display()))?;
    Ok((ota, None))
}

/// For a remote OTA, one line on stderr: how much of it was fetched.
fn fetched(remote: &Option<Arc<RemoteObject>>) -> Result<()> {
    if let Some(o) = remote {
        let s = o.stats();
        errln!(
            "{}: fetched {} of {} bytes ({} ranged GETs)",
            o.name(),
            s.bytes_fetched,
            o.len(),
            s.requests
        )?;
    }
    Ok(())
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

/// Whether the OTA's `payload_properties.txt` has a FILE_HASH.
fn has_file_hash(ota: &Ota) -> bool {
    ota.properties().is_some_and(|(p, _)| p.file_hash.is_some())
}

fn info(path: &Path, verify_file_hash: bool, key_files: &[PathBuf], json: bool) -> Result<()> {
    let keys = Keys::load(key_files)?;
    let (ota, remote) = open(path)?;
    // With keys, FILE_HASH comes from the same read as the signature check.
    let mut props = check_properties(&ota, verify_file_hash && keys.is_empty())?;
    let file = verify_file_hash && has_file_hash(&ota);
    let (sigs, digest) = ota_sig::check(&ota, &keys, file)?;
    if let (Some(r), Some(d), Some((p, _))) = (props.as_mut(), digest, ota.properties()) {
        r.file_hash = p.check_file_digest(&d)?;
    }
    let verdict = if keys.is_empty() {
        Ok(())
    } else {
        sigs.require_verified()
    };
    let s = ota.payload().summary();
    let origin = ota.properties().map(|(_, o)| o.clone());
    if json {
        let mut v = serde_json::to_value(&s)?;
        v["schema"] = INFO_SCHEMA.into();
        v["ok"] = verdict.is_ok().into();
        if let Err(e) = &verdict {
            v["error"] = snapblk_core::Chain(e).to_string().into();
        }
        v["container"] = serde_json::to_value(ota.container())?;
        v["properties"] = serde_json::json!({ "origin": origin, "checks": props });
        for (k, x) in ota_sig::json(&sigs, &keys)
            .as_object()
            .into_iter()
            .flatten()
        {
            v["signatures"][k] = x.clone();
        }
        say!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_info(&ota, &s, props.as_ref(), origin.as_ref(), (&sigs, &keys))?;
    }
    fetched(&remote)?;
    verdict.map_err(|e| Reported(e).into())
}

fn print_info(
    ota: &Ota,
    s: &Summary,
    props: Option<&PropertiesReport>,
    origin: Option<&PropertiesOrigin>,
    (sigs, keys): (&snapblk_ota::SignatureReport, &Keys),
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
    if sigs.is_signed() {
        let sig = &s.signatures;
        say!(
            "Metadata signature ({} bytes): {}",
            sig.metadata_signature_size,
            ota_sig::status_text(&sigs.metadata, keys)
        );
        say!(
            "Payload signature ({}): {}",
            sig.payload_signature
                .map_or("none".into(), |(o, n)| format!("{n} bytes at offset {o}")),
            ota_sig::status_text(&sigs.payload, keys)
        );
    } else {
        say!("Signatures: none (unsigned)");
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
        if s.kind == "incremental" {
            if p.applicable {
                say!("    apply: yes");
            } else if let Some(b) = &p.apply_blocker {
                say!("    apply: no ({})", blocker_text(b));
            } else if let Some(why) = p.name_problem {
                say!("    apply: no (partition name: {why})");
            } else if let Some(why) = p.verity.as_ref().and_then(|v| v.problem.as_ref()) {
                say!("    apply: no (verity: {why})");
            } else {
                say!("    apply: no (new_partition_info lacks a size or a SHA-256)");
            }
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

/// Why `apply` cannot build a partition, for `info` and the skip report.
fn blocker_text(b: &snapblk_ota::Blocker) -> String {
    match b {
        snapblk_ota::Blocker::Operation { index, op_type } => {
            format!("{op_type} at op {index} not supported")
        }
    }
}

/// Make `dir` a directory if it is not one yet; refuse a path that is something else.
fn output_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => bail!("-o {} is not a directory", dir.display()),
        Ok(_) => Ok(()),
        Err(_) => std::fs::create_dir_all(dir)
            .with_context(|| format!("create directory {}", dir.display())),
    }
}

/// Make `dir` a directory with mode 0700 (whatever the umask; parents too) if it is not one
/// yet, so no other user can list it or plant files or links in it; an existing directory is
/// used as it is; a path that is something else is refused.
fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => bail!("{} is not a directory", dir.display()),
        Ok(_) => Ok(()),
        Err(_) => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
            .with_context(|| format!("create directory {}", dir.display())),
    }
}

/// Runs a checked plan into its outputs.
type RunPlan<'a> =
    dyn Fn(&[&dyn Output], &ExtractOptions<'_>) -> snapblk_ota::Result<ExtractReport> + 'a;

/// The images a command writes.
struct Images<'a> {
    /// Output directory.
    dir: &'a Path,
    /// Partition names: DIR/<name>.img.
    names: Vec<&'a str>,
    /// Files no output may be (flag, path).
    inputs: Vec<(&'a str, &'a Path)>,
    /// What the progress events add up to: the bytes the operations write and those the
    /// dm-verity step processes (the progress bar's length).
    bytes: u64,
    /// Progress bar label.
    label: &'static str,
    /// `--threads`.
    threads: Option<u16>,
}

/// Write the images through `run`, named only after `run` and the FILE_HASH check (a reader
/// beside the workers, or `file_hash_done` when the signature check's read gave it) passed.
fn write_images(
    ota: &Ota,
    im: &Images<'_>,
    run: &RunPlan<'_>,
    file_hash_done: Option<Check>,
) -> Result<(ExtractReport, Option<Check>)> {
    let (dir, names, inputs, threads) = (im.dir, &im.names, &im.inputs, im.threads);
    output_dir(dir)?;
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let target = dir.join(format!("{name}.img"));
        refuse_alias("-o", &target, inputs)?;
        files.push((AtomicFile::create(&target)?, target));
    }
    let outputs: Vec<&dyn Output> = files.iter().map(|(f, _)| f.file() as &dyn Output).collect();
    let bar = Progress::bytes(im.bytes, im.label);
    let on = |e: ExtractProgress| {
        if let ExtractProgress::Advance { bytes } = e {
            bar.inc(bytes);
        }
    };
    let opts = ExtractOptions {
        threads: threads.map_or(0, usize::from),
        progress: Some(&on),
    };
    let payload = ota.payload();
    let (report, file_hash) = std::thread::scope(|s| {
        let h = s.spawn(|| match (file_hash_done, ota.properties()) {
            (Some(c), _) => Ok(Some(c)),
            (None, Some((p, _))) => p.check_file_hash(payload, &mut |_| {}).map(Some),
            (None, None) => Ok(None),
        });
        let r = run(&outputs, &opts);
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
    Ok((report, file_hash))
}

/// The OTA, the `payload_properties.txt` beside it and the `--key` files: inputs no output
/// may be.
fn ota_inputs(ota: &Ota, path: &Path, keys: &[PathBuf]) -> Vec<(&'static str, PathBuf)> {
    let mut inputs = vec![("OTA", path.to_path_buf())];
    if let Some((_, PropertiesOrigin::File { path: p })) = ota.properties() {
        inputs.push(("payload_properties.txt", p.clone()));
    }
    inputs.extend(keys.iter().map(|k| ("--key", k.clone())));
    inputs
}

fn with_file_hash(props: Option<PropertiesReport>, c: Option<Check>) -> Option<PropertiesReport> {
    props.map(|mut r| {
        if let Some(c) = c {
            r.file_hash = c;
        }
        r
    })
}

fn print_partitions(report: &ExtractReport) -> Result<()> {
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
            "{}.img: {}, {} ops{verity}, sha256 {} verified",
            p.name,
            crate::human::bytes_exact(p.size),
            p.ops,
            p.sha256
        );
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

/// The signature step of `extract` and `apply`, before anything is written: the report, and
/// FILE_HASH's check when the signature check's read of the whole payload gave it.
fn signatures(ota: &Ota, keys: &Keys) -> Result<(snapblk_ota::SignatureReport, Option<Check>)> {
    let (report, digest) = ota_sig::require(ota, keys, has_file_hash(ota))?;
    let file_hash = match (digest, ota.properties()) {
        (Some(d), Some((p, _))) => Some(p.check_file_digest(&d)?),
        _ => None,
    };
    Ok((report, file_hash))
}

fn extract(
    path: &Path,
    dir: &Path,
    partitions: &[String],
    key_files: &[PathBuf],
    threads: Option<u16>,
    json: bool,
) -> Result<()> {
    let keys = Keys::load(key_files)?;
    let (ota, remote) = open(path)?;
    let props = check_properties(&ota, false)?;
    let (sigs, file_hash) = signatures(&ota, &keys)?;
    let payload = ota.payload();
    let names = (!partitions.is_empty()).then_some(partitions);
    // Everything about the payload is checked before the output directory is touched.
    let plan = payload.plan_extract(names)?;
    let inputs = ota_inputs(&ota, path, key_files);
    let images = Images {
        dir,
        names: plan.partitions().iter().map(|p| p.name.as_str()).collect(),
        inputs: inputs.iter().map(|(f, p)| (*f, p.as_path())).collect(),
        bytes: plan.progress_bytes(),
        label: "extract",
        threads,
    };
    let (report, file_hash) =
        write_images(&ota, &images, &|outs, opts| plan.run(outs, opts), file_hash)?;
    let props = with_file_hash(props, file_hash);
    if json {
        let doc = serde_json::json!({
            "schema": EXTRACT_SCHEMA,
            "ok": true,
            "output_dir": dir,
            "threads": report.threads,
            "properties": props,
            "signatures": ota_sig::json(&sigs, &keys),
            "partitions": report.partitions,
        });
        say!("{}", serde_json::to_string_pretty(&doc)?);
        return fetched(&remote);
    }
    print_partitions(&report)?;
    fetched(&remote)?;
    say!(
        "{} written to {}",
        count(report.partitions.len(), "partition"),
        dir.display()
    );
    Ok(())
}

struct ApplyArgs<'a> {
    ota: &'a Path,
    source: &'a Path,
    out: &'a Path,
    partitions: &'a [String],
    keys: &'a [PathBuf],
    skip_unsupported: bool,
    threads: Option<u16>,
    json: bool,
}

fn apply(a: &ApplyArgs<'_>) -> Result<()> {
    let keys = Keys::load(a.keys)?;
    let (ota, remote) = open(a.ota)?;
    let props = check_properties(&ota, false)?;
    let (sigs, file_hash) = signatures(&ota, &keys)?;
    let payload = ota.payload();
    let names = (!a.partitions.is_empty()).then_some(a.partitions);
    let plan = payload.plan_apply(names, a.skip_unsupported)?;
    check_source_dir(a.source, a.out, "over")?;
    // The old images: every planned partition's that has one, opened read-only; a missing one
    // is an error only for a partition whose operations read it.
    let old_path = |name: &str| a.source.join(format!("{name}.img"));
    let mut olds = Vec::with_capacity(plan.partitions().len());
    for p in plan.partitions() {
        let Some(s) = &p.source else {
            olds.push(None);
            continue;
        };
        let path = old_path(&p.name);
        match std::fs::File::open(&path) {
            Ok(f) => olds.push(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !s.read => olds.push(None),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("partition {}: old image {}", p.name, path.display())
                });
            }
        }
    }
    let sources: Vec<Option<&(dyn ReadAt + Sync)>> = olds
        .iter()
        .map(|f| f.as_ref().map(|f| f as &(dyn ReadAt + Sync)))
        .collect();
    let bar = Progress::bytes(plan.source_hash_bytes(), "check old");
    let on = |n: u64| bar.inc(n);
    let threads = a.threads.map_or(0, usize::from);
    let checked = plan.check_sources(&sources, threads, Some(&on));
    bar.finish();
    let checked = checked?;
    // No output may be the OTA or any old image (hard links, symlinks).
    let mut inputs = ota_inputs(&ota, a.ota, a.keys);
    for p in &payload.manifest().partitions {
        if check_partition_name(&p.partition_name).is_ok() {
            inputs.push(("--source", old_path(&p.partition_name)));
        }
    }
    let images = Images {
        dir: a.out,
        names: plan.partitions().iter().map(|p| p.name.as_str()).collect(),
        inputs: inputs.iter().map(|(f, p)| (*f, p.as_path())).collect(),
        bytes: plan.progress_bytes(),
        label: "apply",
        threads: a.threads,
    };
    let run = |outs: &[&dyn Output], opts: &ExtractOptions<'_>| plan.run(&checked, outs, opts);
    let (report, file_hash) = write_images(&ota, &images, &run, file_hash)?;
    let props = with_file_hash(props, file_hash);
    if a.json {
        let doc = serde_json::json!({
            "schema": APPLY_SCHEMA,
            "ok": true,
            "source_dir": a.source,
            "output_dir": a.out,
            "threads": report.threads,
            "properties": props,
            "signatures": ota_sig::json(&sigs, &keys),
            "partitions": report.partitions,
            "skipped": plan.skipped(),
        });
        say!("{}", serde_json::to_string_pretty(&doc)?);
        return fetched(&remote);
    }
    print_partitions(&report)?;
    fetched(&remote)?;
    for s in plan.skipped() {
        say!(
            "skipped {}: {}",
            s.name.escape_debug(),
            blocker_text(&s.blocker)
        );
    }
    say!(
        "{} written to {}{}",
        count(report.partitions.len(), "partition"),
        a.out.display(),
        match plan.skipped().len() {
            0 => String::new(),
            n => format!(", {n} skipped"),
        }
    );
    Ok(())
}

/// `--source` is a directory of old images and `-o` is not that same directory (compared as
/// files, not paths); `beside` says how the refusal words the write (`over`, `beside`).
pub(super) fn check_source_dir(source: &Path, out: &Path, beside: &str) -> Result<()> {
    match std::fs::metadata(source) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("--source {} is not a directory", source.display()),
        Err(e) => return Err(e).with_context(|| format!("--source {}", source.display())),
    }
    if same_file(out, source) {
        bail!(
            "-o {} is the same directory as --source {}; refusing to write {beside} the old images",
            out.display(),
            source.display()
        );
    }
    Ok(())
}

/// `1 partition`, `2 partitions`: a count and its noun, singular for one.
pub(crate) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
