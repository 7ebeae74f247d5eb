//! Memory follows the operations in flight, not the keys ever seen: a stream of
//! operations over ever-new keys, never more than `IN_FLIGHT` pending at once and each
//! completed by an event, ends with an empty watcher map and a resident set within a few
//! MB of what it was once the first `IN_FLIGHT` operations were waiting.
//!
//! Operation `i` waits on keys `i` and `i + 1`, so every key is shared by two operations
//! and every completion leaves a completed entry behind on its second key until the next
//! check of that key (or a purge) drops it; a key whose list empties must go.
//!
//! The test runs alone in this binary, so the process's resident set (`VmRSS`) is its own.
//! It streams 1,000,000 operations (about 10 s in a debug build, 2 s in release): a leak
//! of 16 bytes per key or per operation would already exceed the slack.

#[path = "support/rss.rs"]
mod rss;
use rss::resident_kb;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use purgatory::{Completion, DelayedOperation, Purgatory};

const OPERATIONS: u64 = 1_000_000;
const IN_FLIGHT: u64 = 10_000;
/// What the stream may add to the resident set once the first `IN_FLIGHT` are waiting.
const SLACK_KB: u64 = 16 * 1024;

/// Ready once the shared watermark has passed its id; carries a request-sized payload.
struct Request {
    id: u64,
    completed_up_to: Arc<AtomicU64>,
    _payload: Box<[u8; 128]>,
}

impl DelayedOperation for Request {
    fn timeout(&self) -> Duration {
        Duration::from_secs(300)
    }

    fn try_complete(&mut self) -> bool {
        self.completed_up_to.load(Ordering::Acquire) > self.id
    }

    fn on_complete(&mut self, how: Completion) {
        assert_eq!(how, Completion::Ready, "request {}", self.id);
    }
}

#[test]
fn memory_does_not_grow_with_the_number_of_keys_ever_seen() {
    let purgatory: Purgatory<u64, Request> = Purgatory::new("memory");
    let watermark = Arc::new(AtomicU64::new(0));
    let mut baseline_kb = 0;
    let mut completed = 0;

    for id in 0..OPERATIONS {
        let request = Request {
            id,
            completed_up_to: Arc::clone(&watermark),
            _payload: Box::new([id as u8; 128]),
        };
        assert!(!purgatory
            .try_complete_else_watch(request, [id, id + 1])
            .unwrap());
        if id + 1 == IN_FLIGHT {
            baseline_kb = resident_kb();
        }
        if id + 1 >= IN_FLIGHT {
            let oldest = id + 1 - IN_FLIGHT;
            watermark.store(oldest + 1, Ordering::Release);
            completed += purgatory.check_and_complete(&oldest) as u64;
        }
    }
    let stats = purgatory.stats();
    assert_eq!(stats.pending as u64, IN_FLIGHT - 1);

    // Drain the last ones the same way.
    for oldest in OPERATIONS + 1 - IN_FLIGHT..=OPERATIONS {
        watermark.store(oldest + 1, Ordering::Release);
        completed += purgatory.check_and_complete(&oldest) as u64;
    }
    assert_eq!(completed, OPERATIONS);
    let stats = purgatory.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.watched, 0, "{stats:?}");
    assert_eq!(stats.keys, 0, "{stats:?}");
    assert_eq!(stats.completed, OPERATIONS);

    let end_kb = resident_kb();
    eprintln!(
        "memory: {OPERATIONS} operations over {} keys: VmRSS {baseline_kb} kB with the first \
         {IN_FLIGHT} waiting, {end_kb} kB at the end ({:+} kB); purged {}",
        OPERATIONS + 1,
        end_kb as i64 - baseline_kb as i64,
        stats.purged
    );
    assert!(
        end_kb <= baseline_kb + SLACK_KB,
        "resident set grew from {baseline_kb} kB to {end_kb} kB over {OPERATIONS} keys"
    );
}
