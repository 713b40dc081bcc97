//! Terminal progress for long operations: indicatif bars on stderr, drawn only when stderr is a
//! terminal and `--quiet` was not given (scripts and logs get nothing). Byte bars show bytes
//! done of the total, the rate and the time left, in binary units like the rest of the text
//! output (`human`). The libraries report progress through callbacks
//! (`MergeOptions.progress`, `GenerateOptions.progress`, `tools::apply`'s `progress`, ...);
//! this module is the only place that draws them.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use snapblk_core::sync::lock;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Set by `--quiet`: no bar at all (except `merge --progress`, which asks for one).
static QUIET: AtomicBool = AtomicBool::new(false);

/// `--quiet`: draw nothing from now on.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether bars are drawn: stderr is a terminal and `--quiet` was not given.
fn shown() -> bool {
    !QUIET.load(Ordering::Relaxed) && std::io::stderr().is_terminal()
}

/// The byte bars' template: label, bar, bytes of total, rate, time left (binary units).
const BYTES: &str =
    "{msg:12} [{bar:40}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}";

/// A progress bar that is a no-op when stderr is not a terminal or with `--quiet`.
pub struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    /// A bar of `len` bytes, labelled `what` (the COW tools' diffing, compressing, applying).
    pub fn bytes(len: u64, what: &str) -> Progress {
        Progress::styled(len, BYTES, what)
    }

    /// A bar of `len` bytes like [`Progress::bytes`], drawn on a terminal even with
    /// `--quiet` when `force` (`merge --progress`).
    pub fn bytes_forced(len: u64, what: &str, force: bool) -> Progress {
        Progress::styled_if(
            shown() || force && std::io::stderr().is_terminal(),
            len,
            BYTES,
            what,
        )
    }

    fn styled(len: u64, template: &str, what: &str) -> Progress {
        Progress::styled_if(shown(), len, template, what)
    }

    fn styled_if(visible: bool, len: u64, template: &str, what: &str) -> Progress {
        if !visible {
            return Progress(None);
        }
        let pb = indicatif::ProgressBar::new(len);
        let style = indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        pb.set_style(style.progress_chars("=> "));
        pb.set_message(what.to_string());
        Progress(Some(pb))
    }

    /// A spinner counting `unit`s done of an unknown total (a tree walk's files):
    /// `⠁ warm 1234 files 3s`.
    pub fn counter(what: &str, unit: &str) -> Progress {
        if !shown() {
            return Progress(None);
        }
        let pb = indicatif::ProgressBar::new_spinner();
        let t = format!("{{spinner}} {{msg}} {{pos}} {unit} {{elapsed}}");
        pb.set_style(
            ProgressStyle::with_template(&t).unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_message(what.to_string());
        pb.enable_steady_tick(std::time::Duration::from_millis(120));
        // Drawn at once, not at the first tick: work shorter than a tick still shows.
        pb.tick();
        Progress(Some(pb))
    }

    /// A progress that draws nothing.
    pub fn spinner_hidden() -> Progress {
        Progress(None)
    }

    /// A spinner for work of unknown size (tree walks).
    pub fn spinner(what: &str) -> Progress {
        if !shown() {
            return Progress(None);
        }
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_message(what.to_string());
        pb.enable_steady_tick(std::time::Duration::from_millis(120));
        // Drawn at once, not at the first tick: work shorter than a tick still shows.
        pb.tick();
        Progress(Some(pb))
    }

    /// Whether anything is shown (stderr is a terminal).
    pub fn visible(&self) -> bool {
        self.0.is_some()
    }

    /// Replaces the text before the bar (e.g. to say why it stopped moving).
    pub fn message(&self, msg: String) {
        if let Some(p) = &self.0 {
            p.set_message(msg);
        }
    }

    /// Sets the position.
    pub fn set(&self, pos: u64) {
        if let Some(p) = &self.0 {
            p.set_position(pos);
        }
    }

    /// Advances the position by `n`.
    pub fn inc(&self, n: u64) {
        if let Some(p) = &self.0 {
            p.inc(n);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(p) = &self.0 {
            p.finish_and_clear();
        }
    }
}

/// Draws the COW generator's stages (`GenerateOptions.progress`) as byte bars, one at a time.
#[derive(Default)]
pub struct GenerateBars(std::sync::Mutex<Option<Progress>>);

impl GenerateBars {
    /// Handles one event; called from the generator's worker threads.
    pub fn on(&self, ev: snapblk_cow::GenerateProgress) {
        use snapblk_cow::GenerateProgress as G;
        let mut cur = lock(&self.0);
        match ev {
            G::Start { stage, total } => {
                if let Some(old) = cur.replace(Progress::bytes(total, stage.name())) {
                    old.finish();
                }
            }
            G::Advance { bytes, .. } => {
                if let Some(p) = cur.as_ref() {
                    p.inc(bytes);
                }
            }
            G::Done { .. } => {
                if let Some(p) = cur.take() {
                    p.finish();
                }
            }
        }
    }
}

/// The load generator's live line for one run: a spinner with the run's label and its IOPS,
/// fed by the engine's completion counter (`snapblk_loadgen::RunProgress::Start`); dropping it
/// clears the line. Drawn only when stderr is a terminal.
pub struct RunSpinner {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunSpinner {
    /// Starts a spinner labelled `label` counting `completed` I/Os.
    pub fn start(label: String, completed: Arc<AtomicU64>) -> RunSpinner {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = shown().then(|| {
            let (c, s) = (completed, stop.clone());
            std::thread::spawn(move || {
                let pb = ProgressBar::new_spinner();
                pb.set_style(
                    ProgressStyle::with_template("{spinner} {elapsed} {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                let (mut last, mut t) = (0u64, Instant::now());
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(250));
                    let now = c.load(Ordering::Relaxed);
                    let dt = t.elapsed().as_secs_f64();
                    pb.set_message(format!(
                        "{label}: {} IOPS",
                        snapblk_loadgen::fmt_count((now - last) as f64 / dt)
                    ));
                    pb.tick();
                    (last, t) = (now, Instant::now());
                }
                pb.finish_and_clear();
            })
        });
        RunSpinner { stop, thread }
    }
}

impl Drop for RunSpinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A bar of bytes done out of a total, with the rate and time left, for one pass at a time
/// (e.g. the overwrite test's create and overwrite passes); drawn only when stderr is a
/// terminal, cleared on drop.
pub struct BytesProgress {
    visible: bool,
    /// The current pass: its label and bar (none before the first [`BytesProgress::set`]).
    pass: Option<(String, ProgressBar)>,
}

impl BytesProgress {
    /// A bar that shows nothing until the first [`BytesProgress::set`].
    pub fn start() -> BytesProgress {
        BytesProgress::on(shown())
    }

    /// A bar drawn on stderr when `visible`, else one that only keeps count.
    fn on(visible: bool) -> BytesProgress {
        BytesProgress {
            visible,
            pass: None,
        }
    }

    /// `done` of `total` bytes of the pass called `label`. A new label starts a new bar, so
    /// each pass has its own rate and time left.
    pub fn set(&mut self, label: &str, done: u64, total: u64) {
        if self.pass.as_ref().is_none_or(|(l, _)| l != label) {
            if let Some((_, old)) = self.pass.take() {
                old.finish_and_clear();
            }
            let target = if self.visible {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            };
            // Built complete before it is drawn: no frame with a zero total or no label.
            let pb = ProgressBar::with_draw_target(Some(total), target)
                .with_style(
                    ProgressStyle::with_template(
                        "{msg} {bytes}/{total_bytes} {binary_bytes_per_sec} (eta {eta})",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                )
                .with_message(label.to_string());
            self.pass = Some((label.to_string(), pb));
        }
        if let Some((_, pb)) = &self.pass {
            pb.set_length(total);
            pb.set_position(done);
        }
    }
}

impl Drop for BytesProgress {
    fn drop(&mut self) {
        if let Some((_, pb)) = self.pass.take() {
            pb.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pass_gets_its_own_bar() {
        let mut p = BytesProgress::on(false);
        let bar = |p: &BytesProgress| {
            let (l, pb) = p.pass.as_ref().unwrap();
            (l.clone(), pb.message(), pb.position(), pb.length())
        };
        assert!(p.pass.is_none());
        p.set("create", 0, 100);
        p.set("create", 100, 100);
        let s = |x: &str| x.to_string();
        assert_eq!(bar(&p), (s("create"), s("create"), 100, Some(100)));
        p.set("overwrite", 10, 50);
        assert_eq!(bar(&p), (s("overwrite"), s("overwrite"), 10, Some(50)));
    }
}
