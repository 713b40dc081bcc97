//! Terminal progress for long operations: indicatif bars on stderr, drawn only when stderr is a
//! terminal (scripts and logs get nothing). The libraries report progress through callbacks
//! (`MergeOptions.progress`, `GenerateOptions.progress`, `tools::apply`'s `progress`, ...);
//! this module is the only place that draws them.

use std::io::IsTerminal;

/// A progress bar that is a no-op when stderr is not a terminal.
pub struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    /// A bar of `len` items, labelled `what`.
    pub fn new(len: u64, what: &str) -> Progress {
        Progress::styled(
            len,
            "{msg} [{bar:40}] {pos}/{len} ({elapsed_precise}, eta {eta})",
            what,
        )
    }

    /// A bar of `len` bytes, labelled `what` (the COW tools' diffing, compressing, applying).
    pub fn bytes(len: u64, what: &str) -> Progress {
        Progress::styled(
            len,
            "{msg:12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
            what,
        )
    }

    /// A bar of `total` merge ops, shown only when `enabled`.
    pub fn merge(total: u64, enabled: bool) -> Progress {
        // The merge bar's template has no message and keeps its default progress characters.
        if !enabled || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let b = indicatif::ProgressBar::new(total);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "merge {bar:40} {pos}/{len} ops ({percent}%) {elapsed}",
        ) {
            b.set_style(style);
        }
        Progress(Some(b))
    }

    fn styled(len: u64, template: &str, what: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let pb = indicatif::ProgressBar::new(len);
        let style = indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        pb.set_style(style.progress_chars("=> "));
        pb.set_message(what.to_string());
        Progress(Some(pb))
    }

    /// A spinner for work of unknown size (tree walks).
    pub fn spinner(what: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_message(what.to_string());
        pb.enable_steady_tick(std::time::Duration::from_millis(120));
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
        let mut cur = self.0.lock().unwrap_or_else(|p| p.into_inner());
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
