//! The naive purgatory: one mutex around `HashMap<key, Vec<operation>>`, and a
//! `BinaryHeap` timer with lazy deletion driven by a reaper thread. It is what one writes
//! first, done carefully: every operation is an `Arc` with its own lock and a `done`
//! flag for exactly-once completion, the map lock is never held while user code runs,
//! and completed entries are purged Kafka's way (when more than `purge_interval`
//! completed entries are still listed).
//!
//! # Invariants
//! - An operation is completed exactly once: whoever takes it out of its slot's
//!   `Option` (under the slot lock) runs its callbacks; everybody else finds `None`.
//! - `done` is set right after the operation is taken, so purges and checks can skip
//!   completed entries without taking their lock.
//! - A forced or event completion leaves the heap entry in place (a heap cannot remove
//!   from the middle); the reaper discards it when its deadline comes up.
//! - A watch tries the operation, lists it, then tries it again (Kafka's order), so an
//!   event that fires while it is being listed is not lost.
//! - No lock of the purgatory is held while `try_complete`'s caller-visible effects
//!   (`on_complete`, `on_expiration`) run; `try_complete` itself runs under the slot lock.

use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use purgatory::{Completion, DelayedOperation};

use super::heap_entry::HeapEntry;

/// Longest the reaper sleeps while it has nothing due (Kafka's reaper wait).
const REAPER_WAIT: Duration = Duration::from_millis(200);

type Map<K, O> = HashMap<K, Vec<Arc<Slot<O>>>, foldhash::fast::RandomState>;

struct Slot<O> {
    op: Mutex<Option<O>>,
    done: AtomicBool,
    keys: u32,
}

/// A watched operation, for [`NaivePurgatory::force_complete`].
pub struct NaiveHandle<O>(Arc<Slot<O>>);

struct Timer<O> {
    heap: BinaryHeap<HeapEntry<u64, Arc<Slot<O>>>>,
    next_seq: u64,
    closed: bool,
}

struct Shared<K, O> {
    watchers: Mutex<Map<K, O>>,
    timer: Mutex<Timer<O>>,
    wake: Condvar,
    origin: Instant,
    /// Completed operations' entries still listed (approximate, for the purge rule).
    stale: AtomicI64,
    purge_interval: i64,
    completed: AtomicU64,
    expired: AtomicU64,
}

/// Counters of a [`NaivePurgatory`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NaiveStats {
    /// Heap entries (pending operations plus completed ones not yet popped).
    pub timer_entries: usize,
    /// Completed by an event or forced.
    pub completed: u64,
    /// Completed by their timeout.
    pub expired: u64,
}

/// A mutex-around-a-map purgatory with a heap timer and a reaper thread.
pub struct NaivePurgatory<K, O> {
    shared: Arc<Shared<K, O>>,
    reaper: Mutex<Option<JoinHandle<()>>>,
}

impl<K, O> NaivePurgatory<K, O>
where
    K: Hash + Eq + Clone + Send + 'static,
    O: DelayedOperation,
{
    /// Starts the purgatory and its reaper; purges once `purge_interval` completed
    /// entries are listed (Kafka's default is 1,000).
    pub fn start(purge_interval: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            watchers: Mutex::new(Map::default()),
            timer: Mutex::new(Timer {
                heap: BinaryHeap::new(),
                next_seq: 0,
                closed: false,
            }),
            wake: Condvar::new(),
            origin: Instant::now(),
            stale: AtomicI64::new(0),
            purge_interval: i64::try_from(purge_interval).unwrap_or(i64::MAX),
            completed: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        });
        let for_reaper = Arc::clone(&shared);
        let reaper = std::thread::Builder::new()
            .name("naive-reaper".into())
            .spawn(move || reaper_loop(&for_reaper))?;
        Ok(NaivePurgatory {
            shared,
            reaper: Mutex::new(Some(reaper)),
        })
    }

    /// Tries `op`; if not ready, watches it on `keys` and arms its timeout. Returns a
    /// handle while it waits, `None` if it completed here (or if `keys` was empty, in
    /// which case it is completed as expired so it is answered).
    pub fn watch(&self, mut op: O, keys: impl IntoIterator<Item = K>) -> Option<NaiveHandle<O>> {
        let s = &*self.shared;
        if op.try_complete() {
            s.completed.fetch_add(1, Ordering::Relaxed);
            op.on_complete(Completion::Ready);
            return None;
        }
        let timeout = op.timeout();
        let keys: Vec<K> = keys.into_iter().collect();
        let slot = Arc::new(Slot {
            op: Mutex::new(Some(op)),
            done: AtomicBool::new(false),
            keys: keys.len() as u32,
        });
        {
            let mut map = s.watchers.lock();
            for key in keys {
                map.entry(key).or_default().push(Arc::clone(&slot));
            }
        }
        if s.try_complete_slot(&slot) {
            return None;
        }
        let at_nanos = s
            .now_nanos()
            .saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX));
        let mut timer = s.timer.lock();
        if timer.closed {
            drop(timer);
            s.complete(&slot, Completion::Expired);
            return None;
        }
        let seq = timer.next_seq;
        timer.next_seq += 1;
        timer.heap.push(HeapEntry {
            deadline: at_nanos,
            seq,
            task: Arc::clone(&slot),
        });
        let earliest = timer.heap.peek().is_some_and(|d| d.seq == seq);
        drop(timer);
        if earliest {
            s.wake.notify_one();
        }
        Some(NaiveHandle(slot))
    }

    /// Watches a batch, like [`watch`](Self::watch) on each, with one map lock and one
    /// timer lock for the whole batch (the best this design can do with many requests in
    /// hand). Appends one result per operation to `out`, in order.
    pub fn watch_batch<'k>(
        &self,
        batch: impl IntoIterator<Item = (O, &'k [K])>,
        out: &mut Vec<Option<NaiveHandle<O>>>,
    ) where
        K: 'k,
    {
        let s = &*self.shared;
        let first = out.len();
        // (slot, timeout, position in `out`) of the operations that wait.
        let mut waiting = Vec::new();
        {
            let mut map = None;
            for (mut op, keys) in batch {
                if op.try_complete() {
                    s.completed.fetch_add(1, Ordering::Relaxed);
                    op.on_complete(Completion::Ready);
                    out.push(None);
                    continue;
                }
                let timeout = op.timeout();
                let slot = Arc::new(Slot {
                    op: Mutex::new(Some(op)),
                    done: AtomicBool::new(false),
                    keys: keys.len() as u32,
                });
                let map = map.get_or_insert_with(|| s.watchers.lock());
                for key in keys {
                    map.entry(key.clone()).or_default().push(Arc::clone(&slot));
                }
                waiting.push((slot, timeout, out.len()));
                out.push(None);
            }
        }
        waiting.retain(|(slot, _, _)| !s.try_complete_slot(slot));
        if waiting.is_empty() {
            return;
        }
        let now = s.now_nanos();
        let mut timer = s.timer.lock();
        if timer.closed {
            drop(timer);
            for (slot, _, _) in waiting {
                s.complete(&slot, Completion::Expired);
            }
            return;
        }
        let before = timer.heap.peek().map(|d| d.seq);
        for (slot, timeout, at) in waiting {
            let seq = timer.next_seq;
            timer.next_seq += 1;
            timer.heap.push(HeapEntry {
                deadline: now.saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)),
                seq,
                task: Arc::clone(&slot),
            });
            debug_assert!(at >= first);
            out[at] = Some(NaiveHandle(slot));
        }
        let earliest_changed = timer.heap.peek().map(|d| d.seq) != before;
        drop(timer);
        if earliest_changed {
            s.wake.notify_one();
        }
    }

    /// Completes the operation now unless it already completed; true if this call did.
    pub fn force_complete(&self, handle: &NaiveHandle<O>) -> bool {
        self.shared.complete(&handle.0, Completion::Forced)
    }

    /// Tries every operation watched on `key`, completing the ready ones, and drops
    /// completed entries from the list. Returns how many this call completed.
    pub fn check_and_complete(&self, key: &K) -> usize {
        let s = &*self.shared;
        let Some(list) = s.watchers.lock().remove(key) else {
            return 0;
        };
        let mut survivors = Vec::with_capacity(list.len());
        let mut completed = 0;
        let mut dropped_stale = 0;
        for slot in list {
            if slot.done.load(Ordering::Acquire) {
                dropped_stale += 1;
            } else if s.try_complete_slot(&slot) {
                completed += 1;
                dropped_stale += 1;
            } else {
                survivors.push(slot);
            }
        }
        s.stale.fetch_sub(dropped_stale, Ordering::Relaxed);
        if !survivors.is_empty() {
            let mut map = s.watchers.lock();
            let list = map.entry(key.clone()).or_default();
            survivors.append(list);
            *list = survivors;
        }
        completed
    }

    /// Counters.
    pub fn stats(&self) -> NaiveStats {
        let s = &*self.shared;
        NaiveStats {
            timer_entries: s.timer.lock().heap.len(),
            completed: s.completed.load(Ordering::Relaxed),
            expired: s.expired.load(Ordering::Relaxed),
        }
    }

    /// Stops the reaper and expires every operation still pending, on this thread.
    pub fn shutdown(&self) {
        let s = &*self.shared;
        let rest = {
            let mut timer = s.timer.lock();
            timer.closed = true;
            std::mem::take(&mut timer.heap)
        };
        s.wake.notify_one();
        if let Some(reaper) = self.reaper.lock().take() {
            let _ = reaper.join();
        }
        for entry in rest {
            s.complete(&entry.task, Completion::Expired);
        }
        s.watchers.lock().clear();
    }
}

impl<K, O> Drop for NaivePurgatory<K, O> {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.timer.lock().closed = true;
        s.wake.notify_one();
        if let Some(reaper) = self.reaper.lock().take() {
            let _ = reaper.join();
        }
    }
}

impl<K, O: DelayedOperation> Shared<K, O> {
    fn now_nanos(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Takes the operation if still there and completes it `how`; true if this call did.
    fn complete(&self, slot: &Slot<O>, how: Completion) -> bool {
        let Some(mut op) = slot.op.lock().take() else {
            return false;
        };
        slot.done.store(true, Ordering::Release);
        self.finish(&mut op, slot.keys, how);
        true
    }

    /// Runs `try_complete` under the slot lock and completes the operation if ready.
    fn try_complete_slot(&self, slot: &Slot<O>) -> bool {
        let mut guard = slot.op.lock();
        let Some(op) = guard.as_mut() else {
            return false;
        };
        if !op.try_complete() {
            return false;
        }
        let mut op = guard.take().expect("checked above");
        drop(guard);
        slot.done.store(true, Ordering::Release);
        self.finish(&mut op, slot.keys, Completion::Ready);
        true
    }

    fn finish(&self, op: &mut O, keys: u32, how: Completion) {
        self.stale.fetch_add(i64::from(keys), Ordering::Relaxed);
        match how {
            Completion::Expired => {
                self.expired.fetch_add(1, Ordering::Relaxed);
                op.on_complete(how);
                op.on_expiration();
            }
            _ => {
                self.completed.fetch_add(1, Ordering::Relaxed);
                op.on_complete(how);
            }
        }
    }
}

impl<K: Hash + Eq, O: DelayedOperation> Shared<K, O> {
    fn purge(&self) {
        let mut map = self.watchers.lock();
        map.retain(|_, list| {
            list.retain(|slot| !slot.done.load(Ordering::Acquire));
            !list.is_empty()
        });
        drop(map);
        self.stale.store(0, Ordering::Relaxed);
    }
}

fn reaper_loop<K: Hash + Eq, O: DelayedOperation>(s: &Shared<K, O>) {
    let mut due = Vec::new();
    let mut timer = s.timer.lock();
    while !timer.closed {
        let now = s.now_nanos();
        while timer.heap.peek().is_some_and(|d| d.deadline <= now) {
            if let Some(d) = timer.heap.pop() {
                due.push(d.task);
            }
        }
        if !due.is_empty() || s.stale.load(Ordering::Relaxed) >= s.purge_interval {
            parking_lot::MutexGuard::unlocked(&mut timer, || {
                for slot in due.drain(..) {
                    if !slot.done.load(Ordering::Acquire) {
                        s.complete(&slot, Completion::Expired);
                    }
                }
                if s.stale.load(Ordering::Relaxed) >= s.purge_interval {
                    s.purge();
                }
            });
            continue;
        }
        let wait_until = match timer.heap.peek() {
            Some(d) => s.origin + Duration::from_nanos(d.deadline),
            None => Instant::now() + REAPER_WAIT,
        };
        s.wake.wait_until(&mut timer, wait_until);
    }
}

impl<O: DelayedOperation> crate::workloads::w3::LoadPurgatory<O> for NaivePurgatory<u64, O> {
    type Handle = NaiveHandle<O>;

    #[inline]
    fn watch(&self, op: O, keys: &[u64]) -> Option<NaiveHandle<O>> {
        NaivePurgatory::watch(self, op, keys.iter().copied())
    }

    fn watch_batch(&self, batch: &mut Vec<(O, &[u64])>, out: &mut Vec<Option<Self::Handle>>) {
        NaivePurgatory::watch_batch(self, batch.drain(..), out);
    }

    #[inline]
    fn force_complete(&self, handle: &NaiveHandle<O>) -> bool {
        NaivePurgatory::force_complete(self, handle)
    }

    #[inline]
    fn check_and_complete(&self, key: u64) -> usize {
        NaivePurgatory::check_and_complete(self, &key)
    }

    fn shutdown(&self) {
        NaivePurgatory::shutdown(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::test_ops::passes_the_purgatory_checks;

    #[test]
    fn event_force_and_expiry_each_complete_once() {
        passes_the_purgatory_checks(|| NaivePurgatory::start(10).unwrap(), |p| p.stats().expired);
    }
}
