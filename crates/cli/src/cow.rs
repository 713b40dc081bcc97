//! `snapblk cow ...`: create, inspect, verify and apply Android COW files. Thin layer over
//! `snapblk-cow`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Subcommand, ValueEnum};
use snapblk_cow::generate::{GenerateOptions, compute_ops, write_ops};
use snapblk_cow::tools::{self, load_image, progress_bar};
use snapblk_cow::{Codec, Compression, CowReader, OpenOptions, ReadAt, WriterOptions};

/// Print a line to stdout; a closed pipe (e.g. `| head`) is not an error worth a panic.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

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

#[derive(Subcommand)]
pub enum CowCmd {
    /// Create a COW from an old and a new image (raw or Android sparse).
    Create {
        #[arg(long)]
        old: PathBuf,
        #[arg(long)]
        new: PathBuf,
        #[arg(short = 'o', long = "output")]
        out: PathBuf,
        #[arg(long, value_enum, default_value = "v3")]
        format: Format,
        #[arg(long, value_enum, default_value = "lz4")]
        compression: Algo,
        /// Compression level for every payload (default: AOSP's — gz 9, brotli 11, zstd 3 —
        /// except that sparse payloads, at most 1/8 non-zero bytes like most XOR payloads, get
        /// gz 4 / zstd -1, which compress them as small and 2.4x faster).
        #[arg(long)]
        level: Option<i32>,
        /// Do not emit XOR ops.
        #[arg(long)]
        no_xor: bool,
        /// v3 compression unit in bytes (4096..262144, power of two).
        #[arg(long, default_value_t = 4096)]
        unit: u32,
        /// Do not reserve the 2 MiB scratch area (AOSP does so only for test devices).
        #[arg(long)]
        no_scratch: bool,
        /// Do not write sequence data (ops are still written in a safe merge order).
        #[arg(long)]
        no_sequence: bool,
        /// Worker threads (default: all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Print statistics as JSON.
        #[arg(long)]
        json: bool,
        /// Benchmarking: after creating the COW, write it again from the computed op list with
        /// every payload encoded by the writer stage, and report that time
        /// (`seconds_writer_only`; the file is the same).
        #[arg(long)]
        time_writer: bool,
    },
    /// Show header, op counts by type and codec, sizes and the merge order.
    Inspect {
        cow: PathBuf,
        #[arg(long)]
        json: bool,
        /// Also list every op record.
        #[arg(long)]
        ops: bool,
    },
    /// Check structure, payloads, merge-order safety and optionally the result.
    Verify {
        cow: PathBuf,
        #[arg(long)]
        base: PathBuf,
        #[arg(long)]
        expect: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Materialise the new image (the base is not modified).
    Apply {
        cow: PathBuf,
        #[arg(long)]
        base: PathBuf,
        #[arg(short = 'o', long = "output")]
        out: PathBuf,
    },
}

fn open_cow(path: &PathBuf, opts: OpenOptions) -> Result<CowReader<std::fs::File>> {
    let f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    CowReader::open_with(f, opts).with_context(|| format!("{}: invalid COW", path.display()))
}

fn open_file(path: &PathBuf) -> Result<std::fs::File> {
    std::fs::File::open(path).with_context(|| format!("open {}", path.display()))
}

pub fn run(c: CowCmd) -> Result<()> {
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
            threads,
            json,
            time_writer,
        } => {
            let t0 = std::time::Instant::now();
            let old_img =
                load_image(&old, MAX_IMAGE).with_context(|| format!("read {}", old.display()))?;
            let new_img =
                load_image(&new, MAX_IMAGE).with_context(|| format!("read {}", new.display()))?;
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
                        snapblk_cow::format::DEFAULT_SCRATCH_SIZE
                    },
                    ..Default::default()
                },
                xor: !no_xor,
                sequence: !no_sequence,
                threads,
                progress: true,
            };
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&out)
                .with_context(|| format!("create {}", out.display()))?;
            let t = std::time::Instant::now();
            let ops = compute_ops(&old_img, &new_img, &opts).context("create COW")?;
            let stats =
                write_ops(&old_img, &new_img, &ops, &f, &opts, true).context("create COW")?;
            let secs = t.elapsed().as_secs_f64();
            let total = t0.elapsed().as_secs_f64();
            let writer_only = if time_writer {
                // Start from an empty file again, as the first run did.
                f.set_len(0)
                    .with_context(|| format!("truncate {}", out.display()))?;
                let again = write_ops(&old_img, &new_img, &ops, &f, &opts, false)
                    .context("create COW (writer timing run)")?;
                if again.cow_bytes != stats.cow_bytes {
                    bail!("internal: writer timing run wrote a different file size");
                }
                Some((again.seconds_write, again.cpu_seconds_write))
            } else {
                None
            };
            if json {
                let mut v = serde_json::to_value(&stats)?;
                v["seconds_generate"] = secs.into();
                if let Some((w, c)) = writer_only {
                    v["seconds_writer_only"] = w.into();
                    v["cpu_seconds_writer_only"] = c.into();
                }
                v["seconds_total"] = total.into();
                v["threads"] = snapblk_cow::generate::threads(threads).into();
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                outln!(
                    "{}: {} bytes; {} blocks: {} unchanged, {} copy, {} xor, {} zero, {} replace ({} ops), {} cycle breaks; {:.2} s",
                    out.display(),
                    stats.cow_bytes,
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
            }
            Ok(())
        }
        CowCmd::Inspect { cow, json, ops } => {
            let r = open_cow(&cow, OpenOptions::default())?;
            let s = tools::summarize(&r);
            if json {
                let mut v = serde_json::to_value(&s)?;
                if ops {
                    v["ops"] = serde_json::to_value(r.ops())?;
                }
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let h = &s.header;
            outln!(
                "Version: {}  header {} bytes  block size {}",
                s.version,
                h.header_size,
                h.block_size
            );
            outln!(
                "File: {} bytes  compression {}",
                s.file_bytes,
                s.compression
            );
            match s.scratch_offset {
                Some(o) => outln!("Scratch: {} bytes at offset {o}", s.scratch_size),
                None => outln!("Scratch: none"),
            }
            outln!(
                "Merge progress: num_merge_ops = {} (u64 at offset {})",
                h.num_merge_ops,
                s.num_merge_ops_offset
            );
            if h.major >= 3 {
                outln!(
                    "v3: op_count {} / {}  sequence {}  resume points {:?}  max unit {}",
                    h.op_count,
                    h.op_count_max,
                    s.sequence_len,
                    s.resume_points,
                    h.max_compression_size
                );
            } else {
                outln!(
                    "v2: cluster_ops {}  sequence {}  labels {:?}  footer {:?}",
                    h.cluster_ops,
                    s.sequence_len,
                    s.labels,
                    s.footer
                );
            }
            outln!("Records: {}  data ops: {}", s.records, s.data_ops);
            for (t, st) in &s.by_type {
                outln!(
                    "  {t:8} {:>10} ops {:>10} blocks {:>12} payload bytes",
                    st.ops,
                    st.blocks,
                    st.payload_bytes
                );
            }
            for (t, n) in &s.op_counts {
                if !s.by_type.contains_key(t) {
                    outln!("  {t:8} {n:>10} records");
                }
            }
            for (c, n) in &s.payload_codecs {
                outln!("  payloads decoded with {c}: {n}");
            }
            outln!(
                "Merge order: {} ops ({}), ordered prefix {}, merged {}, first {:?}",
                s.merge.total,
                s.merge.source,
                s.merge.ordered_prefix,
                s.merge.merged,
                s.merge.first
            );
            match &s.merge.error {
                None => outln!("Merge order: consistent"),
                Some(e) => outln!("Merge order: INVALID: {e}"),
            }
            if ops {
                for op in r.ops() {
                    outln!("{op:?}");
                }
            }
            Ok(())
        }
        CowCmd::Verify {
            cow,
            base,
            expect,
            json,
        } => {
            let base_f = open_file(&base)?;
            // Sources past the base end are checked by tools::verify against the base size.
            let r = open_cow(&cow, OpenOptions::default()).context("verify failed")?;
            let exp = expect.as_ref().map(open_file).transpose()?;
            let rep = tools::verify(&r, &base_f, exp.as_ref()).context("verify failed")?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&rep)?);
            } else {
                outln!(
                    "OK: {} blocks, {} payloads decoded, merge order safe{}",
                    rep.blocks,
                    rep.payloads_decoded,
                    if rep.matches_expected == Some(true) {
                        ", result equals the expected image"
                    } else {
                        ""
                    }
                );
            }
            Ok(())
        }
        CowCmd::Apply { cow, base, out } => {
            let r = open_cow(&cow, OpenOptions::default())?;
            let base_f = open_file(&base)?;
            let len = tools::device_blocks(&r, base_f.size()?) * u64::from(r.block_size());
            if std::fs::canonicalize(&out).ok() == std::fs::canonicalize(&base).ok() {
                bail!("output must not be the base image");
            }
            let f =
                std::fs::File::create(&out).with_context(|| format!("create {}", out.display()))?;
            let mut w = std::io::BufWriter::with_capacity(4 << 20, f);
            let pb = progress_bar(len, "applying");
            tools::apply(&r, &base_f, len, &mut w, &|n| pb.inc(n))?;
            pb.finish_and_clear();
            let f = w.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            Ok(())
        }
    }
}
