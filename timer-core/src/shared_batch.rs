//! An expiry batch shared between the thread expiring it and a stand-in that may take
//! over the rest of it (`stand_in.rs`): each task is claimed exactly once, by whichever
//! thread reaches it first, one task at a time.
//!
//! # Invariants
//! - `next` only grows. The task at index `i` is handed out by the one [`claim`] whose
//!   `fetch_add` returned `i` (`i < len`): that claim alone reads it, once. Nothing else
//!   reads or writes it after construction, except the batch's drop, which owns the batch
//!   (no claim can run any more) and drops the tasks at and after `next`.
//! - Every task is either claimed or dropped by the batch's drop, each through the door
//!   (`user_code.rs`): a task's `Drop` is user code.
//! - A driving thread's batches (this one and the vector the core fills) keep at most
//!   four times what the last round fired, or [`BATCH_KEPT`] tasks: a burst's size goes
//!   back after the round that fired it ([`give_back_batch`]).
//! - The tasks are written before the batch is shared (an `Arc` handed over under a lock),
//!   so a claim on any thread reads them whole.
//!
//! [`claim`]: SharedBatch::claim

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use crate::sync::{AtomicUsize, UnsafeCell};
use crate::user_code::drop_each;

/// Tasks' worth of capacity a driving thread's batches keep whatever they held.
pub(crate) const BATCH_KEPT: usize = 4096;

/// Gives back the memory of a driving thread's batch `batch` (empty after its round)
/// once it is more than four times what the round fired and than [`BATCH_KEPT`]: batches
/// are reused round after round, so one burst fired at once (a reaper held up in a
/// callback, a clock jump) would otherwise keep its size for the driver's life. Kept to
/// twice the round's tasks, a steady load does not regrow it.
pub(crate) fn give_back_batch<T>(batch: &mut Vec<T>, fired: usize) {
    let enough = fired.max(BATCH_KEPT);
    if batch.capacity() > 4 * enough {
        batch.shrink_to(2 * enough);
    }
}

/// A batch of tasks claimed one at a time (see the module doc).
pub(crate) struct SharedBatch<T> {
    tasks: Vec<UnsafeCell<MaybeUninit<T>>>,
    /// The index the next claim gets (may pass the end: claims past it get nothing).
    next: AtomicUsize,
    /// When the oldest of its tasks came due (real time; its bucket's due time, as the
    /// round that fired it read the clock): a task still unclaimed is at most that late,
    /// and the batch's lateness is what relief goes by (`stand_in.rs`).
    due_at: Instant,
}

// SAFETY: a task is reached only by the claim that owns its index, or by the owner of a
// `&mut` (the drop, a refill), which no claim can run beside: one thread at a time, so
// sharing the batch is as safe as sending its tasks (`T: Send`).
unsafe impl<T: Send> Sync for SharedBatch<T> {}

impl<T> SharedBatch<T> {
    /// An empty batch (every claim gets nothing).
    pub(crate) fn new() -> Self {
        SharedBatch {
            tasks: Vec::new(),
            next: AtomicUsize::new(0),
            due_at: Instant::now(),
        }
    }

    /// Makes this batch hold `tasks` (emptied), in their order, the oldest due at `due_at`,
    /// reusing its memory: the tasks of the last fill are all gone (claimed, or dropped
    /// here).
    pub(crate) fn refill(&mut self, tasks: &mut Vec<T>, due_at: Instant) {
        self.due_at = due_at;
        self.drop_unclaimed();
        self.tasks.clear();
        self.tasks.extend(
            tasks
                .drain(..)
                .map(|task| UnsafeCell::new(MaybeUninit::new(task))),
        );
        self.next.store(0, Relaxed);
    }

    /// After a round that fired `fired` tasks (and every task of the last fill was
    /// claimed, or is dropped here): gives back the memory of a burst (see
    /// [`give_back_batch`]); the next fill reuses what is kept.
    pub(crate) fn give_back(&mut self, fired: usize) {
        if self.tasks.capacity() > 4 * fired.max(BATCH_KEPT) {
            self.drop_unclaimed();
            self.tasks.clear();
            give_back_batch(&mut self.tasks, fired);
        }
    }

    /// The next task nobody claimed yet, now this caller's; `None` once every task was
    /// claimed.
    #[inline]
    pub(crate) fn claim(&self) -> Option<T> {
        let index = self.next.fetch_add(1, Relaxed);
        let cell = self.tasks.get(index)?;
        // SAFETY: `index` came from this `fetch_add` alone, so no other claim reads this
        // cell, and no `&mut` user (drop, refill) runs while `&self` is borrowed; the task
        // was written at the fill and never read before (see the module doc).
        Some(unsafe { cell.with_mut(|task| task.assume_init_read()) })
    }

    /// Tasks claimed so far (a moment later there may be more).
    #[inline]
    pub(crate) fn claims(&self) -> usize {
        self.next.load(Relaxed).min(self.tasks.len())
    }

    /// Whether some task is not claimed yet (a moment later it may be).
    #[inline]
    pub(crate) fn has_unclaimed(&self) -> bool {
        self.next.load(Relaxed) < self.tasks.len()
    }

    /// When the oldest of its tasks came due.
    #[inline]
    pub(crate) fn due_at(&self) -> Instant {
        self.due_at
    }

    /// Drops the tasks nobody claimed, one at a time through the door, and marks them
    /// claimed.
    fn drop_unclaimed(&mut self) {
        let claimed = self.next.load(Relaxed).min(self.tasks.len());
        self.next.store(usize::MAX, Relaxed);
        let unclaimed = self.tasks[claimed..].iter().map(|cell| {
            // SAFETY: `&mut self`: no claim runs; the tasks at and after the claim index
            // were never claimed, so each is initialised, and read here once (the index is
            // moved past them).
            unsafe { cell.with_mut(|task| task.assume_init_read()) }
        });
        drop_each("a task dropped unrun panicked", unclaimed);
    }
}

impl<T> Drop for SharedBatch<T> {
    /// Drops the tasks nobody claimed (none, when its expirer finished it), one at a time
    /// through the door.
    fn drop(&mut self) {
        self.drop_unclaimed();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;

    use super::SharedBatch;

    /// Counts its drops.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn every_task_is_claimed_once_in_order_and_the_rest_dropped_with_the_batch() {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut tasks: Vec<(usize, Counted)> =
            (0..5).map(|i| (i, Counted(Arc::clone(&drops)))).collect();
        let mut batch = SharedBatch::new();
        batch.refill(&mut tasks, std::time::Instant::now());
        assert!(tasks.is_empty());
        assert_eq!(batch.claim().map(|(i, _)| i), Some(0));
        assert_eq!(batch.claim().map(|(i, _)| i), Some(1));
        assert_eq!(drops.load(SeqCst), 2, "claimed tasks are the claimer's");
        let mut again: Vec<(usize, Counted)> = vec![(7, Counted(Arc::clone(&drops)))];
        batch.refill(&mut again, std::time::Instant::now());
        assert_eq!(
            drops.load(SeqCst),
            5,
            "a refill drops the three unclaimed ones"
        );
        assert_eq!(batch.claim().map(|(i, _)| i), Some(7));
        assert!(batch.claim().is_none());
        drop(batch);
        assert_eq!(drops.load(SeqCst), 6);
    }

    #[test]
    fn two_threads_claiming_get_each_task_exactly_once() {
        for _ in 0..200 {
            let mut tasks: Vec<usize> = (0..1000).collect();
            let mut batch = SharedBatch::new();
            batch.refill(&mut tasks, std::time::Instant::now());
            let batch = Arc::new(batch);
            let claim_all = |batch: Arc<SharedBatch<usize>>| {
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Some(task) = batch.claim() {
                        got.push(task);
                    }
                    got
                })
            };
            let (a, b) = (claim_all(Arc::clone(&batch)), claim_all(Arc::clone(&batch)));
            let mut all = a.join().unwrap();
            all.extend(b.join().unwrap());
            all.sort_unstable();
            assert_eq!(all, (0..1000).collect::<Vec<_>>());
            assert!(batch.claim().is_none());
        }
    }
}

/// The hand-over a stand-in makes, modelled: the stuck thread has claimed a task and
/// comes back for more while a stand-in claims the rest; whichever drops the batch last
/// drops what nobody claimed. Every task is claimed or dropped exactly once, in every
/// interleaving. Run with `RUSTFLAGS="--cfg loom" cargo test -p purgatory-timer --lib
/// --release shared_batch`.
#[cfg(all(test, loom))]
mod loom_models {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use loom::sync::Arc;

    use super::SharedBatch;

    /// Counts what became of each task: claims and drops, by id (plain atomics: read
    /// after the model's threads are joined).
    struct Tracked(usize, std::sync::Arc<[AtomicUsize; 3]>);

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.1[self.0].fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn a_stand_in_and_the_stuck_thread_claim_each_task_once() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let drops: std::sync::Arc<[AtomicUsize; 3]> = std::sync::Arc::new(Default::default());
            let mut tasks: Vec<Tracked> = (0..3)
                .map(|id| Tracked(id, std::sync::Arc::clone(&drops)))
                .collect();
            let mut batch = SharedBatch::new();
            batch.refill(&mut tasks, std::time::Instant::now());
            let batch = Arc::new(batch);
            // The stuck thread had claimed the first task before the stand-in came.
            let first = batch.claim().expect("three tasks");
            let stand_in = {
                let batch = Arc::clone(&batch);
                loom::thread::spawn(move || {
                    let mut claimed = Vec::new();
                    while let Some(task) = batch.claim() {
                        claimed.push(task.0);
                    }
                    claimed
                })
            };
            // Back from its task, the stuck thread claims again, then lets go of it.
            let mut mine = vec![first.0];
            drop(first);
            if let Some(task) = batch.claim() {
                mine.push(task.0);
            }
            drop(batch);
            let theirs = stand_in.join().unwrap();
            let mut all: Vec<usize> = mine.into_iter().chain(theirs).collect();
            all.sort_unstable();
            assert_eq!(all, [0, 1, 2], "each task claimed once");
            for (id, dropped) in drops.iter().enumerate() {
                assert_eq!(dropped.load(SeqCst), 1, "task {id} dropped once");
            }
        });
    }
}
