//! The reaper does not wake for a timeout bucket whose operations were all answered
//! before their timeout: a completion's timer cancel, applied in a batch at the reaper's
//! next round, takes the emptied bucket off the front of the timer's bucket queue
//! (`docs/timer.md`, "The bucket queue"), so the reaper's next sleep goes past it. Linux
//! only: the reaper's wake-ups are its voluntary context switches, read from `/proc`.
#![cfg(target_os = "linux")]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Purgatory, WatchOutcome};

/// Never ready; tells `done` when it is answered, if given one.
struct Op {
    timeout: Duration,
    done: Option<mpsc::Sender<Completion>>,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, how: Completion) {
        if let Some(done) = self.done.take() {
            let _ = done.send(how);
        }
    }
}

/// The voluntary context switches of this process's thread named `name`.
fn switches_of(name: &str) -> Option<u64> {
    // A thread that exits meanwhile (another test's) fails its reads: skipped.
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let dir = task.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.trim_end() == name {
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            return status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|n| n.trim().parse().ok());
        }
    }
    None
}

#[test]
fn the_reaper_does_not_wake_for_a_bucket_whose_operations_were_all_answered() {
    let ms = Duration::from_millis;
    let op = |timeout, done| Op { timeout, done };
    // Each attempt: an operation with a 60 ms timeout answered at once (forced: its timer
    // cancel is queued, and applied in a batch at the reaper's next round), one with
    // 20 ms that expires, and one an hour away. The reaper wakes at 20 ms, applies the
    // cancel, expires the 20 ms one and sleeps; it must not wake for the emptied 60 ms
    // bucket. An attempt the machine stalled proves nothing and is tried again; eight
    // must run unstalled. Fails when emptied buckets stay queued
    // (`Wheel::drop_emptied_front` a no-op).
    let mut measured = 0;
    for _attempt in 0..60 {
        let p: Purgatory<u64, Op> = Purgatory::new("wp");
        let start = Instant::now();
        let (tx, rx) = mpsc::channel();
        assert!(!p
            .try_complete_else_watch(op(Duration::from_secs(3_600), None), [1])
            .unwrap());
        let Ok(WatchOutcome::Pending(answered)) = p.watch(op(ms(60), None), [2]) else {
            panic!("a never-ready operation waits");
        };
        assert!(p.force_complete(&answered));
        assert!(!p
            .try_complete_else_watch(op(ms(20), Some(tx)), [3])
            .unwrap());
        let how = rx.recv_timeout(Duration::from_secs(10)).expect("expired");
        assert_eq!(how, Completion::Expired);
        if start.elapsed() > ms(45) {
            continue;
        }
        std::thread::sleep(ms(5)); // the reaper goes back to sleep
        let before = switches_of("wp-reaper").expect("the reaper thread is listed");
        std::thread::sleep(ms(150).saturating_sub(start.elapsed()));
        let after = switches_of("wp-reaper").expect("the reaper thread is listed");
        if start.elapsed() > ms(200) {
            continue;
        }
        assert_eq!(
            after - before,
            0,
            "the reaper woke between 25 and 150 ms, where only an answered operation's \
             bucket was"
        );
        p.shutdown();
        measured += 1;
        if measured == 8 {
            return;
        }
    }
    // Attempts the machine stalled measured nothing (the test does not fail CI for the
    // machine's sake; every attempt that ran unstalled was checked above).
    eprintln!("{measured} of 8 attempts ran unstalled: the rest measured nothing");
}
