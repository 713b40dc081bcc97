//! fio's vocabulary: its job files (INI: `[global]` + one section per job) and its
//! `ioengine`/`filename` options, mapped onto snapblk's jobs and device specs.
//!
//! Options snapblk implements mean what they mean in fio; options it does not implement are
//! named in one warning each (never silently dropped); options that would change what is
//! measured in a way snapblk cannot follow (a file per job, `ioengine=posixaio`, ...) are
//! errors.

use crate::spec::{Iomem, JobSpec, RwMode, parse_secs, parse_size};
use crate::{Error, Result};

/// Where fio would do its I/O: `filename`, `ioengine` and the libblkio engine's options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FioTarget {
    /// fio's `filename` (a path, or a snapblk device spec).
    pub filename: Option<String>,
    /// fio's `ioengine`.
    pub ioengine: Option<String>,
    /// fio's `libblkio_driver` (with `ioengine=libblkio`).
    pub libblkio_driver: Option<String>,
    /// fio's `libblkio_path` (with `ioengine=libblkio`; default: `filename`).
    pub libblkio_path: Option<String>,
    /// fio's `libblkio_pre_connect_props` and `libblkio_pre_start_props` (`k=v:k=v`).
    pub libblkio_props: Vec<(String, String)>,
}

/// fio's synchronous engines: one request per system call, as snapblk's `sync` driver.
const SYNC_ENGINES: &[&str] = &["sync", "psync", "vsync", "pvsync", "pvsync2"];

/// The engines snapblk maps, for the error message about the others.
const NAMED_ENGINES: &str = "io_uring, libaio, sync, psync, vsync, pvsync, pvsync2, null, libblkio";

impl FioTarget {
    /// The snapblk device spec fio's options describe, and a warning when the engine is
    /// replaced by a near equivalent. `capacity` is what a `null` engine needs (fio sizes it
    /// from the jobs). An engine with no snapblk equivalent is a one-line error.
    pub fn device_spec(&self, capacity: Option<u64>) -> Result<(String, Option<String>)> {
        // Without an engine a path runs on io_uring (snapblk's default; fio's is psync).
        let engine = self
            .ioengine
            .as_deref()
            .map(str::to_ascii_lowercase)
            .unwrap_or_else(|| "io_uring".into());
        let path = || -> Result<&str> {
            self.filename.as_deref().ok_or_else(|| {
                Error::Spec(format!(
                    "ioengine={engine} needs a filename (fio's files named after jobs are not \
                     supported)"
                ))
            })
        };
        // A filename that is already a device spec (`null:size=1G`) is used as it is, unless
        // the engine says otherwise.
        let is_spec = |f: &str| {
            f.split_once(':')
                .is_some_and(|(d, r)| snapblk::DRIVERS.contains(&d) && r.contains('='))
                && !std::path::Path::new(f).exists()
        };
        if self.ioengine.is_none() {
            let f = path()?;
            return Ok((f.to_string(), None));
        }
        let with_path = |driver: &str| -> Result<String> {
            let f = path()?;
            if is_spec(f) {
                return Err(Error::Spec(format!(
                    "filename={f} is a device spec; drop ioengine={engine} or give a path"
                )));
            }
            Ok(format!("{driver}:path={}", spec_value(f)?))
        };
        Ok(match engine.as_str() {
            "io_uring" => (with_path("io_uring")?, None),
            "libaio" => (
                with_path("io_uring")?,
                Some("ioengine=libaio runs on snapblk's io_uring driver (no libaio driver)".into()),
            ),
            e if SYNC_ENGINES.contains(&e) => (with_path("sync")?, None),
            "null" => {
                let cap = capacity.ok_or_else(|| {
                    Error::Spec("ioengine=null needs a size (fio's null engine does too)".into())
                })?;
                (format!("null:size={cap}"), None)
            }
            "libblkio" => {
                let driver = self
                    .libblkio_driver
                    .as_deref()
                    .ok_or_else(|| Error::Spec("ioengine=libblkio needs libblkio_driver".into()))?;
                if !snapblk::DRIVERS.contains(&driver) {
                    return Err(Error::Spec(format!(
                        "libblkio_driver={driver} is not a snapblk driver (known: {})",
                        snapblk::DRIVERS.join(", ")
                    )));
                }
                let mut props = Vec::new();
                if let Some(p) = self.libblkio_path.as_deref().or(self.filename.as_deref()) {
                    props.push(format!("path={}", spec_value(p)?));
                }
                for (k, v) in &self.libblkio_props {
                    props.push(format!("{k}={}", spec_value(v)?));
                }
                (format!("{driver}:{}", props.join(",")), None)
            }
            e if snapblk::DRIVERS.contains(&e) && e != "snapshot" && e != "fault" => {
                (with_path(e)?, None)
            }
            e => {
                return Err(Error::Spec(format!(
                    "ioengine={e} has no snapblk equivalent (use one of {NAMED_ENGINES}, or a \
                     snapblk device spec as the filename)"
                )));
            }
        })
    }
}

/// A value inside a device spec: commas would split it.
fn spec_value(v: &str) -> Result<&str> {
    if v.contains(',') {
        return Err(Error::Spec(format!(
            "{v:?} contains a comma, which a device spec cannot carry"
        )));
    }
    Ok(v)
}

/// Parse fio's block-size value: `4k`, or `4k,4k` (reads, writes [, trims]) when all sizes
/// agree; different sizes per direction are not supported.
pub fn parse_fio_bs(s: &str) -> Result<u64> {
    let sizes: Vec<u64> = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| parse_size(p.trim()))
        .collect::<Result<_>>()?;
    match sizes.as_slice() {
        [] => Err(Error::Spec("bs: no size given".into())),
        [first, rest @ ..] if rest.iter().all(|b| b == first) => Ok(*first),
        _ => Err(Error::Spec(format!(
            "bs={s}: different block sizes per direction (fio's read,write form) are not \
             supported; for a sweep over block sizes use --sweep-bs"
        ))),
    }
}

/// fio's boolean values: `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`; a bare key is true.
fn fio_bool(k: &str, v: Option<&str>) -> Result<bool> {
    match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
        None | Some("1" | "true" | "yes" | "on") => Ok(true),
        Some("0" | "false" | "no" | "off") => Ok(false),
        Some(o) => Err(Error::JobFile(format!("{k}={o}: expected 0 or 1"))),
    }
}

/// A fio job file turned into snapblk jobs, run one after the other, on one target.
#[derive(Debug, Clone)]
pub struct FioJobFile {
    /// The jobs, in file order (each section once; fio's `numjobs` stays a field).
    pub jobs: Vec<JobSpec>,
    /// Where the jobs do their I/O (all must agree).
    pub target: FioTarget,
    /// One line per option ignored, and per job that fio would run at the same time as the
    /// one before it.
    pub warnings: Vec<String>,
}

/// Job-file options that are accepted and have no effect on snapblk's measurement (fio's
/// reporting and process-model choices that snapblk's results already match).
const NO_EFFECT: &[&str] = &[
    "group_reporting",
    "thread",
    "new_group",
    "stonewall",
    "wait_for_previous",
];

/// One job's state while its section and the `[global]` ones before it are applied.
#[derive(Clone)]
struct Section {
    spec: JobSpec,
    target: FioTarget,
    stonewall: bool,
}

/// Parse a fio job file (INI): `[global]` sections set defaults for the jobs after them,
/// every other `[name]` section is one job named `name`. `;` and `#` start comment lines; a
/// key without `=` is a boolean set to 1. Jobs start from fio's defaults (`rw=read`, `bs=4k`,
/// `iodepth=1`), with `base`'s other settings.
pub fn parse_fio_job_file(text: &str, base: &JobSpec) -> Result<FioJobFile> {
    let start = JobSpec {
        rw: RwMode::Read,
        bs: 4096,
        iodepth: 1,
        numjobs: 1,
        runtime: None,
        time_based: false,
        ..base.clone()
    };
    let mut global = Section {
        spec: start,
        target: FioTarget::default(),
        stonewall: false,
    };
    let mut jobs: Vec<Section> = Vec::new();
    // None: in a [global] section (or before any section).
    let mut cur: Option<Section> = None;
    let mut warnings: Vec<String> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        let at = |e: Error| Error::JobFile(format!("line {}: {}", n + 1, snapblk_core::Chain(&e)));
        if let Some(name) = line.strip_prefix('[') {
            let name = name
                .strip_suffix(']')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| Error::JobFile(format!("line {}: bad section {line:?}", n + 1)))?;
            if let Some(j) = cur.take() {
                jobs.push(j);
            }
            if name != "global" {
                let mut s = global.clone();
                s.spec.name = name.to_string();
                s.spec.named = true;
                s.stonewall = false;
                cur = Some(s);
            }
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (line, None),
        };
        let sec = cur.as_mut().unwrap_or(&mut global);
        if let Some(w) = apply(sec, key, value).map_err(at)? {
            let w = format!("line {}: {w}", n + 1);
            if !warnings.contains(&w) {
                warnings.push(w);
            }
        }
    }
    if let Some(j) = cur.take() {
        jobs.push(j);
    }
    if jobs.is_empty() {
        return Err(Error::JobFile("no job sections (only [global])".into()));
    }
    let target = jobs[0].target.clone();
    for (i, j) in jobs.iter().enumerate() {
        if j.target != target {
            return Err(Error::JobFile(format!(
                "job {:?} uses another filename or ioengine than {:?}: snapblk runs the jobs \
                 of one file on one target",
                j.spec.name, jobs[0].spec.name
            )));
        }
        if i > 0 && !j.stonewall {
            warnings.push(format!(
                "job {:?} runs after {:?}, not at the same time as fio would run it without \
                 stonewall",
                j.spec.name,
                jobs[i - 1].spec.name
            ));
        }
        j.spec.validate()?;
    }
    Ok(FioJobFile {
        jobs: jobs.into_iter().map(|j| j.spec).collect(),
        target,
        warnings,
    })
}

/// Apply one `key[=value]` to `sec`; `Ok(Some(w))` when the option is ignored (w says so).
fn apply(sec: &mut Section, key: &str, value: Option<&str>) -> Result<Option<String>> {
    let k = key.to_ascii_lowercase();
    let val = || {
        value
            .filter(|v| !v.is_empty())
            .ok_or_else(|| Error::JobFile(format!("{k} needs a value")))
    };
    let num = |s: &str| -> Result<u32> {
        s.parse()
            .map_err(|_| Error::JobFile(format!("{k}: bad number {s:?}")))
    };
    let spec = &mut sec.spec;
    match k.as_str() {
        "name" => {
            spec.name = val()?.to_string();
            spec.named = true;
        }
        "filename" => sec.target.filename = Some(val()?.to_string()),
        "ioengine" => sec.target.ioengine = Some(val()?.to_string()),
        "libblkio_driver" => sec.target.libblkio_driver = Some(val()?.to_string()),
        "libblkio_path" => sec.target.libblkio_path = Some(val()?.to_string()),
        "libblkio_pre_connect_props" | "libblkio_pre_start_props" => {
            for p in val()?.split(':').filter(|p| !p.is_empty()) {
                let (pk, pv) = p
                    .split_once('=')
                    .ok_or_else(|| Error::JobFile(format!("{k}: {p:?} is not KEY=VALUE")))?;
                sec.target.libblkio_props.push((pk.into(), pv.into()));
            }
        }
        "rw" | "readwrite" => {
            let v = val()?;
            // fio's `randread:8` (an offset modifier) has no equivalent.
            if v.contains(':') {
                return Err(Error::JobFile(format!(
                    "{k}={v}: offset modifiers are not supported"
                )));
            }
            spec.rw = RwMode::parse(v)?;
        }
        "bs" | "blocksize" => spec.bs = parse_fio_bs(val()?)?,
        "iodepth" => spec.iodepth = num(val()?)?,
        "numjobs" => spec.numjobs = num(val()?)?,
        "rwmixread" => spec.rwmixread = num(val()?)?,
        "rwmixwrite" => spec.rwmixread = 100u32.saturating_sub(num(val()?)?),
        "size" => spec.size = Some(parse_size(val()?)?),
        "offset" => spec.offset = parse_size(val()?)?,
        "offset_increment" => spec.offset_increment = parse_size(val()?)?,
        "runtime" => spec.runtime = Some(parse_secs(val()?)?),
        "time_based" => spec.time_based = fio_bool(&k, value)?,
        "ramp_time" => spec.ramp_time = parse_secs(val()?)?,
        "direct" => spec.direct = fio_bool(&k, value)?,
        "buffered" => spec.direct = !fio_bool(&k, value)?,
        "randseed" => {
            spec.seed = val()?
                .parse()
                .map_err(|_| Error::JobFile(format!("{k}: bad number")))?
        }
        "buffer_compress_percentage" => spec.buffers.compress_percentage = num(val()?)?,
        "refill_buffers" => spec.buffers.refill = fio_bool(&k, value)?,
        "scramble_buffers" => spec.buffers.scramble = fio_bool(&k, value)?,
        "iodepth_batch_submit" | "iodepth_batch" => spec.batch.iodepth_batch_submit = num(val()?)?,
        "iodepth_batch_complete_min" | "iodepth_batch_complete" => {
            spec.batch.iodepth_batch_complete_min = num(val()?)?
        }
        "iodepth_batch_complete_max" => spec.batch.iodepth_batch_complete_max = num(val()?)?,
        "invalidate" => spec.invalidate = fio_bool(&k, value)?,
        "iomem" | "mem" => spec.iomem = Iomem::parse(val()?)?,
        "stonewall" | "wait_for_previous" => sec.stonewall = fio_bool(&k, value)?,
        k if NO_EFFECT.contains(&k) => {}
        "verify" if value.is_some_and(|v| v == "0") => spec.verify = false,
        _ => {
            let shown = match value {
                Some(v) => format!("{key}={v}"),
                None => key.to_string(),
            };
            return Ok(Some(format!(
                "ignored fio option {shown} (not supported by snapblk)"
            )));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOBS: &str = "; a fio job file
[global]
filename=/tmp/x.img
ioengine=psync
direct=1
size=1M
bs=4k
group_reporting
norandommap

[seq]
rw=read
iodepth=1

[rand]
stonewall
rw=randread
iodepth=8
numjobs=2
runtime=2
time_based

# fio runs this one together with rand
[mix]
rw=randrw
rwmixwrite=30
bs=64k,64k
";

    #[test]
    fn a_fio_job_file_becomes_jobs_warnings_and_a_target() {
        let f = parse_fio_job_file(JOBS, &JobSpec::default()).unwrap();
        let names: Vec<&str> = f.jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names, ["seq", "rand", "mix"]);
        assert!(f.jobs.iter().all(|j| j.direct && j.size == Some(1 << 20)));
        let (seq, rand, mix) = (&f.jobs[0], &f.jobs[1], &f.jobs[2]);
        assert_eq!((seq.rw, seq.iodepth, seq.runtime), (RwMode::Read, 1, None));
        assert_eq!(
            (rand.rw, rand.iodepth, rand.numjobs),
            (RwMode::RandRead, 8, 2)
        );
        assert!(rand.time_based && rand.runtime == Some(2.0));
        assert_eq!((mix.rw, mix.rwmixread, mix.bs), (RwMode::RandRw, 70, 65536));
        assert!(
            !mix.time_based,
            "options of one job do not leak into the next"
        );
        assert_eq!(f.target.filename.as_deref(), Some("/tmp/x.img"));
        assert_eq!(
            f.target.device_spec(None).unwrap().0,
            "sync:path=/tmp/x.img"
        );
        // One line for norandommap, one for mix running after rand instead of beside it.
        assert_eq!(f.warnings.len(), 2, "{:?}", f.warnings);
        assert!(f.warnings[0].contains("ignored fio option norandommap"));
        assert!(f.warnings[1].contains("\"mix\" runs after \"rand\""));
    }

    #[test]
    fn bad_job_files_say_where() {
        let d = JobSpec::default();
        let e = parse_fio_job_file("[a]\nbs=4k,64k\n", &d)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("--sweep-bs"), "{e}");
        let e = parse_fio_job_file("[global]\nsize=1M\n", &d)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no job sections"), "{e}");
        let e = parse_fio_job_file("[a]\nfilename=x\n[b]\nfilename=y\n", &d)
            .unwrap_err()
            .to_string();
        assert!(e.contains("another filename"), "{e}");
        let e = parse_fio_job_file("[a\n", &d).unwrap_err().to_string();
        assert!(e.contains("bad section"), "{e}");
        let e = parse_fio_job_file("[a]\niodepth\n", &d)
            .unwrap_err()
            .to_string();
        assert!(e.contains("iodepth needs a value"), "{e}");
    }

    #[test]
    fn engines_map_to_drivers_or_fail_in_one_line() {
        let t = |e: &str| FioTarget {
            filename: Some("/dev/shm/f".into()),
            ioengine: Some(e.into()),
            ..Default::default()
        };
        assert_eq!(
            t("io_uring").device_spec(None).unwrap().0,
            "io_uring:path=/dev/shm/f"
        );
        for e in ["sync", "psync", "pvsync2"] {
            assert_eq!(t(e).device_spec(None).unwrap().0, "sync:path=/dev/shm/f");
        }
        let (s, w) = t("libaio").device_spec(None).unwrap();
        assert_eq!(s, "io_uring:path=/dev/shm/f");
        assert!(w.unwrap().contains("libaio"));
        assert_eq!(
            t("null").device_spec(Some(4096)).unwrap().0,
            "null:size=4096"
        );
        assert!(t("null").device_spec(None).is_err());
        let b = FioTarget {
            libblkio_driver: Some("io_uring".into()),
            libblkio_props: vec![("direct".into(), "true".into())],
            ..t("libblkio")
        };
        assert_eq!(
            b.device_spec(None).unwrap().0,
            "io_uring:path=/dev/shm/f,direct=true"
        );
        assert!(t("libblkio").device_spec(None).is_err());
        for e in ["posixaio", "mmap", "splice", "net"] {
            let msg = t(e).device_spec(None).unwrap_err().to_string();
            assert!(
                msg.contains(&format!("ioengine={e} has no snapblk equivalent")),
                "{msg}"
            );
            assert!(!msg.contains('\n'));
        }
        let spec = FioTarget {
            filename: Some("null:size=1M".into()),
            ..Default::default()
        };
        assert_eq!(spec.device_spec(None).unwrap().0, "null:size=1M");
    }

    #[test]
    fn fio_block_sizes() {
        assert_eq!(parse_fio_bs("4k").unwrap(), 4096);
        assert_eq!(parse_fio_bs("4k,4k,4k").unwrap(), 4096);
        assert!(
            parse_fio_bs("4k,64k")
                .unwrap_err()
                .to_string()
                .contains("--sweep-bs")
        );
    }
}
