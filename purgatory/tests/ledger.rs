//! The randomized ledger: several threads make every call of the API at random (single,
//! keyless and batch watches, events, checks, forces single and batched, cancels by handle, by
//! guard and by key, timeouts reset to short or long deadlines, `is_completed`, purges), on handles that are often stale, with a
//! fifth of the operations on keys nobody ever checks, guards dropped on another thread,
//! clones of the purgatory made and dropped concurrently, and the purgatory shut down in
//! the middle of the run (or by the drop of its last handle). Epoch after epoch, each on a
//! fresh purgatory, until the time budget is spent. Every fourth epoch, one expiry
//! callback in 2,000 blocks 10 ms on a stand-in bound of 3 ms, so stand-ins take the
//! reaper's work over while everything else goes on.
//!
//! Every epoch ends with every operation accounted for, exactly once: answered
//! (`on_complete`, once), handed back by a cancel, or refused (given back in the error).
//! The probe's ledger (`probe/mod.rs`) flags on the fly a `try_complete` run concurrently
//! or after completion, a second `on_complete`, an `on_expiration` without an expiry, a
//! second drop. An operation whose timeout a reset moved to 60 s (and never back) is not
//! answered as timed out. Nothing is answered after a successful cancel (the operation came back:
//! its ledger shows no `on_complete`). The purgatory's counters equal the ledger's.
//!
//! The budget is 15 s by default (about ten epochs on two cores), `LEDGER_SECS` for more;
//! the totals are printed at the end (`cargo test --release --test ledger -- --nocapture`).

mod probe;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use probe::{Ledger, Probe, Readiness, Rng};
use purgatory::{
    Completion, Executor, OperationHandle, Purgatory, PurgatoryBuilder, TimerBuilder, WatchError,
    WatchOutcome,
};

/// Keys that events and checks use; keys at and above it are never checked.
const CHECKED_KEYS: u64 = 2_000;
const UNCHECKED_KEYS: u64 = 500;
const WORKERS: usize = 4;
/// Operations per epoch (at most: the epoch's time may run out first).
const OPS: usize = 400_000;

/// What one epoch records besides the probe's ledger.
struct Epoch {
    ledger: Arc<Ledger>,
    ready: Vec<AtomicBool>,
    /// Ids handed out so far.
    next_id: AtomicUsize,
    /// Per operation: handed back by `cancel` or `cancel_for_key` to this test.
    returned: Vec<AtomicU32>,
    /// Per operation: given back in a `WatchError`.
    refused: Vec<AtomicU32>,
    /// Per operation: a guard was made for it (it may have been cancelled by the guard's
    /// drop, which hands the operation to no one).
    guarded: Vec<AtomicBool>,
    /// Per operation: its timeout was short (it may expire before shutdown), at the
    /// watch or by a reset.
    short: Vec<AtomicBool>,
    /// Per operation: a reset to 60 s won (its timer had not fired). Unless a reset to a
    /// short timeout came too, it can no longer expire by its timeout in an epoch.
    moved_long: Vec<AtomicBool>,
    /// Per operation: a reset to a short timeout was tried.
    reset_short: Vec<AtomicBool>,
    /// Resets that moved a deadline, and resets that found nothing to move.
    resets: [AtomicU64; 2],
    /// Calls made into the purgatory.
    calls: AtomicU64,
    shut_down: AtomicBool,
    /// Some expiry callbacks block (every fourth epoch, inline, with a short stand-in
    /// bound), so stand-ins take over the reaper's work while everything else goes on.
    stalls: bool,
}

impl Epoch {
    fn new(stalls: bool) -> Arc<Self> {
        Arc::new(Epoch {
            ledger: Ledger::new(OPS),
            ready: (0..OPS).map(|_| AtomicBool::new(false)).collect(),
            next_id: AtomicUsize::new(0),
            returned: (0..OPS).map(|_| AtomicU32::new(0)).collect(),
            refused: (0..OPS).map(|_| AtomicU32::new(0)).collect(),
            guarded: (0..OPS).map(|_| AtomicBool::new(false)).collect(),
            short: (0..OPS).map(|_| AtomicBool::new(false)).collect(),
            moved_long: (0..OPS).map(|_| AtomicBool::new(false)).collect(),
            reset_short: (0..OPS).map(|_| AtomicBool::new(false)).collect(),
            resets: [AtomicU64::new(0), AtomicU64::new(0)],
            calls: AtomicU64::new(0),
            shut_down: AtomicBool::new(false),
            stalls,
        })
    }

    fn keys_of(&self, id: usize) -> Vec<u64> {
        let seed = probe::splitmix(id as u64);
        let count = 1 + seed % 3;
        // A fifth of the operations wait only on keys nobody checks.
        let unchecked = seed % 5 == 0;
        (0..count)
            .map(|j| {
                let k = probe::splitmix(seed + j);
                if unchecked {
                    CHECKED_KEYS + k % UNCHECKED_KEYS
                } else {
                    k % CHECKED_KEYS
                }
            })
            .collect()
    }

    fn call(&self) {
        self.calls.fetch_add(1, SeqCst);
    }

    fn refuse(&self, error: WatchError<Probe>) {
        let op = error.into_operation();
        assert!(
            self.shut_down.load(SeqCst),
            "operation {} refused before shutdown",
            op.id
        );
        self.refused[op.id].fetch_add(1, SeqCst);
    }
}

/// A new operation for `epoch`, or `None` once the epoch has handed out all its ids.
fn new_op(epoch: &Epoch, rng: &mut Rng, readiness: &Readiness) -> Option<(Probe, Vec<u64>)> {
    let id = epoch.next_id.fetch_add(1, SeqCst);
    if id >= OPS {
        return None;
    }
    let timeout = if rng.percent(30) {
        epoch.short[id].store(true, SeqCst);
        Duration::from_micros(rng.below(3_000))
    } else {
        Duration::from_secs(60)
    };
    if rng.percent(5) {
        epoch.ready[id].store(true, SeqCst);
    }
    let mut op = Probe::new(id, timeout, &epoch.ledger, readiness);
    if epoch.stalls && rng.below(2_000) == 0 {
        // Blocks its expiry's thread well past the stand-in's bound: on the reaper, a
        // stand-in takes over the rest of the batch and the rounds.
        op = op.stalling_on_expiration(Duration::from_millis(10));
    }
    Some((op, epoch.keys_of(id)))
}

/// Handles a worker keeps: recent ones, many of them stale by the time they are used.
struct Recent(Vec<(usize, OperationHandle<Probe>)>);

impl Recent {
    fn add(&mut self, rng: &mut Rng, id: usize, handle: OperationHandle<Probe>) {
        if self.0.len() < 128 {
            self.0.push((id, handle));
        } else {
            let at = rng.below(128) as usize;
            self.0[at] = (id, handle);
        }
    }

    fn pick(&self, rng: &mut Rng) -> Option<(usize, OperationHandle<Probe>)> {
        (!self.0.is_empty()).then(|| self.0[rng.below(self.0.len() as u64) as usize])
    }
}

/// One worker's run: random calls until `until` or the epoch's ids run out.
#[allow(clippy::too_many_arguments)]
fn worker(
    purgatory: Purgatory<u64, Probe>,
    epoch: Arc<Epoch>,
    readiness: Readiness,
    seed: u64,
    until: Instant,
    shut_down_at: Option<usize>,
    guards: crossbeam_channel::Sender<purgatory::CancelOnDrop<u64, Probe>>,
) {
    let mut rng = Rng::new(seed);
    let mut recent = Recent(Vec::new());
    let mut shut_down_at = shut_down_at;
    while Instant::now() < until {
        if shut_down_at.is_some_and(|at| epoch.next_id.load(SeqCst) >= at) {
            shut_down_at = None;
            epoch.shut_down.store(true, SeqCst);
            epoch.call();
            purgatory.shutdown();
        }
        epoch.call();
        match rng.below(100) {
            0..=29 => {
                let Some((op, keys)) = new_op(&epoch, &mut rng, &readiness) else {
                    break;
                };
                let id = op.id;
                let result = if rng.percent(10) {
                    // Keyless: events on its keys never reach it; its timeout, a force,
                    // a cancel, a guard or shutdown does.
                    drop(keys);
                    purgatory.watch_keyless(op)
                } else if rng.percent(50) {
                    purgatory.watch(op, keys)
                } else {
                    purgatory
                        .try_complete_else_watch(op, keys)
                        .map(|_| WatchOutcome::Completed)
                };
                match result {
                    Ok(WatchOutcome::Pending(handle)) => recent.add(&mut rng, id, handle),
                    Ok(WatchOutcome::Completed) => {}
                    Err(error) => epoch.refuse(error),
                }
            }
            30..=33 => {
                // Under 32 a batch is watched one by one, from 32 in chunks: both.
                let size = 1 + rng.below(100) as usize;
                let batch: Vec<(Probe, Vec<u64>)> = (0..size)
                    .map_while(|_| new_op(&epoch, &mut rng, &readiness))
                    .collect();
                let ids: Vec<usize> = batch.iter().map(|(op, _)| op.id).collect();
                for (id, result) in ids.into_iter().zip(purgatory.watch_batch(batch)) {
                    match result {
                        Ok(WatchOutcome::Pending(handle)) => recent.add(&mut rng, id, handle),
                        Ok(WatchOutcome::Completed) => {}
                        Err(error) => epoch.refuse(error),
                    }
                }
            }
            34..=59 => {
                // An event: some operation handed out so far becomes ready, and one of its
                // keys (maybe one nobody else checks) is checked.
                let handed = epoch.next_id.load(SeqCst).min(OPS);
                if handed > 0 {
                    let target = rng.below(handed as u64) as usize;
                    epoch.ready[target].store(true, SeqCst);
                    let keys = epoch.keys_of(target);
                    let key = keys[rng.below(keys.len() as u64) as usize];
                    if key < CHECKED_KEYS {
                        purgatory.check_and_complete(&key);
                    }
                }
            }
            60..=69 => {
                purgatory.check_and_complete(&rng.below(CHECKED_KEYS));
            }
            70..=75 => {
                if rng.percent(50) {
                    if let Some((_, handle)) = recent.pick(&mut rng) {
                        purgatory.force_complete(&handle);
                    }
                } else {
                    let handles: Vec<_> = (0..1 + rng.below(8))
                        .filter_map(|_| recent.pick(&mut rng).map(|(_, h)| h))
                        .collect();
                    purgatory.force_complete_batch(handles.iter());
                }
            }
            76..=80 => {
                if let Some((id, handle)) = recent.pick(&mut rng) {
                    if let Some(op) = purgatory.cancel(&handle) {
                        assert_eq!(op.id, id, "a handle cancelled another operation");
                        epoch.returned[id].fetch_add(1, SeqCst);
                    }
                }
            }
            81..=86 => {
                if let Some((id, handle)) = recent.pick(&mut rng) {
                    let guard = purgatory.cancel_on_drop(handle);
                    if rng.percent(50) {
                        epoch.guarded[id].store(true, SeqCst);
                        // Dropped on the guard thread, whenever it gets there.
                        let _ = guards.send(guard);
                    } else {
                        let _ = guard.disarm();
                    }
                }
            }
            87 => {
                if rng.percent(20) {
                    for op in purgatory.cancel_for_key(&rng.below(CHECKED_KEYS + UNCHECKED_KEYS)) {
                        epoch.returned[op.id].fetch_add(1, SeqCst);
                    }
                }
            }
            88..=91 => {
                // A heartbeat: the deadline moved, to a short timeout (it may then expire
                // in this epoch) or to 60 s (it may not, unless moved back again).
                if let Some((id, handle)) = recent.pick(&mut rng) {
                    let short = rng.percent(30);
                    let timeout = if short {
                        epoch.short[id].store(true, SeqCst);
                        epoch.reset_short[id].store(true, SeqCst);
                        Duration::from_micros(rng.below(3_000))
                    } else {
                        Duration::from_secs(60)
                    };
                    let moved = purgatory.reset_timeout(&handle, timeout);
                    if moved && !short {
                        epoch.moved_long[id].store(true, SeqCst);
                    }
                    epoch.resets[usize::from(!moved)].fetch_add(1, SeqCst);
                }
            }
            92..=96 => {
                if let Some((id, handle)) = recent.pick(&mut rng) {
                    if !purgatory.is_completed(&handle) {
                        // Still waiting a moment ago: it cannot have been answered before
                        // it was watched, and a cancel would have returned it.
                        assert_eq!(epoch.returned[id].load(SeqCst), 0, "operation {id}");
                    }
                }
            }
            97 => {
                // A clone made and dropped, while others are in use.
                drop(purgatory.clone());
            }
            98 => {
                if rng.percent(10) {
                    purgatory.purge();
                } else if rng.percent(3) {
                    burst(&purgatory, &epoch, &mut rng, &readiness, &mut recent);
                }
            }
            _ => {
                let _ = purgatory.stats();
            }
        }
    }
    // Dropped here, concurrently with the other workers' clones.
    drop(purgatory);
}

/// A burst: thousands of operations watched in one batch and forced in one batch, then a
/// purge, which gives back the op table's segments the burst grew (once what else is in
/// flight fits in half of what remains) while the other workers go on, their handles
/// and list entries often naming slots of the segments given back; a few of the burst's
/// handles, stale now, join the recent ones.
fn burst(
    purgatory: &Purgatory<u64, Probe>,
    epoch: &Epoch,
    rng: &mut Rng,
    readiness: &Readiness,
    recent: &mut Recent,
) {
    let size = 1_000 + rng.below(4_000) as usize;
    let batch: Vec<(Probe, Vec<u64>)> = (0..size)
        .map_while(|_| new_op(epoch, rng, readiness))
        .collect();
    let ids: Vec<usize> = batch.iter().map(|(op, _)| op.id).collect();
    let mut handles = Vec::new();
    for (id, result) in ids.into_iter().zip(purgatory.watch_batch(batch)) {
        match result {
            Ok(WatchOutcome::Pending(handle)) => {
                if rng.percent(1) {
                    recent.add(rng, id, handle);
                }
                handles.push(handle);
            }
            Ok(WatchOutcome::Completed) => {}
            Err(error) => epoch.refuse(error),
        }
    }
    purgatory.force_complete_batch(handles.iter());
    purgatory.purge();
}

/// What an epoch ran.
#[derive(Default)]
struct Totals {
    epochs: u64,
    operations: u64,
    calls: u64,
    answered: u64,
    expired: u64,
    cancelled: u64,
    refused: u64,
    /// Resets that moved a deadline, and those that found nothing to move.
    resets: [u64; 2],
}

fn run_epoch(number: u64, budget: Duration, totals: &mut Totals) {
    let stalls = number % 4 == 0;
    let epoch = Epoch::new(stalls);
    let executor = if number % 2 == 0 {
        Executor::Inline
    } else {
        Executor::pool(2).unwrap()
    };
    let mut timer = TimerBuilder::new().executor(executor);
    if stalls {
        timer = timer.stand_in(Some(Duration::from_millis(3)));
    }
    // Every third epoch (1, 4, 7, ...), the purgatory is a member of a `TimerGroup`,
    // beside a neighbour of other types whose own traffic (and whose callbacks) share the
    // reaper; the group's shutdown (from the neighbour, in turn with the purgatory's own
    // call) answers both.
    let group = (number % 3 == 1).then(|| {
        purgatory::TimerGroup::builder()
            .name("ledger-group")
            .timer(timer.clone())
            .build()
            .unwrap()
    });
    let purgatory: Purgatory<u64, Probe> = match &group {
        Some(group) => PurgatoryBuilder::new()
            .name("ledger")
            .build_on(group)
            .unwrap(),
        None => PurgatoryBuilder::new()
            .name("ledger")
            .timer(timer)
            .build()
            .unwrap(),
    };
    let neighbour = group.as_ref().map(|group| Neighbour::start(group, number));
    let readiness: Readiness = {
        let epoch = Arc::clone(&epoch);
        Arc::new(move |id, _| epoch.ready[id].load(SeqCst))
    };
    // Every third epoch ends with the drop of the last handle instead of a shutdown call.
    let explicit_shutdown = number % 3 != 2;
    let until = Instant::now() + budget;
    let (guards, guard_inbox) = crossbeam_channel::unbounded();
    let dropper = std::thread::spawn(move || {
        for guard in guard_inbox {
            drop(guard);
        }
    });
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (purgatory, epoch, readiness, guards) = (
                purgatory.clone(),
                Arc::clone(&epoch),
                Arc::clone(&readiness),
                guards.clone(),
            );
            // One worker shuts the purgatory down part way through, once 60 to 95 % of
            // the epoch's operations are handed out (or at the end, if time runs out).
            let shut_down_at = (explicit_shutdown && w == 0)
                .then_some(OPS * (60 + (number as usize * 7) % 36) / 100);
            let seed = number * 100 + w as u64;
            std::thread::spawn(move || {
                worker(
                    purgatory,
                    epoch,
                    readiness,
                    seed,
                    until,
                    shut_down_at,
                    guards,
                )
            })
        })
        .collect();
    drop(guards);
    for w in workers {
        w.join().unwrap();
    }
    dropper.join().unwrap();

    if explicit_shutdown {
        epoch.shut_down.store(true, SeqCst);
        match &neighbour {
            // A member's shutdown is the group's: the neighbour's call answers ours.
            Some(neighbour) if number % 2 == 0 => neighbour.purgatory.shutdown(),
            _ => purgatory.shutdown(),
        }
    }
    let stats = purgatory.stats();
    STAND_INS.fetch_add(stats.stand_ins, SeqCst);
    // The last handle: with no explicit shutdown, its drop expires what is pending (on
    // a group, the drop of the last handle of the group and of every member).
    drop(purgatory);
    drop(group);
    if let Some(neighbour) = neighbour {
        neighbour.finish(number, explicit_shutdown);
    }

    let handed = epoch.next_id.load(SeqCst).min(OPS);
    let ledger = &epoch.ledger;
    let mut breaches = Vec::new();
    let mut guard_cancelled = 0u64;
    let (mut returned_total, mut refused_total) = (0u64, 0u64);
    for id in 0..handed {
        let completions = ledger.completions(id);
        let returned = epoch.returned[id].load(SeqCst);
        let refused = epoch.refused[id].load(SeqCst);
        returned_total += u64::from(returned);
        refused_total += u64::from(refused);
        let accounted = completions + returned + refused;
        if accounted == 0 && epoch.guarded[id].load(SeqCst) {
            guard_cancelled += 1; // checked against the purgatory's count below
        } else if accounted != 1 {
            breaches.push(format!(
                "op {id}: {completions} answers, returned {returned}, refused {refused}"
            ));
        }
        let expired = ledger.how(id).is_some_and(Completion::is_expiry);
        if ledger.expirations(id) != u32::from(expired) {
            breaches.push(format!(
                "op {id}: {:?} with {} on_expiration",
                ledger.how(id),
                ledger.expirations(id)
            ));
        }
        if ledger.drops(id) != 1 {
            breaches.push(format!("op {id}: dropped {} times", ledger.drops(id)));
        }
        if expired
            && !epoch.short[id].load(SeqCst)
            && !epoch.shut_down.load(SeqCst)
            && explicit_shutdown
        {
            breaches.push(format!("op {id}: a 60 s timeout expired before shutdown"));
        }
        if ledger.how(id) == Some(Completion::Expired)
            && epoch.moved_long[id].load(SeqCst)
            && !epoch.reset_short[id].load(SeqCst)
        {
            breaches.push(format!(
                "op {id}: expired by a deadline a reset had replaced"
            ));
        }
    }
    assert!(
        breaches.is_empty(),
        "epoch {number}: {} breaches, first: {:#?}",
        breaches.len(),
        &breaches[..breaches.len().min(10)]
    );
    assert_eq!(
        ledger.violations(),
        0,
        "epoch {number}: contract violations"
    );
    // Hand-backs the test saw, plus those of guards dropped on the guard thread, are all
    // the purgatory cancelled.
    assert_eq!(
        stats.cancelled,
        returned_total + guard_cancelled,
        "epoch {number}: {stats:?}"
    );
    assert_eq!(
        stats.completed,
        ledger.count(Completion::Ready),
        "epoch {number}"
    );
    assert_eq!(
        stats.forced,
        ledger.count(Completion::Forced),
        "epoch {number}"
    );
    // A 60 s timeout never fires in an epoch: such an operation that expired was expired
    // by shutdown (or the drop), and told so.
    let long_timed_out = (0..handed)
        .filter(|&id| ledger.how(id) == Some(Completion::Expired) && !epoch.short[id].load(SeqCst))
        .count();
    assert_eq!(
        long_timed_out, 0,
        "epoch {number}: 60 s timeouts answered as timeouts"
    );
    if explicit_shutdown {
        // Every refusal the clients saw was counted.
        assert_eq!(stats.refused, refused_total, "epoch {number}: {stats:?}");
        // What the operations were told is what was counted.
        assert_eq!(
            (stats.expired, stats.expired_at_shutdown),
            (
                ledger.count(Completion::Expired),
                ledger.count(Completion::Shutdown)
            ),
            "epoch {number}: {stats:?}"
        );
        assert_eq!(
            (stats.pending, stats.watched, stats.keys),
            (0, 0, 0),
            "epoch {number}: {stats:?}"
        );
    } else {
        // The drop expired what was still pending after these stats were read (and
        // rounds in progress may have been finishing expiries meanwhile): the ledger has
        // at least as many, and every operation is accounted for below.
        assert!(
            ledger.count(Completion::Expired) >= stats.expired
                && ledger.count(Completion::Shutdown) >= stats.expired_at_shutdown,
            "epoch {number}: {stats:?}"
        );
    }
    assert_eq!(
        ledger.total_completions() + returned_total + refused_total + guard_cancelled,
        handed as u64,
        "epoch {number}"
    );
    totals.epochs += 1;
    totals.operations += handed as u64;
    totals.calls += epoch.calls.load(SeqCst);
    totals.answered += ledger.total_completions();
    totals.expired += ledger.count(Completion::Expired) + ledger.count(Completion::Shutdown);
    totals.cancelled += stats.cancelled;
    totals.refused += refused_total;
    totals.resets[0] += epoch.resets[0].load(SeqCst);
    totals.resets[1] += epoch.resets[1].load(SeqCst);
}

/// The other member of an epoch's `TimerGroup`: keyed by strings, one thread watching
/// operations of 1 to 30 ms (a few ready at once, some checked ready later, some taken
/// back) until the group shuts down or the epoch's neighbour is told to stop.
struct Neighbour {
    purgatory: Purgatory<String, Probe>,
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(usize, u64, u64)>,
}

impl Neighbour {
    const OPS: usize = 100_000;

    fn start(group: &purgatory::TimerGroup, number: u64) -> Self {
        let purgatory: Purgatory<String, Probe> = PurgatoryBuilder::new()
            .name("neighbour")
            .build_on(group)
            .unwrap();
        let ledger = Ledger::new(Self::OPS);
        let stop = Arc::new(AtomicBool::new(false));
        let ready: Arc<Vec<AtomicBool>> =
            Arc::new((0..Self::OPS).map(|_| AtomicBool::new(false)).collect());
        let thread = {
            let (purgatory, ledger, stop) =
                (purgatory.clone(), Arc::clone(&ledger), Arc::clone(&stop));
            std::thread::spawn(move || {
                let read = Arc::clone(&ready);
                let readiness: Readiness = Arc::new(move |id, _| read[id].load(SeqCst));
                let mut rng = Rng::new(number ^ 0x6e65_6967);
                let (mut returned, mut refused) = (0u64, 0u64);
                let mut id = 0;
                while id < Self::OPS && !stop.load(SeqCst) {
                    let key = format!("n{}", rng.below(50));
                    let timeout = Duration::from_millis(1 + rng.below(30));
                    ready[id].store(rng.percent(5), SeqCst);
                    let op = Probe::new(id, timeout, &ledger, &readiness);
                    match purgatory.watch(op, [key.clone()]) {
                        Ok(WatchOutcome::Pending(handle)) => {
                            if rng.percent(10) {
                                returned += u64::from(purgatory.cancel(&handle).is_some());
                            } else if rng.percent(10) {
                                ready[id].store(true, SeqCst);
                                purgatory.check_and_complete(&key);
                            }
                        }
                        Ok(WatchOutcome::Completed) => {}
                        Err(_) => refused += 1,
                    }
                    id += 1;
                    if id % 64 == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                (id, returned, refused)
            })
        };
        Neighbour {
            purgatory,
            ledger,
            stop,
            thread,
        }
    }

    /// Stops the thread once the group is gone and checks the neighbour's ledger: each
    /// operation answered once, taken back, or refused.
    fn finish(self, number: u64, explicit_shutdown: bool) {
        self.stop.store(true, SeqCst);
        let (handed, returned, refused) = self.thread.join().unwrap();
        if !explicit_shutdown {
            // The group lives while the neighbour's handle does: its drop is the last.
            drop(self.purgatory);
        } else {
            assert!(
                self.purgatory.is_shutdown(),
                "epoch {number}: the group's shutdown"
            );
            drop(self.purgatory);
        }
        let ledger = &self.ledger;
        let mut wrong = Vec::new();
        let mut counted_returned = 0;
        for id in 0..handed {
            match ledger.completions(id) {
                1 => {}
                0 => counted_returned += 1,
                n => wrong.push(format!("neighbour op {id}: {n} answers")),
            }
            if ledger.drops(id) != 1 {
                wrong.push(format!(
                    "neighbour op {id}: dropped {} times",
                    ledger.drops(id)
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "epoch {number}: {:#?}",
            &wrong[..wrong.len().min(10)]
        );
        assert_eq!(
            ledger.violations(),
            0,
            "epoch {number}: neighbour violations"
        );
        assert_eq!(
            counted_returned,
            returned + refused,
            "epoch {number}: the neighbour's unanswered operations are those taken back or refused"
        );
    }
}

/// Stand-ins started over every epoch (the purgatories' `stats().stand_ins`).
static STAND_INS: AtomicU64 = AtomicU64::new(0);

#[test]
fn every_operation_is_answered_exactly_once_under_every_call_at_random() {
    let secs: u64 = std::env::var("LEDGER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let start = Instant::now();
    let mut totals = Totals::default();
    let mut number = 0;
    while start.elapsed() < Duration::from_secs(secs) || totals.epochs < 3 {
        run_epoch(number, Duration::from_millis(1_500), &mut totals);
        number += 1;
    }
    let stand_ins = STAND_INS.load(SeqCst);
    eprintln!(
        "ledger: {} epochs, {} operations, {} calls, in {:?}: {} answered ({} expired), {} cancelled, {} refused after shutdown, {stand_ins} stand-ins, resets {} moved and {} too late; 0 unanswered, 0 answered twice",
        totals.epochs,
        totals.operations,
        totals.calls,
        start.elapsed(),
        totals.answered,
        totals.expired,
        totals.cancelled,
        totals.refused,
        totals.resets[0],
        totals.resets[1]
    );
    assert!(
        totals.resets[0] > 0 && totals.resets[1] > 0,
        "resets must both win and lose: {:?}",
        totals.resets
    );
    assert!(
        stand_ins > 0,
        "no stand-in ever took over: the stall epochs test nothing"
    );
}
