//! Hands memory freed by closed connections back to the operating system.
//!
//! The C allocator keeps what a program frees for later reuse: after thousands of
//! connections closed at once (clients that left while their requests waited), the
//! broker's resident memory would stay at its peak although nothing uses it. Every
//! [`CHECK_EVERY`], if at least [`TRIM_AFTER_CLOSED`] connections closed since the last
//! trim, `malloc_trim(0)` returns the free pages (glibc only; elsewhere this does nothing).
//!
//! Invariants: a trim never runs on an async worker (it walks the heap), at most one runs
//! per check, and a broker whose connections come and go slowly never trims.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::BrokerState;

/// Closed connections that make a trim worth it.
pub const TRIM_AFTER_CLOSED: usize = 256;

/// How often the count is looked at.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// Trims after bursts of closed connections until the broker stops.
pub async fn release_after_bursts(state: Arc<BrokerState>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            _ = stop.changed() => return,
        }
        if state.closed_since_trim.load(Ordering::Relaxed) < TRIM_AFTER_CLOSED {
            continue;
        }
        state.closed_since_trim.store(0, Ordering::Relaxed);
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
