//! A driver over an owner's own [`Expire`] target: the wait an `after_round` asks for is
//! applied as the core stands when the round starts to wait, not as it stood when
//! `after_round` decided.
//!
//! Every wait here is bounded (a hang fails the test instead of blocking the run); no test
//! asserts how fast anything is.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use timer_core::{Driver, Expire, ManualClock, NextRound, TimerBuilder, TimerCore, TimerHandle};

/// How long a round may wait while a task is queued.
const QUEUED_WAIT: Duration = Duration::from_millis(10);
/// Far beyond the test: a round that waits for this bucket never comes back in time.
const FAR: Duration = Duration::from_secs(1_000);
/// Upper bound on any wait for something that should happen promptly.
const PATIENCE: Duration = Duration::from_secs(10);

/// A target that asks for short waits while anything is queued and long ones (`empty`)
/// while nothing is (as the purgatory does, to purge and flush cancels while work is
/// pending), and
/// whose first `after_round` (the reaper's, before its first round) stops between
/// deciding and returning until the test lets it go (having added a task meanwhile, or
/// not).
struct Target {
    core: TimerCore<u32>,
    empty: Duration,
    after_rounds: AtomicUsize,
    decided: Barrier,
    resume: Barrier,
}

impl Expire for Target {
    type Task = u32;

    fn core(&self) -> &TimerCore<u32> {
        &self.core
    }

    fn expire(&self, expired: &mut Vec<u32>) {
        expired.clear();
    }

    fn after_round(&self) -> NextRound {
        let wait = NextRound {
            queued: QUEUED_WAIT,
            empty: self.empty,
        };
        if self.after_rounds.fetch_add(1, Ordering::SeqCst) == 0 {
            self.decided.wait();
            self.resume.wait();
        }
        wait
    }
}

/// A driver over a fresh [`Target`] that waits up to `empty` while nothing is queued,
/// its reaper started (and held in its first `after_round` until the test passes both
/// barriers).
fn start(empty: Duration) -> Driver<Target> {
    let (core, config) = TimerBuilder::new().build_parts::<u32>().unwrap();
    let target = Target {
        core,
        empty,
        after_rounds: AtomicUsize::new(0),
        decided: Barrier::new(2),
        resume: Barrier::new(2),
    };
    config.start(target, "driver-test").unwrap()
}

fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < PATIENCE {
        if done() {
            return true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    done()
}

#[test]
fn a_task_added_while_the_reaper_decides_to_sleep_idle_still_gets_the_queued_bound() {
    let driver = start(Duration::MAX);
    // The reaper has found the core empty and asked to sleep without limit; before it
    // starts its round, a task far in the future is queued.
    driver.target().decided.wait();
    driver.target().core.add(FAR, 7).unwrap();
    driver.target().resume.wait();
    // From now on the queued bound applies: rounds come every `QUEUED_WAIT`, not at the
    // far bucket.
    assert!(
        wait_until(|| driver.target().after_rounds.load(Ordering::SeqCst) >= 5),
        "the reaper slept past the queued bound: {} rounds",
        driver.target().after_rounds.load(Ordering::SeqCst)
    );
    let pending = driver.shutdown_with(|pending| pending).unwrap();
    assert_eq!(
        pending,
        vec![7],
        "the far task never fired, and is handed back"
    );
}

#[test]
fn an_add_wakes_a_reaper_sleeping_idle_when_the_queued_bound_is_shorter() {
    // Idle, the reaper plans to wake in a minute; the add below is due far later than
    // that, so only a plan that any add wakes makes the queued bound apply at once.
    let driver = start(Duration::from_secs(60));
    driver.target().decided.wait();
    driver.target().resume.wait();
    // Nothing queued: the reaper sleeps and does not come back by itself.
    thread::sleep(QUEUED_WAIT * 10);
    let idle_rounds = driver.target().after_rounds.load(Ordering::SeqCst);
    assert!(
        idle_rounds <= 2,
        "an idle reaper kept waking: {idle_rounds}"
    );
    // An add whose bucket is far away still wakes it, and the rounds after it are bounded.
    driver.target().core.add(FAR, 7).unwrap();
    assert!(
        wait_until(|| driver.target().after_rounds.load(Ordering::SeqCst) >= idle_rounds + 5),
        "the add did not wake the idle reaper"
    );
    assert_eq!(driver.shutdown_with(|pending| pending).unwrap(), vec![7]);
}

#[test]
fn an_add_missed_while_another_thread_drove_the_core_still_wakes_the_idle_reaper() {
    let driver = start(Duration::MAX);
    driver.target().decided.wait();
    driver.target().resume.wait();
    thread::sleep(QUEUED_WAIT * 10);
    thread::scope(|s| {
        // A second driving thread plans to wake 300 ms from now; the reaper sleeps idle.
        let other = s.spawn(|| driver.advance_clock(Duration::from_millis(300)));
        thread::sleep(Duration::from_millis(100));
        // Later than the other thread's plan: the add notifies nobody.
        driver.target().core.add(FAR, 7).unwrap();
        assert_eq!(other.join().unwrap(), 0);
    });
    // Once the other thread has left, the reaper re-plans under the queued bound.
    let after_other = driver.target().after_rounds.load(Ordering::SeqCst);
    assert!(
        wait_until(|| driver.target().after_rounds.load(Ordering::SeqCst) >= after_other + 5),
        "the reaper slept on after the other driver left: {} rounds",
        driver.target().after_rounds.load(Ordering::SeqCst) - after_other
    );
    assert_eq!(driver.shutdown_with(|pending| pending).unwrap(), vec![7]);
}

/// Where [`Gated`]'s reaper stops once armed.
const IN_BEFORE_ROUND: u8 = 1;
const IN_AFTER_ROUND: u8 = 2;

/// A target whose `before_round` first applies, through `cancel_batch`, the cancels the
/// test queued (as the purgatory applies its completions' cancels at the start of a
/// round); whose reaper, once the test arms the gate (at the start of a round, or in
/// `after_round` as it decides), stops there until the test lets it go; and whose every
/// `after_round` asks for short waits while anything is queued and none while nothing
/// is, and is counted.
struct Gated {
    core: TimerCore<u32>,
    queued: Mutex<Vec<TimerHandle>>,
    gate: AtomicU8,
    stopped: Barrier,
    resume: Barrier,
    after_rounds: AtomicUsize,
}

impl Gated {
    fn new(core: TimerCore<u32>, queued: Vec<TimerHandle>) -> Self {
        Gated {
            core,
            queued: Mutex::new(queued),
            gate: AtomicU8::new(0),
            stopped: Barrier::new(2),
            resume: Barrier::new(2),
            after_rounds: AtomicUsize::new(0),
        }
    }

    fn stop_if_armed(&self, here: u8) {
        if self
            .gate
            .compare_exchange(here, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.stopped.wait();
            self.resume.wait();
        }
    }
}

impl Expire for Gated {
    type Task = u32;

    fn core(&self) -> &TimerCore<u32> {
        &self.core
    }

    fn expire(&self, expired: &mut Vec<u32>) {
        expired.clear();
    }

    fn before_round(&self) {
        let mut handles = std::mem::take(&mut *self.queued.lock().unwrap());
        self.core.cancel_batch(&mut handles, &mut Vec::new());
        self.stop_if_armed(IN_BEFORE_ROUND);
    }

    fn after_round(&self) -> NextRound {
        let wait = NextRound {
            queued: QUEUED_WAIT,
            empty: Duration::MAX,
        };
        self.stop_if_armed(IN_AFTER_ROUND);
        self.after_rounds.fetch_add(1, Ordering::SeqCst);
        wait
    }
}

/// Ends a wait a round should not have begun (no limit, nothing queued): an add due at
/// once wakes it, so that the test fails instead of hanging.
fn end_a_sleep_without_limit(target: &Gated, clock: &ManualClock) {
    target.core.add(Duration::ZERO, 8).unwrap();
    clock.advance(Duration::from_millis(10));
}

/// The purgatory's lost purge, in the driver: the last round decided its wait (none)
/// while a task was queued; the next round's `before_round` cancels that task, whose
/// bucket is due. The advance takes the emptied bucket and leaves the core empty: the
/// round must come back to its owner (who may now want a shorter wait, as the purgatory
/// does once those completions made a purge due) instead of sleeping without limit on the
/// old decision.
#[test]
fn a_round_that_finds_only_a_cancelled_bucket_due_returns_to_its_owner() {
    let clock = ManualClock::new();
    let (core, config) = TimerBuilder::new()
        .clock(clock.clone())
        .reaper(false)
        .build_parts::<u32>()
        .unwrap();
    let handle = core.add(Duration::from_millis(10), 7).unwrap();
    let driver = config
        .start(Gated::new(core, vec![handle]), "cancels-first")
        .unwrap();
    clock.advance(Duration::from_millis(20));
    let (returned, rx) = mpsc::channel();
    thread::scope(|s| {
        // No limit on the wait: the wait its `after_round` asks for is not used here.
        s.spawn(|| returned.send(driver.advance_clock(Duration::MAX)).unwrap());
        let came_back = rx.recv_timeout(PATIENCE);
        if came_back.is_err() {
            end_a_sleep_without_limit(driver.target(), &clock);
        }
        assert_eq!(
            came_back,
            Ok(0),
            "the round slept on a wait decided before its cancels emptied the core"
        );
    });
    assert_eq!(driver.target().after_rounds.load(Ordering::SeqCst), 1);
    let stats = driver.target().core.stats();
    assert_eq!((stats.cancelled, stats.expired, stats.pending), (1, 0, 0));
    assert_eq!(driver.target().core.next_expiration(), None);
}

/// The same, with two driving threads: the reaper has decided its wait while a task was
/// queued, or is deciding it; meanwhile the task is cancelled (its bucket due) and
/// another thread's `advance_clock` takes the emptied bucket and leaves the core empty.
/// The reaper's next advance then finds nothing due at all, yet must not sleep on the
/// bound its target gave for an empty core before the cancel.
fn another_driver_empties_the_core_while_the_reaper_is_stopped(gate: u8) {
    let clock = ManualClock::new();
    let (core, config) = TimerBuilder::new()
        .clock(clock.clone())
        .stand_in(None)
        .build_parts::<u32>()
        .unwrap();
    let handle = core.add(Duration::from_millis(10), 7).unwrap();
    let driver = config.start(Gated::new(core, Vec::new()), "gated").unwrap();
    let gated = driver.target();
    // The reaper comes round every `QUEUED_WAIT` while the task is queued: it stops at
    // the gate within one. Not in its first round, which waits for nothing.
    assert!(wait_until(|| gated.after_rounds.load(Ordering::SeqCst) >= 2));
    gated.gate.store(gate, Ordering::SeqCst);
    gated.stopped.wait();
    clock.advance(Duration::from_millis(20));
    assert_eq!(gated.core.cancel_batch(&mut [handle], &mut Vec::new()), 1);
    assert_eq!(driver.advance_clock(Duration::ZERO), 0);
    assert_eq!(
        gated.core.next_expiration(),
        None,
        "the other round emptied the core"
    );
    let before = gated.after_rounds.load(Ordering::SeqCst);
    gated.resume.wait();
    // Stopped in `after_round`, the reaper counts that round on its way out: the next.
    let next = before + usize::from(gate == IN_AFTER_ROUND) + 1;
    let came_back = wait_until(|| gated.after_rounds.load(Ordering::SeqCst) >= next);
    if !came_back {
        end_a_sleep_without_limit(gated, &clock);
    }
    assert!(
        came_back,
        "the reaper slept on a wait decided before the core was emptied"
    );
    assert!(driver.shutdown_with(|pending| pending).unwrap().len() <= 1);
}

#[test]
fn a_round_whose_core_another_driver_emptied_before_it_advanced_returns_to_its_owner() {
    another_driver_empties_the_core_while_the_reaper_is_stopped(IN_BEFORE_ROUND);
}

#[test]
fn a_round_whose_core_another_driver_emptied_while_its_wait_was_decided_returns_to_its_owner() {
    another_driver_empties_the_core_while_the_reaper_is_stopped(IN_AFTER_ROUND);
}
