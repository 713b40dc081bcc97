//! Byte sizes as people type them: the one size grammar ([`parse_size`]).

/// Why a size did not parse. Each variant holds the (trimmed) text that was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// A well-formed negative size.
    #[error("size {0} is out of range: it cannot be negative")]
    Negative(String),
    /// No number where one was expected.
    #[error("bad size {0:?}")]
    BadNumber(String),
    /// A number followed by something that is not a unit.
    #[error("bad size unit in {0:?}")]
    BadUnit(String),
    /// More than 2^64-1 bytes.
    #[error("size {0:?} overflows")]
    Overflow(String),
}

/// Parse a size: `4096`, `4k`, `4K`, `4KiB`, `4kB`, `64m`, `1G`, `2t`, `1P`. This is the one
/// grammar behind device specs (`null:size=1G`), bench job files and options (`bs=4KiB`,
/// `--bs 4k`) and the readahead tool's `--chunk`.
///
/// The grammar is fio's, with binary units only (fio's default `kb_base=1024`):
///
/// ```text
/// size := WS* ["+"] DIGITS [UNIT] [SUFFIX] WS*
/// UNIT := "k" | "m" | "g" | "t" | "p"        1024^1 .. 1024^5, any case
/// SUFFIX := ("ib")* ("b")*                   any case: 4KiB = 4kB = 4K = 4096; 512B = 512
/// ```
///
/// A negative number is refused with its own error (`size -1 is out of range`), so a user who
/// types `-1` learns why.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    if let Some(abs) = t.strip_prefix('-')
        && parse_size(abs).is_ok()
    {
        return Err(SizeError::Negative(t.to_string()));
    }
    let u = t.strip_prefix('+').unwrap_or(t);
    let num_end = u.find(|c: char| !c.is_ascii_digit()).unwrap_or(u.len());
    let (num, unit) = u.split_at(num_end);
    let n: u64 = num
        .parse()
        .map_err(|_| SizeError::BadNumber(t.to_string()))?;
    let unit = unit.to_ascii_lowercase();
    let mult: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        "p" => 1 << 50,
        _ => return Err(SizeError::BadUnit(t.to_string())),
    };
    n.checked_mul(mult)
        .ok_or_else(|| SizeError::Overflow(t.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The three grammars this one replaced, verbatim but for their error types: every input
    /// one of them accepted must parse to the same value here (inputs may widen, never narrow).
    mod old {
        /// `snapblk::parse_size` (device specs).
        pub(super) fn spec(s: &str) -> Option<u64> {
            let (num, mul) = match s.as_bytes().last()? {
                b'k' | b'K' => (&s[..s.len() - 1], 1u64 << 10),
                b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
                b'g' | b'G' => (&s[..s.len() - 1], 1 << 30),
                b't' | b'T' => (&s[..s.len() - 1], 1 << 40),
                _ => (s, 1),
            };
            num.parse::<u64>().ok()?.checked_mul(mul)
        }

        /// `snapblk_loadgen::parse_size` (fio style).
        pub(super) fn bench(s: &str) -> Option<u64> {
            let t = s.trim();
            if let Some(abs) = t.strip_prefix('-')
                && bench(abs).is_some()
            {
                return None;
            }
            let lower = t.to_ascii_lowercase();
            let num_end = lower
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(lower.len());
            let (num, unit) = lower.split_at(num_end);
            let n: u64 = num.parse().ok()?;
            let mult: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1 << 40,
                _ => return None,
            };
            n.checked_mul(mult)
        }

        /// The readahead tool's size grammar, without its 4K minimum (a check of its own).
        pub(super) fn readahead(s: &str) -> Option<u64> {
            let t = s.trim().trim_end_matches("iB").trim_end_matches('B');
            let (num, mul) = match t.char_indices().last() {
                Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
                Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
                Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
                _ => (t, 1),
            };
            let n: u64 = num.parse().ok()?;
            n.checked_mul(mul)
        }
    }

    #[test]
    fn examples() {
        for (s, v) in [
            ("4096", 4096),
            ("4k", 4096),
            ("4K", 4096),
            ("4KiB", 4096),
            ("4kib", 4096),
            ("4kB", 4096),
            ("512B", 512),
            ("64m", 64 << 20),
            ("1G", 1 << 30),
            ("2t", 2 << 40),
            ("1T", 1 << 40),
            ("1P", 1 << 50),
            (" 8k ", 8192),
            ("+4k", 4096),
            ("0", 0),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s:?}");
        }
    }

    #[test]
    fn errors() {
        assert_eq!(parse_size("-1"), Err(SizeError::Negative("-1".into())));
        assert_eq!(
            parse_size("-4k").unwrap_err().to_string(),
            "size -4k is out of range: it cannot be negative"
        );
        assert_eq!(parse_size("-x"), Err(SizeError::BadNumber("-x".into())));
        assert_eq!(parse_size(""), Err(SizeError::BadNumber("".into())));
        assert_eq!(parse_size("k"), Err(SizeError::BadNumber("k".into())));
        assert_eq!(parse_size("x"), Err(SizeError::BadNumber("x".into())));
        assert_eq!(parse_size("4x"), Err(SizeError::BadUnit("4x".into())));
        assert_eq!(parse_size("4 k"), Err(SizeError::BadUnit("4 k".into())));
        assert_eq!(parse_size("4ki"), Err(SizeError::BadUnit("4ki".into())));
        assert_eq!(
            parse_size("99999999999T"),
            Err(SizeError::Overflow("99999999999T".into()))
        );
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(SizeError::BadNumber(_))
        ));
    }

    /// Spellings of a unit that each old grammar took, and the multiplier.
    fn unit() -> impl Strategy<Value = (String, u64)> {
        let units = [
            ("", 1u64),
            ("k", 1 << 10),
            ("m", 1 << 20),
            ("g", 1 << 30),
            ("t", 1 << 40),
            ("p", 1 << 50),
        ];
        (0..units.len(), 0..4usize, any::<bool>()).prop_map(move |(i, suffix, upper)| {
            let (u, m) = units[i];
            let u = if upper {
                u.to_uppercase()
            } else {
                u.to_string()
            };
            let s = ["", "b", "ib", "iB"][suffix];
            (format!("{u}{s}"), m)
        })
    }

    proptest! {
        /// Any number with any unit spelling parses to number × unit, or overflows.
        #[test]
        fn number_times_unit(n in any::<u64>(), (u, m) in unit(), ws in any::<bool>()) {
            let s = if ws { format!(" {n}{u}\t") } else { format!("{n}{u}") };
            match n.checked_mul(m) {
                Some(v) => prop_assert_eq!(parse_size(&s), Ok(v)),
                None => prop_assert_eq!(parse_size(&s), Err(SizeError::Overflow(s.trim().into()))),
            }
            if n > 0 && n.checked_mul(m).is_some() {
                let neg = format!("-{}", s.trim());
                prop_assert_eq!(parse_size(&neg), Err(SizeError::Negative(neg.clone())));
            }
        }

        /// Whatever an old grammar accepted still parses, to the same value; nothing panics.
        #[test]
        fn accepts_everything_the_old_grammars_did(s in "[ +\\-]?[0-9]{0,21}[kKmMgGtTpPiIbBx ]{0,4}") {
            let new = parse_size(&s).ok();
            for (name, old) in [("spec", old::spec(&s)), ("bench", old::bench(&s)), ("readahead", old::readahead(&s))] {
                if let Some(v) = old {
                    prop_assert_eq!(new, Some(v), "{} accepted {:?}", name, s);
                }
            }
        }

        #[test]
        fn never_panics(s in "\\PC{0,12}") {
            let _ = parse_size(&s);
        }
    }
}
