//! `snapblk ota generate`: write a full or incremental OTA payload from partition images
//! (thin layer over `snapblk_ota::generate`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use snapblk_ota::{
    BsdiffFormat, GenerateOptions, PartitionImages, SigningKey, VabcOptions, generate,
};

use crate::outfile::{AtomicFile, refuse_alias, refuse_same};

/// Print a line to stdout; a write error (a closed pipe) is the command's error.
macro_rules! say {
    ($($t:tt)*) => {{
        $crate::out::write($crate::out::Stream::Stdout, format_args!($($t)*), true)?;
    }};
}

/// Schema of `ota generate --json` documents.
const GENERATE_SCHEMA: &str = "snapblk.ota-generate.v1";

/// `--bsdiff-format`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BsdiffArg {
    /// BROTLI_BSDIFF operations with BSDF2 patches (brotli streams).
    Bsdf2,
    /// SOURCE_BSDIFF operations with BSDIFF40 patches (bzip2 streams), which older readers
    /// (PyPI payload-dumper with bsdiff4) apply.
    Bsdiff40,
}

#[derive(Args)]
pub struct GenerateArgs {
    /// The old image, or a directory of old images OLDDIR/<partition>.img (omit for a full
    /// payload).
    #[arg(long, value_name = "OLD")]
    source: Option<PathBuf>,
    /// The new image, or a directory of new images NEWDIR/<partition>.img (every one is
    /// written).
    #[arg(long, value_name = "NEW")]
    target: PathBuf,
    /// The payload to write (appears only when complete).
    #[arg(short = 'o', long = "output", value_name = "PAYLOAD")]
    out: PathBuf,
    /// Partition name when --target is one image (default: its file name without `.img`).
    #[arg(long, value_name = "NAME")]
    partition: Option<String>,
    /// How bsdiff operations are written.
    #[arg(long, value_enum, default_value = "bsdf2")]
    bsdiff_format: BsdiffArg,
    /// The manifest's minor version (default: 0 full, 8 incremental; 4..=9).
    #[arg(long)]
    minor_version: Option<u32>,
    /// No Virtual A/B metadata, merge operations or COW estimates.
    #[arg(long, conflicts_with_all = ["vabc_compression", "cow_version", "compression_factor", "no_xor"])]
    no_vabc: bool,
    /// Virtual A/B compression (vabc_compression_param): none, gz, brotli, lz4, zstd, with an
    /// optional `,LEVEL`.
    #[arg(long, default_value = "lz4", value_name = "ALGO[,LEVEL]")]
    vabc_compression: String,
    /// COW version the device writes (2 or 3).
    #[arg(long, default_value_t = 3)]
    cow_version: u32,
    /// v3 compression factor in bytes (power of two, 4096..=262144).
    #[arg(long, default_value_t = 65536)]
    compression_factor: u64,
    /// No COW_XOR merge operations.
    #[arg(long)]
    no_xor: bool,
    /// Sign with this private key (RSA 2048..4096 bits or ECDSA P-256; PEM or DER, PKCS#8,
    /// PKCS#1 or SEC1). Repeatable: one signature per key.
    #[arg(long = "key", value_name = "FILE")]
    keys: Vec<PathBuf>,
    /// Worker threads, 1..=256 (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: Option<u16>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// (name, old image path, new image path) of every partition.
type Sources = Vec<(String, Option<PathBuf>, PathBuf)>;

fn partitions(a: &GenerateArgs) -> Result<Sources> {
    let tmeta =
        std::fs::metadata(&a.target).with_context(|| format!("--target {}", a.target.display()))?;
    if let Some(s) = &a.source {
        let smeta = std::fs::metadata(s).with_context(|| format!("--source {}", s.display()))?;
        if smeta.is_dir() != tmeta.is_dir() {
            bail!("--source and --target must both be images or both be directories");
        }
        refuse_same(("--source", s), ("--target", &a.target))?;
    }
    if !tmeta.is_dir() {
        let name = match &a.partition {
            Some(n) => n.clone(),
            None => a
                .target
                .file_name()
                .and_then(|n| n.to_str())
                .map(|n| n.strip_suffix(".img").unwrap_or(n).to_string())
                .context("--target has no file name to name the partition; give --partition")?,
        };
        return Ok(vec![(name, a.source.clone(), a.target.clone())]);
    }
    if a.partition.is_some() {
        bail!("--partition names the partition of one image; --target is a directory");
    }
    let mut v = Vec::new();
    for e in std::fs::read_dir(&a.target)
        .with_context(|| format!("reading --target {}", a.target.display()))?
    {
        let e = e.with_context(|| format!("reading --target {}", a.target.display()))?;
        let f = e.file_name();
        let Some(name) = f.to_str().and_then(|n| n.strip_suffix(".img")) else {
            continue;
        };
        let old = a.source.as_ref().map(|s| s.join(format!("{name}.img")));
        let old = old.filter(|p| p.exists());
        v.push((name.to_string(), old, e.path()));
    }
    if v.is_empty() {
        bail!("--target {} holds no <partition>.img", a.target.display());
    }
    v.sort();
    Ok(v)
}

fn read(flag: &str, p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("reading {flag} {}", p.display()))
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let json = a.json;
    crate::out::json_verdict(json, GENERATE_SCHEMA, generate_cmd(&a))
}

fn generate_cmd(a: &GenerateArgs) -> Result<()> {
    let parts = partitions(a)?;
    let mut inputs: Vec<(&str, &Path)> = vec![("--target", &a.target)];
    for (_, old, new) in &parts {
        inputs.push(("--target", new));
        if let Some(o) = old {
            inputs.push(("--source", o));
        }
    }
    if let Some(s) = &a.source {
        inputs.push(("--source", s));
    }
    for k in &a.keys {
        inputs.push(("--key", k));
    }
    refuse_alias("-o", &a.out, &inputs)?;
    if a.out.is_dir() {
        bail!(
            "-o {} is a directory; name the payload file",
            a.out.display()
        );
    }
    let keys = a
        .keys
        .iter()
        .map(|k| {
            SigningKey::parse(&read("--key", k)?).with_context(|| format!("--key {}", k.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut images = Vec::new();
    for (name, old, new) in &parts {
        let o = old.as_ref().map(|p| read("--source", p)).transpose()?;
        images.push((name.as_str(), o, read("--target", new)?));
    }
    let opts = GenerateOptions {
        bsdiff_format: match a.bsdiff_format {
            BsdiffArg::Bsdf2 => BsdiffFormat::Bsdf2,
            BsdiffArg::Bsdiff40 => BsdiffFormat::Bsdiff40,
        },
        minor_version: a.minor_version,
        vabc: (!a.no_vabc).then(|| VabcOptions {
            compression: a.vabc_compression.clone(),
            cow_version: a.cow_version,
            compression_factor: a.compression_factor,
            xor: !a.no_xor,
            ..VabcOptions::default()
        }),
        threads: a.threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            usize::from,
        ),
    };
    let refs: Vec<PartitionImages<'_>> = images
        .iter()
        .map(|(n, o, new)| PartitionImages {
            name: n,
            old: o.as_deref(),
            new,
        })
        .collect();
    let g = generate(&refs, &opts)?;
    let bytes = if keys.is_empty() {
        g.to_bytes()
    } else {
        g.signed(&keys)?
    };
    let f = AtomicFile::create(&a.out)?;
    f.file()
        .write_all(&bytes)
        .with_context(|| format!("writing {}", a.out.display()))?;
    f.commit()?;
    let minor = g.manifest.minor_version.unwrap_or(0);
    if a.json {
        let doc = serde_json::json!({
            "schema": GENERATE_SCHEMA, "ok": true,
            "payload": a.out.display().to_string(), "size": bytes.len(),
            "minor_version": minor, "signed": !keys.is_empty(), "partitions": g.stats,
        });
        say!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let kind = if minor == 0 { "full" } else { "incremental" };
    say!(
        "{}: {kind} payload, minor version {minor}, {}{}",
        a.out.display(),
        crate::human::bytes_exact(bytes.len() as u64),
        if keys.is_empty() {
            ", unsigned"
        } else {
            ", signed"
        }
    );
    for s in &g.stats {
        let ops: Vec<String> = s.ops.iter().map(|(t, n)| format!("{t} {n}")).collect();
        let mut line = format!(
            "  {}: {}; data {}",
            s.name,
            ops.join(", "),
            crate::human::bytes_exact(s.data_bytes)
        );
        if let Some(e) = s.estimate_cow_size {
            line += &format!(
                "; merge ops: {} COW_COPY, {} COW_XOR, {} dropped in cycles; COW estimate {}",
                s.cow_copy,
                s.cow_xor,
                s.dropped,
                crate::human::bytes_exact(e)
            );
        }
        say!("{line}");
    }
    Ok(())
}
