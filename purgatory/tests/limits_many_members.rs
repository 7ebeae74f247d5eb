//! Why a `TimerGroup` takes at most `MAX_MEMBERS_LIMIT` purgatories: every round of the
//! group's timer runs each member's housekeeping, so a round's fixed cost, and with it
//! how late a timeout can be answered, grows with the members.
//!
//! A measurement, not a bound: ignored by default, run it to print the figures the
//! constant's docs quote:
//!
//! ```text
//! cargo test --release -p kafka-purgatory --test limits_many_members -- --ignored --nocapture
//! ```
//!
//! It checks what holds whatever the machine does: every operation answered once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Purgatory, PurgatoryBuilder, TimerGroup};

/// Each answer's lateness past its deadline.
type Late = Arc<Mutex<Vec<Duration>>>;

/// Never ready; records how late its expiry came.
struct Op {
    deadline: Instant,
    late: Late,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        TIMEOUT
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, how: Completion) {
        assert_eq!(how, Completion::Expired);
        let late = Instant::now().saturating_duration_since(self.deadline);
        self.late.lock().unwrap().push(late);
    }
}

const TIMEOUT: Duration = Duration::from_millis(20);
const OPS: usize = 500;

/// Watches `OPS` operations, one a millisecond, on one member of a group of `members`;
/// returns the median and worst lateness of their expiries.
fn lateness_with(members: usize) -> (Duration, Duration) {
    let group = TimerGroup::builder()
        .name("many-members")
        .max_members(members)
        .build()
        .unwrap();
    let all: Vec<Purgatory<u64, Op>> = (0..members)
        .map(|_| PurgatoryBuilder::new().shards(1).build_on(&group).unwrap())
        .collect();
    let late: Late = Arc::default();
    for i in 0..OPS {
        let op = Op {
            deadline: Instant::now() + TIMEOUT,
            late: Arc::clone(&late),
        };
        assert!(!all[members - 1]
            .try_complete_else_watch(op, [i as u64 % 10])
            .unwrap());
        std::thread::sleep(Duration::from_millis(1));
    }
    let until = Instant::now() + Duration::from_secs(10);
    while late.lock().unwrap().len() < OPS && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    group.shutdown();
    let mut late = late.lock().unwrap().clone();
    assert_eq!(
        late.len(),
        OPS,
        "every operation answered once, by its timeout"
    );
    late.sort();
    (late[OPS / 2], late[OPS - 1])
}

#[test]
#[ignore = "a measurement: run in release with --ignored --nocapture"]
fn a_rounds_cost_grows_with_the_members() {
    for members in [1, 64, purgatory::MAX_MEMBERS_LIMIT] {
        let (median, worst) = lateness_with(members);
        println!(
            "{members} members: a {TIMEOUT:?} timeout answered {median:?} late (median), {worst:?} at worst"
        );
    }
}
