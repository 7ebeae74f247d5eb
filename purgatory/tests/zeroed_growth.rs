//! Hostile growth over zeroed segments: several threads grow the op table at once across
//! segment boundaries (every new slot filled by the thread it is handed out to), while
//! another thread gives segments back with `purge` in a loop and the workers keep acting
//! on the handles of earlier rounds (cancel, force, reset, is_completed). Every round's
//! operations are answered exactly once or handed back once by a cancel, and no stale
//! handle ever reaches a later occupant of its slot (cancel of a stale handle returns
//! nothing, force of one returns false).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use purgatory::{
    Completion, DelayedOperation, OperationHandle, Purgatory, PurgatoryBuilder, WatchOutcome,
};

struct Op {
    id: usize,
    ready: bool,
    /// Blocks its checks: holds a check's pin, so segments given back meanwhile wait
    /// for their grace and are linked again as they are (with slots past their reach).
    blocks: bool,
    answers: Arc<Vec<AtomicU32>>,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        Duration::from_secs(600)
    }
    fn try_complete(&mut self) -> bool {
        if self.blocks {
            std::thread::sleep(Duration::from_millis(3));
        }
        self.ready
    }
    fn on_complete(&mut self, _how: Completion) {
        self.answers[self.id].fetch_add(1, SeqCst);
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const THREADS: usize = 4;
const BLOCK_KEY: u64 = 1 << 40;
const ROUNDS: usize = 30;
const PER_THREAD_MAX: usize = 20_000;

#[test]
fn concurrent_growth_with_give_backs_and_stale_handles_loses_and_doubles_nothing() {
    let purgatory: Purgatory<u64, Op> = PurgatoryBuilder::new()
        .name("zeroed-growth")
        .build()
        .unwrap();
    let total = THREADS * ROUNDS * PER_THREAD_MAX;
    let answers: Arc<Vec<AtomicU32>> = Arc::new((0..total).map(|_| AtomicU32::new(0)).collect());
    let returned: Arc<Vec<AtomicU32>> = Arc::new((0..total).map(|_| AtomicU32::new(0)).collect());
    let next_id = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(THREADS));
    let giver = {
        let purgatory = purgatory.clone();
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut gave = 0usize;
            while !stop.load(SeqCst) {
                gave += purgatory.purge();
                std::thread::yield_now();
            }
            gave
        })
    };
    let blocker = {
        let purgatory = purgatory.clone();
        let stop = Arc::clone(&stop);
        let answers = Arc::clone(&answers);
        let id = next_id.fetch_add(1, SeqCst);
        std::thread::spawn(move || {
            let op = Op {
                id,
                ready: false,
                blocks: true,
                answers,
            };
            let Ok(WatchOutcome::Pending(h)) = purgatory.watch(op, [BLOCK_KEY]) else {
                panic!()
            };
            while !stop.load(SeqCst) {
                purgatory.check_and_complete(&BLOCK_KEY);
                std::thread::sleep(Duration::from_micros(200));
            }
            assert!(purgatory.force_complete(&h));
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let purgatory = purgatory.clone();
            let answers = Arc::clone(&answers);
            let returned = Arc::clone(&returned);
            let next_id = Arc::clone(&next_id);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678_9abc_def1));
                let mut stale: Vec<(usize, OperationHandle<Op>)> = Vec::new();
                for round in 0..ROUNDS {
                    barrier.wait();
                    // A burst, all threads at once: the table grows across segments.
                    let n = if round % 3 == 2 {
                        300
                    } else {
                        1 + rng.below(PER_THREAD_MAX as u64) as usize
                    };
                    let mut live: Vec<(usize, OperationHandle<Op>)> = Vec::with_capacity(n);
                    for i in 0..n {
                        let id = next_id.fetch_add(1, SeqCst);
                        let op = Op {
                            id,
                            ready: false,
                            blocks: false,
                            answers: Arc::clone(&answers),
                        };
                        let key = rng.below(1_000);
                        match purgatory.watch(op, [key]) {
                            Ok(WatchOutcome::Pending(h)) => live.push((id, h)),
                            Ok(_) => panic!("not ready, never completes at once"),
                            Err(_) => panic!("watch refused"),
                        }
                        // Stale handles acted on in between the growth.
                        if i % 16 == 0 && !stale.is_empty() {
                            let (sid, h) = &stale[rng.below(stale.len() as u64) as usize];
                            match rng.below(4) {
                                0 => {
                                    if let Some(op) = purgatory.cancel(h) {
                                        panic!("stale handle of {sid} cancelled {}", op.id);
                                    }
                                }
                                1 => assert!(!purgatory.force_complete(h), "stale force of {sid}"),
                                2 => assert!(
                                    !purgatory.reset_timeout(h, Duration::from_millis(1)),
                                    "stale reset of {sid}"
                                ),
                                _ => {
                                    assert!(purgatory.is_completed(h), "stale {sid} reads waiting")
                                }
                            }
                        }
                    }
                    barrier.wait();
                    // Complete them: some cancelled, some forced one by one, the rest in a batch.
                    let mut batch = Vec::new();
                    for (id, h) in live {
                        match rng.below(4) {
                            0 => {
                                let op = purgatory.cancel(&h).expect("live cancel");
                                assert_eq!(op.id, id, "a handle cancelled another operation");
                                returned[id].fetch_add(1, SeqCst);
                            }
                            1 => assert!(purgatory.force_complete(&h), "live force of {id}"),
                            _ => batch.push((id, h)),
                        }
                        if stale.len() > 50_000 {
                            stale.swap_remove(rng.below(stale.len() as u64) as usize);
                        }
                    }
                    let n = purgatory.force_complete_batch(batch.iter().map(|(_, h)| h));
                    assert_eq!(n, batch.len());
                    stale.extend(batch);
                    // Old handles again after this round's slots are free for reuse.
                    for _ in 0..200 {
                        if stale.is_empty() {
                            break;
                        }
                        let (sid, h) = &stale[rng.below(stale.len() as u64) as usize];
                        assert!(purgatory.cancel(h).is_none(), "stale cancel of {sid}");
                        assert!(!purgatory.force_complete(h), "stale force of {sid}");
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    stop.store(true, SeqCst);
    let gave = giver.join().unwrap();
    blocker.join().unwrap();
    purgatory.shutdown();
    let used = next_id.load(SeqCst);
    let mut bad = Vec::new();
    for id in 0..used {
        let a = answers[id].load(SeqCst);
        let r = returned[id].load(SeqCst);
        if a + r != 1 {
            bad.push((id, a, r));
        }
    }
    eprintln!(
        "ops {used}, entries purged {gave}, stats {:?}",
        purgatory.stats()
    );
    assert!(
        bad.is_empty(),
        "{} operations not accounted exactly once: {:?}",
        bad.len(),
        &bad[..bad.len().min(20)]
    );
}
