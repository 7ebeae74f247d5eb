//! One scenario's world: a purgatory of faulty user code on a faulty manual clock, driven
//! by the test thread (`advance_clock` stands for the reaper's rounds: the same code, and
//! a panic escaping it is what would have ended a reaper), and the ledger of what
//! became of every operation. Every call into the purgatory goes through [`World::call`],
//! which catches a panic that reaches the caller and records it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use purgatory::{
    Completion, ManualClock, OperationHandle, Purgatory, PurgatoryBuilder, TimerBuilder,
    WatchError, WatchOutcome,
};

use super::injector::{quiet, Kind, Run};
use super::user_types::{Faulty, FaultyClock, Key};
use crate::probe::{Ledger, Probe, Readiness};

/// Most operations one scenario makes.
const OPS: usize = 128;
/// Operations the neighbour of a world on a group holds.
const NEIGHBOUR_OPS: usize = 8;

/// What the test knows became of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Never made.
    Unused,
    /// Made, not handed to the purgatory (yet).
    Made,
    /// Accepted by a watch: must be answered exactly once.
    Accepted,
    /// Refused by a watch, with the operation given back: never answered.
    Refused,
    /// Handed back by a cancel: never answered, counted cancelled.
    Cancelled,
    /// Its guard or `Parked` was dropped while it may have waited: answered once, or
    /// cancelled (then counted so) and dropped by the purgatory.
    AnsweredOrCancelled,
    /// Lost to a panic that reached the test from a call that must not let one through.
    Lost,
}

pub type Handle = OperationHandle<Faulty>;

pub struct World {
    pub name: String,
    purgatory: Option<Purgatory<Key, Faulty>>,
    pub clock: ManualClock,
    pub ledger: Arc<Ledger>,
    /// Per operation: the first attempt of `try_complete` that says ready (0: never).
    ready_from: Arc<Vec<AtomicU32>>,
    readiness: Readiness,
    fate: Vec<Fate>,
    /// Panics that reached the test, by the call they came from.
    pub propagated: Vec<&'static str>,
    /// Answers counted when shutdown returned.
    answered_at_shutdown: Option<u64>,
    /// On a `TimerGroup` ([`World::on_group`]): the other member, its ledger, and how
    /// many operations it holds (each waiting on a long timeout until the group's
    /// shutdown, some expiring at the world's rounds).
    neighbour: Option<(Purgatory<Key, Faulty>, Arc<Ledger>, usize)>,
}

impl World {
    /// A world whose purgatory is built by `build` from a builder with the faulty clock
    /// (no reaper) already set; building is part of the run (it reads the clock).
    pub fn new(
        name: String,
        build: impl FnOnce(PurgatoryBuilder<Key, Faulty>, TimerBuilder) -> PurgatoryBuilder<Key, Faulty>,
    ) -> Self {
        let clock = ManualClock::new();
        let timer = TimerBuilder::new()
            .clock(FaultyClock(clock.clone()))
            .reaper(false);
        let builder = build(PurgatoryBuilder::new().name(&name), timer);
        let purgatory = builder.build().expect("a valid configuration");
        Self::with(name, clock, purgatory)
    }

    fn with(name: String, clock: ManualClock, purgatory: Purgatory<Key, Faulty>) -> Self {
        let ready_from: Arc<Vec<AtomicU32>> =
            Arc::new((0..OPS).map(|_| AtomicU32::new(0)).collect());
        let read = Arc::clone(&ready_from);
        let readiness: Readiness = Arc::new(move |id, attempt| {
            let from = read[id].load(SeqCst);
            from != 0 && attempt >= from
        });
        World {
            name,
            purgatory: Some(purgatory),
            clock,
            ledger: Ledger::new(OPS),
            ready_from,
            readiness,
            fate: vec![Fate::Unused; OPS],
            propagated: Vec::new(),
            answered_at_shutdown: None,
            neighbour: None,
        }
    }

    /// A world whose purgatory is a member of a `TimerGroup` on the faulty clock (no
    /// reaper: the world's `advance` runs the group's rounds), beside a neighbour member
    /// that holds operations of its own (half of them on a 1 ms timeout, expired by the
    /// world's rounds, the others answered by the group's shutdown, which the world's
    /// `shutdown` is). The neighbour's operations are user code too, so faults reach
    /// them; the checks then also ask that each of them was answered exactly once.
    pub fn on_group(name: String) -> Self {
        let clock = ManualClock::new();
        let timer = TimerBuilder::new()
            .clock(FaultyClock(clock.clone()))
            .reaper(false);
        let group = purgatory::TimerGroup::builder()
            .name(&name)
            .timer(timer)
            .build()
            .expect("a valid configuration");
        let purgatory = PurgatoryBuilder::new()
            .name(&name)
            .build_on(&group)
            .expect("a place in the group");
        let mut world = Self::with(name.clone(), clock, purgatory);
        let neighbour: Purgatory<Key, Faulty> = PurgatoryBuilder::new()
            .name(&format!("{name}-neighbour"))
            .build_on(&group)
            .expect("a place in the group");
        let ledger = Ledger::new(NEIGHBOUR_OPS);
        let never: Readiness = Arc::new(|_, _| false);
        for id in 0..NEIGHBOUR_OPS {
            let timeout = if id % 2 == 0 {
                Duration::from_millis(1)
            } else {
                Duration::from_secs(60)
            };
            let op = Faulty(Probe::new(id, timeout, &ledger, &never), None);
            // Refused (a fault in its key or timeout) or waiting: checked at the end.
            let _ = super::injector::call(&mut world.propagated, "neighbour watch", || {
                neighbour.watch(op, [Key(id as u32)])
            });
        }
        world.neighbour = Some((neighbour, ledger, NEIGHBOUR_OPS));
        world
    }

    pub fn purgatory(&self) -> &Purgatory<Key, Faulty> {
        self.purgatory.as_ref().expect("not dropped yet")
    }

    /// Readiness that a scenario can extend (an operation whose `try_complete` does more).
    pub fn readiness(&self) -> Readiness {
        Arc::clone(&self.readiness)
    }

    /// A new operation with `timeout`, never ready until told.
    pub fn op(&mut self, timeout: Duration) -> Faulty {
        let readiness = self.readiness();
        self.op_with(timeout, readiness)
    }

    /// A new operation with `timeout` whose readiness is `readiness`.
    pub fn op_with(&mut self, timeout: Duration, readiness: Readiness) -> Faulty {
        let id = self
            .fate
            .iter()
            .position(|fate| *fate == Fate::Unused)
            .expect("fewer than OPS operations a scenario");
        self.fate[id] = Fate::Made;
        Faulty(Probe::new(id, timeout, &self.ledger, &readiness), None)
    }

    /// Operation `id` says ready from its `attempt`-th `try_complete` on.
    pub fn ready_from(&self, id: usize, attempt: u32) {
        self.ready_from[id].store(attempt, SeqCst);
    }

    /// Runs one call into the purgatory, catching a panic that reaches the caller (`what`
    /// names the call, for the checks: only some calls may let one through).
    pub fn call<R>(
        &mut self,
        what: &'static str,
        f: impl FnOnce(&Purgatory<Key, Faulty>) -> R,
    ) -> Option<R> {
        let purgatory = self.purgatory.as_ref().expect("not dropped yet");
        super::injector::call(&mut self.propagated, what, || f(purgatory))
    }

    /// Watches `op` on `keys`; the handle if it waits.
    pub fn watch(&mut self, op: Faulty, keys: &[u32]) -> Option<Handle> {
        let id = op.0.id;
        let keys: Vec<Key> = keys.iter().map(|&k| Key(k)).collect();
        let outcome = self.call("watch", |p| p.watch(op, keys));
        self.watched(id, outcome)
    }

    /// `watch_keyless`: an operation on no key.
    pub fn watch_keyless(&mut self, op: Faulty) -> Option<Handle> {
        let id = op.0.id;
        let outcome = self.call("watch_keyless", |p| p.watch_keyless(op));
        self.watched(id, outcome)
    }

    /// Records what a watch of operation `id` gave.
    fn watched(
        &mut self,
        id: usize,
        outcome: Option<Result<WatchOutcome<Faulty>, WatchError<Faulty>>>,
    ) -> Option<Handle> {
        match outcome {
            None => {
                self.fate[id] = Fate::Lost;
                None
            }
            Some(Ok(WatchOutcome::Pending(handle))) => {
                self.fate[id] = Fate::Accepted;
                Some(handle)
            }
            Some(Ok(WatchOutcome::Completed)) => {
                self.fate[id] = Fate::Accepted;
                None
            }
            Some(Err(refused)) => {
                self.fate[id] = Fate::Refused;
                quiet(|| drop(refused));
                None
            }
        }
    }

    /// Watches a batch; one handle (if waiting) per operation, in order.
    pub fn watch_batch(&mut self, batch: Vec<(Faulty, Vec<u32>)>) -> Vec<Option<Handle>> {
        let ids: Vec<usize> = batch.iter().map(|(op, _)| op.0.id).collect();
        let batch: Vec<(Faulty, Vec<Key>)> = batch
            .into_iter()
            .map(|(op, keys)| (op, keys.into_iter().map(Key).collect()))
            .collect();
        match self.call("watch_batch", |p| p.watch_batch(batch)) {
            None => {
                for id in ids {
                    self.fate[id] = Fate::Lost;
                }
                Vec::new()
            }
            Some(results) => ids
                .into_iter()
                .zip(results)
                .map(|(id, result)| self.watched(id, Some(result)))
                .collect(),
        }
    }

    /// An event on `key`: `check_and_complete` (the caller's key may panic through).
    pub fn check(&mut self, key: u32) {
        let key = Key(key);
        self.call("check_and_complete", |p| p.check_and_complete(&key));
        quiet(|| drop(key));
    }

    pub fn force(&mut self, handles: &[&Handle]) {
        self.call("force_complete_batch", |p| {
            p.force_complete_batch(handles.iter().copied())
        });
    }

    /// `reset_timeout`: the operation's deadline moved to `timeout` from now.
    pub fn reset(&mut self, handle: &Handle, timeout: Duration) {
        self.call("reset_timeout", |p| p.reset_timeout(handle, timeout));
    }

    pub fn cancel(&mut self, handle: &Handle) {
        if let Some(Some(op)) = self.call("cancel", |p| p.cancel(handle)) {
            self.handed_back(op);
        }
    }

    pub fn cancel_for_key(&mut self, key: u32) {
        let key = Key(key);
        if let Some(ops) = self.call("cancel_for_key", |p| p.cancel_for_key(&key)) {
            for op in ops {
                self.handed_back(op);
            }
        }
        quiet(|| drop(key));
    }

    /// A guard made and dropped at once: the operation is cancelled (dropped by the
    /// purgatory) unless already answered.
    pub fn drop_guard(&mut self, handle: Handle, id: usize) {
        self.fate[id] = Fate::AnsweredOrCancelled;
        self.call("cancel_on_drop", |p| drop(p.cancel_on_drop(handle)));
    }

    /// Marks operation `id` as answered or cancelled by something the scenario dropped.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the `parked` scenario's
    pub fn answered_or_cancelled(&mut self, id: usize) {
        self.fate[id] = Fate::AnsweredOrCancelled;
    }

    /// Operation `op` was handed back by a cancel; the test drops it.
    pub fn handed_back(&mut self, op: Faulty) {
        self.fate[op.0.id] = Fate::Cancelled;
        quiet(|| drop(op));
    }

    /// Operation `id` was refused (the test dropped what came back).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the `parked` scenario's
    pub fn refused(&mut self, id: usize) {
        self.fate[id] = Fate::Refused;
    }

    /// Operation `id` was lost with a panic that reached the test.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the `parked` scenario's
    pub fn lost(&mut self, id: usize) {
        self.fate[id] = Fate::Lost;
    }

    /// Moves the clock and runs a round (a reaper's, on this thread).
    pub fn advance(&mut self, by: Duration) {
        self.clock.advance(by);
        self.call("advance_clock", |p| p.advance_clock(Duration::ZERO));
    }

    pub fn purge(&mut self) {
        self.call("purge", Purgatory::purge);
    }

    /// The purgatory still expires: an operation watched now is answered at its timeout
    /// by the next round (or the one after, if the first one's clock read was the one
    /// faulted; and by a second operation if the fault refused the first).
    pub fn still_expiring(&mut self) {
        for attempt in 0..2 {
            let op = self.op(Duration::from_millis(1));
            let id = op.0.id;
            self.watch(op, &[900 + attempt]);
            if self.fate[id] != Fate::Accepted {
                continue;
            }
            self.advance(Duration::from_millis(2));
            if self.ledger.how(id).is_none() {
                // The round's clock read was the one faulted: time stood still for it.
                self.advance(Duration::ZERO);
            }
            assert_eq!(
                self.ledger.how(id),
                Some(Completion::Expired),
                "{}: an operation watched later did not expire on time",
                self.name
            );
            return;
        }
        panic!("{}: two watches in a row refused", self.name);
    }

    pub fn shutdown(&mut self) {
        self.call("shutdown", Purgatory::shutdown);
        self.answered_at_shutdown = Some(self.ledger.total_completions());
    }

    /// Drops the last handle (shuts down, expiring what is pending).
    pub fn drop_last_handle(&mut self) {
        let purgatory = self.purgatory.take().expect("not dropped yet");
        if catch_unwind(AssertUnwindSafe(move || drop(purgatory))).is_err() {
            self.propagated.push("drop");
        }
        self.answered_at_shutdown = Some(self.ledger.total_completions());
    }

    /// The checks after a run (see the suite's doc); `run` says what the fault hit.
    pub fn check_ledger(mut self, run: &Run, published: impl FnOnce(&str) -> Option<Published>) {
        let name = self.name.clone();
        let hit = run.hit();
        let context = format!("{name}, fault {hit:?}");
        // Only the caller's own key (lent to a check or a cancel by key) may panic
        // through to the caller.
        let lent_key = matches!(hit, Some((Kind::KeyHash | Kind::KeyEq, true)));
        for call in &self.propagated {
            let allowed = lent_key && ["check_and_complete", "cancel_for_key"].contains(call);
            assert!(allowed, "{context}: a panic reached the caller of {call}");
        }
        let stats = self.purgatory.as_ref().map(|p| {
            if !p.is_shutdown() {
                p.shutdown();
                self.answered_at_shutdown = Some(self.ledger.total_completions());
            }
            p.stats()
        });
        let answered_at_shutdown = self.answered_at_shutdown;
        drop(self.purgatory.take());
        // On a group, a panic the neighbour's door caught is counted in its figures; a
        // clock's is the shared timer's, counted in both.
        let mut neighbour_panicked = 0;
        if let Some((neighbour, ledger, made)) = self.neighbour.take() {
            // The world's shutdown was the group's: the neighbour is closed, and each of
            // its operations was answered once (or refused at its watch, never answered).
            assert!(neighbour.is_shutdown(), "{context}: the group's shutdown");
            let stats = neighbour.stats();
            drop(neighbour);
            assert_eq!(
                ledger.violations(),
                0,
                "{context}: the neighbour's contract"
            );
            for id in 0..made {
                assert!(
                    ledger.completions(id) <= 1 && ledger.drops(id) == 1,
                    "{context}: the neighbour's operation {id} answered {} times, dropped {}",
                    ledger.completions(id),
                    ledger.drops(id)
                );
            }
            assert_eq!(
                ledger.total_completions() + stats.refused,
                made as u64,
                "{context}: the neighbour's operations, answered or refused: {stats:?}"
            );
            assert_eq!(
                (stats.pending, stats.watched),
                (0, 0),
                "{context}: the neighbour left behind"
            );
            let clock = u64::from(matches!(hit, Some((Kind::Clock, true))));
            neighbour_panicked = stats.panicked - clock.min(stats.panicked);
        }
        let ledger = &self.ledger;
        assert_eq!(
            ledger.violations(),
            0,
            "{context}: the operation contract was broken"
        );
        let mut cancelled = 0;
        for (id, fate) in self.fate.iter().enumerate() {
            let answered = ledger.completions(id);
            let ok = match fate {
                Fate::Unused => continue,
                Fate::Accepted => answered == 1,
                Fate::Refused | Fate::Cancelled => answered == 0,
                Fate::AnsweredOrCancelled => answered <= 1,
                Fate::Made | Fate::Lost => false,
            };
            assert!(
                ok,
                "{context}: operation {id} ({fate:?}) answered {answered} times"
            );
            assert_eq!(
                ledger.drops(id),
                1,
                "{context}: operation {id} ({fate:?}) dropped"
            );
            if *fate == Fate::Cancelled || (*fate == Fate::AnsweredOrCancelled && answered == 0) {
                cancelled += 1;
            }
        }
        assert_eq!(
            Some(ledger.total_completions()),
            answered_at_shutdown,
            "{context}: answered after shutdown returned"
        );
        let Some(stats) = stats else {
            return; // the last handle was dropped: nothing left to read
        };
        let injected = matches!(hit, Some((_, true))) && self.propagated.is_empty();
        assert_eq!(
            (
                stats.completed,
                stats.forced,
                stats.expired,
                stats.expired_at_shutdown,
                stats.cancelled,
                stats.refused,
                stats.panicked + neighbour_panicked,
            ),
            (
                ledger.count(Completion::Ready),
                ledger.count(Completion::Forced),
                ledger.count(Completion::Expired),
                ledger.count(Completion::Shutdown),
                cancelled,
                self.fate.iter().filter(|&&f| f == Fate::Refused).count() as u64,
                u64::from(injected),
            ),
            "{context}: stats() against the ledger: {stats:?}"
        );
        assert_eq!(
            (stats.pending, stats.watched, stats.keys),
            (0, 0, 0),
            "{context}: left behind"
        );
        let recorder_faulted = matches!(hit, Some((Kind::Recorder, _)));
        if let Some(published) = published(&name) {
            if !recorder_faulted {
                assert_eq!(
                    published,
                    Published::of(&stats),
                    "{context}: published figures against stats()"
                );
            }
        }
    }
}

/// The totals a purgatory published (feature `metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Published {
    pub completed: u64,
    pub forced: u64,
    pub expired: u64,
    pub expired_at_shutdown: u64,
    pub cancelled: u64,
    pub panicked: u64,
}

impl Published {
    pub fn of(stats: &purgatory::PurgatoryStats) -> Self {
        Published {
            completed: stats.completed,
            forced: stats.forced,
            expired: stats.expired,
            expired_at_shutdown: stats.expired_at_shutdown,
            cancelled: stats.cancelled,
            panicked: stats.panicked,
        }
    }
}
