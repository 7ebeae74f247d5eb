//! Timer cancels of completed operations, queued and applied in batches.
//!
//! # Why
//! An operation is completed (forced, or made ready by an event) on some caller's thread,
//! but its timer entry lives in the timer shard of the thread that watched it. Cancelling
//! it there at once moves that shard's lock, its bookkeeping and the entry's cache lines
//! to the completing core for every single operation, and the two threads collide on the
//! lock. Queued per completing thread and applied [`FLUSH_AT`] at a time through
//! [`Timer::cancel_batch`], one lock round trip and the shard's hot lines serve a whole
//! batch, and the entries are unlinked in slab order.
//!
//! # Invariants
//! - Exactly-once is not decided here: the operation was already taken out of its slot
//!   (see `op_table.rs`). A queued entry that fires before its cancel is applied reaches
//!   the reaper, which finds the slot's generation changed and does nothing.
//! - A queued cancel is applied within one reaper round (the reaper flushes every queue
//!   each round, and the reaper wakes at least every `REAPER_WAIT` while anything is
//!   armed), as soon as the completing thread has queued [`FLUSH_AT`], and before
//!   `stats`/`pending` read the timer. So a completed operation's timer entry is freed at most
//!   one reaper round late, never at its timeout.
//! - The queue locks are plain `parking_lot` locks held only to push or copy handles out,
//!   never across a timer call or user code (so loom models need not see them).

use smallvec::SmallVec;
use timer_core::{TimerCore, TimerHandle};

use crate::counters::stripe_index;

/// Cancels a completing thread queues before it applies them itself.
pub(crate) const FLUSH_AT: usize = 64;

const STRIPES: usize = crate::counters::STRIPES;

#[repr(align(128))]
#[derive(Default)]
struct Stripe {
    handles: parking_lot::Mutex<Vec<TimerHandle>>,
}

/// Per-thread-stripe queues of timer handles to cancel.
#[derive(Default)]
pub(crate) struct DeferredCancels {
    stripes: [Stripe; STRIPES],
}

type Batch = SmallVec<[TimerHandle; FLUSH_AT]>;

impl DeferredCancels {
    /// Queues `handles` for cancelling (under one lock); applies the calling thread's
    /// queue once it holds [`FLUSH_AT`] handles or more.
    pub(crate) fn push_many<T>(&self, handles: &[TimerHandle], timer: &TimerCore<T>) {
        if handles.is_empty() {
            return;
        }
        let stripe = &self.stripes[stripe_index()];
        let mut batch = Batch::new();
        {
            let mut queued = stripe.handles.lock();
            queued.extend_from_slice(handles);
            if queued.len() < FLUSH_AT {
                return;
            }
            batch.extend(queued.drain(..));
        }
        cancel(timer, &mut batch);
    }

    /// Applies every queued cancel now.
    pub(crate) fn flush<T>(&self, timer: &TimerCore<T>) {
        for stripe in &self.stripes {
            loop {
                let mut batch = Batch::new();
                {
                    let mut handles = stripe.handles.lock();
                    let n = handles.len().min(FLUSH_AT);
                    if n == 0 {
                        break;
                    }
                    let from = handles.len() - n;
                    batch.extend(handles.drain(from..));
                }
                cancel(timer, &mut batch);
            }
        }
    }
}

/// Cancels `batch` on `timer` and drops the cancelled tasks after every lock is released.
fn cancel<T>(timer: &TimerCore<T>, batch: &mut Batch) {
    let mut cancelled: SmallVec<[T; FLUSH_AT]> = SmallVec::new();
    timer.cancel_batch(batch, &mut cancelled);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use timer_core::{ManualClock, Timer, TimerBuilder, TimerTask};

    use super::{DeferredCancels, FLUSH_AT};

    struct Nop;

    impl TimerTask for Nop {
        fn run(self) {}
    }

    fn timer() -> Timer<Nop> {
        TimerBuilder::new()
            .clock(ManualClock::new())
            .reaper(false)
            .build()
            .unwrap()
    }

    #[test]
    fn a_full_queue_is_applied_by_the_pushing_thread_and_flush_applies_the_rest() {
        let timer = timer();
        let cancels = DeferredCancels::default();
        let total = FLUSH_AT + 10;
        let handles: Vec<_> = (0..total)
            .map(|_| timer.add(Duration::from_secs(1), Nop).unwrap())
            .collect();
        for (i, handle) in handles.iter().enumerate() {
            cancels.push_many(&[*handle], &timer);
            let applied = if i + 1 >= FLUSH_AT { FLUSH_AT } else { 0 };
            assert_eq!(timer.len(), total - applied, "after {} pushes", i + 1);
        }
        cancels.flush(&timer);
        assert!(timer.is_empty());
        assert_eq!(timer.stats().cancelled, total as u64);
        // Nothing is left queued: a second flush cancels nothing more.
        cancels.flush(&timer);
        assert_eq!(timer.stats().cancelled, total as u64);
    }

    #[test]
    fn flush_applies_queues_of_every_thread() {
        let timer = std::sync::Arc::new(timer());
        let cancels = std::sync::Arc::new(DeferredCancels::default());
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (timer, cancels) = (timer.clone(), cancels.clone());
                std::thread::spawn(move || {
                    for _ in 0..5 {
                        let h = timer.add(Duration::from_secs(1), Nop).unwrap();
                        cancels.push_many(&[h], &timer);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(timer.len(), 15, "below FLUSH_AT nothing is applied yet");
        cancels.flush(&timer);
        assert!(timer.is_empty());
    }
}
