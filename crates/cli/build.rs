//! Embeds the git commit the binary is built from (`snapblk --version`). Without git or outside
//! a repository (a source tarball) the commit is `SNAPBLK_GIT_COMMIT` if set, else "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=SNAPBLK_GIT_COMMIT");
    let commit = std::env::var("SNAPBLK_GIT_COMMIT")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it points at (a commit),
    // packed refs. Only files that exist: a missing one would rerun this script every build.
    let mut watch = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        watch.push(format!("{dir}/HEAD"));
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.extend(git(&["rev-parse", "--git-path", &r]));
    }
    watch.extend(git(&["rev-parse", "--git-path", "packed-refs"]));
    for p in watch.iter().filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={p}");
    }
    let commit = commit.unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SNAPBLK_GIT_COMMIT={commit}");
}
