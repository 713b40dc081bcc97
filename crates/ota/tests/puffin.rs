//! PUFFDIFF against independent makers and an independent applier.
//!
//! * Deflate streams written by Python's zlib (every level and strategy, raw, zlib and gzip
//!   wrappers, small windows and memory levels), GNU gzip (-1 to -9, with a file name, and
//!   two members) and Info-ZIP zip (-0 to -9, several entries) puff and huff back to exactly
//!   their bytes, and what puffing decoded decompresses to the data they were given.
//! * The puffin port on crates.io (`puffdiff`) finds the same deflate blocks, the same puff
//!   sizes and the same puff stream for every file; PUFFDIFF patches made from its puff
//!   streams and from ours (inner patches by `bsdiff-android`, BSDF2 and BSDIFF40) apply with
//!   both appliers to the destination file.
//!
//! The data: pseudo-English text and an edited copy, random bytes, zeros, text with random
//! runs (stored blocks between compressed ones), and an ext4 image made by `mke2fs -d`.

use std::collections::BTreeMap;
use std::path::Path;

use snapblk_ota::apply_puffdiff;
use snapblk_ota::puffin_testing::{
    Container, Layout, deflates_in, inflate_puff, locate_raw, make_puffdiff, puf1, puff_run,
};
use snapblk_testsupport::{TempDir, path_str, tool_ok};

/// Writes the data sets into DIR.
const DATA_PY: &str = r#"
import random, sys, os
d = sys.argv[1]
r = random.Random(2024)
words = ("the of and to in is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when if "
         "so no will can more other could some what into them than then its time only two may "
         "deflate block huffman stored fixed dynamic puff partition update payload android").split()
def text(n, seed):
    r = random.Random(seed)
    out, line = [], []
    while sum(map(len, out)) < n:
        line.append(r.choice(words))
        if len(line) > r.randrange(6, 14):
            out.append(" ".join(line).capitalize() + ".\n")
            line = []
    return "".join(out).encode()[:n]
t = text(96 << 10, 1)
open(f"{d}/text", "wb").write(t)
# An edited copy: words changed, lines inserted and removed.
lines = t.split(b"\n")
r2 = random.Random(5)
for i in range(0, len(lines), 97):
    lines[i] = lines[i].replace(b" the ", b" a ")
for i in range(len(lines) - 1, 0, -503):
    del lines[i]
for i in range(0, len(lines), 401):
    lines.insert(i, b"An inserted line with a number %d." % r2.randrange(10**6))
open(f"{d}/text2", "wb").write(b"\n".join(lines))
open(f"{d}/random", "wb").write(r.randbytes(32 << 10))
open(f"{d}/zeros", "wb").write(bytes(512 << 10))
m = bytearray()
while len(m) < (128 << 10):
    m += text(r.randrange(2000, 20000), r.randrange(1 << 30))
    m += r.randbytes(r.randrange(20000, 40000))
open(f"{d}/mixed", "wb").write(bytes(m[:128 << 10]))
"#;

/// Compresses each file of argv[2:] with Python's zlib into argv[1], printing
/// "NAME CONTAINER DATA" per output.
const ZLIB_PY: &str = r#"
import sys, zlib, os
out = sys.argv[1]
S = {"default": zlib.Z_DEFAULT_STRATEGY, "filtered": zlib.Z_FILTERED,
     "huffman": zlib.Z_HUFFMAN_ONLY, "rle": zlib.Z_RLE, "fixed": zlib.Z_FIXED}
def kind(wbits):
    return "raw" if wbits < 0 else "gzip" if wbits > 15 else "zlib"
for path in sys.argv[2:]:
    data = open(path, "rb").read()
    name = os.path.basename(path)
    runs = [(l, s, -15, 8) for l in range(10) for s in S]
    runs += [(l, "default", w, 8) for l in (1, 6, 9) for w in (9, 12, 15, 31, -9)]
    runs += [(l, "default", -15, m) for l in (1, 9) for m in (1, 9)]
    for level, strategy, wbits, mem in runs:
        c = zlib.compressobj(level, zlib.DEFLATED, wbits, mem, S[strategy])
        z = c.compress(data) + c.flush()
        assert zlib.decompress(z, wbits) == data
        f = f"{name}.{level}.{strategy}.{wbits}.{mem}"
        open(f"{out}/{f}", "wb").write(z)
        print(f, kind(wbits), name)
"#;

/// Prints the data offset of every DEFLATE entry of the zip argv[1], one per line.
const ZIP_OFFSETS_PY: &str = r#"
import sys, zipfile, struct
b = open(sys.argv[1], "rb").read()
for i in zipfile.ZipFile(sys.argv[1]).infolist():
    if i.compress_type == zipfile.ZIP_DEFLATED:
        h = i.header_offset
        n, x = struct.unpack("<HH", b[h + 26:h + 30])
        print(h + 30 + n + x)
"#;

const DATA: [&str; 6] = ["text", "text2", "random", "zeros", "mixed", "ext4"];

/// The data sets in `dir`, by name.
fn data_sets(dir: &TempDir) -> BTreeMap<String, Vec<u8>> {
    tool_ok("python3", &["-c", DATA_PY, path_str(dir.path())]);
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    for f in ["text", "random"] {
        std::fs::copy(dir.join(f), tree.join(f)).unwrap();
    }
    tool_ok(
        "mke2fs",
        &[
            "-q",
            "-F",
            "-t",
            "ext4",
            "-d",
            path_str(&tree),
            path_str(&dir.join("ext4")),
            "1M",
        ],
    );
    DATA.iter()
        .map(|n| (n.to_string(), std::fs::read(dir.join(n)).unwrap()))
        .collect()
}

/// Bytes of a gzip member's header (fixed part, FEXTRA, FNAME, FCOMMENT, FHCRC).
fn gzip_header_len(b: &[u8]) -> usize {
    let flags = b[3];
    let mut at = 10;
    if flags & 4 != 0 {
        at += 2 + usize::from(u16::from_le_bytes([b[at], b[at + 1]]));
    }
    for bit in [8, 16] {
        if flags & bit != 0 {
            at += b[at..].iter().position(|&c| c == 0).unwrap() + 1;
        }
    }
    if flags & 2 != 0 {
        at += 2;
    }
    at
}

/// Block counts: stored, fixed, dynamic.
#[derive(Default, Debug)]
struct Seen([usize; 3]);

/// Puff then huff `file` must give back its bytes. For a file holding one deflate stream at
/// byte `start`, what puffing decoded must also be `data`.
fn round_trip(
    file: &[u8],
    container: Container,
    start: Option<usize>,
    data: &[u8],
    what: &str,
    seen: &mut Seen,
) {
    let deflates = deflates_in(file, container).unwrap_or_else(|e| panic!("{what}: {e}"));
    let layout = Layout::of(file, deflates).unwrap_or_else(|e| panic!("{what}: {e}"));
    let puff = layout.puff(file).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(puff.len() as u64, layout.puff_len, "{what}");
    let back = layout
        .huff(&puff, file.len() as u64)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(back == file, "{what}: puff then huff changed the bytes");
    if let Some(start) = start {
        let (_, end) = locate_raw(file, start as u64 * 8).unwrap();
        let whole = puff_run(file, start as u64 * 8, end).unwrap();
        let (inflated, kinds) = inflate_puff(&whole, data.len()).unwrap();
        assert!(
            inflated == data,
            "{what}: the puff does not decompress to the data"
        );
        for (s, k) in seen.0.iter_mut().zip(kinds) {
            *s += k;
        }
    }
}

#[test]
fn zlib_streams_round_trip_bit_exactly() {
    let dir = TempDir::new("puffin-zlib");
    let data = data_sets(&dir);
    let out = dir.join("z");
    std::fs::create_dir(&out).unwrap();
    let mut args = vec!["-c", ZLIB_PY, path_str(&out)];
    let paths: Vec<String> = DATA
        .iter()
        .map(|n| path_str(&dir.join(n)).to_string())
        .collect();
    args.extend(paths.iter().map(String::as_str));
    let list = tool_ok("python3", &args);
    let mut seen = Seen::default();
    let mut n = 0;
    for line in list.lines() {
        let [name, kind, src] = line.split(' ').collect::<Vec<_>>()[..] else {
            panic!("{line}");
        };
        let file = std::fs::read(out.join(name)).unwrap();
        let (container, start) = match kind {
            "raw" => (Container::Raw, 0),
            "zlib" => (Container::Zlib, 2),
            _ => (Container::Gzip, gzip_header_len(&file)),
        };
        round_trip(&file, container, Some(start), &data[src], name, &mut seen);
        n += 1;
    }
    assert_eq!(n, DATA.len() * (50 + 15 + 4));
    // Every block type, many times over.
    let [stored, fixed, dynamic] = seen.0;
    assert!(stored > 100 && fixed > 100 && dynamic > 100, "{seen:?}");
}

#[test]
fn gzip_streams_round_trip_bit_exactly() {
    let dir = TempDir::new("puffin-gzip");
    let data = data_sets(&dir);
    let mut seen = Seen::default();
    for name in DATA {
        let path = dir.join(name);
        for level in 1..=9 {
            let gz = dir.join(&format!("{name}.{level}.gz"));
            // gzip -c FILE keeps the file name in the header.
            let out = std::process::Command::new("gzip")
                .args([&format!("-{level}"), "-c", path_str(&path)])
                .output()
                .expect("gzip is required (scripts/install-deps.sh installs it)");
            assert!(out.status.success());
            std::fs::write(&gz, &out.stdout).unwrap();
            let file = out.stdout;
            assert_eq!(file[3] & 8, 8, "no file name in the gzip header");
            let what = format!("gzip -{level} {name}");
            round_trip(
                &file,
                Container::Gzip,
                Some(gzip_header_len(&file)),
                &data[name],
                &what,
                &mut seen,
            );
        }
    }
    // Two members, one after the other.
    let two = [
        std::fs::read(dir.join("text.1.gz")).unwrap(),
        std::fs::read(dir.join("mixed.9.gz")).unwrap(),
    ]
    .concat();
    let blocks = deflates_in(&two, Container::Gzip).unwrap();
    let one = deflates_in(
        &std::fs::read(dir.join("text.1.gz")).unwrap(),
        Container::Gzip,
    )
    .unwrap();
    assert!(blocks.len() > one.len());
    round_trip(
        &two,
        Container::Gzip,
        None,
        &[],
        "two gzip members",
        &mut seen,
    );
    let [_, fixed, dynamic] = seen.0;
    assert!(fixed + dynamic > 50, "{seen:?}");
}

#[test]
fn zip_archives_round_trip_bit_exactly() {
    let dir = TempDir::new("puffin-zip");
    data_sets(&dir);
    for level in 0..=9 {
        let zip = dir.join(&format!("a{level}.zip"));
        let mut args = vec![
            format!("-{level}"),
            "-q".into(),
            "-j".into(),
            path_str(&zip).into(),
        ];
        args.extend(DATA.iter().map(|n| path_str(&dir.join(n)).to_string()));
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        tool_ok("zip", &a);
        let file = std::fs::read(&zip).unwrap();
        let entries = zip_offsets(&zip);
        if level == 0 {
            assert!(entries.is_empty());
        } else {
            assert!(entries.len() >= 5, "zip -{level}: {entries:?}");
        }
        let blocks = deflates_in(&file, Container::Zip).unwrap();
        assert_eq!(blocks.is_empty(), level == 0);
        round_trip(
            &file,
            Container::Zip,
            None,
            &[],
            &format!("zip -{level}"),
            &mut Seen::default(),
        );
        // The blocks found by scanning for local headers are those of the entries Python lists.
        let mut from_entries = Vec::new();
        for &start in &entries {
            from_entries.extend(locate_raw(&file, start as u64 * 8).unwrap().0);
        }
        assert_eq!(
            from_entries, blocks,
            "zip -{level}: blocks by local header scan"
        );
    }
}

/// Data offsets of the DEFLATE entries of a zip, from Python's zipfile.
fn zip_offsets(zip: &Path) -> Vec<usize> {
    tool_ok("python3", &["-c", ZIP_OFFSETS_PY, path_str(zip)])
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

// ---- the puffdiff crate ----

/// puffin's `FindPuffLocations`, from its description: each puff's offset is its deflate's
/// first whole byte, less one when the deflate starts inside the byte the previous one ends in
/// (no gap byte), plus the running difference of puff and deflate sizes.
fn find_puff_locations(deflates: &[(u64, u64)], sizes: &[u64], len: u64) -> (Vec<(u64, u64)>, u64) {
    let mut diff = 0i64;
    let mut puffs = Vec::new();
    for (i, &(off, l)) in deflates.iter().enumerate() {
        let gap = i64::from(i > 0 && deflates[i - 1].0 + deflates[i - 1].1 == off && off % 8 != 0);
        let (start, end) = (off.div_ceil(8) as i64, ((off + l) / 8) as i64);
        puffs.push(((start - gap + diff) as u64, sizes[i]));
        diff += sizes[i] as i64 - (end - start) - gap;
    }
    (puffs, (len as i64 + diff) as u64)
}

/// The puffdiff crate's layout and puff stream of `file`, whose deflate streams start at the
/// bytes `starts`.
fn theirs(file: &[u8], starts: &[usize]) -> (Layout, Vec<u8>) {
    let mut deflates = Vec::new();
    let mut sizes = Vec::new();
    for &s in starts {
        let (d, p, _) = puffdiff::_debug_locate(&file[s..]).unwrap();
        deflates.extend(d.iter().map(|&(o, l)| (o + s as u64 * 8, l)));
        sizes.extend(p.iter().map(|p| p.1));
    }
    let (puffs, puff_len) = find_puff_locations(&deflates, &sizes, file.len() as u64);
    let puff = puffdiff::_debug_stream_puff(file, &deflates, &puffs, puff_len).unwrap();
    (
        Layout {
            deflates,
            puffs,
            puff_len,
        },
        puff,
    )
}

/// Ours, for the same file.
fn ours(file: &[u8], container: Container) -> (Layout, Vec<u8>) {
    let layout = Layout::of(file, deflates_in(file, container).unwrap()).unwrap();
    let puff = layout.puff(file).unwrap();
    (layout, puff)
}

fn bsdf2(old: &[u8], new: &[u8]) -> Vec<u8> {
    use bsdiff_android::CompressionAlgorithm::{Brotli, Bz2};
    let mut p = Vec::new();
    bsdiff_android::diff_bsdf2(old, new, &mut p, Bz2, Brotli, Brotli).unwrap();
    p
}

fn bsdiff40(old: &[u8], new: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    bsdiff_android::diff_bsdiff40(old, new, &mut p).unwrap();
    p
}

fn apply_ours(src: &[u8], patch: &[u8], dst_len: usize) -> Vec<u8> {
    apply_puffdiff(src, patch, dst_len as u64, |old, p, _, new| {
        bsdiff_android::patch_bsdf2(old, p, new)
    })
    .unwrap()
}

/// A compressed file: its bytes, container and the starts of its deflate streams.
struct Made {
    bytes: Vec<u8>,
    container: Container,
    starts: Vec<usize>,
}

fn gzip(dir: &TempDir, name: &str, level: u32) -> Made {
    let out = tool_ok_bytes(
        "gzip",
        &[&format!("-{level}"), "-c", path_str(&dir.join(name))],
    );
    let start = gzip_header_len(&out);
    Made {
        bytes: out,
        container: Container::Gzip,
        starts: vec![start],
    }
}

fn zip(dir: &TempDir, out: &str, level: u32, names: &[&str]) -> Made {
    let zip = dir.join(out);
    let mut args = vec![
        format!("-{level}"),
        "-q".into(),
        "-j".into(),
        path_str(&zip).into(),
    ];
    args.extend(names.iter().map(|n| path_str(&dir.join(n)).to_string()));
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    tool_ok("zip", &a);
    Made {
        bytes: std::fs::read(&zip).unwrap(),
        container: Container::Zip,
        starts: zip_offsets(&zip),
    }
}

fn raw(dir: &TempDir, name: &str, level: u32, strategy: &str) -> Made {
    let py = format!(
        "import sys, zlib; c = zlib.compressobj({level}, 8, -15, 8, zlib.{strategy}); \
         d = open(sys.argv[1], 'rb').read(); sys.stdout.buffer.write(c.compress(d) + c.flush())"
    );
    Made {
        bytes: tool_ok_bytes("python3", &["-c", &py, path_str(&dir.join(name))]),
        container: Container::Raw,
        starts: vec![0],
    }
}

fn tool_ok_bytes(cmd: &str, args: &[&str]) -> Vec<u8> {
    let out = snapblk_testsupport::tool(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn puffdiff_crate_finds_the_same_blocks_and_puffs() {
    let dir = TempDir::new("puffin-crate");
    data_sets(&dir);
    let mut files = Vec::new();
    for name in ["text", "mixed", "ext4", "random"] {
        for level in [1, 6, 9] {
            files.push((format!("gzip -{level} {name}"), gzip(&dir, name, level)));
        }
        for (level, strategy) in [
            (0, "Z_DEFAULT_STRATEGY"),
            (4, "Z_FILTERED"),
            (9, "Z_RLE"),
            (6, "Z_FIXED"),
            (7, "Z_HUFFMAN_ONLY"),
        ] {
            files.push((
                format!("zlib {level} {strategy} {name}"),
                raw(&dir, name, level, strategy),
            ));
        }
    }
    // Not zeros: their `_debug_locate` sizes its scratch puff at 8 bytes per deflate byte
    // (plus 4 KiB) and panics past it, and a run of zeros puffs to about 16.
    let some = ["text", "text2", "random", "mixed", "ext4"];
    for level in [1, 9] {
        let a = zip(&dir, &format!("a{level}.zip"), level, &some);
        files.push((format!("zip -{level}"), a));
    }
    for (what, m) in &files {
        let (tl, tp) = theirs(&m.bytes, &m.starts);
        let (ol, op) = ours(&m.bytes, m.container);
        assert_eq!(tl, ol, "{what}: layouts");
        assert!(tp == op, "{what}: puff streams differ");
    }
}

#[test]
fn patches_apply_with_both_appliers() {
    let dir = TempDir::new("puffin-patch");
    data_sets(&dir);
    let d6 = "Z_DEFAULT_STRATEGY";
    // (what, source, destination, whether their puff streams share most of their bytes (same
    // data, maker and level), whether the puffdiff crate's debug helpers can lay them out:
    // not with zeros, see above)
    let pairs = [
        (
            "gzip -6",
            gzip(&dir, "text", 6),
            gzip(&dir, "text2", 6),
            true,
            true,
        ),
        (
            "gzip -1, -9",
            gzip(&dir, "text", 1),
            gzip(&dir, "text2", 9),
            false,
            true,
        ),
        (
            "zlib 9",
            raw(&dir, "text", 9, d6),
            raw(&dir, "text2", 9, d6),
            true,
            true,
        ),
        (
            "mixed, text",
            raw(&dir, "mixed", 6, d6),
            raw(&dir, "text2", 6, "Z_FIXED"),
            false,
            true,
        ),
        (
            "zip",
            zip(&dir, "old.zip", 6, &["text", "random", "mixed"]),
            zip(&dir, "new.zip", 9, &["random", "text2", "ext4", "mixed"]),
            true,
            true,
        ),
        (
            "zip with zeros",
            zip(&dir, "old0.zip", 6, &["zeros", "text"]),
            zip(&dir, "new0.zip", 6, &["text2", "zeros"]),
            true,
            false,
        ),
    ];
    for (what, src, dst, similar, their_layout) in &pairs {
        let (s, d) = (&src.bytes, &dst.bytes);
        let (osl, _) = ours(s, src.container);
        let (odl, _) = ours(d, dst.container);
        let mut patches = vec![
            (
                "ours, BSDF2",
                make_puffdiff(s, &osl, d, &odl, bsdf2).unwrap(),
            ),
            (
                "ours, BSDIFF40",
                make_puffdiff(s, &osl, d, &odl, bsdiff40).unwrap(),
            ),
        ];
        if *their_layout {
            let (tsl, tsp) = theirs(s, &src.starts);
            let (tdl, tdp) = theirs(d, &dst.starts);
            patches.push(("theirs, BSDF2", puf1(&tsl, &tdl, &bsdf2(&tsp, &tdp))));
            patches.push(("theirs, BSDIFF40", puf1(&tsl, &tdl, &bsdiff40(&tsp, &tdp))));
        }
        for (how, p) in &patches {
            // Similar files make a patch much smaller than the destination: the puff streams
            // matched where the data did.
            let (pl, dl) = (p.len(), d.len());
            assert!(!similar || pl < dl / 3, "{what} {how}: {pl} of {dl}");
            assert!(apply_ours(s, p, d.len()) == *d, "{what} {how}: ours");
            let theirs = puffdiff::puffpatch(s, p).unwrap_or_else(|e| panic!("{what} {how}: {e}"));
            assert!(theirs == *d, "{what} {how}: the puffdiff crate's");
        }
    }
}
