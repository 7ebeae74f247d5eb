//! Purges never drop a waiting operation's entries, whatever its generation's tag: a
//! thread purges (and so gives segments back) in a loop while a churn thread reuses a
//! few slots thousands of times and grows the table in bursts that go back, so the
//! operations watched meanwhile get every residue of generation mod 256, on slots of
//! segments made anew too, including the two tags a purge settles by reading the slot
//! (0, an unfilled slot's; 255, a retired slot's). Each round's anchors wait on two keys
//! nobody else watches; at the round's end they are made ready, and one check of each
//! anchor's first key must complete every one of them (an anchor whose entry there a
//! purge dropped would stay pending until its 600 s timeout). A purge that took the two
//! tags for gone without reading the slot failed it in every run (rounds 7-98 of 100).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use purgatory::{Completion, DelayedOperation, Purgatory, PurgatoryBuilder, WatchOutcome};

struct Op {
    ready: Arc<AtomicBool>,
    answered: Arc<AtomicU32>,
    /// An anchor, completed by an event only; the churn's are forced.
    anchor: bool,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        Duration::from_secs(600)
    }
    fn try_complete(&mut self) -> bool {
        self.ready.load(SeqCst)
    }
    fn on_complete(&mut self, how: Completion) {
        let expected = if self.anchor {
            Completion::Ready
        } else {
            Completion::Forced
        };
        assert_eq!(how, expected, "anchor: {}", self.anchor);
        self.answered.fetch_add(1, SeqCst);
    }
}

const ROUNDS: usize = 100;
const ANCHORS: usize = 128;
const ANCHOR_KEYS: u64 = 16;
const CHURN_KEYS: u64 = 1 << 20;
const BURST: usize = 5_000;

#[test]
fn a_purge_racing_reuse_and_give_backs_never_drops_a_waiting_operations_entries() {
    let purgatory: Purgatory<u64, Op> = PurgatoryBuilder::new()
        .name("purge-keeps-waiting")
        .purge_interval(1)
        .build()
        .unwrap();
    let never = Arc::new(AtomicBool::new(false));
    let churn_answers = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let purger = {
        let purgatory = purgatory.clone();
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                purgatory.purge();
                std::thread::yield_now();
            }
        })
    };
    let churn = {
        let purgatory = purgatory.clone();
        let stop = Arc::clone(&stop);
        let never = Arc::clone(&never);
        let answered = Arc::clone(&churn_answers);
        std::thread::spawn(move || {
            let mut round = 0u64;
            let mut forced_in_all = 0usize;
            while !stop.load(SeqCst) {
                round += 1;
                // Every eighth pass a burst that grows the table and goes back; the
                // others reuse a few slots many times (their generations move on).
                let n = if round % 8 == 0 { BURST } else { 32 };
                let handles: Vec<_> = (0..n as u64)
                    .map(|i| {
                        let op = Op {
                            ready: Arc::clone(&never),
                            answered: Arc::clone(&answered),
                            anchor: false,
                        };
                        match purgatory.watch(op, [(round * 7919 + i) % CHURN_KEYS]) {
                            Ok(WatchOutcome::Pending(handle)) => handle,
                            other => panic!("churn watch: {:?}", other.map(|_| ())),
                        }
                    })
                    .collect();
                let forced = purgatory.force_complete_batch(&handles);
                assert_eq!(forced, handles.len());
                forced_in_all += forced;
                assert_eq!(
                    answered.load(SeqCst) as usize,
                    forced_in_all,
                    "each answered once"
                );
            }
        })
    };
    for round in 0..ROUNDS {
        let ready = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU32::new(0));
        // An anchor's first key is one of the round's first `ANCHOR_KEYS`, its second one
        // of the next `ANCHOR_KEYS`: the checks below reach it through its first only.
        let base = (1u64 << 40) + round as u64 * 2 * ANCHOR_KEYS;
        let anchor_key =
            |i: usize, second: u64| base + second * ANCHOR_KEYS + i as u64 % ANCHOR_KEYS;
        let mut handles = Vec::new();
        for i in 0..ANCHORS {
            let op = Op {
                ready: Arc::clone(&ready),
                answered: Arc::clone(&answered),
                anchor: true,
            };
            match purgatory.watch(op, [anchor_key(i, 0), anchor_key(i, 1)]) {
                Ok(WatchOutcome::Pending(handle)) => handles.push(handle),
                other => panic!("anchor watch: {:?}", other.map(|_| ())),
            }
            // Let the churn and the purges run between the anchors' watches, so that
            // they land on slots of every age.
            std::thread::sleep(Duration::from_micros(100));
        }
        std::thread::sleep(Duration::from_millis(20));
        ready.store(true, SeqCst);
        for k in 0..ANCHOR_KEYS {
            purgatory.check_and_complete(&(base + k));
        }
        let left: Vec<usize> = handles
            .iter()
            .enumerate()
            .filter(|(_, handle)| !purgatory.is_completed(handle))
            .map(|(i, _)| i)
            .collect();
        assert!(
            left.is_empty(),
            "round {round}: anchors {left:?} not found by the checks of their keys"
        );
        assert_eq!(answered.load(SeqCst) as usize, ANCHORS, "round {round}");
        // Their entries on the second keys are stale now, for the purges.
    }
    stop.store(true, SeqCst);
    purger.join().unwrap();
    churn.join().unwrap();
    assert_eq!(purgatory.pending(), 0);
    let stats = purgatory.stats();
    assert!(stats.purged > 0, "the purges dropped nothing: {stats:?}");
}
