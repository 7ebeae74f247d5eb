//! The worked example of the spec (semantics.md, "Wheel geometry"), step by step.
//!
//! Tick 1 ms, 20 buckets per level, so the levels' intervals are 20 ms, 400 ms, 8 s, ...
//! Our level 0 is the spec's "level-1". From t = 0:
//! - a 2 ms task goes to level 0, bucket 2;
//! - a 350 ms task goes to level 1, bucket 17, the range [340, 360);
//! - a 450 ms task goes to level 2, bucket 1, the range [400, 800);
//! - at t = 2 an 8 ms task (expiring at 10) goes to bucket 10, and a 19 ms task (expiring
//!   at 21) goes to bucket 1, a bucket the clock has already passed. (The spec lists the
//!   8 ms task before "at t = 2" but puts it in bucket 10, i.e. expiring at 10; we add it at
//!   t = 2 to match the bucket, and also check that an 8 ms task added at t = 0 lands in
//!   bucket 8.)
//! - when the level-2 bucket expires at 400, the 450 ms task lands in level 1, [440, 460);
//!   at 440 it lands in level 0 and fires at 450, not before.
//!
//! The schedule is checked twice: on the bare [`Wheel`] with [`Wheel::location`] after each
//! step, and through a [`Timer`] on a [`ManualClock`] (no reaper) that must fire every task
//! at exactly its deadline and never before, whatever the size of the clock's steps.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use timer_core::{Clock, ManualClock, Timer, TimerBuilder, TimerTask, Wheel};

/// `(level, bucket, bucket expiration)` as [`Wheel::location`] reports it.
type Location = Option<(usize, u32, u64)>;

#[test]
fn wheel_places_and_cascades_the_spec_example() {
    let mut wheel: Wheel<&'static str> = Wheel::new(20, 0);
    let mut out = Vec::new();

    let k2 = wheel.insert(2, "2ms");
    let k8_at_0 = wheel.insert(8, "8ms@0");
    let k350 = wheel.insert(350, "350ms");
    let k450 = wheel.insert(450, "450ms");
    assert_eq!(wheel.location(k2), Some((0, 2, 2)));
    assert_eq!(wheel.location(k8_at_0), Some((0, 8, 8)));
    assert_eq!(
        wheel.location(k350),
        Some((1, 17, 340)),
        "[340, 360) on level 1"
    );
    assert_eq!(
        wheel.location(k450),
        Some((2, 1, 400)),
        "[400, 800) on level 2"
    );
    assert_eq!(wheel.levels(), 3, "levels are created on first need");
    assert_eq!(wheel.len(), 4);
    assert_eq!(wheel.next_expiration(), Some(2));

    assert_eq!(wheel.advance(1, &mut out), 0);
    assert_eq!(wheel.advance(2, &mut out), 1);
    assert_eq!(std::mem::take(&mut out), ["2ms"]);
    assert_eq!(wheel.current_tick(), 2);
    assert_eq!(wheel.location(k2), None, "a fired task has no location");

    // At t = 2: 8 ms (e = 10) and 19 ms (e = 21, bucket 1 reused after the clock passed it).
    let k8 = wheel.insert(10, "8ms@2");
    let k19 = wheel.insert(21, "19ms@2");
    assert_eq!(wheel.location(k8), Some((0, 10, 10)));
    assert_eq!(wheel.location(k19), Some((0, 1, 21)));

    // Where the two long tasks must be at the start of each tick.
    let expected_at = |t: u64| -> (Location, Location) {
        let l350 = match t {
            ..340 => Some((1, 17, 340)),
            340..350 => Some((0, 10, 350)),
            _ => None,
        };
        let l450 = match t {
            ..400 => Some((2, 1, 400)),
            400..440 => Some((1, 2, 440)),
            440..450 => Some((0, 10, 450)),
            _ => None,
        };
        (l350, l450)
    };
    let fires_at = |name: &str| -> u64 {
        match name {
            "8ms@0" => 8,
            "8ms@2" => 10,
            "19ms@2" => 21,
            "350ms" => 350,
            "450ms" => 450,
            other => panic!("unexpected task {other}"),
        }
    };

    let mut fired = Vec::new();
    for t in 3..=460 {
        wheel.advance(t, &mut out);
        for name in out.drain(..) {
            assert_eq!(fires_at(name), t, "{name} fired at the wrong tick");
            fired.push(name);
        }
        assert_eq!(wheel.current_tick(), t);
        let (l350, l450) = expected_at(t);
        assert_eq!(wheel.location(k350), l350, "350 ms task at t = {t}");
        assert_eq!(wheel.location(k450), l450, "450 ms task at t = {t}");
        // The bucket queue holds at most levels x wheel_size buckets.
        assert!(wheel.queued_buckets() <= wheel.levels() * 20);
        match t {
            21..340 => assert_eq!(wheel.next_expiration(), Some(340)),
            340..350 => assert_eq!(wheel.next_expiration(), Some(350)),
            350..400 => assert_eq!(wheel.next_expiration(), Some(400)),
            400..440 => assert_eq!(wheel.next_expiration(), Some(440)),
            440..450 => assert_eq!(wheel.next_expiration(), Some(450)),
            450.. => assert_eq!(wheel.next_expiration(), None),
            _ => {}
        }
    }
    assert_eq!(fired, ["8ms@0", "8ms@2", "19ms@2", "350ms", "450ms"]);
    assert!(wheel.is_empty());
    assert_eq!(wheel.queued_buckets(), 0);
    assert_eq!(wheel.location(k450), None);
}

#[test]
fn one_big_advance_fires_the_example_in_expiration_order() {
    let mut wheel = Wheel::new(20, 0);
    for e in [2u64, 8, 350, 450] {
        wheel.insert(e, e);
    }
    let mut out = Vec::new();
    assert_eq!(wheel.advance(2, &mut out), 1);
    wheel.insert(10, 10);
    wheel.insert(21, 21);
    assert_eq!(
        wheel.advance(449, &mut out),
        4,
        "everything left but the 450 ms task"
    );
    assert_eq!(out, [2, 8, 10, 21, 350]);
    assert_eq!(wheel.len(), 1);
    assert_eq!(
        wheel.next_expiration(),
        Some(450),
        "cascaded down during the jump"
    );
    assert_eq!(wheel.advance(450, &mut out), 1);
    assert_eq!(out, [2, 8, 10, 21, 350, 450]);
}

/// Records the clock time at which it ran.
struct Stamp {
    name: &'static str,
    clock: ManualClock,
    log: Arc<Mutex<Vec<(&'static str, Duration)>>>,
}

impl TimerTask for Stamp {
    fn run(self) {
        let now = self.clock.now();
        self.log.lock().unwrap().push((self.name, now));
    }
}

const MS: Duration = Duration::from_millis(1);

/// Runs the example on a timer whose manual clock moves by `step` at a time (after the
/// first 2 ms), and checks that each task runs at the first step at or after its deadline.
fn run_timer_schedule(step: Duration) {
    let clock = ManualClock::new();
    let timer: Timer<Stamp> = TimerBuilder::new()
        .tick(MS)
        .wheel_size(20)
        .shards(1)
        .clock(clock.clone())
        .reaper(false)
        .build()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let stamp = |name| Stamp {
        name,
        clock: clock.clone(),
        log: Arc::clone(&log),
    };
    let take = || std::mem::take(&mut *log.lock().unwrap());

    let mut deadlines = vec![("2ms", 2 * MS), ("8ms@0", 8 * MS)];
    timer.add(2 * MS, stamp("2ms")).unwrap();
    timer.add(8 * MS, stamp("8ms@0")).unwrap();
    timer.add(350 * MS, stamp("350ms")).unwrap();
    let h450 = timer.add(450 * MS, stamp("450ms")).unwrap();
    assert_eq!(timer.next_expiration(), Some(2 * MS));
    assert_eq!(timer.advance_clock(Duration::ZERO), 0);
    assert!(take().is_empty(), "nothing is due at t = 0");

    clock.advance(MS);
    assert_eq!(timer.advance_clock(Duration::ZERO), 0);
    clock.advance(MS);
    assert_eq!(timer.advance_clock(Duration::ZERO), 1);
    assert_eq!(take(), [("2ms", 2 * MS)]);

    timer.add(8 * MS, stamp("8ms@2")).unwrap();
    timer.add(19 * MS, stamp("19ms@2")).unwrap();
    assert!(
        take().is_empty(),
        "add never runs a task on the adding thread"
    );
    deadlines.extend([
        ("8ms@2", 10 * MS),
        ("19ms@2", 21 * MS),
        ("350ms", 350 * MS),
        ("450ms", 450 * MS),
    ]);

    let end = 470 * MS;
    let mut fired = vec![("2ms", 2 * MS)];
    while clock.now() < end {
        let before = clock.now();
        clock.advance(step);
        let now = clock.now();
        let n = timer.advance_clock(Duration::ZERO);
        let ran = take();
        assert_eq!(n, ran.len(), "advance_clock counts what it ran");
        for (name, at) in ran {
            let deadline = deadlines.iter().find(|(n, _)| *n == name).unwrap().1;
            assert_eq!(at, now, "{name} ran during the advance at {now:?}");
            assert!(
                at >= deadline,
                "{name} ran at {at:?}, before its deadline {deadline:?}"
            );
            assert!(
                before < deadline,
                "{name} (deadline {deadline:?}) was not run by the advance at {before:?}"
            );
            fired.push((name, at));
        }
        // The 450 ms task is pending until the advance that reaches 450 ms.
        assert_eq!(timer.is_pending(h450), now < 450 * MS);
        if (21 * MS..340 * MS).contains(&now) {
            assert_eq!(
                timer.next_expiration(),
                Some(340 * MS),
                "level-1 bucket [340, 360)"
            );
        }
        if (350 * MS..400 * MS).contains(&now) {
            assert_eq!(
                timer.next_expiration(),
                Some(400 * MS),
                "level-2 bucket [400, 800)"
            );
        }
        if (400 * MS..440 * MS).contains(&now) {
            assert_eq!(
                timer.next_expiration(),
                Some(440 * MS),
                "level-1 bucket [440, 460)"
            );
        }
        if (440 * MS..450 * MS).contains(&now) {
            assert_eq!(timer.next_expiration(), Some(450 * MS), "level-0 bucket 10");
        }
    }
    let names: Vec<_> = fired.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["2ms", "8ms@0", "8ms@2", "19ms@2", "350ms", "450ms"]);
    assert!(timer.is_empty());
    assert_eq!(timer.next_expiration(), None);
    let stats = timer.stats();
    assert_eq!((stats.added, stats.expired, stats.cancelled), (6, 6, 0));
}

#[test]
fn timer_fires_the_example_at_exact_ticks() {
    run_timer_schedule(MS);
}

#[test]
fn timer_never_fires_early_with_sub_tick_steps() {
    // 0.3 ms steps: deadlines fall between steps, so each task runs at the first step
    // past its deadline (less than one step late), never at the step before it.
    run_timer_schedule(Duration::from_micros(300));
}

#[test]
fn timer_fires_on_the_first_advance_past_the_deadline_with_coarse_steps() {
    run_timer_schedule(7 * MS);
}
