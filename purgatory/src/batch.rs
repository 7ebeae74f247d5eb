//! Batch entry points: watching many operations, or force-completing many, with one
//! round of locks instead of one per operation.
//!
//! # Why
//! A broker often has many requests in hand at once (a produce request for many
//! partitions, a network poll that returned many requests, a replica fetch that satisfied
//! many waiters). Watched one by one, each operation takes the lock of every key's shard
//! and of a timer shard, and reads the clock. In a batch, the watcher shards are locked
//! once per run of entries that fall in them (entries sorted by shard), the clock is read
//! once and the timer shard is locked once per 64 operations. Force-completions cancel
//! their timers in one [`Timer::cancel_batch`](timer_core::Timer::cancel_batch) and count
//! once per batch.
//!
//! # Invariants (the same as one at a time, see `purgatory.rs`)
//! - The batch holds the lock of each of its operations from its first `try_complete`
//!   until it is listed on every key and armed (or completed, or handed back), so an event
//!   during the batch is never lost: it is seen by the second try, or it finds the
//!   operation listed and tries it once the batch releases the lock.
//! - The operations of a chunk are created by the batch, so nobody else can wait for
//!   their locks before they are listed; once listed, a checker waits at most until the
//!   chunk (at most [`CHUNK`] operations) is armed.
//! - `on_complete` runs only after every lock of the chunk is released; `try_complete`
//!   runs under its own operation's lock and the locks of the chunk's other operations,
//!   which no other thread can be holding or waiting for in a way that waits on us.
//! - Each operation gets exactly one result, at its position in the input.

use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::time::Duration;

use smallvec::SmallVec;
use timer_core::{AddError, TimerHandle};

use crate::counters::Count;
use crate::error::WatchError;
use crate::op_table::{Locked, OpRef, Taken, Vacated};
use crate::operation::{Completion, DelayedOperation};
use crate::purgatory::{run_callbacks, Expiry, Inner, OperationHandle, Purgatory, Watched};

/// Most operations a batch handles under one round of locks.
pub(crate) const CHUNK: usize = 64;

type Keys<K> = SmallVec<[K; 4]>;

/// What `watch` would return for one operation.
type WatchResult<O> = Result<Watched<O>, WatchError<O>>;

/// Buffers one `watch_batch` call reuses for each of its chunks. Each chunk leaves them
/// empty.
struct WatchScratch<K> {
    /// `(key, operation)` list entries, for `Watchers::watch_many`.
    entries: Vec<(Option<K>, OpRef)>,
    /// `(timeout, expiry)` timer tasks, for `Timer::add_batch`.
    tasks: Vec<(Duration, Expiry)>,
    /// Their results.
    handles: Vec<Result<TimerHandle, AddError<Expiry>>>,
}

impl<K> Default for WatchScratch<K> {
    fn default() -> Self {
        WatchScratch {
            entries: Vec::new(),
            tasks: Vec::new(),
            handles: Vec::new(),
        }
    }
}

impl<K, O> Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// Watches every `(operation, keys)` of `batch`, with the same outcome for each as
    /// [`watch`](Self::watch), and returns one result per operation, in input order.
    /// Cheaper per operation than one `watch` each when there are many (fewer lock round
    /// trips and clock reads; see `docs/purgatory.md`).
    ///
    /// Every timeout counts from one clock reading per 64 operations. The `try_complete`
    /// of an operation may run while the batch holds the locks of other operations of
    /// the batch: it must not call into this purgatory (the locking rule of
    /// [`Purgatory`] already forbids it for the operation's own lock).
    pub fn watch_batch<I, Ks>(&self, batch: I) -> Vec<WatchResult<O>>
    where
        I: IntoIterator<Item = (O, Ks)>,
        Ks: IntoIterator<Item = K>,
    {
        // Run the caller's iterators before any lock is taken: they are user code.
        let staged: Vec<(O, Keys<K>)> = batch
            .into_iter()
            .map(|(op, keys)| (op, keys.into_iter().collect()))
            .collect();
        let mut results = Vec::with_capacity(staged.len());
        let mut scratch = WatchScratch::default();
        let mut staged = staged.into_iter();
        while staged.len() > 0 {
            self.inner
                .watch_chunk(staged.by_ref().take(CHUNK), &mut scratch, &mut results);
        }
        results
    }

    /// Force-completes every operation `handles` names, like
    /// [`force_complete`](Self::force_complete) on each; returns how many this call
    /// completed. Their timers are cancelled in batches and the counters updated once per
    /// batch.
    pub fn force_complete_batch<'a, I>(&self, handles: I) -> usize
    where
        I: IntoIterator<Item = &'a OperationHandle<O>>,
        O: 'a,
    {
        let inner = &*self.inner;
        let mut chunk: SmallVec<[OpRef; CHUNK]> = SmallVec::new();
        let mut completed = 0;
        for handle in handles {
            if handle.purgatory == inner.id {
                chunk.push(handle.at);
                if chunk.len() == CHUNK {
                    completed += inner.force_chunk(&mut chunk);
                }
            }
        }
        completed + inner.force_chunk(&mut chunk)
    }
}

impl<K: Hash + Eq + Clone, O: DelayedOperation> Inner<K, O> {
    /// Watches at most [`CHUNK`] operations; appends their results to `results`.
    fn watch_chunk(
        &self,
        chunk: impl ExactSizeIterator<Item = (O, Keys<K>)>,
        scratch: &mut WatchScratch<K>,
        results: &mut Vec<WatchResult<O>>,
    ) {
        let closed = self.closed.load(Ordering::Acquire);
        let mut slots: SmallVec<[Option<WatchResult<O>>; CHUNK]> =
            (0..chunk.len()).map(|_| None).collect();
        // The operations that go on: their keys, timeout and input position.
        let mut ops: SmallVec<[O; CHUNK]> = SmallVec::new();
        let mut keys: SmallVec<[Keys<K>; CHUNK]> = SmallVec::new();
        let mut timeouts: SmallVec<[Duration; CHUNK]> = SmallVec::new();
        let mut position: SmallVec<[usize; CHUNK]> = SmallVec::new();
        for (i, (op, op_keys)) in chunk.enumerate() {
            if closed {
                slots[i] = Some(Err(WatchError::Shutdown(op)));
            } else if op_keys.is_empty() {
                slots[i] = Some(Err(WatchError::NoKeys(op)));
            } else {
                timeouts.push(op.timeout());
                ops.push(op);
                keys.push(op_keys);
                position.push(i);
            }
        }
        // Completed here: (operation, index in `at`).
        let mut done: SmallVec<[(Taken<O>, usize); 8]> = SmallVec::new();
        let mut at: SmallVec<[OpRef; CHUNK]> = SmallVec::new();
        // Slots emptied while other slots of the chunk are locked: returned to the free
        // lists once every slot lock is released (the op table's lock order).
        let mut vacated: SmallVec<[Vacated; 8]> = SmallVec::new();
        let WatchScratch {
            entries,
            tasks,
            handles,
        } = scratch;
        {
            let mut locked: SmallVec<[Option<Locked<'_, O>>; CHUNK]> = SmallVec::new();
            self.table.insert_many(ops.drain(..), &mut locked);
            at.extend(locked.iter().flatten().map(Locked::at));
            for (j, slot) in locked.iter_mut().enumerate() {
                if self.is_ready(slot.as_mut().expect("locked above")) {
                    let (taken, empty) = slot.take().expect("locked above").take_deferred();
                    vacated.push(empty);
                    done.push((taken, j));
                }
            }
            let mut listed = 0i64;
            for (j, slot) in locked.iter_mut().enumerate() {
                if let Some(op) = slot {
                    let count = u32::try_from(keys[j].len()).unwrap_or(u32::MAX);
                    op.set_keys(count);
                    listed += i64::from(count);
                    entries.extend(keys[j].drain(..).map(|key| (Some(key), at[j])));
                }
            }
            self.counters.add_listed(listed);
            self.watchers.watch_many(entries);
            // Try once more now that they are listed (see `watch`).
            let mut armed: SmallVec<[usize; CHUNK]> = SmallVec::new();
            for (j, slot) in locked.iter_mut().enumerate() {
                let Some(op) = slot.as_mut() else {
                    continue;
                };
                if self.is_ready(op) {
                    let (taken, empty) = slot.take().expect("checked above").take_deferred();
                    vacated.push(empty);
                    done.push((taken, j));
                } else {
                    tasks.push((timeouts[j], Expiry(at[j])));
                    armed.push(j);
                }
            }
            self.timer.add_batch(tasks, handles);
            for (j, handle) in armed.into_iter().zip(handles.drain(..)) {
                match handle {
                    Ok(handle) => locked[j].as_mut().expect("still locked").arm(handle),
                    Err(_) => {
                        // Shut down while we were watching: hand the operation back. Its
                        // entries are now stale.
                        let (taken, empty) =
                            locked[j].take().expect("still locked").take_deferred();
                        vacated.push(empty);
                        self.counters.add_stale(i64::from(taken.keys));
                        slots[position[j]] = Some(Err(WatchError::Shutdown(taken.op)));
                    }
                }
            }
        }
        if !vacated.is_empty() {
            self.table.vacate(&vacated);
        }
        for (taken, j) in done {
            self.finish(taken, Completion::Ready);
            slots[position[j]] = Some(Ok(Watched::Completed));
        }
        for (j, at) in at.into_iter().enumerate() {
            let slot = &mut slots[position[j]];
            if slot.is_none() {
                *slot = Some(Ok(Watched::Pending(OperationHandle::new(at, self.id))));
            }
        }
        tracing::debug!(target: "purgatory", purgatory = %self.name, operations = slots.len(), "watch batch");
        results.extend(
            slots
                .into_iter()
                .map(|slot| slot.expect("every operation has a result")),
        );
    }
}

impl<K, O: DelayedOperation> Inner<K, O> {
    /// Force-completes the operations of `chunk` still waiting; empties it and returns
    /// how many it completed.
    fn force_chunk(&self, chunk: &mut SmallVec<[OpRef; CHUNK]>) -> usize {
        self.table.prepare(chunk.iter().copied());
        let mut taken: SmallVec<[(O, u32); CHUNK]> = SmallVec::new();
        let mut timers: SmallVec<[TimerHandle; CHUNK]> = SmallVec::new();
        let mut vacated: SmallVec<[Vacated; CHUNK]> = SmallVec::new();
        for at in chunk.drain(..) {
            if let Some(locked) = self.table.lock(at) {
                let (Taken { op, timer, keys }, slot) = locked.take_deferred();
                timers.extend(timer);
                taken.push((op, keys));
                vacated.push(slot);
            }
        }
        self.table.vacate(&vacated);
        self.finish_forced(&mut taken, &mut timers)
    }

    /// Completes force-taken operations: cancels their timers in one batch, counts once,
    /// runs their callbacks. Empties both buffers; returns how many it completed.
    fn finish_forced(
        &self,
        taken: &mut SmallVec<[(O, u32); CHUNK]>,
        timers: &mut SmallVec<[TimerHandle; CHUNK]>,
    ) -> usize {
        let n = taken.len();
        if n == 0 {
            return 0;
        }
        let mut cancelled: SmallVec<[Expiry; CHUNK]> = SmallVec::new();
        self.timer.cancel_batch(timers, &mut cancelled);
        timers.clear();
        drop(cancelled);
        let stale: i64 = taken.iter().map(|(_, keys)| i64::from(*keys)).sum();
        self.counters.add_stale(stale);
        self.counters.add(Count::Forced, n as u64);
        let mut panics = 0;
        for (op, _) in taken.drain(..) {
            panics += run_callbacks(op, Completion::Forced);
        }
        if panics > 0 {
            self.counters.add(Count::Panicked, panics);
        }
        tracing::debug!(target: "purgatory", purgatory = %self.name, forced = n, "force batch");
        n
    }
}
