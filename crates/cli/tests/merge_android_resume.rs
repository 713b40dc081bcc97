//! `snapblk merge` resumes a merge AOSP's snapuserd left in the middle of a window. The crashed
//! COW + base are built from the specification alone by the snapshot crate's test helper (see
//! crates/snapshot/tests/support/android_crash.rs; the library-level checks, reads before
//! resuming included, are in crates/snapshot/tests/android_resume.rs).

// Shared with the library-level test, which uses all of it.
#[allow(dead_code)]
#[path = "../../snapshot/tests/support/android_crash.rs"]
mod android_crash;

use android_crash::{assert_merged, crashes, for_each_golden_input, redone_from_scratch};
use snapblk_testsupport::{TempDir, path_str, tool_ok};

#[test]
fn cli_merge_resumes_states_snapuserd_leaves() {
    let mut runs = 0;
    for_each_golden_input(|name, inp| {
        for (kill, c) in crashes(inp) {
            let what = format!("{name} {kill:?}");
            // The case and kill in the directory name name them in a failure report.
            let dir = TempDir::new(&format!("cli-android-resume-{name}-{kill:?}"));
            let (base, cow) = (dir.join("base.img"), dir.join("snapshot.cow"));
            std::fs::write(&base, &c.base).unwrap();
            std::fs::write(&cow, &c.cow).unwrap();
            let args = ["merge", path_str(&cow), "--base", path_str(&base), "--json"];
            let out = tool_ok(env!("CARGO_BIN_EXE_snapblk"), &args);
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["report"]["resumed_at"], c.num_merge_ops, "{what}");
            let redo = redone_from_scratch(&c, kill);
            assert_eq!(v["report"]["resumed_from_scratch"], redo, "{what}");
            assert_merged(inp, &c, &base, &cow, &what);
            runs += 1;
        }
    });
    assert_eq!(runs, 8);
}
