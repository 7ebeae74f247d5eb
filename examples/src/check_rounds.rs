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
//! | `AGAIN`        | a check runs and another round is owed              | nothing (already owed)        |
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
//! - After [`CheckRounds::stop`] owed rounds are dropped (the purgatories are shut down
//!   next, which answers every parked operation) and events check nothing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const AGAIN: u8 = 2;

/// A check of key `usize` (an index below the set's key count).
pub type Check = Box<dyn Fn(usize) + Send + Sync>;

struct Handed {
    keys: VecDeque<usize>,
    stopped: bool,
}

struct Shared {
    states: Box<[AtomicU8]>,
    check: Check,
    handed: Mutex<Handed>,
    wake: Condvar,
}

impl Shared {
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
        // AGAIN: the next round starts after this store, so after every event that asked.
        state.store(RUNNING, Ordering::Release);
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
            }),
            wake: Condvar::new(),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || run_handed(&shared))
                .expect("spawning a checker thread")
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
                _ => return,
            };
            match state.compare_exchange(seen, to, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if inline => break,
                Ok(_) => return,
                Err(now) => seen = now,
            }
        }
        if self.shared.handed.lock().stopped {
            return;
        }
        (self.shared.check)(key);
        if !self.shared.finish(key) {
            let mut handed = self.shared.handed.lock();
            handed.keys.push_back(key);
            drop(handed);
            self.shared.wake.notify_one();
        }
    }

    /// Stops the checker thread (joins it) and drops owed rounds. Idempotent.
    pub fn stop(&self) {
        self.shared.handed.lock().stopped = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
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
                if handed.stopped {
                    return;
                }
                match handed.keys.pop_front() {
                    Some(key) => break key,
                    None => shared.wake.wait(&mut handed),
                }
            }
        };
        (shared.check)(key);
        if !shared.finish(key) {
            // Another round: after the other handed keys.
            shared.handed.lock().keys.push_back(key);
        }
    }
}

#[cfg(test)]
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

    fn counted() -> (Arc<Counted>, CheckRounds) {
        let counted = Arc::new(Counted {
            checks: AtomicUsize::new(0),
            events: AtomicUsize::new(0),
            seen: AtomicUsize::new(0),
        });
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

    #[test]
    fn a_flood_of_events_runs_few_checks_and_the_last_event_is_seen() {
        let (counted, rounds) = counted();
        let rounds = Arc::new(rounds);
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
        let all = 4 * per_thread;
        let deadline = Instant::now() + Duration::from_secs(10);
        while counted.seen.load(Ordering::SeqCst) < all && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(counted.seen.load(Ordering::SeqCst), all);
        let checks = counted.checks.load(Ordering::SeqCst);
        assert!(checks < all / 10, "{checks} checks for {all} events");
    }

    #[test]
    fn stop_drops_owed_rounds_and_later_events_check_nothing() {
        let (counted, rounds) = counted();
        rounds.stop();
        rounds.request(0);
        assert_eq!(counted.checks.load(Ordering::SeqCst), 0);
        rounds.stop();
    }
}
