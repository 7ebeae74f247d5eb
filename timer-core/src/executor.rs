//! Where expired work runs: the choice a [`Driver`](crate::Driver) is configured with.
//!
//! # Invariants
//! - Expired work runs outside every timer lock: the core takes tasks out of the wheel
//!   under the shard lock, releases it, and the driver hands them to the executor.
//! - With `Inline`, expired tasks run one after the other on the driving thread; on the
//!   reaper, work that has waited half the stand-in's bound (20 ms by default) is taken
//!   over by stand-in threads (`stand_in.rs`), so slow tasks delay the others by at most
//!   about that bound. With `Pool`, the driver goes back to its clock at once, and a slow
//!   task holds its pool thread.

use std::sync::Arc;

/// Where the timer runs expired tasks.
#[derive(Clone, Debug, Default)]
pub enum Executor {
    /// On the thread that advances the clock (the reaper, or whoever calls
    /// `advance_clock`). Lowest overhead. On the reaper, tasks kept waiting by slow ones
    /// are taken over by stand-in threads within the stand-in's bound
    /// (`TimerBuilder::stand_in`, 20 ms by default); on a thread in `advance_clock`, a
    /// slow task delays every expiry after it until it returns.
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
