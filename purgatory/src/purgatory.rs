//! The purgatory: operations watched per key, completed by events or expired by a timer.
//!
//! # Threads
//! - Callers' threads run `try_complete` (in `try_complete_else_watch` and
//!   `check_and_complete`) and the `on_complete` of what they complete.
//! - The reaper thread (one per purgatory, unless built with `reaper(false)`) drives the
//!   timer, completes expired operations (`on_complete` then `on_expiration`, inline or on
//!   the configured pool) and purges completed entries. It sleeps until the earliest
//!   timeout, at most `REAPER_WAIT` while operations are pending, and indefinitely when
//!   nothing is pending or stale.
//!
//! # Invariants
//! - An accepted operation is in its slot of the op table until exactly one of: a
//!   successful `try_complete`, a forced completion, its expiry, a cancel, or shutdown
//!   takes it (see `op_table.rs`). Exactly one `on_complete` follows, except for a cancel
//!   (handed back).
//! - The watcher holds the operation's own lock from its first `try_complete` until its
//!   entries are listed and its timeout armed, and tries it a second time once it is
//!   listed (Kafka's order). An event before the listing is seen by that second try; an
//!   event after it finds the operation listed and tries it once the lock is released:
//!   no lost wake-up.
//! - No watcher shard lock or timer lock is held while user code runs. The only lock held
//!   around user code is the operation's own, around its `try_complete`.
//! - Purging happens on the reaper between timer rounds, one watcher shard at a time,
//!   and yields to the timer whenever a bucket is due: a purge never stalls expiry.
//! - A completion's timer cancel is queued (`cancels.rs`) and applied within one reaper
//!   round, and before `stats`/`pending` read the timer, so `pending` counts armed,
//!   not-yet-completed operations.

use std::hash::Hash;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use timer_core::{Executor, Timer, TimerTask};

use crate::cancels::DeferredCancels;
use crate::counters::{Count, Counters};
use crate::error::WatchError;
use crate::op_table::{panic_message, Locked, OpRef, OpTable, Taken};
use crate::operation::{Completion, DelayedOperation};
use crate::watchers::Watchers;

/// Longest the reaper sleeps while operations are pending (Kafka's reaper wait), so stale
/// entries are looked at even when the next timeout is far away.
const REAPER_WAIT: Duration = Duration::from_millis(200);

/// The timer task of one watched operation: the name of the operation to expire.
pub(crate) struct Expiry(pub(crate) OpRef);

impl TimerTask for Expiry {
    /// Never called: the purgatory drives its timer with `advance_clock_into` and
    /// `shutdown`, which hand expiries back to it, and expires them itself (it needs its
    /// op table and counters, which a task does not carry).
    fn run(self) {}
}

/// Source of purgatory identities, so a handle is only honoured by its own purgatory.
static NEXT_PURGATORY_ID: AtomicU64 = AtomicU64::new(0);

/// A watched operation, for [`Purgatory::force_complete`] and
/// [`Purgatory::is_completed`]. A plain 16-byte value: it holds no memory of the
/// operation, and once the operation is completed it names nothing (a later operation
/// is never mistaken for it). A handle given to another purgatory than the one that
/// issued it completes nothing.
pub struct OperationHandle<O> {
    pub(crate) at: OpRef,
    pub(crate) purgatory: u64,
    _op: PhantomData<fn() -> O>,
}

impl<O> OperationHandle<O> {
    pub(crate) fn new(at: OpRef, purgatory: u64) -> Self {
        OperationHandle {
            at,
            purgatory,
            _op: PhantomData,
        }
    }
}

impl<O> Clone for OperationHandle<O> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<O> Copy for OperationHandle<O> {}

impl<O> std::fmt::Debug for OperationHandle<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperationHandle").finish_non_exhaustive()
    }
}

/// What [`Purgatory::watch`] did with an operation.
pub enum Watched<O> {
    /// `try_complete` succeeded at once; `on_complete` has run.
    Completed,
    /// The operation waits on its keys and its timeout.
    Pending(OperationHandle<O>),
}

impl<O> std::fmt::Debug for Watched<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Watched::Completed => f.write_str("Completed"),
            Watched::Pending(_) => f.write_str("Pending(..)"),
        }
    }
}

/// Counters of one purgatory, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgatoryStats {
    /// Operations waiting for their timeout (armed timers).
    pub pending: usize,
    /// Watcher entries, including completed operations not yet dropped from their lists
    /// (Kafka's `PurgatorySize`).
    pub watched: usize,
    /// Keys with a watcher list.
    pub keys: usize,
    /// Operations completed because `try_complete` returned true (on watch or on an event).
    pub completed: u64,
    /// Operations completed by `force_complete`.
    pub forced: u64,
    /// Operations completed by their timeout (or by shutdown).
    pub expired: u64,
    /// Operations handed back by `cancel_for_key`.
    pub cancelled: u64,
    /// Completed entries dropped from lists by purges (not by checks of their key).
    pub purged: u64,
    /// User callbacks that panicked (caught and reported).
    pub panicked: u64,
}

pub(crate) struct Inner<K, O: DelayedOperation> {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) table: OpTable<O>,
    pub(crate) timer: Timer<Expiry>,
    pub(crate) watchers: Watchers<K>,
    pub(crate) counters: Counters,
    pub(crate) purge_interval: usize,
    pub(crate) executor: Executor,
    pub(crate) closed: AtomicBool,
    purge_cursor: AtomicUsize,
    /// Timer cancels of completed operations, applied in batches (see `cancels.rs`).
    cancels: DeferredCancels,
}

/// Holds operations that cannot complete yet, per key, until an event completes them or
/// their timeout expires them. Share it with `Arc`; every method takes `&self`.
///
/// # The locking rule
/// `try_complete` runs under the operation's own lock. Do not call `check_and_complete`
/// (or `try_complete_else_watch`, `force_complete`, `cancel_for_key`) while holding a lock
/// that your `try_complete` also takes: the two would wait for each other.
pub struct Purgatory<K, O: DelayedOperation> {
    pub(crate) inner: Arc<Inner<K, O>>,
    reaper: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl<K, O> Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// A purgatory with the default configuration (see [`PurgatoryBuilder`]).
    ///
    /// # Panics
    /// If the operating system cannot spawn the reaper thread.
    ///
    /// [`PurgatoryBuilder`]: crate::PurgatoryBuilder
    pub fn new(name: &str) -> Self {
        crate::PurgatoryBuilder::new()
            .name(name)
            .build()
            .expect("the default configuration is valid; spawning the reaper failed")
    }

    /// A builder for a configured purgatory: `Purgatory::<K, O>::builder()`, the same as
    /// [`PurgatoryBuilder::new()`](crate::PurgatoryBuilder::new).
    pub fn builder() -> crate::PurgatoryBuilder {
        crate::PurgatoryBuilder::new()
    }

    pub(crate) fn from_parts(
        inner: Inner<K, O>,
        start_reaper: bool,
    ) -> Result<Self, std::io::Error> {
        let inner = Arc::new(inner);
        let reaper = if start_reaper {
            let for_thread = Arc::clone(&inner);
            Some(
                std::thread::Builder::new()
                    .name(format!("{}-reaper", inner.name))
                    .spawn(move || reaper_loop(&for_thread))?,
            )
        } else {
            None
        };
        Ok(Purgatory {
            inner,
            reaper: parking_lot::Mutex::new(reaper),
        })
    }

    /// The name given at build time.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Tries to complete `op`; if it cannot yet, watches it on every key of `keys` and
    /// arms its timeout. Returns `Ok(true)` if this call completed it (`on_complete` has
    /// run), `Ok(false)` if it now waits.
    ///
    /// An event that makes the operation ready while it is being watched is never lost.
    /// An empty `keys` is refused with [`WatchError::NoKeys`]; after shutdown, with
    /// [`WatchError::Shutdown`]; both give the operation back. A key listed twice is
    /// watched twice (harmless).
    pub fn try_complete_else_watch<I>(&self, op: O, keys: I) -> Result<bool, WatchError<O>>
    where
        I: IntoIterator<Item = K>,
    {
        self.watch(op, keys)
            .map(|watched| matches!(watched, Watched::Completed))
    }

    /// Like [`try_complete_else_watch`](Self::try_complete_else_watch), but returns a
    /// handle to a waiting operation, for [`force_complete`](Self::force_complete).
    pub fn watch<I>(&self, op: O, keys: I) -> Result<Watched<O>, WatchError<O>>
    where
        I: IntoIterator<Item = K>,
    {
        let inner = &*self.inner;
        if inner.closed.load(Ordering::Acquire) {
            return Err(WatchError::Shutdown(op));
        }
        // Collect the keys before taking any lock: the caller's iterator is user code.
        let keys: SmallVec<[K; 4]> = keys.into_iter().collect();
        if keys.is_empty() {
            return Err(WatchError::NoKeys(op));
        }
        let timeout = op.timeout();
        let watched = u32::try_from(keys.len()).unwrap_or(u32::MAX);
        let mut locked = inner.table.insert(op);
        if inner.is_ready(&mut locked) {
            inner.finish(locked.take(), Completion::Ready);
            return Ok(Watched::Completed);
        }
        locked.set_keys(watched);
        inner.counters.add_listed(i64::from(watched));
        let at = locked.at();
        for key in keys {
            inner.watchers.watch(key, at);
        }
        // Try once more now that it is listed: an event that made it ready after the
        // first try but before the listing did not find it, so nobody else will try it.
        if inner.is_ready(&mut locked) {
            inner.finish(locked.take(), Completion::Ready);
            return Ok(Watched::Completed);
        }
        match inner.timer.add(timeout, Expiry(at)) {
            Ok(handle) => locked.arm(handle),
            Err(_) => {
                // Shut down while we were watching: hand the operation back. Its entries
                // are now stale.
                let taken = locked.take();
                inner.counters.add_stale(i64::from(watched));
                return Err(WatchError::Shutdown(taken.op));
            }
        }
        drop(locked);
        tracing::debug!(target: "purgatory", purgatory = %inner.name, keys = watched, "watch");
        Ok(Watched::Pending(OperationHandle::new(at, inner.id)))
    }

    /// Tries every operation watched on `key`, in arrival order, completing those that
    /// are ready, and drops completed entries from the list (removing the key when it
    /// empties). Returns how many this call completed; an unknown key returns 0.
    pub fn check_and_complete(&self, key: &K) -> usize {
        let inner = &*self.inner;
        let waiting = |at| inner.table.may_be_waiting(at);
        let mut candidates = SmallVec::<[OpRef; 16]>::new();
        inner.watchers.snapshot(key, &mut candidates);
        let listed = candidates.len();
        candidates.retain(|at| waiting(*at));
        let saw_completed = candidates.len() < listed;
        let mut completed = 0;
        for at in candidates {
            let Some(mut locked) = inner.table.lock(at) else {
                continue; // completed by someone else since the snapshot
            };
            if inner.is_ready(&mut locked) {
                // `take` releases the slot lock: callbacks run without it.
                inner.finish(locked.take(), Completion::Ready);
                completed += 1;
            }
        }
        if completed > 0 || saw_completed {
            let removed = inner.watchers.drop_completed(key, waiting) as i64;
            inner.counters.add_stale(-removed);
            inner.counters.add_listed(-removed);
        }
        completed
    }

    /// Completes the operation now, whatever `try_complete` would say, unless it is
    /// already completed. Returns whether this call completed it.
    pub fn force_complete(&self, handle: &OperationHandle<O>) -> bool {
        if handle.purgatory != self.inner.id {
            return false;
        }
        match self.inner.table.take(handle.at) {
            Some(taken) => {
                self.inner.finish(taken, Completion::Forced);
                true
            }
            None => false,
        }
    }

    /// Takes the operation `handle` names back, uncompleted: its timeout is disarmed at
    /// once, its watcher entries are left stale (dropped by the next check of their key
    /// or a purge), and no callback runs: the caller now owns answering it (or dropping
    /// it, for a request whose client left). `None` if it already completed, expired or
    /// was cancelled, or if the handle is another purgatory's.
    ///
    /// The one-operation counterpart of [`cancel_for_key`](Self::cancel_for_key); where
    /// [`force_complete`](Self::force_complete) answers the operation, this does not.
    pub fn cancel(&self, handle: &OperationHandle<O>) -> Option<O> {
        let inner = &*self.inner;
        if handle.purgatory != inner.id {
            return None;
        }
        let taken = inner.table.take(handle.at)?;
        if let Some(timer) = taken.timer {
            inner.timer.cancel(timer);
        }
        inner.counters.add_stale(i64::from(taken.keys));
        inner.counters.add(Count::Cancelled, 1);
        tracing::debug!(target: "purgatory", purgatory = %inner.name, "cancel");
        Some(taken.op)
    }

    /// Whether the operation `handle` names has been completed, expired or cancelled.
    /// A handle of another purgatory names nothing here and reads as completed.
    pub fn is_completed(&self, handle: &OperationHandle<O>) -> bool {
        handle.purgatory != self.inner.id || !self.inner.table.is_waiting(handle.at)
    }

    /// Removes every operation watched on `key`, disarms their timeouts and hands them
    /// back uncompleted: the caller now owns answering them. Operations already completed
    /// are skipped. Unknown key: empty result.
    pub fn cancel_for_key(&self, key: &K) -> Vec<O> {
        let inner = &*self.inner;
        let mut ops = Vec::new();
        let list = inner.watchers.take(key);
        inner.counters.add_listed(-(list.len() as i64));
        for at in list {
            match inner.table.take(at) {
                Some(taken) => {
                    if let Some(handle) = taken.timer {
                        inner.timer.cancel(handle);
                    }
                    // All its entries are stale now, but the one on `key` is already gone.
                    inner.counters.add_stale(i64::from(taken.keys) - 1);
                    inner.counters.add(Count::Cancelled, 1);
                    ops.push(taken.op);
                }
                None => inner.counters.add_stale(-1),
            }
        }
        if !ops.is_empty() {
            tracing::debug!(target: "purgatory", purgatory = %inner.name, cancelled = ops.len(), "cancel for key");
        }
        ops
    }

    /// Drives the timer once: completes every expired operation, then waits up to
    /// `max_wait` for the next timeout if none was due, and purges if enough completed
    /// entries are listed. Returns how many timeouts fired (an operation an event
    /// completed while its timeout fired is counted here, but not in `stats().expired`). For purgatories built with
    /// `reaper(false)` (for example on a manual clock); harmless otherwise.
    pub fn advance_clock(&self, max_wait: Duration) -> usize {
        Inner::reap_once(&self.inner, max_wait, &mut Vec::new()).0
    }

    /// Drops every completed entry from every list now; returns how many were dropped.
    pub fn purge(&self) -> usize {
        let inner = &*self.inner;
        (0..inner.watchers.shard_count())
            .map(|i| inner.purge_shard(i))
            .sum()
    }

    /// Counters for metrics.
    pub fn stats(&self) -> PurgatoryStats {
        let inner = &*self.inner;
        inner.cancels.flush(&inner.timer);
        let totals = inner.counters.totals();
        PurgatoryStats {
            pending: inner.timer.len(),
            watched: inner.watchers.entries(),
            keys: inner.watchers.keys(),
            completed: totals.completed,
            forced: totals.forced,
            expired: totals.expired,
            cancelled: totals.cancelled,
            purged: totals.purged,
            panicked: totals.panicked,
        }
    }

    /// Operations waiting for their timeout.
    pub fn pending(&self) -> usize {
        self.inner.cancels.flush(&self.inner.timer);
        self.inner.timer.len()
    }

    /// Watcher entries (Kafka's `PurgatorySize`).
    pub fn watched(&self) -> usize {
        self.inner.watchers.entries()
    }

    /// Whether [`shutdown`](Self::shutdown) has run.
    pub fn is_shutdown(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Stops the reaper (promptly) and joins it, then expires every operation still
    /// pending, on the calling thread (`on_complete` with [`Completion::Expired`], then
    /// `on_expiration`), so every waiting request gets an answer. Later calls to
    /// `try_complete_else_watch`/`watch` return [`WatchError::Shutdown`] with the
    /// operation. Idempotent; also run on drop.
    pub fn shutdown(&self) {
        let inner = &*self.inner;
        let Some(expired) = self.stop() else {
            return;
        };
        inner.watchers.clear();
        inner.counters.add_stale(-inner.counters.stale());
        inner.counters.add_listed(-inner.counters.listed());
        tracing::debug!(target: "purgatory", purgatory = %inner.name, expired, "shutdown");
    }
}

impl<K, O: DelayedOperation> Purgatory<K, O> {
    /// Closes the purgatory, stops and joins the reaper and expires what is pending.
    /// Returns how many operations it expired, or `None` if it was already closed.
    fn stop(&self) -> Option<usize> {
        let inner = &*self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return None;
        }
        // Close the timer first: from then on the reaper cannot go back to sleep (its
        // timer refuses to), so joining it cannot hang, however wake-ups interleave with
        // other threads driving the clock.
        let pending = inner.timer.shutdown();
        if let Some(reaper) = self.reaper.lock().take() {
            if reaper.thread().id() != std::thread::current().id() {
                let _ = reaper.join();
            }
        }
        let expired = inner.expire_all(pending);
        Some(expired)
    }
}

impl<K, O: DelayedOperation> Drop for Purgatory<K, O> {
    /// Shuts down: pending operations are expired, so every waiting request is answered.
    fn drop(&mut self) {
        self.stop();
    }
}

impl<K, O: DelayedOperation> std::fmt::Debug for Purgatory<K, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Purgatory")
            .field("name", &self.inner.name)
            .field("closed", &self.inner.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<K, O: DelayedOperation> Inner<K, O> {
    pub(crate) fn new(
        name: String,
        timer: Timer<Expiry>,
        watchers: Watchers<K>,
        purge_interval: usize,
        executor: Executor,
    ) -> Self {
        Inner {
            id: NEXT_PURGATORY_ID.fetch_add(1, Ordering::Relaxed),
            name,
            table: OpTable::new(),
            timer,
            watchers,
            counters: Counters::default(),
            purge_interval,
            executor,
            closed: AtomicBool::new(false),
            purge_cursor: AtomicUsize::new(0),
            cancels: DeferredCancels::default(),
        }
    }

    /// `try_complete` on a locked operation, keeping the lock (a panic is counted and
    /// means "not ready").
    pub(crate) fn is_ready(&self, locked: &mut Locked<'_, O>) -> bool {
        match locked.try_complete() {
            Ok(ready) => ready,
            Err(()) => {
                self.counters.add(Count::Panicked, 1);
                false
            }
        }
    }

    /// Completes a taken operation: queues its timer's cancel (see `cancels.rs`), counts
    /// the watcher entries it leaves behind as stale, runs its callbacks, drops it.
    pub(crate) fn finish(&self, taken: Taken<O>, how: Completion) {
        if let Some(handle) = taken.timer {
            self.cancels.push(handle, &self.timer);
        }
        self.counters.add_stale(i64::from(taken.keys));
        self.counters.add(
            match how {
                Completion::Ready => Count::Completed,
                Completion::Forced => Count::Forced,
                Completion::Expired => Count::Expired,
            },
            1,
        );
        let panics = run_callbacks(taken.op, how);
        if panics > 0 {
            self.counters.add(Count::Panicked, panics);
        }
        if how != Completion::Expired {
            tracing::debug!(target: "purgatory", purgatory = %self.name, ?how, "complete");
        }
    }

    /// Completes one expired operation (its timer has fired, so there is none to cancel).
    /// Returns false when the operation was already taken (completed while its timer
    /// fired, or before its queued cancel was applied).
    fn expire(&self, expiry: Expiry) -> bool {
        match self.table.take(expiry.0) {
            Some(mut taken) => {
                taken.timer = None;
                self.finish(taken, Completion::Expired);
                true
            }
            None => false,
        }
    }

    /// Expires every operation of `batch` still in the table; returns how many.
    fn expire_all(&self, batch: impl IntoIterator<Item = Expiry>) -> usize {
        let mut count = 0usize;
        for expiry in batch {
            count += usize::from(self.expire(expiry));
        }
        if count > 0 {
            tracing::debug!(target: "purgatory", purgatory = %self.name, count, "expire");
        }
        count
    }
}

impl<K: Hash + Eq + Clone, O: DelayedOperation> Inner<K, O> {
    fn purge_shard(&self, index: usize) -> usize {
        let removed = self
            .watchers
            .purge_shard(index, |at| self.table.may_be_waiting(at));
        if removed > 0 {
            self.counters.add_stale(-(removed as i64));
            self.counters.add_listed(-(removed as i64));
            self.counters.add(Count::Purged, removed as u64);
        }
        removed
    }

    /// Whether enough completed entries are listed for a purge to pay for itself: at
    /// least the purge interval, and at least as many as the live entries. A purge visits
    /// every entry of the shards it passes, so the second condition makes it remove at
    /// least one entry for every two it visits (amortised O(1) per completed entry), and
    /// keeps the lists within twice their live size plus the purge interval.
    fn purge_due(&self) -> bool {
        let stale = self.counters.stale();
        stale >= self.purge_interval as i64 && stale * 2 >= self.counters.listed()
    }

    /// Purges shard after shard while a purge is due, yielding as soon as the timer has a
    /// bucket due. Returns whether it stopped early to let the timer run (so the caller
    /// should come straight back); after a full pass it returns false even if the
    /// estimate still says a purge is due, so a drifted estimate cannot make the reaper
    /// spin.
    fn purge_some(&self) -> bool {
        if !self.purge_due() {
            return false;
        }
        let shards = self.watchers.shard_count();
        let mut removed = 0;
        let mut visited = 0;
        let mut yielded = false;
        while visited < shards {
            let index = self.purge_cursor.fetch_add(1, Ordering::Relaxed) % shards;
            removed += self.purge_shard(index);
            visited += 1;
            if self.counters.stale() < (self.purge_interval as i64) / 2 {
                break;
            }
            if self
                .timer
                .next_expiration()
                .is_some_and(|due| due <= self.timer.now())
            {
                yielded = visited < shards;
                break;
            }
        }
        tracing::debug!(target: "purgatory", purgatory = %self.name, removed, shards = visited, "purge");
        yielded
    }

    /// One round of the reaper: expire what is due (waiting up to `max_wait` if nothing
    /// is) on the configured executor, then purge if needed. Returns how many timeouts
    /// fired and whether a purge is unfinished.
    fn reap_once(this: &Arc<Self>, max_wait: Duration, expired: &mut Vec<Expiry>) -> (usize, bool)
    where
        K: Send + Sync + 'static,
    {
        this.cancels.flush(&this.timer);
        let n = this.timer.advance_clock_into(max_wait, expired);
        if n > 0 {
            match &this.executor {
                Executor::Inline => {
                    this.expire_all(expired.drain(..));
                }
                Executor::Pool(pool) => {
                    let inner = Arc::clone(this);
                    let batch = std::mem::take(expired);
                    pool.spawn(move || {
                        inner.expire_all(batch);
                    });
                }
            }
        }
        (n, this.purge_some())
    }
}

/// Runs `on_complete` (and `on_expiration` for an expiry), catching panics; returns how
/// many panicked. Drops the operation afterwards.
pub(crate) fn run_callbacks<O: DelayedOperation>(mut op: O, how: Completion) -> u64 {
    let mut panics = 0;
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| op.on_complete(how))) {
        panics += 1;
        tracing::error!(target: "purgatory", panic = panic_message(&*payload), "on_complete panicked");
    }
    if how == Completion::Expired {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| op.on_expiration())) {
            panics += 1;
            tracing::error!(target: "purgatory", panic = panic_message(&*payload), "on_expiration panicked");
        }
    }
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(op))) {
        panics += 1;
        tracing::error!(target: "purgatory", panic = panic_message(&*payload), "dropping an operation panicked");
    }
    panics
}

fn reaper_loop<K, O>(inner: &Arc<Inner<K, O>>)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    let mut expired = Vec::new();
    let mut purge_unfinished = false;
    while !inner.closed.load(Ordering::Acquire) {
        let max_wait = if purge_unfinished {
            Duration::ZERO
        } else if inner.timer.next_expiration().is_some() || inner.purge_due() {
            REAPER_WAIT
        } else {
            Duration::MAX
        };
        (_, purge_unfinished) = Inner::reap_once(inner, max_wait, &mut expired);
    }
}
