//! The AOSP golden COW cases in `tests/data/aosp-cow/<case>/` (`base.img`, `snapshot.cow`,
//! `target.img`, `README.md`) and the facts their READMEs state: the op stream in file order,
//! op counts by type and the merge order AOSP computed.

use std::path::{Path, PathBuf};

/// How many cases the data set has; a missing or extra case fails every golden test.
pub const CASE_COUNT: usize = 16;

/// The one case whose op order is invalid: AOSP rejects its merge order.
pub const INVALID_MERGE_ORDER: &str = "v3_invalid_order_no_sequence";

/// `tests/data/aosp-cow` in the repository.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/aosp-cow")
}

/// One golden case directory.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub dir: PathBuf,
}

/// Every case (each directory holding a `snapshot.cow`), sorted by name; asserts there are
/// exactly [`CASE_COUNT`].
pub fn cases() -> Vec<Case> {
    let root = dir();
    let mut v: Vec<Case> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("golden data {}: {e}", root.display()))
        .map(|e| e.expect("read golden data dir").path())
        .filter(|p| p.join("snapshot.cow").is_file())
        .map(|dir| Case {
            name: dir
                .file_name()
                .expect("case dir has a name")
                .to_string_lossy()
                .into_owned(),
            dir,
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(
        v.len(),
        CASE_COUNT,
        "expected the {CASE_COUNT} golden cases in {}",
        root.display()
    );
    v
}

/// The case called `name` (panics if it does not exist).
pub fn case(name: &str) -> Case {
    let dir = dir().join(name);
    assert!(
        dir.join("snapshot.cow").is_file(),
        "no golden case {name} in {}",
        dir.display()
    );
    Case {
        name: name.to_owned(),
        dir,
    }
}

/// A case's files read into memory.
pub struct CaseData {
    pub cow: Vec<u8>,
    pub base: Vec<u8>,
    pub target: Vec<u8>,
    pub readme: String,
}

/// One `CowOperation(...)` line of a README's op stream. Fields the line does not show are 0;
/// `data_length` and `source` are what AOSP's inspect_cow prints (for REPLACE, `source` is the
/// payload's file offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadmeOp {
    /// AOSP's type name, e.g. `kCowCopyOp`, `kZeroOp`, `kCowLabelOp`.
    pub kind: String,
    pub new_block: u64,
    pub source: u64,
    pub data_length: u64,
}

impl Case {
    pub fn cow(&self) -> PathBuf {
        self.dir.join("snapshot.cow")
    }
    pub fn base(&self) -> PathBuf {
        self.dir.join("base.img")
    }
    pub fn target(&self) -> PathBuf {
        self.dir.join("target.img")
    }

    /// Whether AOSP rejects this case's merge order (verification must fail).
    pub fn invalid_merge_order(&self) -> bool {
        self.name == INVALID_MERGE_ORDER
    }

    pub fn read(&self, file: &str) -> Vec<u8> {
        let p = self.dir.join(file);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: read {}: {e}", self.name, p.display()))
    }

    pub fn readme(&self) -> String {
        String::from_utf8(self.read("README.md")).expect("README is UTF-8")
    }

    pub fn load(&self) -> CaseData {
        CaseData {
            cow: self.read("snapshot.cow"),
            base: self.read("base.img"),
            target: self.read("target.img"),
            readme: self.readme(),
        }
    }

    /// Copy `base.img` and `snapshot.cow` into `dest` (tests serve or merge copies, never the
    /// checked-in files); returns the two new paths.
    pub fn copy_inputs(&self, dest: &Path) -> (PathBuf, PathBuf) {
        let (base, cow) = (dest.join("base.img"), dest.join("snapshot.cow"));
        std::fs::copy(self.base(), &base).unwrap_or_else(|e| panic!("{}: copy: {e}", self.name));
        std::fs::copy(self.cow(), &cow).unwrap_or_else(|e| panic!("{}: copy: {e}", self.name));
        (base, cow)
    }
}

/// The op stream (file order) the README shows, one entry per `CowOperation(...)` line.
pub fn readme_ops(readme: &str) -> Vec<ReadmeOp> {
    let sec = readme
        .split("## Resulting op stream, file order")
        .nth(1)
        .expect("README has an op stream section")
        .split("```")
        .nth(1)
        .expect("op stream section has a code block");
    let mut out = Vec::new();
    for line in sec.lines() {
        let Some(rest) = line.strip_prefix("CowOperation(") else {
            continue;
        };
        let mut parts = rest.trim_end_matches(')').split(", ");
        let mut op = ReadmeOp {
            kind: parts.next().expect("op type").to_string(),
            new_block: 0,
            source: 0,
            data_length: 0,
        };
        for p in parts {
            let (k, v) = p
                .split_once(':')
                .unwrap_or_else(|| panic!("bad op field {p:?} in {line:?}"));
            let v: u64 = v
                .parse()
                .unwrap_or_else(|e| panic!("bad op field {p:?} in {line:?}: {e}"));
            match k {
                "new_block" => op.new_block = v,
                "source" => op.source = v,
                "data_length" => op.data_length = v,
                _ => {}
            }
        }
        out.push(op);
    }
    out
}

/// Counts of the data ops in the README's op stream: `[copy, replace, zero, xor]`.
pub fn readme_op_counts(readme: &str) -> [u64; 4] {
    let ops = readme_ops(readme);
    ["kCowCopyOp", "kCowReplaceOp", "kZeroOp", "kCowXorOp"]
        .map(|t| ops.iter().filter(|o| o.kind == t).count() as u64)
}

/// The merge order (new_block of each op, as AOSP's GetMergeOpIter yields) the README states.
pub fn readme_merge_order(readme: &str) -> Vec<u64> {
    let l = readme
        .lines()
        .find(|l| l.contains("merge order (new_block of each op"))
        .expect("README states the merge order");
    l.rsplit(": ")
        .next()
        .expect("merge order list")
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|e| panic!("bad merge order {l:?}: {e}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_has_its_files_and_readme_facts() {
        let cs = cases();
        assert!(cs.iter().any(|c| c.invalid_merge_order()));
        for c in cs {
            for f in [c.base(), c.target(), c.cow()] {
                assert!(f.is_file(), "{}", f.display());
            }
            let r = c.readme();
            assert!(!readme_ops(&r).is_empty(), "{}", c.name);
            assert!(!readme_merge_order(&r).is_empty(), "{}", c.name);
        }
    }

    #[test]
    fn parses_a_known_readme() {
        let r = case("v3_basic_none").readme();
        let ops = readme_ops(&r);
        assert_eq!(ops.len(), 8);
        assert_eq!(
            ops[3],
            ReadmeOp {
                kind: "kCowReplaceOp".into(),
                new_block: 8,
                source: 2097806,
                data_length: 4096
            }
        );
        assert_eq!(readme_op_counts(&r), [3, 3, 2, 0]);
        assert_eq!(readme_merge_order(&r), [20, 21, 22, 8, 9, 10, 12, 13]);
    }
}
