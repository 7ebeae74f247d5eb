//! Loom models of the hand-overs of [`CheckRounds`]: an event to the running check (the
//! `AGAIN` mark), the inline thread to the checker thread (the queue and its condvar), and
//! `stop` to both.
//!
//! Each model runs its events on loom threads against one `CheckRounds` (its checker thread
//! a loom thread too) whose check keeps a `Ledger`: the event counter it saw at its start,
//! and an "inside" flag that two overlapping checks of one key would find set. In every
//! interleaving loom produces:
//! - [`two_events_on_one_key_are_both_seen`], [`an_event_that_finds_a_round_owed_is_seen`]:
//!   once the events are over and the owed rounds drained, the last check saw every event
//!   (no lost wake-up);
//! - [`checks_of_one_key_never_overlap`]: at most one check of a key at a time, with
//!   rounds handed to the checker thread and back;
//! - [`nothing_is_checked_once_stop_returned`]: no check runs after `stop` returns (none
//!   still running, none starting later), and `stop` returns (loom reports a deadlock).
//!
//! Run with `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=3
//! cargo test -p purgatory-examples --release --lib check_rounds`. Under `--cfg loom` the
//! crate is this module alone (`lib.rs`): its other modules stand on tokio, which does not
//! build with `--cfg loom`.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, AtomicUsize};

use super::CheckRounds;

/// What the checks of one key saw (loom atomics: the model's assertions are about what
/// happens-before what).
#[derive(Default)]
struct Ledger {
    /// Events so far, bumped by each event before its `request`.
    events: AtomicUsize,
    /// The highest `events` a check read at its start.
    seen: AtomicUsize,
    /// A check of the key is running.
    inside: AtomicBool,
    /// Checks begun and ended.
    begun: AtomicUsize,
    ended: AtomicUsize,
}

impl Ledger {
    fn check(&self) {
        assert!(
            !self.inside.swap(true, SeqCst),
            "two checks of one key at once"
        );
        self.begun.fetch_add(1, SeqCst);
        let events = self.events.load(SeqCst);
        self.seen.fetch_max(events, SeqCst);
        self.inside.store(false, SeqCst);
        self.ended.fetch_add(1, SeqCst);
    }

    fn event(&self, rounds: &CheckRounds) {
        self.events.fetch_add(1, SeqCst);
        rounds.request(0);
    }
}

/// One key, its check keeping `ledger`.
fn start(ledger: &Arc<Ledger>) -> Arc<CheckRounds> {
    let ledger = Arc::clone(ledger);
    Arc::new(CheckRounds::start(
        "loom-checks",
        1,
        Box::new(move |_| ledger.check()),
    ))
}

/// `per_thread[i]` events on key 0 from thread `i` (the last one is the model's own
/// thread); then, the owed rounds drained, the last check must have seen them all.
fn every_event_is_seen(per_thread: &'static [usize]) {
    let mut builder = loom::model::Builder::new();
    // Unbounded unless LOOM_MAX_PREEMPTIONS says otherwise; CI says 3.
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(move || {
        let ledger = Arc::new(Ledger::default());
        let rounds = start(&ledger);
        let (last, others) = per_thread.split_last().unwrap();
        let threads: Vec<_> = others
            .iter()
            .map(|&events| {
                let (ledger, rounds) = (Arc::clone(&ledger), Arc::clone(&rounds));
                loom::thread::spawn(move || {
                    for _ in 0..events {
                        ledger.event(&rounds);
                    }
                })
            })
            .collect();
        for _ in 0..*last {
            ledger.event(&rounds);
        }
        for thread in threads {
            thread.join().unwrap();
        }
        rounds.drain_and_stop();
        let all: usize = per_thread.iter().sum();
        assert_eq!(ledger.seen.load(SeqCst), all, "an event no check saw");
        assert_eq!(ledger.begun.load(SeqCst), ledger.ended.load(SeqCst));
    });
}

/// (a) Two events on one key from two threads: one checks inline, the other finds it
/// running (marks `AGAIN`) or comes after it; the inline thread hands the owed round over.
#[test]
fn two_events_on_one_key_are_both_seen() {
    every_event_is_seen(&[1, 1]);
}

/// (a') A third event, which can find the round already owed (`AGAIN`): the owed round
/// must still start after it. Before the mark was renewed through a read-modify-write and
/// `finish` took it with a swap, that event only loaded `AGAIN` and returned, and nothing
/// ordered it before the owner's next round: that round could read the event counter from
/// before it (loom: the last check saw 2 of 3 events; a store buffer does this on x86).
#[test]
fn an_event_that_finds_a_round_owed_is_seen() {
    every_event_is_seen(&[2, 1]);
}

/// (b) At most one check of a key at a time: rounds handed to the checker thread while
/// events keep marking the key (the ledger's `inside` flag asserts in every check).
#[test]
fn checks_of_one_key_never_overlap() {
    every_event_is_seen(&[1, 2]);
}

/// (c) `stop` racing two events on one key from two threads (one checking inline, the
/// other marking a round owed, which can be handed to the checker thread as it stops): when
/// `stop` returns no check runs, and none starts afterwards; `stop` itself returns (a hang
/// is a loom deadlock).
#[test]
fn nothing_is_checked_once_stop_returned() {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(|| {
        let ledger = Arc::new(Ledger::default());
        let rounds = start(&ledger);
        let events: Vec<_> = (0..2)
            .map(|_| {
                let (ledger, rounds) = (Arc::clone(&ledger), Arc::clone(&rounds));
                loom::thread::spawn(move || ledger.event(&rounds))
            })
            .collect();
        rounds.stop();
        let begun = ledger.begun.load(SeqCst);
        assert_eq!(begun, ledger.ended.load(SeqCst), "a check runs after stop");
        for event in events {
            event.join().unwrap();
        }
        assert_eq!(ledger.begun.load(SeqCst), begun, "a check began after stop");
    });
}
