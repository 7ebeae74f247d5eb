//! Where expired work runs: the choice a [`Driver`](crate::Driver) is configured with.
//!
//! # Invariants
//! - Expired work runs outside every timer lock: the core takes tasks out of the wheel
//!   under the shard lock, releases it, and the driver hands them to the executor.
//! - With `Inline`, expired tasks run one after the other on the driving thread; on the
//!   reaper, a task whose code runs longer than the stand-in's bound (20 ms by default)
//!   gets a stand-in thread that runs the rest (`stand_in.rs`), so a slow task delays the
//!   others by about that bound. With `Pool`, the driver goes back to its clock at once,
//!   and a slow task holds its pool thread.

use std::sync::Arc;

/// Where the timer runs expired tasks.
#[derive(Clone, Debug, Default)]
pub enum Executor {
    /// On the thread that advances the clock (the reaper, or whoever calls
    /// `advance_clock`). Lowest overhead. On the reaper, a task that runs longer than the
    /// stand-in's bound (`TimerBuilder::stand_in`, 20 ms by default) gets a stand-in
    /// thread that runs the tasks after it; on a thread in `advance_clock`, a slow task
    /// delays every expiry after it until it returns.
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
}
