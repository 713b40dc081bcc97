//! PUFFDIFF operations in incremental payloads: `apply` builds the new images from the old
//! ones. The partitions hold a gzip file (GNU gzip) and a zip archive (Info-ZIP zip) whose
//! blocks are spread over several extents; the PUFFDIFF patches are made with the crate's
//! test patch maker, their inner patches by Debian's `bsdiff` (BSDIFF40) and by
//! `bsdiff-android` (BSDF2, bzip2 and brotli streams), and applied through the payload
//! writer, the plan and the worker pool like every operation. Bad PUFFDIFF patches are
//! refused with one line naming the partition and the operation.

use snapblk_ota::puffin_testing::{Container, Layout, deflates_in, make_puffdiff};
use snapblk_ota::testing::{Blocks, Built, DeltaOp, PayloadBuilder, apply_to_memory};
use snapblk_ota::{OpType, OtaError, Payload};
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

const BS: usize = 4096;

/// Old and new versions of a text (what an app update does to a file).
const TEXT_PY: &str = r#"
import random, sys
r = random.Random(4)
w = b"android update payload partition block extent operation source destination".split()
t = b" ".join(r.choice(w) + b"%d" % r.randrange(100) for _ in range(9000))
open(sys.argv[1] + "/a.txt", "wb").write(t)
open(sys.argv[1] + "/b.txt", "wb").write(t.replace(b"block3", b"BLOCK", 6) + b" the end")
open(sys.argv[1] + "/c.txt", "wb").write(t[::-1])
"#;

/// The bytes of `blocks` of `img`, concatenated (past its end: zeros).
fn gather(img: &[u8], blocks: &Blocks) -> Vec<u8> {
    let mut v = Vec::new();
    for &(s, n) in blocks {
        let (a, b) = (s as usize * BS, (s + n) as usize * BS);
        let mut piece = img
            .get(a.min(img.len())..b.min(img.len()))
            .unwrap_or(&[])
            .to_vec();
        piece.resize(b - a, 0);
        v.extend(piece);
    }
    v
}

/// Write `data` over `blocks` of `img` (growing it), in order.
fn scatter(img: &mut Vec<u8>, blocks: &Blocks, data: &[u8]) {
    let mut at = 0;
    for &(s, n) in blocks {
        let (a, len) = (s as usize * BS, n as usize * BS);
        if img.len() < a + len {
            img.resize(a + len, 0);
        }
        let k = len.min(data.len().saturating_sub(at));
        img[a..a + k].copy_from_slice(&data[at..at + k]);
        at += k;
    }
    assert_eq!(at, data.len(), "the blocks hold the data");
}

/// A BSDIFF40 patch made by Debian's bsdiff.
fn bsdiff(old: &[u8], new: &[u8]) -> Vec<u8> {
    let d = TempDir::new("puffdiff-bsdiff");
    let (o, n, p) = (d.join("old"), d.join("new"), d.join("patch"));
    std::fs::write(&o, old).unwrap();
    std::fs::write(&n, new).unwrap();
    tool_ok("bsdiff", &[path_str(&o), path_str(&n), path_str(&p)]);
    std::fs::read(&p).unwrap()
}

/// A BSDF2 patch (bzip2 control, brotli diff and extra) made by bsdiff-android.
fn bsdf2(old: &[u8], new: &[u8]) -> Vec<u8> {
    use bsdiff_android::CompressionAlgorithm::{Brotli, Bz2};
    let mut p = Vec::new();
    bsdiff_android::diff_bsdf2(old, new, &mut p, Bz2, Brotli, Brotli).unwrap();
    p
}

/// The PUFFDIFF blob from `old`'s `src` blocks to `new`'s `dst` blocks, both holding files of
/// `container`.
fn puffdiff(
    old: &[u8],
    src: &Blocks,
    new: &[u8],
    dst: &Blocks,
    container: Container,
    inner: fn(&[u8], &[u8]) -> Vec<u8>,
) -> Vec<u8> {
    let (s, d) = (gather(old, src), gather(new, dst));
    let sl = Layout::of(&s, deflates_in(&s, container).unwrap()).unwrap();
    let dl = Layout::of(&d, deflates_in(&d, container).unwrap()).unwrap();
    assert!(!sl.deflates.is_empty() && !dl.deflates.is_empty());
    make_puffdiff(&s, &sl, &d, &dl, inner).unwrap()
}

struct Case {
    old: Vec<u8>,
    new: Vec<u8>,
    ops: Vec<DeltaOp>,
}

/// `system`: a gzip file (blocks 0.., one extent each side), a zip archive over two extents
/// each side, a copied block and a block of zeros in between.
fn case() -> Case {
    let d = TempDir::new("puffdiff-data");
    tool_ok("python3", &["-c", TEXT_PY, path_str(d.path())]);
    let gz = |name: &str| {
        let out = snapblk_testsupport::tool("gzip", &["-6", "-c", path_str(&d.join(name))]);
        assert!(out.status.success());
        out.stdout
    };
    let zip = |out: &str, names: &[&str]| {
        let mut args = vec![
            "-q".to_string(),
            "-9".into(),
            "-j".into(),
            path_str(&d.join(out)).into(),
        ];
        args.extend(names.iter().map(|n| path_str(&d.join(n)).to_string()));
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        tool_ok("zip", &a);
        std::fs::read(d.join(out)).unwrap()
    };
    let (old_gz, new_gz) = (gz("a.txt"), gz("b.txt"));
    let (old_zip, new_zip) = (
        zip("old.zip", &["a.txt", "c.txt"]),
        zip("new.zip", &["c.txt", "b.txt"]),
    );
    let blocks = |b: &[u8]| b.len().div_ceil(BS) as u64;
    let (og, ng) = (blocks(&old_gz), blocks(&new_gz));
    let (oz, nz) = (blocks(&old_zip), blocks(&new_zip));
    // Old: gzip at 0, a pattern block, the zip in two pieces around a spare block.
    let o_gz: Blocks = vec![(0, og)];
    let o_zip: Blocks = vec![(og + 1, oz / 2), (og + 2 + oz / 2, oz - oz / 2)];
    let mut old = Vec::new();
    scatter(&mut old, &o_gz, &old_gz);
    scatter(&mut old, &vec![(og, 1)], &pattern(BS, 5));
    scatter(&mut old, &o_zip, &old_zip);
    scatter(&mut old, &vec![(og + 1 + oz / 2, 1)], &pattern(BS, 6));
    // New: the pattern block first, the zip in two pieces, zeros, then the gzip.
    let n_zip: Blocks = vec![(1, 3), (5, nz - 3)];
    let n_gz: Blocks = vec![(5 + nz - 3, ng)];
    let mut new = Vec::new();
    scatter(&mut new, &vec![(0, 1)], &pattern(BS, 5));
    scatter(&mut new, &n_zip, &new_zip);
    scatter(&mut new, &vec![(4, 1)], &[0; BS]);
    scatter(&mut new, &n_gz, &new_gz);
    let ops = vec![
        DeltaOp::Copy {
            src: vec![(og, 1)],
            dst: vec![(0, 1)],
        },
        DeltaOp::Raw {
            op_type: OpType::Puffdiff as i32,
            src: o_zip.clone(),
            dst: n_zip.clone(),
            blob: puffdiff(&old, &o_zip, &new, &n_zip, Container::Zip, bsdf2),
        },
        DeltaOp::Zero { dst: vec![(4, 1)] },
        DeltaOp::Raw {
            op_type: OpType::Puffdiff as i32,
            src: o_gz.clone(),
            dst: n_gz.clone(),
            blob: puffdiff(&old, &o_gz, &new, &n_gz, Container::Gzip, bsdiff),
        },
    ];
    Case { old, new, ops }
}

fn build(c: &Case) -> Built {
    PayloadBuilder::new()
        .minor_version(6)
        .delta("system", &c.old, &c.new, &c.ops, &bsdiff)
        .build()
}

/// The one-line report of `e` (its chain joined by ": ").
fn line(e: &OtaError) -> String {
    let mut s = e.to_string();
    let mut cur: &dyn std::error::Error = e;
    while let Some(src) = cur.source() {
        s.push_str(": ");
        s.push_str(&src.to_string());
        cur = src;
    }
    s
}

#[test]
fn puffdiff_operations_apply_to_the_new_image() {
    let c = case();
    let b = build(&c);
    let p = Payload::from_bytes(b.to_bytes()).unwrap();
    let s = p.summary();
    assert!(s.partitions[0].applicable, "{:?}", s.partitions[0]);
    assert_eq!(s.partitions[0].op_counts["PUFFDIFF"], 2);
    // The patches are much smaller than a bsdiff of the compressed bytes: the puff streams
    // matched where the texts did.
    for (i, d) in [(1, &c.ops[1]), (3, &c.ops[3])] {
        let DeltaOp::Raw { src, dst, blob, .. } = d else {
            unreachable!()
        };
        let plain = bsdf2(&gather(&c.old, src), &gather(&c.new, dst)).len();
        assert!(blob.len() * 2 < plain, "op {i}: {} vs {plain}", blob.len());
    }
    for threads in [1, 3] {
        let (out, skipped) =
            apply_to_memory(&p, None, &[("system", &c.old)], false, threads).unwrap();
        assert!(skipped.is_empty());
        assert!(out[0].1 == c.new, "system differs ({threads} threads)");
    }
}

#[test]
fn bad_puffdiff_patches_are_refused_naming_the_op() {
    let c = case();
    let b = build(&c);
    let at = |b: &Built, i: usize| {
        let op = &b.manifest.partitions[0].operations[i];
        op.data_offset() as usize
    };
    let err = |b: &Built| {
        let p = Payload::from_bytes(b.to_bytes()).unwrap();
        line(&apply_to_memory(&p, None, &[("system", &c.old)], false, 1).unwrap_err())
    };
    // Bytes of the blob change: the blob's hash no longer matches.
    let mut b1 = b.clone();
    let o = at(&b1, 3);
    b1.data[o] ^= 1;
    assert!(
        err(&b1).starts_with("partition system, op 3: data SHA-256 "),
        "{}",
        err(&b1)
    );
    // Without the hash, the patch itself is checked: bad magic, a layout past the source, an
    // inner patch that does not apply.
    let unhashed = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b2 = b.clone();
        let o = at(&b2, 3);
        let n = b2.manifest.partitions[0].operations[3].data_length() as usize;
        let mut blob = b2.data[o..o + n].to_vec();
        edit(&mut blob);
        assert_eq!(blob.len(), n);
        b2.data[o..o + n].copy_from_slice(&blob);
        b2.manifest.partitions[0].operations[3].data_sha256_hash = None;
        err(&b2)
    };
    assert_eq!(
        unhashed(&|p| p[3] = b'0'),
        "partition system, op 3: applying the PUFFDIFF patch: not a PUFFDIFF patch: magic [50, 55, 46, 30], expected \"PUF1\""
    );
    let e = unhashed(&|p| {
        let n = p.len();
        p[n - 40..].fill(0x55);
    });
    assert!(
        e.starts_with("partition system, op 3: applying the PUFFDIFF patch: applying the PUFFDIFF's inner bsdiff patch: "),
        "{e}"
    );
    // A source that is not the one the patch was made from.
    let mut old = c.old.clone();
    old[10] ^= 0xff;
    let p = Payload::from_bytes(b.to_bytes()).unwrap();
    let e = line(&apply_to_memory(&p, None, &[("system", &old)], false, 1).unwrap_err());
    assert!(e.contains("SHA-256"), "{e}");
}
