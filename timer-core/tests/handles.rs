//! Handles are honoured only by the timer that issued them, and two threads may drive
//! one timer without losing a wake-up.

use std::sync::mpsc;
use std::time::Duration;

use timer_core::{ManualClock, TimerBuilder};

type Task = Box<dyn FnOnce() + Send>;

#[test]
fn a_handle_of_another_timer_cancels_nothing() {
    let build = || {
        TimerBuilder::new()
            .clock(ManualClock::new())
            .reaper(false)
            .shards(1)
            .build::<Task>()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let from_a = a.add(Duration::from_secs(1), Box::new(|| {})).unwrap();
    let _from_b = b.add(Duration::from_secs(1), Box::new(|| {})).unwrap();
    assert!(b.cancel(from_a).is_none(), "b must refuse a's handle");
    assert!(!b.is_pending(from_a));
    assert_eq!(b.len(), 1, "b's own task must stay");
    assert!(a.cancel(from_a).is_some());
}

#[test]
fn a_second_driver_does_not_blind_the_reaper() {
    let timer = TimerBuilder::new().build::<Task>().unwrap();
    // The reaper sleeps with nothing pending; this thread drives too, and leaves first.
    timer.advance_clock(Duration::from_millis(20));
    let (tx, rx) = mpsc::channel();
    timer
        .add(
            Duration::from_millis(50),
            Box::new(move || tx.send(()).unwrap()),
        )
        .unwrap();
    assert!(
        rx.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the reaper missed the add's wake-up"
    );
}

#[test]
fn a_handle_of_another_timer_resets_nothing() {
    let clock = ManualClock::new();
    let build = || {
        TimerBuilder::new()
            .clock(clock.clone())
            .reaper(false)
            .shards(1)
            .build::<Task>()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let from_a = a.add(Duration::from_secs(1), Box::new(|| {})).unwrap();
    let from_b = b.add(Duration::from_secs(1), Box::new(|| {})).unwrap();
    assert!(!b.reset(from_a, Duration::ZERO), "b must refuse a's handle");
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        b.advance_clock(Duration::ZERO),
        0,
        "b's own task keeps its deadline"
    );
    assert_eq!(
        a.advance_clock(Duration::ZERO),
        0,
        "a's task was not moved either"
    );
    assert!(b.is_pending(from_b) && a.is_pending(from_a));
}

#[test]
fn a_reset_to_an_earlier_deadline_wakes_the_reaper_sleeping_toward_the_old_one() {
    // The reaper of a plain timer sleeps until the earliest bucket, without any other
    // bound: an hour here, unless the reset wakes it.
    let timer = TimerBuilder::new().build::<Task>().unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = timer
        .add(
            Duration::from_secs(3_600),
            Box::new(move || tx.send(()).unwrap()),
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(timer.reset(handle, Duration::from_millis(20)));
    assert!(
        rx.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the reaper missed the reset's wake-up"
    );
    assert!(
        !timer.reset(handle, Duration::ZERO),
        "fired: the handle is stale"
    );
}

#[test]
fn buckets_emptied_by_a_batch_cancel_or_a_reset_are_not_the_next_expiration() {
    let clock = ManualClock::new();
    let timer = TimerBuilder::new()
        .clock(clock.clone())
        .reaper(false)
        .shards(1)
        .build::<Task>()
        .unwrap();
    let ms = Duration::from_millis;
    let early: Vec<_> = (0..3)
        .map(|_| timer.add(ms(5), Box::new(|| {})).unwrap())
        .collect();
    let moved = timer.add(ms(9), Box::new(|| {})).unwrap();
    let _last = timer.add(ms(15), Box::new(|| {})).unwrap();
    assert_eq!(timer.next_expiration(), Some(ms(5)));

    let mut handles = early.clone();
    let mut cancelled = Vec::new();
    assert_eq!(timer.cancel_batch(&mut handles, &mut cancelled), 3);
    assert_eq!(
        timer.next_expiration(),
        Some(ms(9)),
        "the driver would wake for the emptied 5 ms bucket"
    );
    assert!(timer.reset(moved, ms(18)));
    assert_eq!(
        timer.next_expiration(),
        Some(ms(15)),
        "the driver would wake for the bucket the reset left"
    );
    // Nothing is lost on the way: both remaining tasks fire at their own ticks.
    clock.advance(ms(14));
    assert_eq!(timer.advance_clock(Duration::ZERO), 0);
    clock.advance(ms(1));
    assert_eq!(timer.advance_clock(Duration::ZERO), 1);
    clock.advance(ms(3));
    assert_eq!(timer.advance_clock(Duration::ZERO), 1);
    assert!(timer.is_empty());
}
