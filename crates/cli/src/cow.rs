//! `snapblk cow ...`: create, inspect, verify and apply Android COW files. Thin layer over
//! `snapblk-cow`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use snapblk_cow::record::{self, Record, RecordCheck};
use snapblk_cow::{
    Codec, Compression, CowReader, GenerateOptions, OpenOptions, ReadAt, WriterOptions,
    compute_ops, load_image, write_ops,
};

use crate::outfile::{AtomicFile, InPlace, refuse_alias, refuse_same, refuse_special};

/// Print a line to stdout; a write error (full disk, closed pipe) is the command's error
/// (`crate::out` turns a closed pipe into the quiet exit status 141).
macro_rules! say {
    ($($t:tt)*) => {{
        $crate::out::write($crate::out::Stream::Stdout, format_args!($($t)*), true)?;
    }};
}

/// Schema of `cow verify --json` documents (schemas/snapblk.cow-verify.v1.json, as the others).
const VERIFY_SCHEMA: &str = "snapblk.cow-verify.v1";
/// Schema of `cow create --json` documents.
const CREATE_SCHEMA: &str = "snapblk.cow-create.v1";
/// Schema of `cow apply --json` documents.
const APPLY_SCHEMA: &str = "snapblk.cow-apply.v1";
/// Schema of `cow inspect --json` documents.
const INSPECT_SCHEMA: &str = "snapblk.cow-inspect.v1";
/// Blocks named in a one-line message before "and N more".
const NAMED_BLOCKS: usize = 8;

/// Largest image (after sparse expansion) `create` loads into memory.
const MAX_IMAGE: u64 = 1 << 40;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Format {
    V2,
    V3,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Algo {
    None,
    Gz,
    Brotli,
    Lz4,
    Zstd,
}

impl From<Algo> for Compression {
    fn from(a: Algo) -> Self {
        match a {
            Algo::None => Compression::None,
            Algo::Gz => Compression::Gz,
            Algo::Brotli => Compression::Brotli,
            Algo::Lz4 => Compression::Lz4,
            Algo::Zstd => Compression::Zstd,
        }
    }
}

/// Where the COW record comes from.
#[derive(Args, Clone, Debug, Default)]
pub struct RecordArgs {
    /// The COW record to check against (default: COW.snapblk beside the COW, when present).
    #[arg(long, value_name = "FILE", conflicts_with = "no_record")]
    record: Option<PathBuf>,
    /// Ignore the COW record: the base and the result cannot be verified.
    #[arg(long)]
    no_record: bool,
    /// SHA-256 the whole base must have (as update_engine's old_partition_info.hash).
    #[arg(long, value_name = "HEX")]
    base_sha256: Option<String>,
    /// SHA-256 the whole new image must have (as update_engine's new_partition_info.hash).
    #[arg(long, value_name = "HEX")]
    expect_sha256: Option<String>,
}

#[derive(Subcommand)]
pub enum CowCmd {
    /// Create a COW from an old and a new image (raw or Android sparse), and its record
    /// (OUT.snapblk: digests of the base blocks it reads and of the image it produces).
    Create {
        /// The old image (the base the COW applies to): a path, or a device spec
        /// (`rbd:pool=p,image=i,...`) read through its driver.
        #[arg(long)]
        old: PathBuf,
        /// The new image (what the COW produces): a path or a device spec.
        #[arg(long)]
        new: PathBuf,
        /// The COW file to write (replaced atomically; never one of the inputs).
        #[arg(short = 'o', long = "output")]
        out: PathBuf,
        /// COW format: v3 (Android 13+, compression units, XOR ops) or v2 (Android 11/12).
        #[arg(long, value_enum, default_value = "v3")]
        format: Format,
        /// Payload compression codec.
        #[arg(long, value_enum, default_value = "lz4")]
        compression: Algo,
        /// Compression level for every payload (default: AOSP's — gz 9, brotli 11, zstd 3 —
        /// except that sparse payloads, at most 1/8 non-zero bytes like most XOR payloads, get
        /// gz 4 / zstd -1, which compress them as small and 2.4x faster).
        #[arg(long, allow_hyphen_values = true)]
        level: Option<i32>,
        /// Do not emit XOR ops.
        #[arg(long)]
        no_xor: bool,
        /// v3 compression unit in bytes (4096..262144, power of two).
        #[arg(long, default_value_t = 4096)]
        unit: u32,
        /// Do not reserve the 2 MiB scratch area (AOSP does so only for test devices). Blocks whose
        /// best XOR source includes the block itself become REPLACE ops: without scratch, no merge
        /// can apply such an XOR crash-safely.
        #[arg(long)]
        no_scratch: bool,
        /// Do not write sequence data (ops are still written in a safe merge order).
        #[arg(long)]
        no_sequence: bool,
        /// Do not write the record beside the COW (the base cannot be verified later).
        #[arg(long)]
        no_record: bool,
        /// Worker threads, 1..=256 (default: all cores).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
        threads: Option<u16>,
        /// Print statistics as JSON.
        #[arg(long)]
        json: bool,
        /// Benchmarking: after creating the COW, write it again from the computed op list with
        /// every payload encoded by the writer stage, and report that time
        /// (`seconds_writer_only`; the file is the same).
        #[arg(long)]
        time_writer: bool,
    },
    /// Show header, op counts by type and codec, sizes, the merge order and the record.
    Inspect {
        /// The COW file.
        cow: PathBuf,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
        /// Also list every op record.
        #[arg(long)]
        ops: bool,
    },
    /// Check structure, payloads, merge-order safety, the base and the result against the
    /// record, and optionally the result against an expected image.
    Verify {
        /// The COW file.
        cow: PathBuf,
        /// The base image the COW applies to: a path, or a device spec
        /// (`rbd:pool=p,image=i,...`) read through its driver.
        #[arg(long)]
        base: PathBuf,
        /// The image the result must equal, byte for byte.
        #[arg(long)]
        expect: Option<PathBuf>,
        /// Size of the new image in bytes, for a COW without a record whose image is larger
        /// than its base (default: the record's size, else the base's).
        #[arg(long, value_name = "BYTES")]
        size: Option<u64>,
        #[command(flatten)]
        rec: RecordArgs,
        /// Print a JSON verdict on stdout (also when verification fails).
        #[arg(long)]
        json: bool,
    },
    /// Write the record of an existing COW (one made by Android's tools, say) from the images
    /// it was made from, after checking that it turns OLD into NEW.
    Record {
        /// The COW file.
        cow: PathBuf,
        /// The old image (the base the COW applies to): a path, or a device spec
        /// (`rbd:pool=p,image=i,...`) read through its driver.
        #[arg(long)]
        old: PathBuf,
        /// The new image the COW must produce from OLD (a path or a device spec).
        #[arg(long)]
        new: PathBuf,
        /// Where to write the record (default: COW.snapblk; replaced atomically).
        #[arg(short = 'o', long = "output")]
        out: Option<PathBuf>,
    },
    /// Materialise the new image into a new file (the base is not modified).
    Apply {
        /// The COW file.
        cow: PathBuf,
        /// The base image the COW applies to (read only): a path, or a device spec
        /// (`rbd:pool=p,image=i,...`) read through its driver.
        #[arg(long)]
        base: PathBuf,
        /// The image to write (replaced atomically; never the base, the COW or its record). A
        /// device spec (`rbd:pool=p,image=i2,...`) is written in place through its driver and
        /// needs --in-place; an RBD image is resized to the image's size.
        #[arg(short = 'o', long = "output")]
        out: PathBuf,
        /// Size of the new image in bytes, for a COW without a record whose image is larger
        /// than its base (default: the record's size, else the base's).
        #[arg(long, value_name = "BYTES")]
        size: Option<u64>,
        /// Write an existing output in place instead of replacing it: a block device (at
        /// least the image's size, not in use), a regular file, or a stream (a FIFO,
        /// `/dev/stdout`). The whole result is checked first in a pass that writes nothing.
        #[arg(long)]
        in_place: bool,
        #[command(flatten)]
        rec: RecordArgs,
        /// Print the summary as JSON on stdout (also when applying fails); refused when the
        /// output is stdout itself.
        #[arg(long)]
        json: bool,
    },
}

fn open_cow(path: &Path, opts: OpenOptions) -> Result<CowReader<std::fs::File>> {
    let f = open_input(path, "COW")?;
    CowReader::open_with(f, opts).with_context(|| format!("{}: invalid COW", path.display()))
}

/// An image given by path (see [`load_image`]) or as a device spec (`rbd:pool=p,image=i`:
/// opened read-only through its driver and read into memory).
fn load_input_image(flag: &str, path: &Path) -> Result<snapblk_cow::Image> {
    let p = path.display();
    let Some(dev) = open_device_input(path)? else {
        // Open errors as such, not as an I/O error at offset 0 of the image.
        let m = std::fs::metadata(path).with_context(|| format!("{flag} {p}"))?;
        if m.is_dir() {
            bail!("{flag} {p} is a directory");
        }
        return load_image(path, MAX_IMAGE).with_context(|| format!("read {flag} {p}"));
    };
    let read = || -> Result<snapblk_cow::Image> {
        let len = dev.size()?;
        if len > MAX_IMAGE {
            bail!("{len} bytes is more than the {MAX_IMAGE} an image may have");
        }
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(len as usize)
            .map_err(|_| anyhow::anyhow!("cannot allocate {len} bytes"))?;
        v.resize(len as usize, 0);
        dev.read_exact_at(0, &mut v)?;
        Ok(snapblk_cow::Image::Owned(v))
    };
    read().with_context(|| format!("read {flag} {p}"))
}

/// The device of a device-spec argument, opened read-only (`None` for a path).
fn open_device_input(path: &Path) -> Result<Option<snapblk_snapshot::BlkioDev>> {
    let Some(s) = crate::merge::device_spec(path)? else {
        return Ok(None);
    };
    snapblk::open_child(&s.driver, &s.props, false)
        .and_then(snapblk_snapshot::BlkioDev::new)
        .map(Some)
        .with_context(|| format!("open {}", path.display()))
}

/// A base to read: a file ([`open_input`]) or a device spec ([`open_device_input`]).
fn open_base_input(path: &Path) -> Result<Box<dyn ReadAt + Send + Sync>> {
    Ok(match open_device_input(path)? {
        Some(d) => Box::new(d),
        None => Box::new(open_input(path, "base")?),
    })
}

/// Open an input read-only; a directory or an empty file is named as such.
fn open_input(path: &Path, what: &str) -> Result<std::fs::File> {
    let f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let m = f
        .metadata()
        .with_context(|| format!("stat {}", path.display()))?;
    if m.is_dir() {
        bail!("{what} {} is a directory", path.display());
    }
    if m.is_file() && m.len() == 0 {
        bail!("{what} {} is empty", path.display());
    }
    Ok(f)
}

pub(crate) fn parse_hex(flag: &str, v: &Option<String>) -> Result<Option<[u8; 32]>> {
    v.as_deref()
        .map(|s| {
            record::parse_sha256(s)
                .with_context(|| format!("{flag}: expected 64 hexadecimal digits, got {s:?}"))
        })
        .transpose()
}

/// The record to check against: `--record`, else the sidecar beside the COW if there is one.
/// A damaged or stale record is an error that names the record, never the COW.
fn load_record(
    cow_path: &Path,
    cow: &CowReader<std::fs::File>,
    a: &RecordArgs,
) -> Result<Option<(PathBuf, Record)>> {
    if a.no_record {
        return Ok(None);
    }
    let path = a
        .record
        .clone()
        .unwrap_or_else(|| record::sidecar_path(cow_path));
    let rec = match Record::load(&path) {
        Ok(Some(r)) => r,
        Ok(None) if a.record.is_some() => bail!("record {} does not exist", path.display()),
        Ok(None) => return Ok(None),
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "{} (remove it or pass --no-record to go on without checks)",
                path.display()
            )));
        }
    };
    rec.check_binding(cow)
        .with_context(|| format!("record {}", path.display()))?;
    Ok(Some((path, rec)))
}

/// `--base-sha256`: the whole base must have this digest.
fn check_base_sha(base: &dyn ReadAt, path: &Path, want: Option<[u8; 32]>) -> Result<()> {
    let Some(want) = want else {
        return Ok(());
    };
    let got = record::sha256_of(base).context("hashing the base")?;
    if got != want {
        bail!(
            "base {} has SHA-256 {}, not the --base-sha256 given",
            path.display(),
            record::hex(&got)
        );
    }
    Ok(())
}

/// Remove the record of the COW about to be replaced (and make that durable), so it never sits
/// beside a COW it does not describe.
fn remove_stale_record(rec_path: &Path) -> Result<()> {
    match std::fs::remove_file(rec_path) {
        Ok(()) => {
            let dir = match rec_path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
                _ => PathBuf::from("."),
            };
            std::fs::File::open(&dir)
                .and_then(|d| d.sync_all())
                .with_context(|| format!("sync directory {}", dir.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("remove the old record {}", rec_path.display())),
    }
}

/// Warn once that nothing vouches for the base.
fn warn_unverified(cow_path: &Path) {
    crate::out::errln_deferred(format_args!(
        "snapblk: warning: no record for {} ({} absent or --no-record): the base cannot be verified; give --base-sha256 to check it",
        cow_path.display(),
        record::sidecar_path(cow_path).display()
    ));
}

fn name_blocks(v: &[u64]) -> String {
    let mut s = v
        .iter()
        .take(NAMED_BLOCKS)
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if v.len() > NAMED_BLOCKS {
        s.push_str(&format!(" and {} more", v.len() - NAMED_BLOCKS));
    }
    s
}

/// Size of the new image and proof that the COW fits the base and that size, before anything
/// is written: sources inside the base, writes inside the image.
fn image_size(
    cow: &CowReader<std::fs::File>,
    base_path: &Path,
    base_len: u64,
    rec: Option<&Record>,
    size: Option<u64>,
) -> Result<u64> {
    let len = match (rec, size) {
        (Some(r), Some(s)) if r.target_size != s => bail!(
            "--size {s} contradicts the record, which says the new image is {} bytes",
            r.target_size
        ),
        (Some(r), _) => r.target_size,
        (None, Some(s)) => s,
        (None, None) => base_len,
    };
    if len > i64::MAX as u64 {
        bail!("--size {len} is larger than 2^63-1 bytes");
    }
    if let Some(r) = rec
        && r.base_size != base_len
    {
        bail!(
            "base {} is {base_len} bytes; this COW was made for a base of {} bytes (wrong base?)",
            base_path.display(),
            r.base_size
        );
    }
    let bs = u64::from(cow.block_size());
    let e = snapblk_cow::extent(cow);
    if e.source_end > base_len {
        bail!(
            "base {} is {base_len} bytes, too short for this COW: op {} reads up to byte {} (block {})",
            base_path.display(),
            e.source_op.unwrap_or(0),
            e.source_end,
            (e.source_end - 1) / bs
        );
    }
    if e.write_end_blocks > len.div_ceil(bs) {
        let need = e.write_end_blocks * bs;
        bail!(
            "op {} writes block {}, past the end of the {len}-byte new image; if the new image is larger than the base, give its size with --size (at least {need})",
            e.write_op.unwrap_or(0),
            e.write_end_blocks - 1
        );
    }
    Ok(len)
}

pub fn run(c: CowCmd) -> Result<()> {
    if let CowCmd::Create { json: true, .. } = &c {
        return crate::out::json_verdict(true, CREATE_SCHEMA, run_cmd(c));
    }
    if let CowCmd::Apply {
        json: true, out, ..
    } = &c
    {
        // Checked before anything could print a document into the image.
        if is_stdout(out) {
            bail!(
                "--json: the output {} is stdout, where the JSON would go",
                out.display()
            );
        }
        return crate::out::json_verdict(true, APPLY_SCHEMA, run_cmd(c));
    }
    run_cmd(c)
}

/// Refuse a --level outside the range of its algorithm before anything is written (the
/// library's check, [`Codec::checked`]).
fn check_level(algo: Compression, level: Option<i32>) -> Result<()> {
    Codec { algo, level }.checked().context("--level")?;
    Ok(())
}

fn run_cmd(c: CowCmd) -> Result<()> {
    match c {
        CowCmd::Create {
            old,
            new,
            out,
            format,
            compression,
            level,
            no_xor,
            unit,
            no_scratch,
            no_sequence,
            no_record,
            threads,
            json,
            time_writer,
        } => {
            let rec_path = record::sidecar_path(&out);
            check_level(compression.into(), level)?;
            refuse_alias("-o", &out, &[("--old", &old), ("--new", &new)])?;
            refuse_alias("-o", &rec_path, &[("--old", &old), ("--new", &new)])?;
            let t0 = std::time::Instant::now();
            let old_img = load_input_image("--old", &old)?;
            let new_img = load_input_image("--new", &new)?;
            if new_img.is_empty() {
                bail!(
                    "--new {} is empty: a COW makes a device of the new image's size",
                    new.display()
                );
            }
            let bars = crate::progress::GenerateBars::default();
            let on_progress = |ev| bars.on(ev);
            let opts = GenerateOptions {
                writer: WriterOptions {
                    version: match format {
                        Format::V2 => 2,
                        Format::V3 => 3,
                    },
                    codec: Codec {
                        algo: compression.into(),
                        level,
                    },
                    max_compression_size: unit,
                    scratch_size: if no_scratch {
                        0
                    } else {
                        snapblk_cow::DEFAULT_SCRATCH_SIZE
                    },
                    ..Default::default()
                },
                xor: !no_xor,
                sequence: !no_sequence,
                threads: threads.map_or(0, usize::from),
                progress: Some(&on_progress),
            };
            let out_file = AtomicFile::create(&out)?;
            let rec_file = if no_record {
                None
            } else {
                Some(AtomicFile::create(&rec_path)?)
            };
            let f = out_file.file();
            let t = std::time::Instant::now();
            let ops = compute_ops(&old_img, &new_img, &opts).context("create COW")?;
            let stats =
                write_ops(&old_img, &new_img, &ops, f, &opts, true).context("create COW")?;
            let secs = t.elapsed().as_secs_f64();
            let writer_only = if time_writer {
                // Start from an empty file again, as the first run did.
                f.set_len(0)
                    .with_context(|| format!("truncate {}", out.display()))?;
                let again = write_ops(&old_img, &new_img, &ops, f, &opts, false)
                    .context("create COW (writer timing run)")?;
                if again.cow_bytes != stats.cow_bytes {
                    bail!("internal: writer timing run wrote a different file size");
                }
                Some((again.seconds_write, again.cpu_seconds_write))
            } else {
                None
            };
            let mut rec_bytes = None;
            if let Some(rf) = rec_file {
                let t_rec = std::time::Instant::now();
                let reader = CowReader::open(f).context("reading back the new COW")?;
                let rec = Record::build(&reader, &old_img, &new_img);
                let bytes = rec.encode();
                use std::io::Write as _;
                rf.file()
                    .write_all(&bytes)
                    .with_context(|| format!("write {}", rec_path.display()))?;
                rec_bytes = Some((bytes.len(), t_rec.elapsed().as_secs_f64()));
                // An old record goes first, then the new COW, then its record: a crash between
                // the steps leaves a COW without a record (unverifiable, never misjudged).
                remove_stale_record(&rec_path)?;
                out_file.commit()?;
                rf.commit()?;
            } else {
                remove_stale_record(&rec_path)?;
                out_file.commit()?;
            }
            let total = t0.elapsed().as_secs_f64();
            if json {
                let mut v = serde_json::to_value(&stats)?;
                v["schema"] = CREATE_SCHEMA.into();
                v["seconds_generate"] = secs.into();
                if let Some((w, c)) = writer_only {
                    v["seconds_writer_only"] = w.into();
                    v["cpu_seconds_writer_only"] = c.into();
                }
                v["seconds_total"] = total.into();
                v["threads"] = opts.worker_threads().into();
                v["record"] = match rec_bytes {
                    Some((n, s)) => serde_json::json!({
                        "path": rec_path, "bytes": n, "seconds": s }),
                    None => serde_json::Value::Null,
                };
                say!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                say!(
                    "{}: {}; {} blocks: {} unchanged, {} copy, {} xor, {} zero, {} replace ({} ops), {} cycle breaks; {:.2} s",
                    out.display(),
                    crate::human::bytes_exact(stats.cow_bytes),
                    stats.new_blocks,
                    stats.unchanged,
                    stats.copy,
                    stats.xor,
                    stats.zero,
                    stats.replace_blocks,
                    stats.replace_ops,
                    stats.cycle_breaks,
                    secs
                );
                if let Some((n, _)) = rec_bytes {
                    say!(
                        "{}: {} (record)",
                        rec_path.display(),
                        crate::human::bytes(n as u64)
                    );
                }
            }
            Ok(())
        }
        CowCmd::Inspect { cow, json, ops } => {
            let r = inspect(&cow, json, ops);
            crate::out::json_verdict(json, INSPECT_SCHEMA, r)
        }
        CowCmd::Verify {
            cow,
            base,
            expect,
            size,
            rec,
            json,
        } => {
            let res = verify(&cow, &base, expect.as_deref(), size, &rec);
            if !json {
                let v = res.context("verify failed")?;
                let mut line = format!(
                    "OK: {} blocks, {} payloads decoded, merge order safe",
                    v.report.blocks, v.report.payloads_decoded
                );
                match &v.record {
                    Some(_) => line.push_str(&format!(
                        ", base matches the record ({} blocks read, SHA-256 of the whole base), result matches the record ({} blocks)",
                        v.check.base_blocks_checked, v.check.target_blocks_checked
                    )),
                    None => line.push_str(
                        "; no record: the base and the payload contents are NOT verified",
                    ),
                }
                if v.report.matches_expected == Some(true) {
                    line.push_str(", result equals the expected image");
                }
                say!("{line}");
                return Ok(());
            }
            let doc = match &res {
                Ok(v) => serde_json::json!({
                    "schema": VERIFY_SCHEMA, "ok": true, "error": null,
                    "record": v.record, "report": v.report, "check": v.check,
                }),
                Err(e) => {
                    let detail = e.downcast_ref::<VerifyFailure>();
                    serde_json::json!({
                        "schema": VERIFY_SCHEMA, "ok": false, "error": format!("{e:#}"),
                        "check": detail.map(|d| &d.check),
                    })
                }
            };
            say!("{}", serde_json::to_string_pretty(&doc)?);
            res.map(|_| ()).context("verify failed")
        }
        CowCmd::Apply {
            cow,
            base,
            out,
            size,
            in_place,
            rec,
            json,
        } => {
            let t = std::time::Instant::now();
            let done = apply(&cow, &base, &out, size, in_place, &rec)?;
            report_apply(&cow, &base, &out, &done, t.elapsed().as_secs_f64(), json)
        }
        CowCmd::Record { cow, old, new, out } => write_record(&cow, &old, &new, out),
    }
}

fn inspect(cow: &Path, json: bool, ops: bool) -> Result<()> {
    let r = open_cow(cow, OpenOptions::default())?;
    let s = snapblk_cow::summarize(&r);
    let rec_path = record::sidecar_path(cow);
    let rec = Record::load(&rec_path);
    let rec_state = match &rec {
        Ok(None) => "absent".to_owned(),
        Ok(Some(x)) => match x.check_binding(&r) {
            Ok(()) => "present".to_owned(),
            Err(e) => format!("stale: {}", snapblk_core::Chain(&e)),
        },
        Err(e) => snapblk_core::Chain(e).to_string(),
    };
    if json {
        let mut v = serde_json::to_value(&s)?;
        v["schema"] = INSPECT_SCHEMA.into();
        v["record"] = match &rec {
            Ok(Some(x)) => serde_json::json!({
                "path": rec_path, "state": rec_state,
                "base_size": x.base_size, "target_size": x.target_size,
                "base_sha256": record::hex(&x.base_sha256),
                "target_sha256": record::hex(&x.target_sha256),
                "base_blocks": record::blocks(&x.read).count(),
                "target_blocks": record::blocks(&x.write).count(),
            }),
            _ => serde_json::json!({ "path": rec_path, "state": rec_state }),
        };
        if ops {
            v["ops"] = serde_json::to_value(r.ops())?;
        }
        say!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let h = &s.header;
    say!(
        "Version: {}  header {}  block size {}",
        s.version,
        crate::human::bytes(h.header_size.into()),
        h.block_size
    );
    say!(
        "File: {}  compression {}",
        crate::human::bytes_exact(s.file_bytes),
        s.compression
    );
    match s.scratch_offset {
        Some(o) => say!(
            "Scratch: {} at offset {o}",
            crate::human::bytes(s.scratch_size)
        ),
        None => say!("Scratch: none"),
    }
    say!(
        "Merge progress: num_merge_ops = {} (u64 at offset {})",
        h.num_merge_ops,
        s.num_merge_ops_offset
    );
    if h.major >= 3 {
        let points = s
            .resume_points
            .iter()
            .map(|(l, n)| format!("{l}@{n}"))
            .collect::<Vec<_>>()
            .join(" ");
        say!(
            "v3: op_count {} / {}  sequence {}  resume points [{points}]  max unit {}",
            h.op_count,
            h.op_count_max,
            s.sequence_len,
            h.max_compression_size
        );
    } else {
        let labels = s
            .labels
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        let footer = match s.footer {
            Some(f) => format!("at offset {}, {} ops", f.offset, f.num_ops),
            None => "none".into(),
        };
        say!(
            "v2: cluster_ops {}  sequence {}  labels [{labels}]  footer {footer}",
            h.cluster_ops,
            s.sequence_len
        );
    }
    say!("Records: {}  data ops: {}", s.records, s.data_ops);
    for (t, st) in &s.by_type {
        say!(
            "  {t:8} {:>10} ops {:>10} blocks {:>12} of payloads",
            st.ops,
            st.blocks,
            crate::human::bytes(st.payload_bytes)
        );
    }
    for (t, n) in &s.op_counts {
        if !s.by_type.contains_key(t) {
            say!("  {t:8} {n:>10} records");
        }
    }
    for (c, n) in &s.payload_codecs {
        say!("  payloads decoded with {c}: {n}");
    }
    let first = s
        .merge
        .first
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    say!(
        "Merge order: {} ops ({}), ordered prefix {}, merged {}, first [{first}]",
        s.merge.total,
        s.merge.source,
        s.merge.ordered_prefix,
        s.merge.merged
    );
    match &s.merge.error {
        None => say!("Merge order: consistent"),
        Some(e) => say!("Merge order: INVALID: {e}"),
    }
    match &rec {
        Ok(Some(x)) => {
            say!("Record: {} ({rec_state})", rec_path.display());
            say!(
                "  base {}  sha256 {}",
                crate::human::bytes_exact(x.base_size),
                record::hex(&x.base_sha256)
            );
            say!(
                "  new  {}  sha256 {}",
                crate::human::bytes_exact(x.target_size),
                record::hex(&x.target_sha256)
            );
            say!(
                "  digests: {} base blocks read, {} new blocks written",
                x.read_digests.len(),
                x.write_digests.len()
            );
        }
        _ => say!("Record: {} ({rec_state})", rec_path.display()),
    }
    if ops {
        for op in r.ops() {
            say!("{op:?}");
        }
    }
    Ok(())
}

/// What `verify` found.
struct Verified {
    report: snapblk_cow::VerifyReport,
    record: Option<PathBuf>,
    check: RecordCheck,
}

/// A verification that found mismatching or corrupt blocks (carried in the error so the JSON
/// verdict can list them).
#[derive(Debug, thiserror::Error)]
#[error("{msg}")]
struct VerifyFailure {
    msg: String,
    check: RecordCheck,
}

fn record_failure(rec_path: &Path, base: &Path, check: RecordCheck) -> anyhow::Error {
    let msg = if !check.base_mismatches.is_empty() {
        format!(
            "base {} is not the image this COW was made for: {} of the {} blocks it reads differ from the record {} (blocks {})",
            base.display(),
            check.base_mismatches.len(),
            check.base_blocks_checked,
            rec_path.display(),
            name_blocks(&check.base_mismatches)
        )
    } else {
        format!(
            "the COW is corrupt: {} of the {} blocks it produces differ from the record {} (blocks {})",
            check.corrupt_blocks.len(),
            check.target_blocks_checked,
            rec_path.display(),
            name_blocks(&check.corrupt_blocks)
        )
    };
    VerifyFailure { msg, check }.into()
}

fn verify(
    cow_path: &Path,
    base_path: &Path,
    expect: Option<&Path>,
    size: Option<u64>,
    ra: &RecordArgs,
) -> Result<Verified> {
    let base_sha = parse_hex("--base-sha256", &ra.base_sha256)?;
    let expect_sha = parse_hex("--expect-sha256", &ra.expect_sha256)?;
    let base_f = open_base_input(base_path)?;
    let r = open_cow(cow_path, OpenOptions::default())?;
    let rec = load_record(cow_path, &r, ra)?;
    if rec.is_none() && base_sha.is_none() {
        warn_unverified(cow_path);
    }
    let base_len = base_f.size()?;
    let len = image_size(&r, base_path, base_len, rec.as_ref().map(|x| &x.1), size)?;
    let exp = expect
        .map(|p| open_input(p, "expected image"))
        .transpose()?;
    check_base_sha(&base_f, base_path, base_sha)?;
    let mut check = RecordCheck::default();
    if let Some((rp, x)) = &rec {
        record::check_base(x, &base_f, &mut check)?;
        if !check.base_mismatches.is_empty() {
            return Err(record_failure(rp, base_path, check));
        }
        let got = record::sha256_of(&base_f).context("hashing the base")?;
        if got != x.base_sha256 {
            bail!(
                "base {} is not the image this COW was made for: the blocks it reads match, but its SHA-256 {} differs from the record's {}",
                base_path.display(),
                record::hex(&got),
                record::hex(&x.base_sha256)
            );
        }
    }
    let report = snapblk_cow::verify(&r, &base_f, len, exp.as_ref())?;
    if let Some((rp, x)) = &rec {
        record::check_target(x, &r, &base_f, &mut check);
        if !check.corrupt_blocks.is_empty() {
            return Err(record_failure(rp, base_path, check));
        }
    }
    let want_target = expect_sha.or(rec.as_ref().map(|x| x.1.target_sha256));
    if let Some(want) = want_target {
        let mut h = record::Sha256Stream::default();
        snapblk_cow::apply(&r, &base_f, len, &mut HashWriter(&mut h), &|_| {})?;
        let got = h.finish();
        if got != want {
            bail!(
                "the result has SHA-256 {}, not the expected {}",
                record::hex(&got),
                record::hex(&want)
            );
        }
    }
    Ok(Verified {
        report,
        record: rec.map(|x| x.0),
        check,
    })
}

/// An `io::Write` that only hashes.
struct HashWriter<'a>(&'a mut record::Sha256Stream);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.update(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes the new image to the output while hashing it and checking every block the COW
/// produces against the record.
struct CheckedWriter<'a, W> {
    inner: W,
    hash: record::Sha256Stream,
    index: Option<record::RecordIndex<'a>>,
    block_size: usize,
    pos: u64,
    corrupt: Vec<u64>,
}

impl<W: std::io::Write> std::io::Write for CheckedWriter<'_, W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        // snapblk_cow::apply writes whole 1 MiB chunks (block multiples except maybe the last).
        if let Some(ix) = &self.index {
            let bs = self.block_size;
            for (k, chunk) in b.chunks(bs).enumerate() {
                let blk = self.pos / bs as u64 + k as u64;
                if let Some(want) = ix.target_digest(blk) {
                    let d = if chunk.len() == bs {
                        record::block_digest(chunk)
                    } else {
                        let mut pad = chunk.to_vec();
                        pad.resize(bs, 0);
                        record::block_digest(&pad)
                    };
                    if d != want {
                        self.corrupt.push(blk);
                    }
                }
            }
        }
        self.hash.update(b);
        self.inner.write_all(b)?;
        self.pos += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn apply(
    cow_path: &Path,
    base_path: &Path,
    out: &Path,
    size: Option<u64>,
    in_place: bool,
    ra: &RecordArgs,
) -> Result<Applied> {
    let base_sha = parse_hex("--base-sha256", &ra.base_sha256)?;
    let expect_sha = parse_hex("--expect-sha256", &ra.expect_sha256)?;
    let rec_path = ra
        .record
        .clone()
        .unwrap_or_else(|| record::sidecar_path(cow_path));
    let base_spec = crate::merge::device_spec(base_path)?;
    let out_spec = crate::merge::device_spec(out)?;
    crate::devout::refuse_alias(
        "-o",
        out,
        out_spec.as_ref(),
        &[
            ("--base", base_path, base_spec.as_ref()),
            ("the COW", cow_path, None),
            ("the record", &rec_path, None),
        ],
    )?;
    if out_spec.is_some() && !in_place {
        bail!(
            "-o {} is a device, which cannot be replaced atomically: give --in-place to write it in place",
            out.display()
        );
    }
    if !in_place {
        refuse_special(out, "--in-place")?;
    }
    if base_spec.is_none() {
        refuse_same(("--base", base_path), ("the COW", cow_path))?;
    }
    let r = open_cow(cow_path, OpenOptions::default())?;
    let base_f = open_base_input(base_path)?;
    let base_f: &dyn ReadAt = &*base_f;
    let rec = load_record(cow_path, &r, ra)?;
    if rec.is_none() && base_sha.is_none() {
        warn_unverified(cow_path);
    }
    let base_len = base_f.size()?;
    let len = image_size(&r, base_path, base_len, rec.as_ref().map(|x| &x.1), size)?;
    check_base_sha(base_f, base_path, base_sha)?;
    if let Some((rp, x)) = &rec {
        let mut check = RecordCheck::default();
        record::check_base(x, base_f, &mut check)?;
        if !check.base_mismatches.is_empty() {
            return Err(record_failure(rp, base_path, check));
        }
    }
    let job = ApplyJob {
        r: &r,
        base_f,
        base_path,
        len,
        rec: rec.as_ref().map(|(rp, x)| (rp.as_path(), x)),
        expect_sha,
        out,
    };
    if !in_place {
        let target = AtomicFile::create(out)?;
        let f = target
            .file()
            .try_clone()
            .with_context(|| format!("create {}", out.display()))?;
        let sha256 = job.pass(f, Pass::Atomic)?;
        target.commit()?;
        return Ok(Applied::new(&job, sha256, false));
    }
    // In place, the output cannot be put back: prove the whole result first (every payload
    // decodes, every block matches the record, the digest matches), then write it.
    if let Some(spec) = &out_spec {
        return apply_to_device(&job, spec);
    }
    // A block-device base is claimed exclusively before a block-device output is: the kernel
    // then refuses the pair when one holds the other (a partition and its disk, a device-mapper
    // device and its members).
    let _claim = claim_block_input(base_path, out)?;
    let target = InPlace::open(out, len)?;
    let proven = job.pass(std::io::sink(), Pass::Check)?;
    target.reserve(len)?;
    let f = target
        .file()
        .try_clone()
        .with_context(|| format!("open {}", out.display()))?;
    let written = job.pass(f, Pass::InPlace)?;
    if written != proven {
        bail!(
            "{} was written with an image (SHA-256 {}) other than the one checked before (SHA-256 {}): an input changed in between",
            out.display(),
            record::hex(&written),
            record::hex(&proven)
        );
    }
    target.finish(len)?;
    Ok(Applied::new(&job, written, true))
}

/// `cow apply --in-place` into a device spec's device (an RBD image): opened read-write (its
/// driver's lock), the result proven in a pass that writes nothing, the device grown to the
/// image's size if smaller, written through the driver, flushed, and shrunk to the image's size
/// where the driver can resize.
fn apply_to_device(job: &ApplyJob<'_>, spec: &snapblk::Spec) -> Result<Applied> {
    let out = job.out;
    let dev = crate::devout::open(out, spec)?;
    let proven = job.pass(std::io::sink(), Pass::Check)?;
    crate::devout::grow_to(&dev, out, job.len)?;
    let written = job.pass(crate::devout::DevWriter::new(&dev), Pass::InPlace)?;
    if written != proven {
        bail!(
            "{} was written with an image (SHA-256 {}) other than the one checked before (SHA-256 {}): an input changed in between",
            out.display(),
            record::hex(&written),
            record::hex(&proven)
        );
    }
    crate::devout::fit(&dev, out, job.len)?;
    Ok(Applied::new(job, written, true))
}

/// What `cow apply` wrote, for its summary.
struct Applied {
    len: u64,
    sha256: [u8; 32],
    record: Option<PathBuf>,
    expect_sha256: bool,
    in_place: bool,
}

impl Applied {
    fn new(job: &ApplyJob<'_>, sha256: [u8; 32], in_place: bool) -> Applied {
        Applied {
            len: job.len,
            sha256,
            record: job.rec.map(|(p, _)| p.to_path_buf()),
            expect_sha256: job.expect_sha.is_some(),
            in_place,
        }
    }
}

/// Whether `p` is the file stdout writes to (`/dev/stdout`, a redirection to it, its pipe).
fn is_stdout(p: &Path) -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(p) else {
        return false;
    };
    let Ok(fd) = std::io::stdout().as_fd().try_clone_to_owned() else {
        return false;
    };
    std::fs::File::from(fd)
        .metadata()
        .is_ok_and(|o| (o.dev(), o.ino()) == (m.dev(), m.ino()))
}

/// The summary of `cow apply`: JSON, or a line on stdout (stderr when the image went there).
fn report_apply(
    cow: &Path,
    base: &Path,
    out: &Path,
    a: &Applied,
    secs: f64,
    json: bool,
) -> Result<()> {
    if json {
        let doc = serde_json::json!({
            "schema": APPLY_SCHEMA, "ok": true, "error": null,
            "cow": cow, "base": base, "output": out,
            "size": a.len,
            "sha256": record::hex(&a.sha256),
            "record": a.record,
            "expect_sha256": a.expect_sha256,
            "in_place": a.in_place,
            "seconds": secs,
        });
        say!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let checked = match (&a.record, a.expect_sha256) {
        (Some(r), true) => format!("the record {} and --expect-sha256", r.display()),
        (Some(r), false) => format!("the record {}", r.display()),
        (None, true) => "--expect-sha256".to_owned(),
        (None, false) => "nothing (no record, no --expect-sha256)".to_owned(),
    };
    let line = format!(
        "{}: {}{} in {secs:.2} s ({}), SHA-256 {}, checked against {checked}",
        out.display(),
        crate::human::bytes_exact(a.len),
        if a.in_place { " written in place" } else { "" },
        crate::human::rate(a.len, secs),
        record::hex(&a.sha256),
    );
    if is_stdout(out) {
        crate::out::write(crate::out::Stream::Stderr, format_args!("{line}"), true)?;
    } else {
        say!("{line}");
    }
    Ok(())
}

/// When both the base and the in-place output are block devices, open the base with `O_EXCL`
/// (held until the write is done).
fn claim_block_input(base: &Path, out: &Path) -> Result<Option<std::fs::File>> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let is_block = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device());
    if !(is_block(base) && is_block(out)) {
        return Ok(None);
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(base)
        .map(Some)
        .map_err(|e| {
            let busy = e.raw_os_error() == Some(libc::EBUSY);
            anyhow::Error::new(e).context(if busy {
                format!(
                    "base {} is in use (mounted or held open exclusively)",
                    base.display()
                )
            } else {
                format!("open {}", base.display())
            })
        })
}

/// A pass of `cow apply`: into a new file, a check that writes nothing, or into the output in
/// place.
#[derive(Clone, Copy, PartialEq)]
enum Pass {
    Atomic,
    Check,
    InPlace,
}

/// What one pass of `cow apply` needs.
struct ApplyJob<'a> {
    r: &'a CowReader<std::fs::File>,
    base_f: &'a dyn ReadAt,
    base_path: &'a Path,
    len: u64,
    rec: Option<(&'a Path, &'a Record)>,
    expect_sha: Option<[u8; 32]>,
    out: &'a Path,
}

impl ApplyJob<'_> {
    /// The new image written to `dst` while it is hashed and checked against the record; an
    /// error when a block or the whole image is not what was expected.
    fn pass<W: std::io::Write>(&self, dst: W, pass: Pass) -> Result<[u8; 32]> {
        let ApplyJob {
            r,
            base_f,
            base_path,
            len,
            rec,
            expect_sha,
            out,
        } = *self;
        let mut w = CheckedWriter {
            inner: std::io::BufWriter::with_capacity(4 << 20, dst),
            hash: record::Sha256Stream::default(),
            index: rec.map(|x| x.1.index()),
            block_size: r.block_size() as usize,
            pos: 0,
            corrupt: Vec::new(),
        };
        let (label, left) = match pass {
            Pass::Atomic => ("applying", "left unchanged"),
            Pass::Check => ("checking", "left unchanged"),
            // Only if the inputs changed after the check pass.
            Pass::InPlace => (
                "writing",
                "holds a partial result (an input changed while it was written)",
            ),
        };
        let pb = crate::progress::Progress::bytes(len, label);
        snapblk_cow::apply(r, base_f, len, &mut w, &|n| pb.inc(n))
            .with_context(|| format!("writing {}", out.display()))?;
        pb.finish();
        use std::io::Write as _;
        w.flush()
            .with_context(|| format!("writing {}", out.display()))?;
        if let Some((rp, x)) = rec
            && !w.corrupt.is_empty()
        {
            let check = RecordCheck {
                target_blocks_checked: record::blocks(&x.write[..]).count() as u64,
                corrupt_blocks: std::mem::take(&mut w.corrupt),
                ..Default::default()
            };
            return Err(
                record_failure(rp, base_path, check).context(format!("{} {left}", out.display()))
            );
        }
        let got = w.hash.clone().finish();
        let want = expect_sha.or(rec.map(|x| x.1.target_sha256));
        if let Some(want) = want
            && got != want
        {
            bail!(
                "the result has SHA-256 {}, not the expected {}; {} {left}",
                record::hex(&got),
                record::hex(&want),
                out.display()
            );
        }
        Ok(got)
    }
}

fn write_record(cow_path: &Path, old: &Path, new: &Path, out: Option<PathBuf>) -> Result<()> {
    let out = out.unwrap_or_else(|| record::sidecar_path(cow_path));
    refuse_alias(
        "-o",
        &out,
        &[("the COW", cow_path), ("--old", old), ("--new", new)],
    )?;
    let r = open_cow(cow_path, OpenOptions::default())?;
    let old_img = load_input_image("--old", old)?;
    let new_img = load_input_image("--new", new)?;
    let base_len = old_img.len() as u64;
    let len = image_size(&r, old, base_len, None, Some(new_img.len() as u64))?;
    snapblk_cow::verify(&r, &old_img[..], len, Some(&new_img[..])).with_context(|| {
        format!(
            "{} does not turn {} into {}",
            cow_path.display(),
            old.display(),
            new.display()
        )
    })?;
    let rec = Record::build(&r, &old_img, &new_img);
    let f = AtomicFile::create(&out)?;
    use std::io::Write as _;
    f.file()
        .write_all(&rec.encode())
        .with_context(|| format!("write {}", out.display()))?;
    f.commit()?;
    say!(
        "{}: record of {} base blocks read and {} new blocks written",
        out.display(),
        rec.read_digests.len(),
        rec.write_digests.len()
    );
    Ok(())
}
