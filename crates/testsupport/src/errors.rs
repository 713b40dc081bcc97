//! Checks of the error convention (HACKING.md): an error's cause is its
//! [`source`](std::error::Error::source), never repeated in its own message, so a one-line report
//! of the chain (the CLI's `snapblk: a: b: c`) names each cause once.

use std::error::Error;

/// The one-line report of `e`'s chain: each error's message joined by `": "`, as `anyhow`'s
/// `{:#}` (and so the CLI) prints it.
pub fn chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Asserts that `e` has a source whose text is `cause` (when given), that `e`'s own message
/// does not contain that text, and that the chain names it exactly once. Returns the chain.
pub fn assert_cause_is_source(e: &dyn Error, cause: Option<&str>) -> String {
    let src = e
        .source()
        .unwrap_or_else(|| panic!("{e:?}: no source"))
        .to_string();
    if let Some(c) = cause {
        assert_eq!(src, c, "{e:?}: source");
    }
    assert!(!src.is_empty(), "{e:?}: empty source message");
    let own = e.to_string();
    assert!(
        !own.contains(&src),
        "{e:?}: message {own:?} repeats its source {src:?}"
    );
    let line = chain(e);
    assert_eq!(line.matches(&src).count(), 1, "{e:?}: chain {line:?}");
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrap(&'static str, Option<std::io::Error>);
    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl Error for Wrap {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_ref().map(|e| e as _)
        }
    }

    #[test]
    fn a_cause_in_the_message_or_no_source_fails_the_check() {
        let io = || Some(std::io::Error::other("disk on fire"));
        assert_eq!(
            assert_cause_is_source(&Wrap("reading", io()), Some("disk on fire")),
            "reading: disk on fire"
        );
        let twice = std::panic::catch_unwind(|| {
            assert_cause_is_source(&Wrap("reading: disk on fire", io()), None)
        });
        assert!(twice.is_err());
        let none = std::panic::catch_unwind(|| assert_cause_is_source(&Wrap("x", None), None));
        assert!(none.is_err());
    }
}
