//! The watchdog's alarm (`src/alarm.rs`) both ways: a timer built with descriptors to
//! spare sleeps on a `timerfd`, one built while the process has none left falls back to
//! a watchdog that looks every half bound, as on systems without one. Either way every
//! other task starts within the bound behind a blocked one, and the watchdog costs
//! little CPU while idle and while it relieves (a watchdog that looked again at once
//! after each look, as a review found one version do, spent all of a core). Linux only
//! (elsewhere every timer falls back); a binary of its own, since it lowers the
//! process's descriptor limit for a moment.
//!
//! Asserted at the bound in a release build (`cargo test --release -p purgatory-timer
//! --test relief_without_descriptor`), twice the bound in a debug one, as the other
//! on-time suites (`support/on_time.rs`).
#![cfg(target_os = "linux")]

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use timer_core::{Timer, TimerBuilder};

#[path = "support/on_time.rs"]
mod support;
use support::{in_one_of_three, on_time, one_at_a_time, Ran, Recorded, BOUND};

/// The CPU time of the threads whose name starts with `name` (`/proc`, Linux), from
/// `schedstat` (nanoseconds).
fn cpu_of_threads(name: &str) -> Duration {
    let mut total = Duration::ZERO;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(name) {
            continue;
        }
        let ran = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        let nanos = ran.split_whitespace().next().and_then(|n| n.parse().ok());
        total += Duration::from_nanos(nanos.unwrap_or(0));
    }
    total
}

/// The most CPU the watchdog may spend over one scenario and a quiet second after it:
/// its looks while it relieves (every ramp, a millisecond, for the 400 ms a task
/// blocks), and none or a few a second while idle; a watchdog that never slept would
/// spend the whole 1.5 s.
const WATCHDOG_CPU: Duration = Duration::from_millis(150);

/// Asserts that the threads named `name` spent less than [`WATCHDOG_CPU`] since `from`.
fn assert_watchdog_cheap(name: &str, from: Duration) {
    let spent = cpu_of_threads(name).saturating_sub(from);
    eprintln!("the watchdog's CPU over the scenario and a quiet second: {spent:?}");
    assert!(spent < WATCHDOG_CPU, "the watchdog spent {spent:?}");
}

/// How many of the process's descriptors are timerfds.
fn timerfds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains("timerfd"))
        .count()
}

/// Builds a timer with a stand-in while every descriptor the process may open is taken.
fn built_without_descriptors() -> Timer<Recorded> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` and `setrlimit` only read and write the struct we pass.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        let low = libc::rlimit {
            rlim_cur: 256.min(limit.rlim_cur),
            rlim_max: limit.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &low), 0);
    }
    // Take every descriptor left under the low limit.
    let mut held = Vec::new();
    while let Ok(file) = File::open("/dev/null") {
        held.push(file);
    }
    let timer = TimerBuilder::new()
        .thread_name("fallback")
        .stand_in(Some(BOUND))
        .build();
    drop(held);
    // SAFETY: as above; the limit goes back to what it was.
    unsafe {
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    timer.expect("a timer builds without a descriptor to spare")
}

/// The latest start, after its deadline, of 30 quick tasks due in the tick of one that
/// blocks 400 ms and of 30 due 30 ms after it.
fn latest_beside_a_blocked_task(timer: &Timer<Recorded>) -> Duration {
    let ran: Ran = Arc::default();
    let start = Instant::now();
    let add = |deadline: Duration, blocks: Duration| {
        let task = Recorded {
            deadline,
            blocks,
            ran: Arc::clone(&ran),
        };
        timer.add(deadline, task).unwrap();
    };
    let slow_at = Duration::from_millis(10);
    // The quick ones of its tick first: a bucket hands out its newest task first.
    for _ in 0..30 {
        add(slow_at + Duration::from_micros(1), Duration::ZERO);
    }
    add(slow_at, Duration::from_millis(400));
    for _ in 0..30 {
        add(Duration::from_millis(40), Duration::ZERO);
    }
    let until = Instant::now() + Duration::from_secs(10);
    while ran.lock().unwrap().len() < 61 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let ran = ran.lock().unwrap();
    assert_eq!(ran.len(), 61, "every task ran");
    ran.iter()
        .filter(|(deadline, _)| *deadline != slow_at)
        .map(|(deadline, at)| at.duration_since(start).saturating_sub(*deadline))
        .max()
        .unwrap()
}

#[test]
fn without_a_descriptor_the_watchdog_looks_on_a_period_and_relieves_in_time() {
    let _turn = one_at_a_time();
    let before = timerfds();
    let timer = built_without_descriptors();
    assert_eq!(timerfds(), before, "no timerfd could be made");
    let cpu = cpu_of_threads("fallback-watch");
    in_one_of_three(|| {
        let late = latest_beside_a_blocked_task(&timer);
        on_time(
            "behind a blocked task, the watchdog looking on a period",
            late,
        )
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_watchdog_cheap("fallback-watch", cpu);
    timer.shutdown();
}

#[test]
fn with_descriptors_to_spare_the_watchdog_sleeps_on_a_timerfd_and_relieves_in_time() {
    let _turn = one_at_a_time();
    let before = timerfds();
    let timer: Timer<Recorded> = TimerBuilder::new()
        .thread_name("alarm")
        .stand_in(Some(BOUND))
        .build()
        .unwrap();
    assert_eq!(timerfds(), before + 1, "the watchdog's alarm");
    let cpu = cpu_of_threads("alarm-watchdog");
    in_one_of_three(|| {
        let late = latest_beside_a_blocked_task(&timer);
        on_time("behind a blocked task, the watchdog on its alarm", late)
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_watchdog_cheap("alarm-watchdog", cpu);
    timer.shutdown();
    drop(timer);
    // (The driver's state may be dropped on a thread of its own, a moment later.)
    let until = Instant::now() + Duration::from_secs(5);
    while timerfds() != before && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        timerfds(),
        before,
        "the alarm's descriptor closed with its timer"
    );
}
