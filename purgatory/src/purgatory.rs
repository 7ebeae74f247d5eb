//! The purgatory's API: [`Purgatory`], a cheap `Clone` handle to one purgatory. The
//! protocols behind each call have their own files (see `state.rs`).
//!
//! # Threads
//! - Callers' threads run `try_complete` (in `watch`, `try_complete_else_watch`,
//!   `watch_batch` and `check_and_complete`) and the `on_complete` of what they complete.
//! - The reaper thread (one per purgatory, unless its timer is built with
//!   `reaper(false)`) drives the timer, completes expired operations (`on_complete` then
//!   `on_expiration`, inline or on the configured pool) and purges completed entries.
//! - With the feature `tokio`, whichever of them answers an operation enters the
//!   purgatory's runtime for its callbacks (`runtime.rs`), and the last handle dropped in a runtime's context shuts down on its
//!   blocking pool ([`release`]); with `follow_tokio_time` a task replaces the reaper
//!   (`tokio_time.rs`).
//!
//! # Invariants
//! - An accepted operation is in its slot of the op table until exactly one of: a
//!   successful `try_complete`, a forced completion, its expiry, a cancel, or shutdown
//!   takes it (see `op_table.rs`). Exactly one `on_complete` follows, except for a cancel
//!   (handed back).
//! - The purgatory shuts down when `shutdown` is called or the last handle is dropped;
//!   either way every operation still pending is expired first.

use std::borrow::Borrow;
use std::hash::Hash;
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use timer_core::Driver;

use crate::counters::Count;
use crate::error::WatchError;
use crate::group::Group;
use crate::handle::{OperationHandle, WatchOutcome};
use crate::op_table::{OpRef, Taken};
use crate::operation::{Completion, DelayedOperation};
use crate::span::CarriedSpan;
use crate::state::State;
use crate::stats::PurgatoryStats;
use crate::user_code::report;
use crate::watch::{collect_keys, refusal, Keys, Staged, Tried, CHUNK};

/// Batches of fewer operations than this are watched one by one: the chunk's passes and
/// buffers cost more than the locks it shares among that few (callgrind, 3 keys an
/// operation: 1,212-1,224 instructions an operation one by one at every batch size, in
/// chunks 1,907 for 10, 1,518 for 32, 1,437 for 64), while for big batches at high rates
/// the shared locks win (W3 at 3.5-4M/s: 2.6-3.5M held in chunks, 1.8-2.4M one by one).
#[cfg(not(loom))]
const SMALL_BATCH: usize = 32;
/// Under loom, a batch of two is a chunk, so that the models reach a chunk's steps.
#[cfg(loom)]
const SMALL_BATCH: usize = 2;

/// How many list entries ahead of the one it locks a check prefetches a slot (see
/// `check_and_complete`). A slot line another core wrote last takes about as long to
/// arrive as a few entries' work, so a handful in flight hides most of it.
const PREFETCH_AHEAD: usize = 8;

/// Holds operations that cannot complete yet, per key, until an event completes them or
/// their timeout expires them.
///
/// A cheap handle: `clone` it to share the purgatory between threads and tasks (no
/// `Arc` needed); every method takes `&self`. The purgatory shuts down when
/// [`shutdown`](Self::shutdown) is called or its last handle is dropped, expiring what is
/// still pending.
///
/// # The locking rule
/// `try_complete` runs under the operation's own lock. So:
/// - do not call `check_and_complete` (or `watch`, `force_complete`, `cancel`,
///   `cancel_for_key`, `reset_timeout`) while holding a lock that your `try_complete` also takes: the two
///   would wait for each other (Kafka's rule);
/// - from inside `try_complete`, never call a method that waits for another operation's
///   lock: `check_and_complete`, `force_complete` and `force_complete_batch`, `cancel`,
///   `cancel_for_key`, `reset_timeout`, `watch_batch`, or drop a waiting `Parked` or an armed
///   `CancelOnDrop`. Two `try_complete`s that check each other's key would wait for each
///   other forever; one that checks its own key waits for itself. `watch`,
///   `try_complete_else_watch`, `is_completed`, `stats`, `advance_clock` and `purge`
///   never wait for another operation's lock and are safe there. `shutdown` is not: it
///   waits for callbacks in progress, and one of them may be waiting for this
///   operation's lock.
///
/// Callbacks (`on_complete`, `on_expiration`) run with no lock held and may call any
/// method, `shutdown` included (see its doc for the one cycle to avoid).
pub struct Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// The driver of this purgatory's group (`group.rs`): of this purgatory alone, or of
    /// the `TimerGroup` it was built on. Taken only by `drop`, which hands it to
    /// [`release`] with `state`.
    driver: ManuallyDrop<Arc<Driver<Group>>>,
    /// This purgatory's own state (its group holds it too). Taken only by `drop`.
    state: ManuallyDrop<Arc<State<K, O>>>,
    /// Counted among the owners (`Group::owners`): every handle but one a `WeakPurgatory`
    /// upgraded to (and its clones).
    owner: bool,
}

impl<K, O> Clone for Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    fn clone(&self) -> Self {
        if self.owner {
            // As `Arc::clone`: a new owner comes from an existing one, which keeps the
            // count above zero meanwhile.
            self.driver.target().owners.fetch_add(1, Ordering::Relaxed);
        }
        Purgatory {
            driver: ManuallyDrop::new(Arc::clone(&self.driver)),
            state: ManuallyDrop::new(Arc::clone(&self.state)),
            owner: self.owner,
        }
    }
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

    /// A builder for a configured purgatory, the same as
    /// [`PurgatoryBuilder::new()`](crate::PurgatoryBuilder::new): `K` and `O` come from
    /// `Purgatory::<K, O>::builder()` or from the annotation of what `build` returns,
    /// `let p: Purgatory<u32, Op> = Purgatory::builder().build()?;`.
    pub fn builder() -> crate::PurgatoryBuilder<K, O> {
        crate::PurgatoryBuilder::new()
    }

    /// An owning handle of a new purgatory (counted in `Group::owners` by the caller), member
    /// of the group `driver` drives.
    pub(crate) fn from_parts(driver: Arc<Driver<Group>>, state: Arc<State<K, O>>) -> Self {
        Purgatory {
            driver: ManuallyDrop::new(driver),
            state: ManuallyDrop::new(state),
            owner: true,
        }
    }

    /// The group's driver, shared: for weak handles (`weak.rs`: parked futures, the
    /// tokio-time driving task), which do not keep the purgatory alive.
    pub(crate) fn driver(&self) -> &Arc<Driver<Group>> {
        &self.driver
    }

    /// The state, shared: for weak handles.
    pub(crate) fn shared_state(&self) -> &Arc<State<K, O>> {
        &self.state
    }

    /// A handle upgraded from a weak reference: not an owner (its drop lets go of its
    /// references, and shuts nothing down unless it is the very last one).
    pub(crate) fn from_shared(driver: Arc<Driver<Group>>, state: Arc<State<K, O>>) -> Self {
        Purgatory {
            driver: ManuallyDrop::new(driver),
            state: ManuallyDrop::new(state),
            owner: false,
        }
    }

    #[inline(always)]
    pub(crate) fn state(&self) -> &State<K, O> {
        &self.state
    }

    /// The name given at build time.
    pub fn name(&self) -> &str {
        &self.state().name
    }

    /// The tokio runtime whose context this purgatory's callbacks run in: the one given
    /// to [`PurgatoryBuilder::runtime`](crate::PurgatoryBuilder::runtime), else the one
    /// `build` ran in. `None` if neither: its callbacks then run in no runtime's context
    /// (`tokio::spawn` there panics, caught and counted), and `build` logged a warning.
    /// Assert it where a service builds its purgatories. Feature `tokio`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use purgatory::{Completion, DelayedOperation, Purgatory};
    /// # struct Op;
    /// # impl DelayedOperation for Op {
    /// #     fn timeout(&self) -> Duration { Duration::from_secs(1) }
    /// #     fn try_complete(&mut self) -> bool { false }
    /// #     fn on_complete(&mut self, _: Completion) {}
    /// # }
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let inside: Purgatory<u32, Op> = runtime.block_on(async { Purgatory::new("fetch") });
    /// assert!(inside.runtime().is_some());
    /// let outside: Purgatory<u32, Op> = Purgatory::new("orphan"); // warns
    /// assert!(outside.runtime().is_none());
    /// ```
    #[cfg(feature = "tokio")]
    pub fn runtime(&self) -> Option<&tokio::runtime::Handle> {
        self.state().runtime.handle()
    }

    /// Tries to complete `op`; if it cannot yet, watches it on every key of `keys` and
    /// arms its timeout. Returns `Ok(true)` if this call completed it (`on_complete` has
    /// run), `Ok(false)` if it now waits.
    ///
    /// An event that makes the operation ready while it is being watched is never lost.
    /// Refused, with the operation given back: an empty `keys`
    /// ([`WatchError::NoKeys`]), after shutdown ([`WatchError::Shutdown`]), a key whose
    /// `Hash` or `Eq` panicked ([`WatchError::KeyPanicked`]), a `timeout()` that panicked
    /// ([`WatchError::TimeoutPanicked`]). A key listed twice is watched twice (harmless).
    ///
    /// The `tracing` span current here goes with the operation: its `on_complete`,
    /// `on_expiration` and drop run inside it, on whatever thread answers it (see
    /// [`DelayedOperation`]).
    pub fn try_complete_else_watch<I>(&self, op: O, keys: I) -> Result<bool, WatchError<O>>
    where
        I: IntoIterator<Item = K>,
    {
        self.watch_then(op, keys, false, |outcome| {
            matches!(outcome, WatchOutcome::Completed)
        })
    }

    /// Like [`try_complete_else_watch`](Self::try_complete_else_watch), but returns a
    /// handle to a waiting operation, for [`force_complete`](Self::force_complete),
    /// [`cancel`](Self::cancel) or [`cancel_on_drop`](Self::cancel_on_drop). The
    /// `tracing` span current here goes with the operation, as there.
    pub fn watch<I>(&self, op: O, keys: I) -> Result<WatchOutcome<O>, WatchError<O>>
    where
        I: IntoIterator<Item = K>,
    {
        self.watch_then(op, keys, false, |outcome| outcome)
    }

    /// Watches an operation on no key: a timer-only operation (a member's session, a
    /// retry's backoff) that no event checks, and that costs no watcher entry. Like
    /// [`watch`](Self::watch) otherwise: `try_complete` is tried once, here, and then
    /// only its timeout ([`Completion::Expired`](crate::Completion)), a
    /// [`force_complete`](Self::force_complete) (`Forced`) or shutdown (`Shutdown`)
    /// answers it, or a [`cancel`](Self::cancel) or a
    /// [`cancel_on_drop`](Self::cancel_on_drop) guard takes it back, exactly once as
    /// any operation. [`check_and_complete`](Self::check_and_complete),
    /// [`cancel_for_key`](Self::cancel_for_key) and purges never see it. Refused as
    /// `watch` refuses, but for [`WatchError::NoKeys`], which it never returns.
    ///
    /// ```
    /// use std::time::Duration;
    /// use purgatory::{Completion, DelayedOperation, Purgatory, WatchOutcome};
    ///
    /// /// A member's session: answered by its timeout, or forced when the member leaves.
    /// struct Session { member: u32, ended: std::sync::mpsc::Sender<(u32, Completion)> }
    /// impl DelayedOperation for Session {
    ///     fn timeout(&self) -> Duration { Duration::from_millis(10) }
    ///     fn try_complete(&mut self) -> bool { false }
    ///     fn on_complete(&mut self, how: Completion) {
    ///         let _ = self.ended.send((self.member, how));
    ///     }
    /// }
    ///
    /// let sessions: Purgatory<u32, Session> = Purgatory::new("sessions");
    /// let (ended, endings) = std::sync::mpsc::channel();
    /// let Ok(WatchOutcome::Pending(leaves)) =
    ///     sessions.watch_keyless(Session { member: 1, ended: ended.clone() })
    /// else {
    ///     unreachable!("never ready, the purgatory open")
    /// };
    /// sessions.watch_keyless(Session { member: 2, ended }).ok();
    /// assert!(sessions.force_complete(&leaves)); // member 1 leaves
    /// assert_eq!(endings.recv().unwrap(), (1, Completion::Forced));
    /// assert_eq!(endings.recv().unwrap(), (2, Completion::Expired)); // member 2 times out
    /// assert_eq!(sessions.stats().watched, 0); // no watcher entry, ever
    /// ```
    pub fn watch_keyless(&self, op: O) -> Result<WatchOutcome<O>, WatchError<O>> {
        self.watch_then(op, std::iter::empty(), true, |outcome| outcome)
    }

    /// [`watch`](Self::watch), its outcome given as `outcome` makes it.
    ///
    /// The result is made once, last, where it is returned: made before the count and
    /// the publish, it was a second copy in this frame; mapped after
    /// (`try_complete_else_watch` as `watch(..).map(..)`), a second one in the caller's.
    /// Each was 88 bytes for an 80-byte operation, on every level of a re-entrant chain
    /// (`tests/reentrant_depth.rs`). Inlined (a hint): a frame less a level (656 -> 480
    /// bytes there, release), and a call less a watch (callgrind, `expiring_watches`: a
    /// watch and its expiry 1,967 -> 1,919 instructions).
    #[inline]
    fn watch_then<I, R>(
        &self,
        op: O,
        keys: I,
        keyless: bool,
        outcome: impl FnOnce(WatchOutcome<O>) -> R,
    ) -> Result<R, WatchError<O>>
    where
        I: IntoIterator<Item = K>,
    {
        // Collect the keys before taking any lock: the caller's iterator is user code.
        let mut keys: Keys<K> = collect_keys(keys);
        let state = self.state();
        // The operation's place while it is not in its slot, and its keys' until they
        // are listed (see `watch_one`).
        let mut placed = Some(op);
        let watched = state.watch_one(&mut placed, &mut keys, keyless, &self.driver);
        drop(keys); // emptied by the watch
        let settled = state.settle(watched, &mut placed, &self.driver);
        if settled.is_err() {
            state.counters.add(Count::Refused, 1);
        } else if state.in_group {
            state.counters.add(Count::Accepted, 1);
        }
        state.after_call();
        match settled {
            Ok(watched) => Ok(outcome(watched)),
            Err(kind) => Err(refusal(&mut placed, kind)),
        }
    }

    /// Watches every `(operation, keys)` of `batch`, with the same outcome for each as
    /// [`watch`](Self::watch), and returns one result per operation, in input order. Each
    /// operation carries the `tracing` span current at this call.
    /// Cheaper per operation than one `watch` each when there are many (from 32 on, the
    /// watcher shards and the timer shard are locked once per 64 operations, and the
    /// clock read once; see `docs/purgatory.md`); fewer are watched one by one.
    ///
    /// From 32 on, the batch lists and arms all of a chunk's operations before it tries
    /// any of them, then tries each once, under its own lock only: one operation's slow
    /// `try_complete` delays no other's timeout. An operation ready at once is listed and
    /// armed before it is found ready (its entries then go stale and its timer entry is
    /// cancelled), which a single `watch`'s first try avoids; and if its timeout passes
    /// before its turn comes (behind an earlier operation's slow `try_complete`), it is
    /// answered `Expired` without being tried.
    // Out of line: a call per batch costs nothing an operation, and keeps the batch one
    // function in a profile (inlined into its caller, its cost could no longer be read
    // off `callgrind`'s `watch_batch` line as `docs/benchmarks.md` does).
    #[inline(never)]
    pub fn watch_batch<I, Ks>(&self, batch: I) -> Vec<Result<WatchOutcome<O>, WatchError<O>>>
    where
        I: IntoIterator<Item = (O, Ks)>,
        Ks: IntoIterator<Item = K>,
    {
        // Run the caller's iterators before any lock is taken: they are user code.
        let mut staged: Vec<Staged<K, O>> = batch
            .into_iter()
            .map(|(op, keys)| (Some(op), collect_keys(keys)))
            .collect();
        let mut results = Vec::with_capacity(staged.len());
        let state = self.state();
        // Counted as they are refused, not by a pass over the results.
        let mut refused = 0;
        if staged.len() < SMALL_BATCH {
            for (op, keys) in staged.iter_mut() {
                let mut placed = op.take();
                let watched = state.watch_one(&mut placed, keys, false, &self.driver);
                let settled = state.settle(watched, &mut placed, &self.driver);
                refused += usize::from(settled.is_err());
                results.push(settled.map_err(|kind| refusal(&mut placed, kind)));
            }
        } else {
            for chunk in staged.chunks_mut(CHUNK) {
                refused += state.watch_chunk(chunk, &mut results, &self.driver);
            }
        }
        drop(staged); // emptied by the watches
        debug_assert_eq!(refused, results.iter().filter(|r| r.is_err()).count());
        if refused > 0 {
            state.counters.add(Count::Refused, refused as u64);
        }
        if state.in_group && refused < results.len() {
            state
                .counters
                .add(Count::Accepted, (results.len() - refused) as u64);
        }
        state.after_call();
        results
    }

    /// Tries every operation watched on `key`, in arrival order, completing those that
    /// are ready, and drops the completed entries from the list (removing the key when
    /// it empties) once they are a quarter of it or more: below that they are skipped
    /// (by a one-byte read each, with no lock; the rare entry whose tag cannot tell, by a
    /// look at its slot) and left for a later check or a purge, so a long list is not
    /// rewritten for every completion. Returns how many this call completed; an unknown
    /// key returns 0.
    ///
    /// `key` may be any borrowed form of the key type, as for `HashMap::get`: with
    /// `String` keys an event holding a `&str` checks without allocating.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use purgatory::{Completion, DelayedOperation, Purgatory};
    /// # struct Op;
    /// # impl DelayedOperation for Op {
    /// #     fn timeout(&self) -> Duration { Duration::from_secs(1) }
    /// #     fn try_complete(&mut self) -> bool { true }
    /// #     fn on_complete(&mut self, _: Completion) {}
    /// # }
    /// let topics: Purgatory<String, Op> = Purgatory::new("topics");
    /// let event: &str = "orders-0";
    /// assert_eq!(topics.check_and_complete(event), 0);
    /// assert!(topics.cancel_for_key(event).is_empty());
    /// ```
    ///
    /// A key whose `Hash` or `Eq` panics: the panic reaches the caller, and every
    /// operation stays as it was, or was completed exactly once by this call.
    ///
    /// Other calls on keys of the same watcher shard wait while this one copies the
    /// key's list (8 bytes an entry, about 0.5 ms per million entries measured here) and,
    /// while it drops completed entries, for one segment of at most 1,024 entries at a
    /// time.
    pub fn check_and_complete<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let state = self.state();
        let mut candidates = SmallVec::<[OpRef; 16]>::new();
        state.watchers.snapshot(key, &mut candidates);
        if candidates.is_empty() {
            return 0; // an unknown key: nothing to try, drop or expire
        }
        // Entries this check found naming an operation that is gone (completed, expired
        // or cancelled before it looked, or while it looked).
        let mut dead = 0;
        let mut completed = 0;
        // Not ready, and whose timeout fired while this check held them (each answered
        // at once, before the next candidate's `try_complete`).
        let mut expired = 0;
        let pin = state.table.pin();
        // A slot another thread wrote last (a watch, an expiry) is a cache miss: each is
        // found and prefetched `PREFETCH_AHEAD` entries before it is locked, so that the
        // misses of consecutive entries overlap rather than add up. `ahead` holds the
        // entries found and not reached yet, entry `i` at `i % PREFETCH_AHEAD`.
        let entries = candidates.as_slice();
        let found_at = |i: usize| {
            let found = state.table.find(&pin, entries[i]);
            found.prefetch();
            found
        };
        let mut ahead = [found_at(0); PREFETCH_AHEAD];
        for (i, entry) in ahead.iter_mut().enumerate().take(entries.len()).skip(1) {
            *entry = found_at(i);
        }
        for i in 0..entries.len() {
            let found = ahead[i % PREFETCH_AHEAD];
            if i + PREFETCH_AHEAD < entries.len() {
                ahead[i % PREFETCH_AHEAD] = found_at(i + PREFETCH_AHEAD);
            }
            let op = found.op();
            // The dense tag first: an entry of an operation already completed (through
            // another key, or by force, expiry or cancel) is skipped without locking its
            // slot (which was only prefetched), and the list is cleaned below.
            if !found.may_be_waiting() {
                dead += 1;
                continue;
            }
            let Some(locked) = state.table.lock_found(found) else {
                // Gone since the snapshot, or a stale entry its tag could not tell apart
                // (a retired slot's, or one whose tag matches a later generation). Counted
                // only if the list filter below would drop it: a tag collision it keeps
                // must not make every check rewrite the list for nothing.
                dead += usize::from(!state.table.is_waiting_by_tag(&pin, op));
                continue;
            };
            match state.try_held(locked, &self.driver, false) {
                Tried::Completed => completed += 1,
                Tried::Expired => expired += 1,
                Tried::Waiting => {}
            }
        }
        let gone = dead + completed + expired;
        // Each dead entry costs later checks one tag read; rewriting the list costs one
        // per entry. Dropping them once they are a quarter of the list keeps both O(1)
        // per completion, amortised. (`candidates` is not empty: see the early return.)
        if gone * 4 >= candidates.len() {
            state.watchers.drop_completed(
                key,
                |op| state.table.is_waiting_by_tag(&pin, op),
                &state.user,
            );
        }
        state.after_call();
        completed
    }

    /// Completes the operation now, whatever `try_complete` would say, unless it is
    /// already completed. Returns whether this call completed it.
    pub fn force_complete(&self, handle: &OperationHandle<O>) -> bool {
        self.force_complete_batch([handle]) == 1
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
        let state = self.state();
        let mut chunk: SmallVec<[OpRef; CHUNK]> = SmallVec::new();
        let mut completed = 0;
        for handle in handles {
            if handle.purgatory == state.id {
                chunk.push(handle.op);
                if chunk.len() == CHUNK {
                    completed += self.force_chunk(&mut chunk);
                }
            }
        }
        completed += self.force_chunk(&mut chunk);
        state.after_call();
        completed
    }

    /// Force-completes the operations of `chunk` still waiting; empties it and returns
    /// how many it completed.
    ///
    /// What it takes is answered under the driver's work, taken before the first take,
    /// so a shutdown that begins after a take waits for the answer. It may wait for a
    /// slot meanwhile (another thread's `try_complete`, or a watch arming it): the
    /// shutdown then waits for that too, as it waits for any answer in progress.
    fn force_chunk(&self, chunk: &mut SmallVec<[OpRef; CHUNK]>) -> usize {
        if chunk.is_empty() {
            return 0;
        }
        let state = self.state();
        let pin = state.table.pin();
        if chunk.len() > 1 {
            state.table.prepare(&pin, chunk.iter().copied());
        }
        let _work = self.driver.work();
        let mut taken: SmallVec<[Taken<O>; CHUNK]> = SmallVec::new();
        let mut vacated = SmallVec::<[_; CHUNK]>::new();
        for op in chunk.drain(..) {
            if let Some(locked) = state.table.lock(&pin, op) {
                let (t, slot) = locked.take_deferred();
                taken.push(t);
                vacated.push(slot);
            }
        }
        state.table.vacate(&vacated);
        state.complete(&mut taken, Completion::Forced)
    }

    /// Moves the timeout of the operation `handle` names: it now expires `timeout` from
    /// now (the same rounding as at the watch: at most one tick late, never early),
    /// unless an event, a force, a cancel or shutdown answers it first. What a session's
    /// heartbeat does (Kafka's `DelayedHeartbeat`): O(1), the operation stays in its slot
    /// and its watcher entries, the handle stays valid, and its `timeout()` is not asked
    /// again. A zero `timeout` makes it expire at the next tick.
    ///
    /// Returns `true` if the deadline was moved. `false` if nothing was: the operation was
    /// already answered, taken back, or its timeout had already fired (its expiry is
    /// under way, and answers it as expired), the purgatory's shutdown has begun (from
    /// the moment [`is_shutdown`](Self::is_shutdown) reads true: shutdown answers it), or
    /// the handle is another purgatory's. A reset and the operation's expiry never both
    /// win: after `true` the old deadline fires nothing; after `false` the operation is
    /// (or is being) answered, so a caller that wants it waiting again watches a new one.
    ///
    /// Waits for the operation's lock, like [`force_complete`](Self::force_complete):
    /// never from inside a `try_complete`, its own operation's or another's (see the
    /// locking rule above). If the operation's timeout fires while the call holds its
    /// lock (the old deadline, just before the reset could move it; or a new one that
    /// is already due, a zero `timeout`), the expiry is answered on this thread before
    /// the call returns (`on_complete`, `on_expiration`), as a watch does: do not call
    /// it holding a lock those callbacks take. The call then returns `false` for the old
    /// deadline and `true` for the new one.
    ///
    /// A timer per key, where scheduling a key again replaces what waits for it (what
    /// Kafka's coordinator timer does), is a map from the key to the handle: move the
    /// waiting operation's deadline, and watch a new one only when `false` says the old
    /// one is answered. (To replace the operation itself, not only its deadline,
    /// [`cancel`](Self::cancel) the old one and watch the new one.)
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::time::Duration;
    /// use purgatory::{Completion, DelayedOperation, OperationHandle, Purgatory, WatchOutcome};
    ///
    /// /// A partition's retry backoff: a timer-only operation.
    /// struct Backoff { delay: Duration }
    /// impl DelayedOperation for Backoff {
    ///     fn timeout(&self) -> Duration { self.delay }
    ///     fn try_complete(&mut self) -> bool { false }
    ///     fn on_complete(&mut self, _how: Completion) { /* retry the partition */ }
    /// }
    ///
    /// let backoffs: Purgatory<u32, Backoff> = Purgatory::new("backoffs");
    /// let mut timers: HashMap<u32, OperationHandle<Backoff>> = HashMap::new();
    /// let mut schedule = |partition: u32, delay: Duration| {
    ///     if let Some(handle) = timers.get(&partition) {
    ///         if backoffs.reset_timeout(handle, delay) {
    ///             return; // the waiting one now fires `delay` from now, and only then
    ///         }
    ///     }
    ///     // None waiting (or it already fired): a new one.
    ///     if let Ok(WatchOutcome::Pending(handle)) = backoffs.watch_keyless(Backoff { delay }) {
    ///         timers.insert(partition, handle);
    ///     }
    /// };
    /// schedule(7, Duration::from_secs(5));
    /// schedule(7, Duration::from_secs(8)); // replaces partition 7's timer
    /// schedule(9, Duration::from_secs(5));
    /// assert_eq!(backoffs.pending(), 2);
    /// backoffs.shutdown();
    /// ```
    pub fn reset_timeout(&self, handle: &OperationHandle<O>, timeout: Duration) -> bool {
        let state = self.state();
        if handle.purgatory != state.id {
            return false;
        }
        let pin = state.table.pin();
        let Some(mut locked) = state.table.lock(&pin, handle.op) else {
            return false;
        };
        let moved = locked
            .timer()
            .is_some_and(|timer| state.timer.reset(timer, timeout));
        if let Err(handed_over) = locked.unlock() {
            // Its timeout fired (the new one, or the old one before the reset could move
            // it) or shutdown drained it while this call held the slot.
            state.answer_handed_over(handed_over, &self.driver);
        }
        state.after_call();
        moved
    }

    /// Takes the operation `handle` names back, uncompleted: its timeout is disarmed at
    /// once, its watcher entries are left stale (dropped by a later check of their key
    /// or a purge), and no callback runs: the caller now owns answering it (or dropping
    /// it, for a request whose client left), in its own `tracing` span (the one the
    /// operation carried is closed). `None` if it already completed, expired or was
    /// cancelled, or if the handle is another purgatory's.
    ///
    /// The one-operation counterpart of [`cancel_for_key`](Self::cancel_for_key); where
    /// [`force_complete`](Self::force_complete) answers the operation, this does not.
    /// [`cancel_on_drop`](Self::cancel_on_drop) calls it when a guard is dropped.
    #[must_use = "dropping the operation taken back leaves its request unanswered"]
    pub fn cancel(&self, handle: &OperationHandle<O>) -> Option<O> {
        let (op, span) = self.take_back(handle)?;
        span.close(&self.state().user);
        Some(op)
    }

    /// [`cancel`](Self::cancel), giving the operation's span back with it: the drop of
    /// a guard or a `Parked` drops the operation in it (`span.rs`).
    pub(crate) fn take_back(&self, handle: &OperationHandle<O>) -> Option<(O, CarriedSpan)> {
        let state = self.state();
        if handle.purgatory != state.id {
            return None;
        }
        let taken = state.table.take(&state.table.pin(), handle.op)?;
        report!(state.user, DEBUG, purgatory = %state.name, "cancel");
        let taken_back = self.hand_back(taken);
        state.after_call();
        Some(taken_back)
    }

    /// Whether the operation `handle` names has been completed, expired or cancelled.
    /// A handle of another purgatory names nothing here and reads as completed.
    pub fn is_completed(&self, handle: &OperationHandle<O>) -> bool {
        let table = &self.state().table;
        handle.purgatory != self.state().id || !table.is_waiting(&table.pin(), handle.op)
    }

    /// Removes every operation watched on `key`, disarms their timeouts and hands them
    /// back uncompleted: the caller now owns answering them. Operations already completed
    /// are skipped. Unknown key: empty result. `key` may be any borrowed form of the key
    /// type, as for [`check_and_complete`](Self::check_and_complete).
    ///
    /// A key whose `Hash` or `Eq` panics: the panic reaches the caller and nothing was
    /// taken.
    #[must_use = "dropping the operations taken back leaves their requests unanswered"]
    pub fn cancel_for_key<Q>(&self, key: &Q) -> Vec<O>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let state = self.state();
        let pin = state.table.pin();
        let ops: Vec<O> = state
            .watchers
            .take(key, &state.user)
            .into_iter()
            .filter_map(|op| state.table.take(&pin, op))
            .map(|taken| {
                let (op, span) = self.hand_back(taken);
                span.close(&state.user);
                op
            })
            .collect();
        if !ops.is_empty() {
            report!(state.user, DEBUG, purgatory = %state.name, cancelled = ops.len(), "cancel for key");
        }
        state.after_call();
        ops
    }

    /// Hands a taken operation back uncompleted, with its span: disarms its timer at
    /// once, marks its entries stale, counts it cancelled.
    fn hand_back(&self, taken: Taken<O>) -> (O, CarriedSpan) {
        let state = self.state();
        if let Some(timer) = taken.timer {
            state.timer.cancel(timer);
        }
        state.watchers.mark_stale(taken.keys);
        state.counters.add(Count::Cancelled, 1);
        #[cfg(feature = "metrics")]
        state.record_waits([taken.since], Count::Cancelled);
        (taken.op, taken.span)
    }

    /// Drives the timer once: completes every expired operation, then waits up to
    /// `max_wait` for the next timeout if none was due, and purges if enough completed
    /// entries are listed. A call that finds only timeouts of operations completed since
    /// due, and none pending after them, returns 0 without waiting. Returns how many
    /// timeouts fired (an operation an event completed while its timeout fired is counted
    /// here, but not in `stats().expired`).
    /// For purgatories whose timer is built with `reaper(false)` (for example on a
    /// manual clock); harmless otherwise.
    pub fn advance_clock(&self, max_wait: Duration) -> usize {
        let fired = self.driver.advance_clock(max_wait);
        self.state().after_call();
        fired
    }

    /// Drops every completed entry from every list now; returns how many were dropped.
    /// Also gives back the memory of operation slots a burst left unused, as the reaper
    /// does between its rounds (see "Watchers, purging, memory" in `docs/purgatory.md`).
    pub fn purge(&self) -> usize {
        let purged = self.state().purge_all();
        self.state().table.give_back();
        self.state().after_call();
        purged
    }

    /// Under loom only, for the models: how many op-table slots exist (in segments made
    /// and not given back).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn op_table_capacity(&self) -> usize {
        self.state().table.capacity()
    }

    /// Counters for metrics.
    pub fn stats(&self) -> PurgatoryStats {
        self.state().stats()
    }

    /// The figures of the timer its timeouts are in: its own, or, for a member of a
    /// [`TimerGroup`](crate::TimerGroup), the group's shared timer's (all members
    /// together, as [`TimerGroup::timer_stats`](crate::TimerGroup::timer_stats)). Among
    /// them the bytes its entry slabs hold, which an allocator that counts does not see
    /// ([`TimerStats::entry_bytes`](crate::TimerStats::entry_bytes)).
    pub fn timer_stats(&self) -> crate::TimerStats {
        self.state().timer.stats()
    }

    /// Operations waiting for their timeout.
    pub fn pending(&self) -> usize {
        self.state().pending()
    }

    /// Watcher entries (Kafka's `PurgatorySize`), those of operations already answered
    /// or cancelled and not yet dropped by a check or a purge included; the entries of
    /// waiting operations alone are [`PurgatoryStats::watched_live`].
    pub fn watched(&self) -> usize {
        self.state().watchers.entries()
    }

    /// Whether [`shutdown`](Self::shutdown) has begun.
    pub fn is_shutdown(&self) -> bool {
        self.driver.is_shutdown()
    }

    /// Stops the reaper (promptly) and joins it, waits for expirations already running
    /// (inline or on the pool), then expires every operation still pending, on the
    /// calling thread (`on_complete` with [`Completion::Shutdown`], then
    /// `on_expiration`), so every waiting request gets an answer. Later calls to `watch`
    /// and its kin return [`WatchError::Shutdown`] with the operation. Also run when the
    /// last handle is dropped.
    ///
    /// Returns, to a caller outside this purgatory's callbacks, only when every operation
    /// that was pending has had its callbacks, every expiry in progress has finished,
    /// and every answer another thread was making (an operation a check found ready, a
    /// force took, a watch completed) has been made: a second, concurrent call waits for
    /// the first. A call from inside a callback this purgatory runs (an expiry's, an
    /// answer's as above, or one that shutdown itself runs) cannot wait for itself: as
    /// the first call it expires what is pending and returns; otherwise it returns at
    /// once. The whole table is in `docs/purgatory.md` ("Shutdown").
    ///
    /// One exception: an operation whose slot another thread holds when shutdown comes
    /// (running its `try_complete`, arming it in a watch, or moving its deadline in
    /// `reset_timeout`) is answered by that thread as it lets go (`Shutdown`, `Expired`
    /// if its timeout came first, or `Ready` if it said ready), possibly after
    /// `shutdown` returned. User code that shutdown runs (a key's
    /// `Drop` as the lists are emptied) is caught like any other; nothing reaches the
    /// caller.
    ///
    /// Since an outside call waits for callbacks in progress, do not call it where one of
    /// them waits for you: from a `try_complete` (a callback on another thread may be
    /// waiting for its slot), or from a callback of another purgatory that this one's
    /// callbacks shut down in turn (each waits for the other's).
    pub fn shutdown(&self) {
        crate::group::shut_down(&self.driver);
    }

    /// [`shutdown`](Self::shutdown) without blocking the task's thread: the shutdown runs
    /// on the runtime's blocking pool, and this resolves when it has returned (every
    /// operation that was pending has had its callbacks). Once polled, dropping the
    /// future does not stop the shutdown (a future never polled does nothing). Polled
    /// outside a tokio runtime (and the purgatory built without one), or while the
    /// runtime shuts down, it runs `shutdown` inline. Feature `tokio`.
    #[cfg(feature = "tokio")]
    pub async fn shutdown_async(&self) {
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.state().runtime.handle().cloned());
        let Some(runtime) = runtime else {
            return self.shutdown();
        };
        let purgatory = self.clone();
        match runtime.spawn_blocking(move || purgatory.shutdown()).await {
            Ok(()) => {}
            Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            // The runtime is shutting down and dropped the work unrun.
            Err(_) => self.shutdown(),
        }
    }
}

impl<K, O> Drop for Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// The last owning handle's drop (every handle but those a `WeakPurgatory` upgraded
    /// to) shuts the purgatory down, expiring what is pending. With the feature `tokio`,
    /// in a runtime's context, that runs on the runtime's blocking pool and the drop
    /// returns at once.
    fn drop(&mut self) {
        // See `release`.
        // SAFETY: `driver` and `state` are taken here, once, and `self` is never used
        // again: this is its drop.
        let (driver, state) = unsafe {
            (
                ManuallyDrop::take(&mut self.driver),
                ManuallyDrop::take(&mut self.state),
            )
        };
        // As `Arc`'s drop: the last owner sees every other owner's work before it. The
        // owners are the group's (`group.rs`): a member of a `TimerGroup` is not shut
        // down by its own last handle, the group by its last owner, whichever it is.
        if self.owner && driver.target().owners.fetch_sub(1, Ordering::AcqRel) == 1 {
            shut_down_unowned(driver, state);
        } else {
            release(driver, state);
        }
    }
}

/// The last owner of a group is gone (a purgatory's owning handle, or a `TimerGroup`'s):
/// shuts the group down though handles that a `WeakPurgatory` upgraded to may still be in
/// use (their calls are refused from now on), then lets go of this reference to its
/// driver, and of `also` after it (a member's state), as [`release`] does. With the
/// feature `tokio`, on a thread in a runtime's context, the shutdown runs on that
/// runtime's blocking pool, as `release` does the last drop. (If that pool takes no more
/// work, the runtime shutting down, the last reference's drop shuts the group down
/// instead, whenever it comes.)
pub(crate) fn shut_down_unowned<A: Send + 'static>(driver: Arc<Driver<Group>>, also: A) {
    let shut_down = move || {
        crate::group::shut_down(&driver);
        release(driver, also);
    };
    #[cfg(feature = "tokio")]
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        drop(runtime.spawn_blocking(shut_down));
        return;
    }
    shut_down();
}

/// Lets go of one reference to a group's driver, and of `also` (a member's state, which
/// the group holds too: its last reference goes with the driver's when that is the last,
/// on the same thread). The last reference shuts the group down (the driver's drop: every
/// pending operation is expired and answered).
///
/// With the feature `tokio`, a last drop on a thread in a tokio runtime's context (a
/// worker, most often) does not block it: the driver is dropped on that runtime's
/// blocking pool, whose threads exist to wait. It is dropped right here when the runtime
/// is shutting down and its pool takes no more work (the closure is dropped unrun, and
/// the driver with it), so the guarantee does not depend on the runtime.
pub(crate) fn release<A: Send + 'static>(driver: Arc<Driver<Group>>, also: A) {
    #[cfg(feature = "tokio")]
    if let Some(last) = Arc::into_inner(driver) {
        let drop_both = move || {
            drop(last);
            drop(also);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(drop_both)),
            Err(_) => drop_both(),
        }
    } else {
        drop(also);
    }
    #[cfg(not(feature = "tokio"))]
    {
        drop(driver);
        drop(also);
    }
}

impl<K, O> std::fmt::Debug for Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Purgatory")
            .field("name", &self.state().name)
            .field("closed", &self.is_shutdown())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{ManualClock, PurgatoryBuilder, TimerBuilder};

    struct Named;

    impl DelayedOperation for Named {
        fn timeout(&self) -> Duration {
            Duration::from_secs(60)
        }
        fn try_complete(&mut self) -> bool {
            false
        }
        fn on_complete(&mut self, _how: Completion) {}
    }

    fn pending(outcome: Result<WatchOutcome<Named>, WatchError<Named>>) -> OperationHandle<Named> {
        match outcome {
            Ok(WatchOutcome::Pending(handle)) => handle,
            other => panic!("expected a waiting operation, got {:?}", other.map(|_| ())),
        }
    }

    /// A slot released by unwinding (a `Locked` dropped unconsumed) while its expiry was
    /// left to it: the next round expires the operation, counted as any expiry.
    #[test]
    fn an_expiry_only_an_unwinding_holder_saw_is_completed_by_the_next_round() {
        let clock = ManualClock::new();
        let purgatory: Purgatory<&str, Named> = PurgatoryBuilder::new()
            .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
            .build()
            .unwrap();
        let x = pending(purgatory.watch(Named, ["x"]));
        let pin = purgatory.state().table.pin();
        let held = purgatory.state().table.lock(&pin, x.op).expect("x waits");
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            purgatory.advance_clock(Duration::ZERO),
            1,
            "its timer fired"
        );
        assert!(!purgatory.is_completed(&x), "left to the holder");
        drop(held);
        assert!(purgatory.is_completed(&x), "taken by the release");
        assert_eq!(purgatory.stats().expired, 0, "not completed yet");
        purgatory.advance_clock(Duration::ZERO);
        let stats = purgatory.stats();
        assert_eq!((stats.expired, stats.pending), (1, 0), "{stats:?}");
    }

    /// An operation whose `on_complete` shuts its purgatory down.
    struct ShutsDown(Arc<std::sync::OnceLock<Purgatory<&'static str, ShutsDown>>>);

    impl DelayedOperation for ShutsDown {
        fn timeout(&self) -> Duration {
            Duration::from_secs(60)
        }
        fn try_complete(&mut self) -> bool {
            false
        }
        fn on_complete(&mut self, _how: Completion) {
            self.0.get().expect("set").shutdown();
        }
    }

    /// The same, with a callback that shuts the purgatory down: the round that completes
    /// the orphan (in its first hook) is inside the driver's expiry work, so the shutdown
    /// does not wait for its own round.
    #[test]
    fn an_orphans_callback_may_shut_its_purgatory_down() {
        let clock = ManualClock::new();
        let cell = Arc::new(std::sync::OnceLock::new());
        let purgatory: Purgatory<&str, ShutsDown> = PurgatoryBuilder::new()
            .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
            .build()
            .unwrap();
        cell.set(purgatory.clone()).ok().unwrap();
        let x = match purgatory.watch(ShutsDown(Arc::clone(&cell)), ["x"]) {
            Ok(WatchOutcome::Pending(handle)) => handle,
            _ => panic!("x waits"),
        };
        let pin = purgatory.state().table.pin();
        let held = purgatory.state().table.lock(&pin, x.op).expect("x waits");
        clock.advance(Duration::from_secs(60));
        assert_eq!(purgatory.advance_clock(Duration::ZERO), 1);
        drop(held);
        let (done, finished) = std::sync::mpsc::channel();
        let driver = purgatory.clone();
        std::thread::spawn(move || {
            driver.advance_clock(Duration::ZERO);
            let _ = done.send(());
        });
        assert!(
            finished.recv_timeout(Duration::from_secs(10)).is_ok(),
            "the round waited for itself"
        );
        assert!(purgatory.is_shutdown());
        assert_eq!(purgatory.stats().expired, 1);
    }

    /// The issue's scenario without 2^32 real reuses: operation A completes, its slot is
    /// reused until its generation is used up; A's handle and A's stale entry must never
    /// name anything again.
    #[test]
    fn a_stale_name_never_matches_however_often_its_slot_is_reused() {
        let purgatory: Purgatory<&str, Named> = PurgatoryBuilder::new()
            .timer(TimerBuilder::new().clock(ManualClock::new()).reaper(false))
            .build()
            .unwrap();
        let state = purgatory.state();
        let a = pending(purgatory.watch(Named, ["only-a"]));
        assert!(purgatory.force_complete(&a));
        // As if the slot had been reused 2^32 - 2 times since.
        state.table.age_slot(a.op.index(), u32::MAX - 1);
        let last = pending(purgatory.watch(Named, ["other"]));
        assert_eq!(last.op.index(), a.op.index(), "the aged slot is reused");
        assert!(purgatory.force_complete(&last));
        // The slot is retired: later operations get other slots, and neither A's nor the
        // last occupant's name matches them.
        let later: Vec<_> = (0..4)
            .map(|_| pending(purgatory.watch(Named, ["other"])))
            .collect();
        for handle in &later {
            assert_ne!(handle.op.index(), a.op.index());
        }
        for stale in [a, last] {
            assert!(purgatory.is_completed(&stale));
            assert!(purgatory.cancel(&stale).is_none());
            assert!(!purgatory.force_complete(&stale));
        }
        assert!(purgatory.cancel_for_key(&"only-a").is_empty());
        assert_eq!(purgatory.pending(), 4, "the later operations are untouched");
        for handle in &later {
            assert!(!purgatory.is_completed(handle));
        }
    }

    /// A stale entry whose generation is a multiple of 256 (the tag of an unfilled slot),
    /// naming a slot of a segment given back and made anew but not handed out that far
    /// again, on a key nobody checks: the purge drops it, and the key with it. (The tag
    /// alone says "may be waiting" there until the table grows that far again.)
    #[test]
    fn a_stale_entry_with_an_unfilled_slots_tag_is_purged_with_its_key() {
        let purgatory: Purgatory<u32, Named> = PurgatoryBuilder::new()
            .timer(TimerBuilder::new().clock(ManualClock::new()).reaper(false))
            .purge_interval(1)
            .build()
            .unwrap();
        let state = purgatory.state();
        // Two segments (1,024 and 2,048 slots), the second partly handed out.
        let bulk: Vec<_> = (0..1034)
            .map(|_| pending(purgatory.watch(Named, [0])))
            .collect();
        let before = bulk.iter().max_by_key(|h| h.op.index()).expect("watched");
        assert!(before.op.index() >= 1024, "in the second segment");
        assert!(purgatory.force_complete(before));
        state.table.age_slot(before.op.index(), 256);
        let lonely = pending(purgatory.watch(Named, [1]));
        assert_eq!(lonely.op, OpRef::for_test(before.op.index(), 256));
        for handle in bulk.iter().chain([&lonely]) {
            purgatory.force_complete(handle);
        }
        assert_eq!(purgatory.pending(), 0);
        // The second segment goes back before any purge has looked at key 1's list.
        assert_eq!(state.table.give_back(), 2048);
        assert_eq!(state.table.give_back(), 0);
        // Made anew: 1,025 new operations fill the first segment and one slot of it.
        let again: Vec<_> = (0..1025)
            .map(|_| pending(purgatory.watch(Named, [0])))
            .collect();
        assert!(again.iter().all(|h| h.op.index() < before.op.index()));
        purgatory.purge();
        let stats = purgatory.stats();
        assert_eq!(stats.keys, 1, "key 1 kept for its stale entry");
        assert_eq!(stats.watched_live, 1025);
        assert!(purgatory.cancel_for_key(&1).is_empty());
    }

    /// Records each `try_complete` call by its operation's number; ready once told so.
    /// Each `try_complete` runs its hook, if it has one, after recording.
    struct Recorded {
        id: usize,
        tries: Arc<std::sync::Mutex<Vec<usize>>>,
        ready: Arc<std::sync::atomic::AtomicBool>,
        hook: Option<Box<dyn FnMut() + Send>>,
    }

    impl Recorded {
        fn new(id: usize, tries: &Arc<std::sync::Mutex<Vec<usize>>>) -> Self {
            Recorded {
                id,
                tries: Arc::clone(tries),
                ready: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                hook: None,
            }
        }
    }

    impl DelayedOperation for Recorded {
        fn timeout(&self) -> Duration {
            Duration::from_secs(60)
        }
        fn try_complete(&mut self) -> bool {
            self.tries.lock().unwrap().push(self.id);
            if let Some(hook) = &mut self.hook {
                hook();
            }
            self.ready.load(Ordering::Relaxed)
        }
        fn on_complete(&mut self, _how: Completion) {}
    }

    /// A check finds its entries' slots ahead of trying them (`PREFETCH_AHEAD`). Here the
    /// first entry's `try_complete` cancels the next thirty (already found), cancels
    /// every other operation so that the op table's second segment is given back, and
    /// watches enough new operations, on the same key, to make that segment again and
    /// reuse its slots. The check must try none of the cancelled operations and none
    /// of the new ones: an entry found before its slot changed hands names a generation
    /// that is gone.
    #[test]
    fn a_check_tries_no_entry_whose_slot_changed_hands_after_it_was_found() {
        let purgatory: Purgatory<&str, Recorded> = PurgatoryBuilder::new()
            .timer(TimerBuilder::new().clock(ManualClock::new()).reaper(false))
            .build()
            .unwrap();
        let table_capacity = || purgatory.state().table.capacity();
        let tries = Arc::new(std::sync::Mutex::new(Vec::new()));
        // The new operations' tries: their watches' own two each, and none of the check's.
        let new_tries = Arc::new(std::sync::Mutex::new(Vec::new()));
        let cell = Arc::new(std::sync::OnceLock::new());
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let capacities = Arc::new(std::sync::Mutex::new(Vec::new()));
        let segment = table_capacity();
        let hook = {
            let (cell, new_tries, armed) = (cell.clone(), new_tries.clone(), armed.clone());
            let capacities = capacities.clone();
            move || {
                if !armed.swap(false, Ordering::Relaxed) {
                    return;
                }
                let (purgatory, handles): &(Purgatory<&str, Recorded>, Vec<_>) =
                    cell.get().expect("set");
                for handle in handles {
                    assert!(purgatory.cancel(handle).is_some());
                }
                purgatory.purge();
                capacities
                    .lock()
                    .unwrap()
                    .push(purgatory.state().table.capacity());
                for id in 0..segment + 40 {
                    let new = Recorded::new(100_000 + id, &new_tries);
                    assert!(matches!(
                        purgatory.watch(new, ["k"]),
                        Ok(WatchOutcome::Pending(_))
                    ));
                }
                capacities
                    .lock()
                    .unwrap()
                    .push(purgatory.state().table.capacity());
            }
        };
        let hooked = Recorded {
            hook: Some(Box::new(hook)),
            ..Recorded::new(0, &tries)
        };
        assert!(matches!(
            purgatory.watch(hooked, ["k"]),
            Ok(WatchOutcome::Pending(_))
        ));
        // The rest of the first segment, then thirty more entries of "k" in the second.
        let handles: Vec<_> = (1..segment)
            .map(|id| (id, "filler"))
            .chain((segment..segment + 30).map(|id| (id, "k")))
            .map(
                |(id, key)| match purgatory.watch(Recorded::new(id, &tries), [key]) {
                    Ok(WatchOutcome::Pending(handle)) => handle,
                    _ => panic!("{id} waits"),
                },
            )
            .collect();
        assert!(
            table_capacity() > segment,
            "the entries of k reach a second segment"
        );
        cell.set((purgatory.clone(), handles)).ok().unwrap();
        tries.lock().unwrap().clear();
        armed.store(true, Ordering::Relaxed);

        assert_eq!(purgatory.check_and_complete(&"k"), 0);
        assert_eq!(
            *tries.lock().unwrap(),
            vec![0],
            "only the first entry was tried"
        );
        let new_tries = new_tries.lock().unwrap();
        let watches_own: Vec<usize> = (0..segment + 40)
            .flat_map(|id| [100_000 + id, 100_000 + id])
            .collect();
        assert_eq!(
            *new_tries, watches_own,
            "no new operation was tried by the check"
        );
        let capacities = capacities.lock().unwrap();
        assert_eq!(
            capacities[..],
            [segment, 3 * segment],
            "the second segment was given back, then made again"
        );
        assert_eq!(purgatory.pending(), 1 + segment + 40);
        // The hook's assertions run inside `try_complete`, whose panics the purgatory
        // catches and counts: none may have failed.
        assert_eq!(
            purgatory.stats().panicked,
            0,
            "an assertion in the hook failed"
        );
    }

    /// A check tries each operation still waiting on its key once, in arrival order,
    /// skipping the entries of operations already gone, whatever the list's length
    /// against the prefetch window (`PREFETCH_AHEAD`): shorter, equal, one more, many.
    #[test]
    fn a_check_tries_each_waiting_entry_once_in_arrival_order_at_every_length() {
        for len in [
            1,
            2,
            PREFETCH_AHEAD - 1,
            PREFETCH_AHEAD,
            PREFETCH_AHEAD + 1,
            3 * PREFETCH_AHEAD + 5,
        ] {
            let purgatory: Purgatory<&str, Recorded> = PurgatoryBuilder::new()
                .timer(TimerBuilder::new().clock(ManualClock::new()).reaper(false))
                .build()
                .unwrap();
            let tries = Arc::new(std::sync::Mutex::new(Vec::new()));
            let flags: Vec<_> = (0..len)
                .map(|_| Arc::new(std::sync::atomic::AtomicBool::new(false)))
                .collect();
            let handles: Vec<_> = (0..len)
                .map(|id| {
                    let op = Recorded {
                        ready: Arc::clone(&flags[id]),
                        ..Recorded::new(id, &tries)
                    };
                    match purgatory.watch(op, ["k"]) {
                        Ok(WatchOutcome::Pending(handle)) => handle,
                        _ => panic!("{id} waits"),
                    }
                })
                .collect();
            // Every third operation is gone before the check (forced); every fifth
            // becomes ready for it.
            for id in (0..len).step_by(3) {
                assert!(purgatory.force_complete(&handles[id]));
            }
            for id in (0..len).step_by(5) {
                flags[id].store(true, Ordering::Relaxed);
            }
            tries.lock().unwrap().clear();
            let completed = purgatory.check_and_complete(&"k");
            let waiting: Vec<usize> = (0..len).filter(|id| id % 3 != 0).collect();
            assert_eq!(*tries.lock().unwrap(), waiting, "length {len}");
            let ready = waiting.iter().filter(|&&id| id % 5 == 0).count();
            assert_eq!(completed, ready, "length {len}");
            assert_eq!(purgatory.pending(), waiting.len() - ready, "length {len}");
        }
    }
}
