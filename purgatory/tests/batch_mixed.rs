//! `watch_batch` with every kind of refusal mixed into one batch, at the sizes where its
//! paths change (one by one below 32, chunks of 64 above): operations with no keys, a
//! panicking `timeout()`, a key whose `Hash` panics, a key whose `Eq` panics, ready at
//! their one try, and waiting, with keys repeated within an operation and across
//! operations. Each operation must get exactly one result at its own position (its own
//! operation handed back in a refusal), each waiting one be listed on every key in input
//! order (across chunks and shards), and every key and operation be dropped exactly once
//! by the end. A second test refuses a whole chunk at its arming: a shutdown lands while
//! the chunk lists its keys.

mod probe;

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use probe::{manual_purgatory, Ledger, Probe, Readiness, Rng};
use purgatory::{Completion, DelayedOperation, ManualClock, Purgatory, WatchError, WatchOutcome};

const LONG: Duration = Duration::from_secs(60);

/// What a key is: fine keys of a small pool (so operations share them), a key whose
/// `Hash` panics, and keys that all hash alike (`Eq` runs among them), one of which
/// panics when compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Fine(u32),
    HashBomb,
    EqBomb,
    Colliding(u32),
}

/// A key counting its live copies (made, cloned, dropped), so a key leaked or dropped
/// twice shows at the end; with an optional gate its first `Hash` waits for the test.
#[derive(Debug)]
struct Key {
    kind: Kind,
    live: Arc<AtomicI64>,
    gate: Option<Arc<Gate>>,
}

#[derive(Debug)]
struct Gate {
    first: AtomicBool,
    entered: Barrier,
    released: Barrier,
}

impl Key {
    fn new(kind: Kind, live: &Arc<AtomicI64>) -> Self {
        live.fetch_add(1, SeqCst);
        Key {
            kind,
            live: Arc::clone(live),
            gate: None,
        }
    }
}

impl Clone for Key {
    fn clone(&self) -> Self {
        self.live.fetch_add(1, SeqCst);
        Key {
            kind: self.kind,
            live: Arc::clone(&self.live),
            gate: self.gate.clone(),
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        let before = self.live.fetch_sub(1, SeqCst);
        assert!(before > 0, "a key dropped more often than made");
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if let Some(gate) = &self.gate {
            if gate.first.swap(false, SeqCst) {
                gate.entered.wait();
                gate.released.wait();
            }
        }
        match self.kind {
            Kind::Fine(n) => n.hash(state),
            Kind::HashBomb => panic!("Hash of a hostile key (on purpose)"),
            Kind::EqBomb | Kind::Colliding(_) => u32::MAX.hash(state),
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        match (self.kind, other.kind) {
            (Kind::EqBomb, _) | (_, Kind::EqBomb) => panic!("Eq of a hostile key (on purpose)"),
            (a, b) => a == b,
        }
    }
}

impl Eq for Key {}

/// A probe whose `timeout()` may panic.
#[derive(Debug)]
struct Op {
    probe: Probe,
    bad_timeout: bool,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        if self.bad_timeout {
            panic!("timeout() of operation {} (on purpose)", self.probe.id);
        }
        self.probe.timeout()
    }
    fn try_complete(&mut self) -> bool {
        self.probe.try_complete()
    }
    fn on_complete(&mut self, how: Completion) {
        self.probe.on_complete(how)
    }
    fn on_expiration(&mut self) {
        self.probe.on_expiration()
    }
}

/// What an operation of the batch is made to be, and so the result it must get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Waits,
    Ready,
    NoKeys,
    BadTimeout,
    HashBomb,
    EqBomb,
}

/// The keys of an operation planned `plan`: one to five of the pool (repeats likely),
/// with its hostile keys (one or two) anywhere among them.
fn keys_for(plan: Plan, rng: &mut Rng) -> Vec<Kind> {
    if plan == Plan::NoKeys {
        return Vec::new();
    }
    let mut keys: Vec<Kind> = (0..1 + rng.below(5))
        .map(|_| match rng.below(4) {
            0 => Kind::Colliding(rng.below(3) as u32),
            _ => Kind::Fine(rng.below(6) as u32),
        })
        .collect();
    let bomb = match plan {
        Plan::HashBomb => Some(Kind::HashBomb),
        Plan::EqBomb => Some(Kind::EqBomb),
        _ => None,
    };
    if let Some(bomb) = bomb {
        for _ in 0..1 + rng.below(2) {
            let at = rng.below(keys.len() as u64 + 1) as usize;
            keys.insert(at, bomb);
        }
    }
    keys
}

#[test]
fn mixed_refusals_at_every_batch_size_get_one_result_each_in_order_and_drop_everything_once() {
    for seed in 0..6 {
        mixed_batches(seed);
    }
}

fn mixed_batches(seed: u64) {
    const SIZES: [usize; 13] = [1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 130, 200];
    let total: usize = SIZES.iter().sum();
    let mut rng = Rng::new(seed);
    let clock = ManualClock::new();
    let live = Arc::new(AtomicI64::new(0));
    // One more: an operation on `Colliding(0)` watched first, so that every `EqBomb`
    // is compared (and panics) whenever it is listed.
    let ledger = Ledger::new(total + 1);
    let anchor = total;
    let plans: Vec<Plan> = (0..total)
        .map(|_| match rng.below(20) {
            0 => Plan::NoKeys,
            1 => Plan::BadTimeout,
            2 => Plan::HashBomb,
            3 => Plan::EqBomb,
            4..=6 => Plan::Ready,
            _ => Plan::Waits,
        })
        .collect();
    let keys: Vec<Vec<Kind>> = plans.iter().map(|&plan| keys_for(plan, &mut rng)).collect();
    let ready_plans: Arc<Vec<bool>> = Arc::new(plans.iter().map(|&p| p == Plan::Ready).collect());
    // Which operations were tried, in order, while `logging` is set.
    let log = Arc::new(Mutex::new(Vec::new()));
    let logging = Arc::new(AtomicBool::new(false));
    let readiness: Readiness = {
        let (log, logging, ready_plans) = (log.clone(), logging.clone(), ready_plans.clone());
        Arc::new(move |id, _| {
            if logging.load(SeqCst) {
                log.lock().unwrap().push(id);
            }
            ready_plans.get(id).copied().unwrap_or(false)
        })
    };
    let purgatory: Purgatory<Key, Op> = manual_purgatory(&clock);
    let op = |id: usize| Op {
        probe: Probe::new(id, LONG, &ledger, &readiness),
        bad_timeout: id < total && plans[id] == Plan::BadTimeout,
    };
    assert!(matches!(
        purgatory.watch(op(anchor), [Key::new(Kind::Colliding(0), &live)]),
        Ok(WatchOutcome::Pending(_))
    ));
    let mut start = 0;
    let mut handed_back = Vec::new();
    for size in SIZES {
        let ids = start..start + size;
        start += size;
        let batch: Vec<(Op, Vec<Key>)> = ids
            .clone()
            .map(|id| {
                let keys = keys[id].iter().map(|&kind| Key::new(kind, &live)).collect();
                (op(id), keys)
            })
            .collect();
        let results = purgatory.watch_batch(batch);
        assert_eq!(
            results.len(),
            size,
            "seed {seed}, size {size}: one result each"
        );
        for (id, result) in ids.zip(results) {
            let at = format!("seed {seed}, size {size}, operation {id} ({:?})", plans[id]);
            match (plans[id], result) {
                (Plan::Waits, Ok(WatchOutcome::Pending(_))) => {}
                (Plan::Ready, Ok(WatchOutcome::Completed)) => {
                    assert_eq!(ledger.how(id), Some(Completion::Ready), "{at}");
                }
                (Plan::NoKeys, Err(WatchError::NoKeys(op)))
                | (Plan::BadTimeout, Err(WatchError::TimeoutPanicked(op)))
                | (Plan::HashBomb | Plan::EqBomb, Err(WatchError::KeyPanicked(op))) => {
                    assert_eq!(op.probe.id, id, "{at}: its own operation handed back");
                    handed_back.push(op);
                }
                (_, other) => panic!("{at}: got {:?}", other.map(|_| ())),
            }
            if plans[id] != Plan::Ready {
                assert_eq!(ledger.completions(id), 0, "{at}: answered on watch");
            }
        }
    }
    // Only the keys kept by the lists are alive: one per key listed.
    let waits = |id: &usize| plans[*id] == Plan::Waits;
    let stats = purgatory.stats();
    let bombs = keys
        .iter()
        .flatten()
        .filter(|k| matches!(k, Kind::HashBomb | Kind::EqBomb))
        .count();
    let bad_timeouts = plans.iter().filter(|&&p| p == Plan::BadTimeout).count();
    assert_eq!(stats.panicked, (bombs + bad_timeouts) as u64, "seed {seed}");
    assert_eq!(
        stats.pending,
        1 + (0..total).filter(waits).count(),
        "seed {seed}"
    );
    let live_entries: usize = 1
        + (0..total)
            .filter(waits)
            .map(|id| keys[id].len())
            .sum::<usize>();
    assert_eq!(stats.watched_live, live_entries, "seed {seed}: {stats:?}");
    assert_eq!(
        live.load(SeqCst),
        stats.keys as i64,
        "seed {seed}: keys alive besides the lists' own ({stats:?})"
    );
    // Per key, the waiting operations in input order (those refused or completed are
    // stale there: not tried).
    logging.store(true, SeqCst);
    let pool = (0..6).map(Kind::Fine).chain((0..3).map(Kind::Colliding));
    for kind in pool {
        log.lock().unwrap().clear();
        assert_eq!(purgatory.check_and_complete(&Key::new(kind, &live)), 0);
        let mut tried: Vec<usize> = Vec::new();
        for &id in log.lock().unwrap().iter() {
            if !tried.contains(&id) {
                tried.push(id);
            }
        }
        let mut expected: Vec<usize> = (0..total)
            .filter(|id| waits(id) && keys[*id].contains(&kind))
            .collect();
        if kind == Kind::Colliding(0) {
            expected.insert(0, anchor);
        }
        assert_eq!(tried, expected, "seed {seed}: the order on {kind:?}");
    }
    logging.store(false, SeqCst);
    // Every waiting operation expires once at its timeout; the others are never answered.
    clock.advance(LONG);
    purgatory.advance_clock(Duration::ZERO);
    for (id, plan) in plans.iter().enumerate() {
        let expected = match plan {
            Plan::Waits => Some(Completion::Expired),
            Plan::Ready => Some(Completion::Ready),
            _ => None,
        };
        assert_eq!(ledger.how(id), expected, "seed {seed}, operation {id}");
        assert_eq!(
            ledger.completions(id),
            u32::from(expected.is_some()),
            "seed {seed}, operation {id}"
        );
    }
    purgatory.purge();
    let stats = purgatory.stats();
    assert_eq!(
        (stats.pending, stats.watched, stats.keys),
        (0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(live.load(SeqCst), 0, "seed {seed}: a key leaked");
    drop(handed_back);
    for id in 0..=total {
        assert_eq!(
            ledger.drops(id),
            1,
            "seed {seed}, operation {id} dropped once"
        );
    }
    assert_eq!(ledger.violations(), 0);
    drop(purgatory);
    assert_eq!(live.load(SeqCst), 0);
}

/// A shutdown that lands while a chunk lists its keys (the first `Hash` of operation 40
/// waits for it): every operation the chunk admitted is refused at its arming, with
/// `Shutdown` and itself, at its own position (an operation refused at step 1 keeps its
/// own refusal), and the next chunk is refused at its admission; none is answered, no
/// timer entry stays armed, and every key and operation is dropped once.
#[test]
fn a_shutdown_while_a_chunk_lists_refuses_each_operation_once_in_place() {
    const N: usize = 100;
    let live = Arc::new(AtomicI64::new(0));
    let ledger = Ledger::new(N);
    let never: Readiness = Arc::new(|_, _| false);
    let purgatory: Purgatory<Key, Op> = purgatory::PurgatoryBuilder::new()
        .name("batch-racing-shutdown")
        .build()
        .unwrap();
    let gate = Arc::new(Gate {
        first: AtomicBool::new(true),
        entered: Barrier::new(2),
        released: Barrier::new(2),
    });
    let batch: Vec<(Op, Vec<Key>)> = (0..N)
        .map(|id| {
            let mut keys: Vec<Key> = match id {
                10 => Vec::new(),
                20 => vec![Key::new(Kind::HashBomb, &live)],
                _ => vec![
                    Key::new(Kind::Fine(id as u32 % 5), &live),
                    Key::new(Kind::Fine(7), &live),
                ],
            };
            if id == 40 {
                keys[1].gate = Some(Arc::clone(&gate));
            }
            let op = Op {
                probe: Probe::new(id, LONG, &ledger, &never),
                bad_timeout: id == 30,
            };
            (op, keys)
        })
        .collect();
    let watcher = {
        let purgatory = purgatory.clone();
        std::thread::spawn(move || {
            purgatory
                .watch_batch(batch)
                .into_iter()
                .map(|result| match result {
                    Ok(_) => Err("accepted".to_string()),
                    Err(WatchError::NoKeys(op)) => Ok(("no keys", op.probe.id)),
                    Err(WatchError::KeyPanicked(op)) => Ok(("key", op.probe.id)),
                    Err(WatchError::TimeoutPanicked(op)) => Ok(("timeout", op.probe.id)),
                    Err(WatchError::Shutdown(op)) => Ok(("shutdown", op.probe.id)),
                    Err(other) => Err(format!("{other:?}")),
                })
                .collect::<Vec<_>>()
        })
    };
    gate.entered.wait();
    purgatory.shutdown();
    gate.released.wait();
    let results = watcher.join().expect("the batch returns");
    assert_eq!(results.len(), N);
    for (id, result) in results.into_iter().enumerate() {
        let why = match id {
            10 => "no keys",
            20 => "key",
            30 => "timeout",
            _ => "shutdown",
        };
        assert_eq!(result, Ok((why, id)), "operation {id}");
    }
    let stats = purgatory.stats();
    assert_eq!(stats.pending, 0, "nothing armed: {stats:?}");
    assert_eq!(ledger.total_completions(), 0);
    for id in 0..N {
        assert_eq!(ledger.drops(id), 1, "operation {id} dropped once");
    }
    assert_eq!(ledger.violations(), 0);
    // The keys the chunk listed after shutdown emptied the lists stay until the
    // purgatory's memory goes.
    drop(purgatory);
    assert_eq!(live.load(SeqCst), 0, "a key leaked or was dropped twice");
}
