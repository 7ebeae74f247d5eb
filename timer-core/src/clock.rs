//! Time sources for the timer.
//!
//! # Invariants
//! - A [`Clock`] is monotonic: `now()` never goes backwards, whatever the wall clock does.
//!   `now_nanos()` is the same reading in nanoseconds (saturating); the timer reads its
//!   clock only through it, so a clock that overrides it must keep the two in step.
//!   [`SystemClock`] reads `std::time::Instant`, which is monotonic on every supported
//!   platform; a wall-clock jump neither fires nor stalls timers.
//! - A [`ManualClock`] moves only when its owner moves it, so tests are deterministic.
//!   Nothing wakes a sleeping driver when a manual clock moves: drive a timer on a manual
//!   clock with `advance_clock(Duration::ZERO)` after each move (and build it without a
//!   reaper thread).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A monotonic time source: the time elapsed since the clock's own origin.
pub trait Clock: Send + Sync + 'static {
    /// Time since this clock's origin. Never decreases.
    fn now(&self) -> Duration;

    /// [`now`](Self::now) in whole nanoseconds, saturating at `u64::MAX` (585 years).
    /// The timer reads its clock this way, once per add; a clock that keeps nanoseconds
    /// can return them without building a `Duration`.
    fn now_nanos(&self) -> u64 {
        saturating_nanos(self.now())
    }
}

/// `d` in whole nanoseconds, saturating at `u64::MAX` (585 years).
pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The real monotonic clock (`Instant`), with its origin at construction.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A system clock whose origin is now.
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A manual clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by` (saturating at about 584 years).
    pub fn advance(&self, by: Duration) {
        let by = saturating_nanos(by);
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Sets the clock to `to` if that is later than now; a clock never goes backwards.
    pub fn set(&self, to: Duration) {
        let to = saturating_nanos(to);
        self.nanos.fetch_max(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_nanos())
    }

    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward_and_is_shared() {
        let clock = ManualClock::new();
        let other = clock.clone();
        clock.advance(Duration::from_millis(5));
        assert_eq!(other.now(), Duration::from_millis(5));
        other.set(Duration::from_millis(3));
        assert_eq!(clock.now(), Duration::from_millis(5));
        other.set(Duration::from_millis(9));
        assert_eq!(clock.now(), Duration::from_millis(9));
        assert_eq!(clock.now_nanos(), 9_000_000);
    }

    #[test]
    fn default_now_nanos_agrees_with_now_and_saturates() {
        struct Fixed(Duration);
        impl Clock for Fixed {
            fn now(&self) -> Duration {
                self.0
            }
        }
        assert_eq!(Fixed(Duration::new(3, 7)).now_nanos(), 3_000_000_007);
        assert_eq!(Fixed(Duration::MAX).now_nanos(), u64::MAX);
    }

    #[test]
    fn system_clock_is_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
    }
}
