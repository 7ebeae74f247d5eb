//! Time sources for the timer.
//!
//! # Invariants
//! - A [`Clock`] is monotonic: `now()` never goes backwards, whatever the wall clock does.
//!   `now_nanos()` is the same reading in nanoseconds (saturating); the timer reads its
//!   clock only through it, so a clock that overrides it must keep the two in step.
//!   [`SystemClock`] reads `std::time::Instant` (on Linux `CLOCK_MONOTONIC` directly,
//!   which is what `Instant` reads there), monotonic on every supported platform; a
//!   wall-clock jump neither fires nor stalls timers.
//! - A [`ManualClock`] moves only when its owner moves it, so tests are deterministic.
//!   Nothing wakes a sleeping driver when a manual clock moves: drive a timer on a manual
//!   clock with `advance_clock(Duration::ZERO)` after each move (and build it without a
//!   reaper thread).
//! - A timer reads its clock through a [`TimerClock`]: the two clocks of this crate
//!   directly (neither can panic), any other clock as user code (`user_code.rs`): a read
//!   that panics is caught and counted, and the last good reading stands in. Every
//!   reading of such a clock is at least the last good one, so the timer's time never
//!   goes back even if the clock does.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
#[cfg(any(test, not(all(target_os = "linux", not(loom)))))]
use std::time::Instant;

use crate::user_code::caught;

/// A monotonic time source: the time elapsed since the clock's own origin.
///
/// Readings are kept in nanoseconds and saturate at `u64::MAX` (about 584 years): a
/// clock that reads that far (a broken one, `Duration::MAX`) makes every deadline
/// saturate too, and a task added then fires only when the timer is shut down (it is
/// handed back, or a purgatory's operation expired, then), never lost.
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
///
/// Below 2^34 seconds (544 years) the exact sum fits in a `u64` (it is at most
/// `2^34 * 10^9 + 10^9 - 1`, about 1.72e19 of 1.84e19), computed with one shift, one
/// test and one 64-bit multiply; `as_nanos` multiplies into a `u128` and checks its
/// high half (an add converts its timeout so, about 3 instructions more). Longer
/// durations go the saturating way, out of line.
#[inline]
pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    let seconds = d.as_secs();
    if seconds >> 34 == 0 {
        seconds * 1_000_000_000 + u64::from(d.subsec_nanos())
    } else {
        saturating_long_nanos(d)
    }
}

/// [`saturating_nanos`] of a duration of 2^34 seconds or more.
#[cold]
#[inline(never)]
fn saturating_long_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The real monotonic clock (`Instant`), with its origin at construction.
///
/// On Linux it reads `CLOCK_MONOTONIC` directly, the clock `Instant` reads there, and
/// keeps whole nanoseconds: `Instant::elapsed` then a `Duration` in nanoseconds cost
/// about 90 instructions a reading against about 25 (callgrind,
/// `benches/examples/expiring_watches`: one reading per watch).
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    #[cfg(not(all(target_os = "linux", not(loom))))]
    origin: Instant,
    /// The origin, a [`monotonic_nanos`] reading.
    #[cfg(all(target_os = "linux", not(loom)))]
    origin_nanos: u64,
}

impl SystemClock {
    /// A system clock whose origin is now.
    pub fn new() -> Self {
        SystemClock {
            #[cfg(not(all(target_os = "linux", not(loom))))]
            origin: Instant::now(),
            #[cfg(all(target_os = "linux", not(loom)))]
            origin_nanos: monotonic_nanos(),
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
        #[cfg(all(target_os = "linux", not(loom)))]
        return Duration::from_nanos(self.now_nanos());
        #[cfg(not(all(target_os = "linux", not(loom))))]
        return self.origin.elapsed();
    }

    #[cfg(all(target_os = "linux", not(loom)))]
    #[inline]
    fn now_nanos(&self) -> u64 {
        // Monotonic, so never below the origin; saturating all the same.
        monotonic_nanos().saturating_sub(self.origin_nanos)
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds (since boot: far from overflowing a `u64`).
#[cfg(all(target_os = "linux", not(loom)))]
#[inline]
fn monotonic_nanos() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid `timespec` to write to, and `CLOCK_MONOTONIC` is a clock
    // every Linux has (std's `Instant` relies on it too); the call writes nothing else.
    let failed = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) } != 0;
    debug_assert!(!failed, "CLOCK_MONOTONIC cannot fail");
    timespec_nanos(&now)
}

/// A `timespec` in nanoseconds, saturating: a negative field counts as 0, a sum past
/// `u64::MAX` as `u64::MAX`.
#[cfg(all(target_os = "linux", not(loom)))]
#[inline]
fn timespec_nanos(now: &libc::timespec) -> u64 {
    // Every reading the kernel gives has both below 2^34 (seconds since boot: 544
    // years), and then neither the multiply nor the add can overflow (the sum is below
    // 2^34 * (10^9 + 1), about 1.72e19 of 1.84e19); one test of both (an or and a shift)
    // costs fewer instructions than saturating each step (about 10 a reading, one per
    // add), or than a comparison each. Anything else (a negative field reads as a huge
    // one) goes the saturating way, out of line.
    let (seconds, nanos) = (now.tv_sec as u64, now.tv_nsec as u64);
    if (seconds | nanos) >> 34 == 0 {
        seconds * 1_000_000_000 + nanos
    } else {
        saturating_timespec_nanos(now)
    }
}

/// [`timespec_nanos`] of a `timespec` out of its fast path's bounds.
#[cfg(all(target_os = "linux", not(loom)))]
#[cold]
#[inline(never)]
fn saturating_timespec_nanos(now: &libc::timespec) -> u64 {
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
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

/// The clock a timer builder was given, before a timer reads it.
#[derive(Clone)]
pub(crate) enum ClockChoice {
    System(SystemClock),
    Manual(ManualClock),
    /// Any other clock: user code.
    User(Arc<dyn Clock>),
}

impl ClockChoice {
    /// `clock`, told apart from this crate's own clocks.
    pub(crate) fn of<C: Clock>(clock: C) -> Self {
        let any: &dyn Any = &clock;
        if let Some(system) = any.downcast_ref::<SystemClock>() {
            ClockChoice::System(*system)
        } else if let Some(manual) = any.downcast_ref::<ManualClock>() {
            ClockChoice::Manual(manual.clone())
        } else {
            ClockChoice::User(Arc::new(clock))
        }
    }
}

impl std::fmt::Debug for ClockChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClockChoice::System(clock) => clock.fmt(f),
            ClockChoice::Manual(clock) => clock.fmt(f),
            ClockChoice::User(_) => f.write_str("a user clock"),
        }
    }
}

/// How a timer reads its clock (see the module doc): this crate's clocks directly, a user
/// clock through the door, with its last good reading and its panics.
pub(crate) struct TimerClock {
    choice: ClockChoice,
    /// A user clock's latest good reading (ns), which stands in when a read panics.
    last: AtomicU64,
    /// A user clock's reads that panicked.
    panics: AtomicU64,
    /// When a user clock was last read well, on the real monotonic clock
    /// ([`real_nanos`]): the watchdog's estimate of the clock between reads.
    last_at: AtomicU64,
}

/// The real monotonic clock in nanoseconds from a process-wide origin, for estimates
/// that run no user code.
pub(crate) fn real_nanos() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    saturating_nanos(origin.elapsed())
}

impl TimerClock {
    pub(crate) fn new(choice: ClockChoice) -> Self {
        TimerClock {
            choice,
            last: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            last_at: AtomicU64::new(real_nanos()),
        }
    }

    /// Now, in nanoseconds since the clock's origin.
    #[inline]
    pub(crate) fn now_nanos(&self) -> u64 {
        match &self.choice {
            ClockChoice::System(clock) => clock.now_nanos(),
            ClockChoice::Manual(clock) => clock.now_nanos(),
            ClockChoice::User(clock) => self.read_user_clock(&**clock),
        }
    }

    /// A reading that runs no user code: this crate's clocks are read; for a user clock,
    /// its last good reading plus the real time since (an estimate, for the watchdog,
    /// which never runs user code: adds and rounds read the clock, but while the reaper
    /// is held and nothing is added, nothing else would move it).
    pub(crate) fn peek_nanos(&self) -> u64 {
        match &self.choice {
            ClockChoice::System(clock) => clock.now_nanos(),
            ClockChoice::Manual(clock) => clock.now_nanos(),
            ClockChoice::User(_) => {
                let since = real_nanos().saturating_sub(self.last_at.load(Ordering::Relaxed));
                self.last.load(Ordering::Relaxed).saturating_add(since)
            }
        }
    }

    /// Whether this clock is the real one, so that how late a bucket is on it is how
    /// late it is in real time ([`SystemClock`]; a manual or user clock need not move
    /// with real time).
    pub(crate) fn is_real_time(&self) -> bool {
        matches!(self.choice, ClockChoice::System(_))
    }

    /// Reads of a user clock that panicked (0 for this crate's clocks).
    pub(crate) fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }

    /// Reads a user clock through the door: a panic is caught and counted, and the last
    /// good reading stands in; a reading earlier than the last good one is raised to it.
    /// (The shared `last` is written only by a reading that moves it forward.)
    #[inline(never)]
    fn read_user_clock(&self, clock: &dyn Clock) -> u64 {
        match caught(
            "the clock panicked; the last good reading stands in",
            || clock.now_nanos(),
        ) {
            Some(now) => {
                self.last_at.store(real_nanos(), Ordering::Relaxed);
                let seen = self.last.load(Ordering::Relaxed);
                if now <= seen {
                    seen
                } else {
                    self.last.fetch_max(now, Ordering::Relaxed).max(now)
                }
            }
            None => {
                self.panics.fetch_add(1, Ordering::Relaxed);
                self.last.load(Ordering::Relaxed)
            }
        }
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

    /// The fast path agrees with saturating each step, at its bounds and past them.
    #[cfg(all(target_os = "linux", not(loom)))]
    #[test]
    fn timespec_nanos_saturates_as_each_step_would() {
        let max_seconds = (u64::MAX / 1_000_000_000) as libc::time_t;
        for (tv_sec, tv_nsec) in [
            (0, 0),
            (1, 999_999_999),
            (12_345, 678),
            (max_seconds - 1, 999_999_999),
            (max_seconds, 0),
            (max_seconds, 709_551_615),
            (max_seconds, 709_551_616),
            (max_seconds, 999_999_999),
            (max_seconds + 1, 0),
            (libc::time_t::MAX, 0),
            (-1, 5),
            (5, -1),
            (3, 1_000_000_000),
            (3, libc::c_long::MAX),
            // The fast path's bounds: both below 2^34.
            ((1 << 34) - 1, 999_999_999),
            ((1 << 34) - 1, (1 << 34) - 1),
            (1 << 34, 0),
            (0, 1 << 34),
        ] {
            let now = libc::timespec { tv_sec, tv_nsec };
            assert_eq!(
                timespec_nanos(&now),
                saturating_timespec_nanos(&now),
                "{tv_sec} s {tv_nsec} ns"
            );
        }
        let last = libc::timespec {
            tv_sec: max_seconds - 1,
            tv_nsec: 999_999_999,
        };
        assert_eq!(timespec_nanos(&last), 18_446_744_072_999_999_999);
    }

    /// The fast path agrees with `as_nanos`, saturated, at its bound and past it.
    #[test]
    fn saturating_nanos_agrees_with_as_nanos() {
        for (seconds, nanos) in [
            (0, 0),
            (1, 999_999_999),
            ((1 << 34) - 1, 999_999_999),
            (1 << 34, 0),
            (u64::MAX / 1_000_000_000, 709_551_615),
            (u64::MAX / 1_000_000_000, 709_551_616),
            (u64::MAX, 999_999_999),
        ] {
            let d = Duration::new(seconds, nanos);
            let expected = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            assert_eq!(saturating_nanos(d), expected, "{d:?}");
        }
        assert_eq!(saturating_nanos(Duration::MAX), u64::MAX);
    }

    #[test]
    fn system_clock_is_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
    }

    /// The readings keep pace with `Instant` (on Linux they come from `CLOCK_MONOTONIC`
    /// directly, the clock `Instant` reads there): each reading falls between two
    /// `Instant` readings taken around it, so what the clock moved across a sleep lies
    /// between what `Instant` moved from the inner pair to the outer pair. No tolerance:
    /// a thread preempted between two readings (a loaded machine) only widens the bracket.
    #[test]
    fn system_clock_keeps_pace_with_instant() {
        let clock = SystemClock::new();
        let (a0, before, a1) = (Instant::now(), clock.now_nanos(), Instant::now());
        std::thread::sleep(Duration::from_millis(30));
        let (b0, after, b1) = (Instant::now(), clock.now_nanos(), Instant::now());
        let moved = Duration::from_nanos(after - before);
        assert!(
            b0 - a1 <= moved && moved <= b1 - a0,
            "the clock moved {moved:?}, Instant between {:?} and {:?}",
            b0 - a1,
            b1 - a0
        );
        assert!(moved >= Duration::from_millis(30));
        // `now` and `now_nanos` are one reading: `now` read between two `now_nanos`.
        let (first, now, last) = (clock.now_nanos(), clock.now(), clock.now_nanos());
        let now = saturating_nanos(now);
        assert!(first <= now && now <= last, "{first} <= {now} <= {last}");
    }
}
