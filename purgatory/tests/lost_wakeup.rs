//! No lost wake-up on the watch path: an event that makes an operation ready after its
//! first `try_complete` said "not yet" but before the operation is listed on its key must
//! still complete it (the spec: "tries once more, so that an event that happened between
//! the first try and the watch is never lost").
//!
//! The window is opened deterministically from inside the first `try_complete`: having
//! read "not ready", it makes the operation ready and fires the event
//! (`check_and_complete` on the key) from another thread, waits (bounded) for that event
//! to return, and then reports what it read. If the purgatory tried only once, nobody
//! would try the operation again until its 200 s timeout.

mod probe;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use probe::wait_until;
use purgatory::{Completion, DelayedOperation, Purgatory};

struct Shared {
    purgatory: OnceLock<Purgatory<&'static str, RacyOp>>,
    ready: AtomicBool,
    tries: AtomicU32,
    completions: AtomicU32,
    how: OnceLock<Completion>,
    event_completed: AtomicUsize,
    event_returned: AtomicBool,
}

struct RacyOp {
    shared: Arc<Shared>,
}

impl DelayedOperation for RacyOp {
    fn timeout(&self) -> Duration {
        Duration::from_secs(200)
    }

    fn try_complete(&mut self) -> bool {
        let ready = self.shared.ready.load(SeqCst);
        if self.shared.tries.fetch_add(1, SeqCst) == 0 {
            assert!(!ready);
            // The event happens now: after this try read "not ready".
            let shared = Arc::clone(&self.shared);
            let (done_tx, done_rx) = crossbeam_channel::bounded(1);
            std::thread::spawn(move || {
                shared.ready.store(true, SeqCst);
                let purgatory = shared.purgatory.get().expect("set before watching");
                let n = purgatory.check_and_complete(&"key");
                shared.event_completed.store(n, SeqCst);
                shared.event_returned.store(true, SeqCst);
                let _ = done_tx.send(());
            });
            // An implementation that lists the key before trying makes the event wait for
            // this try to end; do not wait for it forever then.
            let _ = done_rx.recv_timeout(Duration::from_secs(1));
        }
        ready
    }

    fn on_complete(&mut self, how: Completion) {
        self.shared.completions.fetch_add(1, SeqCst);
        let _ = self.shared.how.set(how);
    }
}

#[test]
fn an_event_between_the_first_try_and_the_watch_is_not_lost() {
    let shared = Arc::new(Shared {
        purgatory: OnceLock::new(),
        ready: AtomicBool::new(false),
        tries: AtomicU32::new(0),
        completions: AtomicU32::new(0),
        how: OnceLock::new(),
        event_completed: AtomicUsize::new(0),
        event_returned: AtomicBool::new(false),
    });
    let purgatory = Purgatory::new("lost-wakeup");
    assert!(shared.purgatory.set(purgatory.clone()).is_ok());

    let completed_by_watch = purgatory
        .try_complete_else_watch(
            RacyOp {
                shared: Arc::clone(&shared),
            },
            ["key"],
        )
        .expect("accepted");
    assert!(
        wait_until(Duration::from_secs(10), || shared
            .event_returned
            .load(SeqCst)),
        "the event never returned"
    );
    let completed_by_event = shared.event_completed.load(SeqCst) == 1;

    assert!(
        completed_by_watch || completed_by_event,
        "the operation became ready before it was watched, yet neither the watch nor the \
         event completed it (tries: {})",
        shared.tries.load(SeqCst)
    );
    assert!(!(completed_by_watch && completed_by_event));
    assert_eq!(shared.completions.load(SeqCst), 1);
    assert_eq!(shared.how.get(), Some(&Completion::Ready));
    let stats = purgatory.stats();
    assert_eq!(stats.pending, 0, "its timer is disarmed");
    assert_eq!(stats.completed, 1);
    assert_eq!(stats.expired, 0);
    purgatory.shutdown();
}
