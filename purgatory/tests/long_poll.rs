//! The simple case (issue #28): `wait_until`, a long poll from a condition and a timeout,
//! on every way it can end: ready at once or on an event, its timeout (on tokio's paused
//! time), force, shutdown (also when already shut down), refusal, taken back, and the
//! client leaving (the drop cancels it, once).
#![cfg(feature = "tokio")]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use purgatory::{Completion, LongPoll, Purgatory, WaitError, WatchErrorKind};

fn flag() -> (Arc<AtomicBool>, impl FnMut() -> bool + Send + 'static) {
    let flag = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&flag);
    (flag, move || seen.load(SeqCst))
}

#[tokio::test(start_paused = true)]
async fn a_long_poll_ends_ready_expired_forced_or_shutdown() {
    let polls: Purgatory<String, LongPoll> =
        Purgatory::builder().follow_tokio_time().build().unwrap();
    let key = || ["orders".to_string()];

    // Ready at once: nothing watched.
    let wait = polls.wait_until(key(), Duration::from_secs(8), || true);
    assert!(wait.handle().is_none());
    assert_eq!(wait.await, Ok(Completion::Ready));

    // Ready on an event, checked by a borrowed key.
    let (ready, condition) = flag();
    let wait = polls.wait_until(key(), Duration::from_secs(8), condition);
    assert!(wait.handle().is_some());
    ready.store(true, SeqCst);
    assert_eq!(polls.check_and_complete("orders"), 1);
    assert_eq!(wait.await, Ok(Completion::Ready));

    // Its timeout, on paused time.
    let (_, condition) = flag();
    let started = tokio::time::Instant::now();
    let wait = polls.wait_until(key(), Duration::from_secs(8), condition);
    assert_eq!(wait.await, Ok(Completion::Expired));
    assert!(started.elapsed() >= Duration::from_secs(8));

    // Forced through its handle.
    let (_, condition) = flag();
    let wait = polls.wait_until(key(), Duration::from_secs(8), condition);
    assert!(polls.force_complete(&wait.handle().unwrap()));
    assert_eq!(wait.await, Ok(Completion::Forced));

    // Taken back by cancel_for_key: an error, not a completion.
    let (_, condition) = flag();
    let wait = polls.wait_until(key(), Duration::from_secs(8), condition);
    assert_eq!(polls.cancel_for_key("orders").len(), 1);
    assert_eq!(wait.await, Err(WaitError::TakenBack));

    // No keys: refused.
    let (_, condition) = flag();
    let wait = polls.wait_until(Vec::<String>::new(), Duration::from_secs(8), condition);
    assert_eq!(wait.await, Err(WaitError::Refused(WatchErrorKind::NoKeys)));

    // Shutdown answers a waiting poll, and a poll after it, with Shutdown.
    let (_, condition) = flag();
    let wait = polls.wait_until(key(), Duration::from_secs(8), condition);
    polls.shutdown_async().await;
    assert_eq!(wait.await, Ok(Completion::Shutdown));
    let (_, condition) = flag();
    let late = polls.wait_until(key(), Duration::from_secs(8), condition);
    assert!(late.handle().is_none());
    assert_eq!(late.await, Ok(Completion::Shutdown));

    let stats = polls.stats();
    assert_eq!(
        (
            stats.completed,
            stats.expired,
            stats.forced,
            stats.expired_at_shutdown
        ),
        (2, 1, 1, 1)
    );
    assert_eq!(stats.cancelled, 1);
}

/// A client that leaves: dropping the `Wait` cancels the poll at once, with no answer; a
/// condition that panics counts as "not ready" and the poll still ends by its timeout.
#[tokio::test(start_paused = true)]
async fn a_dropped_wait_cancels_and_a_panicking_condition_is_not_ready() {
    let polls: Purgatory<u32, LongPoll> = Purgatory::builder().follow_tokio_time().build().unwrap();
    let tries = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&tries);
    let wait = polls.wait_until([1], Duration::from_secs(5), move || {
        counted.fetch_add(1, SeqCst);
        false
    });
    let tried_on_watch = tries.load(SeqCst);
    drop(wait);
    assert_eq!(polls.stats().cancelled, 1);
    assert_eq!(polls.check_and_complete(&1), 0);
    assert_eq!(
        tries.load(SeqCst),
        tried_on_watch,
        "not tried after the drop: gone"
    );

    let wait = polls.wait_until([2], Duration::from_secs(5), || panic!("condition panics"));
    assert_eq!(wait.await, Ok(Completion::Expired));
    // Tried (and panicked) twice on watch, as every watch tries: before and after
    // listing the poll.
    assert_eq!(polls.stats().panicked, 2);
    polls.shutdown_async().await;
}
