//! The COW record (`COW.snapblk`, see `snapblk_cow::record`) for a snapshot device: loading it
//! beside the COW, checking that it describes this COW and this base, and turning a merge
//! binding verdict into a refusal before a merge writes anything.

use crate::error::{Result, SnapError};
use snapblk_core::sync::lock;
use snapblk_cow::record::{self, MergeBinding, MergeVerdict, Record, RecordCheck, Verifier};
use snapblk_cow::{CowReader, OpenOptions, ReadAt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Blocks named in a message before "and N more".
const NAMED: usize = 8;

fn record_err(path: &Path) -> impl FnOnce(record::RecordError) -> SnapError + '_ {
    move |source| SnapError::Record {
        path: path.to_owned(),
        source,
    }
}

/// Load the record of `cow` (`record`, else `COW.snapblk` when it exists) and check that it
/// describes this COW and a base of this size; with `eager`, also check every base block the
/// COW reads and the SHA-256 of the whole base. `Ok(None)` when there is no record (an error
/// with `eager`: the base cannot be verified).
pub fn load_verifier(
    base: &Path,
    cow: &Path,
    record: Option<&Path>,
    eager: bool,
) -> Result<Option<Arc<Verifier>>> {
    let open_base = || -> Result<std::fs::File> {
        std::fs::File::open(base).map_err(|e| SnapError::Io {
            what: "opening base",
            source: e.into(),
        })
    };
    load_with(
        BaseSource::File(&open_base),
        &base.display(),
        cow,
        record,
        eager,
    )
}

/// [`load_verifier`] for a base that is a device (an `rbd:` image, say, opened by the caller,
/// e.g. as a [`crate::BlkioDev`]): the same checks, every base block read through `base`.
/// `name` names the base in messages.
pub fn load_verifier_dev(
    base: &dyn ReadAt,
    name: &str,
    cow: &Path,
    record: Option<&Path>,
    eager: bool,
) -> Result<Option<Arc<Verifier>>> {
    load_with(BaseSource::Dev(base), &name, cow, record, eager)
}

/// Where [`load_with`] reads the base: a file opened once the record is found, or a device.
enum BaseSource<'a> {
    File(&'a dyn Fn() -> Result<std::fs::File>),
    Dev(&'a dyn ReadAt),
}

fn load_with(
    base: BaseSource<'_>,
    base_name: &dyn std::fmt::Display,
    cow: &Path,
    record: Option<&Path>,
    eager: bool,
) -> Result<Option<Arc<Verifier>>> {
    let path: PathBuf = record.map_or_else(|| record::sidecar_path(cow), Path::to_owned);
    // The record (read, checksummed, parsed) and the COW (opened, its ops parsed) are
    // independent: load them on two threads; their results are looked at in the order the
    // checks have always had (no record means no COW error either).
    let open_cow = || -> Result<(std::fs::File, CowReader<std::fs::File>)> {
        let f = std::fs::File::open(cow).map_err(|e| SnapError::Io {
            what: "opening COW",
            source: e.into(),
        })?;
        let reader = CowReader::open_with(
            f.try_clone().map_err(|e| SnapError::Io {
                what: "opening COW",
                source: e.into(),
            })?,
            OpenOptions::default(),
        )?;
        Ok((f, reader))
    };
    let (loaded, opened) = std::thread::scope(|sc| {
        let h = std::thread::Builder::new()
            .name("snap-record".into())
            .spawn_scoped(sc, || Record::load(&path));
        let opened = open_cow();
        let loaded = match h {
            Ok(h) => h.join().unwrap_or_else(|_| Record::load(&path)),
            Err(_) => Record::load(&path),
        };
        (loaded, opened)
    });
    let rec = match loaded.map_err(record_err(&path))? {
        Some(r) => r,
        None if record.is_some() => {
            return Err(SnapError::Config(format!(
                "COW record {} does not exist",
                path.display()
            )));
        }
        None if eager => return Err(no_record_to_verify(&path)),
        None => return Ok(None),
    };
    let (cow_f, reader) = opened?;
    let base_file;
    let base_dev: &dyn ReadAt = match base {
        BaseSource::File(open) => {
            base_file = open()?;
            &base_file
        }
        BaseSource::Dev(d) => d,
    };
    check_loaded(&rec, &reader, &cow_f, base_dev, base_name, &path, eager)?;
    Ok(Some(shared(&cow_f, base_dev.as_file(), &path, rec)))
}

/// verify-base was asked for, and there is no record to verify the base against.
fn no_record_to_verify(looked: &Path) -> SnapError {
    SnapError::Config(format!(
        "verify-base needs a COW record, and none was found ({}; `snapblk cow record` writes one)",
        looked.display()
    ))
}

/// [`load_verifier_dev`] for a COW that is not a file (an object read through the `s3` / `http`
/// driver) and a record fetched by the caller (`None`: there is none); `record_name` names it
/// (or where it was looked for) in messages. The same checks; the verifier is this open's own.
pub(crate) fn load_verifier_fetched(
    base: &dyn ReadAt,
    base_name: &str,
    cow: &dyn ReadAt,
    record: Option<Record>,
    record_name: &str,
    eager: bool,
) -> Result<Option<Arc<Verifier>>> {
    let path = PathBuf::from(record_name);
    let Some(rec) = record else {
        return if eager {
            Err(no_record_to_verify(&path))
        } else {
            Ok(None)
        };
    };
    let reader = CowReader::open_with(cow, OpenOptions::default())?;
    check_loaded(&rec, &reader, cow, base, &base_name, &path, eager)?;
    Ok(Some(Arc::new(Verifier::new(rec))))
}

/// The checks of a loaded record: it describes this COW (`reader` over `cow`) and a base of
/// this size; with `eager`, before a merge has started, every base block the COW reads and the
/// SHA-256 of the whole base match it.
fn check_loaded<R: ReadAt>(
    rec: &Record,
    reader: &CowReader<R>,
    cow: &dyn ReadAt,
    base_dev: &dyn ReadAt,
    base_name: &dyn std::fmt::Display,
    path: &Path,
    eager: bool,
) -> Result<()> {
    rec.check_binding(reader).map_err(record_err(path))?;
    let base_len = base_dev.size().map_err(|e| SnapError::Io {
        what: "sizing base",
        source: e.into(),
    })?;
    // A shrinking update's finished merge leaves the base at the new image's size.
    if base_len != rec.base_size && base_len != rec.target_size {
        return Err(SnapError::WrongBase(format!(
            "base {base_name} is {base_len} bytes; this COW was made for a base of {} bytes",
            rec.base_size
        )));
    }
    // The whole-base checks hold only before the merge has written anything: a merge in
    // progress (counted ops, or a first window staged in scratch) is bound to its base by
    // `Snapshot::check_merge_base` instead.
    let h = reader.header();
    let started = h.num_merge_ops > 0 || {
        let mut state = [0u8; 1];
        h.buffer_size > 0
            && cow
                .read_exact_at(u64::from(h.header_size), &mut state)
                .is_ok()
            && state[0] == crate::snapshot::scratch_state::DONE
    };
    if eager && !started {
        let mut check = RecordCheck::default();
        record::check_base(rec, base_dev, &mut check).map_err(record_err(path))?;
        if !check.base_mismatches.is_empty() {
            return Err(SnapError::WrongBase(format!(
                "base {base_name} is not the image this COW was made for: {} of the {} blocks it reads differ from the record (blocks {})",
                check.base_mismatches.len(),
                check.base_blocks_checked,
                name_blocks(&check.base_mismatches)
            )));
        }
        // A base grown for a growing update holds the old image in its first base_size bytes.
        let old_len = base_len.min(rec.base_size);
        let got = record::sha256_of_first(base_dev, old_len).map_err(|e| SnapError::Io {
            what: "hashing base",
            source: e.into(),
        })?;
        if got != rec.base_sha256 {
            return Err(SnapError::WrongBase(format!(
                "base {base_name} has SHA-256 {}, the COW record expects {}",
                record::hex(&got),
                record::hex(&rec.base_sha256)
            )));
        }
    }
    Ok(())
}

/// One verifier per (COW file, record file) in the process, so every open of the same snapshot
/// (the driver's and an export's zero-copy planner's) shares what has been verified.
/// The key includes the base: a block that passed over one base says nothing about another.
/// A base without a file (a device) gets a verifier of its own.
fn shared(
    cow: &std::fs::File,
    base: Option<&std::fs::File>,
    rec_path: &Path,
    rec: Record,
) -> Arc<Verifier> {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;
    use std::sync::{Mutex, OnceLock, Weak};
    type Key = [u64; 8];
    static ALL: OnceLock<Mutex<HashMap<Key, Weak<Verifier>>>> = OnceLock::new();
    let Some(base) = base else {
        return Arc::new(Verifier::new(rec));
    };
    let key = match (cow.metadata(), base.metadata(), std::fs::metadata(rec_path)) {
        (Ok(c), Ok(b), Ok(r)) => [
            c.dev(),
            c.ino(),
            b.dev(),
            b.ino(),
            r.dev(),
            r.ino(),
            r.mtime() as u64,
            r.mtime_nsec() as u64,
        ],
        _ => return Arc::new(Verifier::new(rec)),
    };
    let mut all = lock(ALL.get_or_init(Default::default));
    all.retain(|_, w| w.strong_count() > 0);
    if let Some(v) = all.get(&key).and_then(Weak::upgrade)
        && *v.record() == rec
    {
        return v;
    }
    let v = Arc::new(Verifier::new(rec));
    all.insert(key, Arc::downgrade(&v));
    v
}

/// `1, 2, 3 and 5 more`.
pub(crate) fn name_blocks(v: &[u64]) -> String {
    let mut s = v
        .iter()
        .take(NAMED)
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if v.len() > NAMED {
        s.push_str(&format!(" and {} more", v.len() - NAMED));
    }
    s
}

/// The refusal a merge owes the user for `b`, or `None` when the merge may go on.
pub(crate) fn merge_refusal(b: &MergeBinding, merged: usize) -> Option<SnapError> {
    let msg = match b.verdict {
        MergeVerdict::NotStarted | MergeVerdict::InProgress | MergeVerdict::Complete => {
            return None;
        }
        MergeVerdict::ProgressOfAnotherFile => format!(
            "the COW counts {merged} merged ops, but every block it reads here still holds its old data and the merged blocks do not hold the new: that progress was made on another file; nothing was written. To merge into this base, reset the COW's progress with `snapblk merge --reset-progress`"
        ),
        MergeVerdict::AlreadyUpdated => "this base already holds the new image (every block the COW writes matches the record); merging again would corrupt it, so nothing was written".to_owned(),
        MergeVerdict::WrongBase => {
            let mut m = String::from(
                "base is not the file this COW's merge belongs to; nothing was written:",
            );
            if !b.source_mismatches.is_empty() {
                m.push_str(&format!(
                    " {} of the {} blocks still to be read differ from the record (blocks {})",
                    b.source_mismatches.len(),
                    b.source_blocks_checked,
                    name_blocks(&b.source_mismatches)
                ));
            }
            if !b.merged_mismatches.is_empty() {
                m.push_str(&format!(
                    "{} {} of the {} blocks already merged do not hold the new data (blocks {})",
                    if b.source_mismatches.is_empty() { "" } else { ";" },
                    b.merged_mismatches.len(),
                    b.merged_blocks_checked,
                    name_blocks(&b.merged_mismatches)
                ));
            }
            m
        }
    };
    Some(SnapError::WrongBase(msg))
}
