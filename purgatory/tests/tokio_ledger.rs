//! The randomized ledger of the tokio face (feature `tokio`): tasks on a multi-thread
//! runtime park operations and then, at random, await them, drop them early (a client
//! that leaves), `try_cancel` them, force them, or give up after a random wait; a plain
//! thread makes events on random keys; timeouts of 0-30 ms expire on the reaper; and the
//! purgatory is shut down with `shutdown_async` while tasks are still parking.
//!
//! At the end every operation is accounted for exactly once: answered (`on_complete`
//! once, and an awaited answer agrees), taken back (a cancel by drop or `try_cancel`:
//! no `on_complete`), or refused after shutdown (given back); each operation value is
//! dropped exactly once; the purgatory's counters equal the ledger's. The operations are
//! the probe (`probe/mod.rs`) answering through a `Reply`, so its ledger also flags a
//! breach of the operation contract as it happens.
//!
//! The budget is 4 s by default, `TOKIO_LEDGER_SECS` for more.
#![cfg(feature = "tokio")]

mod probe;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use probe::{Ledger, Probe, Readiness, Rng};
use purgatory::{Completion, DelayedOperation, Purgatory, Reply};

/// Operation ids available to one run (a task stops parking when they run out).
const IDS: usize = 400_000;
const KEYS: u64 = 32;
const TASKS: usize = 8;

/// The run's records: the probe's ledger (callbacks and drops, with the operation
/// contract checked on the fly), readiness flags, and how each operation ended as its
/// task saw it.
struct Run {
    ledger: Arc<Ledger>,
    ready: Arc<Vec<AtomicBool>>,
    readiness: Readiness,
    taken_back: AtomicU64,
    refused: AtomicU64,
    awaited: AtomicU64,
    next: AtomicUsize,
}

/// A probe that also answers through a [`Reply`], as a tokio user's operation does.
struct Op {
    probe: Probe,
    reply: Reply<usize>,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        self.probe.timeout()
    }
    fn try_complete(&mut self) -> bool {
        self.probe.try_complete()
    }
    fn on_complete(&mut self, how: Completion) {
        self.probe.on_complete(how);
        self.reply.send(how, self.probe.id);
    }
    fn on_expiration(&mut self) {
        self.probe.on_expiration();
    }
}

/// One client: parks operations one after another, each handled by a task of its own
/// (so many wait at once), until the time is up, the ids run out, or the purgatory has
/// refused 100 of them.
async fn client(p: Purgatory<u64, Op>, run: Arc<Run>, seed: u64, until: Instant) {
    let mut rng = Rng::new(seed);
    let mut handlers = Vec::new();
    let mut refusals = 0;
    while Instant::now() < until && refusals < 100 {
        let id = run.next.fetch_add(1, SeqCst);
        if id >= IDS {
            break;
        }
        let timeout = Duration::from_millis(rng.below(30));
        let probe = Probe::new(id, timeout, &run.ledger, &run.readiness);
        let key = rng.below(KEYS);
        match p.park_with([key, (key + 1) % KEYS], |reply| Op { probe, reply }) {
            Ok(parked) => {
                let action = rng.below(5);
                let wait = Duration::from_micros(rng.below(20_000));
                let (p, run) = (p.clone(), Arc::clone(&run));
                handlers.push(tokio::spawn(handle(p, run, id, parked, action, wait)));
            }
            Err(refused) => {
                refusals += 1;
                run.refused.fetch_add(1, SeqCst);
                drop(refused.into_error().into_operation());
            }
        }
        if id % 16 == 0 {
            tokio::task::yield_now().await;
        }
    }
    for handler in handlers {
        handler.await.expect("a handler panicked");
    }
}

/// What one client does with one parked operation.
async fn handle(
    p: Purgatory<u64, Op>,
    run: Arc<Run>,
    id: usize,
    mut parked: purgatory::Parked<u64, Op, usize>,
    action: u64,
    wait: Duration,
) {
    match action {
        0 => {
            // Awaited to its answer.
            let answered = parked.await.expect("an accepted operation is answered");
            assert_eq!(answered.answer, id);
            assert_eq!(run.ledger.completions(id), 1);
            run.awaited.fetch_add(1, SeqCst);
        }
        1 => {
            // The client leaves after a moment.
            tokio::task::yield_now().await;
            drop(parked);
        }
        2 => match parked.try_cancel() {
            Some(op) => {
                run.taken_back.fetch_add(1, SeqCst);
                drop(op);
            }
            None => {
                parked.await.expect("completed, so answered");
                run.awaited.fetch_add(1, SeqCst);
            }
        },
        3 => {
            // Forced by its own task, racing its timeout and events.
            if let Some(handle) = parked.handle() {
                p.force_complete(&handle);
            }
            parked.await.expect("forced or completed: answered");
            run.awaited.fetch_add(1, SeqCst);
        }
        _ => {
            // Gives up after a random wait.
            if let Ok(answered) = tokio::time::timeout(wait, &mut parked).await {
                answered.expect("answered");
                run.awaited.fetch_add(1, SeqCst);
            }
        }
    }
}

#[test]
fn every_parked_operation_ends_exactly_once_under_random_clients() {
    let secs: u64 = std::env::var("TOKIO_LEDGER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let (ready, readiness) = probe::flags(IDS);
    let run = Arc::new(Run {
        ledger: Ledger::new(IDS),
        ready,
        readiness,
        taken_back: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        awaited: AtomicU64::new(0),
        next: AtomicUsize::new(0),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let p: Purgatory<u64, Op> = runtime.block_on(async { Purgatory::new("tokio-ledger") });

    // Events: random operations made ready, their keys checked, from a plain thread.
    let stop = Arc::new(AtomicBool::new(false));
    let events = {
        let (p, run, stop) = (p.clone(), Arc::clone(&run), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = Rng::new(7);
            while !stop.load(SeqCst) {
                let issued = run.next.load(SeqCst).min(IDS);
                if issued > 0 {
                    let id = rng.below(issued as u64) as usize;
                    run.ready[id].store(true, SeqCst);
                }
                p.check_and_complete(&rng.below(KEYS));
            }
        })
    };

    runtime.block_on(async {
        let clients: Vec<_> = (0..TASKS)
            .map(|t| tokio::spawn(client(p.clone(), Arc::clone(&run), t as u64, until)))
            .collect();
        // Shut down while the clients still park: after four fifths of the time or of
        // the ids, whichever comes first.
        let shut_at = Instant::now() + until.saturating_duration_since(Instant::now()) * 4 / 5;
        while Instant::now() < shut_at && run.next.load(SeqCst) < IDS * 4 / 5 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        p.shutdown_async().await;
        for client in clients {
            client.await.expect("a client task panicked");
        }
    });
    stop.store(true, SeqCst);
    events.join().unwrap();
    drop(runtime);

    let issued = run.next.load(SeqCst).min(IDS);
    assert_eq!(
        run.ledger.violations(),
        0,
        "the operation contract was broken"
    );
    let (mut answered, mut unanswered) = (0u64, 0u64);
    for id in 0..issued {
        let completions = run.ledger.completions(id);
        assert!(
            completions <= 1,
            "operation {id} answered {completions} times"
        );
        assert_eq!(run.ledger.drops(id), 1, "operation {id}: drops");
        if completions == 1 {
            answered += 1;
        } else {
            unanswered += 1;
        }
    }
    let stats = p.stats();
    assert_eq!(
        stats.completed + stats.forced + stats.expired + stats.expired_at_shutdown,
        answered,
        "{stats:?}"
    );
    let refused = run.refused.load(SeqCst);
    assert_eq!(stats.cancelled + refused, unanswered, "{stats:?}");
    assert!(run.taken_back.load(SeqCst) <= stats.cancelled);
    assert_eq!(stats.pending, 0);
    assert!(refused > 0, "the shutdown came while clients parked");
    eprintln!(
        "tokio ledger: {issued} operations in {:?}: {answered} answered ({} awaited), {} \
         cancelled ({} by try_cancel), {refused} refused; {stats:?}",
        started.elapsed(),
        run.awaited.load(SeqCst),
        stats.cancelled,
        run.taken_back.load(SeqCst),
    );
}
