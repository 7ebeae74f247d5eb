//! The thread-safe timer (Kafka's `SystemTimer`): sharded wheels behind locks, a clock,
//! and the logic that advances them.
//!
//! # Design
//! - The timer holds `shards` independent [`Wheel`]s, each behind its own mutex. A thread
//!   adds to "its" shard (picked once per thread, round robin), so threads that add at the
//!   same time do not share a lock or a cache line. A handle records its shard, so cancel
//!   goes straight to the right wheel. One global lock would put every add and cancel of
//!   every thread through one cache line.
//! - Each shard publishes the expiration of its earliest queued bucket in
//!   `next_expiration`, so the driver finds the next due tick without taking any lock, and
//!   skips shards with nothing due.
//! - Deadlines are rounded *up* to a tick and the clock is rounded *down*, so a task never
//!   runs before its deadline; it runs at most one tick (plus scheduling delay) after it.
//!
//! # Invariants
//! - A task is in exactly one place: a wheel (pending), the batch being run (expired), or
//!   back with the caller (cancelled, or refused at add, or returned by `shutdown`).
//!   Moving it between these happens under its shard lock, so cancel and expiry racing on
//!   two threads have exactly one winner: `cancel` returns `Some` only if it won.
//! - `shard.next_expiration` is only lowered by add and only recomputed by advance, both
//!   under the shard lock; it is never later than the shard's earliest queued bucket.
//! - Once `shutdown` has drained a shard it is closed: adds to it are refused, so no task
//!   can slip in after the drain.

use std::sync::atomic::{AtomicU32, AtomicU64 as StdAtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{saturating_nanos, Clock};
use crate::executor::Executor;
use crate::sleeper::Sleeper;
use crate::sync::{AtomicBool, AtomicU64, Mutex};
use crate::wheel::SlotKey;
use crate::wheel::Wheel;
use crate::TimerTask;

/// `Shard::next_expiration` of a shard with no queued bucket.
const IDLE: u64 = u64::MAX;

/// Most cancels [`Timer::cancel_batch`] makes under one shard lock.
const CANCEL_BATCH: usize = 64;

/// Most adds [`Timer::add_batch`] makes under one shard lock.
const ADD_BATCH: usize = 64;

/// Names one added task. Cheap to copy; stale handles, and handles of another timer, are
/// harmless: they cancel nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerHandle {
    timer: u32,
    shard: u32,
    key: SlotKey,
}

/// Source of timer identities, so a handle is only honoured by the timer that issued it.
static NEXT_TIMER_ID: AtomicU32 = AtomicU32::new(0);

/// Counters of one timer, summed over its shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerStats {
    /// Tasks currently waiting.
    pub pending: usize,
    /// Tasks ever accepted by `add`.
    pub added: u64,
    /// Tasks removed by a successful `cancel`.
    pub cancelled: u64,
    /// Tasks that expired and were handed to the executor.
    pub expired: u64,
    /// Expired tasks that panicked while running.
    pub panicked: u64,
}

struct ShardState<T> {
    wheel: Wheel<T>,
    closed: bool,
    added: u64,
    cancelled: u64,
    expired: u64,
}

#[repr(align(128))]
struct Shard<T> {
    state: Mutex<ShardState<T>>,
    next_expiration: AtomicU64,
}

pub(crate) struct Inner<T> {
    id: u32,
    shards: Box<[Shard<T>]>,
    clock: Arc<dyn Clock>,
    tick_nanos: u64,
    executor: Executor,
    closed: AtomicBool,
    sleeper: Sleeper,
    panics: Arc<StdAtomicU64>,
}

/// A thread-safe hierarchical timer. Share it with `Arc`; every method takes `&self`.
///
/// Built by [`TimerBuilder`](crate::TimerBuilder). Unless built with
/// `.reaper(false)`, a background thread advances the clock and runs expired tasks.
pub struct Timer<T: TimerTask> {
    pub(crate) inner: Arc<Inner<T>>,
    pub(crate) reaper: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

static NEXT_THREAD_HINT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_HINT: usize = NEXT_THREAD_HINT.fetch_add(1, Ordering::Relaxed);
}

/// After adds to a locked shard: if its earliest expiration moved earlier than the one
/// published, publishes it and returns it, for the caller to wake the driver once the
/// lock is released.
fn publish_earlier<T>(shard: &Shard<T>, state: &ShardState<T>) -> Option<u64> {
    let next = state.wheel.next_expiration().unwrap_or(IDLE);
    // Under loom, read with a read-modify-write: loom's DPOR remembers only the last
    // access to an atomic, so a plain load here would hide this thread's store below
    // from the driver's earlier loads, and the add-versus-sleep race would go unexplored.
    #[cfg(loom)]
    let published = shard.next_expiration.fetch_add(0, Ordering::Relaxed);
    #[cfg(not(loom))]
    let published = shard.next_expiration.load(Ordering::Relaxed);
    (next < published).then(|| {
        shard.next_expiration.store(next, Ordering::SeqCst);
        next
    })
}

impl<T: TimerTask> Inner<T> {
    pub(crate) fn new(
        wheel_size: u32,
        shards: usize,
        tick: Duration,
        clock: Arc<dyn Clock>,
        executor: Executor,
    ) -> Self {
        let tick_nanos = saturating_nanos(tick);
        let start = clock.now_nanos() / tick_nanos;
        let shards = (0..shards)
            .map(|_| Shard {
                state: Mutex::new(ShardState {
                    wheel: Wheel::new(wheel_size, start),
                    closed: false,
                    added: 0,
                    cancelled: 0,
                    expired: 0,
                }),
                next_expiration: AtomicU64::new(IDLE),
            })
            .collect();
        Inner {
            id: NEXT_TIMER_ID.fetch_add(1, Ordering::Relaxed),
            shards,
            clock,
            tick_nanos,
            executor,
            closed: AtomicBool::new(false),
            sleeper: Sleeper::new(),
            panics: Arc::new(StdAtomicU64::new(0)),
        }
    }

    fn now_nanos(&self) -> u64 {
        self.clock.now_nanos()
    }

    /// Moves a locked shard's wheel up to `now` (ns) if the clock has passed its tick;
    /// divides only then.
    #[inline]
    fn catch_up(&self, state: &mut ShardState<T>, now: u64) {
        let next_tick_nanos = (state.wheel.current_tick() + 1).saturating_mul(self.tick_nanos);
        if now >= next_tick_nanos {
            state.wheel.catch_up(now / self.tick_nanos);
        }
    }

    fn add_at(&self, now: u64, deadline: u64, task: T) -> Result<TimerHandle, AddError<T>> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(AddError::Shutdown(task));
        }
        let expiration = deadline.div_ceil(self.tick_nanos);
        let shard_index = self.local_shard();
        let shard = &self.shards[shard_index];
        let mut state = shard.state.lock();
        if state.closed {
            return Err(AddError::Shutdown(task));
        }
        self.catch_up(&mut state, now);
        let key = state.wheel.insert(expiration, task);
        state.added += 1;
        let earlier = publish_earlier(shard, &state);
        drop(state);
        if let Some(next) = earlier {
            self.sleeper.wake_if_later_than(next);
        }
        Ok(TimerHandle {
            timer: self.id,
            shard: shard_index as u32,
            key,
        })
    }

    /// Adds every `(deadline, task)` of `tasks` to the calling thread's shard, taking its
    /// lock once per [`ADD_BATCH`] tasks (after bringing the slab entries those adds will
    /// fill into the cache); appends one result per task to `out`, in order.
    fn add_many(
        &self,
        now: u64,
        mut tasks: impl ExactSizeIterator<Item = (u64, T)>,
        out: &mut Vec<Result<TimerHandle, AddError<T>>>,
    ) {
        loop {
            if tasks.len() == 0 {
                return;
            }
            if self.closed.load(Ordering::Relaxed) {
                break;
            }
            let shard_index = self.local_shard();
            let shard = &self.shards[shard_index];
            let mut state = shard.state.lock();
            if state.closed {
                break;
            }
            self.catch_up(&mut state, now);
            state.wheel.prefetch_inserts(tasks.len().min(ADD_BATCH));
            let mut added = 0u64;
            for (deadline, task) in tasks.by_ref().take(ADD_BATCH) {
                let key = state.wheel.insert(deadline.div_ceil(self.tick_nanos), task);
                out.push(Ok(TimerHandle {
                    timer: self.id,
                    shard: shard_index as u32,
                    key,
                }));
                added += 1;
            }
            state.added += added;
            let earlier = publish_earlier(shard, &state);
            drop(state);
            if let Some(next) = earlier {
                self.sleeper.wake_if_later_than(next);
            }
        }
        out.extend(tasks.map(|(_, task)| Err(AddError::Shutdown(task))));
    }

    /// The shard the calling thread adds to.
    #[inline]
    fn local_shard(&self) -> usize {
        let hint = THREAD_HINT.with(|hint| *hint);
        let n = self.shards.len();
        if n.is_power_of_two() {
            hint & (n - 1)
        } else {
            hint % n
        }
    }

    fn earliest(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.next_expiration.load(Ordering::SeqCst))
            .min()
            .unwrap_or(IDLE)
    }

    /// Flushes every due bucket of every shard, handing each shard's expired tasks to
    /// `sink` (outside the shard lock). Returns how many expired.
    pub(crate) fn fire_due(&self, mut sink: impl FnMut(Vec<T>)) -> usize {
        let now = self.now_nanos() / self.tick_nanos;
        let mut fired = 0;
        for shard in self.shards.iter() {
            if shard.next_expiration.load(Ordering::Acquire) > now {
                continue;
            }
            let mut batch = Vec::new();
            let mut state = shard.state.lock();
            let n = state.wheel.advance(now, &mut batch);
            state.expired += n as u64;
            let next = state.wheel.next_expiration().unwrap_or(IDLE);
            shard.next_expiration.store(next, Ordering::SeqCst);
            drop(state);
            fired += n;
            if n > 0 {
                sink(batch);
            }
        }
        fired
    }

    /// Fires what is due; if nothing was, waits up to `max_wait` for the earliest bucket
    /// (or an earlier add, or shutdown) and fires what is due then.
    pub(crate) fn advance_clock_with(
        &self,
        max_wait: Duration,
        mut sink: impl FnMut(Vec<T>),
    ) -> usize {
        let fired = self.fire_due(&mut sink);
        if fired > 0 || max_wait.is_zero() || self.closed.load(Ordering::SeqCst) {
            return fired;
        }
        let now = self.now_nanos();
        let limit = now.saturating_add(saturating_nanos(max_wait));
        let earliest = self.earliest();
        let wake_nanos = earliest.saturating_mul(self.tick_nanos).min(limit);
        if wake_nanos <= now {
            // A bucket came due since `fire_due` looked (an add raced it): fire it now
            // rather than going through the condition variable.
            return self.fire_due(sink);
        }
        let wake_tick = wake_nanos / self.tick_nanos;
        let deadline = if wake_nanos == u64::MAX {
            None
        } else {
            Instant::now().checked_add(Duration::from_nanos(wake_nanos.saturating_sub(now)))
        };
        self.sleeper.sleep(wake_tick, deadline, |wake_tick| {
            self.closed.load(Ordering::SeqCst) || self.earliest() < wake_tick
        });
        self.fire_due(sink)
    }

    pub(crate) fn advance_clock(&self, max_wait: Duration) -> usize {
        self.advance_clock_with(max_wait, |batch| self.executor.run(batch, &self.panics))
    }
}

pub use crate::error::AddError;

impl<T: TimerTask> Timer<T> {
    /// Schedules `task` to run once `delay` has passed. A zero delay means due now (it
    /// runs on the next clock advance, never on the calling thread). A deadline beyond the
    /// wheel's range is clamped to its end: with wheel sizes up to 256 (the default is 20)
    /// the range exceeds every deadline a `u64` of nanoseconds can hold, so nothing is
    /// clamped; larger sizes cover less (at least `2^46.5` ticks: about 3 years at a 1 us
    /// tick, 3,000 years at 1 ms), and a later deadline fires at the range's end.
    ///
    /// Returns a handle for [`cancel`](Self::cancel), or the task back if the timer has
    /// been shut down.
    pub fn add(&self, delay: Duration, task: T) -> Result<TimerHandle, AddError<T>> {
        let now = self.inner.now_nanos();
        self.inner
            .add_at(now, now.saturating_add(saturating_nanos(delay)), task)
    }

    /// Schedules `task` to run at `deadline`, a time on this timer's clock (see
    /// [`now`](Self::now)). Lets a caller that adds many tasks read the clock once.
    pub fn add_at(&self, deadline: Duration, task: T) -> Result<TimerHandle, AddError<T>> {
        let now = self.inner.now_nanos();
        self.inner.add_at(now, saturating_nanos(deadline), task)
    }

    /// Adds every `(delay, task)` of `tasks`, like [`add`](Self::add) on each, and
    /// appends one result per task to `out`, in the order of `tasks` (which is left
    /// empty). Cheaper per task than one `add` each: the clock is read once for the whole
    /// batch (every delay counts from that reading) and the shard lock is taken once per
    /// run of at most 64 tasks.
    pub fn add_batch(
        &self,
        tasks: &mut Vec<(Duration, T)>,
        out: &mut Vec<Result<TimerHandle, AddError<T>>>,
    ) {
        let now = self.inner.now_nanos();
        out.reserve(tasks.len());
        let at = tasks
            .drain(..)
            .map(|(delay, task)| (now.saturating_add(saturating_nanos(delay)), task));
        self.inner.add_many(now, at, out);
    }

    /// The current time of this timer's clock.
    pub fn now(&self) -> Duration {
        self.inner.clock.now()
    }

    /// Cancels the task `handle` names and gives it back. Returns `None` if the task
    /// already expired (it has run or is running), was already cancelled, or the timer
    /// was shut down: exactly one of cancel and expiry wins. O(1).
    ///
    /// The task is out of the timer when this returns. Its slot is reused a
    /// little later: up to 8 cancelled slots per shard wait to be unlinked, by later
    /// cancels or the shard's next advance ([`Wheel::cancel`] says why).
    pub fn cancel(&self, handle: TimerHandle) -> Option<T> {
        let shard = self.shard_of(handle)?;
        let mut state = shard.state.lock();
        let task = state.wheel.cancel(handle.key)?;
        state.cancelled += 1;
        Some(task)
    }

    /// Cancels every task `handles` names, like [`cancel`](Self::cancel) on each, and
    /// appends the tasks whose cancel won to `cancelled`; returns how many that was.
    /// Handles that are stale or from another timer cancel nothing.
    ///
    /// Cheaper per task than one `cancel` each: `handles` is sorted in place by shard and
    /// slot, and each shard lock is taken once per run of at most 64 of its handles (so an
    /// adder never waits behind a long batch), walking its slab in address order. The
    /// tasks are appended after each lock is released.
    pub fn cancel_batch(
        &self,
        handles: &mut [TimerHandle],
        cancelled: &mut impl Extend<T>,
    ) -> usize {
        handles.sort_unstable_by_key(|h| (u64::from(h.shard) << 32) | u64::from(h.key.index));
        let mut won = 0;
        let mut run: Vec<T> = Vec::new();
        let mut rest = &handles[..];
        while let Some(first) = rest.first() {
            let same = rest
                .iter()
                .take(CANCEL_BATCH)
                .take_while(|h| h.shard == first.shard)
                .count();
            let (chunk, tail) = rest.split_at(same);
            rest = tail;
            // By index only: the timer id is checked per handle below, so a foreign
            // handle heading the run does not make the run's other handles skip.
            let Some(shard) = self.inner.shards.get(first.shard as usize) else {
                continue;
            };
            {
                let mut state = shard.state.lock();
                state.wheel.prefetch_cancels(chunk.iter().map(|h| h.key));
                for handle in chunk {
                    if handle.timer != self.inner.id {
                        continue;
                    }
                    if let Some(task) = state.wheel.cancel_prefetched(handle.key) {
                        run.push(task);
                    }
                }
                state.cancelled += run.len() as u64;
            }
            won += run.len();
            cancelled.extend(run.drain(..));
        }
        won
    }

    /// Whether `handle` still names a pending task.
    pub fn is_pending(&self, handle: TimerHandle) -> bool {
        self.shard_of(handle)
            .is_some_and(|s| s.state.lock().wheel.contains(handle.key))
    }

    /// The shard a handle names, if this timer issued it.
    fn shard_of(&self, handle: TimerHandle) -> Option<&Shard<T>> {
        if handle.timer != self.inner.id {
            return None;
        }
        self.inner.shards.get(handle.shard as usize)
    }

    /// Runs every task that is due, then, if none was, waits up to `max_wait` for the
    /// earliest bucket to come due (or for an earlier one to be added) and runs what is due
    /// then. Returns how many tasks expired. With `Duration::ZERO` it never waits.
    ///
    /// The reaper thread calls this in a loop; call it yourself when the timer was built
    /// without one (for example on a [`ManualClock`](crate::ManualClock)).
    pub fn advance_clock(&self, max_wait: Duration) -> usize {
        self.inner.advance_clock(max_wait)
    }

    /// Like [`advance_clock`](Self::advance_clock), but instead of running the expired
    /// tasks it appends them to `expired` for the caller to handle (the executor is not
    /// used). For owners that drive the timer from their own loop and need context the
    /// task cannot carry.
    pub fn advance_clock_into(&self, max_wait: Duration, expired: &mut Vec<T>) -> usize {
        self.inner
            .advance_clock_with(max_wait, |batch| expired.extend(batch))
    }

    /// Wakes a thread blocked in [`advance_clock`](Self::advance_clock).
    pub fn wake(&self) {
        self.inner.sleeper.wake();
    }

    /// When the earliest queued bucket is due, on this timer's clock; `None` when idle.
    pub fn next_expiration(&self) -> Option<Duration> {
        match self.inner.earliest() {
            IDLE => None,
            tick => Some(Duration::from_nanos(
                tick.saturating_mul(self.inner.tick_nanos),
            )),
        }
    }

    /// Number of pending tasks.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.state.lock().wheel.len())
            .sum()
    }

    /// Whether no task is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters summed over all shards.
    pub fn stats(&self) -> TimerStats {
        let mut stats = TimerStats {
            panicked: self.inner.panics.load(Ordering::Relaxed),
            ..TimerStats::default()
        };
        for shard in self.inner.shards.iter() {
            let state = shard.state.lock();
            stats.pending += state.wheel.len();
            stats.added += state.added;
            stats.cancelled += state.cancelled;
            stats.expired += state.expired;
        }
        stats
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub fn is_shutdown(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// Stops the reaper (promptly: it is woken, not waited out) and joins it, refuses
    /// every later `add`, and hands back every task still pending, unrun. A second call
    /// returns nothing. Tasks already handed to a pool executor still run there.
    pub fn shutdown(&self) -> Vec<T> {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Vec::new();
        }
        self.inner.sleeper.wake();
        if let Some(reaper) = self.reaper.lock().take() {
            if reaper.thread().id() != std::thread::current().id() {
                let _ = reaper.join();
            }
        }
        let mut pending = Vec::new();
        for shard in self.inner.shards.iter() {
            let mut state = shard.state.lock();
            state.closed = true;
            pending.extend(state.wheel.drain());
            shard.next_expiration.store(IDLE, Ordering::SeqCst);
        }
        pending
    }
}

impl<T: TimerTask> Drop for Timer<T> {
    /// Shuts the timer down; tasks still pending are dropped without running (call
    /// [`shutdown`](Timer::shutdown) first to get them back).
    fn drop(&mut self) {
        let dropped = self.shutdown().len();
        if dropped > 0 {
            tracing::debug!(target: "timer_core", dropped, "timer dropped with pending tasks");
        }
    }
}

impl<T: TimerTask> std::fmt::Debug for Timer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timer")
            .field("shards", &self.inner.shards.len())
            .field("tick_nanos", &self.inner.tick_nanos)
            .field("closed", &self.is_shutdown())
            .finish_non_exhaustive()
    }
}

pub(crate) fn reaper_loop<T: TimerTask>(inner: Arc<Inner<T>>) {
    while !inner.closed.load(Ordering::SeqCst) {
        inner.advance_clock(Duration::MAX);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::{ManualClock, Timer, TimerBuilder, TimerHandle, TimerTask};

    /// A task that is just its id.
    #[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
    struct Id(u32);

    impl TimerTask for Id {
        fn run(self) {}
    }

    fn manual_timer(clock: &ManualClock, shards: usize) -> Arc<Timer<Id>> {
        Arc::new(
            TimerBuilder::new()
                .clock(clock.clone())
                .shards(shards)
                .reaper(false)
                .build()
                .unwrap(),
        )
    }

    /// Adds `ids` from a fresh thread (so successive calls land in different shards).
    fn add_from_new_thread(timer: &Arc<Timer<Id>>, ids: std::ops::Range<u32>) -> Vec<TimerHandle> {
        let timer = Arc::clone(timer);
        std::thread::spawn(move || {
            ids.map(|id| timer.add(Duration::from_millis(10), Id(id)).unwrap())
                .collect()
        })
        .join()
        .unwrap()
    }

    #[test]
    fn cancel_batch_cancels_exactly_the_live_handles_across_shards() {
        let clock = ManualClock::new();
        let timer = manual_timer(&clock, 3);
        let mut handles = Vec::new();
        for t in 0..3u32 {
            handles.extend(add_from_new_thread(&timer, t * 100..t * 100 + 100));
        }
        let shards: std::collections::HashSet<_> = handles.iter().map(|h| h.shard).collect();
        assert!(shards.len() > 1, "the batch must span shards");
        // Cancel two thirds (more than 64 per shard in one batch), plus a stale handle, a
        // duplicate and a handle of another timer.
        let mut batch: Vec<TimerHandle> = handles
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0)
            .map(|(_, h)| *h)
            .collect();
        let already = handles[1];
        assert_eq!(timer.cancel(already), Some(Id(1)));
        batch.push(batch[5]);
        let other = manual_timer(&clock, 1);
        batch.push(other.add(Duration::from_millis(10), Id(9999)).unwrap());
        let mut cancelled = Vec::new();
        let won = timer.cancel_batch(&mut batch, &mut cancelled);
        let expected: Vec<Id> = (0..300).filter(|i| i % 3 != 0 && *i != 1).map(Id).collect();
        assert_eq!(won, expected.len());
        cancelled.sort_unstable();
        assert_eq!(cancelled, expected);
        assert_eq!(other.len(), 1, "another timer's handle cancels nothing");
        assert_eq!(timer.stats().cancelled, expected.len() as u64 + 1);
        // The rest still fire, the cancelled ones never do.
        clock.advance(Duration::from_millis(10));
        let mut fired = Vec::new();
        timer.advance_clock_into(Duration::ZERO, &mut fired);
        fired.sort_unstable();
        assert_eq!(fired, (0..300).step_by(3).map(Id).collect::<Vec<_>>());
        assert!(timer.is_empty());
    }

    #[test]
    fn add_batch_adds_in_order_and_each_task_fires_at_its_own_delay() {
        let clock = ManualClock::new();
        let timer = manual_timer(&clock, 2);
        // More than one lock's worth (64), delays 1..=150 ms in reverse order.
        let mut tasks: Vec<(Duration, Id)> = (0..150u32)
            .map(|i| (Duration::from_millis(u64::from(150 - i)), Id(i)))
            .collect();
        let mut handles = Vec::new();
        timer.add_batch(&mut tasks, &mut handles);
        assert!(tasks.is_empty());
        assert_eq!(handles.len(), 150);
        let handles: Vec<TimerHandle> = handles.into_iter().map(Result::unwrap).collect();
        assert_eq!(timer.len(), 150);
        assert_eq!(timer.stats().added, 150);
        // Handles are in input order: the one of `Id(10)` cancels `Id(10)`.
        assert_eq!(timer.cancel(handles[10]), Some(Id(10)));
        // Nothing fires early; at 75 ms exactly the tasks with delay <= 75 ms have fired.
        clock.advance(Duration::from_millis(75));
        let mut fired = Vec::new();
        timer.advance_clock_into(Duration::ZERO, &mut fired);
        fired.sort_unstable();
        assert_eq!(fired, (75..150).map(Id).collect::<Vec<_>>());
        clock.advance(Duration::from_millis(75));
        fired.clear();
        timer.advance_clock_into(Duration::ZERO, &mut fired);
        fired.sort_unstable();
        let rest: Vec<Id> = (0..75).filter(|&i| i != 10).map(Id).collect();
        assert_eq!(fired, rest);
        assert!(timer.is_empty());
    }

    #[test]
    fn add_batch_after_shutdown_hands_every_task_back_in_order() {
        let clock = ManualClock::new();
        let timer = manual_timer(&clock, 1);
        timer.shutdown();
        let mut tasks: Vec<(Duration, Id)> =
            (0..70).map(|i| (Duration::from_millis(5), Id(i))).collect();
        let mut out = Vec::new();
        timer.add_batch(&mut tasks, &mut out);
        let back: Vec<Id> = out
            .into_iter()
            .map(|r| match r {
                Err(crate::AddError::Shutdown(task)) => task,
                Ok(_) => panic!("added after shutdown"),
            })
            .collect();
        assert_eq!(back, (0..70).map(Id).collect::<Vec<_>>());
        assert!(timer.is_empty());
    }

    #[test]
    fn cancel_batch_of_nothing_cancels_nothing() {
        let clock = ManualClock::new();
        let timer = manual_timer(&clock, 2);
        let h = timer.add(Duration::from_millis(1), Id(7)).unwrap();
        let mut cancelled = Vec::new();
        assert_eq!(timer.cancel_batch(&mut [], &mut cancelled), 0);
        assert!(cancelled.is_empty());
        assert!(timer.is_pending(h));
    }
}
