//! The VABC writer and the merge over the real merge-operation sets of Android builds
//! (tests/data/ota/cycle_nodes.tar.xz: serialized `PartitionUpdate`s holding only
//! `merge_operations`, thousands of COW_COPY and COW_XOR ops with `src_offset`, from
//! update_engine's test data, unordered and with dependency cycles). Each set is ordered by
//! `ota generate`'s own ordering and cycle breaker; the partition's install operations are
//! made from the merge operations (SOURCE_COPY per COW_COPY, SOURCE_BSDIFF per COW_XOR).
//!
//! - Whole sets: the COW written for all of a set's blocks (op records only; contents
//!   modelled as one id per block) holds the kept ops' destinations as its sequence, its
//!   reader's merge order follows it, every offset XOR reads one block more than it writes,
//!   dropped ops are REPLACE, and the merge applied in that order over the old image never
//!   reads a block it already overwrote and ends at the new image on every block the ops
//!   touch — with XOR on, and (for the set made without XOR) on a device without merge
//!   sequences.
//! - Windows: the ops of a 2048-block window of each set, with real bytes, over v2 and v3 and
//!   three codecs: `verify` and snapblk-cow's byte-level simulated merge end at the new image.

use std::path::Path;

use prost::Message;
use snapblk_core::MemFile;
use snapblk_core::ReadAt;
use snapblk_cow::{CowReader, OpKind};
use snapblk_ota::testing::vabc::{VabcFields, cow_copy, cow_xor, order_merge_operations, set_vabc};
use snapblk_ota::{
    CowMergeOpType, CowMergeOperation, DeltaArchiveManifest, DeviceProfile, Extent,
    InstallOperation, OpType, PartitionInfo, PartitionUpdate, VabcParams, vabc_merge_sequence,
    write_vabc_cow,
};
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

const BS: usize = 4096;

fn ext(s: u64, n: u64) -> Extent {
    Extent {
        start_block: Some(s),
        num_blocks: Some(n),
    }
}

fn range(e: &Option<Extent>) -> (u64, u64) {
    let e = e.as_ref().unwrap();
    (e.start_block.unwrap(), e.num_blocks.unwrap())
}

/// The sets, by name.
fn sets() -> Vec<(String, PartitionUpdate)> {
    let d = TempDir::new("ota-cycle-nodes");
    let a = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/ota/cycle_nodes.tar.xz");
    tool_ok("tar", &["-xf", path_str(&a), "-C", path_str(d.path())]);
    let mut v = Vec::new();
    for e in std::fs::read_dir(d.path()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_str().unwrap().to_string();
        let bytes = std::fs::read(&p).unwrap();
        v.push((name, PartitionUpdate::decode(&bytes[..]).unwrap()));
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(v.len(), 7);
    v
}

/// One merge operation, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Op {
    xor: bool,
    src: u64,
    sn: u64,
    dst: u64,
    dn: u64,
    off: u32,
}

impl Op {
    fn identity(&self) -> bool {
        !self.xor && self.src == self.dst
    }
    fn merge_op(&self) -> CowMergeOperation {
        if self.xor {
            cow_xor(self.src, self.sn, self.dst, self.dn, self.off)
        } else {
            cow_copy(self.src, self.dst, self.dn)
        }
    }
}

fn ops_of(p: &PartitionUpdate) -> Vec<Op> {
    p.merge_operations
        .iter()
        .map(|m| {
            let (src, sn) = range(&m.src_extent);
            let (dst, dn) = range(&m.dst_extent);
            Op {
                xor: m.r#type == Some(CowMergeOpType::CowXor as i32),
                src,
                sn,
                dst,
                dn,
                off: m.src_offset.unwrap_or(0),
            }
        })
        .collect()
}

/// The merge order `ota generate` gives `ops` (which the data files hold unordered, cycles
/// included): the generator's own ordering and cycle breaker, run on the set. Returns the
/// ordered operations and the ones dropped to break cycles (written to the COW as REPLACE).
fn order(ops: &[Op]) -> (Vec<Op>, Vec<Op>) {
    let mut by_dst: Vec<Op> = ops.to_vec();
    by_dst.sort_by_key(|o| o.dst);
    for w in by_dst.windows(2) {
        assert!(
            w[0].dst + w[0].dn <= w[1].dst,
            "destinations overlap: {w:?}"
        );
    }
    let protos: Vec<CowMergeOperation> = ops.iter().map(Op::merge_op).collect();
    let (kept, dropped) = order_merge_operations(&protos);
    let unpack = |v: Vec<CowMergeOperation>| {
        ops_of(&PartitionUpdate {
            merge_operations: v,
            ..Default::default()
        })
    };
    (unpack(kept), unpack(dropped))
}

/// Block `b` of the synthetic old image: its number in every word (compresses well).
fn old_block(b: u64, out: &mut [u8]) {
    for w in out.chunks_mut(8) {
        w.copy_from_slice(&(b | 0x5a00_0000_0000_0000).to_le_bytes());
    }
}

/// The new image the operations lay out over the old one, computed per block: a COW_COPY
/// destination holds its source block, a COW_XOR destination fresh bytes, the rest the old.
struct Laid {
    ops: Vec<Op>, // sorted by dst
    blocks: u64,
    old: bool,
}

impl Laid {
    fn block(&self, b: u64, out: &mut [u8]) {
        if !self.old {
            let i = self.ops.partition_point(|o| o.dst + o.dn <= b);
            if let Some(o) = self.ops.get(i).filter(|o| o.dst <= b) {
                if o.xor {
                    for w in out.chunks_mut(8) {
                        w.copy_from_slice(&(b ^ 0x00c3_0000_dead_0000).to_le_bytes());
                    }
                } else {
                    old_block(o.src + (b - o.dst), out);
                }
                return;
            }
        }
        old_block(b, out);
    }
}

impl ReadAt for Laid {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let end = (offset + buf.len() as u64).min(self.blocks * BS as u64);
        let mut blk = [0u8; BS];
        let mut pos = offset;
        while pos < end {
            let b = pos / BS as u64;
            self.block(b, &mut blk);
            let i = (pos % BS as u64) as usize;
            let n = (BS - i).min((end - pos) as usize);
            let at = (pos - offset) as usize;
            buf[at..at + n].copy_from_slice(&blk[i..i + n]);
            pos += n as u64;
        }
        Ok(end.saturating_sub(offset) as usize)
    }
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.blocks * BS as u64)
    }
}

/// The partition for `all` (install ops: SOURCE_COPY per COW_COPY, SOURCE_BSDIFF per
/// COW_XOR, in the file's order) with the merge operations `merge`.
fn partition(name: &str, all: &[Op], merge: &[Op], blocks: u64) -> PartitionUpdate {
    PartitionUpdate {
        partition_name: name.into(),
        new_partition_info: Some(PartitionInfo {
            size: Some(blocks * BS as u64),
            hash: None,
        }),
        operations: all
            .iter()
            .map(|o| InstallOperation {
                r#type: if o.xor {
                    OpType::SourceBsdiff
                } else {
                    OpType::SourceCopy
                } as i32,
                src_extents: vec![ext(o.src, if o.xor { o.dn } else { o.sn })],
                dst_extents: vec![ext(o.dst, o.dn)],
                ..Default::default()
            })
            .collect(),
        merge_operations: merge.iter().map(Op::merge_op).collect(),
        ..Default::default()
    }
}

fn new_blocks(p: &PartitionUpdate) -> u64 {
    p.new_partition_info.as_ref().unwrap().size.unwrap() / BS as u64
}

fn params(p: &PartitionUpdate, version: u32, compression: &str) -> VabcParams {
    let mut manifest = DeltaArchiveManifest {
        block_size: Some(BS as u32),
        ..Default::default()
    };
    let f = VabcFields {
        cow_version: version,
        compression: compression.into(),
        compression_factor: 0,
        batch_writes: false,
        threaded: false,
    };
    set_vabc(&mut manifest, &[&p.partition_name], &f);
    VabcParams::from_manifest(&manifest, p).unwrap()
}

/// The COW checks that need no data: the sequence is every kept op's destination blocks, op
/// by op; the reader's merge order starts with it; no merge step reads a base block an
/// earlier step overwrote (an offset XOR's second block included); each block has the op
/// the rules give it.
fn check_cow<R: ReadAt>(
    name: &str,
    cow: &CowReader<R>,
    p: &PartitionUpdate,
    merge: &[Op],
    old_blocks: u64,
    profile: DeviceProfile,
) {
    let seq = vabc_merge_sequence(p, BS as u32, old_blocks, profile).unwrap();
    assert_eq!(cow.sequence(), &seq[..], "{name}");
    if profile.xor {
        let mut i = 0;
        for o in merge.iter().filter(|o| !o.identity()) {
            let mut got: Vec<u64> = seq[i..i + o.dn as usize]
                .iter()
                .map(|&b| b.into())
                .collect();
            got.sort_unstable();
            assert_eq!(got, (o.dst..o.dst + o.dn).collect::<Vec<_>>(), "{name}");
            i += o.dn as usize;
        }
        assert_eq!(i, seq.len(), "{name}");
        let order: Vec<u64> = cow
            .merge_order()
            .map(|o| o.new_block)
            .take(seq.len())
            .collect();
        let head: Vec<u64> = seq.iter().map(|&b| b.into()).collect();
        assert_eq!(order, head, "{name}");
    } else {
        assert!(seq.is_empty(), "{name}");
    }
    cow.verify_merge_order()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let bs = BS as u64;
    let mut want = vec![None; old_blocks.max(new_blocks(p)) as usize];
    for o in merge.iter().filter(|o| !o.identity()) {
        for k in 0..o.dn {
            let w = if o.xor && profile.xor {
                let end = (o.src + k + 1) * bs + u64::from(o.off);
                if end > old_blocks * bs {
                    ("xor", (o.src + k) * bs)
                } else {
                    ("xor", (o.src + k) * bs + u64::from(o.off))
                }
            } else if o.xor {
                ("replace", 0)
            } else {
                ("copy", (o.src + k) * bs)
            };
            want[(o.dst + k) as usize] = Some(w);
        }
    }
    for op in cow.data_ops() {
        let got = match op.kind {
            OpKind::Copy { source_block } => ("copy", source_block * bs),
            OpKind::Xor { source_offset, .. } => ("xor", source_offset),
            _ => ("replace", 0),
        };
        if let Some(w) = want[op.new_block as usize] {
            assert_eq!(got, w, "{name}: block {}", op.new_block);
        } else {
            assert_eq!(
                got.0, "replace",
                "{name}: block {} has no merge op",
                op.new_block
            );
        }
    }
}

/// The ops' blocks as update_engine's generator would see them: whole images stand for the
/// old and new partitions, but the COW's ops and order do not depend on block contents, so
/// both read as zeros (the writer's cost is then memset, not pattern filling); the contents
/// are modelled in [`Model`] instead.
struct Zeros(u64);

impl ReadAt for Zeros {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.0 * BS as u64)
            .saturating_sub(offset)
            .min(buf.len() as u64) as usize;
        buf[..n].fill(0);
        Ok(n)
    }
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.0 * BS as u64)
    }
}

/// splitmix64: a block's content id from anything that names it.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Synthetic old and new images laid out by a whole merge-operation set, one content id per
/// block instead of 4 KiB (ids stand for block contents: equal ids, equal bytes): old block b
/// is `mix(b)`; the new image has, at a COW_COPY destination, the id of the old block it
/// copies, at a COW_XOR destination a fresh id, and elsewhere the old id. The bytes an XOR
/// reads at a byte offset (`src_offset` into one block and on into the next) are an id mixed
/// from both blocks' ids and the offset, so an XOR is only right if both blocks still hold
/// what the writer read.
struct Model {
    new: Vec<u64>,
}

impl Model {
    fn new(all: &[Op], blocks: u64) -> Model {
        let mut new: Vec<u64> = (0..blocks).map(Model::old).collect();
        let mut set = vec![false; blocks as usize];
        for o in all {
            for k in 0..o.dn {
                let b = o.dst + k;
                assert!(
                    !std::mem::replace(&mut set[b as usize], true),
                    "block {b} twice"
                );
                new[b as usize] = if o.xor { mix(!b) } else { mix(o.src + k) };
            }
        }
        Model { new }
    }
    fn old(b: u64) -> u64 {
        mix(b)
    }
    /// The 4 KiB at byte `off` of an image whose block ids `at` gives.
    fn window(at: impl Fn(u64) -> u64, off: u64) -> u64 {
        let (b, r) = (off / BS as u64, off % BS as u64);
        if r == 0 {
            at(b)
        } else {
            mix(at(b) ^ mix(at(b + 1) ^ mix(r)))
        }
    }
}

/// The merge the device runs, applied in place over the old image in the order snapblk-cow's
/// reader derives from the COW (`merge_order`: the sequence's ops, then the rest): COPY
/// moves a block, XOR sets new = (the old image's current bytes at `source_offset`) ⊕
/// (payload the writer stored, new ⊕ the bytes it read there), REPLACE writes the new
/// block, ZERO zeros. Asserts that no op reads a block an earlier op already changed from the
/// old image (the extra block of an offset XOR included) and returns the image it ends at
/// (block → id) and how many blocks the merge wrote.
fn merge_model<R: ReadAt>(name: &str, cow: &CowReader<R>, m: &Model) -> (Vec<u64>, u64) {
    let bs = BS as u64;
    let blocks = m.new.len() as u64;
    let mut disk: Vec<u64> = (0..blocks).map(Model::old).collect();
    let mut writer = vec![usize::MAX; blocks as usize];
    for (pos, op) in cow.merge_order().enumerate() {
        if let Some((first, n)) = op.source_blocks(bs) {
            assert!(
                first + n <= blocks,
                "{name}: {op:?} reads past the old image"
            );
            for s in first..first + n {
                assert!(
                    disk[s as usize] == Model::old(s),
                    "{name}: merge step {pos} (new block {}) reads old block {s}, which step {} \
                     already overwrote",
                    op.new_block,
                    writer[s as usize]
                );
            }
        }
        let at = |b: u64| disk[b as usize];
        let (d, n) = (op.new_block, op.block_count());
        assert!(d + n <= blocks, "{name}: {op:?} writes past the image");
        let id = match op.kind {
            OpKind::Copy { source_block } => at(source_block),
            OpKind::Xor { source_offset, .. } => {
                let payload = m.new[d as usize] ^ Model::window(Model::old, source_offset);
                Model::window(at, source_offset) ^ payload
            }
            OpKind::Replace { .. } => m.new[d as usize],
            OpKind::Zero => 0,
            _ => unreachable!("merge_order holds data ops only"),
        };
        disk[d as usize] = id;
        for b in d + 1..d + n {
            disk[b as usize] = m.new[b as usize]; // the rest of a multi-block REPLACE
        }
        writer[d as usize..(d + n) as usize].fill(pos);
    }
    let wrote = writer.iter().filter(|&&w| w != usize::MAX).count() as u64;
    (disk, wrote)
}

/// Every real set, whole: the +1-block XOR sources; the generator's order of it (cycle
/// breaker included) keeps or drops every op; the COW written from it holds the sequence of
/// the kept ops, the reader's merge order follows it, each block has the op the rules give
/// it (a dropped op's blocks REPLACE); and the merge run over the set's synthetic images in
/// that order reads no block it already overwrote and ends at the new image on every block
/// the ops touch — with XOR on, and (for the set made without XOR) on a device without merge
/// sequences too.
#[test]
fn real_merge_sets_merge_whole_in_the_generators_order() {
    // Ops the generator's cycle breaker drops from each set (pinned 2026 with its heuristic:
    // the op with the most pending dependants, XOR on a tie); the merge below proves the
    // rest is a safe order whatever the count.
    let want_dropped = [
        ("cycle_nodes_product", 48),
        ("cycle_nodes_product_no_xor", 38),
        ("cycle_nodes_system", 1),
        ("cycle_nodes_system_dlkm", 0),
        ("cycle_nodes_system_ext", 41),
        ("cycle_nodes_vendor", 10),
        ("cycle_nodes_vendor_dlkm", 0),
    ];
    let mut total = 0;
    for ((name, p), (want_name, want_drop)) in sets().into_iter().zip(want_dropped) {
        assert_eq!(name, want_name);
        let all = ops_of(&p);
        total += all.len();
        let (mut copies, mut xors, mut offset_xors) = (0, 0, 0);
        for o in &all {
            if o.xor {
                xors += 1;
                if o.off > 0 {
                    offset_xors += 1;
                    assert_eq!(o.sn, o.dn + 1, "{name}: an offset XOR reads one more block");
                } else {
                    assert_eq!(o.sn, o.dn, "{name}");
                }
            } else {
                copies += 1;
                assert_eq!(o.sn, o.dn, "{name}");
            }
        }
        let (merge, dropped) = order(&all);
        // Every op kept or dropped, none made up.
        let mut both: Vec<Op> = merge.iter().chain(&dropped).copied().collect();
        let mut sorted = all.clone();
        both.sort_unstable();
        sorted.sort_unstable();
        assert!(both == sorted, "{name}: the order keeps or drops every op");
        assert_eq!(
            dropped.len(),
            want_drop,
            "{name}: ops dropped to break cycles"
        );
        let blocks = all
            .iter()
            .map(|o| (o.src + o.sn).max(o.dst + o.dn))
            .max()
            .unwrap();
        eprintln!(
            "{name}: {} merge ops ({copies} copy, {xors} xor, {offset_xors} with an offset), {} dropped to break cycles, {blocks} blocks",
            all.len(),
            dropped.len()
        );
        let p = partition(&name, &all, &merge, blocks);
        let model = Model::new(&all, blocks);
        let img = Zeros(blocks);
        let profiles: &[DeviceProfile] = if xors > 0 {
            &[DeviceProfile::CURRENT]
        } else {
            &[DeviceProfile::CURRENT, DeviceProfile::LEGACY]
        };
        for &profile in profiles {
            let what = format!("{name} {profile:?}");
            let cow = if profile.xor {
                // v3 without compression; the sink keeps the header, sequence and op records
                // and drops the payloads (which the checks do not read).
                let pr = params(&p, 3, "none");
                let keep = (8 << 20) + 24 * pr.op_count_max + 4 * blocks;
                let sink = MetaOnly::new(keep);
                write_vabc_cow(&p, &pr, profile, Some(&img), &img, &sink).unwrap();
                CowReader::open(sink.into_sparse()).unwrap()
            } else {
                let sink = MemFile::new(Vec::new());
                write_vabc_cow(&p, &params(&p, 2, "lz4"), profile, Some(&img), &img, &sink)
                    .unwrap();
                let v = sink.into_inner();
                let n = v.len() as u64;
                CowReader::open(Sparse(v, n)).unwrap()
            };
            // A dropped op's blocks are REPLACE, merged after every ordered op.
            for o in &dropped {
                for b in o.dst..o.dst + o.dn {
                    let op = cow.lookup(b).unwrap();
                    assert!(
                        matches!(op.kind, OpKind::Replace { .. }),
                        "{what}: block {b} of dropped {o:?} is {op:?}"
                    );
                }
            }
            let (disk, wrote) = merge_model(&what, &cow, &model);
            // The merge ends at the new image on every block an op reads or writes.
            let mut touched = 0;
            for o in &all {
                for b in (o.src..o.src + o.sn).chain(o.dst..o.dst + o.dn) {
                    let (got, want) = (disk[b as usize], model.new[b as usize]);
                    assert!(got == want, "{what}: block {b} after the merge");
                    touched += 1;
                }
            }
            // It writes exactly the blocks that change: every destination but the identity
            // copies'.
            let moved: u64 = all.iter().filter(|o| !o.identity()).map(|o| o.dn).sum();
            assert_eq!(wrote, moved, "{what}: blocks the merge wrote");
            eprintln!("{what}: merged {wrote} blocks, {touched} checked");
            check_cow(&what, &cow, &p, &merge, blocks, profile);
        }
    }
    assert!(total > 40_000, "{total} ops in the sets");
}

/// A COW sink that keeps the first `keep` bytes (header, sequence, op records) and only the
/// length of the rest.
struct MetaOnly {
    buf: std::sync::Mutex<Vec<u8>>,
    len: std::sync::atomic::AtomicU64,
}

impl MetaOnly {
    fn new(keep: u64) -> MetaOnly {
        MetaOnly {
            buf: std::sync::Mutex::new(vec![0; keep as usize]),
            len: 0.into(),
        }
    }
    fn into_sparse(self) -> Sparse {
        Sparse(self.buf.into_inner().unwrap(), self.len.into_inner())
    }
}

impl snapblk_cow::WriteAt for MetaOnly {
    fn write_all_at(&self, offset: u64, b: &[u8]) -> std::io::Result<()> {
        let mut v = self.buf.lock().unwrap();
        let keep = v.len() as u64;
        if offset < keep {
            let n = (keep - offset).min(b.len() as u64) as usize;
            v[offset as usize..offset as usize + n].copy_from_slice(&b[..n]);
        }
        self.len.fetch_max(
            offset + b.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl snapblk_cow::CowSink for MetaOnly {
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.len.store(len, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// Bytes, then zeros up to a length.
struct Sparse(Vec<u8>, u64);

impl ReadAt for Sparse {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let end = (offset + buf.len() as u64).min(self.1);
        let n = end.saturating_sub(offset) as usize;
        let have = self.0.len().saturating_sub(offset as usize).min(n);
        if have > 0 {
            buf[..have].copy_from_slice(&self.0[offset as usize..offset as usize + have]);
        }
        buf[have..n].fill(0);
        Ok(n)
    }
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.1)
    }
}

/// The densest 2048-block window of each set with real bytes (synthetic old image, new one
/// laid out by the window's ops, fresh bytes in the XOR blocks): the COW of every version
/// and codec verifies and merges, byte for byte, to the new image.
#[test]
fn real_merge_set_windows_merge_to_the_new_image() {
    const W: u64 = 2048;
    for (name, p) in sets() {
        let all = ops_of(&p);
        let inside = |lo: u64, o: &Op| {
            o.src >= lo && o.dst >= lo && o.src + o.sn <= lo + W && o.dst + o.dn <= lo + W
        };
        let top = all.iter().map(|o| o.dst).max().unwrap();
        let lo = (0..=top / 512)
            .map(|k| k * 512)
            .max_by_key(|&lo| {
                all.iter()
                    .filter(|o| inside(lo, o))
                    .map(|o| 1 + 4 * u64::from(o.xor && o.off > 0))
                    .sum::<u64>()
            })
            .unwrap();
        let part: Vec<Op> = all
            .iter()
            .filter(|o| inside(lo, o))
            .map(|o| Op {
                src: o.src - lo,
                dst: o.dst - lo,
                ..*o
            })
            .collect();
        let (merge, dropped) = order(&part);
        let p = partition(&name, &part, &merge, W);
        let mut by_dst = part.clone();
        by_dst.sort_by_key(|o| o.dst);
        let (old_l, new_l) = (
            Laid {
                ops: Vec::new(),
                blocks: W,
                old: true,
            },
            Laid {
                ops: by_dst,
                blocks: W,
                old: false,
            },
        );
        let mut old = vec![0u8; (W as usize) * BS];
        old_l.read_exact_at(0, &mut old).unwrap();
        let mut new = vec![0u8; (W as usize) * BS];
        new_l.read_exact_at(0, &mut new).unwrap();
        // Fresh bytes in the XOR blocks, so payloads are not all alike.
        let noise = pattern(new.len(), 99);
        for o in part.iter().filter(|o| o.xor) {
            let (a, z) = (o.dst as usize * BS, (o.dst + o.dn) as usize * BS);
            new[a..z].copy_from_slice(&noise[a..z]);
        }
        eprintln!(
            "{name}: window at block {lo}: {} ops ({} xor with an offset), {} dropped",
            part.len(),
            part.iter().filter(|o| o.xor && o.off > 0).count(),
            dropped.len()
        );
        for (version, comp, profile) in [
            (3, "lz4", DeviceProfile::CURRENT),
            (2, "gz", DeviceProfile::CURRENT),
            (2, "none", DeviceProfile::LEGACY),
        ] {
            let what = format!("{name} v{version} {comp} {profile:?}");
            let sink = MemFile::new(Vec::new());
            write_vabc_cow(
                &p,
                &params(&p, version, comp),
                profile,
                Some(&old),
                &new,
                &sink,
            )
            .unwrap();
            let cow = CowReader::open(sink.into_inner()).unwrap();
            check_cow(&what, &cow, &p, &merge, W, profile);
            let r = snapblk_cow::verify(&cow, &old, new.len() as u64, Some(&new))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(r.matches_expected, Some(true), "{what}");
            let mut disk = old.clone();
            snapblk_cow::simulate_merge(&cow, &mut disk).unwrap();
            assert!(disk == new, "{what}: merge ends at the new image");
        }
    }
}
