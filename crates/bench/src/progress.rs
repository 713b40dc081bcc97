//! Terminal progress (only when stderr is a terminal): a spinner that shows the running
//! configuration and its live IOPS, fed by the engine's completion counter.

use indicatif::{ProgressBar, ProgressStyle};
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
