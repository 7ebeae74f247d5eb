//! Real threads adding, cancelling and driving the clock at once, with exact accounting.
//!
//! Every task carries an id; a shared [`Ledger`] counts, per id, how often it ran, how
//! often a `cancel` gave it back and how often `shutdown` handed it back. At the end every
//! id must have exactly one of the three, and the timer's counters must agree with the
//! ledger. A task also checks, when it runs, that the clock has reached its deadline.
//!
//! Besides the stress runs: a panicking task is counted and the others still run; shutdown
//! is prompt, hands back what is pending and refuses later adds with the task given back;
//! a stale handle cancels nothing; zero and `Duration::MAX` delays are accepted.
//!
//! Every wait here is bounded (a hang fails the test instead of blocking the run); no test
//! asserts how fast anything is.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use timer_core::{
    AddError, Clock, Executor, ManualClock, SystemClock, Timer, TimerBuilder, TimerHandle,
    TimerTask,
};

const MS: Duration = Duration::from_millis(1);
/// Upper bound on any wait for something that should happen promptly.
const PATIENCE: Duration = Duration::from_secs(30);

/// Per-task outcome counters, indexed by task id.
struct Ledger {
    clock: Box<dyn Clock>,
    ran: Vec<AtomicU32>,
    cancelled: Vec<AtomicU32>,
    handed_back: Vec<AtomicU32>,
    early: AtomicU64,
}

impl Ledger {
    fn new(tasks: usize, clock: impl Clock) -> Arc<Self> {
        let zeros = || (0..tasks).map(|_| AtomicU32::new(0)).collect();
        Arc::new(Ledger {
            clock: Box::new(clock),
            ran: zeros(),
            cancelled: zeros(),
            handed_back: zeros(),
            early: AtomicU64::new(0),
        })
    }

    fn count(counters: &[AtomicU32]) -> u64 {
        counters
            .iter()
            .map(|c| u64::from(c.load(Ordering::SeqCst)))
            .sum()
    }

    fn ran(&self) -> u64 {
        Self::count(&self.ran)
    }

    fn cancelled(&self) -> u64 {
        Self::count(&self.cancelled)
    }

    fn handed_back(&self) -> u64 {
        Self::count(&self.handed_back)
    }

    fn settled(&self) -> u64 {
        self.ran() + self.cancelled() + self.handed_back()
    }

    /// Every id settled exactly once: ran, cancelled or handed back.
    fn assert_each_exactly_once(&self) {
        for id in 0..self.ran.len() {
            let ran = self.ran[id].load(Ordering::SeqCst);
            let cancelled = self.cancelled[id].load(Ordering::SeqCst);
            let back = self.handed_back[id].load(Ordering::SeqCst);
            assert_eq!(
                ran + cancelled + back,
                1,
                "task {id}: ran {ran}, cancelled {cancelled}, handed back {back}"
            );
        }
        assert_eq!(self.early.load(Ordering::SeqCst), 0, "tasks ran early");
    }
}

/// A task that records in the ledger that it ran, and whether it ran before `deadline`.
struct Tracked {
    id: usize,
    deadline: Duration,
    ledger: Arc<Ledger>,
}

impl TimerTask for Tracked {
    fn run(self) {
        if self.ledger.clock.now() < self.deadline {
            self.ledger.early.fetch_add(1, Ordering::SeqCst);
        }
        self.ledger.ran[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

/// Adds `count` tasks with ids `first..first + count` and cancels about half of them
/// (some twice, some long after they fired), recording successful cancels in the ledger.
/// Alternates `add` (the deadline is a lower bound read before the call) and `add_at`
/// (the exact deadline).
fn add_and_cancel(
    timer: &Timer<Tracked>,
    ledger: &Arc<Ledger>,
    first: usize,
    count: usize,
    seed: u64,
    delay: impl Fn(&mut StdRng) -> Duration,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut handles: Vec<(usize, TimerHandle)> = Vec::with_capacity(count);
    for id in first..first + count {
        let delay = delay(&mut rng);
        let now = timer.now();
        let deadline = now.saturating_add(delay);
        let task = Tracked {
            id,
            deadline,
            ledger: Arc::clone(ledger),
        };
        let handle = if id % 2 == 0 {
            timer.add(delay, task)
        } else {
            timer.add_at(deadline, task)
        }
        .unwrap_or_else(|_| panic!("add refused before shutdown"));
        handles.push((id, handle));
        if rng.gen_bool(0.5) {
            // Mostly recent handles (likely still pending), sometimes any earlier one.
            let back = if rng.gen_bool(0.8) { 8 } else { handles.len() };
            let pick = handles.len() - 1 - rng.gen_range(0..back.min(handles.len()));
            let (id, handle) = handles[pick];
            if let Some(task) = timer.cancel(handle) {
                assert_eq!(task.id, id, "cancel gave back another task");
                ledger.cancelled[id].fetch_add(1, Ordering::SeqCst);
                assert!(timer.cancel(handle).is_none(), "a handle cancelled twice");
            }
        }
    }
}

#[test]
fn adders_cancellers_and_a_driver_on_a_manual_clock_account_for_every_task() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 100_000;
    let clock = ManualClock::new();
    let timer: Timer<Tracked> = TimerBuilder::new()
        .shards(4)
        .clock(clock.clone())
        .reaper(false)
        .build()
        .unwrap();
    let ledger = Ledger::new(THREADS * PER_THREAD, clock.clone());
    let adders_done = AtomicUsize::new(0);
    let driver_ran = AtomicU64::new(0);

    thread::scope(|s| {
        for t in 0..THREADS {
            let (timer, ledger, adders_done) = (&timer, &ledger, &adders_done);
            s.spawn(move || {
                add_and_cancel(
                    timer,
                    ledger,
                    t * PER_THREAD,
                    PER_THREAD,
                    t as u64,
                    |rng| match rng.gen_range(0..100) {
                        0..10 => Duration::ZERO,
                        10..80 => Duration::from_micros(rng.gen_range(0..50_000)),
                        80..95 => Duration::from_millis(rng.gen_range(50..5_000)),
                        95..98 => Duration::from_secs(rng.gen_range(3_600..1_000_000)),
                        _ => Duration::MAX,
                    },
                );
                adders_done.fetch_add(1, Ordering::SeqCst);
            });
        }
        // The driver moves the clock in small random steps and fires what is due, while
        // the adders run.
        let (timer, clock, adders_done, driver_ran) = (&timer, &clock, &adders_done, &driver_ran);
        s.spawn(move || {
            let mut rng = StdRng::seed_from_u64(99);
            while adders_done.load(Ordering::SeqCst) < THREADS {
                clock.advance(Duration::from_micros(rng.gen_range(0..3_000)));
                let n = timer.advance_clock(Duration::ZERO);
                driver_ran.fetch_add(n as u64, Ordering::SeqCst);
                if n == 0 {
                    thread::yield_now();
                }
            }
        });
    });

    // Fire everything due within the next 10 seconds, then shut down.
    clock.advance(Duration::from_secs(10));
    let last = timer.advance_clock(Duration::ZERO);
    let horizon = clock.now();
    let ran = driver_ran.load(Ordering::SeqCst) + last as u64;
    for task in timer.shutdown() {
        assert!(
            task.deadline > horizon,
            "task {} (deadline {:?}) was still pending at {horizon:?}",
            task.id,
            task.deadline
        );
        ledger.handed_back[task.id].fetch_add(1, Ordering::SeqCst);
    }

    ledger.assert_each_exactly_once();
    let stats = timer.stats();
    assert_eq!(stats.added, (THREADS * PER_THREAD) as u64);
    assert_eq!(stats.expired, ledger.ran());
    assert_eq!(stats.expired, ran, "advance_clock's counts add up");
    assert_eq!(stats.cancelled, ledger.cancelled());
    assert_eq!(stats.panicked, 0);
    assert_eq!(stats.pending, 0);
    assert!(ledger.ran() > 0 && ledger.cancelled() > 0 && ledger.handed_back() > 0);
}

/// Waits until `done()` or `PATIENCE` runs out; returns whether `done()` held.
fn wait_for(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > PATIENCE {
            return false;
        }
        thread::sleep(MS);
    }
    true
}

/// Stress with the real reaper thread and system clock: short delays, so everything not
/// cancelled fires during the run.
fn reaper_stress(executor: Executor, threads: usize, per_thread: usize) {
    let clock = SystemClock::new();
    let timer: Timer<Tracked> = TimerBuilder::new()
        .clock(clock)
        .executor(executor)
        .build()
        .unwrap();
    let ledger = Ledger::new(threads * per_thread, clock);
    thread::scope(|s| {
        for t in 0..threads {
            let (timer, ledger) = (&timer, &ledger);
            s.spawn(move || {
                add_and_cancel(timer, ledger, t * per_thread, per_thread, t as u64, |rng| {
                    Duration::from_micros(rng.gen_range(0..5_000))
                });
            });
        }
    });
    let total = (threads * per_thread) as u64;
    assert!(
        wait_for(|| ledger.ran() + ledger.cancelled() == total),
        "only {} of {total} tasks settled; stats {:?}",
        ledger.settled(),
        timer.stats()
    );
    for task in timer.shutdown() {
        ledger.handed_back[task.id].fetch_add(1, Ordering::SeqCst);
    }
    ledger.assert_each_exactly_once();
    let stats = timer.stats();
    assert_eq!(stats.added, total);
    assert_eq!(stats.expired, ledger.ran());
    assert_eq!(stats.cancelled, ledger.cancelled());
    assert_eq!(stats.panicked, 0);
    assert_eq!(stats.pending, 0);
    assert_eq!(
        ledger.handed_back(),
        0,
        "every task was due long before shutdown"
    );
}

#[test]
fn adders_and_cancellers_against_the_reaper_thread_account_for_every_task() {
    reaper_stress(Executor::Inline, 4, 50_000);
}

#[test]
fn pool_executor_runs_every_expired_task_exactly_once() {
    reaper_stress(Executor::pool(2).unwrap(), 2, 25_000);
}

/// A boxed closure task, for tests whose tasks differ.
type Job = Box<dyn FnOnce() + Send>;

/// A job with an id, so that tasks handed back by `cancel` or `shutdown` can be told apart.
struct Tagged(usize, Job);

impl TimerTask for Tagged {
    fn run(self) {
        (self.1)()
    }
}

fn manual_timer<T: TimerTask>(clock: &ManualClock) -> Timer<T> {
    TimerBuilder::new()
        .shards(2)
        .clock(clock.clone())
        .reaper(false)
        .build()
        .unwrap()
}

#[test]
fn a_panicking_task_is_counted_and_the_others_still_run() {
    let clock = ManualClock::new();
    let timer: Timer<Job> = manual_timer(&clock);
    let ran = Arc::new(AtomicUsize::new(0));
    for i in 0..6 {
        let ran = Arc::clone(&ran);
        let job: Job = if i % 3 == 1 {
            Box::new(move || panic!("task {i} panics on purpose"))
        } else {
            Box::new(move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
        };
        timer.add(5 * MS, job).unwrap();
    }
    clock.advance(5 * MS);
    assert_eq!(timer.advance_clock(Duration::ZERO), 6);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        4,
        "the non-panicking tasks all ran"
    );
    let stats = timer.stats();
    assert_eq!((stats.expired, stats.panicked, stats.pending), (6, 2, 0));

    // The timer goes on working.
    let again = Arc::clone(&ran);
    timer
        .add(
            MS,
            Box::new(move || {
                again.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
    clock.advance(MS);
    assert_eq!(timer.advance_clock(Duration::ZERO), 1);
    assert_eq!(ran.load(Ordering::SeqCst), 5);
}

#[test]
fn the_reaper_survives_a_panicking_task() {
    let timer: Timer<Job> = TimerBuilder::new().build().unwrap();
    let (tx, rx) = mpsc::channel();
    timer
        .add(
            Duration::ZERO,
            Box::new(|| panic!("reaper task panics on purpose")),
        )
        .unwrap();
    timer
        .add(
            2 * MS,
            Box::new(move || tx.send("after the panic").unwrap()),
        )
        .unwrap();
    assert_eq!(rx.recv_timeout(PATIENCE), Ok("after the panic"));
    assert!(wait_for(|| timer.stats().panicked == 1));
    assert_eq!(timer.stats().expired, 2);
}

/// Runs `f` on another thread and returns its result, or panics if it takes longer than
/// `PATIENCE` (so a hang fails the test).
fn within_patience<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(PATIENCE)
        .expect("did not finish in time (hang?)")
}

#[test]
fn shutdown_is_prompt_hands_back_pending_tasks_and_refuses_later_adds() {
    let ran = Arc::new(AtomicUsize::new(0));
    let timer: Arc<Timer<Tagged>> = Arc::new(TimerBuilder::new().build().unwrap());
    let mut handles = Vec::new();
    for id in 0..100 {
        let ran = Arc::clone(&ran);
        let delay = if id == 99 {
            Duration::MAX
        } else {
            Duration::from_secs(3_600)
        };
        let job: Job = Box::new(move || {
            ran.fetch_add(1, Ordering::SeqCst);
        });
        handles.push(timer.add(delay, Tagged(id, job)).unwrap());
    }
    // Let the reaper go to sleep until the hour is up.
    thread::sleep(20 * MS);
    assert!(timer.next_expiration().is_some());

    let t = Arc::clone(&timer);
    let back = within_patience(move || t.shutdown());
    let mut ids: Vec<usize> = back.iter().map(|t| t.0).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..100).collect::<Vec<_>>(),
        "every pending task handed back"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "handed back, not run");
    assert!(timer.is_shutdown());
    assert_eq!(timer.len(), 0);
    assert_eq!(timer.next_expiration(), None);
    assert!(
        timer.shutdown().is_empty(),
        "a second shutdown returns nothing"
    );
    for handle in handles {
        assert!(timer.cancel(handle).is_none());
    }

    let job: Job = Box::new(|| panic!("must not run"));
    match timer.add(Duration::ZERO, Tagged(7, job)) {
        Err(AddError::Shutdown(Tagged(id, _))) => assert_eq!(id, 7, "the task comes back"),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("add accepted after shutdown"),
    }
    let job: Job = Box::new(|| panic!("must not run"));
    let err = timer.add_at(Duration::ZERO, Tagged(8, job)).unwrap_err();
    assert!(!err.to_string().is_empty());
    assert_eq!(err.into_task().0, 8);
    assert_eq!(timer.stats().added, 100);
}

#[test]
fn shutdown_wakes_a_driver_blocked_in_advance_clock() {
    let clock = ManualClock::new();
    let timer: Arc<Timer<Job>> = Arc::new(manual_timer(&clock));
    timer
        .add(Duration::from_secs(3_600), Box::new(|| {}))
        .unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let (t, s) = (Arc::clone(&timer), Arc::clone(&started));
    let driver = thread::spawn(move || {
        s.store(true, Ordering::SeqCst);
        // Waits (in real time) for up to an hour unless woken.
        t.advance_clock(Duration::from_secs(3_600))
    });
    assert!(wait_for(|| started.load(Ordering::SeqCst)));
    thread::sleep(20 * MS);
    let t = Arc::clone(&timer);
    let back = within_patience(move || t.shutdown());
    assert_eq!(back.len(), 1);
    let fired = within_patience(move || driver.join().unwrap());
    assert_eq!(fired, 0);
}

#[test]
fn a_stale_handle_cancels_nothing() {
    let clock = ManualClock::new();
    let timer: Timer<Tagged> = TimerBuilder::new()
        .shards(1)
        .clock(clock.clone())
        .reaper(false)
        .build()
        .unwrap();
    let noop = |id| Tagged(id, Box::new(|| {}));

    let fired = timer.add(MS, noop(1)).unwrap();
    clock.advance(MS);
    assert_eq!(timer.advance_clock(Duration::ZERO), 1);
    assert!(!timer.is_pending(fired));
    assert!(timer.cancel(fired).is_none(), "fired handle");

    // The freed slot is reused; the old handle must not reach the new task.
    let second = timer.add(5 * MS, noop(2)).unwrap();
    let third = timer.add(5 * MS, noop(3)).unwrap();
    assert!(
        timer.cancel(fired).is_none(),
        "fired handle after slot reuse"
    );
    assert!(timer.is_pending(second) && timer.is_pending(third));
    assert_eq!(timer.len(), 2);

    assert_eq!(timer.cancel(second).map(|t| t.0), Some(2));
    assert!(timer.cancel(second).is_none(), "cancelled handle");
    // A cancelled slot is freed once 8 more cancels have come after it (the wheel defers
    // the unlink); then, lowest free slot first, the next add takes `second`'s slot.
    for filler in 10..18 {
        let handle = timer.add(5 * MS, noop(filler)).unwrap();
        assert!(timer.cancel(handle).is_some());
    }
    let fourth = timer.add(5 * MS, noop(4)).unwrap();
    assert!(
        timer.cancel(second).is_none(),
        "cancelled handle after slot reuse"
    );
    assert!(timer.cancel(fired).is_none());
    assert!(timer.is_pending(third) && timer.is_pending(fourth));
    assert_eq!(timer.len(), 2);

    clock.advance(5 * MS);
    assert_eq!(timer.advance_clock(Duration::ZERO), 2);
    let stats = timer.stats();
    assert_eq!((stats.added, stats.cancelled, stats.expired), (12, 9, 3));
}

#[test]
fn zero_and_max_delays_are_accepted_on_a_manual_clock() {
    let clock = ManualClock::new();
    let timer: Timer<Job> = manual_timer(&clock);
    let ran = Arc::new(AtomicUsize::new(0));
    let job = |ran: &Arc<AtomicUsize>| -> Job {
        let ran = Arc::clone(ran);
        Box::new(move || {
            ran.fetch_add(1, Ordering::SeqCst);
        })
    };
    clock.advance(Duration::from_millis(7));
    timer.add(Duration::ZERO, job(&ran)).unwrap();
    timer.add_at(Duration::ZERO, job(&ran)).unwrap();
    let max = timer.add(Duration::MAX, job(&ran)).unwrap();
    let max_at = timer.add_at(Duration::MAX, job(&ran)).unwrap();
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "due-now tasks never run on the adder"
    );
    assert_eq!(timer.next_expiration(), Some(Duration::from_millis(7)));
    // Due now: the next advance runs them, without the clock moving.
    assert_eq!(timer.advance_clock(Duration::ZERO), 2);
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    // A century later the far tasks are still pending.
    clock.advance(Duration::from_secs(100 * 365 * 86_400));
    assert_eq!(timer.advance_clock(Duration::ZERO), 0);
    assert!(timer.is_pending(max) && timer.is_pending(max_at));
    assert!(timer.next_expiration().is_some());
    assert!(timer.cancel(max).is_some());
    assert_eq!(timer.shutdown().len(), 1);
}

#[test]
fn zero_and_max_delays_are_accepted_by_the_reaper() {
    let timer: Timer<Job> = TimerBuilder::new().build().unwrap();
    let (tx, rx) = mpsc::channel();
    let max = timer
        .add(Duration::MAX, Box::new(|| panic!("must not run")))
        .unwrap();
    let tx2 = tx.clone();
    timer
        .add(Duration::ZERO, Box::new(move || tx.send("zero").unwrap()))
        .unwrap();
    timer
        .add_at(Duration::ZERO, Box::new(move || tx2.send("past").unwrap()))
        .unwrap();
    let mut got = vec![
        rx.recv_timeout(PATIENCE).unwrap(),
        rx.recv_timeout(PATIENCE).unwrap(),
    ];
    got.sort_unstable();
    assert_eq!(got, ["past", "zero"]);
    assert!(timer.is_pending(max));
    assert_eq!(timer.stats().panicked, 0);
    assert_eq!(timer.shutdown().len(), 1);
}

/// `shutdown` returns only when every task that expired before it has run, on a pool too;
/// a concurrent second call waits for the first.
#[test]
fn shutdown_waits_for_expired_tasks_still_running_on_the_pool() {
    type Task = Box<dyn FnOnce() + Send>;
    let timer: Arc<Timer<Task>> = Arc::new(
        TimerBuilder::new()
            .executor(Executor::pool(1).unwrap())
            .build()
            .unwrap(),
    );
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..100 {
        let ran = Arc::clone(&ran);
        let task: Task = Box::new(move || {
            thread::sleep(Duration::from_millis(2));
            ran.fetch_add(1, Ordering::SeqCst);
        });
        timer.add(Duration::from_millis(1), task).unwrap();
    }
    assert!(wait_for(|| ran.load(Ordering::SeqCst) > 0), "tasks started");
    let second = {
        let timer = Arc::clone(&timer);
        let ran = Arc::clone(&ran);
        thread::spawn(move || {
            let back = timer.shutdown();
            (back.len(), ran.load(Ordering::SeqCst))
        })
    };
    let back = timer.shutdown();
    let ran_when_returned = ran.load(Ordering::SeqCst);
    let (back_second, ran_second) = second.join().unwrap();
    // Every task either ran before shutdown returned or was handed back unrun.
    assert_eq!(ran_when_returned + back.len() + back_second, 100);
    assert_eq!(ran_second + back.len() + back_second, 100);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        ran_when_returned,
        "nothing ran afterwards"
    );
}

/// The shutdown table's row "outside, after a first caller inside a round": a task
/// shuts its own timer down (the first caller, inside a round of 40 slow tasks), then
/// another thread does. That second call returns only after the whole round ran: the
/// first caller could not wait for its own round, the second must.
#[test]
fn an_outside_shutdown_waits_for_the_round_of_an_inside_first_caller() {
    type Task = Box<dyn FnOnce() + Send>;
    for executor in [Executor::Inline, Executor::pool(2).unwrap()] {
        let timer: Arc<Timer<Task>> =
            Arc::new(TimerBuilder::new().executor(executor).build().unwrap());
        let cell: Arc<std::sync::OnceLock<Arc<Timer<Task>>>> = Arc::new(std::sync::OnceLock::new());
        cell.set(Arc::clone(&timer)).ok().unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let inside_returned = Arc::new(AtomicBool::new(false));
        let last_end = Arc::new(std::sync::Mutex::new(None::<Instant>));
        let tasks: Vec<(Duration, Task)> = (0..40)
            .map(|i| {
                let (cell, ran, inside_returned, last_end) = (
                    Arc::clone(&cell),
                    Arc::clone(&ran),
                    Arc::clone(&inside_returned),
                    Arc::clone(&last_end),
                );
                let task: Task = Box::new(move || {
                    if i == 0 {
                        let timer = cell.get().expect("set").clone();
                        assert!(timer.shutdown().is_empty(), "nothing else was pending");
                        inside_returned.store(true, Ordering::SeqCst);
                    }
                    thread::sleep(Duration::from_millis(5));
                    ran.fetch_add(1, Ordering::SeqCst);
                    *last_end.lock().unwrap() = Some(Instant::now());
                });
                (Duration::from_millis(1), task)
            })
            .collect();
        let mut tasks = tasks;
        let mut handles = Vec::new();
        timer.add_batch(&mut tasks, &mut handles);
        assert!(handles.iter().all(Result::is_ok));
        assert!(wait_for(|| inside_returned.load(Ordering::SeqCst)));
        timer.shutdown();
        let returned = Instant::now();
        assert_eq!(
            ran.load(Ordering::SeqCst),
            40,
            "the round was still running"
        );
        assert!(last_end.lock().unwrap().expect("ran") <= returned);
    }
}
