//! The progress line on stderr: requests issued, actual rate, pending.
//!
//! # Invariants
//! - Drawn only on a terminal (indicatif hides itself otherwise) and refreshed at most
//!   five times a second by one thread, so it costs the measured process almost nothing.
//! - [`Progress::finish`] wakes the thread at once and joins it; the line is cleared.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

const REFRESH: Duration = Duration::from_millis(200);

/// A running progress line, updated by a scoped thread.
pub struct Progress<'scope> {
    stop: Arc<AtomicBool>,
    thread: ScopedJoinHandle<'scope, ()>,
}

impl<'scope> Progress<'scope> {
    /// Starts the line for `total` requests; `sample` returns (issued, pending).
    pub fn start<'env, F>(
        scope: &'scope Scope<'scope, 'env>,
        label: String,
        total: u64,
        sample: F,
    ) -> Self
    where
        F: Fn() -> (u64, u64) + Send + 'scope,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_for_thread = Arc::clone(&stop);
        let thread = scope.spawn(move || {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} issued, {msg}",
            ) {
                bar.set_style(style);
            }
            bar.set_prefix(label);
            let start = Instant::now();
            while !stop_for_thread.load(Ordering::Acquire) {
                let (issued, pending) = sample();
                let rate = issued as f64 / start.elapsed().as_secs_f64().max(1e-9);
                bar.set_position(issued);
                bar.set_message(format!("{rate:.0} req/s, {pending} pending"));
                std::thread::park_timeout(REFRESH);
            }
            bar.finish_and_clear();
        });
        Progress { stop, thread }
    }

    /// Stops and clears the line.
    pub fn finish(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

/// A spinner for the parent process while a child measures ("w1 ours run 2/3").
pub fn spinner(enabled: bool) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}
