//! The pre-merge check through the real `snapblk` binary (issue 19, D4, item 4, U2/U3/U11): a
//! merge that cannot finish is refused before its first write, with base and COW left
//! byte-identical, and `merge --check` refuses the same COWs with the same message.

use snapblk_cow::{CowReader, OpKind};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BS: usize = 4096;
const BLOCKS: usize = 2048;

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(tag: &str) -> TempDir {
    let p = std::env::temp_dir().join(format!("snapblk-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    TempDir(p)
}

fn snapblk(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_snapblk"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// Stderr without the one warning a COW without a record gets (checked in merge_record.rs).
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| !l.starts_with("snapblk: warning: no COW record"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Deterministic incompressible bytes.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// An old image, and a new one where blocks 100..300 are copies of 500..700 (COPY ops, merged
/// first) and blocks 1000..1400 are compressible text (400 lz4 REPLACE ops, merged in batches
/// of 256: a corrupt payload in the last one is found only after a batch was written).
fn images() -> (Vec<u8>, Vec<u8>) {
    let old = noise(1, BLOCKS * BS);
    let mut new = old.clone();
    new.copy_within(500 * BS..700 * BS, 100 * BS);
    for b in 1000..1400 {
        let mut t = Vec::new();
        let mut k = 0;
        while t.len() < BS {
            t.extend_from_slice(format!("the quick brown fox {b} jumps over {k}\n").as_bytes());
            k += 1;
        }
        new[b * BS..(b + 1) * BS].copy_from_slice(&t[..BS]);
    }
    (old, new)
}

/// Write old.img, new.img and (with `cow create` and `extra` flags) NAME, without a COW record:
/// these are the checks a COW from Android's tools gets (tests/merge_record.rs has the record's).
fn setup(dir: &Path, old: &[u8], new: &[u8], name: &str, extra: &[&str]) {
    create(dir, old, new, name, &[&["--no-record"], extra].concat());
}

/// Write old.img and new.img and make NAME of them with `cow create` and `flags` (by default
/// with its COW record).
fn create(dir: &Path, old: &[u8], new: &[u8], name: &str, flags: &[&str]) {
    std::fs::write(dir.join("old.img"), old).unwrap();
    std::fs::write(dir.join("new.img"), new).unwrap();
    let mut args = vec![
        "cow", "create", "--old", "old.img", "--new", "new.img", "-o", name,
    ];
    args.extend_from_slice(flags);
    let o = snapblk(&args, dir);
    assert!(o.status.success(), "cow create: {}", stderr(&o));
}

/// Run `merge` (or `merge --check`) and return (output, base bytes changed, COW bytes changed).
fn merge_leaves(dir: &Path, cow: &str, base: &str, check: bool) -> (Output, bool, bool) {
    let before = (
        std::fs::read(dir.join(base)).unwrap(),
        std::fs::read(dir.join(cow)).unwrap(),
    );
    let mut args = vec!["merge", cow, "--base", base];
    if check {
        args.push("--check");
    }
    let o = snapblk(&args, dir);
    let after = (
        std::fs::read(dir.join(base)).unwrap(),
        std::fs::read(dir.join(cow)).unwrap(),
    );
    (o, before.0 != after.0, before.1 != after.1)
}

fn check_json(dir: &Path, cow: &str, base: &str) -> (serde_json::Value, bool) {
    let o = snapblk(&["merge", cow, "--base", base, "--check", "--json"], dir);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("--check --json stdout is not JSON ({e}): {o:?}"));
    (v, o.status.success())
}

/// Assert both `merge` and `merge --check` refuse with the same one-line message containing
/// `want`, leaving base and COW byte-identical; `--check --json` says why.
fn assert_refused(dir: &Path, cow: &str, base: &str, want: &str) {
    let (m, base_changed, cow_changed) = merge_leaves(dir, cow, base, false);
    assert!(!m.status.success(), "merge accepted it");
    assert!(
        !base_changed,
        "the refused merge changed the base: {}",
        stderr(&m)
    );
    assert!(
        !cow_changed,
        "the refused merge changed the COW: {}",
        stderr(&m)
    );
    let msg = stderr(&m);
    assert!(msg.contains(want), "merge said: {msg}");
    assert!(!msg.contains("invalid COW"), "merge said: {msg}");
    assert_eq!(msg.trim_end().lines().count(), 1, "one line: {msg}");
    let (c, base_changed, cow_changed) = merge_leaves(dir, cow, base, true);
    assert!(!c.status.success(), "--check accepted it: {c:?}");
    assert!(!base_changed && !cow_changed, "--check wrote");
    assert_eq!(stderr(&c), msg, "--check and merge say the same");
    let (v, ok) = check_json(dir, cow, base);
    assert!(!ok);
    assert_eq!(v["mergeable"], false, "{v}");
    let err = v["error"].as_str().unwrap_or_default();
    assert!(err.contains(want), "{v}");
}

#[test]
fn undecodable_payload_is_refused_before_the_first_write() {
    let dir = tempdir("precheck-payload");
    let d = &dir.0;
    let (old, new) = images();
    setup(d, &old, &new, "bad.cow", &[]);
    // Overwrite the payload of the last lz4 REPLACE op in merge order with 0xFF bytes (D4).
    let mut bytes = std::fs::read(d.join("bad.cow")).unwrap();
    let cow = CowReader::open(bytes.clone()).unwrap();
    let p = cow
        .merge_order()
        .filter_map(|o| match o.kind {
            OpKind::Replace { payload } if payload.codec == snapblk_cow::Compression::Lz4 => {
                Some(payload)
            }
            _ => None,
        })
        .last()
        .expect("an lz4 REPLACE op");
    assert!(cow.merge_len() > 300, "several replace batches");
    bytes[p.offset as usize..(p.offset + u64::from(p.len)) as usize].fill(0xFF);
    std::fs::write(d.join("bad.cow"), &bytes).unwrap();
    std::fs::write(d.join("dev.img"), &old).unwrap();
    assert_refused(
        d,
        "bad.cow",
        "dev.img",
        &format!("payload at COW offset {} does not decode", p.offset),
    );
    // The message has no Rust debug text.
    let (m, _, _) = merge_leaves(d, "bad.cow", "dev.img", false);
    assert!(!stderr(&m).contains("Corrupt("), "{}", stderr(&m));
    // The intact COW still merges into the untouched base.
    setup(d, &old, &new, "good.cow", &[]);
    let o = snapblk(&["merge", "good.cow", "--base", "dev.img"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read(d.join("dev.img")).unwrap() == new);
}

/// Blocks 1600..1700 move down by 100 bytes: the best XOR source of each spans its own block.
fn shifted_images() -> (Vec<u8>, Vec<u8>) {
    let (old, mut new) = images();
    new.copy_within(1600 * BS + 100..1700 * BS + 100, 1600 * BS);
    (old, new)
}

/// (XOR ops, REPLACE ops) of a COW.
fn xor_and_replace(path: &Path) -> (usize, usize) {
    let cow = CowReader::open(std::fs::read(path).unwrap()).unwrap();
    let kinds: Vec<_> = cow.merge_order().map(|o| o.kind).collect();
    (
        kinds
            .iter()
            .filter(|k| matches!(k, OpKind::Xor { .. }))
            .count(),
        kinds
            .iter()
            .filter(|k| matches!(k, OpKind::Replace { .. }))
            .count(),
    )
}

#[test]
fn no_scratch_xor_reading_its_own_destination_is_refused() {
    // Such a COW as another writer may make it (Android's makes them; `cow create
    // --no-scratch` no longer does): no scratch area, XOR ops whose unaligned sources span
    // their own blocks.
    let dir = tempdir("precheck-xor");
    let d = &dir.0;
    let (old, new) = shifted_images();
    let f = std::fs::File::create(d.join("x.cow")).unwrap();
    let mut w = snapblk_cow::CowWriter::new(
        &f,
        snapblk_cow::WriterOptions {
            version: 2,
            scratch_size: 0,
            op_count_max: BLOCKS as u64,
            ..Default::default()
        },
    )
    .unwrap();
    let mut xored = new[1600 * BS..1700 * BS].to_vec();
    for (x, o) in xored.iter_mut().zip(&old[1600 * BS + 100..1700 * BS + 100]) {
        *x ^= o;
    }
    w.add_xor_blocks(1600, &xored, 1600, 100).unwrap();
    w.finalize().unwrap();
    drop(f);
    assert_eq!(xor_and_replace(&d.join("x.cow")), (100, 0));
    std::fs::write(d.join("dev.img"), &old).unwrap();
    assert_refused(d, "x.cow", "dev.img", "reads its own destination");
    let m = snapblk(&["merge", "--check", "x.cow", "--base", "dev.img"], d);
    assert!(stderr(&m).contains("merge --stash FILE"), "{}", stderr(&m));

    // With a stash the same COW merges: --check says so, the merge gives the new image (the
    // XOR-ed blocks and everything else as before) and removes the stash at the end.
    let cow_before = std::fs::read(d.join("x.cow")).unwrap();
    let c = snapblk(
        &[
            "merge", "--check", "x.cow", "--base", "dev.img", "--stash", "x.stash",
        ],
        d,
    );
    assert!(c.status.success(), "{}", stderr(&c));
    assert!(!d.join("x.stash").exists(), "--check writes no stash");
    // The stash is never one of the merge's own files.
    let a = snapblk(
        &["merge", "x.cow", "--base", "dev.img", "--stash", "dev.img"],
        d,
    );
    assert!(
        stderr(&a).contains("--stash dev.img is the same file as --base"),
        "{}",
        stderr(&a)
    );
    assert_eq!(std::fs::read(d.join("dev.img")).unwrap(), old);
    let m = snapblk(
        &["merge", "x.cow", "--base", "dev.img", "--stash", "x.stash"],
        d,
    );
    assert!(m.status.success(), "{}", stderr(&m));
    let mut want = old.clone();
    want[1600 * BS..1700 * BS].copy_from_slice(&new[1600 * BS..1700 * BS]);
    assert!(
        std::fs::read(d.join("dev.img")).unwrap() == want,
        "merged with a stash"
    );
    assert!(
        !d.join("x.stash").exists(),
        "the stash is removed when the merge completes"
    );
    assert!(
        std::fs::read(d.join("x.cow")).unwrap() != cow_before,
        "progress recorded"
    );

    // A COW with a scratch area needs no stash.
    setup(d, &old, &new, "s.cow", &[]);
    std::fs::write(d.join("dev2.img"), &old).unwrap();
    let s = snapblk(
        &["merge", "s.cow", "--base", "dev2.img", "--stash", "s.stash"],
        d,
    );
    assert!(stderr(&s).contains("has a scratch area"), "{}", stderr(&s));
}

#[test]
fn cow_create_without_scratch_writes_no_xor_that_reads_its_own_block() {
    let dir = tempdir("create-noscratch");
    let d = &dir.0;
    let (old, new) = shifted_images();
    // With a scratch area the shifted blocks are XOR ops (the merge stages them in scratch)...
    setup(d, &old, &new, "s.cow", &[]);
    let (xor, _) = xor_and_replace(&d.join("s.cow"));
    assert!(xor >= 100, "{xor} XOR ops with scratch");
    // ...without one they are REPLACE ops, and the COW merges crash-safely to the new image.
    setup(d, &old, &new, "n.cow", &["--no-scratch"]);
    let cow = CowReader::open(std::fs::read(d.join("n.cow")).unwrap()).unwrap();
    let bs = BS as u64;
    for op in cow.merge_order() {
        if let OpKind::Xor { source_offset, .. } = op.kind {
            let (first, last) = (source_offset / bs, (source_offset + bs).div_ceil(bs) - 1);
            assert!(
                op.new_block != first && op.new_block != last,
                "XOR into block {} reads it (source offset {source_offset})",
                op.new_block
            );
        }
    }
    let (_, replace) = xor_and_replace(&d.join("n.cow"));
    assert!(replace >= 100, "{replace} REPLACE ops without scratch");
    std::fs::write(d.join("dev.img"), &old).unwrap();
    let (c, _, _) = merge_leaves(d, "n.cow", "dev.img", true);
    assert!(c.status.success(), "--check: {}", stderr(&c));
    let o = snapblk(&["merge", "n.cow", "--base", "dev.img"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read(d.join("dev.img")).unwrap() == new);
}

#[test]
fn base_problems_name_the_base_and_both_sizes() {
    let dir = tempdir("precheck-base");
    let d = &dir.0;
    let (old, new) = images();
    setup(d, &old, &new, "a.cow", &[]);
    // The COW reads block 699 (COPY source) and writes up to block 1399.
    let needed = 1400 * BS;
    std::fs::write(d.join("short.img"), &old[..BS * 256]).unwrap();
    assert_refused(
        d,
        "a.cow",
        "short.img",
        &format!(
            "base short.img is {} bytes; the COW reads/writes up to block 1399 (needs at least {needed} bytes)",
            BS * 256
        ),
    );
    std::fs::write(d.join("empty.img"), b"").unwrap();
    assert_refused(
        d,
        "a.cow",
        "empty.img",
        &format!(
            "base empty.img is 0 bytes; the COW reads/writes up to block 1399 (needs at least {needed} bytes)"
        ),
    );
    std::fs::create_dir(d.join("dir.img")).unwrap();
    for check in [true, false] {
        let mut args = vec!["merge", "a.cow", "--base", "dir.img"];
        if check {
            args.push("--check");
        }
        let o = snapblk(&args, d);
        assert!(!o.status.success());
        assert_eq!(stderr(&o), "snapblk: base dir.img is a directory\n");
    }
    let (v, ok) = check_json(d, "a.cow", "dir.img");
    assert!(!ok && v["mergeable"] == false && v["error"] == "base dir.img is a directory");
}

#[test]
fn growing_update_says_to_grow_the_base_first() {
    let dir = tempdir("precheck-grow");
    let d = &dir.0;
    let (old, mut new) = images();
    new.extend_from_slice(&noise(9, 100 * BS));
    setup(d, &old, &new, "grow.cow", &[]);
    std::fs::write(d.join("dev.img"), &old).unwrap();
    let n = new.len();
    assert_refused(
        d,
        "grow.cow",
        "dev.img",
        &format!(
            "the new image is larger than base dev.img ({} bytes): the COW writes up to block {}, so the base must be grown to at least {n} bytes first (truncate -s {n} dev.img)",
            old.len(),
            n / BS - 1
        ),
    );
    // Following the advice works.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("dev.img"))
        .unwrap();
    f.set_len(n as u64).unwrap();
    drop(f);
    let o = snapblk(&["merge", "grow.cow", "--base", "dev.img"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read(d.join("dev.img")).unwrap() == new);
}

#[test]
fn check_says_what_it_checked() {
    let dir = tempdir("precheck-ok");
    let d = &dir.0;
    let (old, new) = images();
    setup(d, &old, &new, "a.cow", &[]);
    std::fs::write(d.join("dev.img"), &old).unwrap();
    let (o, base_changed, cow_changed) = merge_leaves(d, "a.cow", "dev.img", true);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!base_changed && !cow_changed);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("mergeable: 0/600 ops merged\n"), "{out}");
    assert!(out.contains("400 payloads decoded"), "{out}");
    assert!(out.contains("merge order valid"), "{out}");
    let (v, ok) = check_json(d, "a.cow", "dev.img");
    assert!(ok);
    assert_eq!(v["mergeable"], true);
    assert_eq!(v["checked"]["payloads_decoded"], 400);
    assert_eq!(v["checked"]["ops_checked"], 600);
}

#[test]
fn a_merge_into_a_sparse_base_on_a_full_file_system_fails_before_its_first_write() {
    // The merge reserves the blocks it will write (fallocate, size kept) before writing any:
    // it used to fail part-way with ENOSPC (resumable, but only once space was freed). Every
    // other block changes, so the reservation is many ranges, and the ones allocated before
    // the file system ran out must be given back.
    let d = tempdir("merge-full");
    let blocks = 256;
    let old = vec![0u8; blocks * BS];
    let mut new = old.clone();
    for (i, b) in new.chunks_mut(BS).enumerate().filter(|(i, _)| i % 2 == 0) {
        b.copy_from_slice(&noise(i as u64 + 1, BS));
    }
    create(&d.0, &old, &new, "u.cow", &[]);
    let cow_before = std::fs::read(d.0.join("u.cow")).unwrap();
    // A base of all zeros, every block a hole, on a tmpfs with room for half the blocks the
    // merge writes.
    let mnt = d.0.join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    let size = format!("size={}k", blocks * BS / 4 / 1024);
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &size, "tiny"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs (the tests run as root)");
    let base = mnt.join("base.img");
    std::fs::File::create(&base)
        .unwrap()
        .set_len((blocks * BS) as u64)
        .unwrap();
    let b = base.to_str().unwrap();
    let o = snapblk(&["merge", "u.cow", "--base", b], &d.0);
    let after = std::fs::read(&base).unwrap();
    let cow_after = std::fs::read(d.0.join("u.cow")).unwrap();
    let used = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&base).unwrap().blocks()
    };
    // With room for it, the same merge succeeds.
    let grow = Command::new("mount")
        .args(["-o", "remount,size=4m"])
        .arg(&mnt)
        .status()
        .unwrap();
    let o2 = snapblk(&["merge", "u.cow", "--base", b], &d.0);
    let merged = std::fs::read(&base).unwrap();
    Command::new("umount").arg(&mnt).status().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("No space left on device") && err.contains("nothing written"),
        "{err}"
    );
    assert!(after == old, "the base is unchanged");
    assert_eq!(used, 0, "the space reserved before ENOSPC was given back");
    assert!(cow_after == cow_before, "the COW is unchanged");
    assert!(grow.success(), "remount the tmpfs larger");
    assert!(o2.status.success(), "{}", stderr(&o2));
    assert!(merged == new, "merged with room for it");
}

#[test]
fn check_with_a_record_counts_the_bytes_its_content_check_decodes() {
    // With a record the payloads are decoded by the content check, not by the decode pass:
    // the report said "N payloads decoded (X -> 0 B)".
    let d = tempdir("precheck-record");
    let blocks = 64;
    let old = noise(3, blocks * BS);
    let mut new = old.clone();
    new[..16 * BS].fill(b'x');
    create(&d.0, &old, &new, "r.cow", &[]);
    assert!(
        d.0.join("r.cow.snapblk").exists(),
        "cow create writes a record"
    );
    let o = snapblk(
        &["merge", "r.cow", "--base", "old.img", "--check", "--json"],
        &d.0,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let n = v["checked"]["payloads_decoded"].as_u64().unwrap();
    assert!(n > 0, "{v}");
    assert_eq!(v["checked"]["decoded_bytes"], n * BS as u64, "{v}");
}
