//! `tokio_util::time::DelayQueue` as a timer peer.
//!
//! `DelayQueue` keeps its entries in a slab and a hierarchical wheel of its own, and
//! needs a tokio runtime: its inserts arm a `Sleep` on the runtime's timer.
//!
//! # Invariants
//! - [`DelayQueueTimer`] must be created and used inside a runtime context (for W1, a
//!   current-thread runtime with its clock paused, from [`paused_runtime`], so time does
//!   not move while adds and cancels are measured).
//! - Deadlines are given relative to the origin read once at construction, with
//!   `insert_at`, so no add reads the clock.
//! - Cancel uses `try_remove`, so a stale key is harmless instead of a panic.

use std::future::poll_fn;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::time::delay_queue::Key;
use tokio_util::time::DelayQueue;

use crate::workloads::w1::ChurnTimer;

/// A current-thread tokio runtime with time enabled and paused (W1). Enter it with
/// `runtime.enter()` on every thread that touches a [`DelayQueueTimer`].
pub fn paused_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
}

/// A `DelayQueue` with deadlines in milliseconds from its creation.
pub struct DelayQueueTimer<T> {
    queue: DelayQueue<T>,
    origin: Instant,
}

impl<T> DelayQueueTimer<T> {
    /// An empty queue with room for `capacity` entries. Call inside a runtime context.
    pub fn with_capacity(capacity: usize) -> Self {
        DelayQueueTimer {
            queue: DelayQueue::with_capacity(capacity),
            origin: Instant::now(),
        }
    }

    /// Adds `task` due `delay_ms` after the origin.
    #[inline]
    pub fn add(&mut self, delay_ms: u64, task: T) -> Key {
        self.queue
            .insert_at(task, self.origin + Duration::from_millis(delay_ms))
    }

    /// Removes the task and returns it, if still pending.
    #[inline]
    pub fn cancel(&mut self, key: Key) -> Option<T> {
        self.queue.try_remove(&key).map(|e| e.into_inner())
    }

    /// Number of pending tasks.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no task is pending.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

impl ChurnTimer for DelayQueueTimer<u32> {
    type Handle = Key;

    #[inline]
    fn add(&mut self, delay_ms: u64, task: u32) -> Key {
        DelayQueueTimer::add(self, delay_ms, task)
    }

    #[inline]
    fn cancel(&mut self, handle: Key) -> bool {
        DelayQueueTimer::cancel(self, handle).is_some()
    }

    fn pending(&self) -> usize {
        self.len()
    }
}

/// W2 with `DelayQueue`: on a current-thread runtime driven by the calling thread, adds
/// task `i` due `deadlines_nanos[i]` after `origin`, as fast as possible, then lets every
/// one expire on the real clock, calling `fire(i)` as each comes out (and `adds_done`
/// once, after the last add). Returns when all have fired.
pub fn delay_queue_expiry_run(
    deadlines_nanos: &[u64],
    origin: std::time::Instant,
    fire: impl Fn(u32),
    adds_done: impl FnOnce(),
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let origin = Instant::from_std(origin);
    runtime.block_on(async {
        let mut queue = DelayQueue::with_capacity(deadlines_nanos.len());
        for (i, &nanos) in deadlines_nanos.iter().enumerate() {
            queue.insert_at(i as u32, origin + Duration::from_nanos(nanos));
        }
        adds_done();
        while let Some(expired) = poll_fn(|cx| queue.poll_expired(cx)).await {
            fire(expired.into_inner());
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_cancel_on_a_paused_clock() {
        let rt = paused_runtime().unwrap();
        let _guard = rt.enter();
        let mut t = DelayQueueTimer::with_capacity(4);
        let a = t.add(10, 1u32);
        t.add(20, 2);
        assert_eq!(t.cancel(a), Some(1));
        assert_eq!(t.cancel(a), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn expiry_run_fires_everything() {
        let fired = std::sync::Mutex::new(Vec::new());
        delay_queue_expiry_run(
            &[3_000_000, 1_000_000, 0],
            std::time::Instant::now(),
            |i| fired.lock().unwrap().push(i),
            || {},
        )
        .unwrap();
        assert_eq!(fired.into_inner().unwrap(), vec![2, 1, 0]);
    }
}
