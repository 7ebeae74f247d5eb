//! The timer's thread-free core (Kafka's `SystemTimer` without its threads): sharded
//! wheels behind locks, a clock, and the logic that advances them.
//!
//! # Design
//! - The core holds `shards` independent [`Wheel`]s, each behind its own mutex. A thread
//!   adds to "its" shard (picked once per thread, round robin), so threads that add at the
//!   same time do not share a lock or a cache line. A handle records its shard, so cancel
//!   goes straight to the right wheel. One global lock would put every add and cancel of
//!   every thread through one cache line.
//! - Each shard publishes the expiration of its earliest queued bucket in
//!   `next_expiration`, so an advance finds the next due tick without taking any lock, and
//!   skips shards with nothing due.
//! - Deadlines are rounded *up* to a tick and the clock is rounded *down*, so a task never
//!   expires before its deadline; it expires at most one tick (plus scheduling delay)
//!   after it.
//! - The core owns no thread and runs no task: [`TimerCore::advance_into`] hands expired
//!   tasks to its caller. The reaper thread, the executor and panic containment are the
//!   driver's (`driver.rs`).
//!
//! # Invariants
//! - A task is in exactly one place: a wheel (pending), the batch being handed out
//!   (expired), or back with the caller (cancelled, or refused at add, or returned by
//!   shutdown). Moving it between these happens under its shard lock, so cancel and
//!   expiry racing on two threads have exactly one winner: `cancel` returns `Some` only
//!   if it won; so do a reset (which moves a pending task within its wheel) and expiry:
//!   `reset` returns `true` only if the task was still pending.
//! - `shard.next_expiration` is written under the shard lock only: lowered by an add,
//!   set to the wheel's earliest queued bucket by an advance, a reset and a batch cancel
//!   that leaves the shard a task (which may raise it, past buckets they emptied), and
//!   set to idle by the drain. Nothing else moves the wheel's earliest queued bucket
//!   earlier, so the published value is never later than it. It may be earlier: a
//!   single cancel publishes nothing, and a batch cancel that empties the shard whole
//!   keeps the old value on purpose (see `cancel_batch`), until an advance reaches it.
//! - A shard's `next_tick_nanos` is `(wheel.current_tick() + 1) * tick_nanos`
//!   (saturating) whenever its lock is free, or 0 once the shard is closed, or
//!   `u64::MAX` after an add found a bucket due that stopped its catch-up (until the
//!   advance that fires it, adds in between would find the same; a batch cancel, which
//!   may take that bucket off the queue, sets it back): what moves a wheel's
//!   time (`catch_up`, the advance in `fire_due`) sets it right after (`moved`), and
//!   closing a shard sets it to 0. Every clock reading is at least 0, so an add,
//!   which compares its reading with it (`catch_up`), looks at `closed` only when the
//!   tick has moved on or the shard is closed: no check of its own.
//! - An advance that publishes a shard idle increments `idled` first, under the shard
//!   lock; a driver that reads the shard idle therefore reads the count too, and compares
//!   it with the count read when its wait was decided (`advance_with`).
//! - Once closed, an advance fires nothing and adds and resets are refused. `close`
//!   closes every shard, under its lock, before the core reads closed
//!   ([`is_shutdown`](TimerCore::is_shutdown)), and a shard refuses adds itself: an add
//!   either took the shard's lock first (its task is in the wheel, and the drain hands it
//!   back) or is refused, so no task can slip in, or move, after the drain.

use std::num::{NonZeroU32, NonZeroU64};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::clock::{saturating_nanos, TimerClock};
use crate::driver::NextRound;
use crate::error::AddError;
use crate::sleeper::Sleeper;
use crate::sync::{AtomicBool, AtomicU64, Mutex};
use crate::wheel::{SlotKey, Spare, Wheel};

/// `Shard::next_expiration` of a shard with no queued bucket.
const IDLE: u64 = u64::MAX;

/// Most cancels [`TimerCore::cancel_batch`] makes under one shard lock.
const CANCEL_BATCH: usize = 64;

/// Most adds [`TimerCore::add_batch`] makes under one shard lock.
const ADD_BATCH: usize = 64;

/// Names one added task. Cheap to copy; stale handles, and handles of another timer, are
/// harmless: they cancel nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerHandle {
    /// Never zero, so that `Option<TimerHandle>` is no larger than a handle: a
    /// purgatory keeps one in every waiting operation's slot.
    pub(crate) timer: NonZeroU32,
    pub(crate) shard: u32,
    pub(crate) key: SlotKey,
}

/// Source of timer identities, so a handle is only honoured by the timer that issued it.
static NEXT_TIMER_ID: AtomicU32 = AtomicU32::new(1);

/// A new timer's identity: the next of [`NEXT_TIMER_ID`], skipping the zero it reaches
/// once every 2^32 timers.
fn next_timer_id() -> NonZeroU32 {
    loop {
        if let Some(id) = NonZeroU32::new(NEXT_TIMER_ID.fetch_add(1, Ordering::Relaxed)) {
            return id;
        }
    }
}

/// Counters of one timer, summed over its shards.
///
/// With the cargo feature `serde`: `Serialize` and `Deserialize`, as an object of these
/// fields under their names; a field missing from the input (a snapshot taken before it
/// was added) reads as 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct TimerStats {
    /// Tasks currently waiting.
    pub pending: usize,
    /// Tasks ever accepted by `add`.
    pub added: u64,
    /// Tasks removed by a successful `cancel`.
    pub cancelled: u64,
    /// Tasks that expired and were handed to the executor.
    pub expired: u64,
    /// Expired tasks that panicked while running (counted by [`Timer`](crate::Timer);
    /// always 0 from a bare [`TimerCore`]).
    pub panicked: u64,
    /// Reads of the clock that panicked, caught: the last good reading stood in for each
    /// (see `user_code.rs`). Always 0 for [`SystemClock`](crate::SystemClock) and
    /// [`ManualClock`](crate::ManualClock).
    pub clock_panics: u64,
    /// Reliefs of late expiry (`stand_in.rs`): each handed a stand-in thread (started,
    /// or woken from a wait for more) a batch's unclaimed tasks or the rounds, while
    /// driving threads were held in user code. Always 0 without a reaper with stand-ins.
    pub stand_ins: u64,
    /// Times relief was wanted while every stand-in slot was taken (the limit,
    /// `TimerBuilder::max_stand_ins`): counted once each time the limit is reached, not
    /// per look. Expiry behind the blocked callbacks then waits for one of them.
    pub stand_in_limit_reached: u64,
    /// Bytes the shards' entry slabs hold now, the room made for tasks whether in use or
    /// not (32 bytes a task for pointer-sized tasks; a purgatory's are 40). A gauge, not
    /// a counter. This memory does not come from the program's global allocator: a
    /// large slab is pages mapped for it alone (Linux), a small one the system
    /// allocator's (`std::alloc::System`), so that a slab grows by remapping pages, not
    /// by a copy under its shard's lock (see `docs/timer.md`). A global allocator that
    /// counts its bytes does not see it, and this figure is what to add.
    pub entry_bytes: usize,
}

/// What one advance fired: how many tasks, and how long before the advance read the
/// clock the earliest of their buckets came due: how late the oldest of them already is
/// (on the real clock; 0 on any other, see `fire_due`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Fired {
    pub(crate) count: usize,
    pub(crate) overdue: Duration,
}

/// The relief machinery's counts (`stand_in.rs`), kept with the core so that an owner
/// holding only the core reads them in its stats.
#[derive(Debug, Default)]
pub(crate) struct ReliefCounts {
    pub(crate) started: std::sync::atomic::AtomicU64,
    pub(crate) limit_reached: std::sync::atomic::AtomicU64,
}

struct ShardState<T> {
    wheel: Wheel<T>,
    /// The clock reading (ns) at which the wheel's tick moves on:
    /// `(wheel.current_tick() + 1) * tick_nanos`, saturating. Set with every move of the
    /// wheel's time (`TimerCore::moved`), so an add compares the clock with it instead
    /// of multiplying.
    next_tick_nanos: u64,
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

/// The timer without threads: sharded wheels behind locks and a clock. Every method
/// takes `&self` and runs on the caller's thread; nothing runs an expired task, it is
/// handed to whoever advances the clock ([`advance_into`](Self::advance_into)).
///
/// Built by [`TimerBuilder::build_core`](crate::TimerBuilder::build_core). A
/// [`Driver`](crate::Driver) adds a reaper thread and an executor; [`Timer`](crate::Timer)
/// is a core with a driver that runs tasks.
pub struct TimerCore<T> {
    id: NonZeroU32,
    shards: Box<[Shard<T>]>,
    clock: TimerClock,
    /// Never 0 (the builder takes ticks of 1 us to 1 h), and typed so: dividing by it
    /// then needs no check for a zero divisor.
    tick_nanos: NonZeroU64,
    /// `shards.len() - 1` when that is a power of two (a thread's shard is then its hint
    /// masked), else `usize::MAX` (its hint modulo the count). Kept so that an add does
    /// not test the count each time.
    shard_mask: usize,
    closed: AtomicBool,
    sleeper: Sleeper,
    relief: ReliefCounts,
    /// How many times an advance has left a shard idle (see [`idled`](Self::idled)).
    idled: AtomicU64,
}

static NEXT_THREAD_HINT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_HINT: usize = NEXT_THREAD_HINT.fetch_add(1, Ordering::Relaxed);
}

/// A small number, different for threads that ask one after the other: picks a thread's
/// shard (and its stripe of the driver's work counts).
#[inline]
pub(crate) fn thread_hint() -> usize {
    THREAD_HINT.with(|hint| *hint)
}

/// After adds to a locked shard, `queued` the earliest expiration of the buckets they
/// queued (`IDLE` if they queued none): if the shard's earliest expiration moved earlier
/// than the one published, publishes it and returns it, for the caller to wake the
/// driver once the lock is released.
///
/// Adds only ever push onto the bucket queue, and the published expiration is never
/// later than the wheel's earliest queued one (see the module doc), so the earliest
/// moved earlier than the published one exactly when `queued` is earlier than it, and
/// is then `queued`: the bucket queue need not be read.
fn publish_earlier<T>(shard: &Shard<T>, state: &ShardState<T>, queued: u64) -> Option<u64> {
    // Under loom, read with a read-modify-write: loom's DPOR remembers only the last
    // access to an atomic, so a plain load here would hide this thread's store below
    // from the driver's earlier loads, and the add-versus-sleep race would go unexplored.
    #[cfg(loom)]
    let published = shard.next_expiration.fetch_add(0, Ordering::Relaxed);
    #[cfg(not(loom))]
    let published = shard.next_expiration.load(Ordering::Relaxed);
    // Checked in debug builds, and under loom (whose models run in release).
    if cfg!(any(loom, debug_assertions)) {
        let next = state.wheel.next_expiration().unwrap_or(IDLE);
        assert_eq!(
            (next < published).then_some(next),
            (queued < published).then_some(queued),
            "the published expiration was later than the wheel's earliest"
        );
    }
    (queued < published).then(|| {
        shard.next_expiration.store(queued, Ordering::SeqCst);
        queued
    })
}

/// After a change to a locked shard that may move its earliest expiration either way (a
/// reset, or cancels that emptied its earliest bucket): publishes the wheel's earliest
/// expiration if it differs from the one published, and returns it if it is earlier,
/// for the caller to wake the driver once the lock is released. A later one is
/// published too, so that a driver that reads it next does not wake for a bucket with
/// nothing in it; one already asleep wakes at the earlier time and finds nothing due.
fn publish_moved<T>(shard: &Shard<T>, state: &ShardState<T>) -> Option<u64> {
    let next = state.wheel.next_expiration().unwrap_or(IDLE);
    // A read-modify-write under loom, as in `publish_earlier`.
    #[cfg(loom)]
    let published = shard.next_expiration.fetch_add(0, Ordering::Relaxed);
    #[cfg(not(loom))]
    let published = shard.next_expiration.load(Ordering::Relaxed);
    if next != published {
        shard.next_expiration.store(next, Ordering::SeqCst);
    }
    (next < published).then_some(next)
}

impl<T> TimerCore<T> {
    pub(crate) fn new(wheel_size: u32, shards: usize, tick: Duration, clock: TimerClock) -> Self {
        let tick_nanos = NonZeroU64::new(saturating_nanos(tick))
            .filter(|nanos| nanos.get() >= 2)
            .expect("a tick of at least 2 ns (the builder takes 1 us ..= 1 h)");
        let start = clock.now_nanos() / tick_nanos;
        let shards = (0..shards)
            .map(|_| {
                let wheel = Wheel::new(wheel_size, start);
                Shard {
                    state: Mutex::new(ShardState {
                        next_tick_nanos: (wheel.current_tick() + 1)
                            .saturating_mul(tick_nanos.get()),
                        wheel,
                        closed: false,
                        added: 0,
                        cancelled: 0,
                        expired: 0,
                    }),
                    next_expiration: AtomicU64::new(IDLE),
                }
            })
            .collect::<Box<[_]>>();
        let shard_mask = if shards.len().is_power_of_two() {
            shards.len() - 1
        } else {
            usize::MAX
        };
        TimerCore {
            id: next_timer_id(),
            shards,
            clock,
            tick_nanos,
            shard_mask,
            closed: AtomicBool::new(false),
            sleeper: Sleeper::new(),
            relief: ReliefCounts::default(),
            idled: AtomicU64::new(0),
        }
    }

    fn now_nanos(&self) -> u64 {
        self.clock.now_nanos()
    }

    /// Moves a locked shard's wheel up to `now` (ns) if the clock has passed its tick;
    /// divides only then. Returns `false`, moving nothing, if the shard is closed (its
    /// `next_tick_nanos` is then 0, which every reading has passed: see the module doc).
    #[inline]
    #[must_use]
    fn catch_up(&self, state: &mut ShardState<T>, now: u64) -> bool {
        debug_assert!(
            state.next_tick_nanos == u64::MAX && !state.closed
                || state.next_tick_nanos == self.next_tick_nanos(state),
            "the wheel's time moved without `moved`"
        );
        if now >= state.next_tick_nanos {
            if state.closed {
                return false;
            }
            if state.wheel.catch_up(now / self.tick_nanos) {
                self.moved(state);
            } else {
                // A bucket is due: the wheel's time waits for the advance that fires it,
                // which sets `next_tick_nanos` again (`moved`); until then every add
                // would find the same, so none looks (see the module doc).
                state.next_tick_nanos = u64::MAX;
            }
        }
        true
    }

    /// `nanos` in ticks, rounded up (a deadline's expiration). At most
    /// `ceil(u64::MAX / 2)`, the tick being at least 2 ns (see `new`): far below the
    /// wheel's last tick, so `Wheel::insert_queuing` takes it unclamped.
    #[inline]
    fn ticks_ceil(&self, nanos: u64) -> u64 {
        nanos / self.tick_nanos + u64::from(nanos % self.tick_nanos != 0)
    }

    /// After the wheel of a locked shard may have moved its time: sets the shard's
    /// `next_tick_nanos` to match (0 for a closed shard).
    fn moved(&self, state: &mut ShardState<T>) {
        state.next_tick_nanos = self.next_tick_nanos(state);
    }

    /// What a locked shard's `next_tick_nanos` should be (see the module doc).
    fn next_tick_nanos(&self, state: &ShardState<T>) -> u64 {
        if state.closed {
            0
        } else {
            (state.wheel.current_tick() + 1).saturating_mul(self.tick_nanos.get())
        }
    }

    fn add_at_nanos(&self, now: u64, deadline: u64, task: T) -> Result<TimerHandle, AddError<T>> {
        let expiration = self.ticks_ceil(deadline);
        let shard_index = self.local_shard();
        let shard = self.shard(shard_index);
        let mut state = shard.state.lock();
        // A closed shard refuses (`close` closes every shard, under its lock).
        if !self.catch_up(&mut state, now) {
            return Err(AddError::Shutdown(task));
        }
        let (key, queued) = state.wheel.insert_queuing(expiration, task);
        state.added += 1;
        // Most adds go to a bucket queued already: nothing to publish, nor to read.
        let earlier = if queued == IDLE {
            None
        } else {
            publish_earlier(shard, &state, queued)
        };
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
            let shard_index = self.local_shard();
            let shard = self.shard(shard_index);
            let mut state = shard.state.lock();
            if !self.catch_up(&mut state, now) {
                break;
            }
            state.wheel.prefetch_inserts(tasks.len().min(ADD_BATCH));
            let mut added = 0u64;
            let mut queued = IDLE;
            for (deadline, task) in tasks.by_ref().take(ADD_BATCH) {
                let expiration = self.ticks_ceil(deadline);
                let (key, bucket) = state.wheel.insert_queuing(expiration, task);
                queued = queued.min(bucket);
                out.push(Ok(TimerHandle {
                    timer: self.id,
                    shard: shard_index as u32,
                    key,
                }));
                added += 1;
            }
            state.added += added;
            let earlier = publish_earlier(shard, &state, queued);
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
        let hint = thread_hint();
        match self.shard_mask {
            usize::MAX => hint % self.shards.len(),
            mask => hint & mask,
        }
    }

    /// Shard `index`, which [`local_shard`](Self::local_shard) gave.
    #[inline(always)]
    fn shard(&self, index: usize) -> &Shard<T> {
        debug_assert!(index < self.shards.len());
        // SAFETY: `local_shard` gives a remainder modulo `shards.len()`, or a hint masked
        // with `shard_mask`, which is then `shards.len() - 1` (set in `new`; `shards`
        // never changes length, a boxed slice), a power of two less one: both below
        // `shards.len()`.
        unsafe { self.shards.get_unchecked(index) }
    }

    fn earliest(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.next_expiration.load(Ordering::SeqCst))
            .min()
            .unwrap_or(IDLE)
    }

    /// Flushes every due bucket of every shard, appending the expired tasks to `expired`
    /// (the caller's vector, reused round after round: a fresh one per shard and round,
    /// grown push by push and then copied over, cost about 190 instructions an expiry).
    /// Returns how many expired.
    fn fire_due(&self, expired: &mut Vec<T>) -> Fired {
        // Once closed, what is left is for `drain`: a round racing `close` fires nothing
        // more, so every task is either fired before the close or handed back.
        if self.closed.load(Ordering::SeqCst) {
            return Fired::default();
        }
        let now_nanos = self.now_nanos();
        let now = now_nanos / self.tick_nanos;
        let mut fired = 0;
        let mut oldest = IDLE;
        for shard in self.shards.iter() {
            let next = shard.next_expiration.load(Ordering::Acquire);
            if next > now {
                continue;
            }
            oldest = oldest.min(next);
            let mut state = shard.state.lock();
            let n = state.wheel.advance(now, expired);
            self.moved(&mut state);
            state.expired += n as u64;
            let next = state.wheel.next_expiration().unwrap_or(IDLE);
            if next == IDLE {
                // Counted before it is published: a driver that reads the shard idle
                // reads the count too (`advance_with`).
                self.idled.fetch_add(1, Ordering::SeqCst);
            }
            shard.next_expiration.store(next, Ordering::SeqCst);
            drop(state);
            fired += n;
        }
        // How late in real time: known on the real clock only (a manual clock moved 30 s
        // at once, or a user clock, need not move with real time: their batches count
        // as late from the moment they fired).
        let overdue = if fired == 0 || !self.clock.is_real_time() {
            0
        } else {
            now_nanos.saturating_sub(oldest.saturating_mul(self.tick_nanos.get()))
        };
        Fired {
            count: fired,
            overdue: Duration::from_nanos(overdue),
        }
    }

    /// How many times an advance has left a shard idle, so far. A driver reads it when
    /// it decides how long its next round may wait, and passes it to that round's
    /// [`advance_with`](Self::advance_with).
    pub(crate) fn idled(&self) -> u64 {
        self.idled.load(Ordering::SeqCst)
    }

    /// Fires what is due; if nothing was, waits (see [`NextRound`]: `wait.queued` at
    /// most while a task is queued, `wait.empty` at most while none is) for the earliest
    /// bucket, an earlier add or shutdown, and fires what is due then. `before_sleep` is
    /// told, just before such a wait, when it will end at the latest (`None`: not before
    /// a wake): a driving thread's watchdog then knows whether it is back before its
    /// look.
    ///
    /// `decided` is what [`idled`](Self::idled) read when `wait` was decided. A core
    /// found empty after an advance has left a shard idle since then does not wait at
    /// all: the advance that did it (this one, or another driving thread's) took a due
    /// bucket whose entries were cancelled after the decision (by the owner's
    /// `before_round`, or a completing thread), so the core may have been emptied since,
    /// and `wait.empty` decided for a core that was not; the owner decides again (its
    /// `after_round`) first. Only an advance publishes a shard idle while drivers run
    /// (`cancel_batch` keeps the old value when it empties a shard whole), and it counts
    /// before it publishes, so a round never sleeps under `wait.empty` on a core a
    /// cancel emptied after `decided` was read. Otherwise the purgatory, whose
    /// completions' cancels are applied at the start of a round, slept without limit
    /// though those completions had made a purge due.
    pub(crate) fn advance_with(
        &self,
        wait: NextRound,
        decided: u64,
        expired: &mut Vec<T>,
        before_sleep: impl FnOnce(Option<Instant>),
    ) -> Fired {
        let fired = self.fire_due(expired);
        if fired.count > 0 || self.closed.load(Ordering::SeqCst) {
            return fired;
        }
        let earliest = self.earliest();
        let max_wait = if earliest == IDLE {
            if self.idled() != decided {
                return fired;
            }
            wait.empty
        } else {
            wait.queued
        };
        if max_wait.is_zero() {
            return fired;
        }
        let now = self.now_nanos();
        let limit = now.saturating_add(saturating_nanos(max_wait));
        let wake_nanos = earliest.saturating_mul(self.tick_nanos.get()).min(limit);
        if wake_nanos <= now {
            // A bucket came due since `fire_due` looked (an add raced it): fire it now
            // rather than going through the condition variable.
            return self.fire_due(expired);
        }
        // An empty core sleeping longer than a queued one may must be woken by the first
        // add, however late its bucket: from then on the shorter bound applies. Planning
        // to wake at `IDLE` makes every add that queues a shard's first task notify, and
        // the recheck catches one that came before the plan was published.
        let wake_tick = if earliest == IDLE && wait.queued < wait.empty {
            IDLE
        } else {
            wake_nanos / self.tick_nanos
        };
        let timeout = (wake_nanos != u64::MAX).then(|| Duration::from_nanos(wake_nanos - now));
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        before_sleep(deadline);
        self.sleeper.sleep(wake_tick, timeout, |wake_tick| {
            self.closed.load(Ordering::SeqCst) || self.earliest() < wake_tick
        });
        self.fire_due(expired)
    }
}

impl<T> TimerCore<T> {
    /// Schedules `task` to run once `delay` has passed: at the first advance at or after
    /// the deadline rounded up to a tick boundary (a zero delay included: added half a
    /// tick in, it fires at the next boundary; never on the calling thread). A deadline beyond the
    /// wheel's range is clamped to its end: with wheel sizes up to 256 (the default is 256)
    /// the range exceeds every deadline a `u64` of nanoseconds can hold, so nothing is
    /// clamped; larger sizes cover less (at least `2^46.5` ticks: about 3 years at a 1 us
    /// tick, 3,000 years at 1 ms), and a later deadline fires at the range's end.
    ///
    /// Returns a handle for [`cancel`](Self::cancel), or the task back if the timer has
    /// been shut down.
    pub fn add(&self, delay: Duration, task: T) -> Result<TimerHandle, AddError<T>> {
        let now = self.now_nanos();
        self.add_at_nanos(now, now.saturating_add(saturating_nanos(delay)), task)
    }

    /// Schedules `task` to run at `deadline`, a time on this timer's clock (see
    /// [`now`](Self::now)). Lets a caller that adds many tasks read the clock once.
    pub fn add_at(&self, deadline: Duration, task: T) -> Result<TimerHandle, AddError<T>> {
        let now = self.now_nanos();
        self.add_at_nanos(now, saturating_nanos(deadline), task)
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
        self.add_batch_from(tasks.drain(..), out);
    }

    /// [`add_batch`](Self::add_batch) of the `(delay, task)`s `tasks` gives, taken from
    /// it as they are added, with no vector of them made first (`tasks.len()` must be
    /// exact: a batch that made one cost its caller 18 instructions a task more). The
    /// iterator runs with a shard's lock held: it must be quick, must not panic (the
    /// tasks added before would stay added, their earliest deadline not yet published to
    /// the driver), and must not call this timer.
    pub fn add_batch_from(
        &self,
        tasks: impl ExactSizeIterator<Item = (Duration, T)>,
        out: &mut Vec<Result<TimerHandle, AddError<T>>>,
    ) {
        let now = self.now_nanos();
        out.reserve(tasks.len());
        let at = tasks.map(|(delay, task)| (now.saturating_add(saturating_nanos(delay)), task));
        self.add_many(now, at, out);
    }

    /// The current time of this timer's clock (for a clock that panics, the last good
    /// reading; see `TimerStats::clock_panics`).
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now_nanos())
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

    /// Moves the deadline of the pending task `handle` names to `delay` from now (rounded
    /// up to a tick, clamped as by [`add`](Self::add); a zero delay makes it due at the
    /// next tick boundary). Returns `false`, and changes nothing, when the handle is
    /// stale: the task already expired (it has run, is running, or was handed to the
    /// advancing thread), was cancelled, or the timer's shutdown has begun (from the moment
    /// [`is_shutdown`](Self::is_shutdown) reads true). Exactly one of a
    /// reset and an expiry that race wins; a task never fires at a deadline a won reset
    /// replaced. O(1), and the handle stays valid: the task keeps its entry.
    ///
    /// A deadline already passed but not yet fired (no advance has reached it) can still
    /// be moved: until an advance takes the task out, it is pending.
    pub fn reset(&self, handle: TimerHandle, delay: Duration) -> bool {
        let now = self.now_nanos();
        self.reset_at_nanos(handle, now, now.saturating_add(saturating_nanos(delay)))
    }

    /// [`reset`](Self::reset) to `deadline`, a time on this timer's clock (see
    /// [`now`](Self::now)).
    pub fn reset_at(&self, handle: TimerHandle, deadline: Duration) -> bool {
        let now = self.now_nanos();
        self.reset_at_nanos(handle, now, saturating_nanos(deadline))
    }

    fn reset_at_nanos(&self, handle: TimerHandle, now: u64, deadline: u64) -> bool {
        // Once closed (shutdown has begun), nothing moves: the task is shutdown's to hand
        // back, and a caller told `true` would count on a deadline that never comes. A
        // reset that read "open" just before a concurrent close is ordered before it.
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        let Some(shard) = self.shard_of(handle) else {
            return false;
        };
        let expiration = self.ticks_ceil(deadline);
        let mut state = shard.state.lock();
        if !self.catch_up(&mut state, now) {
            return false;
        }
        if !state.wheel.reset(handle.key, expiration) {
            return false;
        }
        let earlier = publish_moved(shard, &state);
        drop(state);
        if let Some(next) = earlier {
            self.sleeper.wake_if_later_than(next);
        }
        true
    }

    /// Cancels every task `handles` names, like [`cancel`](Self::cancel) on each, and
    /// appends the tasks whose cancel won to `cancelled`; returns how many that was.
    /// Handles that are stale or from another timer cancel nothing.
    ///
    /// Cheaper per task than one `cancel` each: `handles` is grouped in place by shard
    /// (where they are of more than one), and each shard lock is taken once per run of
    /// at most 64 of its handles (so an adder never waits behind a long batch), reading
    /// the run's entries and their neighbours in two sweeps before any is unlinked. The
    /// tasks are appended after each lock is released. Buckets the batch empties leave the
    /// bucket queue when they are a shard's earliest, so [`next_expiration`](
    /// Self::next_expiration) and the driver's next sleep go to the next bucket with a
    /// task (a single [`cancel`](Self::cancel) leaves that to the next advance). A shard
    /// the batch empties whole keeps its expiration until an advance reaches it, so a
    /// driver keeps the bound it has while a task is queued (`NextRound::queued`) until
    /// then.
    pub fn cancel_batch(
        &self,
        handles: &mut [TimerHandle],
        cancelled: &mut impl Extend<T>,
    ) -> usize {
        // Grouped by shard only where they are not all of one (the common case: a
        // thread adds to its own shard). Sorting every batch by shard and slot cost 114
        // instructions a cancel in batches of 64 (callgrind, `forced_batches`), for an
        // order the two read sweeps of `prefetch_cancels` make moot.
        let one_shard = handles
            .split_first()
            .is_none_or(|(first, rest)| rest.iter().all(|h| h.shard == first.shard));
        if !one_shard {
            // Unstable: a stable sort allocates a buffer past about 20 handles, and the
            // order within a shard does not matter (see above).
            handles.sort_unstable_by_key(|h| h.shard);
        }
        let mut won = 0;
        // Sized for a whole run at once: grown push by push, from 4 to 64, it was
        // reallocated four times a call (43 instructions a cancel, `forced_batches`).
        let mut run: Vec<T> = Vec::with_capacity(handles.len().min(CANCEL_BATCH));
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
            let Some(shard) = self.shards.get(first.shard as usize) else {
                continue;
            };
            {
                let mut state = shard.state.lock();
                state.wheel.prefetch_cancels(chunk.iter().map(|h| h.key));
                for handle in chunk {
                    if handle.timer != self.id {
                        continue;
                    }
                    if let Some(task) = state.wheel.cancel_prefetched(handle.key) {
                        run.push(task);
                    }
                }
                state.cancelled += run.len() as u64;
                if !run.is_empty() {
                    // The driver's next sleep skips the buckets these cancels emptied.
                    // Cancels move the earliest expiration later or leave it, and the one
                    // published is never later than the wheel's: nobody needs waking.
                    state.wheel.drop_emptied_front();
                    // If an add found a due bucket and stopped catching up (next tick
                    // `u64::MAX`), that bucket may be gone now, and no advance would
                    // come to clear the mark: the next add tries again (and marks it
                    // again if a due bucket is left).
                    if state.next_tick_nanos == u64::MAX {
                        self.moved(&mut state);
                    }
                    // A shard they emptied whole keeps the expiration it published: a
                    // driver then still waits under its bound for a queued timer and
                    // looks again by then, as an owner that is not woken by the
                    // completions behind these cancels counts on (the purgatory's purge
                    // after them); the advance that reaches it publishes it idle.
                    if !state.wheel.is_empty() {
                        let earlier = publish_moved(shard, &state);
                        debug_assert_eq!(earlier, None, "a cancel made a bucket due earlier");
                    }
                }
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
        if handle.timer != self.id {
            return None;
        }
        self.shards.get(handle.shard as usize)
    }

    /// Moves every task that is due into `expired`; then, if none was, waits up to
    /// `max_wait` for the earliest bucket to come due (or for an earlier one to be added,
    /// or for [`shutdown`](Self::shutdown)) and moves what is due then. Returns how many
    /// tasks expired. With `Duration::ZERO` it never waits; after shutdown it moves
    /// nothing. A call that leaves the core empty by taking due buckets whose tasks were
    /// all cancelled returns 0 without waiting. The caller runs (or drops) the expired
    /// tasks: nothing here runs them.
    pub fn advance_into(&self, max_wait: Duration, expired: &mut Vec<T>) -> usize {
        let decided = self.idled();
        self.advance_with(NextRound::at_most(max_wait), decided, expired, |_| {})
            .count
    }

    /// Wakes a thread blocked in [`advance_into`](Self::advance_into).
    pub fn wake(&self) {
        self.sleeper.wake();
    }

    /// For a driver that does not sleep in [`advance_into`](Self::advance_into) but
    /// elsewhere (an async task, which must not block its thread): `hook` is called by
    /// [`wake`](Self::wake), by [`shutdown`](Self::shutdown), and by every add that
    /// queues a task earlier than every task already queued in its shard. Such a driver
    /// advances with `Duration::ZERO`, reads [`next_expiration`](Self::next_expiration),
    /// and waits until then or until the hook is called: an add before the read is seen
    /// by it, an add after it calls the hook, so the hook must remember a call made
    /// before the driver starts waiting (as `tokio::sync::Notify::notify_one` does).
    /// Keep it short and non-blocking: it runs on the adding thread. At most one hook;
    /// returns false, dropping `hook`, if one is set already.
    pub fn set_wake_hook(&self, hook: impl Fn() + Send + Sync + 'static) -> bool {
        self.sleeper
            .set_hook(crate::sleeper::WakeHook(Box::new(hook)))
    }

    /// When the earliest queued bucket is due, on this timer's clock; `None` when idle.
    pub fn next_expiration(&self) -> Option<Duration> {
        match self.earliest() {
            IDLE => None,
            tick => Some(Duration::from_nanos(
                tick.saturating_mul(self.tick_nanos.get()),
            )),
        }
    }

    /// Number of pending tasks.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.state.lock().wheel.len()).sum()
    }

    /// Whether no task is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters summed over all shards.
    pub fn stats(&self) -> TimerStats {
        let mut stats = TimerStats::default();
        for shard in self.shards.iter() {
            let state = shard.state.lock();
            stats.pending += state.wheel.len();
            stats.added += state.added;
            stats.cancelled += state.cancelled;
            stats.expired += state.expired;
            stats.entry_bytes += state.wheel.entry_bytes();
        }
        stats.clock_panics = self.clock.panics();
        stats.stand_ins = self.relief.started.load(Ordering::Relaxed);
        stats.stand_in_limit_reached = self.relief.limit_reached.load(Ordering::Relaxed);
        stats
    }

    /// The relief machinery's counts (`stand_in.rs`).
    pub(crate) fn relief(&self) -> &ReliefCounts {
        &self.relief
    }

    /// How long ago the earliest queued bucket came due, in nanoseconds on the timer's
    /// clock (negative: how long until it does); `None` while nothing is queued. Runs no
    /// user code: a user clock is not read, its last good reading stands in (every add
    /// and round reads it), so the watchdog may call this (`stand_in.rs`).
    pub(crate) fn overdue_nanos(&self) -> Option<i128> {
        match self.earliest() {
            IDLE => None,
            tick => {
                let due = i128::from(tick) * i128::from(self.tick_nanos.get());
                Some(i128::from(self.clock.peek_nanos()) - due)
            }
        }
    }

    /// Reads of the clock that panicked (`TimerStats::clock_panics`), without locking.
    pub fn clock_panics(&self) -> u64 {
        self.clock.panics()
    }

    /// Gives back the memory of entry slots a burst left unused: each shard whose
    /// tasks are at most a quarter of its slots drops the free slots above its last one
    /// in use (keys to them stay stale: a slot made again starts above their
    /// generations), at most 32,768 of them a call (about 0.3 ms under the shard's lock):
    /// call again while it returns more than 0. Returns how many slots were dropped.
    /// Locks each shard once; call it between rounds, not on a hot path (a purgatory's
    /// reaper does). The memory goes when a shard's give-back ends, freed here, outside
    /// the shard's lock.
    pub fn give_back(&self) -> usize {
        self.give_back_each(drop)
    }

    /// [`give_back`](Self::give_back), the memory it frees handed to `free` instead (to
    /// be dropped on another thread: freeing a large block unmaps it, which can take
    /// milliseconds, and meanwhile every other change to the process's mappings waits).
    pub fn give_back_elsewhere(&self, mut free: impl FnMut(Box<dyn Send>)) -> usize
    where
        T: Send + 'static,
    {
        self.give_back_each(|spare| free(Box::new(spare)))
    }

    /// One give-back step in each shard; what a shard's last step frees goes to
    /// `spare`, outside its lock.
    fn give_back_each(&self, mut spare: impl FnMut(Spare<T>)) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let (slots, freed) = shard.state.lock().wheel.give_back_step();
                if let Some(freed) = freed {
                    spare(freed);
                }
                slots
            })
            .sum()
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub fn is_shutdown(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Refuses every later add, wakes every thread waiting in
    /// [`advance_into`](Self::advance_into) and hands back every task still pending,
    /// unrun. A second call returns nothing. (A [`Driver`](crate::Driver) closes, then
    /// waits for its rounds, then drains: use its shutdown when one drives this core.)
    pub fn shutdown(&self) -> Vec<T> {
        if self.close() {
            self.drain()
        } else {
            Vec::new()
        }
    }

    /// Refuses every later add and wakes every sleeping driver; a round that fires after
    /// this fires nothing. Returns whether this call closed it.
    pub(crate) fn close(&self) -> bool {
        // Every shard first, each under its lock: an add refused by none of them took
        // its shard's lock before, and its task is there for the drain (module doc).
        for shard in self.shards.iter() {
            self.close_shard(&mut shard.state.lock());
        }
        let first = !self.closed.swap(true, Ordering::SeqCst);
        self.sleeper.wake();
        first
    }

    /// Empties every shard of a closed core, handing back its tasks; every later add to a
    /// shard is refused by the shard itself.
    pub(crate) fn drain(&self) -> Vec<T> {
        let mut pending = Vec::new();
        for shard in self.shards.iter() {
            let mut state = shard.state.lock();
            self.close_shard(&mut state);
            pending.extend(state.wheel.drain());
            shard.next_expiration.store(IDLE, Ordering::SeqCst);
        }
        pending
    }
}

impl<T> TimerCore<T> {
    /// Closes a locked shard: it refuses adds and resets from now on.
    fn close_shard(&self, state: &mut ShardState<T>) {
        state.closed = true;
        self.moved(state);
    }
}

impl<T> std::fmt::Debug for TimerCore<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerCore")
            .field("shards", &self.shards.len())
            .field("tick_nanos", &self.tick_nanos)
            .field("closed", &self.is_shutdown())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, feature = "serde"))]
mod serde_tests {
    use super::TimerStats;

    #[test]
    fn timer_stats_serialize_under_their_field_names_and_read_back() {
        let stats = TimerStats {
            pending: 1,
            added: 2,
            cancelled: 3,
            expired: 4,
            panicked: 5,
            clock_panics: 6,
            stand_ins: 7,
            stand_in_limit_reached: 8,
            entry_bytes: 9,
        };
        let json = serde_json::to_value(stats).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "pending": 1, "added": 2, "cancelled": 3, "expired": 4,
                "panicked": 5, "clock_panics": 6, "stand_ins": 7,
                "stand_in_limit_reached": 8, "entry_bytes": 9,
            })
        );
        assert_eq!(serde_json::from_value::<TimerStats>(json).unwrap(), stats);
        // A field missing from an older snapshot reads as 0.
        let old: TimerStats = serde_json::from_str(r#"{"pending": 7}"#).unwrap();
        assert_eq!((old.pending, old.clock_panics), (7, 0));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{ManualClock, TimerBuilder};

    const MS: Duration = Duration::from_millis(1);

    /// A one-shard core of 1 ms ticks, 20 buckets a level, on a manual clock at 0.
    fn core() -> (TimerCore<&'static str>, ManualClock) {
        let clock = ManualClock::new();
        let core = TimerBuilder::new()
            .tick(MS)
            .wheel_size(20)
            .shards(1)
            .clock(clock.clone())
            .build_core()
            .unwrap();
        (core, clock)
    }

    fn next_tick_nanos<T>(core: &TimerCore<T>) -> u64 {
        core.shards[0].state.lock().next_tick_nanos
    }

    fn current_tick<T>(core: &TimerCore<T>) -> u64 {
        core.shards[0].state.lock().wheel.current_tick()
    }

    /// Moves the clock to `at` ms and advances without waiting; returns what fired.
    fn fire_at(core: &TimerCore<&'static str>, clock: &ManualClock, at: u64) -> Vec<&'static str> {
        clock.set(Duration::from_millis(at));
        let mut fired = Vec::new();
        core.advance_into(Duration::ZERO, &mut fired);
        fired.sort_unstable();
        fired
    }

    /// `entry_bytes` counts the slab's room: none before the first add, at least an
    /// entry a task while they wait, and it shrinks once a burst's room is given back.
    #[test]
    fn entry_bytes_follow_the_slabs_room() {
        let (core, _clock) = core();
        assert_eq!(core.stats().entry_bytes, 0);
        let handles: Vec<_> = (0..100_000)
            .map(|_| core.add(Duration::from_secs(10), "t").unwrap())
            .collect();
        let entry = std::mem::size_of::<crate::wheel::EntryOf<&'static str>>();
        let grown = core.stats().entry_bytes;
        assert!(grown >= 100_000 * entry, "{grown}");
        assert!(grown <= 2 * 100_000 * entry, "{grown}");
        // Last first: the cancels whose unlinks wait (`deferred_unlinks.rs`) keep the
        // lowest slots, not the top ones the give-back drops.
        for handle in handles.into_iter().rev() {
            assert!(core.cancel(handle).is_some());
        }
        while core.give_back() > 0 {}
        let kept = core.stats().entry_bytes;
        assert!(kept < grown / 4, "{kept} of {grown}");
    }

    /// An add that finds a bucket due marks the shard's next tick `u64::MAX`, and the
    /// adds after it place their tasks against the wheel's old time (at level 0 and,
    /// past its interval, at level 1, in a bucket that starts before their deadline);
    /// none fires before its deadline nor after its tick. A batch cancel that takes that
    /// bucket off the queue (no advance comes for it then) sets the next tick back to
    /// the wheel's, so the next add catches up; a batch cancel that leaves a due bucket
    /// does too, and that add marks it again.
    #[test]
    fn adds_against_a_wheel_held_behind_by_a_due_bucket_fire_on_time() {
        let (core, clock) = core();
        let due = core.add(MS, "due").unwrap();
        let also_due = core.add(2 * MS, "also due").unwrap();
        core.add(Duration::from_secs(3600), "far").unwrap();
        clock.set(5 * MS);
        // Finds tick 1 due: the wheel stays at 0, the next tick at u64::MAX.
        core.add(10 * MS, "at 15").unwrap();
        assert_eq!((current_tick(&core), next_tick_nanos(&core)), (0, u64::MAX));
        // Placed against tick 0, not 5: no catch-up while the next tick is u64::MAX.
        core.add(MS, "at 6").unwrap();
        core.add(30 * MS, "at 35").unwrap(); // level 1, the bucket starting at 20
        let moved = core.add(40 * MS, "reset to 9").unwrap();
        assert!(core.reset(moved, 4 * MS));
        assert_eq!((current_tick(&core), next_tick_nanos(&core)), (0, u64::MAX));
        // The first due bucket cancelled whole; the one at tick 2 is still due: the
        // mark is cleared, and the next add finds tick 2 and sets it again.
        let mut cancelled = Vec::new();
        assert_eq!(core.cancel_batch(&mut [due], &mut cancelled), 1);
        assert_eq!(
            (current_tick(&core), next_tick_nanos(&core)),
            (0, 1_000_000)
        );
        core.add(3 * MS, "at 8").unwrap();
        assert_eq!((current_tick(&core), next_tick_nanos(&core)), (0, u64::MAX));
        // The second cancelled whole: nothing is due at 5 ms, the mark is cleared, and
        // the next add catches the wheel up to the clock.
        assert_eq!(core.cancel_batch(&mut [also_due], &mut cancelled), 1);
        assert_eq!(core.next_expiration(), Some(6 * MS));
        assert_eq!(
            (current_tick(&core), next_tick_nanos(&core)),
            (0, 1_000_000)
        );
        core.add(2 * MS, "at 7").unwrap();
        assert_eq!(
            (current_tick(&core), next_tick_nanos(&core)),
            (5, 6_000_000)
        );
        assert_eq!(fire_at(&core, &clock, 5), Vec::<&str>::new());
        assert_eq!(fire_at(&core, &clock, 6), ["at 6"]);
        assert_eq!(fire_at(&core, &clock, 7), ["at 7"]);
        assert_eq!(fire_at(&core, &clock, 8), ["at 8"]);
        // The advances moved the wheel, and its next tick with it.
        assert_eq!(
            (current_tick(&core), next_tick_nanos(&core)),
            (8, 9_000_000)
        );
        assert_eq!(fire_at(&core, &clock, 9), ["reset to 9"]);
        assert_eq!(fire_at(&core, &clock, 14), Vec::<&str>::new());
        assert_eq!(fire_at(&core, &clock, 15), ["at 15"]);
        for at in 16..35 {
            assert_eq!(fire_at(&core, &clock, at), Vec::<&str>::new(), "at {at} ms");
        }
        assert_eq!(fire_at(&core, &clock, 35), ["at 35"]);
        assert_eq!(core.len(), 1);
        assert_eq!(core.shutdown(), ["far"]);
    }

    /// A shard whose next tick is `u64::MAX` (a due bucket stopped an add's catch-up)
    /// still refuses adds and resets once closed: closing sets it to 0.
    #[test]
    fn a_shard_marked_behind_refuses_adds_and_resets_once_closed() {
        let (core, clock) = core();
        core.add(MS, "due").unwrap();
        clock.set(5 * MS);
        let pending = core.add(10 * MS, "pending").unwrap();
        assert_eq!(next_tick_nanos(&core), u64::MAX);
        assert!(core.close());
        assert_eq!(next_tick_nanos(&core), 0);
        assert!(matches!(
            core.add(MS, "late"),
            Err(AddError::Shutdown("late"))
        ));
        assert!(!core.reset(pending, MS));
        let mut drained = core.drain();
        drained.sort_unstable();
        assert_eq!(drained, ["due", "pending"]);
    }
}
