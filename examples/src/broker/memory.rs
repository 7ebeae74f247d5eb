//! Hands memory freed by closed connections back to the operating system.
//!
//! The C allocator keeps what a program frees for later reuse: after thousands of
//! connections closed at once (clients that left while their requests waited), the
//! broker's resident memory would stay at its peak although nothing uses it. When
//! [`TRIM_AFTER_CLOSED`] connections have closed since the last trim, the task below is
//! woken, lets the burst finish for [`SETTLE`], then `malloc_trim(0)` returns the free
//! pages (glibc only; elsewhere this does nothing).
//!
//! Invariants: nothing ticks (an idle broker never wakes this task), a trim never runs on
//! an async worker (it walks the heap), and a broker whose connections come and go slowly
//! trims at most once per [`TRIM_AFTER_CLOSED`] closed connections.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::BrokerState;

/// Closed connections that make a trim worth it.
pub const TRIM_AFTER_CLOSED: usize = 256;

/// How long a burst of closes is given to finish before the trim.
pub const SETTLE: Duration = Duration::from_millis(250);

/// Counts a closed connection; the one that completes a burst wakes the trimming task.
pub fn connection_closed(state: &BrokerState) {
    if state.closed_since_trim.fetch_add(1, Ordering::AcqRel) + 1 == TRIM_AFTER_CLOSED {
        state.trim_wanted.notify_one();
    }
}

/// Trims after bursts of closed connections until the broker stops.
pub async fn release_after_bursts(state: Arc<BrokerState>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = state.trim_wanted.notified() => {}
            _ = stop.changed() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(SETTLE) => {}
            _ = stop.changed() => return,
        }
        state.closed_since_trim.store(0, Ordering::Release);
        let _ = tokio::task::spawn_blocking(trim).await;
    }
}

/// Returns the allocator's free pages to the operating system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only inspects and releases the allocator's own free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
