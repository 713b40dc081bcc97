//! `snapblk merge` with the COW record: a merge is bound to its base by content. It refuses,
//! before writing anything, a wrong base, an already updated one, a COW whose progress was made
//! on another file (D5), and a COW whose blocks do not come out as recorded (W1); `--status`
//! shows what the base is, `--reset-progress` recovers a COW consumed on the wrong file, and a
//! shrinking update leaves the base exactly the new image's size (W2).

use snapblk_testsupport::{TempDir, assert_file_eq, path_str};
use std::path::Path;

#[path = "cli_common.rs"]
mod common;
use common::{Case, ok, read, refused, snapblk};

#[test]
fn wrong_and_already_updated_bases_are_refused_with_nothing_written() {
    let c = Case::new("mrec-wrong", 256, &[]);
    let other = c.tmp.join("other.img");
    std::fs::write(&other, snapblk_testsupport::pattern(256 * 4096, 9)).unwrap();
    let updated = c.file_copy(&c.new, "updated.img");
    for (base, want) in [
        (&other, "not the file this COW's merge belongs to"),
        (&updated, "already holds the new image"),
    ] {
        let cow = c.cow_copy("m.cow");
        let before = [read(base), read(&cow)];
        refused(&["merge", path_str(&cow), "--base", path_str(base)], want);
        assert!([read(base), read(&cow)] == before, "{want}: a file changed");
        // --check says the same, without writing either.
        refused(
            &["merge", "--check", path_str(&cow), "--base", path_str(base)],
            want,
        );
    }
}

#[test]
fn a_cow_consumed_on_another_file_is_refused_shown_and_recovered() {
    let c = Case::new("mrec-d5", 256, &[]);
    let cow = c.cow_copy("m.cow");
    let copy = c.file_copy(&c.old, "copy.img");
    let right = c.file_copy(&c.old, "right.img");
    // Merged into a copy of the old image (another file with the same content)...
    ok(&["merge", path_str(&cow), "--base", path_str(&copy)]);
    assert_file_eq(&copy, &read(&c.new), "the copy is merged");
    // ...so the COW is consumed: the merge into the right base is refused, not a silent no-op.
    refused(
        &["merge", path_str(&cow), "--base", path_str(&right)],
        "that progress was made on another file",
    );
    assert_eq!(read(&right), read(&c.old));
    let st: serde_json::Value = serde_json::from_str(&ok(&[
        "merge",
        "--status",
        "--json",
        path_str(&cow),
        "--base",
        path_str(&right),
    ]))
    .unwrap();
    assert_eq!(st["base"], "progress-of-another-file", "{st}");
    assert_eq!(st["merged"], st["total"]);
    // The merged copy is "complete"; resetting there is refused.
    let st2: serde_json::Value = serde_json::from_str(&ok(&[
        "merge",
        "--status",
        "--json",
        path_str(&cow),
        "--base",
        path_str(&copy),
    ]))
    .unwrap();
    assert_eq!(st2["base"], "complete");
    refused(
        &[
            "merge",
            "--reset-progress",
            path_str(&cow),
            "--base",
            path_str(&copy),
        ],
        "refusing to reset",
    );
    ok(&[
        "merge",
        "--reset-progress",
        path_str(&cow),
        "--base",
        path_str(&right),
    ]);
    ok(&["merge", path_str(&cow), "--base", path_str(&right)]);
    assert_file_eq(&right, &read(&c.new), "merged after the reset");
}

/// (record offset, payload offset) of every op of `kind`, from `inspect --ops --json`.
fn ops_of(cow: &Path, kind: &str) -> Vec<serde_json::Value> {
    let j: serde_json::Value =
        serde_json::from_str(&ok(&["cow", "inspect", "--json", "--ops", path_str(cow)])).unwrap();
    j["ops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["kind"]["type"] == kind)
        .cloned()
        .collect()
}

#[test]
fn blocks_that_do_not_come_out_as_recorded_are_refused_before_writing() {
    let c = Case::new("mrec-w1", 256, &["--compression", "none"]);
    // A REPLACE payload byte flipped: it still "decodes".
    let bad = c.cow_copy("bad.cow");
    let off = ops_of(&bad, "replace")[0]["kind"]["payload"]["offset"]
        .as_u64()
        .unwrap();
    let mut d = read(&bad);
    d[off as usize + 7] ^= 0x40;
    std::fs::write(&bad, &d).unwrap();
    let base = c.file_copy(&c.old, "b.img");
    refused(
        &["merge", path_str(&bad), "--base", path_str(&base)],
        "does not match the COW record",
    );
    assert_eq!(read(&base), read(&c.old));
    // Two neighbouring COPY ops (same run) with their sources swapped: the sets of blocks read and written are
    // unchanged; the digest of the COW's ops in the record sees it.
    let bad2 = c.cow_copy("bad2.cow");
    let copies = ops_of(&bad2, "copy");
    let (a, b) = (&copies[0], &copies[1]);
    let src = |o: &serde_json::Value| o["kind"]["source_block"].as_u64().unwrap();
    let (sa, sb) = (src(a), src(b));
    assert_ne!(sa, sb);
    let mut d = read(&bad2);
    // v3 record: source_info (u64 at record offset 8) holds the source in bits 0..47.
    for (op, to) in [(a, sb), (b, sa)] {
        let ro = op["record_offset"].as_u64().unwrap() as usize + 8;
        let cur = u64::from_le_bytes(d[ro..ro + 8].try_into().unwrap());
        let v = (cur & !((1u64 << 48) - 1)) | to;
        d[ro..ro + 8].copy_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&bad2, &d).unwrap();
    let j = ops_of(&bad2, "copy");
    assert_eq!((src(&j[0]), src(&j[1])), (sb, sa), "patched");
    refused(
        &["merge", path_str(&bad2), "--base", path_str(&base)],
        "does not describe this COW",
    );
    assert_eq!(read(&base), read(&c.old));
}

#[test]
fn a_shrinking_update_merges_to_exactly_the_new_size() {
    let c = Case::new("mrec-shrink", 240, &[]);
    let base = c.file_copy(&c.old, "b.img");
    let out = ok(&["merge", path_str(&c.cow), "--base", path_str(&base)]);
    assert!(
        out.contains("truncated to 960.00 KiB (983040 bytes)"),
        "{out}"
    );
    assert_file_eq(&base, &read(&c.new), "shrunk base");
    // Run again: complete, nothing to do.
    ok(&["merge", path_str(&c.cow), "--base", path_str(&base)]);
    assert_file_eq(&base, &read(&c.new), "second run");
}

#[test]
fn verify_base_checks_the_old_image_inside_a_grown_base() {
    // 300 blocks from 256: the base grown to the new size first (as the refusal says, or as a
    // merge into an RBD image does itself) still holds the old image, which --verify-base
    // checks in its first old-size bytes.
    let c = Case::new("mrec-grow-verify", 300, &[]);
    let base = c.file_copy(&c.old, "b.img");
    let f = std::fs::OpenOptions::new().write(true).open(&base).unwrap();
    f.set_len(read(&c.new).len() as u64).unwrap();
    drop(f);
    ok(&[
        "merge",
        path_str(&c.cow),
        "--base",
        path_str(&base),
        "--verify-base",
    ]);
    assert_file_eq(&base, &read(&c.new), "grown base");
}

#[test]
fn without_a_record_merge_warns_once() {
    let c = Case::new("mrec-norecord", 256, &["--no-record"]);
    let base = c.file_copy(&c.old, "b.img");
    let o = snapblk(&["merge", path_str(&c.cow), "--base", path_str(&base)]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("cannot be verified").count(), 1, "{err}");
    assert_file_eq(&base, &read(&c.new), "merged without a record");
}

#[test]
fn the_same_file_as_base_and_cow_is_named_as_such() {
    let c = Case::new("mrec-same", 256, &[]);
    let cow = path_str(&c.cow);
    let link = c.tmp.join("link.cow");
    std::fs::hard_link(&c.cow, &link).unwrap();
    for base in [cow, path_str(&link)] {
        refused(&["merge", cow, "--base", base], "are the same file");
        refused(
            &["merge", "--check", cow, "--base", base],
            "are the same file",
        );
        refused(
            &["serve", "--base", base, "--cow", cow, "--nbd", "0"],
            "are the same file",
        );
    }
    // Flags that would do nothing with --check are refused by the parser (exit 2).
    let o = snapblk(&[
        "merge",
        "--check",
        "--progress",
        cow,
        "--base",
        path_str(&c.old),
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_shrinking_update_that_moves_the_old_tail_merges_and_serves() {
    let tmp = TempDir::new("mrec-shrink-tail");
    let old = snapblk_testsupport::pattern(256 * 4096, 21);
    // The new image is 240 blocks and starts with the old image's last 8 blocks (sources past
    // the new end).
    let mut new = old[..240 * 4096].to_vec();
    new[..8 * 4096].copy_from_slice(&old[248 * 4096..]);
    let (o, n) = (tmp.join("old.img"), tmp.join("new.img"));
    std::fs::write(&o, &old).unwrap();
    std::fs::write(&n, &new).unwrap();
    let cow = tmp.join("u.cow");
    ok(&[
        "cow",
        "create",
        "--old",
        path_str(&o),
        "--new",
        path_str(&n),
        "-o",
        path_str(&cow),
    ]);
    let base = tmp.join("b.img");
    std::fs::copy(&o, &base).unwrap();
    let st: serde_json::Value = serde_json::from_str(&ok(&[
        "merge",
        "--status",
        "--json",
        path_str(&cow),
        "--base",
        path_str(&base),
    ]))
    .unwrap();
    assert_eq!(st["base"], "not-started", "{st}");
    ok(&["merge", path_str(&cow), "--base", path_str(&base)]);
    assert_file_eq(&base, &new, "shrunk base, tail moved to the front");
    // Run again (as after a kill between the truncate and the exit): the COW's sources lie
    // past the shrunk base's end, yet the run finds the merge complete, changes nothing.
    let out = ok(&["merge", path_str(&cow), "--base", path_str(&base)]);
    assert!(out.contains("merged 8 ops (already complete)"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&ok(&[
        "merge",
        "--json",
        path_str(&cow),
        "--base",
        path_str(&base),
    ]))
    .unwrap();
    assert_eq!(
        (v["merged"].as_u64(), v["bytes_written"].as_u64()),
        (Some(8), Some(0)),
        "{v}"
    );
    assert_file_eq(&base, &new, "second run");
    // A shrunk base that is not the new image is not taken for a finished merge.
    let mut other = new.clone();
    other[100 * 4096] ^= 1;
    std::fs::write(&base, &other).unwrap();
    refused(&["merge", path_str(&cow), "--base", path_str(&base)], "");
    assert_file_eq(&base, &other, "a wrong shrunk base is left alone");
}

#[test]
fn verify_base_does_not_refuse_a_merge_that_has_started() {
    let c = Case::new("mrec-verify-base", 256, &[]);
    let cow = c.cow_copy("m.cow");
    let base = c.file_copy(&c.old, "b.img");
    ok(&[
        "merge",
        "--check",
        "--verify-base",
        path_str(&cow),
        "--base",
        path_str(&base),
    ]);
    ok(&["merge", path_str(&cow), "--base", path_str(&base)]);
    // The base now holds the new image: its SHA-256 is no longer the old one's, and that is
    // right for a merge that has written; the content binding says "complete".
    let st: serde_json::Value = serde_json::from_str(&ok(&[
        "merge",
        "--status",
        "--json",
        "--verify-base",
        path_str(&cow),
        "--base",
        path_str(&base),
    ]))
    .unwrap();
    assert_eq!(st["base"], "complete", "{st}");
    ok(&[
        "merge",
        "--verify-base",
        path_str(&cow),
        "--base",
        path_str(&base),
    ]);
    // Before any merge, --verify-base still checks the whole base.
    let near = c.file_copy(&c.old, "near.img");
    let mut d = read(&near);
    let last = d.len() - 1;
    d[last] ^= 1;
    std::fs::write(&near, d).unwrap();
    let fresh = c.cow_copy("f.cow");
    refused(
        &[
            "merge",
            "--verify-base",
            path_str(&fresh),
            "--base",
            path_str(&near),
        ],
        "SHA-256",
    );
}

/// `sha256sum FILE`, the independent digest a user would paste.
fn sha256sum(p: &Path) -> String {
    let o = std::process::Command::new("sha256sum")
        .arg(p)
        .output()
        .unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap()[..64].to_owned()
}

#[test]
fn without_a_record_digests_given_by_hand_guard_the_merge() {
    let c = Case::new("mrec-by-hand", 256, &["--no-record"]);
    let (old_sha, new_sha) = (sha256sum(&c.old), sha256sum(&c.new));
    let wrong = "ab".repeat(32);
    let other = c.tmp.join("other.img");
    std::fs::write(&other, snapblk_testsupport::pattern(256 * 4096, 9)).unwrap();
    let base = c.file_copy(&c.old, "b.img");
    for (b, flag, digest, want) in [
        (
            &base,
            "--base-sha256",
            wrong.as_str(),
            "not the --base-sha256 given",
        ),
        (
            &other,
            "--base-sha256",
            old_sha.as_str(),
            "not the --base-sha256 given",
        ),
        (
            &base,
            "--expect-sha256",
            wrong.as_str(),
            "not the --expect-sha256 given; nothing written",
        ),
    ] {
        let cow = c.file_copy(&c.cow, "m.cow");
        let before = [read(b), read(&cow)];
        let args = ["merge", path_str(&cow), "--base", path_str(b), flag, digest];
        refused(&args, want);
        assert!([read(b), read(&cow)] == before, "{flag}: a file changed");
        let mut check = args.to_vec();
        check.insert(1, "--check");
        refused(&check, want);
    }
    // The right digests: merged, and no warning that the base cannot be verified.
    let cow = c.file_copy(&c.cow, "m.cow");
    let o = snapblk(&[
        "merge",
        path_str(&cow),
        "--base",
        path_str(&base),
        "--base-sha256",
        &old_sha,
        "--expect-sha256",
        &new_sha,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("cannot be verified"), "{err}");
    assert_file_eq(&base, &read(&c.new), "merged with digests given by hand");
    // Once the merge has written, the base is no longer the old image.
    refused(
        &[
            "merge",
            path_str(&cow),
            "--base",
            path_str(&base),
            "--base-sha256",
            &old_sha,
        ],
        "the merge has started",
    );
    ok(&[
        "merge",
        path_str(&cow),
        "--base",
        path_str(&base),
        "--expect-sha256",
        &new_sha,
    ]);
}

#[test]
fn verify_base_without_a_record_is_refused_not_skipped() {
    // --verify-base asks for the base to be proved right; with no record nothing proves it.
    let c = Case::new("mrec-verify-none", 64, &[]);
    let cow = c.cow_copy("n.cow");
    std::fs::remove_file(format!("{}.snapblk", cow.display())).unwrap();
    let base = c.file_copy(&c.old, "b.img");
    let before = read(&base);
    for args in [
        &[
            "merge",
            "--verify-base",
            path_str(&cow),
            "--base",
            path_str(&base),
        ][..],
        &[
            "info",
            &format!(
                "snapshot:base={},cow={},verify-base=true",
                base.display(),
                cow.display()
            ),
        ][..],
    ] {
        refused(args, "verify-base needs a COW record, and none was found");
    }
    assert_file_eq(&base, &before, "the base is left alone");
    // Without --verify-base the merge goes on (with its warning).
    ok(&["merge", path_str(&cow), "--base", path_str(&base)]);
}
