//! Property tests: random schedules of add, cancel and clock moves, checked step by step
//! against a reference model that is just a map of pending deadlines.
//!
//! The model's rules (semantics.md section 1, and the timer's own docs):
//! - a task's expiration tick is its deadline rounded *up* to a tick; the clock's tick is
//!   its reading rounded *down*;
//! - a pending task runs exactly at the first `advance_clock` whose clock tick reaches its
//!   expiration tick (so never before its deadline, and on a manual clock at most one tick
//!   after it), exactly once, and never on the thread that adds or cancels;
//! - `cancel` gives the task back exactly when the model still holds it; a stale handle
//!   (fired, cancelled) gives nothing back and changes nothing;
//! - `len()` and every counter of `stats()` match the model after every step;
//! - `shutdown` hands back exactly the tasks the model still holds, and later adds are
//!   refused with the task given back.
//!
//! The same is checked directly on [`Wheel`], in ticks, including where each pending task
//! sits (its bucket's range must contain its expiration).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use timer_core::{
    AddError, Clock, ManualClock, SlotKey, Timer, TimerBuilder, TimerHandle, TimerTask, Wheel,
};

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------
// The thread-safe timer against the model.

/// A task that logs `(id, clock reading in ns)` when it runs.
struct Probe {
    id: usize,
    clock: ManualClock,
    log: Arc<Mutex<Vec<(usize, u64)>>>,
}

impl TimerTask for Probe {
    fn run(self) {
        let now = nanos(self.clock.now());
        self.log.lock().unwrap().push((self.id, now));
    }
}

#[derive(Clone, Debug)]
enum TimerOp {
    /// `add(delay)` from adder thread `via`.
    Add { delay: Duration, via: usize },
    /// `add_at(now + offset)` or, when `past`, `add_at(now - offset)`, from thread `via`.
    AddAt {
        offset: Duration,
        past: bool,
        via: usize,
    },
    /// Cancel the handle returned by the `pick`-th add (modulo the adds so far).
    Cancel { pick: usize },
    /// Cancel the handles of the `picks`-th adds in one `cancel_batch` (repeats allowed).
    CancelBatch { picks: Vec<usize> },
    /// Move the deadline of the `pick`-th add's task to `delay` from now (`reset`), or,
    /// when `at`, to the time `delay` (`reset_at`, in the past once the clock passed it).
    Reset {
        pick: usize,
        delay: Duration,
        at: bool,
    },
    /// Move the clock, then call `advance_clock(ZERO)` if `drive`.
    Move { by: Duration, drive: bool },
}

fn delay_strategy() -> impl Strategy<Value = Duration> {
    prop_oneof![
        3 => Just(Duration::ZERO),
        6 => (0u64..5_000_000).prop_map(Duration::from_nanos),
        6 => (0u64..2_000).prop_map(Duration::from_millis),
        3 => (0u64..100_000).prop_map(Duration::from_secs),
        1 => (0u64..=u64::MAX).prop_map(Duration::from_nanos),
        1 => Just(Duration::MAX),
    ]
}

fn move_strategy() -> impl Strategy<Value = Duration> {
    prop_oneof![
        2 => Just(Duration::ZERO),
        6 => (0u64..5_000_000).prop_map(Duration::from_nanos),
        6 => (0u64..100).prop_map(Duration::from_millis),
        2 => (0u64..20_000).prop_map(Duration::from_millis),
        1 => (0u64..200_000).prop_map(Duration::from_secs),
        1 => (0u64..(1 << 62)).prop_map(Duration::from_nanos),
    ]
}

fn timer_op_strategy() -> impl Strategy<Value = TimerOp> {
    prop_oneof![
        5 => (delay_strategy(), 0usize..8).prop_map(|(delay, via)| TimerOp::Add { delay, via }),
        2 => (delay_strategy(), any::<bool>(), 0usize..8)
            .prop_map(|(offset, past, via)| TimerOp::AddAt { offset, past, via }),
        3 => any::<usize>().prop_map(|pick| TimerOp::Cancel { pick }),
        2 => prop::collection::vec(any::<usize>(), 1..6)
            .prop_map(|picks| TimerOp::CancelBatch { picks }),
        3 => (any::<usize>(), delay_strategy(), prop::bool::weighted(0.2))
            .prop_map(|(pick, delay, at)| TimerOp::Reset { pick, delay, at }),
        4 => (move_strategy(), prop::bool::weighted(0.8))
            .prop_map(|(by, drive)| TimerOp::Move { by, drive }),
    ]
}

#[derive(Clone, Copy, Debug)]
struct Expected {
    deadline: u64,
    expiration_tick: u64,
}

/// The reference model: pending tasks by id, plus the counters the timer must report.
struct TimerModel {
    tick: u64,
    now: u64,
    pending: BTreeMap<usize, Expected>,
    added: u64,
    cancelled: u64,
    expired: u64,
}

impl TimerModel {
    fn expect(&self, deadline: u64) -> Expected {
        Expected {
            deadline,
            expiration_tick: deadline.div_ceil(self.tick),
        }
    }

    /// Removes and returns the tasks an advance at the current clock must run.
    fn take_due(&mut self) -> BTreeMap<usize, Expected> {
        let now_tick = self.now / self.tick;
        let due: Vec<usize> = self
            .pending
            .iter()
            .filter(|(_, e)| e.expiration_tick <= now_tick)
            .map(|(id, _)| *id)
            .collect();
        due.into_iter()
            .map(|id| (id, self.pending.remove(&id).unwrap()))
            .collect()
    }
}

/// A request to one adder thread: the task and `Ok(delay)` for `add`, or
/// `Err(deadline)` for `add_at`.
type AddRequest = (Probe, Result<Duration, Duration>);
type AddReply = Result<TimerHandle, AddError<Probe>>;

/// Threads that add on the test's behalf, so the adds spread over the timer's shards (each
/// thread adds to its own shard).
struct Adders {
    senders: Vec<mpsc::Sender<(AddRequest, mpsc::Sender<AddReply>)>>,
}

impl Adders {
    fn add(&self, via: usize, request: AddRequest) -> AddReply {
        let (tx, rx) = mpsc::channel();
        self.senders[via % self.senders.len()]
            .send((request, tx))
            .unwrap();
        rx.recv().unwrap()
    }
}

fn check_timer_against_model(
    tick: Duration,
    wheel_size: u32,
    shards: usize,
    ops: &[TimerOp],
) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let timer: Timer<Probe> = TimerBuilder::new()
        .tick(tick)
        .wheel_size(wheel_size)
        .shards(shards)
        .clock(clock.clone())
        .reaper(false)
        .build()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let probe = |id| Probe {
        id,
        clock: clock.clone(),
        log: Arc::clone(&log),
    };
    let take_log = || std::mem::take(&mut *log.lock().unwrap());

    std::thread::scope(|scope| {
        let mut senders = Vec::new();
        for _ in 0..shards {
            let (tx, rx) = mpsc::channel::<(AddRequest, mpsc::Sender<AddReply>)>();
            let timer = &timer;
            scope.spawn(move || {
                for ((task, when), reply) in rx {
                    let result = match when {
                        Ok(delay) => timer.add(delay, task),
                        Err(deadline) => timer.add_at(deadline, task),
                    };
                    let _ = reply.send(result);
                }
            });
            senders.push(tx);
        }
        let adders = Adders { senders };

        let mut model = TimerModel {
            tick: nanos(tick),
            now: 0,
            pending: BTreeMap::new(),
            added: 0,
            cancelled: 0,
            expired: 0,
        };
        let mut handles: Vec<(usize, TimerHandle)> = Vec::new();

        for op in ops {
            match *op {
                TimerOp::Add { delay, via } => {
                    let id = handles.len();
                    let deadline = model.now.saturating_add(nanos(delay));
                    let handle = adders
                        .add(via, (probe(id), Ok(delay)))
                        .map_err(|_| TestCaseError::fail("add refused before shutdown"))?;
                    model.pending.insert(id, model.expect(deadline));
                    model.added += 1;
                    handles.push((id, handle));
                }
                TimerOp::AddAt { offset, past, via } => {
                    let id = handles.len();
                    let deadline = if past {
                        model.now.saturating_sub(nanos(offset))
                    } else {
                        model.now.saturating_add(nanos(offset))
                    };
                    let handle = adders
                        .add(via, (probe(id), Err(Duration::from_nanos(deadline))))
                        .map_err(|_| TestCaseError::fail("add_at refused before shutdown"))?;
                    model.pending.insert(id, model.expect(deadline));
                    model.added += 1;
                    handles.push((id, handle));
                }
                TimerOp::Cancel { pick } => {
                    if handles.is_empty() {
                        continue;
                    }
                    let (id, handle) = handles[pick % handles.len()];
                    let pending = model.pending.contains_key(&id);
                    prop_assert_eq!(timer.is_pending(handle), pending);
                    match timer.cancel(handle) {
                        Some(task) => {
                            prop_assert!(pending, "cancel of a stale handle gave a task back");
                            prop_assert_eq!(task.id, id, "cancel gave back the wrong task");
                            model.pending.remove(&id);
                            model.cancelled += 1;
                        }
                        None => prop_assert!(!pending, "cancel lost to nobody"),
                    }
                    prop_assert!(!timer.is_pending(handle));
                }
                TimerOp::CancelBatch { ref picks } => {
                    if handles.is_empty() {
                        continue;
                    }
                    let chosen: Vec<(usize, _)> =
                        picks.iter().map(|p| handles[p % handles.len()]).collect();
                    let expected: BTreeSet<usize> = chosen
                        .iter()
                        .map(|(id, _)| *id)
                        .filter(|id| model.pending.contains_key(id))
                        .collect();
                    let mut batch: Vec<_> = chosen.iter().map(|(_, h)| *h).collect();
                    let mut back = Vec::new();
                    let won = timer.cancel_batch(&mut batch, &mut back);
                    let got: BTreeSet<usize> = back.iter().map(|t| t.id).collect();
                    prop_assert_eq!(won, back.len());
                    prop_assert_eq!(back.len(), got.len(), "a task was given back twice");
                    prop_assert_eq!(&got, &expected, "cancel_batch gave back the wrong tasks");
                    for id in &got {
                        model.pending.remove(id);
                    }
                    model.cancelled += got.len() as u64;
                    for (_, handle) in &chosen {
                        prop_assert!(!timer.is_pending(*handle));
                    }
                }
                TimerOp::Reset { pick, delay, at } => {
                    if handles.is_empty() {
                        continue;
                    }
                    let (id, handle) = handles[pick % handles.len()];
                    let pending = model.pending.contains_key(&id);
                    let moved = if at {
                        timer.reset_at(handle, delay)
                    } else {
                        timer.reset(handle, delay)
                    };
                    prop_assert_eq!(moved, pending, "reset of task {}", id);
                    if pending {
                        let deadline = if at {
                            nanos(delay)
                        } else {
                            model.now.saturating_add(nanos(delay))
                        };
                        model.pending.insert(id, model.expect(deadline));
                    }
                    prop_assert_eq!(timer.is_pending(handle), pending, "reset keeps the handle");
                }
                TimerOp::Move { by, drive } => {
                    clock.advance(by);
                    model.now = model.now.saturating_add(nanos(by));
                    prop_assert_eq!(nanos(clock.now()), model.now);
                    if drive {
                        let due = model.take_due();
                        let n = timer.advance_clock(Duration::ZERO);
                        let ran = take_log();
                        prop_assert_eq!(n, due.len(), "advance_clock's count");
                        let ran_ids: BTreeSet<usize> = ran.iter().map(|(id, _)| *id).collect();
                        prop_assert_eq!(ran_ids.len(), ran.len(), "a task ran twice");
                        let due_ids: BTreeSet<usize> = due.keys().copied().collect();
                        prop_assert_eq!(&ran_ids, &due_ids, "tasks run at {} ns", model.now);
                        for (id, at) in ran {
                            let expected = due[&id];
                            prop_assert!(at >= expected.deadline, "task {} ran early", id);
                            prop_assert_eq!(at, model.now);
                        }
                        model.expired += due.len() as u64;
                    }
                }
            }
            prop_assert!(take_log().is_empty(), "a task ran outside advance_clock");
            prop_assert_eq!(timer.len(), model.pending.len());
            let stats = timer.stats();
            prop_assert_eq!(stats.pending, model.pending.len());
            prop_assert_eq!(stats.added, model.added);
            prop_assert_eq!(stats.cancelled, model.cancelled);
            prop_assert_eq!(stats.expired, model.expired);
            prop_assert_eq!(stats.panicked, 0);
            if let Some(first) = model.pending.values().map(|e| e.expiration_tick).min() {
                // A task whose deadline has passed is due at the current tick.
                let first = first.max(model.now / model.tick);
                let next = timer.next_expiration().map(nanos);
                prop_assert!(next.is_some(), "pending tasks but no next expiration");
                prop_assert!(
                    next.unwrap() <= first.saturating_mul(model.tick),
                    "next_expiration is later than the earliest pending task"
                );
            }
        }

        // Shutdown hands back exactly the pending tasks, unrun.
        let back: BTreeSet<usize> = timer.shutdown().into_iter().map(|t| t.id).collect();
        let pending: BTreeSet<usize> = model.pending.keys().copied().collect();
        prop_assert_eq!(back, pending);
        prop_assert!(take_log().is_empty());
        prop_assert_eq!(timer.len(), 0);
        for (_, handle) in &handles {
            prop_assert!(timer.cancel(*handle).is_none());
            prop_assert!(
                !timer.reset(*handle, Duration::ZERO),
                "a reset after shutdown"
            );
        }
        let id = handles.len();
        match adders.add(0, (probe(id), Ok(Duration::ZERO))) {
            Err(AddError::Shutdown(task)) => prop_assert_eq!(task.id, id),
            Err(other) => prop_assert!(false, "refused for another reason: {other}"),
            Ok(_) => prop_assert!(false, "add accepted after shutdown"),
        }
        prop_assert_eq!(timer.advance_clock(Duration::ZERO), 0);
        prop_assert!(take_log().is_empty());
        Ok(())
    })
}

fn tick_strategy() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::from_micros(1)),
        Just(Duration::from_millis(1)),
        Just(Duration::from_millis(3)),
        Just(Duration::from_nanos(1_234_567)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn timer_matches_the_model(
        tick in tick_strategy(),
        wheel_size in prop_oneof![Just(2u32), Just(3), Just(8), Just(20), Just(64), Just(256)],
        shards in 1usize..=4,
        ops in prop::collection::vec(timer_op_strategy(), 1..120),
    ) {
        check_timer_against_model(tick, wheel_size, shards, &ops)?;
    }
}

// ---------------------------------------------------------------------------------------
// The bare wheel against the model, in ticks.

/// The wheel's last tick: `u64::MAX` itself marks an unqueued bucket.
const LAST_TICK: u64 = u64::MAX - 1;

#[derive(Clone, Debug)]
enum WheelOp {
    /// Insert at `current + delta`, or `current - delta` when `past`.
    Insert {
        delta: u64,
        past: bool,
    },
    Cancel {
        pick: usize,
    },
    /// Move the `pick`-th insert's task to `current + delta` (`current - delta` when
    /// `past`).
    Reset {
        pick: usize,
        delta: u64,
        past: bool,
    },
    /// Advance to `current + delta`, or to `current - delta` (a no-op) when `back`.
    Advance {
        delta: u64,
        back: bool,
    },
}

fn ticks_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..4,
        4 => 0u64..100,
        3 => 0u64..10_000,
        2 => 0u64..1_000_000_000,
        1 => 0u64..1_000_000_000_000,
    ]
}

/// Inserts, cancels, advances and resets in the proportions
/// `insert : cancel : advance : reset`.
fn wheel_op_strategy(
    insert: u32,
    cancel: u32,
    advance: u32,
    reset: u32,
) -> impl Strategy<Value = WheelOp> {
    prop_oneof![
        reset => (any::<usize>(), ticks_strategy(), prop::bool::weighted(0.1))
            .prop_map(|(pick, delta, past)| WheelOp::Reset { pick, delta, past }),
        insert => (ticks_strategy(), prop::bool::weighted(0.1))
            .prop_map(|(delta, past)| WheelOp::Insert { delta, past }),
        cancel => any::<usize>().prop_map(|pick| WheelOp::Cancel { pick }),
        advance => (ticks_strategy(), prop::bool::weighted(0.1))
            .prop_map(|(delta, back)| WheelOp::Advance { delta, back }),
    ]
}

/// Checks that the task `key` with effective expiration `e` sits in a bucket whose range
/// `[start, start + tick_of_level)` holds `e` and does not lie in the past.
fn check_location(
    wheel: &Wheel<usize>,
    wheel_size: u32,
    key: SlotKey,
    e: u64,
) -> Result<(), TestCaseError> {
    let location = wheel.location(key);
    prop_assert!(location.is_some(), "pending task has no location");
    let (level, bucket, start) = location.unwrap();
    prop_assert!(level < wheel.levels());
    prop_assert!(bucket < wheel_size);
    let level_tick = u64::from(wheel_size).pow(level as u32);
    prop_assert_eq!(
        start,
        e - e % level_tick,
        "bucket range start (level {})",
        level
    );
    prop_assert_eq!(
        u64::from(bucket),
        (e / level_tick) % u64::from(wheel_size),
        "bucket index (level {})",
        level
    );
    prop_assert!(start >= wheel.current_tick(), "task sits in a past bucket");
    Ok(())
}

fn check_wheel_against_model(
    wheel_size: u32,
    start: u64,
    ops: &[WheelOp],
) -> Result<(), TestCaseError> {
    let mut wheel = Wheel::new(wheel_size, start);
    // The model: current tick and the effective expiration of each pending task.
    let mut current = start.min(LAST_TICK);
    let mut pending: BTreeMap<usize, u64> = BTreeMap::new();
    let mut keys: Vec<(usize, SlotKey)> = Vec::new();
    let mut latest = current;
    let mut out = Vec::new();

    for op in ops {
        match *op {
            WheelOp::Insert { delta, past } => {
                let e = if past {
                    current.saturating_sub(delta)
                } else {
                    current.saturating_add(delta)
                };
                let id = keys.len();
                let key = wheel.insert(e, id);
                // An expiration in the past is due at the current tick; time ends at
                // `u64::MAX - 1`.
                let effective = e.min(LAST_TICK).max(current);
                pending.insert(id, effective);
                latest = latest.max(effective);
                keys.push((id, key));
                prop_assert!(wheel.contains(key));
            }
            WheelOp::Cancel { pick } => {
                if keys.is_empty() {
                    continue;
                }
                let (id, key) = keys[pick % keys.len()];
                let was_pending = pending.remove(&id).is_some();
                prop_assert_eq!(wheel.cancel(key), was_pending.then_some(id));
                prop_assert!(!wheel.contains(key));
                prop_assert_eq!(wheel.location(key), None);
            }
            WheelOp::Reset { pick, delta, past } => {
                if keys.is_empty() {
                    continue;
                }
                let (id, key) = keys[pick % keys.len()];
                let e = if past {
                    current.saturating_sub(delta)
                } else {
                    current.saturating_add(delta)
                };
                let was_pending = pending.contains_key(&id);
                prop_assert_eq!(wheel.reset(key, e), was_pending);
                if was_pending {
                    let effective = e.min(LAST_TICK).max(current);
                    pending.insert(id, effective);
                    latest = latest.max(effective);
                }
                prop_assert_eq!(wheel.contains(key), was_pending);
            }
            WheelOp::Advance { delta, back } => {
                let now = if back {
                    current.saturating_sub(delta)
                } else {
                    current.saturating_add(delta)
                };
                let due: BTreeSet<usize> = pending
                    .iter()
                    .filter(|(_, e)| **e <= now)
                    .map(|(id, _)| *id)
                    .collect();
                out.clear();
                let n = wheel.advance(now, &mut out);
                prop_assert_eq!(n, out.len());
                let got: BTreeSet<usize> = out.iter().copied().collect();
                prop_assert_eq!(got.len(), out.len(), "a task was handed out twice");
                prop_assert_eq!(&got, &due, "advance to {}", now);
                let order: Vec<u64> = out.iter().map(|id| pending[id]).collect();
                prop_assert!(
                    order.windows(2).all(|w| w[0] <= w[1]),
                    "tasks handed out out of expiration order: {:?}",
                    order
                );
                for id in &out {
                    pending.remove(id);
                }
                current = current.max(now.min(LAST_TICK));
            }
        }
        prop_assert_eq!(wheel.current_tick(), current);
        prop_assert_eq!(wheel.len(), pending.len());
        prop_assert_eq!(wheel.is_empty(), pending.is_empty());
        prop_assert!(wheel.queued_buckets() <= wheel.levels() * wheel_size as usize);
        if let Some(first) = pending.values().min() {
            let next = wheel.next_expiration();
            prop_assert!(
                next.is_some_and(|n| n <= *first),
                "next expiration {:?}",
                next
            );
        }
        for (id, key) in &keys {
            match pending.get(id) {
                Some(e) => check_location(&wheel, wheel_size, *key, *e)?,
                None => prop_assert!(!wheel.contains(*key)),
            }
        }
    }

    // Everything left comes out once the clock passes the latest expiration, and the
    // bucket queue is then empty (buckets emptied by cancels included).
    out.clear();
    wheel.advance(latest, &mut out);
    let got: BTreeSet<usize> = out.iter().copied().collect();
    let left: BTreeSet<usize> = pending.keys().copied().collect();
    prop_assert_eq!(got, left);
    prop_assert!(wheel.is_empty());
    prop_assert_eq!(wheel.queued_buckets(), 0);
    prop_assert_eq!(wheel.next_expiration(), None);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn wheel_matches_the_model(
        wheel_size in prop_oneof![2u32..=5, Just(8), Just(20), Just(256)],
        start in prop_oneof![
            2 => Just(0u64),
            2 => 0u64..1_000_000,
            1 => (u64::MAX - (1 << 41))..=u64::MAX,
        ],
        ops in prop::collection::vec(wheel_op_strategy(5, 2, 3, 2), 1..150),
    ) {
        check_wheel_against_model(wheel_size, start, &ops)?;
    }

    /// Long runs of cancels between advances: every cancel leaves its entry linked, and
    /// once 8 are waiting each cancel unlinks the oldest (`deferred_unlinks.rs`), so
    /// neighbours of waiting entries get cancelled and unlinked in every order.
    #[test]
    fn wheel_matches_the_model_under_cancel_bursts(
        wheel_size in prop_oneof![2u32..=5, Just(20)],
        start in prop_oneof![Just(0u64), 0u64..1_000_000],
        ops in prop::collection::vec(wheel_op_strategy(6, 6, 1, 3), 1..200),
    ) {
        check_wheel_against_model(wheel_size, start, &ops)?;
    }
}

// ---------------------------------------------------------------------------------------
// The ends of the tick range (regressions: `advance_levels` overflowed near `u64::MAX`, and
// a task expiring at tick `u64::MAX` was linked into a bucket that was never queued).

#[test]
fn wheel_advances_to_the_last_tick_twice_without_overflow() {
    let mut wheel = Wheel::new(20, 0);
    wheel.insert(30, 'a');
    let mut out = Vec::new();
    assert_eq!(wheel.advance(u64::MAX, &mut out), 1);
    assert_eq!(wheel.advance(u64::MAX, &mut out), 0);
    assert_eq!(out, ['a']);
    // A task added at the end of time is still handed out.
    wheel.insert(u64::MAX, 'b');
    assert_eq!(wheel.advance(u64::MAX, &mut out), 1);
    assert_eq!(out, ['a', 'b']);
    assert!(wheel.is_empty());
}

#[test]
fn wheel_hands_out_a_task_expiring_at_u64_max() {
    for start in [u64::MAX - 100, u64::MAX - 1, u64::MAX] {
        let mut wheel = Wheel::new(20, start);
        let key = wheel.insert(u64::MAX, ());
        assert!(
            wheel.next_expiration().is_some(),
            "start {start}: task not queued"
        );
        let mut out = Vec::new();
        wheel.advance(u64::MAX - 50, &mut out);
        wheel.advance(u64::MAX, &mut out);
        assert_eq!(out.len(), 1, "start {start}: task lost");
        assert!(!wheel.contains(key));
        assert_eq!(wheel.queued_buckets(), 0);
    }
}

#[test]
fn wheel_clamps_beyond_its_range_but_not_within_it() {
    // The top level's range, as the wheel's docs state it: the largest power of the wheel
    // size that is at most 2^62.
    for size in [2u32, 3, 20, 256, 1000, 46_341, 65_536] {
        let mut range = u64::from(size);
        while let Some(next) = range.checked_mul(u64::from(size)).filter(|r| *r <= 1 << 62) {
            range = next;
        }
        // Within the range: fires exactly at its expiration.
        let mut wheel = Wheel::new(size, 0);
        let within = wheel.insert(range - 1, "within");
        let mut out = Vec::new();
        wheel.advance(range - 2, &mut out);
        assert!(out.is_empty(), "size {size}: fired early");
        assert!(wheel.contains(within));
        wheel.advance(range - 1, &mut out);
        assert_eq!(out, ["within"], "size {size}");
        // Beyond it: clamped to the range's last tick, never beyond it, and no panic.
        let mut wheel = Wheel::new(size, 0);
        wheel.insert(u64::MAX, "beyond");
        out.clear();
        wheel.advance(range - 2, &mut out);
        assert!(out.is_empty(), "size {size}: clamped below the range");
        wheel.advance(range - 1, &mut out);
        assert_eq!(out, ["beyond"], "size {size}: clamped past the range");
        assert!(
            range >= 1 << 46,
            "size {size}: range below the documented minimum"
        );
        if size <= 256 {
            // Every timer deadline (u64 nanoseconds at a tick of at least 1 us) fits.
            assert!(range > u64::MAX / 1_000, "size {size}");
        }
    }
}
