//! The wake hook of a driver that waits outside the core (`TimerCore::set_wake_hook`):
//! called by every add that queues a task earlier than every other of its shard, by
//! `wake` and by shutdown; not by an add behind an earlier task.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use timer_core::{ManualClock, TimerBuilder, TimerCore};

fn core_with_hook() -> (TimerCore<u32>, Arc<AtomicUsize>) {
    let core: TimerCore<u32> = TimerBuilder::new()
        .clock(ManualClock::new())
        .shards(1)
        .build_core()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    assert!(core.set_wake_hook(move || {
        counted.fetch_add(1, Ordering::SeqCst);
    }));
    assert!(!core.set_wake_hook(|| {}), "one hook at most");
    (core, calls)
}

#[test]
fn an_add_earlier_than_every_queued_task_calls_the_hook() {
    let (core, calls) = core_with_hook();
    core.add(Duration::from_secs(10), 1).unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the first task of an idle core"
    );
    core.add(Duration::from_secs(20), 2).unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "behind an earlier task: no call"
    );
    core.add(Duration::from_secs(5), 3).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2, "earlier than all");
    core.wake();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    drop(core.shutdown());
    assert_eq!(calls.load(Ordering::SeqCst), 4, "shutdown wakes the driver");
}
