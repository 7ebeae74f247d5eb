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

/// One operation of a chunk as it goes through the steps.
struct Member<'a, K, O: DelayedOperation> {
    /// Its position in the chunk's input, and so its result's.
    position: usize,
    keys: Keys<K>,
    timeout: Duration,
    /// Its slot, locked from step 1 until it is taken or step 5 ends.
    locked: Option<Locked<'a, O>>,
    /// Its name, once it has a slot.
    op: OpRef,
    /// Whether it now waits (listed and armed), once step 5 is done.
    waiting: bool,
}

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
        let mut ops: SmallVec<[O; N]> = SmallVec::new();
        let mut members: SmallVec<[Member<'_, K, O>; N]> = SmallVec::new();
        for (position, (op, keys)) in chunk.enumerate() {
            let refused = if closed {
                WatchError::Shutdown(op)
            } else if keys.is_empty() {
                WatchError::NoKeys(op)
            } else {
                match catch_unwind(AssertUnwindSafe(|| op.timeout())) {
                    Ok(timeout) => {
                        ops.push(op);
                        members.push(Member {
                            position,
                            keys,
                            timeout,
                            locked: None,
                            op: OpRef::default(),
                            waiting: false,
                        });
                        continue;
                    }
                    Err(payload) => {
                        tracing::error!(target: "purgatory", panic = panic_message(&*payload), "timeout() panicked; the operation is handed back");
                        self.counters.add(Count::Panicked, 1);
                        WatchError::TimeoutPanicked(op)
                    }
                }
            };
            out[position] = Some(Err(refused));
        }
        // Completed here (step 2 or 4).
        let mut done: SmallVec<[Taken<O>; N]> = SmallVec::new();
        // Slots emptied while other slots of the chunk are locked: freed once every slot
        // lock is released (the op table's lock order).
        let mut vacated: SmallVec<[Vacated; N]> = SmallVec::new();
        let mut take = |member: &mut Member<'_, K, O>| {
            let locked = member.locked.take().expect("still locked");
            let (taken, empty) = locked.take_deferred();
            vacated.push(empty);
            taken
        };
        // Step 1.
        self.table
            .insert_many(ops.drain(..), members.iter_mut().map(|m| &mut m.locked));
        for m in members.iter_mut() {
            m.op = m.locked.as_ref().expect("locked above").op();
        }
        // Step 2.
        for m in members.iter_mut() {
            if self.is_ready(m.locked.as_mut().expect("locked above")) {
                done.push(take(m));
                out[m.position] = Some(Ok(WatchOutcome::Completed));
            }
        }
        // Step 3. One operation's keys fit inline; a batch's are reserved once.
        let total: usize = members.iter().map(|m| m.keys.len()).sum();
        let mut entries: SmallVec<[(Option<K>, OpRef); 4]> = SmallVec::with_capacity(total);
        let mut owner: SmallVec<[u32; 4]> = SmallVec::with_capacity(total);
        for (j, m) in members.iter_mut().enumerate() {
            if let Some(locked) = m.locked.as_mut() {
                locked.set_keys(u32::try_from(m.keys.len()).unwrap_or(u32::MAX));
                owner.extend(std::iter::repeat_n(j as u32, m.keys.len()));
                entries.extend(m.keys.drain(..).map(|key| (Some(key), m.op)));
            }
        }
        let unlisted = self.watchers.watch_many(&mut entries);
        drop(entries);
        if !unlisted.is_empty() {
            // A key's `Hash` or `Eq` panicked: its operation goes back to the caller,
            // unarmed; what of it was listed is stale.
            let mut failed: SmallVec<[u32; N]> = SmallVec::from_elem(0, members.len());
            for i in unlisted {
                failed[owner[i] as usize] += 1;
            }
            for (m, &failures) in members.iter_mut().zip(&failed) {
                if failures > 0 {
                    self.counters.add(Count::Panicked, 1);
                    let taken = take(m);
                    self.watchers.mark_stale(taken.keys - failures);
                    out[m.position] = Some(Err(WatchError::KeyPanicked(taken.op)));
                }
            }
        }
        // Step 4, and the timeouts of those still waiting.
        let mut tasks: SmallVec<[(Duration, Expiry); N]> = SmallVec::new();
        for m in members.iter_mut() {
            let Some(locked) = m.locked.as_mut() else {
                continue;
            };
            if self.is_ready(locked) {
                done.push(take(m));
                out[m.position] = Some(Ok(WatchOutcome::Completed));
            } else {
                tasks.push((m.timeout, Expiry(m.op)));
            }
        }
        // Step 5: arm, then unlock.
        let mut expired: SmallVec<[Taken<O>; 1]> = SmallVec::new();
        let mut handles: SmallVec<[Result<TimerHandle, AddError<Expiry>>; N]> = SmallVec::new();
        self.arm(&mut tasks, &mut handles);
        let mut handles = handles.into_iter();
        for m in members.iter_mut().filter(|m| m.locked.is_some()) {
            match handles.next().expect("one result per task") {
                Ok(handle) => {
                    let mut locked = m.locked.take().expect("still locked");
                    locked.arm(handle);
                    // Its timeout may already have fired (a zero or tiny timeout): then
                    // the unlock hands it back, to expire once no slot is held.
                    if let Some(taken) = locked.unlock() {
                        expired.push(taken);
                    }
                    m.waiting = true;
                }
                Err(_) => {
                    // Shut down while we were watching: hand the operation back. Its
                    // entries are now stale.
                    let taken = take(m);
                    self.watchers.mark_stale(taken.keys);
                    out[m.position] = Some(Err(WatchError::Shutdown(taken.op)));
                }
            }
        }
        // Step 6.
        if !vacated.is_empty() {
            self.table.vacate(&vacated);
        }
        self.complete(&mut done, Completion::Ready);
        for m in members.iter().filter(|m| m.waiting) {
            out[m.position] = Some(Ok(WatchOutcome::Pending(OperationHandle::new(
                m.op, self.id,
            ))));
        }
        self.complete(&mut expired, Completion::Expired);
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
