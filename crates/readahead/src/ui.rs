//! Terminal progress for long operations: an indicatif bar on stderr, only when stderr is a
//! terminal (scripts and logs get nothing).

use std::io::IsTerminal;

/// A progress bar that is a no-op when stderr is not a terminal.
pub struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    pub fn new(len: u64, what: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let pb = indicatif::ProgressBar::new(len);
        if let Ok(st) = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {pos}/{len} ({elapsed_precise}, eta {eta})",
        ) {
            pb.set_style(st.progress_chars("=> "));
        }
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

    pub fn set(&self, pos: u64) {
        if let Some(p) = &self.0 {
            p.set_position(pos);
        }
    }

    pub fn finish(&self) {
        if let Some(p) = &self.0 {
            p.finish_and_clear();
        }
    }
}
