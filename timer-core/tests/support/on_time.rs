//! What the on-time suites share (`timer-core/tests/stand_in.rs`, `relief_edges.rs`,
//! `slow_subscriber.rs` and `purgatory/tests/on_time.rs`, which include this file): the
//! lateness they assert, their turns, and how a measurement is judged on a shared machine.
//!
//! The machines these run on have two shared cores: a neighbour, or the kernel scanning
//! memory after a build, can take one for tens of milliseconds, and one measurement past
//! the bound then says little about the library. So a scenario past its bound is run again,
//! [`ATTEMPTS`] times in all, and fails the test only if every run was past it. What the
//! suites guard against breaks the bound in every run (before relief by lateness: others
//! 34-40 ms late behind one blocked callback, 955 ms among fifty just under the bound,
//! 2.0 s behind sixteen blocked, 1.36 s beside a slow subscriber), so it still fails.

#![allow(dead_code)] // Each suite uses what it needs.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The promise under test: the default bound (20 ms).
pub const BOUND: Duration = timer_core::DEFAULT_STAND_IN_BOUND;

/// The lateness asserted: the bound itself in a release build (the figure the docs
/// promise, and how CI's release step runs these suites); twice the bound in a debug
/// build, whose driving threads run unoptimised code beside the rest of the suite. That
/// still fails on what the suites guard against.
pub const ASSERTED: Duration = if cfg!(debug_assertions) {
    Duration::from_nanos(2 * BOUND.as_nanos() as u64)
} else {
    BOUND
};

/// Runs of a scenario past its bound before it fails the test.
pub const ATTEMPTS: usize = 3;

/// Serialises the tests of a suite: each measures lateness on a 2-core machine, and they
/// would measure each other.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `Ok` with a report if `took` is under `bound`, else `Err` with it.
pub fn under(what: &str, took: Duration, bound: Duration) -> Result<String, String> {
    let report = format!("{what}: {took:?} (bound {bound:?})");
    if took < bound {
        Ok(report)
    } else {
        Err(report)
    }
}

/// `Ok` if `late` is under [`ASSERTED`].
pub fn on_time(what: &str, late: Duration) -> Result<String, String> {
    under(what, late, ASSERTED)
}

/// Runs `scenario` until one run keeps its bounds, at most [`ATTEMPTS`] times; panics
/// with every run's report if none did.
pub fn in_one_of_three(mut scenario: impl FnMut() -> Result<String, String>) {
    let mut past = Vec::new();
    for attempt in 1..=ATTEMPTS {
        match scenario() {
            Ok(report) => {
                eprintln!("run {attempt}: {report}");
                return;
            }
            Err(report) => {
                eprintln!("run {attempt} past its bound: {report}");
                past.push(report);
            }
        }
    }
    panic!("past the bound in each of {ATTEMPTS} runs: {past:#?}");
}

/// What ran: each task's deadline and when it started.
pub type Ran = Arc<Mutex<Vec<(Duration, Instant)>>>;

/// A timer task that records when it ran (and its deadline), then blocks for `blocks`.
pub struct Recorded {
    pub deadline: Duration,
    pub blocks: Duration,
    pub ran: Ran,
}

impl timer_core::TimerTask for Recorded {
    fn run(self) {
        self.ran
            .lock()
            .unwrap()
            .push((self.deadline, Instant::now()));
        if !self.blocks.is_zero() {
            std::thread::sleep(self.blocks);
        }
    }
}
