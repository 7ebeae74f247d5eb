//! User code that panics where the purgatory runs it before an operation is armed: a
//! key's `Hash` or `Eq` while the operation is listed, the operation's `timeout()`. The
//! operation must come back to the caller in an error (never be left unanswered), every
//! other operation must keep its result, and the purgatory must stay consistent.

mod probe;

use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use probe::{flags, manual_purgatory, never, DropBomb, Ledger, Probe};
use purgatory::{Completion, DelayedOperation, ManualClock, Purgatory, WatchError, WatchOutcome};

/// A key whose `Hash` panics for `Key::HashBomb`, and whose `Eq` panics when it compares
/// `Key::EqBomb` (all `EqBomb` and `Colliding` keys hash alike, so `Eq` runs).
#[derive(Clone, Debug)]
enum Key {
    Fine(u32),
    HashBomb,
    EqBomb,
    Colliding(u32),
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            Key::Fine(n) => n.hash(state),
            Key::HashBomb => panic!("Hash of a hostile key (on purpose)"),
            Key::EqBomb | Key::Colliding(_) => u32::MAX.hash(state),
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Key::EqBomb, _) | (_, Key::EqBomb) => panic!("Eq of a hostile key (on purpose)"),
            (Key::Fine(a), Key::Fine(b)) | (Key::Colliding(a), Key::Colliding(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Key {}

const LONG: Duration = Duration::from_secs(60);

fn refused_for_key(result: Result<WatchOutcome<Probe>, WatchError<Probe>>) -> Probe {
    match result {
        Err(WatchError::KeyPanicked(op)) => op,
        other => panic!("expected KeyPanicked, got {other:?}"),
    }
}

#[test]
fn a_key_whose_hash_panics_hands_the_operation_back_and_leaves_nothing_behind() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(2);
    let purgatory: Purgatory<Key, Probe> = manual_purgatory(&clock);
    // Listed on a fine key first, then the hostile one.
    let op = Probe::new(0, LONG, &ledger, &never());
    let back = refused_for_key(purgatory.watch(op, [Key::Fine(1), Key::HashBomb]));
    assert_eq!(back.id, 0);
    assert_eq!(ledger.completions(0), 0, "handed back, not answered");
    let stats = purgatory.stats();
    assert_eq!(stats.pending, 0, "nothing of it is armed");
    assert_eq!(stats.panicked, 1);
    // Its entry on the fine key is stale: a check drops it and completes nothing.
    assert_eq!(purgatory.check_and_complete(&Key::Fine(1)), 0);
    assert_eq!((purgatory.watched(), purgatory.stats().keys), (0, 0));
    // The purgatory goes on: another operation on the same fine key works.
    let (ready, readiness) = flags(2);
    assert!(!purgatory
        .try_complete_else_watch(Probe::new(1, LONG, &ledger, &readiness), [Key::Fine(1)])
        .unwrap());
    ready[1].store(true, SeqCst);
    assert_eq!(purgatory.check_and_complete(&Key::Fine(1)), 1);
    assert_eq!(ledger.how(1), Some(Completion::Ready));
    drop(back);
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn a_key_whose_eq_panics_hands_the_operation_back() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(2);
    let purgatory: Purgatory<Key, Probe> = manual_purgatory(&clock);
    // A colliding key is listed first, so listing `EqBomb` compares against it.
    let WatchOutcome::Pending(first) = purgatory
        .watch(Probe::new(0, LONG, &ledger, &never()), [Key::Colliding(7)])
        .unwrap()
    else {
        panic!("a never-ready operation waits");
    };
    let back =
        refused_for_key(purgatory.watch(Probe::new(1, LONG, &ledger, &never()), [Key::EqBomb]));
    assert_eq!(back.id, 1);
    assert_eq!(purgatory.pending(), 1, "only the first operation is armed");
    assert_eq!(purgatory.stats().panicked, 1);
    // The first operation is intact and answerable.
    assert!(purgatory.force_complete(&first));
    assert_eq!(ledger.how(0), Some(Completion::Forced));
    assert_eq!(ledger.completions(1), 0);
}

#[test]
fn in_a_batch_only_the_operation_with_the_hostile_key_is_refused() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(100);
    let purgatory: Purgatory<Key, Probe> = manual_purgatory(&clock);
    let batch = (0..100).map(|id| {
        let key = if id == 69 {
            Key::HashBomb
        } else {
            Key::Fine(id as u32 % 7)
        };
        (
            Probe::new(id, LONG, &ledger, &never()),
            vec![Key::Fine(100), key],
        )
    });
    let results = purgatory.watch_batch(batch);
    only_69_refused(results, |refused| match refused {
        WatchError::KeyPanicked(op) => op.id,
        other => panic!("refused as {other:?}"),
    });
    every_other_one_expires(&purgatory, &clock, &ledger);
}

/// The same with the hostile key first among its operation's keys, each operation with a
/// different number of keys: the failed entry is the first of its operation's run in the
/// chunk, right after the end of the run before it, and must be charged to its own
/// operation, not to that one.
#[test]
fn in_a_batch_a_hostile_first_key_refuses_its_own_operation_not_the_one_before() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(100);
    let purgatory: Purgatory<Key, Probe> = manual_purgatory(&clock);
    let batch = (0..100).map(|id| {
        let mut keys = vec![Key::Fine(id as u32 % 7); 1 + id % 3];
        if id == 69 {
            keys.insert(0, Key::HashBomb);
        }
        (Probe::new(id, LONG, &ledger, &never()), keys)
    });
    let results = purgatory.watch_batch(batch);
    only_69_refused(results, |refused| match refused {
        WatchError::KeyPanicked(op) => op.id,
        other => panic!("refused as {other:?}"),
    });
    every_other_one_expires(&purgatory, &clock, &ledger);
}

/// Checks the results of a batch of 100 in which only the 70th (id 69) is refused, as
/// `refused_id` says.
fn only_69_refused<O: std::fmt::Debug>(
    results: Vec<Result<WatchOutcome<O>, WatchError<O>>>,
    refused_id: impl Fn(WatchError<O>) -> usize,
) {
    assert_eq!(results.len(), 100, "one result per operation");
    for (id, result) in results.into_iter().enumerate() {
        match result {
            Err(refused) => assert_eq!((id, refused_id(refused)), (69, 69)),
            Ok(WatchOutcome::Pending(_)) => assert_ne!(id, 69),
            Ok(WatchOutcome::Completed) => panic!("operation {id} is never ready"),
        }
    }
}

/// After such a batch: 99 armed, one panic counted, and at their timeout every accepted
/// operation is answered, the refused one never.
fn every_other_one_expires<K, O>(purgatory: &Purgatory<K, O>, clock: &ManualClock, ledger: &Ledger)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    assert_eq!(purgatory.pending(), 99);
    assert_eq!(purgatory.stats().panicked, 1);
    clock.advance(LONG);
    purgatory.advance_clock(Duration::ZERO);
    for id in 0..100 {
        let expected = u32::from(id != 69);
        assert_eq!(ledger.completions(id), expected, "operation {id}");
    }
    assert_eq!(ledger.count(Completion::Expired), 99);
    assert_eq!(ledger.violations(), 0);
}

/// An operation whose `timeout()` panics.
struct BadTimeout(Probe);

impl DelayedOperation for BadTimeout {
    fn timeout(&self) -> Duration {
        if self.0.id == 69 {
            panic!("timeout() of operation 69 (on purpose)");
        }
        self.0.timeout()
    }
    fn try_complete(&mut self) -> bool {
        self.0.try_complete()
    }
    fn on_complete(&mut self, how: Completion) {
        self.0.on_complete(how)
    }
    fn on_expiration(&mut self) {
        self.0.on_expiration()
    }
}

#[test]
fn a_panicking_timeout_in_a_batch_refuses_that_operation_only() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(100);
    let purgatory: Purgatory<u32, BadTimeout> = manual_purgatory(&clock);
    let batch = (0..100).map(|id| {
        (
            BadTimeout(Probe::new(id, LONG, &ledger, &never())),
            [id as u32],
        )
    });
    let results = purgatory.watch_batch(batch);
    only_69_refused(results, |refused| match refused {
        WatchError::TimeoutPanicked(op) => op.0.id,
        other => panic!("refused as {other:?}"),
    });
    every_other_one_expires(&purgatory, &clock, &ledger);
}

impl std::fmt::Debug for BadTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[test]
fn checking_or_cancelling_a_hostile_key_panics_to_the_caller_and_changes_nothing() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(2);
    let purgatory: Purgatory<Key, Probe> = manual_purgatory(&clock);
    let (ready, readiness) = flags(2);
    for id in 0..2 {
        assert!(!purgatory
            .try_complete_else_watch(
                Probe::new(id, LONG, &ledger, &readiness),
                [Key::Colliding(1)]
            )
            .unwrap());
    }
    ready[0].store(true, SeqCst);
    for bomb in [Key::HashBomb, Key::EqBomb] {
        let check = catch_unwind(AssertUnwindSafe(|| purgatory.check_and_complete(&bomb)));
        assert!(
            check.is_err(),
            "{bomb:?}: the key's panic reaches the caller"
        );
        let cancel = catch_unwind(AssertUnwindSafe(|| purgatory.cancel_for_key(&bomb)));
        assert!(
            cancel.is_err(),
            "{bomb:?}: the key's panic reaches the caller"
        );
    }
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched, stats.keys), (2, 2, 1));
    assert_eq!(ledger.total_completions(), 0);
    // Both operations are still answerable through their real key.
    assert_eq!(purgatory.check_and_complete(&Key::Colliding(1)), 1);
    let rest = purgatory.cancel_for_key(&Key::Colliding(1));
    assert_eq!(rest.iter().map(|op| op.id).collect::<Vec<_>>(), [1]);
    assert_eq!(ledger.violations(), 0);
}

/// Issue #27, finding 1: a key whose `Drop` panics while a purge drops its emptied list
/// must not stop the reaper: later timeouts still fire on time, and purges go on.
#[test]
fn a_key_whose_drop_panics_in_a_purge_never_stops_the_reaper() {
    let purgatory: Purgatory<DropBomb, Probe> = purgatory::PurgatoryBuilder::new()
        .name("drop-bomb-purge")
        .purge_interval(1)
        .build()
        .unwrap();
    let ledger = Ledger::new(3);
    let (bomb, armed) = DropBomb::armed(1);
    let WatchOutcome::Pending(first) = purgatory
        .watch(Probe::new(0, LONG, &ledger, &never()), [bomb])
        .unwrap()
    else {
        panic!("a never-ready operation waits");
    };
    // Completed: its entry is stale, the reaper's next purge empties the list and drops
    // the armed key.
    assert!(purgatory.force_complete(&first));
    assert!(
        probe::wait_until(Duration::from_secs(5), || !armed.load(SeqCst)),
        "the purge dropped the key"
    );
    assert!(probe::wait_until(Duration::from_secs(5), || purgatory
        .stats()
        .panicked
        == 1));
    // The reaper goes on: a short timeout watched now fires, and so does one due later.
    let started = std::time::Instant::now();
    for (id, timeout) in [
        (1, Duration::from_millis(10)),
        (2, Duration::from_millis(300)),
    ] {
        assert!(!purgatory
            .try_complete_else_watch(
                Probe::new(id, timeout, &ledger, &never()),
                [DropBomb::plain(10 + id as u32)]
            )
            .unwrap());
    }
    assert!(
        probe::wait_until(Duration::from_secs(5), || ledger.completions(1) == 1
            && ledger.completions(2) == 1),
        "the reaper stopped: nothing expired after the key's panic"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(ledger.how(2), Some(Completion::Expired));
    assert!(!purgatory.is_shutdown());
    assert_eq!(ledger.violations(), 0);
}

/// Issue #27, finding 4: `cancel_for_key` on a key whose stored copy's `Drop` panics
/// still hands back every operation of the key (the panic is caught and counted), and
/// leaves no operation unlisted behind.
#[test]
fn cancel_for_key_hands_back_everything_when_the_stored_keys_drop_panics() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(3);
    let purgatory: Purgatory<DropBomb, Probe> = manual_purgatory(&clock);
    let (bomb, _armed) = DropBomb::armed(1);
    let mut keys = vec![bomb, DropBomb::plain(1), DropBomb::plain(1)].into_iter();
    for id in 0..3 {
        assert!(!purgatory
            .try_complete_else_watch(
                Probe::new(id, LONG, &ledger, &never()),
                [keys.next().unwrap()]
            )
            .unwrap());
    }
    let cancelled = catch_unwind(AssertUnwindSafe(|| {
        purgatory.cancel_for_key(&DropBomb::plain(1))
    }))
    .expect("the stored key's panic is caught");
    let mut ids: Vec<usize> = cancelled.iter().map(|op| op.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2], "every operation of the key handed back");
    let stats = purgatory.stats();
    assert_eq!((stats.cancelled, stats.pending, stats.panicked), (3, 0, 1));
    assert_eq!((stats.watched, stats.keys), (0, 0));
    drop(cancelled);
    assert_eq!(ledger.total_completions(), 0);
    assert_eq!(ledger.violations(), 0);
}

/// A clock that panics on the read after it is armed (once), otherwise reads `inner`.
#[derive(Clone)]
struct BombClock<C> {
    inner: C,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<C: purgatory::Clock> purgatory::Clock for BombClock<C> {
    fn now(&self) -> Duration {
        if self.armed.swap(false, SeqCst) {
            panic!("the clock panics (on purpose)");
        }
        self.inner.now()
    }
}

/// Issue #27, finding 2: a clock that panics while a watch arms the operation's timeout
/// must not lose the operation: it is armed (or handed back) and answered exactly once,
/// at the latest by shutdown.
#[test]
fn a_clock_that_panics_while_a_watch_arms_loses_nothing() {
    let manual = ManualClock::new();
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clock = BombClock {
        inner: manual.clone(),
        armed: std::sync::Arc::clone(&armed),
    };
    let purgatory: Purgatory<u32, Probe> = purgatory::PurgatoryBuilder::new()
        .timer(purgatory::TimerBuilder::new().clock(clock).reaper(false))
        .build()
        .unwrap();
    let ledger = Ledger::new(2);
    armed.store(true, SeqCst);
    let watched = catch_unwind(AssertUnwindSafe(|| {
        purgatory.try_complete_else_watch(Probe::new(0, LONG, &ledger, &never()), [1])
    }));
    assert!(
        matches!(watched, Ok(Ok(false))),
        "the clock's panic is caught and the operation waits"
    );
    assert!(!armed.load(SeqCst), "the clock was read");
    assert_eq!(purgatory.pending(), 1, "armed");
    assert_eq!(purgatory.stats().panicked, 1);
    // It expires: at its timeout, counted from the last good reading.
    manual.advance(LONG);
    purgatory.advance_clock(Duration::ZERO);
    assert_eq!(ledger.how(0), Some(Completion::Expired));
    purgatory.shutdown();
    assert_eq!(ledger.total_completions(), 1);
    assert_eq!(ledger.violations(), 0);
}

/// Issue #27, finding 2: a clock that panics on the reaper never stops expiry.
#[test]
fn a_clock_that_panics_on_the_reaper_never_stops_expiry() {
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clock = BombClock {
        inner: purgatory::SystemClock::new(),
        armed: std::sync::Arc::clone(&armed),
    };
    let purgatory: Purgatory<u32, Probe> = purgatory::PurgatoryBuilder::new()
        .name("bomb-clock-reaper")
        .timer(purgatory::TimerBuilder::new().clock(clock))
        .build()
        .unwrap();
    let ledger = Ledger::new(3);
    assert!(!purgatory
        .try_complete_else_watch(
            Probe::new(0, Duration::from_millis(20), &ledger, &never()),
            [1]
        )
        .unwrap());
    // The next read panics: most likely the reaper's, as it wakes for the timeout.
    armed.store(true, SeqCst);
    assert!(
        probe::wait_until(Duration::from_secs(5), || !armed.load(SeqCst)),
        "the clock was read"
    );
    for id in 1..3 {
        assert!(!purgatory
            .try_complete_else_watch(
                Probe::new(id, Duration::from_millis(30), &ledger, &never()),
                [id as u32]
            )
            .unwrap());
    }
    assert!(
        probe::wait_until(Duration::from_secs(5), || ledger.total_completions() == 3),
        "expiry stopped after the clock panicked: {} of 3 answered",
        ledger.total_completions()
    );
    assert_eq!(ledger.count(Completion::Expired), 3);
    assert_eq!(purgatory.stats().panicked, 1);
    assert_eq!(ledger.violations(), 0);
}

/// A key whose first `Hash` (when a gate is set) waits for the test to let it go, and
/// whose `Drop` panics (as [`DropBomb`]).
#[derive(Clone, Debug)]
struct GatedKey {
    bomb: DropBomb,
    gate: Option<Arc<Gate>>,
}

#[derive(Debug)]
struct Gate {
    first: std::sync::atomic::AtomicBool,
    entered: Barrier,
    released: Barrier,
}

impl Hash for GatedKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if let Some(gate) = &self.gate {
            if gate.first.swap(false, SeqCst) {
                gate.entered.wait();
                gate.released.wait();
            }
        }
        self.bomb.hash(state);
    }
}

impl PartialEq for GatedKey {
    fn eq(&self, other: &Self) -> bool {
        self.bomb == other.bomb
    }
}

impl Eq for GatedKey {}

/// A watch racing shutdown lists its key after shutdown emptied the lists (its arming is
/// then refused). That key stays listed until the purgatory's memory is freed, and is
/// dropped there through the door: its `Drop` panicking is caught. Before, it went down
/// with the lists, and its panic reached whoever dropped the last handle (a second such
/// key would have aborted the process).
#[test]
fn a_key_listed_by_a_watch_racing_shutdown_is_dropped_through_the_door() {
    let purgatory: Purgatory<GatedKey, Probe> = purgatory::PurgatoryBuilder::new()
        .name("listed-after-shutdown")
        .build()
        .unwrap();
    let ledger = Ledger::new(1);
    let gate = Arc::new(Gate {
        first: std::sync::atomic::AtomicBool::new(true),
        entered: Barrier::new(2),
        released: Barrier::new(2),
    });
    let (bomb, armed) = DropBomb::armed(1);
    let key = GatedKey {
        bomb,
        gate: Some(Arc::clone(&gate)),
    };
    let watcher = {
        let purgatory = purgatory.clone();
        let op = Probe::new(0, LONG, &ledger, &never());
        std::thread::spawn(move || purgatory.watch(op, [key]).map(|_| ()))
    };
    gate.entered.wait();
    purgatory.shutdown();
    gate.released.wait();
    match watcher.join().expect("the watch returns") {
        Err(WatchError::Shutdown(op)) => drop(op),
        other => panic!("expected the watch refused by shutdown, got {other:?}"),
    }
    assert!(armed.load(SeqCst), "the key is still listed");
    let dropped = catch_unwind(AssertUnwindSafe(move || drop(purgatory)));
    assert!(
        dropped.is_ok(),
        "the key's panic reached the last handle's drop"
    );
    assert!(!armed.load(SeqCst), "the key was dropped");
    assert_eq!(ledger.total_completions(), 0);
}

/// Several hostile keys in one batch, where a chunk's run of entries begins and ends: the
/// first operation of the batch (its first key), the last of the first chunk (its last
/// key) and the first of the next, one operation with two hostile keys beside one with
/// one, and the last operation of the batch (a chunk of two, listed by the short path).
/// Each failed entry is charged to its own operation: exactly those are refused, each
/// once, the others armed, and the purgatory's books come out even.
#[test]
fn in_a_batch_hostile_keys_at_the_chunks_edges_and_twice_in_one_operation_refuse_their_own_operations(
) {
    const N: usize = 130;
    // id -> where its hostile keys go: at the front, at the back.
    let hostile = |id: usize| -> (usize, usize) {
        match id {
            0 => (1, 0),
            63 => (0, 1),
            64 => (1, 0),
            70 => (1, 1),
            71 => (0, 1),
            N_LAST => (0, 1),
            _ => (0, 0),
        }
    };
    const N_LAST: usize = N - 1;
    // Fine keys per operation: 1 to 3, and 1 in the last chunk, whose 3 entries (at
    // most `FEW`, 4) are listed one by one, not sorted by shard.
    let fine = |id: usize| if id >= 128 { 1 } else { 1 + id % 3 };
    let refused: Vec<usize> = (0..N).filter(|&id| hostile(id) != (0, 0)).collect();
    let bombs: u64 = (0..N)
        .map(|id| hostile(id).0 + hostile(id).1)
        .sum::<usize>() as u64;
    let clock = ManualClock::new();
    let ledger = Ledger::new(N);
    let purgatory: Purgatory<Key, Probe> = manual_purgatory(&clock);
    let batch = (0..N).map(|id| {
        let (front, back) = hostile(id);
        let mut keys = vec![Key::HashBomb; front];
        keys.extend((0..fine(id)).map(|k| Key::Fine((id + k) as u32 % 7)));
        keys.extend(std::iter::repeat_n(Key::HashBomb, back));
        (Probe::new(id, LONG, &ledger, &never()), keys)
    });
    let results = purgatory.watch_batch(batch);
    assert_eq!(results.len(), N, "one result per operation");
    for (id, result) in results.into_iter().enumerate() {
        match result {
            Err(WatchError::KeyPanicked(op)) => {
                assert!(refused.contains(&id), "operation {id} refused");
                assert_eq!(op.id, id, "the refusal hands back its own operation");
            }
            Err(other) => panic!("operation {id} refused as {other:?}"),
            Ok(WatchOutcome::Pending(_)) => {
                assert!(!refused.contains(&id), "operation {id} left waiting")
            }
            Ok(WatchOutcome::Completed) => panic!("operation {id} is never ready"),
        }
    }
    assert_eq!(purgatory.pending(), N - refused.len());
    let stats = purgatory.stats();
    assert_eq!(stats.panicked, bombs);
    // Every fine key was listed; those of the refused operations are stale, and only those.
    let live: usize = (0..N).filter(|id| !refused.contains(id)).map(fine).sum();
    assert_eq!(stats.watched, (0..N).map(fine).sum::<usize>(), "{stats:?}");
    assert_eq!(stats.watched_live, live, "{stats:?}");
    clock.advance(LONG);
    purgatory.advance_clock(Duration::ZERO);
    for id in 0..N {
        let expected = u32::from(!refused.contains(&id));
        assert_eq!(ledger.completions(id), expected, "operation {id}");
    }
    assert_eq!(
        ledger.count(Completion::Expired),
        (N - refused.len()) as u64
    );
    assert_eq!(ledger.violations(), 0);
    purgatory.purge();
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched), (0, 0), "{stats:?}");
}
