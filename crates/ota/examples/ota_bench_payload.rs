//! Writes large OTA payloads from image files for bench/ota-bench.sh (not a test), the way
//! update_engine's `delta_generator` encodes them, on all cores and streaming (memory is a batch
//! of operations, whatever the images' size).
//!
//! usage: ota_bench_payload full OUT [--codecs xz,bz[,zstd]] NAME=IMAGE...
//!        ota_bench_payload delta OUT PLAN [--codecs ...]
//!
//! * `full`: each image cut into 2 MiB operations (delta_generator's default chunk); each
//!   chunk stored with the smallest of REPLACE and the codecs asked for (REPLACE_BZ: bzip2 -9;
//!   REPLACE_XZ: xz level 6 with the dictionary reduced to the chunk and no check, as
//!   delta_generator's `XzCompress`; REPLACE_ZSTD, Android 17's, only on request). Minor version
//!   0; no ZERO (not allowed in full payloads: a zero chunk compresses to almost nothing).
//! * `delta`: the operations of PLAN (written by bench/ota/plan-delta.py, one per line:
//!   `partition NAME OLD NEW`, then `copy SRC DST`, `diff SRC DST`, `replace DST`, `zero DST`,
//!   extents as `start+count,...`): `diff` becomes a SOURCE_BSDIFF with a BSDIFF40 patch made
//!   by Debian's `bsdiff` (in `$TMPDIR`) unless a REPLACE_* of the new blocks is smaller (as
//!   delta_generator chooses); `replace` is the smallest REPLACE_* per destination extent and
//!   per 2 MiB (payload readers that write a REPLACE's data from its first extent on, like PyPI
//!   payload-dumper, then read it right). Minor version 6, every source-reading operation with
//!   `src_sha256_hash`, `old_partition_info` from the old image.
//!
//! Every blob carries `data_sha256_hash`, every partition `new_partition_info`. The header and
//! manifest are the test writer's ([`Built::to_bytes`] with an empty data area); the blobs
//! follow from a temporary file beside OUT. Prints one line per partition on stderr.

use snapblk_ota::testing::{Built, Encoding, encode, sha256};
use snapblk_ota::{
    DeltaArchiveManifest, Extent, InstallOperation, OpType, PartitionInfo, PartitionUpdate,
};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

const BS: u64 = 4096;
/// delta_generator's default full-operation size (2 MiB).
const CHUNK_BLOCKS: u64 = 512;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;
type Blocks = Vec<(u64, u64)>;

#[derive(Clone, Debug)]
enum Job {
    /// Store these new blocks (one extent at most `CHUNK_BLOCKS` long).
    Replace {
        dst: (u64, u64),
    },
    Copy {
        src: Blocks,
        dst: Blocks,
    },
    Diff {
        src: Blocks,
        dst: Blocks,
    },
    Zero {
        dst: Blocks,
    },
}

struct Part {
    name: String,
    old: Option<PathBuf>,
    new: PathBuf,
    jobs: Vec<Job>,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("ota_bench_payload: {e}");
        std::process::exit(1);
    }
}

fn run() -> Res<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut codecs = vec![Encoding::Xz, Encoding::Bz];
    if let Some(i) = args.iter().position(|a| a == "--codecs") {
        let list = args.get(i + 1).ok_or("--codecs needs a list")?.clone();
        codecs = list
            .split(',')
            .map(|c| match c {
                "xz" => Ok(Encoding::Xz),
                "bz" => Ok(Encoding::Bz),
                "zstd" => Ok(Encoding::Zstd),
                _ => Err(format!("unknown codec {c}")),
            })
            .collect::<Result<_, _>>()?;
        args.drain(i..i + 2);
    }
    let (mode, out) = match args.as_slice() {
        [m, o, ..] => (m.clone(), PathBuf::from(o)),
        _ => return Err("usage: ota_bench_payload full|delta OUT ...".into()),
    };
    let parts = match mode.as_str() {
        "full" => args[2..]
            .iter()
            .map(|a| {
                let (name, img) = a.split_once('=').ok_or("NAME=IMAGE expected")?;
                let blocks = std::fs::metadata(img)?.len().div_ceil(BS);
                let jobs = (0..blocks)
                    .step_by(CHUNK_BLOCKS as usize)
                    .map(|s| Job::Replace {
                        dst: (s, CHUNK_BLOCKS.min(blocks - s)),
                    })
                    .collect();
                Ok(Part {
                    name: name.into(),
                    old: None,
                    new: img.into(),
                    jobs,
                })
            })
            .collect::<Res<Vec<_>>>()?,
        "delta" => read_plan(Path::new(args.get(2).ok_or("PLAN missing")?))?,
        _ => return Err(format!("unknown mode {mode}").into()),
    };
    write_payload(&out, &parts, &codecs, mode == "delta")
}

fn extents(s: &str) -> Res<Blocks> {
    s.split(',')
        .map(|e| {
            let (a, b) = e.split_once('+').ok_or("extent start+count expected")?;
            Ok((a.parse()?, b.parse()?))
        })
        .collect()
}

fn read_plan(path: &Path) -> Res<Vec<Part>> {
    let mut parts: Vec<Part> = Vec::new();
    for line in std::fs::read_to_string(path)?.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let ["partition", name, old, new] = w.as_slice() {
            parts.push(Part {
                name: name.to_string(),
                old: Some(old.into()),
                new: new.into(),
                jobs: Vec::new(),
            });
            continue;
        }
        let part = parts.last_mut().ok_or("operation before partition")?;
        match w.as_slice() {
            ["copy", s, d] => part.jobs.push(Job::Copy {
                src: extents(s)?,
                dst: extents(d)?,
            }),
            ["diff", s, d] => part.jobs.push(Job::Diff {
                src: extents(s)?,
                dst: extents(d)?,
            }),
            ["zero", d] => part.jobs.push(Job::Zero { dst: extents(d)? }),
            ["replace", d] => {
                for (s, n) in extents(d)? {
                    let mut b = s;
                    while b < s + n {
                        let k = CHUNK_BLOCKS.min(s + n - b);
                        part.jobs.push(Job::Replace { dst: (b, k) });
                        b += k;
                    }
                }
            }
            [] => {}
            _ => return Err(format!("bad plan line: {line}").into()),
        }
    }
    Ok(parts)
}

/// The bytes of `blocks` of `f`.
fn read_blocks(f: &File, blocks: &[(u64, u64)]) -> Res<Vec<u8>> {
    let mut v = vec![0u8; (blocks.iter().map(|b| b.1).sum::<u64>() * BS) as usize];
    let mut at = 0;
    for &(s, n) in blocks {
        let len = (n * BS) as usize;
        f.read_exact_at(&mut v[at..at + len], s * BS)?;
        at += len;
    }
    Ok(v)
}

fn ext(blocks: &[(u64, u64)]) -> Vec<Extent> {
    blocks
        .iter()
        .map(|&(s, n)| Extent {
            start_block: Some(s),
            num_blocks: Some(n),
        })
        .collect()
}

/// xz as delta_generator's `XzCompress`: level 6, the dictionary reduced to the input's size
/// (LZMA SDK's `reduceSize`: the smallest 2·2^i or 3·2^i that holds it), no check.
fn xz(data: &[u8]) -> Res<Vec<u8>> {
    use liblzma::stream::{Check, Filters, LzmaOptions, Stream};
    let mut opts = LzmaOptions::new_preset(6)?;
    let mut dict = 8u32 << 20;
    for i in 11..23 {
        if (2u64 << i) >= data.len() as u64 {
            dict = dict.min(2 << i);
            break;
        }
        if (3u64 << i) >= data.len() as u64 {
            dict = dict.min(3 << i);
            break;
        }
    }
    opts.dict_size(dict);
    let mut filters = Filters::new();
    filters.lzma2(&opts);
    let s = Stream::new_stream_encoder(&filters, Check::None)?;
    let mut w = liblzma::write::XzEncoder::new_stream(Vec::new(), s);
    w.write_all(data)?;
    Ok(w.finish()?)
}

/// The smallest of REPLACE and `codecs` for `data`: (type, blob).
fn best(data: &[u8], codecs: &[Encoding]) -> Res<(OpType, Vec<u8>)> {
    let mut best = (OpType::Replace, data.to_vec());
    for &c in codecs {
        let (t, blob) = match c {
            Encoding::Xz => (OpType::ReplaceXz, xz(data)?),
            Encoding::Bz => (OpType::ReplaceBz, encode(Encoding::Bz, data)),
            Encoding::Zstd => (OpType::ReplaceZstd, encode(Encoding::Zstd, data)),
            Encoding::Replace => continue,
        };
        if blob.len() < best.1.len() {
            best = (t, blob);
        }
    }
    Ok(best)
}

/// A BSDIFF40 patch from `old` to `new` by Debian's `bsdiff`, through files in `dir`.
fn bsdiff(dir: &Path, old: &[u8], new: &[u8]) -> Res<Vec<u8>> {
    let (o, n, p) = (dir.join("old"), dir.join("new"), dir.join("patch"));
    std::fs::write(&o, old)?;
    std::fs::write(&n, new)?;
    let st = Command::new("bsdiff").arg(&o).arg(&n).arg(&p).status()?;
    if !st.success() {
        return Err(format!("bsdiff failed: {st}").into());
    }
    Ok(std::fs::read(&p)?)
}

/// The operations (without data fields) and blobs of one job.
fn run_job(
    job: &Job,
    old: Option<&File>,
    new: &File,
    codecs: &[Encoding],
    tmp: &Path,
) -> Res<Vec<(InstallOperation, Vec<u8>)>> {
    let op = |t: OpType, src: &[(u64, u64)], dst: &[(u64, u64)]| InstallOperation {
        r#type: t as i32,
        src_extents: ext(src),
        dst_extents: ext(dst),
        ..Default::default()
    };
    let src_hash = |src: &[(u64, u64)]| -> Res<Vec<u8>> {
        Ok(sha256(&read_blocks(old.ok_or("no old image")?, src)?))
    };
    Ok(match job {
        Job::Replace { dst } => {
            let (t, blob) = best(&read_blocks(new, &[*dst])?, codecs)?;
            vec![(op(t, &[], &[*dst]), blob)]
        }
        Job::Zero { dst } => vec![(op(OpType::Zero, &[], dst), Vec::new())],
        Job::Copy { src, dst } => {
            let mut o = op(OpType::SourceCopy, src, dst);
            o.src_sha256_hash = Some(src_hash(src)?);
            vec![(o, Vec::new())]
        }
        Job::Diff { src, dst } => {
            let old_bytes = read_blocks(old.ok_or("no old image")?, src)?;
            let new_bytes = read_blocks(new, dst)?;
            let patch = bsdiff(tmp, &old_bytes, &new_bytes)?;
            // The REPLACE_* alternative, cut per extent and 2 MiB.
            let mut alt = Vec::new();
            for &(s, n) in dst {
                let mut b = s;
                while b < s + n {
                    let k = CHUNK_BLOCKS.min(s + n - b);
                    let (t, blob) = best(&read_blocks(new, &[(b, k)])?, codecs)?;
                    alt.push((op(t, &[], &[(b, k)]), blob));
                    b += k;
                }
            }
            if alt.iter().map(|a| a.1.len()).sum::<usize>() <= patch.len() {
                alt
            } else {
                let mut o = op(OpType::SourceBsdiff, src, dst);
                o.src_sha256_hash = Some(sha256(&old_bytes));
                vec![(o, patch)]
            }
        }
    })
}

fn file_sha256(path: &Path) -> Res<(u64, Vec<u8>)> {
    use sha2::Digest;
    let mut f = File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, h.finalize().to_vec()))
}

fn write_payload(out: &Path, parts: &[Part], codecs: &[Encoding], delta: bool) -> Res<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let tmp_base = std::env::temp_dir().join(format!("ota-bench-payload.{}", std::process::id()));
    let data_path = out.with_extension("data.tmp");
    let mut data = BufWriter::new(File::create(&data_path)?);
    let mut offset = 0u64;
    let mut partitions = Vec::new();
    for p in parts {
        let new = File::open(&p.new)?;
        let old = p.old.as_ref().map(File::open).transpose()?;
        let mut ops = Vec::new();
        let mut counts = std::collections::BTreeMap::<&str, (u64, u64)>::new();
        for batch in p.jobs.chunks(threads * 16) {
            let next = AtomicUsize::new(0);
            let mut results: Vec<_> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let (next, new, old) = (&next, &new, old.as_ref());
                        let tmp = tmp_base.join(t.to_string());
                        s.spawn(move || {
                            let _ = std::fs::create_dir_all(&tmp);
                            let mut done = Vec::new();
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                let Some(job) = batch.get(i) else { break };
                                done.push((i, run_job(job, old, new, codecs, &tmp)));
                            }
                            done
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_default())
                    .collect()
            });
            if results.len() != batch.len() {
                return Err("a worker failed".into());
            }
            results.sort_by_key(|r| r.0);
            for (_, r) in results {
                for (mut op, blob) in r? {
                    let t = OpType::try_from(op.r#type).map_or("?", OpType::name);
                    let c = counts.entry(t).or_default();
                    c.0 += 1;
                    c.1 += blob.len() as u64;
                    if !blob.is_empty() {
                        op.data_offset = Some(offset);
                        op.data_length = Some(blob.len() as u64);
                        op.data_sha256_hash = Some(sha256(&blob));
                        data.write_all(&blob)?;
                        offset += blob.len() as u64;
                    }
                    ops.push(op);
                }
            }
        }
        let (size, hash) = file_sha256(&p.new)?;
        let old_info = match &p.old {
            Some(o) => {
                let (size, hash) = file_sha256(o)?;
                Some(PartitionInfo {
                    size: Some(size),
                    hash: Some(hash),
                })
            }
            None => None,
        };
        eprintln!(
            "{}: {} MiB, {} ops: {}",
            p.name,
            size >> 20,
            ops.len(),
            counts
                .iter()
                .map(|(k, v)| format!("{} {k} ({:.1} MiB)", v.0, v.1 as f64 / 1048576.0))
                .collect::<Vec<_>>()
                .join(", ")
        );
        partitions.push(PartitionUpdate {
            partition_name: p.name.clone(),
            old_partition_info: old_info,
            new_partition_info: Some(PartitionInfo {
                size: Some(size),
                hash: Some(hash),
            }),
            operations: ops,
            ..Default::default()
        });
    }
    data.flush()?;
    drop(data);
    let _ = std::fs::remove_dir_all(&tmp_base);
    let head = Built {
        manifest: DeltaArchiveManifest {
            block_size: Some(BS as u32),
            minor_version: Some(if delta { 6 } else { 0 }),
            partitions,
            ..Default::default()
        },
        data: Vec::new(),
    }
    .to_bytes();
    let part_path = out.with_extension("part.tmp");
    let mut f = File::create(&part_path)?;
    f.write_all(&head)?;
    std::io::copy(&mut File::open(&data_path)?, &mut f)?;
    f.sync_all()?;
    std::fs::remove_file(&data_path)?;
    std::fs::rename(&part_path, out)?;
    Ok(())
}
