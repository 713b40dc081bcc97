//! A progress bar for long merges: indicatif on a terminal, nothing otherwise.

use std::io::IsTerminal;

/// Progress display for `total` merge ops.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    /// A bar when `enabled` and stderr is a terminal.
    pub fn new(total: u64, enabled: bool) -> Self {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "merge {bar:40} {pos}/{len} ops ({percent}%) {elapsed}",
            ) {
                b.set_style(style);
            }
            b
        });
        Progress { bar }
    }
    /// Set the position.
    pub fn set(&self, merged: u64) {
        if let Some(b) = &self.bar {
            b.set_position(merged);
        }
    }
    /// Remove the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
