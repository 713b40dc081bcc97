//! ext4 images of directory trees, made by `mkfs.ext4 -d` (e2fsprogs, installed by
//! scripts/install-deps.sh; a missing tool fails the test).

use crate::{path_str, tool_ok};
use std::path::Path;

/// An ext4 image of `mib` MiB at `img` holding the tree `dir`, with 4 KiB blocks, root-owned
/// files and a fixed UUID and directory hash seed, so two images of similar trees differ only
/// where the trees do. Returns its bytes.
pub fn mkfs(dir: &Path, img: &Path, mib: u32) -> Vec<u8> {
    tool_ok(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-b",
            "4096",
            "-U",
            "6f2c6e8e-5b1a-4c43-9d61-2f1f6b0d7a10",
            "-E",
            "root_owner=0:0,hash_seed=0b7a8f6c-41a9-4f35-8d39-8a8d2c1c4f01",
            "-d",
            path_str(dir),
            path_str(img),
            &format!("{mib}M"),
        ],
    );
    std::fs::read(img).unwrap()
}

/// Write `files` (path in the tree, bytes) under `parent/tag` and make `parent/tag.img` of
/// `mib` MiB of that tree with [`mkfs`]. Returns the image's bytes.
pub fn of_files(parent: &Path, tag: &str, files: &[(&str, Vec<u8>)], mib: u32) -> Vec<u8> {
    let dir = parent.join(tag);
    for (name, bytes) in files {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    std::fs::create_dir_all(&dir).unwrap();
    mkfs(&dir, &parent.join(format!("{tag}.img")), mib)
}
