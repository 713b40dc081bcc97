//! A device spec (`rbd:pool=p,image=i`, `sync:path=F`) as the output of `cow apply --in-place`:
//! which device it names (so it is never an input too), and writing it through its driver.

use anyhow::{Context, Result, bail};
use snapblk_cow::{ReadAt, WriteAt};
use snapblk_snapshot::BlkioDev;
use std::path::{Path, PathBuf};

/// The last value of property `key` in a spec.
fn prop<'a>(s: &'a snapblk::Spec, key: &str) -> Option<&'a str> {
    s.props
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The RBD image a spec names: (pool, namespace, image). The cluster's name (`mon-host`,
/// `conf`) is left out on purpose: one cluster has many names, so two specs that differ only
/// there are taken for the same image.
fn rbd_image(s: &snapblk::Spec) -> Option<(&str, &str, &str)> {
    (s.driver == "rbd").then(|| {
        (
            prop(s, "pool").unwrap_or(""),
            prop(s, "namespace").unwrap_or(""),
            prop(s, "image").unwrap_or(""),
        )
    })
}

/// The file an argument stands for: itself for a path, the `path` property of a device spec of
/// a file-backed driver, none for other devices.
fn file_of(arg: &Path, spec: Option<&snapblk::Spec>) -> Option<PathBuf> {
    match spec {
        None => Some(arg.to_owned()),
        Some(s) => prop(s, "path").map(PathBuf::from),
    }
}

/// Refuse an output (`out`, a device spec when `out_spec` is set) that is one of the inputs
/// (each a path or a device spec): the same RBD image (pool, namespace, image), or the same
/// file, compared as [`crate::outfile::refuse_alias`] compares files.
pub(crate) fn refuse_alias(
    flag: &str,
    out: &Path,
    out_spec: Option<&snapblk::Spec>,
    inputs: &[(&str, &Path, Option<&snapblk::Spec>)],
) -> Result<()> {
    if let Some(o) = out_spec.and_then(rbd_image) {
        for (what, p, s) in inputs {
            if s.and_then(rbd_image) == Some(o) {
                bail!(
                    "{flag} {} and {what} {} name the same RBD image ({}/{}{}): an output is never an input; nothing written",
                    out.display(),
                    p.display(),
                    o.0,
                    if o.1.is_empty() {
                        String::new()
                    } else {
                        format!("{}/", o.1)
                    },
                    o.2
                );
            }
        }
    }
    let Some(out_file) = file_of(out, out_spec) else {
        return Ok(());
    };
    let files: Vec<(&str, PathBuf)> = inputs
        .iter()
        .filter_map(|(what, p, s)| file_of(p, *s).map(|f| (*what, f)))
        .collect();
    let refs: Vec<(&str, &Path)> = files.iter().map(|(w, f)| (*w, f.as_path())).collect();
    crate::outfile::refuse_alias(flag, &out_file, &refs)
}

/// Open the device of an output spec read-write (its driver's lock: exclusive for `rbd`).
pub(crate) fn open(out: &Path, spec: &snapblk::Spec) -> Result<BlkioDev> {
    snapblk::open_child(&spec.driver, &spec.props, true)
        .and_then(BlkioDev::new)
        .with_context(|| format!("open {}", out.display()))
}

/// Make the device at least `len` bytes: grow it through its driver (an RBD image), or fail for
/// a device that cannot grow, before anything is written.
pub(crate) fn grow_to(dev: &BlkioDev, out: &Path, len: u64) -> Result<()> {
    let have = dev.size()?;
    if have >= len {
        return Ok(());
    }
    dev.resize(len).with_context(|| {
        format!(
            "{} is {have} bytes, smaller than the {len}-byte image, and cannot be grown",
            out.display()
        )
    })
}

/// After the image is written and flushed: a device larger than the image is shrunk to its
/// size when its driver can resize (an RBD image ends as a file does); others keep their size.
pub(crate) fn fit(dev: &BlkioDev, out: &Path, len: u64) -> Result<()> {
    dev.sync_data()
        .with_context(|| format!("flush {}", out.display()))?;
    if dev.size()? <= len {
        return Ok(());
    }
    match dev.resize(len) {
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Ok(()),
        r => r.with_context(|| format!("shrinking {} to {len} bytes", out.display())),
    }
}

/// Sequential writes into a device from offset 0 (`cow apply`'s image stream); a flush is the
/// device's.
pub(crate) struct DevWriter<'a> {
    dev: &'a BlkioDev,
    pos: u64,
}

impl<'a> DevWriter<'a> {
    pub(crate) fn new(dev: &'a BlkioDev) -> Self {
        DevWriter { dev, pos: 0 }
    }
}

impl std::io::Write for DevWriter<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.dev.write_all_at(self.pos, b)?;
        self.pos += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.dev.sync_data()
    }
}
