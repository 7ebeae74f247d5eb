//! What the two tokio peers share: watcher lists in a `dashmap::DashMap` (key -> the
//! requests waiting on it) and the per-request [`Slot`] that makes completion
//! exactly-once. Only the timer differs between the peers (a task per request, or one
//! `DelayQueue`), and how a completed request's timer is told: [`Wake`].
//!
//! This is the map a tokio user reaches for: `DashMap<key, Vec<Arc<request>>>` with
//! foldhash (the naive peer's hasher), a `parking_lot` mutex per request. Completed
//! requests' entries are cleaned the way a careful user cleans them, never by a rescan
//! on a request's path: a check drops its key's completed entries as it goes; a list
//! that has doubled since it was last cleaned is cleaned by the watch that pushes onto it
//! (amortised O(1) a push); and lists nobody touches any more are swept by the timer's
//! side ([`Watchers::sweep_if_due`], from the driver task or a timer task, on Kafka's
//! purge rule), off every request's path.
//!
//! # Invariants
//! - A request completes exactly once: whoever takes the operation out of its slot's
//!   `Option` (under the slot's lock) runs `on_complete`; everybody else finds `None`.
//! - `done` is set right after the operation is taken, so list scans and cleanings skip
//!   completed entries without locking them.
//! - A watch tries the operation, lists it, then tries it again (Kafka's order), so an
//!   event that fires while it is being listed is not lost; the caller arms the timeout
//!   only for a request still pending after the second try. A request with no key
//!   (Kafka refuses those) is answered at once, as expired.
//! - Every pending request is listed under at least one key until it completes (a
//!   cleaning drops only completed entries), so [`Watchers::expire_all`] reaches every
//!   one of them at shutdown, wherever its timer is.
//! - A key is removed when a check or a sweep finds its list empty.
//! - `check_and_complete` runs `try_complete` under its key's shard lock (the
//!   operation's contract: cheap and non-blocking) but `on_complete` and the wake-up
//!   only after that lock is released.
//! - A completion other than an expiry calls [`Wake::wake`] on the slot, so a timer
//!   that waits for the request can stop early; an expiry is the timer's own.
//! - Keys are `u64` (all W3 and the criterion bench need).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::Mutex;
use purgatory::{Completion, DelayedOperation};

/// How a request's timer learns that the request completed some other way.
pub trait Wake: Default + Send + Sync + 'static {
    /// Called once, after a forced or event completion.
    fn wake(&self);
}

/// No timer to tell: the timer fires anyway and skips the request (lazy deletion).
impl Wake for () {
    #[inline]
    fn wake(&self) {}
}

/// One request: the operation until it completes, and its timer's wake-up.
pub struct Slot<O, W> {
    op: Mutex<Option<O>>,
    done: AtomicBool,
    keys: u32,
    waker: W,
}

impl<O, W> Slot<O, W> {
    /// Whether the request has completed.
    #[inline]
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// The timer's wake-up.
    #[inline]
    pub fn waker(&self) -> &W {
        &self.waker
    }
}

impl<O: DelayedOperation, W> Slot<O, W> {
    /// Takes the operation out if it is still there and `try_complete` says it is ready
    /// (run under the slot's lock).
    fn take_if_ready(&self) -> Option<O> {
        let mut guard = self.op.lock();
        if guard.as_mut()?.try_complete() {
            guard.take()
        } else {
            None
        }
    }
}

/// What [`Watchers::watch`] did with a request.
pub enum Watched<O, W> {
    /// It completed on the spot (ready before or right after listing).
    Completed,
    /// It is listed and waits: arm its timeout.
    Pending(Arc<Slot<O, W>>),
}

/// Counters of the tokio peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatcherStats {
    /// Completed by an event or forced.
    pub completed: u64,
    /// Completed by their timeout.
    pub expired: u64,
}

/// One key's waiting requests, and the length at which a push cleans it next.
struct List<O, W> {
    slots: Vec<Arc<Slot<O, W>>>,
    clean_at: usize,
}

/// Shortest list a push cleans.
const CLEAN_FROM: usize = 16;

impl<O, W> List<O, W> {
    fn new() -> Self {
        List {
            slots: Vec::new(),
            clean_at: CLEAN_FROM,
        }
    }

    /// Appends `slot`; a list that has doubled since it was last cleaned drops its
    /// completed entries first. Returns how many it dropped.
    fn push(&mut self, slot: Arc<Slot<O, W>>) -> usize {
        let dropped = if self.slots.len() >= self.clean_at {
            self.drop_done()
        } else {
            0
        };
        self.slots.push(slot);
        dropped
    }

    /// Drops the completed entries; returns how many.
    fn drop_done(&mut self) -> usize {
        let before = self.slots.len();
        self.slots.retain(|slot| !slot.is_done());
        self.cleaned();
        before - self.slots.len()
    }

    /// Notes that the list was just cleaned: the next push cleans it once it doubles.
    fn cleaned(&mut self) {
        self.clean_at = (self.slots.len() * 2).max(CLEAN_FROM);
    }
}

type Lists<O, W> = DashMap<u64, List<O, W>, foldhash::fast::RandomState>;

/// The watcher lists and the completion counters of one purgatory.
pub struct Watchers<O, W> {
    lists: Lists<O, W>,
    /// Completed requests' entries still listed (approximate, for the sweep's rule).
    stale: AtomicI64,
    purge_interval: i64,
    completed: AtomicU64,
    expired: AtomicU64,
}

impl<O: DelayedOperation, W: Wake> Watchers<O, W> {
    /// Empty lists; the timer's side sweeps them once `purge_interval` completed entries
    /// are listed (Kafka's purge rule; its default is 1,000).
    pub fn new(purge_interval: usize) -> Self {
        Watchers {
            lists: Lists::default(),
            stale: AtomicI64::new(0),
            purge_interval: i64::try_from(purge_interval).unwrap_or(i64::MAX),
            completed: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// Tries `op`; if not ready, lists it under `keys` and tries it again. With no key
    /// it expires on the spot (nothing could ever complete it but a handle).
    pub fn watch(&self, mut op: O, keys: &[u64]) -> Watched<O, W> {
        if op.try_complete() {
            self.finish(&mut op, 0, Completion::Ready);
            return Watched::Completed;
        }
        if keys.is_empty() {
            self.finish(&mut op, 0, Completion::Expired);
            return Watched::Completed;
        }
        let slot = Arc::new(Slot {
            op: Mutex::new(Some(op)),
            done: AtomicBool::new(false),
            keys: u32::try_from(keys.len()).unwrap_or(u32::MAX),
            waker: W::default(),
        });
        let mut dropped = 0;
        for &key in keys {
            dropped += self
                .lists
                .entry(key)
                .or_insert_with(List::new)
                .push(Arc::clone(&slot));
        }
        self.unstale(dropped);
        match slot.take_if_ready() {
            Some(op) => {
                self.finish_taken(&slot, op, Completion::Ready);
                Watched::Completed
            }
            None => Watched::Pending(slot),
        }
    }

    /// Completes the request `how` unless it already completed; true if this call did.
    pub fn complete(&self, slot: &Slot<O, W>, how: Completion) -> bool {
        let Some(op) = slot.op.lock().take() else {
            return false;
        };
        self.finish_taken(slot, op, how);
        true
    }

    /// Tries every request listed under `key`, completing the ready ones, and drops
    /// completed entries from the list (and the key, once its list is empty). Returns how
    /// many this call completed.
    pub fn check_and_complete(&self, key: u64) -> usize {
        let mut ready = Vec::new();
        let mut dropped = 0;
        let mut emptied = false;
        if let Some(mut list) = self.lists.get_mut(&key) {
            list.slots.retain(|slot| {
                if slot.is_done() {
                    dropped += 1;
                    return false;
                }
                match slot.take_if_ready() {
                    Some(op) => {
                        slot.done.store(true, Ordering::Release);
                        ready.push((Arc::clone(slot), op));
                        dropped += 1;
                        false
                    }
                    // Not ready, or completed an instant ago (dropped later).
                    None => true,
                }
            });
            list.cleaned();
            emptied = list.slots.is_empty();
        }
        if emptied {
            self.lists.remove_if(&key, |_, list| list.slots.is_empty());
        }
        // Entries of requests completed here count as stale in `finish` below, and were
        // just dropped from this list: the two cancel out for this key.
        self.unstale(dropped);
        let completed = ready.len();
        for (slot, mut op) in ready {
            slot.waker.wake();
            self.finish(&mut op, slot.keys, Completion::Ready);
        }
        completed
    }

    /// For the timer's side (a driver task, a timer task), every so often: once
    /// `purge_interval` completed entries are listed, drops them from every list, and
    /// the lists left empty (Kafka's purge, off every request's path). Returns whether
    /// it swept.
    pub fn sweep_if_due(&self) -> bool {
        if self.stale.load(Ordering::Relaxed) < self.purge_interval {
            return false;
        }
        self.stale.store(0, Ordering::Relaxed);
        self.lists.retain(|_, list| {
            list.drop_done();
            !list.slots.is_empty()
        });
        true
    }

    /// Expires every listed request still pending, then drops every list (shutdown).
    pub fn expire_all(&self) {
        let mut pending = Vec::new();
        self.lists.retain(|_, list| {
            pending.extend(list.slots.drain(..).filter(|slot| !slot.is_done()));
            false
        });
        for slot in pending {
            self.complete(&slot, Completion::Expired);
        }
        self.stale.store(0, Ordering::Relaxed);
    }

    /// Counters.
    pub fn stats(&self) -> WatcherStats {
        WatcherStats {
            completed: self.completed.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
        }
    }

    /// Completes `op`, just taken out of `slot`.
    fn finish_taken(&self, slot: &Slot<O, W>, mut op: O, how: Completion) {
        slot.done.store(true, Ordering::Release);
        if how != Completion::Expired {
            slot.waker.wake();
        }
        self.finish(&mut op, slot.keys, how);
    }

    /// Counts and answers a completed request that was listed under `keys` keys.
    fn finish(&self, op: &mut O, keys: u32, how: Completion) {
        if how == Completion::Expired {
            self.expired.fetch_add(1, Ordering::Relaxed);
            op.on_complete(how);
            op.on_expiration();
        } else {
            self.completed.fetch_add(1, Ordering::Relaxed);
            op.on_complete(how);
        }
        if keys > 0 {
            self.stale.fetch_add(i64::from(keys), Ordering::Relaxed);
        }
    }

    /// Counts `dropped` completed entries out of the stale estimate.
    fn unstale(&self, dropped: usize) {
        if dropped > 0 {
            self.stale.fetch_sub(dropped as i64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::test_ops::Logged;

    #[derive(Default)]
    struct CountWakes(AtomicU64);

    impl Wake for CountWakes {
        fn wake(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn each_request_completes_once_and_wakes_its_timer_unless_expired() {
        let w = Watchers::<_, CountWakes>::new(2);
        let ops = Logged::default();
        let watch = |keys: &[u64]| match w.watch(ops.op(60_000), keys) {
            Watched::Pending(slot) => slot,
            Watched::Completed => panic!("not ready yet"),
        };
        let (a, b, c) = (watch(&[1, 2]), watch(&[2]), watch(&[3]));
        ops.release(0);
        assert_eq!(w.check_and_complete(2), 1);
        assert_eq!(w.check_and_complete(1), 0, "already completed via key 2");
        assert!(w.complete(&b, Completion::Forced));
        assert!(!w.complete(&b, Completion::Forced));
        assert!(w.complete(&c, Completion::Expired));
        assert!(!w.complete(&a, Completion::Expired));
        assert_eq!(
            ops.log(),
            [Completion::Ready, Completion::Forced, Completion::Expired]
        );
        let wakes = [a, b, c].map(|s| s.waker().0.load(Ordering::Relaxed));
        assert_eq!(wakes, [1, 1, 0]);
        assert_eq!(
            w.stats(),
            WatcherStats {
                completed: 2,
                expired: 1
            }
        );
        // Three completions crossed the purge interval: a sweep leaves no completed
        // entry listed, and no empty list.
        assert!(w.sweep_if_due());
        assert!(w
            .lists
            .iter()
            .all(|l| !l.slots.is_empty() && l.slots.iter().all(|s| !s.is_done())));
    }

    #[test]
    fn expire_all_reaches_every_pending_request_once() {
        let w = Watchers::<_, ()>::new(1000);
        let ops = Logged::default();
        for keys in [&[1, 2][..], &[2], &[3]] {
            assert!(matches!(w.watch(ops.op(60_000), keys), Watched::Pending(_)));
        }
        assert!(matches!(w.watch(ops.op(60_000), &[]), Watched::Completed));
        w.expire_all();
        assert_eq!(ops.log(), [Completion::Expired; 4]);
        assert!(w.lists.is_empty());
    }

    #[test]
    fn ready_before_listing_completes_without_a_slot() {
        let w = Watchers::<_, ()>::new(1000);
        let ops = Logged::default();
        let op = ops.op(60_000);
        ops.release(0);
        assert!(matches!(w.watch(op, &[7]), Watched::Completed));
        assert!(w.lists.is_empty());
        assert_eq!(ops.log(), [Completion::Ready]);
    }

    #[test]
    fn a_list_that_doubles_is_cleaned_by_the_push_and_a_check_removes_an_emptied_key() {
        let w = Watchers::<_, ()>::new(1_000_000);
        let ops = Logged::default();
        let slots: Vec<_> = (0..CLEAN_FROM)
            .map(|_| match w.watch(ops.op(60_000), &[5]) {
                Watched::Pending(slot) => slot,
                Watched::Completed => panic!("not ready yet"),
            })
            .collect();
        for slot in &slots {
            assert!(w.complete(slot, Completion::Forced));
        }
        assert_eq!(
            w.lists.get(&5).unwrap().slots.len(),
            CLEAN_FROM,
            "not cleaned yet"
        );
        // The push that finds the list at its cleaning length drops the completed ones.
        let last = match w.watch(ops.op(60_000), &[5]) {
            Watched::Pending(slot) => slot,
            Watched::Completed => panic!("not ready yet"),
        };
        assert_eq!(w.lists.get(&5).unwrap().slots.len(), 1);
        assert_eq!(
            w.stale.load(Ordering::Relaxed),
            0,
            "the stale count follows"
        );
        assert!(w.complete(&last, Completion::Forced));
        assert_eq!(w.check_and_complete(5), 0);
        assert!(w.lists.get(&5).is_none(), "the emptied key is gone");
    }
}
