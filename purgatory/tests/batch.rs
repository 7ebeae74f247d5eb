//! The batch entry points, `watch_batch` and `force_complete_batch`: each operation of a
//! batch ends exactly as it would have through `watch` / `force_complete`, results come
//! back in input order, per-key arrival order is kept, and batches longer than one round
//! of locks (64) behave the same. Their races with events and forces from other threads
//! are exercised by the chaos test in `exactly_once.rs`.

mod probe;

use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use probe::{flags, manual_purgatory, never, Ledger, Probe, Readiness};
use purgatory::{
    Completion, DelayedOperation, ManualClock, OperationHandle, Purgatory, WatchError, WatchOutcome,
};

const LONG: Duration = Duration::from_secs(200);

fn pending<O>(result: Result<WatchOutcome<O>, WatchError<O>>) -> OperationHandle<O> {
    match result {
        Ok(WatchOutcome::Pending(handle)) => handle,
        Ok(WatchOutcome::Completed) => panic!("completed on watch"),
        Err(e) => panic!("refused: {e}"),
    }
}

/// The same four operations, alone (a batch under 32 is watched one by one) and then
/// followed by 40 more (a chunk): each path gives every operation what `watch` would, in
/// input order. (A chunk tries each operation once, after listing and arming it all; a
/// ready one leaves a stale entry behind.)
#[test]
fn each_operation_gets_the_outcome_watch_would_give_in_input_order() {
    outcomes_in_input_order(0);
    outcomes_in_input_order(40);
}

fn outcomes_in_input_order(padding: usize) {
    let clock = ManualClock::new();
    let purgatory: Purgatory<u64, _> = manual_purgatory(&clock);
    let ledger = Ledger::new(4 + padding);
    let (ready, readiness) = flags(4 + padding);
    ready[1].store(true, SeqCst);
    let probe = |id| Probe::new(id, LONG, &ledger, &readiness);
    let mut batch = vec![
        (probe(0), vec![1, 2]),
        (probe(1), vec![1]),
        (probe(2), vec![]),
        (probe(3), vec![3]),
    ];
    // Never ready, each on a key of its own.
    batch.extend((4..4 + padding).map(|id| (probe(id), vec![100 + id as u64])));
    let results = purgatory.watch_batch(batch);
    assert_eq!(results.len(), 4 + padding);
    let mut results = results.into_iter();
    let h0 = pending(results.next().unwrap());
    assert!(matches!(
        results.next().unwrap(),
        Ok(WatchOutcome::Completed)
    ));
    match results.next().unwrap() {
        Err(WatchError::NoKeys(op)) => assert_eq!(op.id, 2),
        other => panic!("operation 2: {:?}", other.map(|_| ())),
    }
    let h3 = pending(results.next().unwrap());
    let padded: Vec<_> = results.map(pending).collect();
    assert_eq!(padded.len(), padding);
    assert_eq!(ledger.how(1), Some(Completion::Ready));
    assert_eq!(ledger.tries(1), 1, "ready at its first try");
    let chunk = padding > 0;
    if chunk {
        assert_eq!(ledger.tries(0), 1, "tried once, after listing");
    } else {
        assert_eq!(ledger.tries(0), 2, "tried before and after listing");
    }
    let stats = purgatory.stats();
    assert_eq!(
        (stats.pending, stats.watched, stats.keys),
        (2 + padding, 3 + padding + usize::from(chunk), 3 + padding)
    );
    assert_eq!(stats.completed, 1);

    ready[0].store(true, SeqCst);
    assert_eq!(purgatory.check_and_complete(&2), 1);
    assert!(purgatory.is_completed(&h0) && !purgatory.is_completed(&h3));
    assert_eq!(purgatory.force_complete_batch([&h3, &h3, &h0]), 1);
    assert_eq!(ledger.how(3), Some(Completion::Forced));
    let stats = purgatory.stats();
    assert_eq!(
        stats.pending, padding,
        "the forced operation's timer is cancelled at once"
    );
    assert_eq!((stats.completed, stats.forced), (2, 1));
    assert_eq!(purgatory.force_complete_batch(&padded), padding);
    assert_eq!(ledger.violations(), 0);
}

/// Logs the order in which operations are tried.
struct Ordered {
    id: usize,
    log: Arc<Mutex<Vec<usize>>>,
}

impl DelayedOperation for Ordered {
    fn timeout(&self) -> Duration {
        LONG
    }
    fn try_complete(&mut self) -> bool {
        self.log.lock().unwrap().push(self.id);
        false
    }
    fn on_complete(&mut self, _how: Completion) {}
}

#[test]
fn operations_on_one_key_are_listed_in_input_order_across_chunks() {
    let clock = ManualClock::new();
    let purgatory: Purgatory<u64, _> = manual_purgatory(&clock);
    let log = Arc::new(Mutex::new(Vec::new()));
    // 150 operations (three rounds of locks), on key 7 and one of 40 others each.
    let batch: Vec<(Ordered, [u64; 2])> = (0..150)
        .map(|id| {
            let op = Ordered {
                id,
                log: Arc::clone(&log),
            };
            (op, [100 + (id as u64 * 13) % 40, 7])
        })
        .collect();
    let results = purgatory.watch_batch(batch);
    assert!(results
        .iter()
        .all(|r| matches!(r, Ok(WatchOutcome::Pending(_)))));
    log.lock().unwrap().clear();
    assert_eq!(purgatory.check_and_complete(&7), 0);
    assert_eq!(*log.lock().unwrap(), (0..150).collect::<Vec<_>>());
    log.lock().unwrap().clear();
    purgatory.check_and_complete(&113);
    // Key 113 = 100 + (id * 13) % 40 for id = 1, 41, 81, 121.
    let expected: Vec<usize> = (0..150).filter(|id| (id * 13) % 40 == 13).collect();
    assert_eq!(*log.lock().unwrap(), expected);
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched, stats.keys), (150, 300, 41));
}

fn timeout_ms(id: usize) -> u64 {
    1 + (id as u64 % 50)
}

#[test]
fn a_long_batch_expires_each_operation_once_at_its_own_timeout() {
    let clock = ManualClock::new();
    let purgatory: Purgatory<u64, _> = manual_purgatory(&clock);
    let ledger = Ledger::new(200);
    let readiness = never();
    let batch: Vec<(Probe, Vec<u64>)> = (0..200)
        .map(|id| {
            let timeout = Duration::from_millis(timeout_ms(id));
            (
                Probe::new(id, timeout, &ledger, &readiness),
                vec![id as u64 % 9],
            )
        })
        .collect();
    let handles: Vec<_> = purgatory
        .watch_batch(batch)
        .into_iter()
        .map(pending)
        .collect();
    assert_eq!(purgatory.pending(), 200);
    clock.advance(Duration::from_millis(25));
    purgatory.advance_clock(Duration::ZERO);
    for id in 0..200 {
        let due = timeout_ms(id) <= 25;
        assert_eq!(ledger.is_completed(id), due, "operation {id} at 25 ms");
    }
    // Forcing a mix of expired and waiting operations wins only for the waiting ones.
    let waiting = (0..200).filter(|&id| timeout_ms(id) > 25).count();
    assert_eq!(purgatory.force_complete_batch(&handles), waiting);
    clock.advance(Duration::from_millis(100));
    purgatory.advance_clock(Duration::ZERO);
    for id in 0..200 {
        assert_eq!(ledger.completions(id), 1, "operation {id}");
        let how = if timeout_ms(id) <= 25 {
            Completion::Expired
        } else {
            Completion::Forced
        };
        assert_eq!(ledger.how(id), Some(how), "operation {id}");
    }
    assert_eq!(purgatory.pending(), 0);
    assert_eq!(purgatory.purge(), 200);
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn after_shutdown_every_operation_of_a_batch_is_handed_back_in_order() {
    let clock = ManualClock::new();
    let purgatory: Purgatory<u64, _> = manual_purgatory(&clock);
    let ledger = Ledger::new(70);
    let readiness: Readiness = never();
    purgatory.shutdown();
    let batch: Vec<(Probe, [u64; 1])> = (0..70)
        .map(|id| (Probe::new(id, LONG, &ledger, &readiness), [1]))
        .collect();
    let back: Vec<usize> = purgatory
        .watch_batch(batch)
        .into_iter()
        .map(|r| match r {
            Err(WatchError::Shutdown(op)) => op.id,
            _ => panic!("accepted after shutdown"),
        })
        .collect();
    assert_eq!(back, (0..70).collect::<Vec<_>>());
    assert_eq!(ledger.total_completions(), 0);
}

#[test]
fn a_handle_of_another_purgatory_forces_nothing() {
    let clock = ManualClock::new();
    let a: Purgatory<u64, Probe> = manual_purgatory(&clock);
    let b: Purgatory<u64, Probe> = manual_purgatory(&clock);
    let ledger = Ledger::new(1);
    let readiness = never();
    let handle = pending(a.watch(Probe::new(0, LONG, &ledger, &readiness), [1]));
    assert_eq!(b.force_complete_batch([&handle]), 0);
    assert!(!a.is_completed(&handle));
    assert!(b.is_completed(&handle), "names nothing in b");
    assert_eq!(a.force_complete_batch([&handle]), 1);
}

/// A clock that stops, once, at the watching thread's `stop_at`-th reading after it is
/// armed, until released, telling the test when it stopped.
#[cfg(feature = "metrics")]
struct StoppingClock {
    inner: ManualClock,
    armed: std::sync::atomic::AtomicBool,
    reads: std::sync::atomic::AtomicUsize,
    stop_at: usize,
    stopped: std::sync::mpsc::Sender<Event>,
    release: Mutex<std::sync::mpsc::Receiver<()>>,
}

/// What the watching thread tells the test: its clock stopped, or its watch returned
/// (how many results, how many refused).
#[cfg(feature = "metrics")]
enum Event {
    Stopped,
    Done(usize, usize),
}

#[cfg(feature = "metrics")]
#[derive(Clone)]
struct Stopping(Arc<StoppingClock>);

#[cfg(feature = "metrics")]
impl purgatory::Clock for Stopping {
    fn now(&self) -> Duration {
        let clock = &self.0;
        let watcher = std::thread::current().name() == Some("watcher");
        if watcher
            && clock.armed.load(SeqCst)
            && clock.reads.fetch_add(1, SeqCst) + 1 == clock.stop_at
        {
            let _ = clock.stopped.send(Event::Stopped);
            let _ = clock.release.lock().unwrap().recv();
        }
        clock.inner.now()
    }
}

/// Calls `check_and_complete` on another member's key from its `on_complete`, and
/// records which thread answered it.
#[cfg(feature = "metrics")]
struct ChecksAnother {
    purgatory: Arc<Mutex<Option<Purgatory<u64, ChecksAnother>>>>,
    other: u64,
    answered_by: Arc<Mutex<Vec<Option<String>>>>,
}

#[cfg(feature = "metrics")]
impl DelayedOperation for ChecksAnother {
    fn timeout(&self) -> Duration {
        Duration::from_millis(10)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, how: Completion) {
        let thread = std::thread::current().name().map(str::to_string);
        self.answered_by.lock().unwrap().push(thread);
        assert_eq!(how, Completion::Expired, "its timeout fired");
        let purgatory = self.purgatory.lock().unwrap().clone();
        if let Some(purgatory) = purgatory {
            purgatory.check_and_complete(&self.other);
        }
    }
}

/// From the review of issue #28: a chunk whose expiries were handed over to it (their
/// timeouts fired while the watch held their slots, between arming and letting go; a
/// shutdown's drain does the same) must answer them with none of the chunk's slots held:
/// an answer's `on_complete` that checks another member's key waited for the watching
/// thread itself, forever. The clock stops the watch at each of its readings in turn
/// while a round fires every timeout; the one after arming (the wait samples' of
/// feature `metrics`) is the window.
#[cfg(feature = "metrics")]
#[test]
fn a_chunk_answers_handed_over_expiries_with_none_of_its_slots_held() {
    const MEMBERS: u64 = 40;
    let mut answered_by_the_watch = 0;
    for stop_at in 1..=4 {
        let (events_tx, events) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let clock = Arc::new(StoppingClock {
            inner: ManualClock::new(),
            armed: std::sync::atomic::AtomicBool::new(false),
            reads: std::sync::atomic::AtomicUsize::new(0),
            stop_at,
            stopped: events_tx.clone(),
            release: Mutex::new(release_rx),
        });
        let purgatory: Purgatory<u64, ChecksAnother> = purgatory::PurgatoryBuilder::new()
            .timer(
                purgatory::TimerBuilder::new()
                    .clock(Stopping(Arc::clone(&clock)))
                    .reaper(false),
            )
            .build()
            .unwrap();
        let shared = Arc::new(Mutex::new(Some(purgatory.clone())));
        let answered_by = Arc::new(Mutex::new(Vec::new()));
        let batch: Vec<_> = (0..MEMBERS)
            .map(|k| {
                let op = ChecksAnother {
                    purgatory: Arc::clone(&shared),
                    other: (k + 1) % MEMBERS,
                    answered_by: Arc::clone(&answered_by),
                };
                (op, vec![k])
            })
            .collect();
        let watcher = {
            let purgatory = purgatory.clone();
            let clock = Arc::clone(&clock);
            std::thread::Builder::new()
                .name("watcher".into())
                .spawn(move || {
                    clock.armed.store(true, SeqCst);
                    let results = purgatory.watch_batch(batch);
                    let refused = results.iter().filter(|r| r.is_err()).count();
                    let _ = events_tx.send(Event::Done(results.len(), refused));
                })
                .unwrap()
        };
        let mut event = events.recv_timeout(Duration::from_secs(10));
        if let Ok(Event::Stopped) = event {
            // The watch holds its chunk's slots here (or has not taken them yet): every
            // timeout armed so far fires (a round never waits for a slot).
            clock.inner.advance(Duration::from_millis(20));
            purgatory.advance_clock(Duration::ZERO);
            release.send(()).unwrap();
            event = events.recv_timeout(Duration::from_secs(10));
        }
        let Ok(Event::Done(watched, refused)) = event else {
            panic!("stop {stop_at}: watch_batch never returned");
        };
        assert_eq!(watched, MEMBERS as usize);
        watcher.join().unwrap();
        // The rest time out now.
        clock.inner.advance(Duration::from_millis(20));
        purgatory.advance_clock(Duration::ZERO);
        purgatory.shutdown();
        *shared.lock().unwrap() = None;
        let answered_by = answered_by.lock().unwrap().clone();
        assert_eq!(refused, 0, "stop {stop_at}");
        assert_eq!(
            answered_by.len(),
            MEMBERS as usize,
            "stop {stop_at}: each answered once"
        );
        assert_eq!(purgatory.stats().panicked, 0, "stop {stop_at}");
        answered_by_the_watch += answered_by
            .iter()
            .filter(|t| t.as_deref() == Some("watcher"))
            .count();
    }
    assert!(
        answered_by_the_watch > 0,
        "no stop fell in the window: the test tests nothing"
    );
}
