//! Every timeout on time whatever runs beside it (issue #36): with the default
//! configuration, operations whose expiry callbacks hold the reaper (one that blocks,
//! sixteen that block at once, fifty that each run just under the bound) leave every
//! other operation answered within the bound of its deadline, 20 ms
//! (`timer_core::DEFAULT_STAND_IN_BOUND`). Relief follows lateness: a stand-in thread
//! takes over whatever has waited half the bound (`timer-core/src/stand_in.rs`).
//!
//! The bound is asserted at its edge in a release build, as CI's release step runs this
//! binary (`cargo test --release -p kafka-purgatory --test on_time`); a debug build
//! asserts twice it. Its tests take turns, and a scenario past its bound is run again
//! before it fails (`timer-core/tests/support/on_time.rs` says why).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Purgatory, PurgatoryBuilder, TimerGroup};

#[path = "../../timer-core/tests/support/on_time.rs"]
mod support;
use support::{in_one_of_three, on_time, one_at_a_time, BOUND};

/// When each operation was answered: whether it was a slow one, its deadline, and when
/// its `on_expiration` began.
type Answers = Arc<Mutex<Vec<(bool, Instant, Instant)>>>;

/// Never ready; its expiry callback records when it began, then holds its thread for
/// `holds`.
struct Timed {
    timeout: Duration,
    deadline: Instant,
    holds: Duration,
    answers: Answers,
}

impl DelayedOperation for Timed {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, how: Completion) {
        assert_eq!(how, Completion::Expired);
    }
    fn on_expiration(&mut self) {
        let slow = !self.holds.is_zero();
        self.answers
            .lock()
            .unwrap()
            .push((slow, self.deadline, Instant::now()));
        std::thread::sleep(self.holds);
    }
}

/// A purgatory with the default configuration, and what it answered; on a group, the
/// slow operations go to a second member of the group.
struct Scenario {
    purgatory: Purgatory<u64, Timed>,
    slow_member: Option<Purgatory<u64, Timed>>,
    answers: Answers,
    watched: usize,
}

impl Scenario {
    fn new(name: &str) -> Self {
        Scenario {
            purgatory: Purgatory::new(name),
            slow_member: None,
            answers: Arc::default(),
            watched: 0,
        }
    }

    /// Two purgatories on one `TimerGroup` with the default configuration: the quick
    /// operations on one, the slow ones on the other.
    fn on_group(name: &str) -> Self {
        let group = TimerGroup::new(name);
        let member = || PurgatoryBuilder::new().build_on(&group).unwrap();
        Scenario {
            purgatory: member(),
            slow_member: Some(member()),
            answers: Arc::default(),
            watched: 0,
        }
    }

    /// Watches an operation that expires after `timeout` and whose callback holds its
    /// thread for `holds` (a quick one when zero).
    fn watch(&mut self, timeout: Duration, holds: Duration) {
        let op = Timed {
            timeout,
            deadline: Instant::now() + timeout,
            holds,
            answers: Arc::clone(&self.answers),
        };
        self.watched += 1;
        let key = self.watched as u64;
        let purgatory = match &self.slow_member {
            Some(slow) if !holds.is_zero() => slow,
            _ => &self.purgatory,
        };
        assert!(!purgatory.try_complete_else_watch(op, [key]).unwrap());
    }

    /// Waits for every answer; returns the latest lateness of the quick ones.
    fn latest_quick(self) -> Duration {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.answers.lock().unwrap().len() < self.watched && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let answers = self.answers.lock().unwrap().clone();
        assert_eq!(answers.len(), self.watched, "every operation was answered");
        let late = answers
            .iter()
            .filter(|(slow, _, _)| !slow)
            .map(|(_, deadline, at)| at.saturating_duration_since(*deadline))
            .max()
            .expect("quick operations");
        eprintln!(
            "latest quick answer {late:?} after its deadline; {:?}",
            self.purgatory.stats()
        );
        self.purgatory.shutdown();
        late
    }
}

/// `blocked` operations whose callbacks block `holds`, due at 10 ms; 20 quick ones due in
/// the same tick, behind them in their batch (a timer bucket hands out its newest first,
/// so they are watched first); 20 quick ones due at 40 ms, while they block.
fn behind_blocked(name: &str, blocked: usize, holds: Duration) -> Duration {
    behind_blocked_in(Scenario::new(name), blocked, holds)
}

fn behind_blocked_in(mut scenario: Scenario, blocked: usize, holds: Duration) -> Duration {
    let at = Duration::from_millis(10);
    for _ in 0..20 {
        scenario.watch(at, Duration::ZERO);
    }
    for _ in 0..blocked {
        scenario.watch(at, holds);
    }
    for _ in 0..20 {
        scenario.watch(Duration::from_millis(40), Duration::ZERO);
    }
    scenario.latest_quick()
}

/// One callback blocked a second. Before: others 34-40 ms late (a stand-in came only
/// after a whole look without progress).
#[test]
fn one_blocked_callback_delays_no_other_timeout() {
    let _turn = one_at_a_time();
    in_one_of_three(|| {
        let late = behind_blocked("one-blocked", 1, Duration::from_secs(1));
        on_time("behind one blocked callback", late)
    });
}

/// Sixteen callbacks blocked a second each, at once. Before: with at most 8 driving
/// threads, others 2.0 s late.
#[test]
fn sixteen_blocked_callbacks_delay_no_other_timeout() {
    let _turn = one_at_a_time();
    in_one_of_three(|| {
        let late = behind_blocked("sixteen-blocked", 16, Duration::from_secs(1));
        on_time("behind sixteen blocked callbacks", late)
    });
}

/// On a `TimerGroup` (issue #37): sixteen callbacks of one purgatory blocked a second
/// each, at once, hold no timeout of another purgatory on the same timer.
#[test]
fn sixteen_blocked_callbacks_of_one_member_delay_no_other_members_timeout() {
    let _turn = one_at_a_time();
    in_one_of_three(|| {
        let scenario = Scenario::on_group("group-blocked");
        let late = behind_blocked_in(scenario, 16, Duration::from_secs(1));
        on_time("behind sixteen blocked callbacks of another member", late)
    });
}

/// Fifty callbacks of 19 ms each (just under the bound), one due every 2 ms, with quick
/// operations due every millisecond among them. Before: no stand-in ever started (each
/// callback returned within a look), and the others were 955 ms late.
#[test]
fn fifty_callbacks_just_under_the_bound_delay_no_other_timeout() {
    let _turn = one_at_a_time();
    let holds = BOUND - Duration::from_millis(1);
    in_one_of_three(|| {
        let mut scenario = Scenario::new("just-under");
        for i in 0..110u64 {
            scenario.watch(Duration::from_millis(10 + i), Duration::ZERO);
        }
        for i in 0..50u64 {
            scenario.watch(Duration::from_millis(10 + 2 * i), holds);
        }
        let late = scenario.latest_quick();
        on_time(&format!("among fifty callbacks of {holds:?}"), late)
    });
}
