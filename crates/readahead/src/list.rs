//! Readahead lists: which byte ranges of which files to bring into the page cache.
//!
//! Three line forms are read, and may even be mixed in one file:
//!
//! * **text v1** (written by `record`), three TAB-separated fields:
//!   `PATH<TAB>dev=MAJ:MIN ino=N size=N mtime=SEC.NSEC<TAB>OFF:LEN,OFF:LEN,...`.
//!   The identity field may be `-` (none) and the range field `*` (whole file). PATH is escaped:
//!   `\\`, `\t`, `\n`, `\r` and `\xHH` (any control byte, any non-UTF-8 byte, and a leading `#`
//!   or `{`), so any Linux path fits on one line.
//! * **JSON Lines**, one object per line (a line starting with `{`):
//!   `{"path":"<escaped as above>","identity":{...}|null,"ranges":"*"|[[off,len],...]}`.
//! * **classic block list**: `filename offset:length,offset:length` (no TAB). File names are
//!   taken verbatim (no escapes) and may contain spaces, so the last space-separated token is
//!   the range list when it *looks like one* (see [`looks_like_range_list`]: it contains `:`
//!   and only digits, `:`, `,` and letters inside numbers such as `40g96`). Such a token must
//!   then parse, or the line is an error naming the token; a typo must not turn into a file
//!   name that is silently reported as missing. Any other line is a file name meaning "the
//!   whole file".
//!
//! Blank lines and lines starting with `#` are ignored. Offsets and lengths are decimal bytes;
//! ranges may be unsorted or overlap (they are normalised). The parser is meant for untrusted
//! input: every error is typed and carries its line number, lines and entry counts are bounded.

use crate::{Range, RangeSet};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{BufRead, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// First line written by [`write_text`].
pub(crate) const TEXT_HEADER: &str = "# snapblk-readahead-list v1";

/// What a file looked like when its entry was recorded; a mismatch marks the entry stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileIdentity {
    /// Major number of the device holding the file (`st_dev`), as stat(2) reports it.
    pub dev_major: u32,
    /// Minor number of the device holding the file (`st_dev`).
    pub dev_minor: u32,
    /// Inode number (`st_ino`); together with the device it names the file regardless of path.
    pub ino: u64,
    /// File size in bytes (`st_size`) when recorded.
    pub size: u64,
    /// Modification time (`st_mtime`), whole seconds since the Unix epoch.
    pub mtime_sec: i64,
    /// Nanosecond part of the modification time, 0..1_000_000_000.
    pub mtime_nsec: u32,
}

impl FileIdentity {
    /// The identity of a file from its metadata (stat(2) or `File::metadata`), to store in a list
    /// entry and compare at replay.
    pub fn of(meta: &std::fs::Metadata) -> FileIdentity {
        let dev = meta.dev();
        FileIdentity {
            dev_major: libc::major(dev),
            dev_minor: libc::minor(dev),
            ino: meta.ino(),
            size: meta.size(),
            mtime_sec: meta.mtime(),
            mtime_nsec: meta.mtime_nsec().clamp(0, 999_999_999) as u32,
        }
    }

    /// Names of the fields that differ between `self` (recorded) and `now`.
    pub fn diff(&self, now: &FileIdentity) -> Vec<&'static str> {
        let mut v = Vec::new();
        if (self.dev_major, self.dev_minor) != (now.dev_major, now.dev_minor) {
            v.push("dev");
        }
        if self.ino != now.ino {
            v.push("ino");
        }
        if self.size != now.size {
            v.push("size");
        }
        if (self.mtime_sec, self.mtime_nsec) != (now.mtime_sec, now.mtime_nsec) {
            v.push("mtime");
        }
        v
    }

    fn to_text(self) -> String {
        format!(
            "dev={}:{} ino={} size={} mtime={}.{:09}",
            self.dev_major, self.dev_minor, self.ino, self.size, self.mtime_sec, self.mtime_nsec
        )
    }

    fn parse_text(s: &str) -> Result<FileIdentity, ParseErrorKind> {
        let bad = |m: &str| ParseErrorKind::BadIdentity(m.to_string());
        let (mut dev, mut ino, mut size, mut mtime) = (None, None, None, None);
        for kv in s.split(' ').filter(|t| !t.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad("expected key=value"))?;
            let slot = match k {
                "dev" => &mut dev,
                "ino" => &mut ino,
                "size" => &mut size,
                "mtime" => &mut mtime,
                _ => return Err(bad("unknown key")),
            };
            if slot.replace(v).is_some() {
                return Err(bad("duplicate key"));
            }
        }
        let (Some(dev), Some(ino), Some(size), Some(mtime)) = (dev, ino, size, mtime) else {
            return Err(bad("need dev, ino, size and mtime"));
        };
        let (ma, mi) = dev
            .split_once(':')
            .ok_or_else(|| bad("dev must be MAJ:MIN"))?;
        let (sec, nsec) = mtime.split_once('.').unwrap_or((mtime, "0"));
        let nsec: u32 = parse_dec(nsec).ok_or_else(|| bad("bad mtime nanoseconds"))?;
        if nsec > 999_999_999 {
            return Err(bad("mtime nanoseconds out of range"));
        }
        Ok(FileIdentity {
            dev_major: parse_dec(ma).ok_or_else(|| bad("bad dev major"))?,
            dev_minor: parse_dec(mi).ok_or_else(|| bad("bad dev minor"))?,
            ino: parse_dec(ino).ok_or_else(|| bad("bad ino"))?,
            size: parse_dec(size).ok_or_else(|| bad("bad size"))?,
            mtime_sec: sec.parse::<i64>().map_err(|_| bad("bad mtime seconds"))?,
            mtime_nsec: nsec,
        })
    }
}

/// Which part of a file an entry covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extent {
    /// The whole file, whatever its size at replay (`*` in JSON Lines).
    Whole,
    /// Only these byte ranges; at replay they are clipped to the file's current size.
    Ranges(RangeSet),
}

impl Extent {
    /// The concrete ranges for a file of `size` bytes.
    pub fn resolve(&self, size: u64) -> RangeSet {
        match self {
            Extent::Whole => match Range::new(0, size) {
                Some(r) => RangeSet::from_ranges(vec![r]),
                None => RangeSet::new(),
            },
            Extent::Ranges(rs) => rs.clip(size),
        }
    }
}

/// One file of a readahead list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    /// The file's path, absolute in recorded lists; escaped in text form by [`escape_path`].
    pub path: PathBuf,
    /// The file's identity when recorded; `None` (classic lists, hand-written entries) disables the
    /// staleness check.
    pub identity: Option<FileIdentity>,
    /// Which bytes of the file to bring into the cache.
    pub extent: Extent,
}

use snapblk_blocklist::{Limits, ParseError, ParseErrorKind};

fn parse_dec<T: std::str::FromStr>(s: &str) -> Option<T> {
    // Reject signs and blanks that FromStr would accept for some types.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_ranges(s: &str) -> Result<RangeSet, ParseErrorKind> {
    let mut v = Vec::new();
    for tok in s.split(',') {
        let (o, l) = tok
            .split_once(':')
            .ok_or_else(|| ParseErrorKind::BadRange(short(tok)))?;
        let o: u64 = parse_dec(o).ok_or_else(|| ParseErrorKind::BadRange(short(tok)))?;
        let l: u64 = parse_dec(l).ok_or_else(|| ParseErrorKind::BadRange(short(tok)))?;
        if l == 0 {
            return Err(ParseErrorKind::EmptyRange);
        }
        // Offsets are off_t in the kernel.
        let end = o.checked_add(l).ok_or(ParseErrorKind::RangeOverflow)?;
        if end > i64::MAX as u64 {
            return Err(ParseErrorKind::RangeOverflow);
        }
        v.push(Range { offset: o, len: l });
    }
    Ok(RangeSet::from_ranges(v))
}

fn short(s: &str) -> String {
    s.chars().take(40).collect()
}

/// Escapes a path for the text and JSON forms.
pub fn escape_path(p: &Path) -> String {
    let b = p.as_os_str().as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        // Decode one UTF-8 char if valid, else escape the byte.
        let rest = &b[i..];
        let ch_len = match rest.first() {
            Some(&c) if c < 0x80 => 1,
            Some(&c) if c >= 0xf0 => 4,
            Some(&c) if c >= 0xe0 => 3,
            Some(&c) if c >= 0xc0 => 2,
            _ => 1,
        };
        let ch = rest.get(..ch_len).and_then(|s| std::str::from_utf8(s).ok());
        match ch {
            Some("\\") => out.push_str("\\\\"),
            Some("\t") => out.push_str("\\t"),
            Some("\n") => out.push_str("\\n"),
            Some("\r") => out.push_str("\\r"),
            Some(s) if i == 0 && (s == "#" || s == "{") => {
                out.push_str(&format!("\\x{:02x}", s.as_bytes()[0]))
            }
            Some(s) if s.len() == 1 && (s.as_bytes()[0] < 0x20 || s.as_bytes()[0] == 0x7f) => {
                out.push_str(&format!("\\x{:02x}", s.as_bytes()[0]))
            }
            Some(s) => {
                out.push_str(s);
                i += s.len();
                continue;
            }
            None => out.push_str(&format!("\\x{:02x}", rest[0])),
        }
        i += ch.map_or(1, |s| s.len());
    }
    out
}

/// Inverse of [`escape_path`].
pub(crate) fn unescape_path(s: &str) -> Result<PathBuf, ParseErrorKind> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        match b.get(i + 1) {
            Some(b'\\') => out.push(b'\\'),
            Some(b't') => out.push(b'\t'),
            Some(b'n') => out.push(b'\n'),
            Some(b'r') => out.push(b'\r'),
            Some(b'x') => {
                let hex = b
                    .get(i + 2..i + 4)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| ParseErrorKind::BadEscape(short(&s[i..])))?;
                out.push(hex);
                i += 4;
                continue;
            }
            _ => return Err(ParseErrorKind::BadEscape(short(&s[i..]))),
        }
        i += 2;
    }
    check_path(out)
}

fn check_path(b: Vec<u8>) -> Result<PathBuf, ParseErrorKind> {
    if b.is_empty() {
        return Err(ParseErrorKind::EmptyPath);
    }
    if b.len() > 4096 {
        return Err(ParseErrorKind::PathTooLong);
    }
    if b.contains(&0) {
        return Err(ParseErrorKind::NulInPath);
    }
    Ok(PathBuf::from(OsString::from_vec(b)))
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    path: String,
    #[serde(default)]
    identity: Option<FileIdentity>,
    ranges: JsonExtent,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum JsonExtent {
    Whole(String),
    Ranges(Vec<(u64, u64)>),
}

fn parse_line(line: &[u8]) -> Result<Option<ListEntry>, ParseErrorKind> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(|c| c.is_ascii_whitespace()) || line.first() == Some(&b'#') {
        return Ok(None);
    }
    if line.first() == Some(&b'{') {
        let j: JsonEntry = serde_json::from_slice(line).map_err(ParseErrorKind::Json)?;
        let extent = match j.ranges {
            JsonExtent::Whole(s) if s == "*" => Extent::Whole,
            JsonExtent::Whole(s) => return Err(ParseErrorKind::BadRange(short(&s))),
            JsonExtent::Ranges(v) => {
                let mut rs = Vec::with_capacity(v.len());
                for (o, l) in v {
                    if l == 0 {
                        return Err(ParseErrorKind::EmptyRange);
                    }
                    let end = o.checked_add(l).ok_or(ParseErrorKind::RangeOverflow)?;
                    if end > i64::MAX as u64 {
                        return Err(ParseErrorKind::RangeOverflow);
                    }
                    rs.push(Range { offset: o, len: l });
                }
                Extent::Ranges(RangeSet::from_ranges(rs))
            }
        };
        // The same bound as the text form's, so every list read can be written back.
        if let Some(id) = &j.identity
            && id.mtime_nsec > 999_999_999
        {
            return Err(ParseErrorKind::BadIdentity(
                "mtime nanoseconds out of range".into(),
            ));
        }
        return Ok(Some(ListEntry {
            path: unescape_path(&j.path)?,
            identity: j.identity,
            extent,
        }));
    }
    if line.contains(&b'\t') {
        let s = std::str::from_utf8(line)
            .map_err(|_| ParseErrorKind::BadEscape("text v1 lines must be UTF-8".into()))?;
        let fields: Vec<&str> = s.split('\t').collect();
        let [p, id, r] = fields[..] else {
            return Err(ParseErrorKind::FieldCount(fields.len()));
        };
        let identity = if id == "-" {
            None
        } else {
            Some(FileIdentity::parse_text(id)?)
        };
        let extent = if r == "*" {
            Extent::Whole
        } else {
            Extent::Ranges(parse_ranges(r)?)
        };
        return Ok(Some(ListEntry {
            path: unescape_path(p)?,
            identity,
            extent,
        }));
    }
    // Classic `filename offset:length,...`, file names verbatim. Spaces after the range list
    // are tolerated; a name without a range list keeps its trailing spaces.
    let trimmed = trim_end_spaces(line);
    if let Some(sp) = trimmed.iter().rposition(|&c| c == b' ')
        && looks_like_range_list(&trimmed[sp + 1..])
    {
        let tok = String::from_utf8_lossy(&trimmed[sp + 1..]);
        let rs = parse_ranges(&tok).map_err(|e| ParseErrorKind::BadRangeList {
            token: short(&tok),
            error: Box::new(e),
        })?;
        return Ok(Some(ListEntry {
            path: check_path(trim_end_spaces(&trimmed[..sp]).to_vec())?,
            identity: None,
            extent: Extent::Ranges(rs),
        }));
    }
    Ok(Some(ListEntry {
        path: check_path(line.to_vec())?,
        identity: None,
        extent: Extent::Whole,
    }))
}

fn trim_end_spaces(b: &[u8]) -> &[u8] {
    &b[..b.iter().rposition(|&c| c != b' ').map_or(0, |e| e + 1)]
}

/// Whether the last token of a classic line is an attempted range list (and so must parse):
/// it contains `:` and a digit, and consists of digits, `:`, `,` and letters that follow a
/// digit (typos and unit suffixes inside numbers: `40g96:8192`, `4k:8k`). A file name ending
/// in `Track 1:Intro` or `a:b` does not qualify, since its letters do not follow a digit.
pub(crate) fn looks_like_range_list(tok: &[u8]) -> bool {
    tok.contains(&b':')
        && tok.iter().any(u8::is_ascii_digit)
        && tok.iter().enumerate().all(|(i, &c)| match c {
            b'0'..=b'9' | b':' | b',' => true,
            // The letter run must start right after a digit.
            c if c.is_ascii_alphabetic() => tok[..i]
                .iter()
                .rev()
                .find(|p| !p.is_ascii_alphabetic())
                .is_some_and(u8::is_ascii_digit),
            _ => false,
        })
}

/// Parses a list from a reader, with bounds.
pub fn parse_reader<R: BufRead>(mut r: R, limits: Limits) -> Result<Vec<ListEntry>, ParseError> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut lineno = 0u64;
    loop {
        buf.clear();
        lineno += 1;
        let n = (&mut r)
            .take(limits.max_line as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| ParseError {
                line: lineno,
                kind: ParseErrorKind::Io(e),
            })?;
        if n == 0 {
            break;
        }
        if buf.len() > limits.max_line {
            return Err(ParseError {
                line: lineno,
                kind: ParseErrorKind::LineTooLong(limits.max_line),
            });
        }
        match parse_line(&buf) {
            Ok(Some(e)) => {
                if out.len() >= limits.max_entries {
                    return Err(ParseError {
                        line: lineno,
                        kind: ParseErrorKind::TooManyEntries(limits.max_entries),
                    });
                }
                out.push(e);
            }
            Ok(None) => {}
            Err(kind) => return Err(ParseError { line: lineno, kind }),
        }
    }
    Ok(out)
}

/// Parses a list held in memory (the fuzz entry point).
pub fn parse_bytes(b: &[u8], limits: Limits) -> Result<Vec<ListEntry>, ParseError> {
    parse_reader(b, limits)
}

fn ranges_text(e: &Extent) -> String {
    match e {
        Extent::Whole => "*".into(),
        Extent::Ranges(rs) if rs.is_empty() => "*".into(),
        Extent::Ranges(rs) => {
            let v: Vec<String> = rs
                .ranges()
                .iter()
                .map(|r| format!("{}:{}", r.offset, r.len))
                .collect();
            v.join(",")
        }
    }
}

/// Writes the text v1 form (with header). Entries with an empty range set are skipped, since
/// `*` would widen them to the whole file.
pub fn write_text<W: Write>(mut w: W, entries: &[ListEntry]) -> std::io::Result<()> {
    writeln!(w, "{TEXT_HEADER}")?;
    writeln!(w, "# path<TAB>identity<TAB>offset:length,...")?;
    for e in entries
        .iter()
        .filter(|e| !matches!(&e.extent, Extent::Ranges(r) if r.is_empty()))
    {
        let id = e.identity.map_or_else(|| "-".to_string(), |i| i.to_text());
        writeln!(
            w,
            "{}\t{}\t{}",
            escape_path(&e.path),
            id,
            ranges_text(&e.extent)
        )?;
    }
    Ok(())
}

/// Writes the JSON Lines form (same skipping rule as [`write_text`]).
pub fn write_jsonl<W: Write>(mut w: W, entries: &[ListEntry]) -> std::io::Result<()> {
    for e in entries
        .iter()
        .filter(|e| !matches!(&e.extent, Extent::Ranges(r) if r.is_empty()))
    {
        let j = JsonEntry {
            path: escape_path(&e.path),
            identity: e.identity,
            ranges: match &e.extent {
                Extent::Whole => JsonExtent::Whole("*".into()),
                Extent::Ranges(rs) => {
                    JsonExtent::Ranges(rs.ranges().iter().map(|r| (r.offset, r.len)).collect())
                }
            },
        };
        serde_json::to_writer(&mut w, &j)?;
        writeln!(w)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(s: &str) -> Result<Vec<ListEntry>, ParseError> {
        parse_bytes(s.as_bytes(), Limits::default())
    }

    #[test]
    fn classic_form() {
        let v = parse("/usr/lib/a.so 0:4096,8192:100\n/my file 1:1\n/plain name\n\n# c\n").unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].path, Path::new("/usr/lib/a.so"));
        assert_eq!(
            v[0].extent,
            Extent::Ranges(RangeSet::from_ranges(vec![
                Range {
                    offset: 0,
                    len: 4096
                },
                Range {
                    offset: 8192,
                    len: 100
                }
            ]))
        );
        assert_eq!(v[1].path, Path::new("/my file"));
        assert_eq!(v[2].path, Path::new("/plain name"));
        assert_eq!(v[2].extent, Extent::Whole);
    }

    #[test]
    fn json_identity_nanoseconds_are_bounded_as_in_the_text_form() {
        let line = |nsec: u32| {
            format!(
                "{{\"path\":\"/a\",\"identity\":{{\"dev_major\":8,\"dev_minor\":1,\"ino\":2,\
                 \"size\":3,\"mtime_sec\":4,\"mtime_nsec\":{nsec}}},\"ranges\":\"*\"}}\n"
            )
        };
        let ok = parse(&line(999_999_999)).unwrap();
        // What is read can be written and read back.
        let mut text = Vec::new();
        write_text(&mut text, &ok).unwrap();
        assert_eq!(parse_bytes(&text, Limits::default()).unwrap(), ok);
        let e = parse(&line(1_000_000_000)).unwrap_err();
        assert_eq!(e.line, 1);
        assert!(
            e.to_string().contains("mtime nanoseconds out of range"),
            "{e}"
        );
    }

    #[test]
    fn classic_range_typos_are_line_errors_naming_the_token() {
        let bad = |text: &str, line: u64, token: &str| {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            match &e.kind {
                ParseErrorKind::BadRangeList { token: t, .. } => assert_eq!(t, token, "{e}"),
                k => panic!("{text:?}: expected BadRangeList, got {k:?}"),
            }
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("line {line}: ")), "{msg}");
            assert!(msg.contains(&format!("{token:?}")), "{msg}");
        };
        bad(
            "/usr/lib/a.so 0:4096\n/usr/lib/x.so 0:4096,40g96:8192\n",
            2,
            "0:4096,40g96:8192",
        );
        bad("x 0:4096,\n", 1, "0:4096,");
        bad("# c\n\nx 12:\n", 3, "12:");
        bad("/x/big 0:4096,8192\n", 1, "0:4096,8192");
        bad("/x/big 4k:8k\n", 1, "4k:8k");
        bad("/x/big :4096\n", 1, ":4096");
        bad("/x/big 0:0\n", 1, "0:0");
        bad("/x/big 0:4096,  \n", 1, "0:4096,"); // trailing blanks do not hide the token
        bad("/x/big 0:4096 12:\n", 1, "12:");
        let e = parse("x 0:4096,40g96:8192\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 1: bad range list \"0:4096,40g96:8192\" in a classic `FILE OFFSET:LENGTH,...` \
             line: bad range \"40g96:8192\" (expected OFFSET:LENGTH in decimal bytes)"
        );
        let e = parse("x 18446744073709551615:2\n").unwrap_err();
        assert!(
            matches!(&e.kind, ParseErrorKind::BadRangeList { error, .. }
                if matches!(**error, ParseErrorKind::RangeOverflow)),
            "{e}"
        );
    }

    #[test]
    fn classic_names_with_spaces_and_colons_stay_names() {
        for name in [
            "/music/Track 1:Intro",
            "/data/a:b",
            "/data/backup 2024-01-01",
            "/srv/file 8192",
            "/srv/x 0x",
            "/plain",
            "/trailing blank ",
            "/tab-free:name 12:x",
        ] {
            let v = parse(&format!("{name}\n")).unwrap();
            assert_eq!(v[0].path, Path::new(name), "{name:?}");
            assert_eq!(v[0].extent, Extent::Whole, "{name:?}");
        }
        let v = parse("/my dir/a file  0:10 \n").unwrap();
        assert_eq!(v[0].path, Path::new("/my dir/a file"));
        assert_eq!(
            v[0].extent,
            Extent::Ranges(RangeSet::from_ranges(vec![Range { offset: 0, len: 10 }]))
        );
    }

    #[test]
    fn range_list_detection() {
        for yes in [
            "0:1",
            "12:",
            ":4",
            "40g96:8192",
            "0:4096,",
            "1,2:3",
            "0x10:4",
        ] {
            assert!(looks_like_range_list(yes.as_bytes()), "{yes}");
        }
        for no in [
            "", "8192", "a:b", "1:Intro", "x1:2", "0:4096;", "0-1:2", "1.5:2", "é1:2",
        ] {
            assert!(!looks_like_range_list(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn errors_carry_line_numbers() {
        let e = parse("# hdr\n/a\t-\t0:0\n").unwrap_err();
        assert!(
            matches!(
                e,
                ParseError {
                    line: 2,
                    kind: ParseErrorKind::EmptyRange
                }
            ),
            "{e}"
        );
        let e = parse("/a\t-\t18446744073709551615:2\n").unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::RangeOverflow), "{e}");
        let e = parse("/a\tdev=1 ino=2\t*\n").unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::BadIdentity(_)));
        let e = parse("\n\n/a\\q\t-\t*\n").unwrap_err();
        assert_eq!(e.line, 3);
        let e = parse("/a\t-\n").unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::FieldCount(2)), "{e}");
        let e = parse("{\"path\":\"/a\",\"ranges\":[[1,0]]}\n").unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::EmptyRange), "{e}");
        let e = parse("{\"path\":\"/a\",\"ranges\":\"*\",\"x\":1}\n").unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::Json(_)));
        let e = parse_bytes(
            &[b'a'; 100],
            Limits {
                max_line: 10,
                max_entries: 5,
            },
        )
        .unwrap_err();
        assert!(matches!(e.kind, ParseErrorKind::LineTooLong(10)), "{e}");
        let e = parse_bytes(
            b"a\nb\nc\n",
            Limits {
                max_line: 10,
                max_entries: 2,
            },
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                ParseError {
                    line: 3,
                    kind: ParseErrorKind::TooManyEntries(2)
                }
            ),
            "{e}"
        );
    }

    fn arb_entry() -> impl Strategy<Value = ListEntry> {
        (
            proptest::collection::vec(any::<u8>().prop_filter("no NUL", |b| *b != 0), 1..40),
            proptest::option::of((
                any::<u32>(),
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<i64>(),
                0u32..1_000_000_000,
            )),
            proptest::option::of(proptest::collection::vec(
                (0u64..1 << 40, 1u64..1 << 30),
                1..6,
            )),
        )
            .prop_map(|(p, id, rs)| ListEntry {
                path: PathBuf::from(OsString::from_vec(p)),
                identity: id.map(|(a, b, c, d, e, f)| FileIdentity {
                    dev_major: a,
                    dev_minor: b,
                    ino: c,
                    size: d,
                    mtime_sec: e,
                    mtime_nsec: f,
                }),
                extent: match rs {
                    None => Extent::Whole,
                    Some(v) => Extent::Ranges(RangeSet::from_ranges(
                        v.into_iter()
                            .map(|(o, l)| Range { offset: o, len: l })
                            .collect(),
                    )),
                },
            })
    }

    /// A classic-form file name: no NUL, newline, CR or TAB (a TAB makes a text v1 line), not
    /// starting with `#` or `{` (comment, JSON), with a non-blank last byte (blanks before the
    /// range list are separators).
    fn arb_classic_name() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(
            prop_oneof![
                Just(b' '),
                Just(b':'),
                Just(b','),
                Just(b'1'),
                any::<u8>().prop_filter("no line breaks, TAB or NUL", |b| {
                    !matches!(*b, 0 | b'\n' | b'\r' | b'\t')
                })
            ],
            1..40,
        )
        .prop_filter("a usable classic name", |n| {
            !matches!(n.first(), Some(b'#' | b'{'))
                && n.last().is_some_and(|&c| c != b' ')
                && !n.iter().all(u8::is_ascii_whitespace)
        })
    }

    proptest! {
        #[test]
        fn classic_lines_round_trip(
            name in arb_classic_name(),
            ranges in proptest::collection::vec((0u64..1 << 40, 1u64..1 << 30), 1..6),
            sep in 1usize..3,
        ) {
            let mut line = name.clone();
            line.extend(std::iter::repeat_n(b' ', sep));
            let toks: Vec<String> = ranges.iter().map(|(o, l)| format!("{o}:{l}")).collect();
            line.extend(toks.join(",").as_bytes());
            line.push(b'\n');
            let want = ListEntry {
                path: PathBuf::from(OsString::from_vec(name)),
                identity: None,
                extent: Extent::Ranges(RangeSet::from_ranges(
                    ranges.iter().map(|&(offset, len)| Range { offset, len }).collect(),
                )),
            };
            prop_assert_eq!(parse_bytes(&line, Limits::default()).unwrap(), vec![want.clone()]);
            // And on through the native forms.
            let mut t = Vec::new();
            write_text(&mut t, std::slice::from_ref(&want)).unwrap();
            prop_assert_eq!(parse_bytes(&t, Limits::default()).unwrap(), vec![want]);
        }

        #[test]
        fn classic_whole_file_names_round_trip(name in arb_classic_name()) {
            let last = name.rsplit(|&c| c == b' ').next().unwrap_or(&[]);
            prop_assume!(!name.contains(&b' ') || !looks_like_range_list(last));
            let mut line = name.clone();
            line.push(b'\n');
            let v = parse_bytes(&line, Limits::default()).unwrap();
            prop_assert_eq!(v, vec![ListEntry {
                path: PathBuf::from(OsString::from_vec(name)),
                identity: None,
                extent: Extent::Whole,
            }]);
        }

        /// A last token that looks like a range list is never folded into a file name: the
        /// line is a range entry or an error that names the token.
        #[test]
        fn attempted_range_lists_never_become_names(
            name in arb_classic_name(),
            tok in "[0-9:,]{0,5}[0-9][a-z]{0,2}[0-9:,]{0,5}:[0-9,]{0,4}",
        ) {
            prop_assume!(looks_like_range_list(tok.as_bytes()));
            let mut line = name;
            line.push(b' ');
            line.extend(tok.as_bytes());
            line.push(b'\n');
            match parse_bytes(&line, Limits::default()) {
                Ok(v) => prop_assert!(matches!(v[0].extent, Extent::Ranges(_)), "{:?}", v),
                Err(e) => prop_assert!(
                    matches!(&e.kind, ParseErrorKind::BadRangeList { token, .. } if *token == tok)
                        || matches!(e.kind, ParseErrorKind::EmptyPath),
                    "{}", e
                ),
            }
        }

        #[test]
        fn text_round_trip(entries in proptest::collection::vec(arb_entry(), 0..8)) {
            let mut buf = Vec::new();
            write_text(&mut buf, &entries).unwrap();
            prop_assert_eq!(parse_bytes(&buf, Limits::default()).unwrap(), entries);
        }

        #[test]
        fn jsonl_round_trip(entries in proptest::collection::vec(arb_entry(), 0..8)) {
            let mut buf = Vec::new();
            write_jsonl(&mut buf, &entries).unwrap();
            prop_assert_eq!(parse_bytes(&buf, Limits::default()).unwrap(), entries);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_bytes(&b, Limits { max_line: 256, max_entries: 16 });
        }
    }
}
