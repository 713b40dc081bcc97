//! The CLI's logger. Library crates log through the `log` crate and never print; this writes
//! their records to stderr as `[LEVEL target] message`. `RUST_LOG` filters them: a comma-separated
//! list of `LEVEL` (the default for every target) and `TARGET=LEVEL` (a module path and what is
//! below it; the longest matching target wins), levels being `off`, `error`, `warn`, `info`,
//! `debug` and `trace`. Without it, warnings and errors are shown (for the `fuser` crate only its
//! errors: it warns about each request the FUSE export leaves unanswered on purpose). `SNAPBLK_RA_DEBUG` (set to
//! anything) still turns on readahead replay's debug lines, as
//! `RUST_LOG=snapblk_readahead::replay=debug` does. Malformed directives are ignored.

use log::{LevelFilter, Log, Metadata, Record};
use std::io::Write as _;

/// Target levels parsed from `RUST_LOG`.
#[derive(Debug, PartialEq, Eq)]
struct Filter {
    default: LevelFilter,
    /// `(target, level)`, longest target first.
    targets: Vec<(String, LevelFilter)>,
}

impl Filter {
    fn parse(spec: &str) -> Filter {
        let mut f = Filter {
            default: LevelFilter::Warn,
            targets: Vec::new(),
        };
        for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            match d.split_once('=') {
                Some((t, l)) => {
                    if let Ok(l) = l.trim().parse() {
                        f.targets.push((t.trim().to_owned(), l));
                    }
                }
                None => {
                    if let Ok(l) = d.parse() {
                        f.default = l;
                    }
                }
            }
        }
        // fuser warns, in several lines each, about every request the FUSE export leaves
        // unimplemented on purpose (answered ENOSYS: the kernel's `security.*` xattr probes,
        // `create` in the export's directory) and about unmounts already done: noise, not
        // news. Its errors stay; `RUST_LOG=fuser=warn` brings the rest back.
        if !f.targets.iter().any(|(t, _)| t == "fuser") {
            let level = f.default.min(LevelFilter::Error);
            f.targets.push(("fuser".to_owned(), level));
        }
        f.targets.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
        f
    }

    fn level_for(&self, target: &str) -> LevelFilter {
        self.targets
            .iter()
            .find(|(t, _)| {
                target
                    .strip_prefix(t.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
            })
            .map_or(self.default, |(_, l)| *l)
    }

    fn max(&self) -> LevelFilter {
        self.targets
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, Ord::max)
    }
}

struct Logger(Filter);

impl Log for Logger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= self.0.level_for(m.target())
    }

    fn log(&self, r: &Record<'_>) {
        if self.enabled(r.metadata()) {
            // A closed stderr loses the line rather than failing the command.
            let _ = writeln!(
                std::io::stderr().lock(),
                "[{} {}] {}",
                r.level().as_str().to_ascii_lowercase(),
                r.target(),
                r.args()
            );
        }
    }

    fn flush(&self) {}
}

/// Installs the logger (once, at start) from `RUST_LOG` and `SNAPBLK_RA_DEBUG`.
pub fn init() {
    let mut spec = std::env::var("RUST_LOG").unwrap_or_default();
    if std::env::var_os("SNAPBLK_RA_DEBUG").is_some() {
        spec.push_str(",snapblk_readahead::replay=debug");
    }
    let filter = Filter::parse(&spec);
    let max = filter.max();
    // Leaked: the logger lives as long as the process (the `log` crate wants `'static`).
    if log::set_logger(Box::leak(Box::new(Logger(filter)))).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_directives_set_levels_by_longest_target() {
        let f = Filter::parse("info, snapblk_readahead=error ,snapblk_readahead::replay=debug");
        assert_eq!(f.level_for("snapblk_nbd::conn"), LevelFilter::Info);
        assert_eq!(f.level_for("snapblk_readahead"), LevelFilter::Error);
        assert_eq!(f.level_for("snapblk_readahead::walk"), LevelFilter::Error);
        assert_eq!(f.level_for("snapblk_readahead::replay"), LevelFilter::Debug);
        assert_eq!(
            f.level_for("snapblk_readahead::replay::x"),
            LevelFilter::Debug
        );
        // A target is a module path: a longer crate name with the same prefix does not match.
        assert_eq!(f.level_for("snapblk_readahead2"), LevelFilter::Info);
        assert_eq!(f.max(), LevelFilter::Debug);
    }

    #[test]
    fn default_is_warn_and_bad_directives_are_ignored() {
        let f = Filter::parse("");
        assert_eq!(f.level_for("anything"), LevelFilter::Warn);
        assert_eq!(f.max(), LevelFilter::Warn);
        let f = Filter::parse("loud,x=nope,=,off");
        assert_eq!(f.default, LevelFilter::Off);
        assert_eq!(f.targets, [("fuser".to_owned(), LevelFilter::Off)]);
    }

    #[test]
    fn fuser_shows_errors_only_unless_asked() {
        let f = Filter::parse("");
        assert_eq!(f.level_for("fuser"), LevelFilter::Error);
        assert_eq!(f.level_for("fuser::session"), LevelFilter::Error);
        assert_eq!(f.level_for("snapblk_fuse"), LevelFilter::Warn);
        let f = Filter::parse("debug,fuser=warn");
        assert_eq!(f.level_for("fuser::session"), LevelFilter::Warn);
        assert_eq!(f.level_for("snapblk_fuse"), LevelFilter::Debug);
    }
}
