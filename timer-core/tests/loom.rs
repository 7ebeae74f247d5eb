//! Loom models of the timer's two races that matter (run with
//! `RUSTFLAGS="--cfg loom" cargo test -p purgatory-timer --test loom --release`).
//!
//! Under `cfg(loom)` every lock, condition variable and atomic of the thread-safe timer is
//! loom's (see `src/sync.rs`), so loom explores every interleaving of them:
//! - **Cancel racing expiry** of the same task: exactly one wins; the task runs if and only
//!   if `cancel` returned `None`, and runs once.
//! - **An add racing the driver's flush and sleep**: a driver blocked in `advance_clock`
//!   with a long `max_wait` must not lose a task that became due while it was going to
//!   sleep: once everything has finished, the task has run exactly once or was handed back
//!   by `shutdown`, never neither, never both.
//!
//! - **Reset racing expiry** of the same task: exactly one wins; the task runs if and only
//!   if `reset` returned `false`, and a won reset leaves it pending under its handle.
//! - **A reset to now racing the driver's sleep**: the moved task is never lost or run
//!   twice (run, or handed back by the `shutdown` that ends the wait).
//!
//! - **A batch cancel emptying the earliest bucket, racing an add and the driver's
//!   sleep**: the cancel publishes a later expiration (so the driver does not wake for
//!   the emptied bucket); the add of a task due now is never hidden behind it: once both
//!   have returned, the task has run or the published expiration says it is due.
//!
//! - **A batch cancel emptying a due bucket, racing the driver's advance**: the cancel
//!   leaves the shard's published expiration as it was, so the advance takes the emptied
//!   bucket and leaves the timer empty; it must then return (the owner decides its wait
//!   again) rather than sleep under the bound for an empty timer it was given before.
//!   Here that bound is unlimited and nothing else wakes the driver, so a sleep is a
//!   deadlock loom reports; it does when the advance waits after taking only emptied
//!   buckets.
//!
//! - **Another driver emptying the core after a round's decision**: a round has begun
//!   with its wait decided (unlimited while the core is empty); then the task whose
//!   bucket is due is cancelled and a second driving thread's round takes the emptied
//!   bucket. The first round, finding the core empty, must return (the advance that
//!   idled a shard counts it before publishing, and the round compares the count with
//!   the one read when its wait was decided) rather than sleep: loom reports the
//!   deadlock when the comparison is left out. It does not catch a count made after the
//!   publish: `fire_due` loads the published expiration and then stores it (the first
//!   limit below), and the read-modify-write that lets loom explore that order there
//!   makes it report a stale read after a mutex hand-over in other models (its
//!   modification order is partial), so the order is kept by a comment in `core.rs`.
//!
//! - **A wake after an add**: `wake` is never lost (even when it comes before the driver
//!   sleeps), and the woken driver runs the task that became due.
//! - **An add racing a driver that waits elsewhere** (an async task, woken through
//!   `TimerCore::set_wake_hook`): a driver that consumed its earlier wake-ups and then
//!   read the next expiration either saw the new task or is woken after the read.
//!
//! Loom has no clock: a timed wait there waits until notified. The add-versus-sleep model
//! therefore ends with `shutdown` (which always notifies), as a real driver's deadline
//! would end the wait; what it checks is that no interleaving loses or duplicates the task.
//!
//! Two limits of loom shape these models:
//! - Its DPOR remembers only the last access to each atomic, so a thread that loads an
//!   atomic and then stores to it hides its store's race with other threads' earlier
//!   loads. `Timer::add` does exactly that with the shard's published expiration, so under
//!   `cfg(loom)` it reads it with a read-modify-write instead (see `src/timer.rs`); without
//!   that, loom never lets the adder's store fall between the driver's loads.
//! - Because a timed wait never times out, a model cannot check that the adder's own
//!   notification suffices: when the driver already saw the new bucket before sleeping, only
//!   its (real-time) deadline would end the wait. The models end the wait with `shutdown` or
//!   `wake` instead.
//!
//! The models are kept small (two or three threads, one shard) because loom explores
//! interleavings exponentially. All but the batch-cancel model (three threads besides
//! the main one) finish in well under a minute unbounded; that one takes minutes, and
//! about 7 s with `LOOM_MAX_PREEMPTIONS=3`, the bound CI runs them with. It fails (the
//! added task neither ran nor is published) when the cancel's publish is made after the
//! shard lock is released.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use timer_core::{Clock, Expire, ManualClock, Timer, TimerBuilder, TimerCore, TimerTask};

/// Counts its runs in a plain (not loom) atomic: only read after every thread has joined.
struct Counted(std::sync::Arc<AtomicUsize>);

impl TimerTask for Counted {
    fn run(self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn manual_timer<T: TimerTask>(clock: &ManualClock) -> Timer<T> {
    TimerBuilder::new()
        .tick(Duration::from_millis(1))
        .shards(1)
        .clock(clock.clone())
        .reaper(false)
        .build()
        .expect("valid configuration")
}

#[test]
fn cancel_racing_expiry_has_exactly_one_winner() {
    loom::model(|| {
        let clock = ManualClock::new();
        let timer = Arc::new(manual_timer(&clock));
        let runs = std::sync::Arc::new(AtomicUsize::new(0));
        let handle = timer
            .add(Duration::from_millis(1), Counted(runs.clone()))
            .expect("timer is open");
        // The task is due: the driver's next advance expires it, unless cancel wins.
        clock.advance(Duration::from_millis(1));

        let driver = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance_clock(Duration::ZERO))
        };
        let cancelled = timer.cancel(handle);
        let fired = driver.join().unwrap();

        let ran = runs.load(Ordering::SeqCst);
        assert_eq!(
            ran,
            usize::from(cancelled.is_none()),
            "runs iff cancel lost"
        );
        assert_eq!(fired, ran, "advance_clock reports what it ran");
        let stats = timer.stats();
        assert_eq!(stats.expired + stats.cancelled, 1, "exactly one winner");
        assert_eq!(stats.pending, 0);
        // Whoever lost, the handle is stale now.
        assert!(timer.cancel(handle).is_none());
        assert!(timer.shutdown().is_empty());
        drop(cancelled);
    });
}

#[test]
fn reset_racing_expiry_has_exactly_one_winner() {
    loom::model(|| {
        let clock = ManualClock::new();
        let timer = Arc::new(manual_timer(&clock));
        let runs = std::sync::Arc::new(AtomicUsize::new(0));
        let handle = timer
            .add(Duration::from_millis(1), Counted(runs.clone()))
            .expect("timer is open");
        // Due: the driver's next advance expires it, unless the reset moves it first.
        clock.advance(Duration::from_millis(1));

        let driver = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance_clock(Duration::ZERO))
        };
        let moved = timer.reset(handle, Duration::from_secs(3_600));
        let fired = driver.join().unwrap();

        let ran = runs.load(Ordering::SeqCst);
        assert_eq!(ran, usize::from(!moved), "runs iff the reset lost");
        assert_eq!(fired, ran);
        // A won reset leaves the task pending under the same handle, for shutdown to hand
        // back; a lost one leaves the handle stale.
        assert_eq!(timer.is_pending(handle), moved);
        assert_eq!(timer.shutdown().len(), usize::from(moved));
        assert_eq!(runs.load(Ordering::SeqCst), ran, "nothing ran after");
    });
}

#[test]
fn a_reset_to_now_racing_the_drivers_sleep_is_never_lost() {
    loom::model(|| {
        let clock = ManualClock::new();
        let timer = Arc::new(manual_timer(&clock));
        let runs = std::sync::Arc::new(AtomicUsize::new(0));
        let handle = timer
            .add(Duration::from_secs(3_600), Counted(runs.clone()))
            .expect("timer is open");

        // The driver finds nothing due and sleeps toward the far deadline unless woken.
        let driver = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance_clock(Duration::from_secs(3_600)))
        };
        assert!(timer.reset(handle, Duration::ZERO), "nothing fired it yet");
        let handed_back = timer.shutdown().len();
        let fired = driver.join().unwrap();

        let ran = runs.load(Ordering::SeqCst);
        assert_eq!(ran + handed_back, 1, "ran {ran}, handed back {handed_back}");
        assert_eq!(fired, ran);
    });
}

#[test]
fn a_batch_cancel_emptying_the_earliest_bucket_never_hides_an_add() {
    loom::model(|| {
        let clock = ManualClock::new();
        clock.advance(Duration::from_millis(5));
        let timer = Arc::new(manual_timer(&clock));
        let (early, late, added) = (
            std::sync::Arc::new(AtomicUsize::new(0)),
            std::sync::Arc::new(AtomicUsize::new(0)),
            std::sync::Arc::new(AtomicUsize::new(0)),
        );
        // The earliest bucket (10 ms from now) holds one task, which the batch cancels;
        // the next holds a task an hour away.
        let first = timer
            .add(Duration::from_millis(10), Counted(early.clone()))
            .expect("timer is open");
        timer
            .add(Duration::from_secs(3_600), Counted(late.clone()))
            .expect("timer is open");

        // The driver finds nothing due and sleeps unless woken.
        let driver = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance_clock(Duration::from_secs(3_600)))
        };
        let canceller = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || {
                let mut cancelled = Vec::new();
                assert_eq!(timer.cancel_batch(&mut [first], &mut cancelled), 1);
            })
        };
        // A task due now, added while the cancel publishes the hour-away bucket.
        timer
            .add(Duration::ZERO, Counted(added.clone()))
            .expect("timer is open");
        canceller.join().unwrap();

        let due = timer.next_expiration().is_some_and(|at| at <= clock.now());
        assert!(
            added.load(Ordering::SeqCst) == 1 || due,
            "the added task neither ran nor is published as due"
        );
        let handed_back = timer.shutdown().len();
        let fired = driver.join().unwrap();

        let ran = added.load(Ordering::SeqCst);
        assert_eq!(early.load(Ordering::SeqCst), 0, "the cancelled task ran");
        assert_eq!(late.load(Ordering::SeqCst), 0, "the hour-away task ran");
        assert_eq!(ran + handed_back, 2, "ran {ran}, handed back {handed_back}");
        assert_eq!(fired, ran);
    });
}

#[test]
fn a_batch_cancel_emptying_a_due_bucket_never_leaves_the_driver_asleep_without_limit() {
    loom::model(|| {
        let clock = ManualClock::new();
        let timer = Arc::new(manual_timer(&clock));
        let runs = std::sync::Arc::new(AtomicUsize::new(0));
        let handle = timer
            .add(Duration::from_millis(10), Counted(runs.clone()))
            .expect("timer is open");
        // Its bucket is due; the batch cancel (as a completing thread's flush) races the
        // driver's advance.
        clock.advance(Duration::from_millis(20));
        let canceller = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || {
                let mut cancelled = Vec::new();
                timer.cancel_batch(&mut [handle], &mut cancelled)
            })
        };
        // No limit on the wait while nothing is queued, and nothing here would wake the
        // driver: a driver that sleeps after taking the emptied bucket never returns, and
        // loom reports the deadlock.
        let fired = timer.advance_clock(Duration::MAX);
        let cancelled = canceller.join().unwrap();

        assert_eq!(fired + cancelled, 1, "fired {fired}, cancelled {cancelled}");
        assert_eq!(runs.load(Ordering::SeqCst), fired);
        assert_eq!(timer.shutdown().len(), 0);
    });
}

/// A driver's target for the model below: its `before_round` marks that a round has
/// begun (its wait decided), and its tasks only count.
struct Marks {
    core: TimerCore<u32>,
    began: loom::sync::atomic::AtomicBool,
}

impl Expire for Marks {
    type Task = u32;

    fn core(&self) -> &TimerCore<u32> {
        &self.core
    }

    fn expire(&self, expired: &mut Vec<u32>) {
        expired.clear();
    }

    fn before_round(&self) {
        self.began.store(true, Ordering::SeqCst);
    }
}

#[test]
fn another_driver_emptying_the_core_after_a_rounds_decision_never_leaves_it_asleep() {
    loom::model(|| {
        let clock = ManualClock::new();
        let (core, config) = TimerBuilder::new()
            .tick(Duration::from_millis(1))
            .shards(1)
            .clock(clock.clone())
            .reaper(false)
            .stand_in(None)
            .build_parts::<u32>()
            .expect("valid configuration");
        let handle = core.add(Duration::from_millis(10), 7).expect("open");
        clock.advance(Duration::from_millis(20));
        let driver = Arc::new(
            config
                .start(
                    Marks {
                        core,
                        began: loom::sync::atomic::AtomicBool::new(false),
                    },
                    "marks",
                )
                .expect("a driver"),
        );
        // Once the first driver's round has begun (its wait decided: none while the core
        // is empty), the task is cancelled and the second driver's round takes the
        // emptied bucket.
        let other = {
            let driver = Arc::clone(&driver);
            thread::spawn(move || {
                while !driver.target().began.load(Ordering::SeqCst) {
                    thread::yield_now();
                }
                let cancelled = driver
                    .target()
                    .core
                    .cancel_batch(&mut [handle], &mut Vec::new());
                (cancelled, driver.advance_clock(Duration::ZERO))
            })
        };
        // Nothing would wake this round: one that sleeps is a deadlock loom reports.
        let fired = driver.advance_clock(Duration::MAX);
        let (cancelled, fired_there) = other.join().unwrap();
        assert_eq!(fired + cancelled + fired_there, 1);
        assert_eq!(driver.target().core.next_expiration(), None);
    });
}

/// An add racing `shutdown` is refused (its task comes back in the error) or accepted and
/// then handed back by the shutdown: never lost, never both. And once the core reads
/// shut down, an add is refused: `close` closes every shard, under its lock, before the
/// core reads closed, and an add asks its shard alone.
#[test]
fn an_add_racing_shutdown_is_refused_or_handed_back() {
    loom::model(|| {
        let clock = ManualClock::new();
        let timer = Arc::new(manual_timer(&clock));
        let runs = std::sync::Arc::new(AtomicUsize::new(0));
        let adder = {
            let timer = Arc::clone(&timer);
            let runs = runs.clone();
            thread::spawn(move || {
                let first = timer
                    .add(Duration::from_millis(1), Counted(runs.clone()))
                    .is_ok();
                let seen_shut = timer.is_shutdown();
                let second = timer.add(Duration::ZERO, Counted(runs)).is_ok();
                (first, seen_shut, second)
            })
        };
        let handed_back = timer.shutdown().len();
        let (first, seen_shut, second) = adder.join().unwrap();
        assert!(
            !(seen_shut && second),
            "an add after the core read shut down was accepted"
        );
        assert_eq!(handed_back, usize::from(first) + usize::from(second));
        assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
        assert_eq!(timer.len(), 0);
    });
}

#[test]
fn an_add_racing_the_drivers_sleep_is_never_lost() {
    loom::model(|| {
        let clock = ManualClock::new();
        clock.advance(Duration::from_millis(5));
        let timer = Arc::new(manual_timer(&clock));
        let runs = std::sync::Arc::new(AtomicUsize::new(0));

        // The driver finds nothing due and sleeps (up to an hour) unless woken.
        let driver = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance_clock(Duration::from_secs(3_600)))
        };
        // The adder adds a task due now while the driver flushes and goes to sleep.
        let adder = {
            let timer = Arc::clone(&timer);
            let runs = runs.clone();
            thread::spawn(move || {
                timer
                    .add(Duration::ZERO, Counted(runs))
                    .expect("timer is open");
            })
        };
        adder.join().unwrap();
        let handed_back = timer.shutdown().len();
        let fired = driver.join().unwrap();

        let ran = runs.load(Ordering::SeqCst);
        assert_eq!(ran + handed_back, 1, "ran {ran}, handed back {handed_back}");
        assert_eq!(fired, ran);
        assert_eq!(timer.len(), 0);
        assert_eq!(
            clock.now(),
            Duration::from_millis(5),
            "the clock did not move"
        );
    });
}

#[test]
fn an_add_the_outside_drivers_read_missed_calls_its_hook_after_the_read() {
    loom::model(|| {
        let core: Arc<timer_core::TimerCore<u32>> = Arc::new(
            TimerBuilder::new()
                .tick(Duration::from_millis(1))
                .shards(1)
                .clock(ManualClock::new())
                .build_core()
                .expect("valid configuration"),
        );
        // The driver's wake-up permit (what `tokio::sync::Notify` keeps).
        let permit = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let hook = Arc::clone(&permit);
        // A read-modify-write, as `Notify::notify_one` (loom also loses a plain store
        // here that a later load of the same thread should see).
        assert!(core.set_wake_hook(move || {
            hook.swap(true, Ordering::SeqCst);
        }));

        let adder = {
            let core = Arc::clone(&core);
            thread::spawn(move || drop(core.add(Duration::from_millis(7), 1)))
        };
        // The driver: a wait of its last round consumed the permits given so far (a
        // read-modify-write, as `Notify` does), then this round reads the next expiry.
        permit.swap(false, Ordering::SeqCst);
        let seen = core.next_expiration().is_some();
        adder.join().unwrap();
        // Its next wait: a permit is there unless the read saw the task.
        let woken = permit.swap(false, Ordering::SeqCst);
        assert!(
            seen || woken,
            "the driver would wait without a wake-up for a task it did not see"
        );
    });
}

#[test]
fn a_wake_after_an_add_makes_the_driver_run_the_task() {
    loom::model(|| {
        let clock = ManualClock::new();
        let timer = Arc::new(manual_timer(&clock));
        let runs = std::sync::Arc::new(AtomicUsize::new(0));

        let driver = {
            let timer = Arc::clone(&timer);
            thread::spawn(move || timer.advance_clock(Duration::from_secs(3_600)))
        };
        let adder = {
            let timer = Arc::clone(&timer);
            let runs = runs.clone();
            thread::spawn(move || {
                timer
                    .add(Duration::ZERO, Counted(runs))
                    .expect("timer is open");
            })
        };
        adder.join().unwrap();
        // A wake is never lost, even if it arrives before the driver sleeps; the driver
        // then fires what is due, so the task runs on the driver, not at shutdown.
        timer.wake();
        let fired = driver.join().unwrap();

        assert_eq!(fired, 1, "the driver ran the task");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(timer.shutdown().is_empty());
    });
}

/// A task that counts its run and, if it holds its timer, shuts it down first (from
/// inside the round that runs it). Its counters are loom's: each count is a point where
/// loom may switch threads, so the outside caller can run between two tasks of a round.
struct Step {
    shut: Option<std::sync::Weak<Timer<Step>>>,
    ran: Arc<loom::sync::atomic::AtomicUsize>,
    handed_back: Arc<loom::sync::atomic::AtomicUsize>,
}

impl TimerTask for Step {
    fn run(self) {
        if let Some(timer) = self.shut.as_ref().and_then(std::sync::Weak::upgrade) {
            let back = timer.shutdown();
            self.handed_back.fetch_add(back.len(), Ordering::SeqCst);
        }
        self.ran.fetch_add(1, Ordering::SeqCst);
    }
}

/// The shutdown hand-over: a task shuts its timer down from inside a round while another
/// thread calls `shutdown` too. Whichever is first, the outside call returns only after
/// every task of that round has run (the inside call cannot wait for its own round, so
/// the outside one must), and every task ran or was handed back, exactly once.
#[test]
fn an_outside_shutdown_returns_after_the_round_an_inside_shutdown_is_in() {
    loom::model(|| {
        let clock = ManualClock::new();
        let timer: std::sync::Arc<Timer<Step>> = std::sync::Arc::new(manual_timer(&clock));
        let ran = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let handed_back = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        for shut in [Some(std::sync::Arc::downgrade(&timer)), None] {
            let step = Step {
                shut,
                ran: ran.clone(),
                handed_back: handed_back.clone(),
            };
            assert!(timer.add(Duration::from_millis(1), step).is_ok());
        }
        clock.advance(Duration::from_millis(1));
        let round = {
            let timer = std::sync::Arc::clone(&timer);
            thread::spawn(move || timer.advance_clock(Duration::ZERO))
        };
        let outside = {
            let timer = std::sync::Arc::clone(&timer);
            let ran = ran.clone();
            thread::spawn(move || {
                let back = timer.shutdown().len();
                (back, ran.load(Ordering::SeqCst))
            })
        };
        round.join().unwrap();
        let (back, ran_when_returned) = outside.join().unwrap();
        let ran = ran.load(Ordering::SeqCst);
        assert_eq!(
            ran_when_returned, ran,
            "nothing ran after the outside call returned"
        );
        assert_eq!(
            ran + back + handed_back.load(Ordering::SeqCst),
            2,
            "each task once"
        );
    });
}
