//! Terminal progress (only when stderr is a terminal): a spinner that shows the running
//! configuration and its live IOPS, fed by the engine's completion counter; and a byte bar
//! (done/total, rate, ETA) for single long passes such as the overwrite test.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A live progress line for one run; dropping it clears the line.
pub struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Give this to [`crate::engine::RunOpts::progress`].
    pub counter: Arc<AtomicU64>,
}

impl Progress {
    /// Start a spinner labelled `label` (a no-op unless stderr is a terminal).
    pub fn start(label: String) -> Progress {
        let counter = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::io::stderr().is_terminal().then(|| {
            let (c, s) = (counter.clone(), stop.clone());
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
                        crate::report::fmt_count((now - last) as f64 / dt)
                    ));
                    pb.tick();
                    (last, t) = (now, Instant::now());
                }
                pb.finish_and_clear();
            })
        });
        Progress {
            stop,
            thread,
            counter,
        }
    }
}

impl Drop for Progress {
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
        BytesProgress::on(std::io::stderr().is_terminal())
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
