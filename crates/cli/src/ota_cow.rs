//! `snapblk ota cow`: the Virtual A/B COW files update_engine would write for an OTA, from the
//! old images (`snapblk_ota::write_vabc_cow` over the partitions `apply` builds), each checked
//! against the COW size the payload reserves and, with `--verify`, through the snapshot driver
//! against the payload's hash; written atomically beside their COW records.

use std::io::Write as _;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use snapblk_core::ReadAt;
use snapblk_cow::CowReader;
use snapblk_cow::record::{self, Record};
use snapblk_ota::{
    DeviceProfile, ExtractOptions, Output, PartitionUpdate, VabcParams, VabcReport,
    check_partition_name, write_vabc_cow,
};
use snapblk_snapshot::{MergeOptions, OpenMode, SnapshotConfig, merge, open_files_sized};

use super::{check_properties, open, ota_inputs, output_dir, private_dir, signatures};
use crate::ota_sig::Keys;
use crate::outfile::{AtomicFile, refuse_alias};
use crate::progress::Progress;

/// Schema of `ota cow --json` documents.
pub(super) const COW_SCHEMA: &str = "snapblk.ota-cow.v1";

/// What the device adds to `estimate_cow_size` when it sizes a snapshot's COW device.
pub(crate) const COW_DEVICE_SLACK: u64 = 2 << 20;

#[derive(Args)]
pub struct CowArgs {
    /// The OTA: a zip with payload.bin, or a bare payload.bin.
    ota: PathBuf,
    /// Directory of the old images, OLDDIR/<partition>.img.
    #[arg(long, value_name = "OLDDIR")]
    source: PathBuf,
    /// Output directory for <partition>.cow and its record <partition>.cow.snapblk (created
    /// if missing; never the source directory).
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    out: PathBuf,
    /// Only these partitions (comma-separated names).
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    partitions: Vec<String>,
    /// Also write COWs for partitions without a COW estimate (update_engine writes those
    /// raw), with no size limit.
    #[arg(long)]
    all_partitions: bool,
    /// The device the COWs are for: `current` (XOR and merge sequences, userspace
    /// snapshots), `no-xor` (userspace snapshots without XOR) or `legacy` (Android 12
    /// dm-snapshot: neither).
    #[arg(long, default_value = "current", value_parser = parse_profile)]
    profile: DeviceProfile,
    /// Check each COW before it is named: the new partition read through the snapshot
    /// driver (old image + COW) has the payload's SHA-256.
    #[arg(long)]
    verify: bool,
    /// With --verify, also merge a copy of the old image and the COW (after checking there
    /// is room for both in the output directory) and check the result's SHA-256.
    #[arg(long, requires = "verify")]
    verify_merge: bool,
    /// Refuse the payload unless its signatures verify with this X.509 certificate or public
    /// key (as `ota apply --key`). Repeatable.
    #[arg(long = "key", value_name = "FILE")]
    keys: Vec<PathBuf>,
    /// Worker threads for building the new partitions and compressing their COWs, 1..=256
    /// (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: Option<u16>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn parse_profile(s: &str) -> Result<DeviceProfile, String> {
    DeviceProfile::by_name(s).ok_or_else(|| format!("{s:?} is not current, no-xor or legacy"))
}

impl CowArgs {
    pub(super) fn json(&self) -> bool {
        self.json
    }
}

/// What `make` does: `ota cow`'s options, and for `ota serve` the partitions without a COW
/// estimate kept as built images.
pub(super) struct Job<'a> {
    pub(super) ota: &'a Path,
    pub(super) source: &'a Path,
    pub(super) out: &'a Path,
    pub(super) partitions: &'a [String],
    /// COWs for partitions without an estimate too.
    pub(super) all_partitions: bool,
    /// Keep the partitions without an estimate as DIR/<partition>.img instead.
    pub(super) keep_raw: bool,
    /// Create a missing output directory with mode 0700 (`ota serve`'s work directory, as
    /// private as its default one), after every check.
    pub(super) private_out: bool,
    pub(super) profile: DeviceProfile,
    pub(super) verify: bool,
    pub(super) verify_merge: bool,
    pub(super) keys: &'a [PathBuf],
    pub(super) threads: Option<u16>,
}

/// What `make` wrote: the COWs, and (with `keep_raw`) the images of the other partitions.
pub(super) struct Made {
    pub(super) cows: Vec<CowResult>,
    pub(super) raw: Vec<(String, PathBuf)>,
    /// Where the time went.
    pub(super) seconds: Phases,
}

/// Wall-clock seconds of `ota cow`'s phases, one after the other (the rest of `total` is
/// opening the OTA, checking signatures, planning and naming the files). `apply` and `verity`
/// come from the library's [`snapblk_ota::ExtractTiming`], `cow_write` from each partition's
/// [`snapblk_ota::VabcTiming`]; the others are timed around the library calls.
#[derive(Default, serde::Serialize)]
pub(super) struct Phases {
    /// The whole command, from opening the OTA to the last file named.
    total: f64,
    /// Hashing the old images against the payload.
    check_old: f64,
    /// Decoding the payload's operations into the new images, and hashing those.
    apply: f64,
    /// Computing the dm-verity hash trees and FEC the manifest leaves to the device.
    verity: f64,
    /// The Virtual A/B COW writer, all partitions (their `cow_write`).
    cow_write: f64,
    /// Digesting the old and new images for the records.
    record: f64,
    /// `--verify`: reading the new partitions through the snapshot driver.
    verify: f64,
    /// `--verify-merge`: copying and merging the old images and COWs.
    verify_merge: f64,
}

/// Wall-clock seconds of one partition's COW steps.
#[derive(Default, serde::Serialize)]
pub(super) struct CowSeconds {
    /// The COW writer (`write_vabc_cow`): merge sequence, every operation, the verity blocks,
    /// finalize.
    cow_write: f64,
    /// Of `cow_write`: reading the old and new images.
    cow_read: f64,
    /// Of `cow_write`: the dm-verity hash tree and FEC blocks after the end label.
    cow_verity: f64,
    /// Digesting the images for the record.
    record: f64,
    /// `--verify`.
    verify: f64,
    /// `--verify-merge`.
    verify_merge: f64,
}

/// The COW device size the device reserves: `estimate_cow_size` + 2 MiB, in whole 4 KiB.
pub(crate) fn cow_limit(estimate: u64) -> u64 {
    (estimate + COW_DEVICE_SLACK).div_ceil(4096) * 4096
}

/// One partition's result.
#[derive(serde::Serialize)]
pub(super) struct CowResult {
    pub(super) partition: String,
    pub(super) cow: PathBuf,
    record: PathBuf,
    /// Size of the new partition (`new_partition_info.size`).
    pub(super) new_size: u64,
    cow_size: u64,
    estimate_cow_size: Option<u64>,
    /// estimate + 2 MiB (the COW device), when there is an estimate.
    cow_device_size: Option<u64>,
    ops: VabcReport,
    /// SHA-256 of the snapshot view (with --verify).
    view_sha256: Option<String>,
    /// SHA-256 of a merged copy of the old image (with --verify-merge).
    merge_sha256: Option<String>,
    /// Where the partition's time went.
    seconds: CowSeconds,
}

/// The partitions `ota cow` writes: those with a COW estimate (all with `--all-partitions`),
/// among `--partitions` when given.
fn chosen<'a>(parts: &'a [PartitionUpdate], a: &Job<'_>) -> Result<Vec<&'a PartitionUpdate>> {
    for n in a.partitions {
        if !parts.iter().any(|p| &p.partition_name == n) {
            bail!("--partitions: the payload has no partition {n:?}");
        }
    }
    let v: Vec<_> = parts
        .iter()
        .filter(|p| a.partitions.is_empty() || a.partitions.contains(&p.partition_name))
        .filter(|p| a.all_partitions || a.keep_raw || has_estimate(p))
        .collect();
    if v.is_empty() {
        bail!(
            "no chosen partition has a COW estimate (update_engine writes them without snapshots); --all-partitions writes COWs for them too"
        );
    }
    Ok(v)
}

fn has_estimate(p: &PartitionUpdate) -> bool {
    p.estimate_cow_size.unwrap_or(0) > 0
}

/// `/proc/self/fd/N` of an open file: a path to an unnamed (O_TMPFILE) file.
fn fd_path(f: &std::fs::File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// SHA-256 of the first `len` bytes of `r`.
fn sha256_prefix(r: &dyn Fn(u64, &mut [u8]) -> Result<()>, len: u64) -> Result<[u8; 32]> {
    let mut h = record::Sha256Stream::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        r(off, &mut buf[..n])?;
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(h.finish())
}

/// The unnamed COW file without the syncs of every label: nothing can resume from a file that
/// has no name, and naming it syncs it once.
struct Unsynced<'a>(&'a std::fs::File);

impl snapblk_cow::WriteAt for Unsynced<'_> {
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        snapblk_cow::WriteAt::write_all_at(self.0, offset, buf)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl snapblk_cow::CowSink for Unsynced<'_> {
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
}

/// The first `.1` bytes of a file (the built partition, whatever the file's length); reading
/// past them is a short read, and a file shorter than them fails with `UnexpectedEof`.
struct Prefix<'a>(&'a std::fs::File, u64);

impl ReadAt for Prefix<'_> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.1.saturating_sub(offset).min(buf.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.0.read_at(offset, &mut buf[..n])
    }
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.1)
    }
}

/// Bytes free for an unprivileged user in the file system holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a valid, writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statvfs {}", dir.display()));
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

/// Copy all of `from` into the unnamed file `to`.
fn copy_into(from: &dyn ReadAt, to: &std::fs::File) -> Result<()> {
    let len = from.size()?;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        from.read_exact_at(off, &mut buf[..n])?;
        snapblk_core::WriteAt::write_all_at(to, off, &buf[..n])?;
        off += n as u64;
    }
    Ok(())
}

pub(super) fn run(c: &CowArgs) -> Result<()> {
    let job = Job {
        ota: &c.ota,
        source: &c.source,
        out: &c.out,
        partitions: &c.partitions,
        all_partitions: c.all_partitions,
        keep_raw: false,
        private_out: false,
        profile: c.profile,
        verify: c.verify,
        verify_merge: c.verify_merge,
        keys: &c.keys,
        threads: c.threads,
    };
    let made = make(&job)?;
    report(c, &made.cows, &made.seconds)
}

/// Build the chosen partitions and write their COWs (see the module docs).
pub(super) fn make(a: &Job<'_>) -> Result<Made> {
    let t0 = std::time::Instant::now();
    let keys = Keys::load(a.keys)?;
    let (ota, _remote) = open(a.ota)?;
    check_properties(&ota, false)?;
    signatures(&ota, &keys)?;
    let payload = ota.payload();
    let manifest = payload.manifest();
    let parts = chosen(&manifest.partitions, a)?;
    let names: Vec<String> = parts.iter().map(|p| p.partition_name.clone()).collect();
    // Everything about the payload and the VABC parameters is checked before any write.
    let plan = payload.plan_apply(Some(&names), false)?;
    let params: Vec<VabcParams> = parts
        .iter()
        .map(|p| {
            // The writer compresses on the threads asked for here, not the device's count
            // (the COW is the same for any).
            VabcParams::from_manifest(manifest, p)
                .map(|v| VabcParams {
                    threads: a.threads.map_or(0, u32::from),
                    ..v
                })
                .with_context(|| format!("partition {}", p.partition_name))
        })
        .collect::<Result<_>>()?;
    super::check_source_dir(a.source, a.out, "beside")?;
    let old_path = |name: &str| a.source.join(format!("{name}.img"));
    let mut olds = Vec::with_capacity(plan.partitions().len());
    for p in plan.partitions() {
        let path = old_path(&p.name);
        match std::fs::File::open(&path) {
            Ok(f) => olds.push(Some(f)),
            // A missing old image is an error only for a partition whose operations read it.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && !p.source.as_ref().is_some_and(|s| s.read) =>
            {
                olds.push(None)
            }
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
    let threads = a.threads.map_or(0, usize::from);
    let bar = Progress::bytes(plan.source_hash_bytes(), "check old");
    let on = |n: u64| bar.inc(n);
    let t = std::time::Instant::now();
    let checked = plan.check_sources(&sources, threads, Some(&on));
    let check_old = t.elapsed().as_secs_f64();
    bar.finish();
    let checked = checked?;
    let mut inputs = ota_inputs(&ota, a.ota, a.keys);
    for p in &manifest.partitions {
        if check_partition_name(&p.partition_name).is_ok() {
            inputs.push(("--source", old_path(&p.partition_name)));
        }
    }
    let inputs: Vec<(&str, &Path)> = inputs.iter().map(|(f, p)| (*f, p.as_path())).collect();
    if a.private_out {
        private_dir(a.out)?;
    } else {
        output_dir(a.out)?;
    }
    for name in &names {
        let cow = a.out.join(format!("{name}.cow"));
        refuse_alias("-o", &cow, &inputs)?;
        refuse_alias("-o", &record::sidecar_path(&cow), &inputs)?;
    }
    // The new partitions, built into unnamed files in the output directory (never named).
    // (`ota serve` keeps those of partitions without a COW, as DIR/<partition>.img.)
    let raw = |p: &PartitionUpdate| a.keep_raw && !has_estimate(p);
    let news: Vec<AtomicFile> = parts
        .iter()
        .map(|p| {
            let n = &p.partition_name;
            let name = if raw(p) {
                format!("{n}.img")
            } else {
                format!(".{n}.new.img")
            };
            let path = a.out.join(name);
            refuse_alias("-o", &path, &inputs)?;
            AtomicFile::create(&path)
        })
        .collect::<Result<_>>()?;
    let outs: Vec<&dyn Output> = news.iter().map(|f| f.file() as &dyn Output).collect();
    let bar = Progress::bytes(plan.progress_bytes(), "apply");
    let on = |e: snapblk_ota::ExtractProgress| {
        if let snapblk_ota::ExtractProgress::Advance { bytes } = e {
            bar.inc(bytes);
        }
    };
    let r = plan.run(
        &checked,
        &outs,
        &ExtractOptions {
            threads,
            progress: Some(&on),
        },
    );
    bar.finish();
    let timing = r?.timing;
    // Every COW is written and checked before any is named: a partition that fails leaves
    // none of them beside the older COWs of the others.
    let mut ready = Vec::new();
    let mut raws = Vec::new();
    for ((i, p), f) in parts.iter().enumerate().zip(news) {
        let ctx = || format!("partition {}", p.partition_name);
        if raw(p) {
            raws.push((p.partition_name.clone(), f));
            continue;
        }
        let res = one(a, p, &params[i], olds[i].as_ref(), f.file()).with_context(ctx)?;
        ready.push(res);
    }
    let mut made = Made {
        cows: Vec::new(),
        raw: Vec::new(),
        seconds: Phases {
            check_old,
            apply: timing.operations().as_secs_f64(),
            verity: timing.verity.as_secs_f64(),
            ..Phases::default()
        },
    };
    for (name, f) in raws {
        let path = a.out.join(format!("{name}.img"));
        f.commit().with_context(|| format!("partition {name}"))?;
        made.raw.push((name, path));
    }
    for r in ready {
        made.cows.push(r.name()?);
    }
    let m = &mut made.seconds;
    for c in &made.cows {
        m.cow_write += c.seconds.cow_write;
        m.record += c.seconds.record;
        m.verify += c.seconds.verify;
        m.verify_merge += c.seconds.verify_merge;
    }
    m.total = t0.elapsed().as_secs_f64();
    Ok(made)
}

/// A partition's COW written and checked, not yet named, with its record.
struct ReadyCow {
    cow: AtomicFile,
    record: Vec<u8>,
    result: CowResult,
}

impl ReadyCow {
    /// Name the COW, then its record.
    fn name(self) -> Result<CowResult> {
        let r = self.result;
        // A new COW never sits beside an old record (docs/safety.md).
        match std::fs::remove_file(&r.record) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("remove the old {}", r.record.display()));
            }
            _ => {}
        }
        self.cow
            .commit()
            .with_context(|| format!("naming {}", r.cow.display()))?;
        let rf = AtomicFile::create(&r.record)?;
        rf.file()
            .write_all(&self.record)
            .with_context(|| format!("write {}", r.record.display()))?;
        rf.commit()?;
        Ok(r)
    }
}

fn report(a: &CowArgs, results: &[CowResult], seconds: &Phases) -> Result<()> {
    if a.json {
        let doc = serde_json::json!({
            "schema": COW_SCHEMA,
            "ok": true,
            "output_dir": a.out,
            "profile": a.profile,
            "partitions": results,
            "seconds": seconds,
        });
        say!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    for r in results {
        let fit = match (r.estimate_cow_size, r.cow_device_size) {
            (Some(e), Some(d)) => format!(
                "estimate {}, COW device {}, {:.1} % used",
                crate::human::bytes_exact(e),
                crate::human::bytes_exact(d),
                r.cow_size as f64 * 100.0 / d as f64
            ),
            _ => "no estimate".into(),
        };
        say!(
            "{}: {} ({fit}); {} copy, {} xor, {} replace, {} zero, {} verity blocks{}{}",
            r.cow.display(),
            crate::human::bytes_exact(r.cow_size),
            r.ops.copy_blocks,
            r.ops.xor_blocks,
            r.ops.replace_blocks,
            r.ops.zero_blocks,
            r.ops.verity_blocks,
            r.view_sha256
                .as_ref()
                .map_or(String::new(), |h| format!("; view sha256 {h} verified")),
            r.merge_sha256.as_ref().map_or(String::new(), |h| format!(
                "; merged copy sha256 {h} verified"
            )),
        );
    }
    let image: u64 = results.iter().map(|r| r.new_size).sum();
    let s = seconds;
    say!(
        "{:.2} s: check old {:.2} s, apply {:.2} s, verity {:.2} s, COW writer {:.2} s ({:.0} MiB of image/s), record {:.2} s, verify {:.2} s, verify merge {:.2} s",
        s.total,
        s.check_old,
        s.apply,
        s.verity,
        s.cow_write,
        image as f64 / (1u64 << 20) as f64 / s.cow_write.max(1e-9),
        s.record,
        s.verify,
        s.verify_merge
    );
    say!(
        "{} written to {}",
        crate::ota::count(results.len(), "COW"),
        a.out.display()
    );
    Ok(())
}

/// Write and check one partition's COW and build its record (named by [`ReadyCow::name`]).
fn one(
    a: &Job<'_>,
    p: &PartitionUpdate,
    params: &VabcParams,
    old: Option<&std::fs::File>,
    new: &std::fs::File,
) -> Result<ReadyCow> {
    let name = &p.partition_name;
    let cow_path = a.out.join(format!("{name}.cow"));
    let rec_path = record::sidecar_path(&cow_path);
    let mut seconds = CowSeconds::default();
    let info = p.new_partition_info.as_ref();
    let new_size = info.and_then(|i| i.size).unwrap_or(0);
    let want_hash = info.and_then(|i| i.hash.clone());
    let cow = AtomicFile::create(&cow_path)?;
    let report = write_vabc_cow(p, params, a.profile, old, new, Unsynced(cow.file()))?;
    seconds.cow_write = report.timing.total.as_secs_f64();
    seconds.cow_read = report.timing.read.as_secs_f64();
    seconds.cow_verity = report.timing.verity.as_secs_f64();
    let estimate = p.estimate_cow_size.filter(|&e| e > 0);
    let limit = estimate.map(cow_limit);
    if let Some(l) = limit
        && report.cow_size > l
    {
        bail!(
            "the COW is {} bytes, more than the {l} bytes the device reserves (estimate_cow_size {} + 2 MiB): it would not fit; nothing written",
            report.cow_size,
            estimate.unwrap_or(0)
        );
    }
    // The record: base digests from the old image (whose SHA-256 `apply` checked against the
    // payload's old_partition_info), target digests from the built partition.
    // Both images are read from their files a chunk at a time, never held in memory.
    let t = std::time::Instant::now();
    let reader = CowReader::open(cow.file()).context("reading the COW back")?;
    let no_old: Vec<u8> = Vec::new();
    let old_src: &(dyn ReadAt + Sync) = match old {
        Some(f) => f,
        None => &no_old,
    };
    let new_src = Prefix(new, new_size);
    let mut rec = Record::build_from(&reader, old_src, &new_src)
        .context("digesting the old and new images for the record")?;
    if let Some(h) = p.old_partition_info.as_ref().and_then(|i| i.hash.as_ref())
        && h.as_slice() != rec.base_sha256
    {
        bail!("the old image's SHA-256 is not the payload's old_partition_info hash");
    }
    if let Some(h) = &want_hash
        && h.as_slice() != rec.target_sha256
    {
        bail!("the built partition's SHA-256 is not the payload's new_partition_info hash");
    }
    rec.target_size = new_size;
    drop(reader);
    seconds.record = t.elapsed().as_secs_f64();
    let (mut view_sha256, mut merge_sha256) = (None, None);
    if a.verify {
        let t = std::time::Instant::now();
        // A partition without an old image, or one that grows, is served over a copy of the
        // old image (if any) extended to the new size, as the device's partition is.
        let grown;
        let old_len = old.map_or(Ok(0), ReadAt::size)?;
        let base: PathBuf = match old {
            Some(f) if old_len >= new_size => fd_path(f),
            _ => {
                grown = AtomicFile::create(&a.out.join(format!(".{name}.base.img")))?;
                if let Some(f) = old {
                    copy_into(f, grown.file())?;
                }
                grown.file().set_len(new_size)?;
                fd_path(grown.file())
            }
        };
        let snap = open_files_sized(
            &base,
            &fd_path(cow.file()),
            SnapshotConfig::default(),
            OpenMode::default(),
            Some(new_size),
        )
        .context("opening the snapshot (old image + COW)")?;
        let got = sha256_prefix(&|o, b| Ok(snap.read(o, b)?), new_size)?;
        drop(snap);
        if let Some(h) = &want_hash
            && h.as_slice() != got
        {
            bail!(
                "the snapshot view has SHA-256 {}, not the payload's {}; nothing written",
                record::hex(&got),
                record::hex(h)
            );
        }
        view_sha256 = Some(record::hex(&got));
        seconds.verify = t.elapsed().as_secs_f64();
        if a.verify_merge {
            let t = std::time::Instant::now();
            merge_sha256 = Some(merge_copy(
                a,
                name,
                old,
                cow.file(),
                new_size,
                want_hash.as_deref(),
            )?);
            seconds.verify_merge = t.elapsed().as_secs_f64();
        }
    }
    let result = CowResult {
        partition: name.clone(),
        cow: cow_path,
        record: rec_path,
        new_size,
        cow_size: report.cow_size,
        estimate_cow_size: estimate,
        cow_device_size: limit,
        ops: report,
        view_sha256,
        merge_sha256,
        seconds,
    };
    Ok(ReadyCow {
        cow,
        record: rec.encode(),
        result,
    })
}

/// Merge copies of the old image and the COW (unnamed files in the output directory, after a
/// free-space check) and check the merged image's SHA-256.
fn merge_copy(
    a: &Job<'_>,
    name: &str,
    old: Option<&std::fs::File>,
    cow: &std::fs::File,
    new_size: u64,
    want: Option<&[u8]>,
) -> Result<String> {
    let old_len = old.map_or(Ok(0), ReadAt::size)?;
    let need = old_len.max(new_size) + ReadAt::size(cow)?;
    let free = free_bytes(a.out)?;
    if free < need {
        bail!(
            "--verify-merge needs {need} bytes free in {} for copies of the old image and the COW, and {free} are",
            a.out.display()
        );
    }
    let base = AtomicFile::create(&a.out.join(format!(".{name}.merge.img")))?;
    match old {
        Some(f) => copy_into(f, base.file())?,
        None => base.file().set_len(new_size)?,
    }
    if old_len < new_size {
        base.file().set_len(new_size)?;
    }
    let cow_copy = AtomicFile::create(&a.out.join(format!(".{name}.merge.cow")))?;
    copy_into(cow, cow_copy.file())?;
    let mode = OpenMode {
        base_writable: true,
        cow_writable: true,
    };
    let snap = open_files_sized(
        &fd_path(base.file()),
        &fd_path(cow_copy.file()),
        SnapshotConfig::default(),
        mode,
        Some(new_size),
    )
    .context("opening the copies to merge")?;
    merge(&snap, MergeOptions::default()).context("merging the copies")?;
    drop(snap);
    let f = base.file();
    let got = sha256_prefix(&|o, b| Ok(f.read_exact_at(o, b)?), new_size)?;
    if let Some(h) = want
        && h != got
    {
        bail!(
            "the merged copy has SHA-256 {}, not the payload's {}; nothing written",
            record::hex(&got),
            record::hex(h)
        );
    }
    Ok(record::hex(&got))
}
