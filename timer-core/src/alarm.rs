//! The watchdog's alarm: one deadline that any thread may move, and one thread sleeps
//! until. On Linux it is a `timerfd`, so moving the deadline, earlier or later, is one
//! system call (0.4 us in a tight loop on the project's VM) and never wakes the sleeper;
//! a timed sleep that wakes costs a hundred times that there
//! (`benches/examples/timed_wake.rs`). That is what lets the driving threads keep the
//! watchdog asleep while they keep up: work that begins arms the alarm for when it would
//! become late, and a driving thread going to sleep in the core puts it off
//! (`stand_in.rs`).
//!
//! Elsewhere, under loom, or when a `timerfd` cannot be made, a deadline behind a mutex
//! and a condition variable stands in: it must wake the sleeper to move its deadline
//! earlier, so [`Alarm::moves_quietly`] says false and the watchdog keeps its periodic
//! looks there.
//!
//! | call | deadline after | the sleeper |
//! |---|---|---|
//! | [`set`](Alarm::set)`(Some(at))` | `at` (replacing any other) | returns from [`wait`](Alarm::wait) once `at` passes |
//! | `set(None)` | none | keeps sleeping |
//! | `set(Some(at))`, `at` passed | `at` | returns at once, or does not sleep |
//!
//! # Invariants
//! - [`wait`](Alarm::wait) returns no later than the last deadline set passes (a
//!   deadline set before the wait began counts), and may return early: its caller reads
//!   its own state again after every return.
//! - The deadline set last wins: a `timerfd`'s setting replaces the one before and
//!   clears an expiry nobody read; callers order their sets with a lock of their own
//!   (the stand-in's control lock).

use std::time::Instant;

/// A movable deadline one thread sleeps until (see the module doc).
pub(crate) struct Alarm {
    #[cfg(all(target_os = "linux", not(loom)))]
    kernel: Option<kernel::TimerFd>,
    fallback: Fallback,
}

impl Alarm {
    /// A new alarm with no deadline.
    pub(crate) fn new() -> Self {
        Alarm {
            #[cfg(all(target_os = "linux", not(loom)))]
            kernel: kernel::TimerFd::new(),
            fallback: Fallback::default(),
        }
    }

    /// Whether moving the deadline leaves the sleeper asleep (a `timerfd`).
    pub(crate) fn moves_quietly(&self) -> bool {
        #[cfg(all(target_os = "linux", not(loom)))]
        if self.kernel.is_some() {
            return true;
        }
        cfg!(loom)
    }

    /// Sets the deadline to `at`, or to none.
    pub(crate) fn set(&self, at: Option<Instant>) {
        #[cfg(all(target_os = "linux", not(loom)))]
        if let Some(kernel) = &self.kernel {
            kernel.set(at);
            return;
        }
        self.fallback.set(at);
    }

    /// The deadline set last (the loom models' view of it).
    #[cfg(loom)]
    pub(crate) fn deadline(&self) -> Option<Instant> {
        *self.fallback.deadline.lock()
    }

    /// Sleeps until the deadline passes (forever while there is none), or returns early.
    pub(crate) fn wait(&self) {
        #[cfg(all(target_os = "linux", not(loom)))]
        if let Some(kernel) = &self.kernel {
            kernel.wait();
            return;
        }
        self.fallback.wait();
    }
}

/// The deadline behind a lock, for where there is no `timerfd`.
#[derive(Default)]
struct Fallback {
    deadline: crate::sync::Mutex<Option<Instant>>,
    moved: crate::sync::Condvar,
}

impl Fallback {
    fn set(&self, at: Option<Instant>) {
        let mut deadline = self.deadline.lock();
        let earlier = match (at, *deadline) {
            (Some(at), Some(old)) => at < old,
            (Some(_), None) => true,
            (None, _) => false,
        };
        *deadline = at;
        // Under loom every move wakes the sleeper, which reads its state again: the
        // models then reach the states a quiet move leaves, without time.
        if earlier || cfg!(loom) {
            self.moved.notify_all();
        }
    }

    fn wait(&self) {
        let mut deadline = self.deadline.lock();
        #[cfg(loom)]
        {
            // Loom has no time: a near deadline passes at once, a far one or none only
            // by a move. As a `timerfd`'s read, the wait goes on while the deadline set
            // last has not passed: a move that comes and is moved again before the
            // sleeper runs does not end it.
            let near = |at: Option<Instant>| {
                at.is_some_and(|at| at < Instant::now() + std::time::Duration::from_secs(60))
            };
            while !near(*deadline) {
                deadline = self.moved.wait_until(deadline, None);
            }
        }
        #[cfg(not(loom))]
        {
            let at = *deadline;
            if at.is_some_and(|at| Instant::now() >= at) {
                return;
            }
            // Returns at the deadline, or when a move wakes it; the caller looks again.
            deadline = self.moved.wait_until(deadline, at);
        }
        drop(deadline);
    }
}

#[cfg(all(target_os = "linux", not(loom)))]
mod kernel {
    use std::time::Instant;

    /// A `timerfd` on `CLOCK_MONOTONIC` (the clock of `Instant` on Linux), set relative
    /// to now.
    pub(super) struct TimerFd {
        fd: libc::c_int,
    }

    impl TimerFd {
        /// `None` if the kernel refuses one (too many descriptors, a seccomp filter):
        /// the alarm then falls back to a condition variable.
        pub(super) fn new() -> Option<Self> {
            // SAFETY: a plain system call with constant flags; it returns a descriptor
            // this value owns from here on, or -1.
            let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
            (fd >= 0).then_some(TimerFd { fd })
        }

        pub(super) fn set(&self, at: Option<Instant>) {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            let value = match at {
                // A zero value disarms.
                None => zero,
                Some(at) => {
                    let after = at.saturating_duration_since(Instant::now());
                    libc::timespec {
                        tv_sec: after.as_secs().min(i32::MAX as u64) as libc::time_t,
                        // A deadline passed or now: one nanosecond, since zero disarms.
                        tv_nsec: if after.is_zero() {
                            1
                        } else {
                            libc::c_long::from(after.subsec_nanos() as i32)
                        },
                    }
                }
            };
            let setting = libc::itimerspec {
                it_interval: zero,
                it_value: value,
            };
            // SAFETY: `fd` is this value's open timerfd; `setting` lives for the call and
            // the old setting is not asked for (null).
            let rc = unsafe { libc::timerfd_settime(self.fd, 0, &setting, std::ptr::null_mut()) };
            debug_assert_eq!(rc, 0, "timerfd_settime on our own descriptor");
        }

        pub(super) fn wait(&self) {
            let mut expirations = 0u64;
            // SAFETY: `fd` is this value's open timerfd, and the buffer is the 8 bytes a
            // timerfd read fills. An interrupted read returns early, which `wait` allows.
            unsafe {
                libc::read(
                    self.fd,
                    std::ptr::addr_of_mut!(expirations).cast::<libc::c_void>(),
                    std::mem::size_of::<u64>(),
                );
            }
        }
    }

    impl Drop for TimerFd {
        fn drop(&mut self) {
            // SAFETY: `fd` is open and owned by this value alone; nothing uses it after.
            unsafe {
                libc::close(self.fd);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::Alarm;

    #[test]
    fn a_deadline_set_before_the_wait_ends_it_then() {
        let alarm = Alarm::new();
        let start = Instant::now();
        alarm.set(Some(start + Duration::from_millis(20)));
        while Instant::now() < start + Duration::from_millis(20) {
            alarm.wait();
        }
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn a_deadline_moved_later_keeps_the_sleeper_asleep_until_then() {
        let alarm = Arc::new(Alarm::new());
        let start = Instant::now();
        alarm.set(Some(start + Duration::from_millis(30)));
        let sleeper = {
            let alarm = Arc::clone(&alarm);
            std::thread::spawn(move || {
                let mut wakes = 0;
                while Instant::now() < start + Duration::from_millis(150) {
                    alarm.wait();
                    wakes += 1;
                }
                wakes
            })
        };
        // Moved later before the first deadline: the sleeper sleeps on.
        alarm.set(Some(start + Duration::from_millis(150)));
        let wakes = sleeper.join().unwrap();
        assert!(start.elapsed() >= Duration::from_millis(150));
        if alarm.moves_quietly() {
            // Not woken at 30 ms: once, at 150 ms (a move raced by the sleeper's first
            // wait is at most one more).
            assert!(wakes <= 2, "woken {wakes} times");
        }
    }

    #[test]
    fn a_deadline_moved_earlier_wakes_the_sleeper_then() {
        let alarm = Arc::new(Alarm::new());
        let start = Instant::now();
        let sleeper = {
            let alarm = Arc::clone(&alarm);
            std::thread::spawn(move || {
                alarm.wait();
                start.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        alarm.set(Some(Instant::now() + Duration::from_millis(10)));
        let slept = sleeper.join().unwrap();
        if alarm.moves_quietly() {
            // (The stand-in wakes the sleeper to move its deadline, which the contract
            // allows: a sleeper looks again after every return.)
            assert!(slept >= Duration::from_millis(25), "woke at {slept:?}");
        }
        assert!(slept < Duration::from_secs(2), "woke at {slept:?}");
    }

    #[test]
    fn a_passed_deadline_ends_the_wait_at_once_and_none_disarms() {
        let alarm = Alarm::new();
        alarm.set(Some(Instant::now()));
        let start = Instant::now();
        alarm.wait();
        assert!(start.elapsed() < Duration::from_secs(1));
        // Disarmed, then armed in the past: at once again.
        alarm.set(None);
        let before = Instant::now().checked_sub(Duration::from_millis(1));
        alarm.set(Some(before.unwrap_or_else(Instant::now)));
        alarm.wait();
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
