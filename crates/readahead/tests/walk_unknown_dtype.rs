//! The walk on a filesystem whose directory entries carry no type (readdir's d_type is
//! DT_UNKNOWN): an ext2 image made without the `filetype` feature, loop-mounted read-only. The
//! walk must then stat each entry to tell files from directories and symlinks, and still find
//! exactly the regular files, each openable through `Found::open_quiet`. Needs root (mount).

use snapblk_readahead::{WalkOptions, walk};
use snapblk_testsupport::{TempDir, pattern, tool, tool_ok};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Unmounts (lazily) on drop, so a failing assertion leaves no mount behind.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn walk_stats_entries_whose_type_the_filesystem_does_not_report() {
    let d = TempDir::new("walk-dtype");
    let tree = d.join("tree");
    let mut expect = BTreeMap::new();
    for (i, rel) in [
        "top.bin",
        "a/one.txt",
        "a/b/two.bin",
        "a/b/c/three",
        "empty",
    ]
    .iter()
    .enumerate()
    {
        let p = tree.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let data = if *rel == "empty" {
            Vec::new()
        } else {
            pattern(1000 + i * 5000, i as u64)
        };
        std::fs::write(&p, &data).unwrap();
        expect.insert(PathBuf::from(rel), data);
    }
    std::fs::create_dir_all(tree.join("emptydir")).unwrap();
    // Symlinks to a file and to a directory: neither is a regular file found by the walk.
    std::os::unix::fs::symlink("top.bin", tree.join("link-to-file")).unwrap();
    std::os::unix::fs::symlink("a", tree.join("link-to-dir")).unwrap();

    let img = d.join("fs.img");
    let (tree_s, img_s) = (tree.to_str().unwrap(), img.to_str().unwrap());
    tool_ok(
        "mke2fs",
        &[
            "-q",
            "-F",
            "-t",
            "ext2",
            "-O",
            "^filetype",
            "-d",
            tree_s,
            img_s,
            "4M",
        ],
    );
    let mnt = d.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = tool(
        "mount",
        &["-o", "loop,ro", "-t", "ext2", img_s, mnt.to_str().unwrap()],
    );
    assert!(
        m.status.success(),
        "mount (needs root): {}",
        String::from_utf8_lossy(&m.stderr)
    );
    let _mounted = Mounted(mnt.clone());

    // The premise: this filesystem really reports no entry types.
    let types: Vec<_> = std::fs::read_dir(&mnt)
        .unwrap()
        .map(|e| dtype_of(&e.unwrap().path()))
        .collect();
    assert!(
        types.iter().all(|t| *t == rustix::fs::FileType::Unknown),
        "{types:?}"
    );

    let found = Mutex::new(BTreeMap::new());
    let opts = WalkOptions {
        recursive: true,
        one_file_system: false,
        threads: 3,
        follow_symlinks: false,
    };
    let errors = walk(std::slice::from_ref(&mnt), &opts, |f| {
        let mut data = Vec::new();
        f.open_quiet()
            .and_then(|mut file| file.read_to_end(&mut data))
            .unwrap_or_else(|e| panic!("{}: {e}", f.path().display()));
        let rel = f.path().strip_prefix(&mnt).unwrap().to_path_buf();
        assert!(
            found.lock().unwrap().insert(rel, data).is_none(),
            "{} found twice",
            f.path().display()
        );
    });
    assert!(errors.is_empty(), "{errors:?}");
    let found = found.into_inner().unwrap();
    assert_eq!(
        found.keys().collect::<Vec<_>>(),
        expect.keys().collect::<Vec<_>>(),
        "files found"
    );
    for (rel, data) in &expect {
        assert!(
            found[rel] == *data,
            "{} read back differently",
            rel.display()
        );
    }
}

/// The d_type readdir reports for `path`'s entry in its parent directory.
fn dtype_of(path: &Path) -> rustix::fs::FileType {
    let parent = std::fs::File::open(path.parent().unwrap()).unwrap();
    let name = path.file_name().unwrap();
    rustix::fs::Dir::read_from(&parent)
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.file_name().to_bytes() == name.as_encoded_bytes())
        .map(|e| e.file_type())
        .unwrap()
}
