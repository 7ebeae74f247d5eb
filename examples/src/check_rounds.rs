//! Coalesced checks: `check_and_complete` on a key runs once per round of events, not once
//! per event.
//!
//! A check of a key walks every operation parked on it, so with many parked polls it costs
//! that many `try_complete` (about 25 µs per 1,000 parked fetches in a release build, see
//! the README). Run once per event, a flood of events multiplies that cost; here an event
//! that finds a check of its key already running only asks for one more round, and the
//! thread running the check runs it.
//!
//! | state of a key | meaning                                             | an event (`request`)          |
//! |----------------|-----------------------------------------------------|-------------------------------|
//! | `IDLE`         | no check running or owed                            | becomes `RUNNING`, checks inline |
//! | `RUNNING`      | a check runs (or is handed over), started after every event so far | becomes `AGAIN` |
//! | `AGAIN`        | a check runs and another round is owed              | stays `AGAIN`, marked again (an exchange, so the owed round starts after it) |
//!
//! The thread that runs a check inline (the event's own thread: a follower, or the task that
//! appended) runs one round only: if another is owed when it ends, it hands the key to this
//! set's checker thread, which runs rounds until none is owed. So an event never runs more
//! than one check, and under a flood the checks run back to back on one thread while the
//! events cost an atomic operation each.
//!
//! Invariants:
//! - Every event is followed by a whole check of its key that starts after it (no lost
//!   wake-up): an event either starts one, or finds one running and marks `AGAIN`, which its
//!   owner sees when that check ends and answers with another round.
//! - At most one check per key runs at a time, in the purgatory the key belongs to.
//! - A check that panics counts as ended: the panic is caught and reported, the key's state
//!   moves on as after any check, and the checker thread lives on (an uncaught panic left
//!   the key `RUNNING` for good, or killed the checker thread with the keys handed to it).
//! - After [`CheckRounds::stop`] owed rounds are dropped (the purgatories are shut down
//!   next, which answers every parked operation) and events check nothing; a check that
//!   an event started inline before ends before `stop` returns.
//!
//! The hand-overs (an event to the running check, the inline thread to the checker thread)
//! have loom models in `check_rounds/loom_models.rs` (the atomics, lock, condvar and thread
//! come from `check_rounds/sync.rs`, loom's under `--cfg loom`), and a randomized ledger
//! test with plain threads (`tests::ledger_every_event_is_followed_by_a_check_that_saw_it`).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod sync;
use sync::{AtomicU8, Condvar, JoinHandle, Mutex};

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const AGAIN: u8 = 2;

/// A check of key `usize` (an index below the set's key count).
pub type Check = Box<dyn Fn(usize) + Send + Sync>;

struct Handed {
    keys: VecDeque<usize>,
    stopped: bool,
    /// The checker runs the owed rounds before it ends (`stopped` set by the tests'
    /// `drain_and_stop`).
    drain: bool,
    /// Checks running inline (on events' threads), which `stop` waits for.
    inline: usize,
}

struct Shared {
    states: Box<[AtomicU8]>,
    check: Check,
    handed: Mutex<Handed>,
    wake: Condvar,
    /// Signalled when the last inline check ends after `stopped`.
    quiet: Condvar,
}

impl Shared {
    /// Runs one check of `key`. A panic in it is caught and reported, and counts as the
    /// check having ended: the key's state moves on as after any check (so an owed round
    /// still runs and later events still check) and the checker thread lives on.
    fn run(&self, key: usize) {
        let check = std::panic::AssertUnwindSafe(|| (self.check)(key));
        if std::panic::catch_unwind(check).is_err() {
            eprintln!(
                "check_rounds: the check of key {key} panicked; its next round runs as usual"
            );
        }
    }

    /// Called by the owner of `key` after a check: `true` when no round is owed (the key
    /// is idle again), `false` when one is (the key stays owned, now `RUNNING`).
    fn finish(&self, key: usize) -> bool {
        let state = &self.states[key];
        if state
            .compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return true;
        }
        // AGAIN: the next round starts after this swap, so after every event that asked. A
        // swap, not a store: it reads the latest mark (every write of a state is a
        // read-modify-write, so it reads from every event's mark before it), where a store
        // after the failed exchange would leave room for an event's mark in between that
        // nothing orders before the next round.
        state.swap(RUNNING, Ordering::AcqRel);
        false
    }
}

/// Coalesced checks over keys `0..keys`, with their checker thread.
pub struct CheckRounds {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl CheckRounds {
    /// Checks of `keys` keys, each run by `check`; starts the checker thread (`name`).
    pub fn start(name: &str, keys: usize, check: Check) -> CheckRounds {
        let shared = Arc::new(Shared {
            states: (0..keys).map(|_| AtomicU8::new(IDLE)).collect(),
            check,
            handed: Mutex::new(Handed {
                keys: VecDeque::new(),
                stopped: false,
                drain: false,
                inline: 0,
            }),
            wake: Condvar::new(),
            quiet: Condvar::new(),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            sync::spawn_named(name, move || run_handed(&shared)).expect("spawning a checker thread")
        };
        CheckRounds {
            shared,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Something happened on `key`: a check of it will start after this call (inline, here,
    /// when none runs). Keys out of range are ignored.
    pub fn request(&self, key: usize) {
        let Some(state) = self.shared.states.get(key) else {
            return;
        };
        let mut seen = state.load(Ordering::Acquire);
        loop {
            let (to, inline) = match seen {
                IDLE => (RUNNING, true),
                RUNNING => (AGAIN, false),
                // Marked even when already marked: an event that only loaded `AGAIN` and
                // returned would not be ordered before the owner's next round (which could
                // miss what it did); the exchange is, through the owner's swap in `finish`.
                _ => (AGAIN, false),
            };
            match state.compare_exchange(seen, to, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if inline => break,
                Ok(_) => return,
                Err(now) => seen = now,
            }
        }
        let _inline = {
            let mut handed = self.shared.handed.lock();
            if handed.stopped {
                return;
            }
            handed.inline += 1;
            Inline(&self.shared)
        };
        self.shared.run(key);
        if !self.shared.finish(key) {
            let mut handed = self.shared.handed.lock();
            handed.keys.push_back(key);
            drop(handed);
            self.shared.wake.notify_one();
        }
    }

    /// Stops the checker thread (joins it), waits for the checks running inline on events'
    /// threads, and drops owed rounds: no check runs once it returns. Idempotent. (Not to
    /// be called from a check: it would wait for itself.)
    pub fn stop(&self) {
        self.shut(false);
    }

    /// Like [`CheckRounds::stop`], the checker thread first running every round owed: for
    /// the tests, a way to wait until the checks are quiet once the events are over.
    #[cfg(test)]
    fn drain_and_stop(&self) {
        self.shut(true);
    }

    fn shut(&self, drain: bool) {
        {
            let mut handed = self.shared.handed.lock();
            handed.stopped = true;
            handed.drain |= drain;
            while handed.inline > 0 {
                handed = self.shared.quiet.wait(handed);
            }
        }
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

/// An inline check in flight, counted in [`Handed::inline`] until it ends (or unwinds), so
/// that `stop` waits for it.
struct Inline<'a>(&'a Shared);

impl Drop for Inline<'_> {
    fn drop(&mut self) {
        let mut handed = self.0.handed.lock();
        handed.inline -= 1;
        let last = handed.stopped && handed.inline == 0;
        drop(handed);
        if last {
            self.0.quiet.notify_all();
        }
    }
}

impl Drop for CheckRounds {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The checker thread: runs the rounds owed on handed keys until none is, then gives the
/// key back (idle).
fn run_handed(shared: &Shared) {
    loop {
        let key = {
            let mut handed = shared.handed.lock();
            loop {
                let key = handed.keys.pop_front();
                if handed.stopped && !(handed.drain && key.is_some()) {
                    return;
                }
                match key {
                    Some(key) => break key,
                    None => handed = shared.wake.wait(handed),
                }
            }
        };
        shared.run(key);
        if !shared.finish(key) {
            // Another round: after the other handed keys.
            shared.handed.lock().keys.push_back(key);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_models;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    /// A check that counts itself, records the latest event it saw, and takes 1 ms.
    struct Counted {
        checks: AtomicUsize,
        events: AtomicUsize,
        seen: AtomicUsize,
    }

    fn zeroed() -> Arc<Counted> {
        Arc::new(Counted {
            checks: AtomicUsize::new(0),
            events: AtomicUsize::new(0),
            seen: AtomicUsize::new(0),
        })
    }

    fn counted() -> (Arc<Counted>, CheckRounds) {
        let counted = zeroed();
        let inner = Arc::clone(&counted);
        let rounds = CheckRounds::start(
            "test-checks",
            1,
            Box::new(move |_| {
                let events = inner.events.load(Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
                inner.seen.fetch_max(events, Ordering::SeqCst);
                inner.checks.fetch_add(1, Ordering::SeqCst);
            }),
        );
        (counted, rounds)
    }

    #[test]
    fn a_lone_event_is_checked_inline() {
        let (counted, rounds) = counted();
        counted.events.store(1, Ordering::SeqCst);
        rounds.request(0);
        assert_eq!(counted.checks.load(Ordering::SeqCst), 1);
        assert_eq!(counted.seen.load(Ordering::SeqCst), 1);
        rounds.request(7);
        assert_eq!(counted.checks.load(Ordering::SeqCst), 1);
    }

    /// 80,000 events from four threads while the first check of their key runs: every
    /// one of them only marks a round owed, and after the first check one more round (on
    /// the checker thread) sees the last event. The first check is held until the whole
    /// flood is in, so this does not depend on the machine's pace: timed instead (each
    /// check 1 ms, the flood left to outrun it), it failed on a stalled machine with
    /// 14,542 checks for 80,000 events, the events coming slower than the checks.
    #[test]
    fn a_flood_of_events_runs_few_checks_and_the_last_event_is_seen() {
        let counted = zeroed();
        let started = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let rounds = {
            let (inner, started, gate) = (
                Arc::clone(&counted),
                Arc::clone(&started),
                Arc::clone(&gate),
            );
            Arc::new(CheckRounds::start(
                "test-checks",
                1,
                Box::new(move |_| {
                    let events = inner.events.load(Ordering::SeqCst);
                    started.fetch_add(1, Ordering::SeqCst);
                    let (open, opened) = &*gate;
                    let mut open = open.lock().unwrap();
                    while !*open {
                        open = opened.wait(open).unwrap();
                    }
                    drop(open);
                    inner.seen.fetch_max(events, Ordering::SeqCst);
                    inner.checks.fetch_add(1, Ordering::SeqCst);
                }),
            ))
        };
        // The first event's check runs inline on its own thread, held at the gate.
        let first = {
            let rounds = Arc::clone(&rounds);
            std::thread::spawn(move || rounds.request(0))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while started.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(started.load(Ordering::SeqCst), 1, "the first check began");
        let per_thread = 20_000;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (counted, rounds) = (Arc::clone(&counted), Arc::clone(&rounds));
                std::thread::spawn(move || {
                    for _ in 0..per_thread {
                        counted.events.fetch_add(1, Ordering::SeqCst);
                        rounds.request(0);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "no event of the flood began a check of its own"
        );
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        first.join().unwrap();
        let all = 4 * per_thread;
        while counted.seen.load(Ordering::SeqCst) < all && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            counted.seen.load(Ordering::SeqCst),
            all,
            "the last event was seen"
        );
        // Give a spurious extra round the time to show.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            counted.checks.load(Ordering::SeqCst),
            2,
            "the held check and one owed round"
        );
    }

    /// A check that panics (inline, and on the checker thread) leaves no key stuck: later
    /// events on the key are checked, and so are keys handed to the checker afterwards.
    #[test]
    fn a_panicking_check_leaves_no_key_stuck() {
        let checks = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let panics = Arc::new(AtomicUsize::new(2));
        let (gate, opened) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let rounds = {
            let (checks, panics, gate, opened) = (
                Arc::clone(&checks),
                Arc::clone(&panics),
                Arc::clone(&gate),
                Arc::clone(&opened),
            );
            CheckRounds::start(
                "test-checks",
                2,
                Box::new(move |key| {
                    checks[key].fetch_add(1, Ordering::SeqCst);
                    // Key 1's first check waits for the test's second event, so that event
                    // is owed a round, which the checker thread runs (and which panics).
                    if key == 1 && opened.fetch_add(1, Ordering::SeqCst) == 0 {
                        while gate.load(Ordering::SeqCst) == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        return;
                    }
                    if panics.load(Ordering::SeqCst) > 0 {
                        panics.fetch_sub(1, Ordering::SeqCst);
                        panic!("a check that panics");
                    }
                }),
            )
        };
        let rounds = Arc::new(rounds);
        // Key 0: an inline check that panics, then an event that must still be checked.
        rounds.request(0);
        rounds.request(0);
        assert_eq!(
            checks[0].load(Ordering::SeqCst),
            2,
            "key 0 stuck after a panic"
        );
        // Key 1: the first check blocks; a second event is owed a round, handed to the
        // checker thread, whose check panics; later events are still checked there.
        let first = {
            let rounds = Arc::clone(&rounds);
            std::thread::spawn(move || rounds.request(1))
        };
        while opened.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        rounds.request(1);
        gate.store(1, Ordering::SeqCst);
        first.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while checks[1].load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            panics.load(Ordering::SeqCst),
            0,
            "the owed round did not panic"
        );
        for _ in 0..10 {
            rounds.request(1);
            while checks[1].load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert!(
            checks[1].load(Ordering::SeqCst) >= 3,
            "key 1 was not checked after the checker thread's check panicked"
        );
        rounds.stop();
    }

    #[test]
    fn stop_drops_owed_rounds_and_later_events_check_nothing() {
        let (counted, rounds) = counted();
        rounds.stop();
        rounds.request(0);
        assert_eq!(counted.checks.load(Ordering::SeqCst), 0);
        rounds.stop();
    }

    /// The randomized ledger: threads x events on random keys, each event numbered per key
    /// (`events[key]`, bumped before its `request`); each check records the highest number
    /// of its key it saw at its start, and whether another check of the key was running.
    /// Once the events are over and the owed rounds drained, every key's checks saw every
    /// one of its events, and none overlapped.
    #[test]
    fn ledger_every_event_is_followed_by_a_check_that_saw_it() {
        const KEYS: usize = 8;
        const THREADS: usize = 4;
        const EVENTS: usize = 20_000;
        struct Ledger {
            events: [AtomicUsize; KEYS],
            seen: [AtomicUsize; KEYS],
            inside: [std::sync::atomic::AtomicBool; KEYS],
            overlaps: AtomicUsize,
            checks: AtomicUsize,
        }
        let ledger = Arc::new(Ledger {
            events: Default::default(),
            seen: Default::default(),
            inside: Default::default(),
            overlaps: AtomicUsize::new(0),
            checks: AtomicUsize::new(0),
        });
        let seed = std::env::var("CHECK_ROUNDS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                now.map_or(1, |d| d.as_nanos() as u64) | 1
            });
        println!("CHECK_ROUNDS_SEED={seed}");
        let inner = Arc::clone(&ledger);
        let rounds = Arc::new(CheckRounds::start(
            "ledger-checks",
            KEYS,
            Box::new(move |key| {
                if inner.inside[key].swap(true, Ordering::SeqCst) {
                    inner.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let events = inner.events[key].load(Ordering::SeqCst);
                inner.seen[key].fetch_max(events, Ordering::SeqCst);
                // A check that takes a little while, so events pile up behind it.
                for _ in 0..(events % 64) {
                    std::hint::spin_loop();
                }
                inner.checks.fetch_add(1, Ordering::SeqCst);
                inner.inside[key].store(false, Ordering::SeqCst);
            }),
        ));
        let threads: Vec<_> = (0..THREADS as u64)
            .map(|thread| {
                let (ledger, rounds) = (Arc::clone(&ledger), Arc::clone(&rounds));
                // xorshift64, one stream per thread.
                let mut x = seed ^ (thread + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                std::thread::spawn(move || {
                    for _ in 0..EVENTS {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let key = (x % KEYS as u64) as usize;
                        ledger.events[key].fetch_add(1, Ordering::SeqCst);
                        rounds.request(key);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        rounds.drain_and_stop();
        let events: Vec<usize> = ledger
            .events
            .iter()
            .map(|e| e.load(Ordering::SeqCst))
            .collect();
        let seen: Vec<usize> = ledger
            .seen
            .iter()
            .map(|s| s.load(Ordering::SeqCst))
            .collect();
        assert_eq!(seen, events, "seed {seed}: events no check saw");
        assert_eq!(events.iter().sum::<usize>(), THREADS * EVENTS);
        assert_eq!(ledger.overlaps.load(Ordering::SeqCst), 0, "seed {seed}");
        let checks = ledger.checks.load(Ordering::SeqCst);
        println!("{checks} checks for {} events", THREADS * EVENTS);
    }
}
