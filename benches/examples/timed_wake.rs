//! What a thread's timed sleep costs in CPU on this machine, against re-arming a kernel
//! timer that does not fire: the two prices a watchdog that looks on a period, and one
//! that sleeps until the driving threads' alarm goes off, would pay.
//!
//! ```text
//! cargo run --release -p purgatory-benches --example timed_wake [N]
//! ```
//!
//! 1. `N` (default 3,000) sleeps of 2 ms on a `parking_lot` condition variable nobody
//!    notifies, as the reaper and the watchdog sleep: the thread's CPU time per sleep
//!    (the wake-up, the switch in and out, and on a virtual machine the timer's exits).
//! 2. On Linux, 100 x `N` re-arms of a `timerfd` to 10 ms ahead, which never fires: the
//!    CPU time per re-arm (one system call, no switch), in a tight loop.
//! 3. On Linux, the sleeps of 1 again, each followed by an arm and a disarm of that
//!    `timerfd`: the CPU per sleep, and its difference from 1's, what two moves cost
//!    right after a wake-up (on the project's VM within the wake-ups' own spread).
//!
//! # Invariants
//! - Each figure is the calling thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`) over
//!   its loop, divided by the loop's count; nothing else runs on the thread meanwhile.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` only writes the `timespec` we pass, which lives for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// CPU per timed sleep of `period`, over `n` sleeps, each followed by `after`, and the
/// mean lateness of the wake.
fn timed_sleeps(n: u32, period: Duration, mut after: impl FnMut()) -> (Duration, Duration) {
    let lock = Mutex::new(());
    let never = Condvar::new();
    let mut guard = lock.lock();
    let mut late = Duration::ZERO;
    let start = thread_cpu();
    for _ in 0..n {
        let until = Instant::now() + period;
        let _ = never.wait_until(&mut guard, until);
        late += Instant::now().saturating_duration_since(until);
        after();
    }
    ((thread_cpu() - start) / n, late / n)
}

/// A `timerfd` this example arms and disarms.
#[cfg(target_os = "linux")]
struct TimerFd(libc::c_int);

#[cfg(target_os = "linux")]
impl TimerFd {
    fn new() -> Self {
        // SAFETY: a plain system call with constant flags; the descriptor is this
        // value's, closed on drop.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
        assert!(fd >= 0, "timerfd_create");
        TimerFd(fd)
    }

    /// Arms it `nanos` ahead (0: disarms).
    fn set(&self, nanos: libc::c_long) {
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let setting = libc::itimerspec {
            it_interval: zero,
            it_value: libc::timespec {
                tv_sec: 0,
                tv_nsec: nanos,
            },
        };
        // SAFETY: `self.0` is an open timerfd; `setting` lives for the call.
        let rc = unsafe { libc::timerfd_settime(self.0, 0, &setting, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "timerfd_settime");
    }
}

#[cfg(target_os = "linux")]
impl Drop for TimerFd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this value's alone, and nothing uses it after.
        unsafe { libc::close(self.0) };
    }
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .map_or(3_000, |a| a.parse().expect("a count"));
    let period = Duration::from_millis(2);
    let (per_sleep, late) = timed_sleeps(n, period, || {});
    println!(
        "timed sleep of {period:?} (parking_lot Condvar::wait_until), {n} of them: \
         {:.1} us CPU each, woken {:.0} us late on average",
        per_sleep.as_secs_f64() * 1e6,
        late.as_secs_f64() * 1e6
    );
    #[cfg(target_os = "linux")]
    {
        let alarm = TimerFd::new();
        let m = n.saturating_mul(100);
        let start = thread_cpu();
        for _ in 0..m {
            alarm.set(10_000_000);
        }
        let per = (thread_cpu() - start) / m;
        println!(
            "timerfd re-armed 10 ms ahead, never firing, {m} times in a loop: {:.2} us CPU each",
            per.as_secs_f64() * 1e6
        );
        let (with_moves, _) = timed_sleeps(n, period, || {
            alarm.set(10_000_000);
            alarm.set(0);
        });
        println!(
            "the same sleeps, each followed by an arm and a disarm: {:.1} us CPU each, \
             {:+.1} us for the two moves",
            with_moves.as_secs_f64() * 1e6,
            (with_moves.as_secs_f64() - per_sleep.as_secs_f64()) * 1e6
        );
    }
}
