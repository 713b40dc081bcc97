//! The pre-merge check run by `merge` itself (issue 19, item 4): a merge that could not finish
//! is refused before the first write of the run — also a resumed merge (over the ops it has
//! still to merge) and a merge the driver runs on its own thread (`merge=true`) — and leaves base
//! and COW byte-identical.

use snapblk_core::{Driver, PropValue, State};
use snapblk_snapshot::synth::{SynthCase, SynthSpec, generate};
use snapblk_snapshot::{
    MergeOptions, MergeState, MergeStep, OpKind, OpenMode, Payload, SnapError, SnapshotConfig,
    SnapshotDriver, merge, open_files, precheck,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const RW: OpenMode = OpenMode {
    base_writable: true,
    cow_writable: true,
};

struct Files {
    _dir: tempfile::TempDir,
    base: PathBuf,
    cow: PathBuf,
    case: SynthCase,
}

/// A v3 lz4 COW with a scratch area, ordered windows and several REPLACE batches (256 ops
/// each), as files.
fn lz4_files(seed: u64) -> Files {
    let spec = SynthSpec {
        blocks: 4096,
        scratch_size: 2 << 20,
        chain_len: 200,
        chains: 3,
        random_ordered: 300,
        replaces: 900,
        zeros: 16,
        ..SynthSpec::default()
    };
    let mut case = generate(&spec, seed);
    // Compressible REPLACE data, so lz4 stores it compressed.
    let bs = case.layout.block_size as usize;
    for op in &case.ops {
        if let OpKind::Replace { payload, .. } = op.kind {
            let mut t = Vec::new();
            let mut k = 0;
            while t.len() < bs {
                t.extend_from_slice(
                    format!("block {} line {k} of text\n", op.new_block).as_bytes(),
                );
                k += 1;
            }
            let at = payload.offset as usize;
            case.cow[at..at + bs].copy_from_slice(&t[..bs]);
            let d = op.new_block as usize * bs;
            case.target[d..d + bs].copy_from_slice(&t[..bs]);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let opts = snapblk_cow::WriterOptions {
        codec: snapblk_cow::Codec::new(snapblk_cow::Compression::Lz4),
        ..Default::default()
    };
    let (base, cow) = case.write_files(dir.path(), opts).unwrap();
    Files {
        _dir: dir,
        base,
        cow,
        case,
    }
}

fn bytes(f: &Files) -> (Vec<u8>, Vec<u8>) {
    (
        std::fs::read(&f.base).unwrap(),
        std::fs::read(&f.cow).unwrap(),
    )
}

/// The compressed payloads of the COW's ops, by merge index (from the snapshot's own map).
fn compressed_payloads(base: &Path, cow: &Path) -> Vec<(usize, Payload)> {
    let s = open_files(base, cow, SnapshotConfig::default(), OpenMode::default()).unwrap();
    s.map()
        .ops()
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o.kind {
            OpKind::Replace { payload, .. } | OpKind::Xor { payload, .. }
                if payload.codec != snapblk_snapshot::Codec::None =>
            {
                Some((i, payload))
            }
            _ => None,
        })
        .collect()
}

fn corrupt(cow: &Path, p: &Payload) {
    let mut c = std::fs::read(cow).unwrap();
    c[p.offset as usize..(p.offset + u64::from(p.stored_len)) as usize].fill(0xFF);
    std::fs::write(cow, c).unwrap();
}

#[test]
fn an_undecodable_payload_is_refused_before_the_first_write() {
    let f = lz4_files(3);
    let list = compressed_payloads(&f.base, &f.cow);
    let &(last, p) = list.last().unwrap();
    corrupt(&f.cow, &p);
    let before = bytes(&f);
    let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
    let e = precheck(&s, &MergeOptions::default()).unwrap_err();
    assert!(
        matches!(e, SnapError::UndecodablePayload { op, .. } if op == last),
        "{e}"
    );
    let e = merge(&s, MergeOptions::default()).unwrap_err();
    assert!(matches!(e, SnapError::UndecodablePayload { .. }), "{e}");
    // The decoder's words are the source, not repeated in the message.
    assert!(std::error::Error::source(&e).is_some());
    drop(s);
    assert!(
        bytes(&f) == before,
        "base or COW changed by a refused merge"
    );
}

#[test]
fn a_resumed_merge_checks_the_ops_it_has_still_to_merge() {
    let f = lz4_files(5);
    let ordered = {
        let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
        s.map().ordered_len()
    };
    // Stop the merge after its first REPLACE batch is committed.
    let stop = AtomicBool::new(false);
    let hook = |st: MergeStep| {
        if let MergeStep::Committed { merged } = st
            && merged > ordered
        {
            stop.store(true, Ordering::Relaxed);
        }
    };
    let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
    let r = merge(
        &s,
        MergeOptions {
            stop: Some(&stop),
            hook: Some(&hook),
            ..Default::default()
        },
    );
    assert!(matches!(r, Err(SnapError::Interrupted)), "{r:?}");
    let merged = s.merge_progress().0;
    drop(s);
    assert!(merged > ordered && merged < f.case.ops.len(), "{merged}");
    let list = compressed_payloads(&f.base, &f.cow);
    // A corrupt payload of an op already merged does not stop the rest: it is never read again.
    let done = list.iter().find(|(i, _)| *i < merged).unwrap().1;
    let todo = list.iter().find(|(i, _)| *i >= merged).unwrap().1;
    let pristine = std::fs::read(&f.cow).unwrap();
    corrupt(&f.cow, &todo);
    let before = bytes(&f);
    let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
    let e = merge(&s, MergeOptions::default()).unwrap_err();
    assert!(matches!(e, SnapError::UndecodablePayload { .. }), "{e}");
    drop(s);
    assert!(
        bytes(&f) == before,
        "base or COW changed by a refused resume"
    );
    std::fs::write(&f.cow, pristine).unwrap();
    corrupt(&f.cow, &done);
    let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
    let pre = precheck(&s, &MergeOptions::default()).unwrap();
    assert_eq!(pre.from_op, merged);
    let rep = merge(&s, MergeOptions::default()).unwrap();
    assert_eq!(rep.resumed_at, merged);
    drop(s);
    assert!(std::fs::read(&f.base).unwrap() == f.case.target);
}

#[test]
fn a_merge_the_driver_runs_is_refused_before_its_first_write() {
    let f = lz4_files(7);
    let list = compressed_payloads(&f.base, &f.cow);
    corrupt(&f.cow, &list.last().unwrap().1);
    let before = bytes(&f);
    let mut d = SnapshotDriver::new();
    let s = |p: &Path| PropValue::Str(p.display().to_string());
    d.set_prop("base", s(&f.base), State::Created).unwrap();
    d.set_prop("cow", s(&f.cow), State::Created).unwrap();
    d.set_prop("merge", PropValue::Bool(true), State::Created)
        .unwrap();
    d.connect(false).unwrap();
    let st = d.activity().merge().wait(Duration::from_secs(120));
    assert_eq!(st.state, MergeState::Failed, "{st:?}");
    assert!(
        st.error
            .as_deref()
            .unwrap_or("")
            .contains("does not decode"),
        "{st:?}"
    );
    assert_eq!(st.merged, 0);
    drop(d);
    assert!(
        bytes(&f) == before,
        "base or COW changed by a refused merge"
    );
}

#[test]
fn without_scratch_an_xor_reading_its_own_destination_is_refused_up_front() {
    // Unaligned XOR sources in shift chains read their own destination; the chains come after
    // nothing else in the merge order, so the old engine merged windows before it got there.
    for seed in 0..20 {
        let spec = SynthSpec {
            blocks: 512,
            scratch_size: 0,
            chain_len: 40,
            chains: 3,
            random_ordered: 60,
            unaligned_xor: true,
            ..SynthSpec::default()
        };
        let case = generate(&spec, seed);
        let bs = 4096u64;
        let Some(bad) = case.ops.iter().position(|o| match o.kind {
            OpKind::Xor { src_byte, .. } => {
                (src_byte / bs..(src_byte + bs).div_ceil(bs)).contains(&o.new_block)
            }
            _ => false,
        }) else {
            continue;
        };
        if bad == 0 {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let opts = snapblk_cow::WriterOptions {
            scratch_size: 0,
            ..Default::default()
        };
        let (base, cow) = case.write_files(dir.path(), opts).unwrap();
        let before = (std::fs::read(&base).unwrap(), std::fs::read(&cow).unwrap());
        let s = open_files(&base, &cow, SnapshotConfig::default(), RW).unwrap();
        let e = precheck(&s, &MergeOptions::default()).unwrap_err();
        assert!(matches!(e, SnapError::MergeOrder(_)), "{e}");
        assert!(e.to_string().contains("reads its own destination"), "{e}");
        let e = merge(&s, MergeOptions::default()).unwrap_err();
        assert!(matches!(e, SnapError::MergeOrder(_)), "{e}");
        drop(s);
        let after = (std::fs::read(&base).unwrap(), std::fs::read(&cow).unwrap());
        assert!(after == before, "seed {seed}: refused merge wrote");
        return;
    }
    panic!("no seed made an XOR reading its own destination after the first op");
}

#[test]
fn a_good_cow_passes_and_the_report_says_what_was_checked() {
    let f = lz4_files(9);
    let n = compressed_payloads(&f.base, &f.cow).len() as u64;
    let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
    let rep = merge(&s, MergeOptions::default()).unwrap();
    let pre = &rep.precheck;
    assert!(pre.order_valid && pre.scratch);
    assert_eq!(pre.payloads_decoded, n);
    assert_eq!(pre.ops_checked, f.case.ops.len());
    assert_eq!(pre.from_op, 0);
    drop(s);
    assert!(std::fs::read(&f.base).unwrap() == f.case.target);
}

/// Counts the payloads it decodes (through the real codecs).
#[derive(Default)]
struct Counting(std::sync::atomic::AtomicU64);

impl snapblk_snapshot::Decoder for Counting {
    fn decode(
        &self,
        codec: snapblk_snapshot::Codec,
        src: &[u8],
        out: &mut [u8],
    ) -> Result<(), snapblk_cow::DecodeError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        snapblk_snapshot::CowDecoder.decode(codec, src, out)
    }
}

/// A COW file that counts the bytes read from it.
struct CountingDev(snapblk_snapshot::FileDev, std::sync::atomic::AtomicU64);

impl snapblk_core::ReadAt for CountingDev {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read_at(offset, buf)?;
        self.1.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn size(&self) -> std::io::Result<u64> {
        self.0.size()
    }
}

impl snapblk_core::WriteAt for CountingDev {
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.0.write_all_at(offset, buf)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
}

/// What [`merge_counting`] saw.
struct Counted {
    /// Payloads decoded in all (check and merge).
    decodes: u64,
    /// Bytes read from the COW in all.
    cow_read: u64,
    rep: snapblk_snapshot::MergeReport,
}

/// Merge `f` with the check keeping `keep` bytes of decoded units (with a COW record: the check
/// computes every block and compares it with the record).
fn merge_counting(f: &Files, keep: u64, record: bool) -> Counted {
    use snapblk_snapshot::{FileDev, Snapshot, SnapshotMap, SnapshotParts};
    use std::sync::Arc;
    let (map, layout) = {
        let s = open_files(
            &f.base,
            &f.cow,
            SnapshotConfig::default(),
            OpenMode::default(),
        )
        .unwrap();
        let m = s.map();
        (
            SnapshotMap::new(m.block_size() as u32, m.capacity(), m.ops().to_vec()).unwrap(),
            s.layout(),
        )
    };
    let dec = Arc::new(Counting::default());
    let cow = Arc::new(CountingDev(
        FileDev::open(&f.cow, true).unwrap(),
        Default::default(),
    ));
    let s = Snapshot::open(SnapshotParts {
        base: Arc::new(FileDev::open(&f.base, true).unwrap()),
        cow: cow.clone(),
        map,
        layout,
        decoder: dec.clone(),
        config: SnapshotConfig::default(),
    })
    .unwrap();
    if record {
        let bytes = std::fs::read(&f.cow).unwrap();
        let r = snapblk_cow::CowReader::open(bytes.as_slice()).unwrap();
        let rec = snapblk_cow::record::Record::build(&r, &f.case.base, &f.case.target);
        std::fs::write(snapblk_cow::record::sidecar_path(&f.cow), rec.encode()).unwrap();
        let v = snapblk_snapshot::load_verifier(&f.base, &f.cow, None, false).unwrap();
        s.attach_verifier(v.expect("a record")).unwrap();
    }
    let rep = merge(
        &s,
        MergeOptions {
            pipeline: true,
            keep_decoded: keep,
            ..MergeOptions::default()
        },
    )
    .unwrap();
    drop(s);
    assert!(
        std::fs::read(&f.base).unwrap() == f.case.target,
        "keep {keep}: merged base"
    );
    Counted {
        decodes: dec.0.load(Ordering::Relaxed),
        cow_read: cow.1.load(Ordering::Relaxed),
        rep,
    }
}

#[test]
fn the_merge_takes_the_units_the_check_decoded_instead_of_decoding_them_again() {
    let n = compressed_payloads(&lz4_files(11).base, &lz4_files(11).cow).len() as u64;
    assert!(n > 500, "compressed payloads: {n}");
    let stored: u64 = compressed_payloads(&lz4_files(11).base, &lz4_files(11).cow)
        .iter()
        .map(|(_, p)| u64::from(p.stored_len))
        .sum();
    // Nothing kept: the check decodes every payload, then the merge decodes what it writes.
    let none = merge_counting(&lz4_files(11), 0, false);
    let twice = none.decodes;
    let merge_needs = twice - n;
    assert!(merge_needs > 500, "the merge decoded {merge_needs}");
    assert_eq!(none.rep.units_from_check, 0);
    assert_eq!(none.rep.precheck.kept_units, 0);
    // Everything kept: each payload is decoded once, by the check, and the merge does not read
    // the payloads it has the units of.
    let all = merge_counting(&lz4_files(11), u64::MAX, false);
    assert_eq!(all.decodes, n, "payloads decoded with every unit kept");
    assert_eq!(all.rep.units_from_check, merge_needs);
    assert_eq!(all.rep.precheck.kept_units, n);
    assert!(
        all.cow_read + stored * merge_needs / n / 2 < none.cow_read,
        "COW bytes read: {} with every unit kept, {} with none ({stored} bytes of compressed payloads)",
        all.cow_read,
        none.cow_read
    );
    // A cap of 100 units: the first 100 payloads in merge order are kept, the rest decoded again.
    let unit = 4096;
    let some = merge_counting(&lz4_files(11), 100 * unit, false);
    assert_eq!(some.rep.precheck.kept_units, 100);
    assert_eq!(some.rep.precheck.kept_bytes, 100 * unit);
    assert_eq!(some.rep.units_from_check, 100);
    assert_eq!(some.decodes, twice - 100);
}

#[test]
fn with_a_record_the_units_the_check_computed_the_blocks_from_are_kept() {
    // The record check computes every block the merge writes, decoding exactly the payloads the
    // merge needs: nothing kept, each twice; all kept, each once.
    let none = merge_counting(&lz4_files(12), 0, true);
    let twice = none.decodes;
    assert!(none.rep.precheck.record_new_blocks > 0);
    assert_eq!(none.rep.units_from_check, 0);
    assert!(twice > 1000 && twice.is_multiple_of(2), "decoded {twice}");
    let all = merge_counting(&lz4_files(12), u64::MAX, true);
    let once = all.decodes;
    assert_eq!(once, twice / 2, "payloads decoded with every unit kept");
    assert_eq!(all.rep.units_from_check, once);
    assert_eq!(all.rep.precheck.kept_units, once);
}

/// A v2 COW whose REPLACE ops give their payload's offset themselves (`source`): op 0 stores a
/// raw block at the offset of op 1's lz4 payload (the reader accepts it; the raw block is the
/// 4,096 bytes from there). Both payloads start at the same offset but are different payloads,
/// so the unit the check decoded for op 1 is not op 0's: the merge must write op 0's raw bytes.
#[test]
fn a_kept_unit_is_taken_only_by_its_own_payload() {
    const BS: usize = 4096;
    let dir = tempfile::tempdir().unwrap();
    let (base, cow) = (dir.path().join("base.img"), dir.path().join("shared.cow"));
    std::fs::write(&base, vec![0x5au8; 4 * BS]).unwrap();
    // Block 1: incompressible (stored raw); block 2: text (stored lz4-compressed).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..BS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let text: Vec<u8> = (0..BS).map(|i| b"line of text\n"[i % 13]).collect();
    {
        let file = std::fs::File::create(&cow).unwrap();
        let opts = snapblk_cow::WriterOptions {
            version: 2,
            block_size: BS as u32,
            codec: snapblk_cow::Codec::new(snapblk_cow::Compression::Lz4),
            cluster_ops: 0,
            scratch_size: 0,
            ..Default::default()
        };
        let mut w = snapblk_cow::CowWriter::new(&file, opts).unwrap();
        w.add_raw_blocks(2, &text).unwrap();
        w.add_raw_blocks(1, &noise).unwrap();
        w.finalize().unwrap();
    }
    // Point the raw op's payload at the compressed one's.
    let mut bytes = std::fs::read(&cow).unwrap();
    let (raw_rec, lz4_at) = {
        let r = snapblk_cow::CowReader::open(bytes.as_slice()).unwrap();
        let mut raw_rec = None;
        let mut lz4_at = None;
        for op in r.ops() {
            if let snapblk_cow::OpKind::Replace { payload } = op.kind {
                if payload.codec == snapblk_cow::Compression::None {
                    raw_rec = Some(op.record_offset);
                } else {
                    lz4_at = Some(payload.offset);
                }
            }
        }
        (raw_rec.unwrap() as usize, lz4_at.unwrap())
    };
    bytes[raw_rec + 12..raw_rec + 20].copy_from_slice(&lz4_at.to_le_bytes());
    std::fs::write(&cow, &bytes).unwrap();
    let s = open_files(&base, &cow, SnapshotConfig::default(), RW).unwrap();
    // The raw op comes first in merge order, so the merge meets it before the lz4 op.
    let kinds: Vec<(u64, u64, Option<snapblk_snapshot::Codec>)> = s
        .map()
        .ops()
        .iter()
        .map(|o| match o.kind {
            OpKind::Replace { payload, .. } => (o.new_block, payload.offset, Some(payload.codec)),
            _ => (o.new_block, 0, None),
        })
        .collect();
    assert!(
        kinds.len() == 2
            && kinds[0].0 == 1
            && kinds[0].1 == lz4_at
            && kinds[1].1 == lz4_at
            && kinds[0].2 != kinds[1].2,
        "merge order {kinds:?}"
    );
    let mut want = vec![0u8; 4 * BS];
    s.read(0, &mut want).unwrap();
    assert!(want[BS..2 * BS] == bytes[lz4_at as usize..lz4_at as usize + BS]);
    assert!(want[2 * BS..3 * BS] == text[..]);
    let rep = merge(
        &s,
        MergeOptions {
            keep_decoded: snapblk_snapshot::KEEP_DECODED,
            ..MergeOptions::default()
        },
    )
    .unwrap();
    drop(s);
    let got = std::fs::read(&base).unwrap();
    assert!(
        got[BS..2 * BS] == want[BS..2 * BS],
        "block 1 (the raw op) merged from the lz4 op's kept unit"
    );
    assert!(got == want, "the merged base is the snapshot's image");
    assert_eq!(rep.units_from_check, 1, "the lz4 op took its kept unit");
}
