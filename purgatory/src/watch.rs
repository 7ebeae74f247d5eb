//! The watch protocol, written once: a single `watch` is a chunk of one, `watch_batch`
//! runs it over chunks of at most [`CHUNK`]. The inline capacity `N` of the chunk's
//! buffers is a type parameter, so the single call keeps everything on a small stack
//! frame and the batch gets room for a whole chunk.
//!
//! # Steps (Kafka's order), for every operation of the chunk
//! 1. Put it in a new slot of the op table, locked (nobody else can know the slot yet).
//! 2. `try_complete`; if ready, it is taken and completed in step 6.
//! 3. List it on every one of its keys (each watcher shard locked once per chunk).
//! 4. `try_complete` again: an event between steps 2 and 3 did not find it listed, so
//!    nobody else will try it for that event.
//! 5. Arm its timeout (the timer shard locked once per chunk) and unlock it.
//! 6. After every lock of the chunk is released: free the slots emptied on the way, run
//!    the callbacks of what completed, and expire what timed out while it was locked.
//!
//! # Invariants
//! - The chunk holds each operation's lock from step 1 to step 5, so an event during the
//!   watch is never lost: it is seen by the second try, or it finds the operation listed
//!   and tries it once the lock is released.
//! - Once listed, an operation's slot can be waited for by a checker; it waits at most
//!   until its chunk is armed. The chunk's `try_complete` calls run under its own
//!   operation's lock and the locks of the chunk's other (new) operations.
//! - An operation whose key's `Hash` or `Eq` panics while being listed is taken back out
//!   before it is armed: it gets [`WatchError::KeyPanicked`] with the operation, its
//!   entries on its other keys are stale, and nothing of it is armed. A panicking
//!   `timeout()` is caught the same way, before anything of its operation exists here.
//! - Each operation gets exactly one result, at its position in the input.

use std::hash::Hash;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use smallvec::SmallVec;
use timer_core::{panic_message, AddError, TimerHandle};

use crate::counters::Count;
use crate::error::WatchError;
use crate::expiry::Expiry;
use crate::handle::{OperationHandle, WatchOutcome};
use crate::op_table::{Locked, OpRef, Taken, Vacated};
use crate::operation::{Completion, DelayedOperation};
use crate::state::State;

/// Most operations watched under one round of locks.
pub(crate) const CHUNK: usize = 64;

/// The keys of one operation, collected before any lock is taken.
pub(crate) type Keys<K> = SmallVec<[K; 4]>;

/// What watching one operation gave.
pub(crate) type WatchResult<O> = Result<WatchOutcome<O>, WatchError<O>>;

impl<K: Hash + Eq + Clone, O: DelayedOperation> State<K, O> {
    /// Watches the operations of `chunk` (at most [`CHUNK`]) and appends one result per
    /// operation, in order, to `results`.
    pub(crate) fn watch_chunk<const N: usize>(
        &self,
        chunk: impl ExactSizeIterator<Item = (O, Keys<K>)>,
        results: &mut impl Extend<WatchResult<O>>,
    ) {
        debug_assert!(chunk.len() <= CHUNK);
        let closed = self.timer.is_shutdown();
        let mut out: SmallVec<[Option<WatchResult<O>>; N]> =
            (0..chunk.len()).map(|_| None).collect();
        // The operations that go on: the operation, its keys, timeout and input position.
        let mut ops: SmallVec<[O; N]> = SmallVec::new();
        let mut keys: SmallVec<[Keys<K>; N]> = SmallVec::new();
        let mut timeouts: SmallVec<[Duration; N]> = SmallVec::new();
        let mut position: SmallVec<[usize; N]> = SmallVec::new();
        for (i, (op, op_keys)) in chunk.enumerate() {
            if closed {
                out[i] = Some(Err(WatchError::Shutdown(op)));
            } else if op_keys.is_empty() {
                out[i] = Some(Err(WatchError::NoKeys(op)));
            } else {
                match catch_unwind(AssertUnwindSafe(|| op.timeout())) {
                    Ok(timeout) => {
                        timeouts.push(timeout);
                        ops.push(op);
                        keys.push(op_keys);
                        position.push(i);
                    }
                    Err(payload) => {
                        tracing::error!(target: "purgatory", panic = panic_message(&*payload), "timeout() panicked; the operation is handed back");
                        self.counters.add(Count::Panicked, 1);
                        out[i] = Some(Err(WatchError::TimeoutPanicked(op)));
                    }
                }
            }
        }
        // Completed here, with their index among `ops`.
        let mut done: SmallVec<[Taken<O>; N]> = SmallVec::new();
        let mut done_at: SmallVec<[usize; N]> = SmallVec::new();
        let mut at: SmallVec<[OpRef; N]> = SmallVec::new();
        // Slots emptied while other slots of the chunk are locked: freed once every slot
        // lock is released (the op table's lock order).
        let mut vacated: SmallVec<[Vacated; N]> = SmallVec::new();
        // Armed and unlocked at the end of step 5.
        let mut armed_ok: SmallVec<[usize; N]> = SmallVec::new();
        {
            let mut locked: SmallVec<[Option<Locked<'_, O>>; N]> = SmallVec::new();
            // Step 1.
            self.table.insert_many(ops.drain(..), &mut locked);
            at.extend(locked.iter().flatten().map(Locked::at));
            let mut take = |slot: &mut Option<Locked<'_, O>>| {
                let (taken, empty) = slot.take().expect("still locked").take_deferred();
                vacated.push(empty);
                taken
            };
            // Step 2.
            for (j, slot) in locked.iter_mut().enumerate() {
                if self.is_ready(slot.as_mut().expect("locked above")) {
                    done.push(take(slot));
                    done_at.push(j);
                }
            }
            // Step 3.
            let mut entries: SmallVec<[(Option<K>, OpRef); 8]> = SmallVec::new();
            let mut owner: SmallVec<[usize; 8]> = SmallVec::new();
            for (j, slot) in locked.iter_mut().enumerate() {
                if let Some(op) = slot {
                    op.set_keys(u32::try_from(keys[j].len()).unwrap_or(u32::MAX));
                    owner.extend(std::iter::repeat_n(j, keys[j].len()));
                    entries.extend(keys[j].drain(..).map(|key| (Some(key), at[j])));
                }
            }
            let unlisted = self.watchers.watch_many(&mut entries);
            drop(entries);
            if !unlisted.is_empty() {
                // A key's `Hash` or `Eq` panicked: its operation goes back to the caller,
                // unarmed; what of it was listed is stale.
                let mut failed: SmallVec<[u32; N]> = SmallVec::from_elem(0, locked.len());
                for i in unlisted {
                    failed[owner[i]] += 1;
                }
                for (j, &failures) in failed.iter().enumerate() {
                    if failures > 0 {
                        self.counters.add(Count::Panicked, 1);
                        let taken = take(&mut locked[j]);
                        self.watchers.mark_stale(taken.keys - failures);
                        out[position[j]] = Some(Err(WatchError::KeyPanicked(taken.op)));
                    }
                }
            }
            // Step 4, and the timeouts of those still waiting.
            let mut armed: SmallVec<[usize; N]> = SmallVec::new();
            let mut tasks: SmallVec<[(Duration, Expiry); N]> = SmallVec::new();
            for (j, slot) in locked.iter_mut().enumerate() {
                let Some(op) = slot.as_mut() else {
                    continue;
                };
                if self.is_ready(op) {
                    done.push(take(slot));
                    done_at.push(j);
                } else {
                    tasks.push((timeouts[j], Expiry(at[j])));
                    armed.push(j);
                }
            }
            // Step 5.
            let mut handles: SmallVec<[Result<TimerHandle, AddError<Expiry>>; N]> = SmallVec::new();
            self.arm(&mut tasks, &mut handles);
            for (j, handle) in armed.into_iter().zip(handles) {
                match handle {
                    Ok(handle) => {
                        locked[j].as_mut().expect("still locked").arm(handle);
                        armed_ok.push(j);
                    }
                    Err(_) => {
                        // Shut down while we were watching: hand the operation back. Its
                        // entries are now stale.
                        let taken = take(&mut locked[j]);
                        self.watchers.mark_stale(taken.keys);
                        out[position[j]] = Some(Err(WatchError::Shutdown(taken.op)));
                    }
                }
            }
        }
        // Step 6. An operation whose timeout fired while the chunk held its lock (a zero
        // or tiny timeout) is expired now (see `OpTable::claim_expiry`).
        if !vacated.is_empty() {
            self.table.vacate(&vacated);
        }
        self.complete(&mut done, Completion::Ready);
        let mut expired: SmallVec<[Taken<O>; 1]> = SmallVec::new();
        for &j in &armed_ok {
            expired.extend(self.table.claim_expiry(at[j]));
        }
        self.complete(&mut expired, Completion::Expired);
        for j in done_at {
            out[position[j]] = Some(Ok(WatchOutcome::Completed));
        }
        for (j, at) in at.into_iter().enumerate() {
            let slot = &mut out[position[j]];
            if slot.is_none() {
                *slot = Some(Ok(WatchOutcome::Pending(OperationHandle::new(at, self.id))));
            }
        }
        tracing::debug!(target: "purgatory", purgatory = %self.name, operations = out.len(), "watch");
        results.extend(
            out.into_iter()
                .map(|result| result.expect("every operation has a result")),
        );
    }

    /// Arms the timeouts of `tasks` (leaving it empty), one result each in `handles`:
    /// one `add` for a single task, one `add_batch` for more.
    fn arm<const N: usize>(
        &self,
        tasks: &mut SmallVec<[(Duration, Expiry); N]>,
        handles: &mut SmallVec<[Result<TimerHandle, AddError<Expiry>>; N]>,
    ) {
        if tasks.len() == 1 {
            let (timeout, expiry) = tasks.pop().expect("one task");
            handles.push(self.timer.add(timeout, expiry));
        } else if !tasks.is_empty() {
            let mut batch: Vec<(Duration, Expiry)> = tasks.drain(..).collect();
            let mut out = Vec::with_capacity(batch.len());
            self.timer.add_batch(&mut batch, &mut out);
            handles.extend(out);
        }
    }
}
