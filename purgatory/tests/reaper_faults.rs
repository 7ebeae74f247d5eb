//! The reaper thread's own expiry path as a fault point, call by call. The fault suite
//! (`tests/faults`) drives its rounds with `advance_clock` on the test thread, which
//! expires a round's batch in one piece; a purgatory with its reaper thread and
//! stand-ins hands the batch out one task at a time (`Expire::expire_claimed`) and frees
//! the slots of its expiries together (`VacateLater`, every 32). This runs that path with
//! the n-th call into user code on it faulting, for every n in turn, and checks the
//! ledger after each run:
//! - every operation is answered exactly once, as expired, and dropped exactly once,
//!   whichever callback panicked or stalled;
//! - `stats()` agrees: 40 expired, the one panic counted, nothing pending, and after a
//!   purge nothing listed;
//! - the reaper lives on: a second wave, watched after the fault, expires too. (Whether
//!   it reuses the slots the first wave's expiries freed is not visible from here: with
//!   `VacateLater` freeing nothing this test still passes. The freeing is
//!   `op_table.rs`'s `slots_vacated_later_are_all_freed_even_when_a_panic_unwinds`.)
//!
//! Every panic here is caught by the door around the call: none unwinds through the
//! reaper's batch (`VacateLater` freeing on an unwind is that same unit test's).
//!
//! The calls on that path, per operation: `on_complete`, `on_expiration`, the
//! operation's `Drop`; the purge after the wave drops the keys (integers: no user code).
//! A wave of 40 crosses a `VacateLater` flush (32).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Purgatory, PurgatoryBuilder, WatchOutcome};

const WAVE: usize = 40;
const TIMEOUT: Duration = Duration::from_millis(20);

/// What the n-th call does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Panic,
    Stall,
}

/// The shared books of one run: per operation, its answers, expirations and drops; and
/// the call counter that picks the faulting call.
struct Books {
    answers: Vec<AtomicU32>,
    expirations: Vec<AtomicU32>,
    drops: Vec<AtomicU32>,
    not_expired: AtomicU32,
    calls: AtomicUsize,
    fault_at: usize,
    fault: Fault,
}

impl Books {
    fn new(fault_at: usize, fault: Fault) -> Arc<Self> {
        let zeros = || (0..2 * WAVE).map(|_| AtomicU32::new(0)).collect();
        Arc::new(Books {
            answers: zeros(),
            expirations: zeros(),
            drops: zeros(),
            not_expired: AtomicU32::new(0),
            calls: AtomicUsize::new(0),
            fault_at,
            fault,
        })
    }

    /// Counts a call into user code; faults if it is the chosen one.
    fn call(&self, what: &str) {
        let n = self.calls.fetch_add(1, SeqCst) + 1;
        if n == self.fault_at {
            match self.fault {
                Fault::Panic => panic!("call {n} ({what}) panics, on purpose"),
                Fault::Stall => std::thread::sleep(Duration::from_millis(60)),
            }
        }
    }
}

struct Op {
    id: usize,
    books: Arc<Books>,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        TIMEOUT
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, how: Completion) {
        self.books.answers[self.id].fetch_add(1, SeqCst);
        if how != Completion::Expired {
            self.books.not_expired.fetch_add(1, SeqCst);
        }
        self.books.call("on_complete");
    }
    fn on_expiration(&mut self) {
        self.books.expirations[self.id].fetch_add(1, SeqCst);
        self.books.call("on_expiration");
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        self.books.drops[self.id].fetch_add(1, SeqCst);
        self.books.call("drop");
    }
}

/// Watches operations `ids` on 2 of 4 keys each, all with the same timeout.
fn watch_wave(purgatory: &Purgatory<u32, Op>, books: &Arc<Books>, ids: std::ops::Range<usize>) {
    for id in ids {
        let op = Op {
            id,
            books: Arc::clone(books),
        };
        let keys = [id as u32 % 4, (id as u32 + 1) % 4];
        match purgatory.watch(op, keys) {
            Ok(WatchOutcome::Pending(_)) => {}
            other => panic!("operation {id} not left waiting: {:?}", other.map(|_| ())),
        }
    }
}

/// Waits until operations `ids` are all answered (at most 30 s).
fn wait_answered(books: &Books, ids: std::ops::Range<usize>) {
    let limit = Instant::now() + Duration::from_secs(30);
    while ids.clone().any(|id| books.drops[id].load(SeqCst) == 0) {
        assert!(
            Instant::now() < limit,
            "the reaper left operations unanswered (fault at call {}, {:?})",
            books.fault_at,
            books.fault
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One run: a wave of `WAVE` expires through the reaper with the `fault_at`-th call into
/// user code faulting, then a second wave expires after it; the ledger is checked.
fn run(fault_at: usize, fault: Fault) {
    let books = Books::new(fault_at, fault);
    let purgatory: Purgatory<u32, Op> = PurgatoryBuilder::new()
        .name("reaper-faults")
        .build()
        .expect("built");
    watch_wave(&purgatory, &books, 0..WAVE);
    wait_answered(&books, 0..WAVE);
    watch_wave(&purgatory, &books, WAVE..2 * WAVE);
    wait_answered(&books, WAVE..2 * WAVE);
    let context = format!("fault at call {fault_at} ({fault:?})");
    for id in 0..2 * WAVE {
        assert_eq!(
            books.answers[id].load(SeqCst),
            1,
            "{context}: answers of {id}"
        );
        assert_eq!(
            books.expirations[id].load(SeqCst),
            1,
            "{context}: expirations of {id}"
        );
        assert_eq!(books.drops[id].load(SeqCst), 1, "{context}: drops of {id}");
    }
    assert_eq!(books.not_expired.load(SeqCst), 0, "{context}");
    // A panic is counted after the code that panicked has unwound: a `Drop` that
    // panics has already counted its drop. Should the thread that caught it be held up
    // there (preempted, past the stand-in bound), a stand-in can expire the rest, and
    // the second wave, first: the count is waited for, not read once.
    let panics = u64::from(fault == Fault::Panic && fault_at <= books.calls.load(SeqCst));
    let limit = Instant::now() + Duration::from_secs(30);
    while purgatory.stats().panicked < panics && Instant::now() < limit {
        std::thread::sleep(Duration::from_millis(2));
    }
    purgatory.purge();
    let stats = purgatory.stats();
    assert_eq!(stats.expired, 2 * WAVE as u64, "{context}: {stats:?}");
    assert_eq!(stats.panicked, panics, "{context}: {stats:?}");
    assert_eq!(
        (stats.pending, stats.watched),
        (0, 0),
        "{context}: {stats:?}"
    );
    purgatory.shutdown();
}

#[test]
fn every_call_into_user_code_on_the_reapers_expiry_path_faults_in_turn_and_the_ledger_holds() {
    // A census run: how many calls the path makes (3 per operation, 2 waves).
    let census = Books::new(0, Fault::Panic);
    {
        let purgatory: Purgatory<u32, Op> = Purgatory::new("reaper-faults-census");
        watch_wave(&purgatory, &census, 0..WAVE);
        wait_answered(&census, 0..WAVE);
        assert_eq!(census.calls.load(SeqCst), 3 * WAVE, "calls per wave");
        purgatory.shutdown();
    }
    for at in 1..=3 * WAVE {
        run(at, Fault::Panic);
    }
    // Stalls at the first and last call of each kind in the wave, and one past the
    // flush: a stalled callback holds the reaper's batch (a stand-in takes over after its
    // bound) while up to 31 slots wait to be freed.
    for at in [1, 2, 3, 3 * 33, 3 * WAVE - 2, 3 * WAVE - 1, 3 * WAVE] {
        run(at, Fault::Stall);
    }
}
