//! Where expired work runs: the choice a [`Driver`](crate::Driver) is configured with.
//!
//! # Invariants
//! - Expired work runs outside every timer lock: the core takes tasks out of the wheel
//!   under the shard lock, releases it, and the driver hands them to the executor.
//! - With `Inline`, a slow expiry holds up every later one on the same driver (they run
//!   one after the other on the driving thread); with `Pool`, the driver goes back to
//!   its clock at once.

use std::sync::Arc;

/// Where the timer runs expired tasks.
#[derive(Clone, Debug, Default)]
pub enum Executor {
    /// On the thread that advances the clock (the reaper, or whoever calls
    /// `advance_clock`). Lowest overhead; a slow or blocking task delays every expiry
    /// after it, on every shard, until it returns.
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
