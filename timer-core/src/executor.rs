//! Where expired tasks run, and how a panicking task is contained.
//!
//! # Invariants
//! - Tasks run outside every timer lock: the driver takes them out of the wheel under the
//!   shard lock, releases it, then hands them here.
//! - A task that panics is caught; the panic is reported through `tracing` (target
//!   `timer_core`, level error) and counted, and the remaining tasks still run. The
//!   driving thread never unwinds because of a task.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::TimerTask;

/// Where the timer runs expired tasks.
#[derive(Clone, Debug, Default)]
pub enum Executor {
    /// On the thread that advances the clock (the reaper, or whoever calls
    /// `advance_clock`). Lowest overhead; a slow task delays the tasks after it.
    #[default]
    Inline,
    /// Submitted in batches to a rayon thread pool; the driver goes back to its clock at
    /// once. Use when tasks do real work (Kafka runs expirations on one executor thread).
    Pool(Arc<rayon::ThreadPool>),
}

impl Executor {
    /// A dedicated rayon pool of `threads` threads named `timer-expiry-N`.
    pub fn pool(threads: usize) -> Result<Executor, rayon::ThreadPoolBuildError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("timer-expiry-{i}"))
            .build()?;
        Ok(Executor::Pool(Arc::new(pool)))
    }

    /// Runs (or submits) every task of `batch`, counting panics in `panics`.
    pub(crate) fn run<T: TimerTask>(&self, batch: Vec<T>, panics: &Arc<AtomicU64>) {
        match self {
            Executor::Inline => run_all(batch, panics),
            Executor::Pool(pool) => {
                let panics = Arc::clone(panics);
                pool.spawn(move || run_all(batch, &panics));
            }
        }
    }
}

fn run_all<T: TimerTask>(batch: Vec<T>, panics: &AtomicU64) {
    for task in batch {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(move || task.run())) {
            panics.fetch_add(1, Ordering::Relaxed);
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("non-string panic payload");
            tracing::error!(target: "timer_core", panic = message, "timer task panicked");
        }
    }
}
