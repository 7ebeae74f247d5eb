//! Lookups by a borrowed form of the key (issue #28, finding 5): with `String` keys, an
//! event that holds a `&str` checks and cancels without allocating a `String`, and finds
//! exactly what the owned key would.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use purgatory::{Completion, DelayedOperation, Purgatory};

struct Op {
    ready: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn try_complete(&mut self) -> bool {
        self.ready.load(SeqCst) > 0
    }
    fn on_complete(&mut self, how: Completion) {
        assert_eq!(how, Completion::Ready);
        self.answered.fetch_add(1, SeqCst);
    }
}

#[test]
fn string_keys_are_checked_and_cancelled_by_str() {
    let p: Purgatory<String, Op> = Purgatory::new("borrowed");
    let ready = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let op = || Op {
        ready: Arc::clone(&ready),
        answered: Arc::clone(&answered),
    };
    for topic in ["orders-0", "orders-1", "orders-0"] {
        assert!(!p
            .try_complete_else_watch(op(), [topic.to_string()])
            .unwrap());
    }
    ready.store(1, SeqCst);
    // Not a key: nothing. A prefix of one, or a longer string, must not match.
    assert_eq!(p.check_and_complete("orders"), 0);
    assert_eq!(p.check_and_complete("orders-00"), 0);
    let event: &str = "orders-0";
    assert_eq!(p.check_and_complete(event), 2);
    assert_eq!(answered.load(SeqCst), 2);
    // The owned form still works, and finds the same list.
    ready.store(0, SeqCst);
    assert_eq!(p.check_and_complete(&"orders-1".to_string()), 0);
    let taken = p.cancel_for_key("orders-1");
    assert_eq!(taken.len(), 1);
    let stats = p.stats();
    assert_eq!((stats.pending, stats.cancelled, stats.keys), (0, 1, 0));
    p.shutdown();
}
