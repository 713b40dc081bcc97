//! The VABC writer over the real merge-operation sets of Android builds
//! (tests/data/ota/cycle_nodes.tar.xz: serialized `PartitionUpdate`s holding only
//! `merge_operations`, thousands of COW_COPY and COW_XOR ops with `src_offset`, from
//! update_engine's test data). For each: synthetic old and new images laid out by the
//! operations (new = old copied per COW_COPY, fresh bytes per COW_XOR destination), the
//! blocks the operations name packed densely (order and adjacency kept, so every overlap and
//! direction stays as it was) to keep the images small; the partition's install operations
//! made from the merge operations (SOURCE_COPY per COW_COPY, SOURCE_BSDIFF per COW_XOR).
//! Checked: the sequence in the COW is the merge operations' destinations in order, the merge
//! order snapblk-cow's reader derives from it never reads a base block (the extra block of an
//! offset XOR included) an earlier merge step overwrote, every offset XOR reads one block
//! more than it writes, and a merge simulated over the old image ends at the new one — with
//! XOR on, and (for the set made without XOR) on a device without merge sequences.

use std::path::Path;

use prost::Message;
use snapblk_core::MemFile;
use snapblk_core::ReadAt;
use snapblk_cow::{CowReader, OpKind};
use snapblk_ota::testing::vabc::{VabcFields, cow_copy, cow_xor, set_vabc};
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
#[derive(Clone, Copy, Debug)]
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

/// A merge order for `ops` (which the data files hold unordered, cycles included): an op
/// that reads blocks another op writes merges before it; ready ops go by destination; when
/// only cycles remain, an op is dropped (the one most ops wait for, XOR preferred) — written
/// as raw data — as update_engine's generator does. Returns the order and the dropped count.
fn order(ops: &[Op]) -> (Vec<Op>, usize) {
    let n = ops.len();
    let mut by_dst: Vec<usize> = (0..n).collect();
    by_dst.sort_by_key(|&i| ops[i].dst);
    for w in by_dst.windows(2) {
        let (a, b) = (ops[w[0]], ops[w[1]]);
        assert!(a.dst + a.dn <= b.dst, "destinations overlap: {a:?} {b:?}");
    }
    let mut out_edges: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut indeg = vec![0usize; n];
    for (r, o) in ops.iter().enumerate() {
        if o.identity() {
            continue;
        }
        let (s, e) = (o.src, o.src + o.sn);
        let first = by_dst.partition_point(|&i| ops[i].dst + ops[i].dn <= s);
        for &w in by_dst[first..].iter().take_while(|&&i| ops[i].dst < e) {
            if w != r && !ops[w].identity() {
                out_edges[r].push(w);
                indeg[w] += 1;
            }
        }
    }
    let mut done = vec![false; n];
    let mut ready: std::collections::BTreeSet<(u64, usize)> = (0..n)
        .filter(|&i| indeg[i] == 0)
        .map(|i| (ops[i].dst, i))
        .collect();
    let (mut out, mut dropped, mut left) = (Vec::new(), 0, n);
    let finish = |i: usize,
                  indeg: &mut Vec<usize>,
                  ready: &mut std::collections::BTreeSet<(u64, usize)>,
                  done: &mut Vec<bool>| {
        done[i] = true;
        for &w in &out_edges[i] {
            indeg[w] -= 1;
            if indeg[w] == 0 && !done[w] {
                ready.insert((ops[w].dst, w));
            }
        }
    };
    while left > 0 {
        if let Some((_, i)) = ready.pop_first() {
            out.push(ops[i]);
            finish(i, &mut indeg, &mut ready, &mut done);
        } else {
            let i = (0..n)
                .filter(|&i| !done[i])
                .max_by_key(|&i| (out_edges[i].len(), ops[i].xor, usize::MAX - i))
                .unwrap();
            dropped += 1;
            finish(i, &mut indeg, &mut ready, &mut done);
        }
        left -= 1;
    }
    (out, dropped)
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
    let mut want = std::collections::HashMap::new();
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
            want.insert(o.dst + k, w);
        }
    }
    for op in cow.data_ops() {
        let got = match op.kind {
            OpKind::Copy { source_block } => ("copy", source_block * bs),
            OpKind::Xor { source_offset, .. } => ("xor", source_offset),
            _ => ("replace", 0),
        };
        if let Some(w) = want.get(&op.new_block) {
            assert_eq!(got, *w, "{name}: block {}", op.new_block);
        } else {
            assert_eq!(
                got.0, "replace",
                "{name}: block {} has no merge op",
                op.new_block
            );
        }
    }
}

#[test]
fn real_merge_sets_give_a_consistent_sequence_and_merge_order() {
    for (name, p) in sets() {
        let all = ops_of(&p);
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
        let blocks = all
            .iter()
            .map(|o| (o.src + o.sn).max(o.dst + o.dn))
            .max()
            .unwrap();
        eprintln!(
            "{name}: {} merge ops ({copies} copy, {xors} xor, {offset_xors} with an offset), {dropped} dropped to break cycles, {blocks} blocks",
            all.len()
        );
        let p = partition(&name, &all, &merge, blocks);
        let mut by_dst = all.clone();
        by_dst.sort_by_key(|o| o.dst);
        let old = Laid {
            ops: Vec::new(),
            blocks,
            old: true,
        };
        let new = Laid {
            ops: by_dst,
            blocks,
            old: false,
        };
        let profiles: &[DeviceProfile] = if xors > 0 {
            &[DeviceProfile::CURRENT]
        } else {
            &[DeviceProfile::CURRENT, DeviceProfile::LEGACY]
        };
        for &profile in profiles {
            let cow = if profile.xor {
                // v3 without compression; the sink keeps the header, sequence and op records
                // and drops the payloads (which the checks do not read).
                let pr = params(&p, 3, "none");
                let keep = (8 << 20) + 24 * pr.op_count_max + 4 * blocks;
                let sink = MetaOnly::new(keep);
                write_vabc_cow(&p, &pr, profile, Some(&old), &new, &sink).unwrap();
                CowReader::open(sink.into_sparse()).unwrap()
            } else {
                let sink = MemFile::new(Vec::new());
                write_vabc_cow(&p, &params(&p, 2, "lz4"), profile, Some(&old), &new, &sink)
                    .unwrap();
                let v = sink.into_inner();
                let n = v.len() as u64;
                CowReader::open(Sparse(v, n)).unwrap()
            };
            check_cow(&name, &cow, &p, &merge, blocks, profile);
        }
    }
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
        for (i, x) in buf[..n].iter_mut().enumerate() {
            *x = self.0.get(offset as usize + i).copied().unwrap_or(0);
        }
        Ok(n)
    }
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.1)
    }
}

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
            "{name}: window at block {lo}: {} ops ({} xor with an offset), {dropped} dropped",
            part.len(),
            part.iter().filter(|o| o.xor && o.off > 0).count()
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
