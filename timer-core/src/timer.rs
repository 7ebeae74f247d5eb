//! The timer users hold: a [`TimerCore`] driven by a [`Driver`] whose expired tasks run
//! themselves ([`TimerTask::run`]), each with its panic caught and counted.
//!
//! # Invariants
//! - Every added task either runs exactly once or is handed back (by a winning `cancel`,
//!   or by `shutdown`); a stale handle touches nothing (see `core.rs`).
//! - A task that panics is caught; the panic is reported through `tracing` (target
//!   `timer_core`, level error) and counted, and the remaining tasks of its batch still
//!   run.
//! - `shutdown` returns after every task that expired before it has finished running,
//!   on whichever executor (see `driver.rs`).

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::core::{TimerCore, TimerStats};
use crate::driver::{Driver, Expire};
use crate::user_code::{caught, drop_each, event};
use crate::TimerTask;

/// The expiry of a plain timer: run each task, catching and counting panics.
pub(crate) struct RunTasks<T> {
    core: TimerCore<T>,
    panicked: AtomicU64,
}

impl<T> RunTasks<T> {
    pub(crate) fn new(core: TimerCore<T>) -> Self {
        RunTasks {
            core,
            panicked: AtomicU64::new(0),
        }
    }
}

impl<T: TimerTask> Expire for RunTasks<T> {
    type Task = T;

    fn core(&self) -> &TimerCore<T> {
        &self.core
    }

    fn expire(&self, expired: &mut Vec<T>) {
        for task in expired.drain(..) {
            self.expire_one(task);
        }
    }

    fn expire_one(&self, task: T) {
        if caught("timer task panicked", move || task.run()).is_none() {
            self.panicked.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn at_drop(&self, pending: Vec<T>) {
        if !pending.is_empty() {
            let dropped = pending.len();
            event(
                || tracing::debug!(target: "timer_core", dropped, "timer dropped with pending tasks"),
            );
        }
        drop_each("a task dropped unrun panicked", pending);
    }
}

/// A thread-safe hierarchical timer whose expired tasks run themselves. Share it with
/// `Arc`; every method takes `&self`.
///
/// Built by [`TimerBuilder`](crate::TimerBuilder). Unless built with
/// `.reaper(false)`, a background thread advances the clock and runs expired tasks. It
/// dereferences to its [`TimerCore`], which has the methods that do not run tasks (`add`,
/// `cancel`, `len`, ...).
pub struct Timer<T: TimerTask> {
    driver: Driver<RunTasks<T>>,
}

impl<T: TimerTask> Timer<T> {
    pub(crate) fn from_driver(driver: Driver<RunTasks<T>>) -> Self {
        Timer { driver }
    }

    /// Runs every task that is due, then, if none was, waits up to `max_wait` for the
    /// earliest bucket to come due (or for an earlier one to be added) and runs what is due
    /// then. Returns how many tasks expired. With `Duration::ZERO` it never waits. A call
    /// that leaves the timer empty by taking due buckets whose tasks were all cancelled
    /// returns 0 without waiting.
    ///
    /// The reaper thread calls this in a loop; call it yourself when the timer was built
    /// without one (for example on a [`ManualClock`](crate::ManualClock)).
    pub fn advance_clock(&self, max_wait: Duration) -> usize {
        self.driver.advance_clock(max_wait)
    }

    /// Counters summed over all shards, with the tasks that panicked.
    pub fn stats(&self) -> TimerStats {
        let target = self.driver.target();
        TimerStats {
            panicked: target.panicked.load(Ordering::Relaxed),
            ..target.core.stats()
        }
    }

    /// Stops the reaper (promptly: it is woken, not waited out) and joins it, refuses
    /// every later `add`, waits until every task that already expired has run (on the
    /// pool too), and hands back every task still pending, unrun. A later or concurrent
    /// call returns nothing, once the first call is done and every task that expired has
    /// run. A call from inside a running task cannot wait for its own round: as the first
    /// call it hands back what is pending without waiting for the tasks still running,
    /// and otherwise returns nothing at once. (The whole table: `docs/timer.md`.)
    pub fn shutdown(&self) -> Vec<T> {
        self.driver
            .shutdown_with(|pending| pending)
            .unwrap_or_default()
    }
}

impl<T: TimerTask> Deref for Timer<T> {
    type Target = TimerCore<T>;

    fn deref(&self) -> &TimerCore<T> {
        &self.driver.target().core
    }
}

impl<T: TimerTask> std::fmt::Debug for Timer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timer")
            .field("core", &**self)
            .field("driver", &self.driver)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::{ManualClock, Timer, TimerBuilder, TimerHandle, TimerTask};

    /// A task that is just its id.
    #[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
    struct Id(u32);

    impl TimerTask for Id {
        fn run(self) {}
    }

    fn manual_timer(clock: &ManualClock, shards: usize) -> Arc<Timer<Id>> {
        Arc::new(
            TimerBuilder::new()
                .clock(clock.clone())
                .shards(shards)
                .reaper(false)
                .build()
                .unwrap(),
        )
    }

    /// Adds `ids` from a fresh thread (so successive calls land in different shards).
    fn add_from_new_thread(timer: &Arc<Timer<Id>>, ids: std::ops::Range<u32>) -> Vec<TimerHandle> {
        let timer = Arc::clone(timer);
        std::thread::spawn(move || {
            ids.map(|id| timer.add(Duration::from_millis(10), Id(id)).unwrap())
                .collect()
        })
        .join()
        .unwrap()
    }

    #[test]
    fn cancel_batch_cancels_exactly_the_live_handles_across_shards() {
        let clock = ManualClock::new();
        let timer = manual_timer(&clock, 3);
        let mut handles = Vec::new();
        for t in 0..3u32 {
            handles.extend(add_from_new_thread(&timer, t * 100..t * 100 + 100));
        }
        let shards: std::collections::HashSet<_> = handles.iter().map(|h| h.shard).collect();
        assert!(shards.len() > 1, "the batch must span shards");
        // Cancel two thirds (more than 64 per shard in one batch), plus a stale handle, a
        // duplicate and a handle of another timer.
        let mut batch: Vec<TimerHandle> = handles
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0)
            .map(|(_, h)| *h)
            .collect();
        let already = handles[1];
        assert_eq!(timer.cancel(already), Some(Id(1)));
        batch.push(batch[5]);
        let other = manual_timer(&clock, 1);
        batch.push(other.add(Duration::from_millis(10), Id(9999)).unwrap());
        let mut cancelled = Vec::new();
        let won = timer.cancel_batch(&mut batch, &mut cancelled);
        let expected: Vec<Id> = (0..300).filter(|i| i % 3 != 0 && *i != 1).map(Id).collect();
        assert_eq!(won, expected.len());
        cancelled.sort_unstable();
        assert_eq!(cancelled, expected);
        assert_eq!(other.len(), 1, "another timer's handle cancels nothing");
        assert_eq!(timer.stats().cancelled, expected.len() as u64 + 1);
        // The rest still fire, the cancelled ones never do.
        clock.advance(Duration::from_millis(10));
        let mut fired = Vec::new();
        timer.advance_into(Duration::ZERO, &mut fired);
        fired.sort_unstable();
        assert_eq!(fired, (0..300).step_by(3).map(Id).collect::<Vec<_>>());
        assert!(timer.is_empty());
    }

    #[test]
    fn add_batch_adds_in_order_and_each_task_fires_at_its_own_delay() {
        let clock = ManualClock::new();
        let timer = manual_timer(&clock, 2);
        // More than one lock's worth (64), delays 1..=150 ms in reverse order.
        let mut tasks: Vec<(Duration, Id)> = (0..150u32)
            .map(|i| (Duration::from_millis(u64::from(150 - i)), Id(i)))
            .collect();
        let mut handles = Vec::new();
        timer.add_batch(&mut tasks, &mut handles);
        assert!(tasks.is_empty());
        assert_eq!(handles.len(), 150);
        let handles: Vec<TimerHandle> = handles.into_iter().map(Result::unwrap).collect();
        assert_eq!(timer.len(), 150);
        assert_eq!(timer.stats().added, 150);
        // Handles are in input order: the one of `Id(10)` cancels `Id(10)`.
        assert_eq!(timer.cancel(handles[10]), Some(Id(10)));
        // Nothing fires early; at 75 ms exactly the tasks with delay <= 75 ms have fired.
        clock.advance(Duration::from_millis(75));
        let mut fired = Vec::new();
        timer.advance_into(Duration::ZERO, &mut fired);
        fired.sort_unstable();
        assert_eq!(fired, (75..150).map(Id).collect::<Vec<_>>());
        clock.advance(Duration::from_millis(75));
        fired.clear();
        timer.advance_into(Duration::ZERO, &mut fired);
        fired.sort_unstable();
        let rest: Vec<Id> = (0..75).filter(|&i| i != 10).map(Id).collect();
        assert_eq!(fired, rest);
        assert!(timer.is_empty());
    }

    /// The batch's earliest bucket is published, wherever it comes in the batch: a
    /// reaper sleeping until the published expiration would otherwise sleep past it.
    #[test]
    fn add_batch_publishes_its_earliest_bucket_not_its_last() {
        let clock = ManualClock::new();
        let timer = manual_timer(&clock, 1);
        let mut tasks = vec![
            (Duration::from_millis(5), Id(0)),
            (Duration::from_millis(50), Id(1)),
        ];
        let mut handles = Vec::new();
        timer.add_batch(&mut tasks, &mut handles);
        assert_eq!(timer.next_expiration(), Some(Duration::from_millis(5)));
    }

    #[test]
    fn add_batch_after_shutdown_hands_every_task_back_in_order() {
        let clock = ManualClock::new();
        let timer = manual_timer(&clock, 1);
        timer.shutdown();
        let mut tasks: Vec<(Duration, Id)> =
            (0..70).map(|i| (Duration::from_millis(5), Id(i))).collect();
        let mut out = Vec::new();
        timer.add_batch(&mut tasks, &mut out);
        let back: Vec<Id> = out
            .into_iter()
            .map(|r| match r {
                Err(crate::AddError::Shutdown(task)) => task,
                Ok(_) => panic!("added after shutdown"),
            })
            .collect();
        assert_eq!(back, (0..70).map(Id).collect::<Vec<_>>());
        assert!(timer.is_empty());
    }

    #[test]
    fn cancel_batch_of_nothing_cancels_nothing() {
        let clock = ManualClock::new();
        let timer = manual_timer(&clock, 2);
        let h = timer.add(Duration::from_millis(1), Id(7)).unwrap();
        let mut cancelled = Vec::new();
        assert_eq!(timer.cancel_batch(&mut [], &mut cancelled), 0);
        assert!(cancelled.is_empty());
        assert!(timer.is_pending(h));
    }
}
