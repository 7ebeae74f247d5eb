//! Exactly once under concurrency: every accepted operation gets one `on_complete`, no
//! more, no less, whoever races to complete it (events, forced completions, timeouts) or
//! to take it away (cancels); `on_expiration` follows exactly the expiries; cancelled
//! operations are handed back exactly once and never completed; and when the dust settles
//! the purgatory holds nothing and its counters add up.
//!
//! The probe's ledger (see `probe/mod.rs`) also flags, as they happen, concurrent
//! `try_complete`s, a `try_complete` after completion and double completions.

mod probe;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use probe::{splitmix, wait_until, Ledger, Probe, Readiness, Rng};
use purgatory::{
    Completion, Executor, OperationHandle, Purgatory, PurgatoryBuilder, TimerBuilder, WatchOutcome,
};

/// 100 operations, each on its own key, each ready only at its 20th `try_complete`;
/// 20 threads fire events on random keys at random moments while the operations are
/// being watched. None may be lost, none completed twice, none tried after completion.
#[test]
fn no_completion_is_lost_when_many_threads_check_at_once() {
    const OPS: usize = 100;
    const THREADS: usize = 20;
    const READY_AT: u32 = 20;

    let purgatory: Purgatory<usize, Probe> = Purgatory::new("contention");
    let ledger = Ledger::new(OPS);
    let ready: Readiness = Arc::new(|_, attempt| attempt >= READY_AT);
    let deadline = Instant::now() + Duration::from_secs(60);

    let checkers: Vec<_> = (0..THREADS)
        .map(|t| {
            let purgatory = purgatory.clone();
            let ledger = Arc::clone(&ledger);
            std::thread::spawn(move || {
                let mut rng = Rng::new(t as u64);
                let mut completed = 0;
                while (0..OPS).any(|id| !ledger.is_completed(id)) && Instant::now() < deadline {
                    completed += purgatory.check_and_complete(&(rng.below(OPS as u64) as usize));
                    match rng.below(4) {
                        0 => std::thread::yield_now(),
                        1 => std::thread::sleep(Duration::from_micros(rng.below(50))),
                        _ => {}
                    }
                }
                completed
            })
        })
        .collect();

    let mut completed_on_watch = 0;
    for id in 0..OPS {
        let op = Probe::new(id, Duration::from_secs(200), &ledger, &ready);
        if purgatory.try_complete_else_watch(op, [id]).unwrap() {
            completed_on_watch += 1;
        }
    }
    let completed_by_events: usize = checkers.into_iter().map(|c| c.join().unwrap()).sum();

    for id in 0..OPS {
        assert_eq!(ledger.completions(id), 1, "operation {id}");
        assert_eq!(ledger.how(id), Some(Completion::Ready), "operation {id}");
        assert_eq!(
            ledger.tries(id),
            READY_AT,
            "operation {id}: tried after completing"
        );
        assert_eq!(ledger.expirations(id), 0);
        assert_eq!(ledger.drops(id), 1);
    }
    assert_eq!(
        completed_on_watch, 0,
        "no operation is ready at its first two tries"
    );
    assert_eq!(
        completed_by_events, OPS,
        "check_and_complete counts what it completed"
    );
    assert_eq!(ledger.violations(), 0);
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched, stats.keys), (0, 0, 0));
    assert_eq!(stats.completed, OPS as u64);
}

/// Everything the chaos test records about its operations, beside the probe ledger.
struct Chaos {
    ops: usize,
    keys: u64,
    ledger: Arc<Ledger>,
    ready: Vec<AtomicBool>,
    all_ready: AtomicBool,
    short_timeout: Vec<AtomicBool>,
    returned: Vec<AtomicU32>,
    forced: Vec<AtomicU32>,
    /// Forced completions won by `force_complete_batch` (which reports a count only).
    forced_in_batches: AtomicU64,
    /// Operations handed back by `cancel` (by handle).
    cancelled_by_handle: AtomicU64,
}

impl Chaos {
    /// One to three keys per operation, derived from its id (repeats allowed: a key
    /// listed twice is watched twice).
    fn keys_of(&self, id: usize) -> Vec<u64> {
        let count = 1 + splitmix(id as u64) % 3;
        (0..count)
            .map(|j| splitmix((id as u64) * 4 + j + 1) % self.keys)
            .collect()
    }
}

/// How the chaos workers submit and force operations.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Calls {
    /// `watch` and `force_complete`, one operation per call.
    Single,
    /// Odd-numbered workers use `watch_batch` (batches of 1 to 100) and
    /// `force_complete_batch` (1 to 4 handles); the others one at a time.
    Mixed,
}

fn chaos(threads: usize, ops: usize, keys: u64, executor: Executor, calls: Calls) {
    let purgatory: Purgatory<u64, Probe> = PurgatoryBuilder::new()
        .name("chaos")
        .timer(TimerBuilder::new().executor(executor))
        .build()
        .unwrap();
    let ledger = Ledger::new(ops);
    let chaos = Arc::new(Chaos {
        ops,
        keys,
        ledger: Arc::clone(&ledger),
        ready: (0..ops).map(|_| AtomicBool::new(false)).collect(),
        all_ready: AtomicBool::new(false),
        short_timeout: (0..ops).map(|_| AtomicBool::new(false)).collect(),
        returned: (0..ops).map(|_| AtomicU32::new(0)).collect(),
        forced: (0..ops).map(|_| AtomicU32::new(0)).collect(),
        forced_in_batches: AtomicU64::new(0),
        cancelled_by_handle: AtomicU64::new(0),
    });
    let readiness: Readiness = {
        let chaos = Arc::clone(&chaos);
        Arc::new(move |id, _| chaos.all_ready.load(SeqCst) || chaos.ready[id].load(SeqCst))
    };

    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let purgatory = purgatory.clone();
            let chaos = Arc::clone(&chaos);
            let readiness = Arc::clone(&readiness);
            std::thread::spawn(move || {
                let mut rng = Rng::new(1000 + t as u64);
                let mut recent: Vec<(usize, OperationHandle<Probe>)> = Vec::new();
                let batched = calls == Calls::Mixed && t % 2 == 1;
                let mut batch: Vec<(Probe, Vec<u64>)> = Vec::new();
                let mut batch_size = 1 + rng.below(100) as usize;
                let ids: Vec<usize> = (t..chaos.ops).step_by(threads).collect();
                for (n, &id) in ids.iter().enumerate() {
                    let timeout = if rng.percent(40) {
                        chaos.short_timeout[id].store(true, SeqCst);
                        Duration::from_micros(rng.below(5_001))
                    } else {
                        Duration::from_secs(60)
                    };
                    if rng.percent(5) {
                        chaos.ready[id].store(true, SeqCst);
                    }
                    let op = Probe::new(id, timeout, &chaos.ledger, &readiness);
                    let results = if batched {
                        batch.push((op, chaos.keys_of(id)));
                        if batch.len() < batch_size && n + 1 < ids.len() {
                            Vec::new()
                        } else {
                            batch_size = 1 + rng.below(100) as usize;
                            let ids: Vec<usize> = batch.iter().map(|(op, _)| op.id).collect();
                            let results = purgatory.watch_batch(batch.drain(..));
                            assert_eq!(results.len(), ids.len());
                            ids.into_iter().zip(results).collect()
                        }
                    } else {
                        vec![(id, purgatory.watch(op, chaos.keys_of(id)))]
                    };
                    for (id, result) in results {
                        match result {
                            Ok(WatchOutcome::Pending(handle)) => {
                                if recent.len() < 64 {
                                    recent.push((id, handle));
                                } else {
                                    let slot = rng.below(64) as usize;
                                    recent[slot] = (id, handle);
                                }
                            }
                            Ok(WatchOutcome::Completed) => {}
                            Err(e) => panic!("operation {id} refused: {e}"),
                        }
                    }
                    // Events: make an earlier operation (maybe another thread's, maybe
                    // not watched yet) ready and fire on one of its keys.
                    if rng.percent(40) {
                        let target = rng.below(id as u64 + 1) as usize;
                        chaos.ready[target].store(true, SeqCst);
                        let keys = chaos.keys_of(target);
                        let key = keys[rng.below(keys.len() as u64) as usize];
                        purgatory.check_and_complete(&key);
                    }
                    if rng.percent(20) {
                        purgatory.check_and_complete(&rng.below(chaos.keys));
                    }
                    if rng.percent(5) && !recent.is_empty() {
                        if batched {
                            let count = 1 + rng.below(4);
                            let handles: Vec<_> = (0..count)
                                .map(|_| &recent[rng.below(recent.len() as u64) as usize].1)
                                .collect();
                            let won = purgatory.force_complete_batch(handles);
                            chaos.forced_in_batches.fetch_add(won as u64, SeqCst);
                        } else {
                            let (target, handle) = &recent[rng.below(recent.len() as u64) as usize];
                            if purgatory.force_complete(handle) {
                                chaos.forced[*target].fetch_add(1, SeqCst);
                            }
                        }
                    }
                    if rng.percent(3) && !recent.is_empty() {
                        // Cancel by handle: the operation comes back uncompleted, unless
                        // something else ended it first.
                        let (target, handle) = &recent[rng.below(recent.len() as u64) as usize];
                        if let Some(op) = purgatory.cancel(handle) {
                            assert_eq!(op.id, *target, "a handle cancelled another operation");
                            chaos.returned[op.id].fetch_add(1, SeqCst);
                            chaos.cancelled_by_handle.fetch_add(1, SeqCst);
                        }
                    }
                    if rng.below(1000) < 5 {
                        for op in purgatory.cancel_for_key(&rng.below(chaos.keys)) {
                            chaos.returned[op.id].fetch_add(1, SeqCst);
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }

    // Settle: every remaining operation becomes ready; one sweep over every key
    // completes them (each at its first key in sweep order) and drops every completed
    // entry (each at its own key).
    chaos.all_ready.store(true, SeqCst);
    for key in 0..keys {
        purgatory.check_and_complete(&key);
    }
    let returned_total = || -> u64 {
        chaos
            .returned
            .iter()
            .map(|r| u64::from(r.load(SeqCst)))
            .sum()
    };
    assert!(
        wait_until(Duration::from_secs(30), || {
            ledger.total_completions() + returned_total() == ops as u64
                && purgatory.stats().pending == 0
        }),
        "not every operation was answered: {} completed, {} handed back, {} pending, of {ops}",
        ledger.total_completions(),
        returned_total(),
        purgatory.stats().pending
    );
    purgatory.purge();

    let mut breaches = Vec::new();
    for id in 0..ops {
        let completions = ledger.completions(id);
        let returned = chaos.returned[id].load(SeqCst);
        let how = ledger.how(id);
        let expired = how == Some(Completion::Expired);
        if completions + returned != 1 {
            breaches.push(format!(
                "op {id}: {completions} on_complete, handed back {returned} times"
            ));
        }
        if ledger.expirations(id) != u32::from(expired) {
            breaches.push(format!(
                "op {id}: {how:?} with {} on_expiration",
                ledger.expirations(id)
            ));
        }
        if expired && !chaos.short_timeout[id].load(SeqCst) {
            breaches.push(format!("op {id}: a 60 s timeout expired"));
        }
        // Forces won by `force_complete_batch` are only counted in total, below.
        let forced = chaos.forced[id].load(SeqCst);
        let expected = u32::from(how == Some(Completion::Forced));
        if forced > expected || (calls == Calls::Single && forced != expected) {
            breaches.push(format!(
                "op {id}: force won {forced} times, completed {how:?}"
            ));
        }
        if ledger.drops(id) != 1 {
            breaches.push(format!("op {id}: dropped {} times", ledger.drops(id)));
        }
    }
    assert!(
        breaches.is_empty(),
        "{} breaches, first: {:#?}",
        breaches.len(),
        &breaches[..breaches.len().min(10)]
    );
    assert_eq!(ledger.violations(), 0);
    let forced_singly: u64 = chaos.forced.iter().map(|f| u64::from(f.load(SeqCst))).sum();
    assert_eq!(
        forced_singly + chaos.forced_in_batches.load(SeqCst),
        ledger.count(Completion::Forced),
        "every forced completion was won by exactly one force call"
    );

    let stats = purgatory.stats();
    assert_eq!(
        (stats.pending, stats.watched, stats.keys),
        (0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(stats.completed, ledger.count(Completion::Ready));
    assert_eq!(stats.forced, ledger.count(Completion::Forced));
    assert_eq!(stats.expired, ledger.count(Completion::Expired));
    assert_eq!(stats.cancelled, returned_total());
    assert_eq!(
        stats.completed + stats.forced + stats.expired + stats.cancelled,
        ops as u64,
        "{stats:?}"
    );
    assert_eq!(stats.panicked, 0);
    // Every kind of ending happened, or the test did not test the races it claims to.
    assert!(
        stats.completed > 0 && stats.forced > 0 && stats.expired > 0 && stats.cancelled > 0,
        "{stats:?}"
    );
    let by_handle = chaos.cancelled_by_handle.load(SeqCst);
    assert!(
        by_handle > 0 && by_handle < stats.cancelled,
        "cancels by handle ({by_handle}) and by key ({}) both happened",
        stats.cancelled - by_handle
    );
    eprintln!("chaos: {stats:?}");
}

/// 8 threads, 200,000 operations over 1,000 keys, expiries on the reaper thread.
#[test]
fn every_operation_ends_exactly_once_under_chaos() {
    chaos(8, 200_000, 1_000, Executor::Inline, Calls::Single);
}

/// The same with half the workers watching and forcing in batches.
#[test]
fn every_operation_ends_exactly_once_under_chaos_with_batches() {
    chaos(8, 200_000, 1_000, Executor::Inline, Calls::Mixed);
}

/// The same with expiries run on a pool while the reaper goes on.
#[test]
fn every_operation_ends_exactly_once_under_chaos_with_pooled_expiry() {
    chaos(8, 50_000, 1_000, Executor::pool(2).unwrap(), Calls::Single);
}
