//! A session's heartbeat, for counting what it costs under `valgrind --tool=callgrind`:
//! `S` sessions (the third argument, default 1,000) are watched keyless with a 10 s
//! timeout, then `N` heartbeats (default 20,000) go round them, 10 a millisecond: each
//! session's deadline moves by `S / 10` ms a heartbeat (100 ms by default; 2 s with
//! 20,000 sessions, the coordinator example's heartbeat interval). Mode `reset` (default)
//! moves the session's deadline (`Purgatory::reset_timeout`); mode `rewatch` does what a
//! heartbeat cost before it, a `cancel` and a new `watch_keyless`. Then shutdown.
//!
//! ```text
//! cargo build --release -p purgatory-benches --example heartbeats
//! valgrind --tool=callgrind target/release/examples/heartbeats {100,20000} [reset|rewatch] [S]
//! ```
//!
//! Per heartbeat: (total at 20,000 - total at 100) / 19,900.

use std::time::Duration;

use purgatory::{Completion, DelayedOperation, OperationHandle, Purgatory, WatchOutcome};

struct Session;

impl DelayedOperation for Session {
    fn timeout(&self) -> Duration {
        Duration::from_secs(10)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {}
}

fn watch(p: &Purgatory<u64, Session>) -> OperationHandle<Session> {
    match p.watch_keyless(Session).expect("watched") {
        WatchOutcome::Pending(handle) => handle,
        WatchOutcome::Completed => unreachable!("never ready"),
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("a number"))
        .unwrap_or(20_000);
    let rewatch = std::env::args().nth(2).is_some_and(|m| m == "rewatch");
    let sessions: usize = std::env::args()
        .nth(3)
        .map(|a| a.parse().expect("a number"))
        .unwrap_or(1_000);
    let p: Purgatory<u64, Session> = Purgatory::new("heartbeats");
    let mut handles: Vec<_> = (0..sessions).map(|_| watch(&p)).collect();
    let mut i = 0;
    while i < n {
        for _ in 0..10 {
            let at = (i % sessions as u64) as usize;
            if rewatch {
                let _ = p.cancel(&handles[at]).expect("alive");
                handles[at] = watch(&p);
            } else {
                assert!(p.reset_timeout(&handles[at], Duration::from_secs(10)));
            }
            i += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    p.shutdown();
}
