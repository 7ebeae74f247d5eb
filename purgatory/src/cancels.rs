//! Timer cancels of completed operations, queued and applied in batches.
//!
//! # Why
//! An operation is completed (forced, or made ready by an event) on some caller's thread,
//! but its timer entry lives in the timer shard of the thread that watched it. Cancelling
//! it there at once moves that shard's lock, its bookkeeping and the entry's cache lines
//! to the completing core for every single operation, and the two threads collide on the
//! lock. Queued per completing thread and applied [`FLUSH_AT`] at a time through
//! [`TimerCore::cancel_batch`], one lock round trip and the shard's hot lines serve a whole
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
//! - A queue's lock is held while its handles are applied, not only while they are taken
//!   out: a flush that finds a queue empty, or waits for it, knows that every cancel
//!   queued there before is applied. (Taken out first and applied after the lock, a
//!   flush of the reaper could hold a batch the moment another thread's flush found the
//!   queue empty; `stats().pending` then counted up to 63 completed operations as still
//!   pending, and a test expecting an exact count failed once in CI.)
//! - Each queue has a flag, `queued`, written only under the queue's lock: every push
//!   sets it right after queueing (before any apply of its own), an apply that empties
//!   the queue clears it (release) before the lock is released. So when the lock is
//!   free a queue holding a cancel has its flag set, even after an apply unwound.
//! - A flush reads each flag without the lock (acquire) and skips a queue whose flag is
//!   clear. A push that happens before the flush (the same thread, a join, a
//!   release-acquire pair) set the flag before the flush's read, so the read sees that
//!   set or a later clear; a later clear was stored in a later hold of the lock, after
//!   applying everything queued, that push's cancels included, and the read
//!   synchronizes with it. So a skipped queue holds no cancel queued before the flush,
//!   and their applies are visible to the flusher: also to a reader that takes no timer
//!   lock (the published next expiration, which `bucket_due` and the tokio driver
//!   read). (Before the flag, a flush locked all 16 queues every round, empty or not:
//!   about 270 instructions a reaper round, round 18 of `docs/benchmarks.md`.)
//! - The queue locks are taken before a timer shard lock (inside `cancel_batch`), never
//!   after one, and never around user code: the cancelled tasks are dropped after the
//!   queue's lock is released. They are `sync.rs`'s, loom's under `cfg(loom)`: a model
//!   thread may now be switched out while it holds one.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use smallvec::SmallVec;
use timer_core::{TimerCore, TimerHandle};

use crate::counters::stripe_index;
use crate::sync::{AtomicUsize, Mutex};

/// Cancels a completing thread queues before it applies them itself.
pub(crate) const FLUSH_AT: usize = 64;

const STRIPES: usize = crate::counters::STRIPES;

#[repr(align(128))]
#[derive(Default)]
struct Stripe {
    handles: Mutex<Vec<TimerHandle>>,
    /// 1 while `handles` may hold a cancel, else 0; written under the lock only (see the
    /// module doc).
    queued: AtomicUsize,
}

/// Per-thread-stripe queues of timer handles to cancel.
#[derive(Default)]
pub(crate) struct DeferredCancels {
    stripes: [Stripe; STRIPES],
}

impl DeferredCancels {
    /// Queues `handles` for cancelling (under one lock); applies the calling thread's
    /// queue once it holds [`FLUSH_AT`] handles or more.
    pub(crate) fn push_many<T>(&self, handles: &[TimerHandle], timer: &TimerCore<T>) {
        if handles.is_empty() {
            return;
        }
        let stripe = &self.stripes[stripe_index()];
        let mut cancelled = Cancelled::new();
        {
            let mut queued = stripe.handles.lock();
            queued.extend_from_slice(handles);
            // Set before the apply below: should it unwind, the handles stay queued
            // behind a set flag, for the next flush.
            stripe.queued.store(1, Relaxed);
            if queued.len() < FLUSH_AT {
                return;
            }
            apply(timer, &mut queued, &mut cancelled);
            stripe.queued.store(0, Release);
        }
        drop(cancelled);
    }

    /// Applies every queued cancel now. When it returns, every cancel queued before the
    /// call has been applied, by this call or by another that had taken it out of its
    /// queue first (see the module doc).
    ///
    /// Every round calls it, and most find every flag clear: all 16 are read first, with
    /// no branch between them (32 instructions, inlined into the round; looked at one by
    /// one, each behind its own branch, in a call, about 125 a round: callgrind,
    /// `expiring_watches`), and only a flag found set sends it through the queues.
    /// A queue skipped because its flag read clear in that first read is skipped on the
    /// grounds the module doc gives for any clear read.
    #[inline]
    pub(crate) fn flush<T>(&self, timer: &TimerCore<T>) {
        let queued = self
            .stripes
            .iter()
            .fold(0, |any, stripe| any | stripe.queued.load(Acquire));
        if queued != 0 {
            self.flush_queued(timer);
        }
    }

    /// [`flush`](Self::flush) once a flag read set.
    #[inline(never)]
    fn flush_queued<T>(&self, timer: &TimerCore<T>) {
        let mut cancelled = Cancelled::new();
        for stripe in &self.stripes {
            if stripe.queued.load(Acquire) == 0 {
                continue;
            }
            {
                let mut queued = stripe.handles.lock();
                if queued.is_empty() {
                    continue;
                }
                apply(timer, &mut queued, &mut cancelled);
                stripe.queued.store(0, Release);
            }
            cancelled.clear();
        }
    }
}

/// Tasks a cancel took out of the timer, dropped once the queue's lock is released.
type Cancelled<T> = SmallVec<[T; FLUSH_AT]>;

/// Cancels every handle of `queued` (a queue, locked by the caller) on `timer` and
/// empties it; the cancelled tasks go to `cancelled`.
fn apply<T>(timer: &TimerCore<T>, queued: &mut Vec<TimerHandle>, cancelled: &mut Cancelled<T>) {
    timer.cancel_batch(queued, cancelled);
    queued.clear();
}

#[cfg(all(test, not(loom)))]
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

    /// A flush returns only once every cancel queued before it is applied, also those
    /// another thread's flush took out of a queue a moment before: `stats().pending` and
    /// `pending()` count on it (a purgatory's reaper flushes every round).
    #[test]
    fn a_flush_waits_for_cancels_another_flush_has_taken_out_of_a_queue() {
        let timer = std::sync::Arc::new(timer());
        let cancels = std::sync::Arc::new(DeferredCancels::default());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reaper = {
            let (timer, cancels, stop) = (timer.clone(), cancels.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    cancels.flush(&timer);
                }
            })
        };
        let mut seen = Vec::new();
        for _ in 0..50_000 {
            let handles: Vec<_> = (0..FLUSH_AT - 1)
                .map(|_| timer.add(Duration::from_secs(60), Nop).unwrap())
                .collect();
            cancels.push_many(&handles, &timer);
            cancels.flush(&timer);
            let left = timer.len();
            if left != 0 {
                seen.push(left);
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        reaper.join().unwrap();
        assert!(
            seen.is_empty(),
            "{} flushes returned with cancels still in flight, first: {:?}",
            seen.len(),
            &seen[..seen.len().min(5)]
        );
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

/// Loom models of the flag's hand-overs (see the module doc), on a bare queue set and a
/// timer of one shard: `RUSTFLAGS="--cfg loom" cargo test -p kafka-purgatory --lib
/// --release -- cancels`. (Under loom every model thread shares one stripe: the stripe
/// comes from a thread-local of the one OS thread loom runs them on.)
#[cfg(all(test, loom))]
mod loom_models {
    use std::sync::atomic::Ordering::{Acquire, Release};
    use std::time::Duration;

    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;
    use timer_core::{ManualClock, Timer, TimerBuilder, TimerTask};

    use super::{DeferredCancels, FLUSH_AT};

    struct Nop;

    impl TimerTask for Nop {
        fn run(self) {}
    }

    /// Runs `f` with clones of `timer` and `cancels` on a model thread.
    fn on_a_thread(
        timer: &Arc<Timer<Nop>>,
        cancels: &Arc<DeferredCancels>,
        f: impl FnOnce(&Timer<Nop>, &DeferredCancels) + Send + 'static,
    ) -> loom::thread::JoinHandle<()> {
        let (timer, cancels) = (Arc::clone(timer), Arc::clone(cancels));
        loom::thread::spawn(move || f(&timer, &cancels))
    }

    fn timer() -> Arc<Timer<Nop>> {
        let timer = TimerBuilder::new()
            .shards(1)
            .clock(ManualClock::new())
            .reaper(false)
            .build()
            .expect("valid configuration");
        Arc::new(timer)
    }

    /// A flush races two pushes of this thread, then this thread flushes: neither
    /// cancel may be left. (A clear stored after the queue's lock is released would
    /// overwrite the second push's set.)
    #[test]
    fn a_clear_never_hides_a_later_push() {
        loom::model(|| {
            let (timer, cancels) = (timer(), Arc::new(DeferredCancels::default()));
            let first = timer.add(Duration::from_secs(1), Nop).unwrap();
            let second = timer.add(Duration::from_secs(1), Nop).unwrap();
            let flusher = on_a_thread(&timer, &cancels, |timer, cancels| cancels.flush(timer));
            cancels.push_many(&[first], &timer);
            cancels.push_many(&[second], &timer);
            cancels.flush(&timer);
            assert!(!timer.is_pending(first), "the first cancel is applied");
            assert!(!timer.is_pending(second), "the second cancel is applied");
            flusher.join().unwrap();
        });
    }

    /// A push that fills its queue applies it itself: a flush that saw an earlier push
    /// of that thread return must find that push's cancel applied. (A clear stored
    /// before the full push's apply would let the flush skip the queue meanwhile.)
    #[test]
    fn a_push_that_applies_its_queue_clears_the_flag_only_after() {
        loom::model(|| {
            let (timer, cancels) = (timer(), Arc::new(DeferredCancels::default()));
            let first = timer.add(Duration::from_secs(1), Nop).unwrap();
            let rest: Vec<_> = (1..FLUSH_AT)
                .map(|_| timer.add(Duration::from_secs(1), Nop).unwrap())
                .collect();
            let pushed = Arc::new(AtomicBool::new(false));
            let pusher = {
                let pushed = Arc::clone(&pushed);
                on_a_thread(&timer, &cancels, move |timer, cancels| {
                    cancels.push_many(&[first], timer);
                    pushed.store(true, Release);
                    cancels.push_many(&rest, timer);
                })
            };
            if pushed.load(Acquire) {
                cancels.flush(&timer);
                assert!(
                    !timer.is_pending(first),
                    "a cancel pushed before is applied"
                );
            }
            pusher.join().unwrap();
        });
    }

    /// The timer's published next expiration is read without its locks (`bucket_due`,
    /// the tokio driver). A flush that skips a queue another thread's flush emptied must
    /// see what that apply published: here the cancel of the earliest task, which moves
    /// the next expiration from about 1 s to about 30 s. (Tells the flag's acquire read
    /// from a relaxed one, which `pending()` and `stats()` cannot: they lock the shard.)
    #[test]
    fn a_skipped_queue_s_apply_is_visible_without_the_timer_s_locks() {
        loom::model(|| {
            let (timer, cancels) = (timer(), Arc::new(DeferredCancels::default()));
            let early = timer.add(Duration::from_secs(1), Nop).unwrap();
            let _late = timer.add(Duration::from_secs(30), Nop).unwrap();
            let pushed = Arc::new(AtomicBool::new(false));
            let other = {
                let pushed = Arc::clone(&pushed);
                on_a_thread(&timer, &cancels, move |timer, cancels| {
                    cancels.push_many(&[early], timer);
                    pushed.store(true, Release);
                    cancels.flush(timer);
                })
            };
            if pushed.load(Acquire) {
                cancels.flush(&timer);
                let next = timer.next_expiration();
                assert!(
                    next > Some(Duration::from_secs(1)),
                    "the cancel's published expiration is seen: {next:?}"
                );
            }
            other.join().unwrap();
        });
    }
}
