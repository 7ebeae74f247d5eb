//! The shutdown table of `docs/purgatory.md`, one test per row: who calls `shutdown` (or
//! drops the last handle), from where, when that call returns and what has been answered
//! by then.
//!
//! Every operation records when its `on_complete` started and ended. "Answered by then"
//! is checked against the instant the call returned: no `on_complete` of an operation that
//! was pending may start or still run after an outside caller got control back.
//!
//! A hang fails through a bounded wait on another thread instead of hanging the suite.

mod probe;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use probe::{wait_until, within};
use purgatory::{
    Completion, DelayedOperation, Executor, Purgatory, PurgatoryBuilder, TimerBuilder,
};

/// Long enough that only shutdown ends these operations.
const LONG: Duration = Duration::from_secs(600);

/// What every operation of a test shares: the answers, and what callbacks may do.
#[derive(Default)]
struct Log {
    /// `(started, ended)` of every `on_complete`.
    answers: Mutex<Vec<(Instant, Instant)>>,
    answered: AtomicUsize,
    /// The purgatory, for callbacks that shut it down.
    purgatory: OnceLock<Purgatory<u32, Op>>,
    /// While set, a callback that shuts down waits before it does (a test still watching
    /// its operations would otherwise have them refused).
    setting_up: std::sync::atomic::AtomicBool,
    /// When an inside call to `shutdown` returned, and how many answers it saw.
    inside_returned: Mutex<Option<(Instant, usize)>>,
    /// Set when the thread of a `MarkExitThenShutDown` callback has exited.
    driving_thread_exited: Arc<std::sync::atomic::AtomicBool>,
}

impl Log {
    fn answered(&self) -> usize {
        self.answered.load(SeqCst)
    }

    /// The latest end of an `on_complete`.
    fn last_answer_ended(&self) -> Instant {
        self.answers
            .lock()
            .unwrap()
            .iter()
            .map(|&(_, end)| end)
            .max()
            .expect("something was answered")
    }
}

/// What an operation's `on_complete` does besides recording.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnComplete {
    Record,
    /// Sleeps, so a batch of these takes a while.
    Sleep(Duration),
    /// Calls `shutdown` on its purgatory (then records when it returned), then sleeps.
    ShutDownThenSleep(Duration),
    /// Drops the handle it holds (the last one, in the tests that use it).
    DropHandle,
    /// Leaves a mark that sets [`Log::driving_thread_exited`] as its thread exits (after
    /// a pause), then shuts down as `ShutDownThenSleep`.
    MarkExitThenShutDown,
}

/// Sets its flag when the thread that holds it exits, `EXIT_PAUSE` after the exit began.
struct ExitMark(Arc<std::sync::atomic::AtomicBool>);

const EXIT_PAUSE: Duration = Duration::from_millis(100);

impl Drop for ExitMark {
    fn drop(&mut self) {
        std::thread::sleep(EXIT_PAUSE);
        self.0.store(true, SeqCst);
    }
}

thread_local! {
    static EXIT_MARK: std::cell::RefCell<Option<ExitMark>> = const { std::cell::RefCell::new(None) };
}

struct Op {
    timeout: Duration,
    log: Arc<Log>,
    on_complete: OnComplete,
    handle: Option<Purgatory<u32, Op>>,
}

impl Op {
    fn new(timeout: Duration, log: &Arc<Log>, on_complete: OnComplete) -> Self {
        Op {
            timeout,
            log: Arc::clone(log),
            on_complete,
            handle: None,
        }
    }
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn try_complete(&mut self) -> bool {
        false
    }

    fn on_complete(&mut self, how: Completion) {
        assert!(how.is_expiry(), "{how:?}");
        let started = Instant::now();
        match self.on_complete {
            OnComplete::Record => {}
            OnComplete::Sleep(pause) => std::thread::sleep(pause),
            OnComplete::MarkExitThenShutDown => {
                let mark = ExitMark(Arc::clone(&self.log.driving_thread_exited));
                EXIT_MARK.with(|slot| *slot.borrow_mut() = Some(mark));
                self.log.purgatory.get().expect("set").shutdown();
                *self.log.inside_returned.lock().unwrap() =
                    Some((Instant::now(), self.log.answered()));
            }
            OnComplete::ShutDownThenSleep(pause) => {
                let purgatory = self.log.purgatory.get().expect("set before any expiry");
                while self.log.setting_up.load(SeqCst) {
                    std::thread::yield_now();
                }
                purgatory.shutdown();
                *self.log.inside_returned.lock().unwrap() =
                    Some((Instant::now(), self.log.answered()));
                std::thread::sleep(pause);
            }
            OnComplete::DropHandle => drop(self.handle.take()),
        }
        self.log
            .answers
            .lock()
            .unwrap()
            .push((started, Instant::now()));
        self.log.answered.fetch_add(1, SeqCst);
    }
}

fn purgatory(name: &str, executor: Executor) -> Purgatory<u32, Op> {
    PurgatoryBuilder::new()
        .name(name)
        .timer(TimerBuilder::new().executor(executor))
        .build()
        .unwrap()
}

fn executors() -> [(&'static str, Executor); 2] {
    [
        ("inline", Executor::Inline),
        ("pool", Executor::pool(2).unwrap()),
    ]
}

/// Watches `n` operations with `timeout`, in one batch (so short ones expire together).
fn watch_many(
    purgatory: &Purgatory<u32, Op>,
    log: &Arc<Log>,
    n: u32,
    timeout: Duration,
    on_complete: OnComplete,
) {
    let results =
        purgatory.watch_batch((0..n).map(|key| (Op::new(timeout, log, on_complete), [key])));
    assert!(results.iter().all(Result::is_ok));
}

/// A purgatory with 40 operations expiring now, slowly (2 ms an answer, so rounds and pool
/// batches are in progress when the test goes on), and `pending` waiting for shutdown.
fn busy(name: &str, executor: Executor, pending: u32) -> (Arc<Log>, Purgatory<u32, Op>) {
    let log = Arc::new(Log::default());
    let purgatory = purgatory(name, executor);
    let slow = OnComplete::Sleep(Duration::from_millis(2));
    watch_many(&purgatory, &log, 40, Duration::from_millis(1), slow);
    watch_many(&purgatory, &log, pending, LONG, OnComplete::Record);
    assert!(wait_until(Duration::from_secs(10), || log.answered() > 0));
    (log, purgatory)
}

/// Asserts that `answered` operations were answered, every answer before `returned`.
fn assert_answered_before(log: &Log, answered: usize, returned: Instant, what: &str) {
    assert_eq!(log.answered(), answered, "{what}: answered");
    assert!(
        log.last_answer_ended() <= returned,
        "{what}: an answer ran after the call returned"
    );
}

/// Row "outside, first": returns once the reaper is joined, every round and pool batch in
/// progress has finished and every pending operation was expired on the calling thread.
#[test]
fn outside_first_returns_after_every_pending_operation_was_answered() {
    for (name, executor) in executors() {
        let (log, purgatory) = busy("outside-first", executor, 100);
        let shut = purgatory.clone();
        within(Duration::from_secs(10), "shutdown", move || shut.shutdown());
        assert_answered_before(&log, 140, Instant::now(), name);
        assert_eq!(purgatory.stats().pending, 0, "{name}");
    }
}

/// Row "outside, while another shutdown runs": returns only when the first caller's work
/// and every round and pool batch are done.
#[test]
fn outside_while_another_runs_waits_for_it() {
    for (name, executor) in executors() {
        let (log, purgatory) = busy("outside-twice", executor, 5_000);
        let barrier = Arc::new(std::sync::Barrier::new(3));
        let callers: Vec<_> = (0..3)
            .map(|_| {
                let (purgatory, barrier) = (purgatory.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    purgatory.shutdown();
                    Instant::now()
                })
            })
            .collect();
        for caller in callers {
            assert_answered_before(&log, 5_040, caller.join().unwrap(), name);
        }
    }
}

/// Row "inside a reaper round or a pool batch, first": a callback's `shutdown` closes
/// the purgatory and expires every pending operation before it returns; it cannot wait
/// for its own round, whose rest is answered after it returns.
#[test]
fn inside_first_expires_the_pending_before_it_returns() {
    for (name, executor) in executors() {
        let log = Arc::new(Log::default());
        let purgatory = purgatory("inside-first", executor);
        log.purgatory.set(purgatory.clone()).ok().unwrap();
        watch_many(&purgatory, &log, 100, LONG, OnComplete::Record);
        watch_many(
            &purgatory,
            &log,
            1,
            Duration::from_millis(1),
            OnComplete::ShutDownThenSleep(Duration::ZERO),
        );
        assert!(
            wait_until(Duration::from_secs(10), || log.answered() == 101),
            "{name}: the callback's shutdown answered everything"
        );
        let (_, seen) = log
            .inside_returned
            .lock()
            .unwrap()
            .expect("the callback shut down");
        assert_eq!(
            seen, 100,
            "{name}: every pending operation was answered when it returned"
        );
        assert!(purgatory.is_shutdown());
    }
}

/// Rows "outside" and "inside, first" at once: an expiry callback shuts down (the first
/// caller, inside a round of 40 slow answers) and then an outside caller does. The
/// outside call returns only after the inside caller's round has answered all 40.
#[test]
fn outside_after_an_inside_first_waits_for_its_round() {
    for (name, executor) in executors() {
        let log = Arc::new(Log::default());
        let purgatory = purgatory("outside-and-inside", executor);
        log.purgatory.set(purgatory.clone()).ok().unwrap();
        // One batch of 40 (one bucket): the first to be answered shuts down.
        let ops: Vec<_> = (0..40u32)
            .map(|key| {
                let on_complete = if key == 0 {
                    OnComplete::ShutDownThenSleep(Duration::from_millis(5))
                } else {
                    OnComplete::Sleep(Duration::from_millis(5))
                };
                (Op::new(Duration::from_millis(1), &log, on_complete), [key])
            })
            .collect();
        assert!(purgatory.watch_batch(ops).iter().all(Result::is_ok));
        assert!(wait_until(Duration::from_secs(10), || {
            log.inside_returned.lock().unwrap().is_some()
        }));
        let shut = purgatory.clone();
        within(Duration::from_secs(10), "outside shutdown", move || {
            shut.shutdown()
        });
        assert_answered_before(&log, 40, Instant::now(), name);
    }
}

/// Rows "inside, first" then "outside": the outside call joins the driving thread the
/// inside caller (a callback on it) could not join. Before, it returned while that thread
/// was still exiting (its exit here takes `EXIT_PAUSE`).
#[test]
fn outside_after_an_inside_first_joins_the_driving_thread_it_left() {
    let log = Arc::new(Log::default());
    let purgatory = purgatory("joins-what-inside-left", Executor::Inline);
    log.purgatory.set(purgatory.clone()).ok().unwrap();
    let op = Op::new(
        Duration::from_millis(1),
        &log,
        OnComplete::MarkExitThenShutDown,
    );
    assert!(purgatory.try_complete_else_watch(op, [0]).is_ok());
    assert!(wait_until(Duration::from_secs(10), || {
        log.inside_returned.lock().unwrap().is_some()
    }));
    let shut = purgatory.clone();
    within(Duration::from_secs(10), "outside shutdown", move || {
        shut.shutdown()
    });
    assert!(
        log.driving_thread_exited.load(SeqCst),
        "the outside shutdown returned before the thread the inside one left had exited"
    );
}

/// Row "inside shutdown's own expiry of the pending": a callback that shutdown runs calls
/// `shutdown` again. It returns at once (the outer call is its caller, up the stack), and
/// the outer call returns once everything is answered.
#[test]
fn inside_shutdowns_own_expiry_returns_at_once() {
    for (name, executor) in executors() {
        let log = Arc::new(Log::default());
        let purgatory = purgatory("nested", executor);
        log.purgatory.set(purgatory.clone()).ok().unwrap();
        watch_many(
            &purgatory,
            &log,
            4,
            LONG,
            OnComplete::ShutDownThenSleep(Duration::ZERO),
        );
        watch_many(&purgatory, &log, 100, LONG, OnComplete::Record);
        let shut = purgatory.clone();
        within(Duration::from_secs(10), "shutdown", move || shut.shutdown());
        assert_answered_before(&log, 104, Instant::now(), name);
    }
}

/// Row "last handle dropped outside": as an outside shutdown.
#[test]
fn last_handle_dropped_outside_answers_everything_before_the_drop_returns() {
    for (name, executor) in executors() {
        let (log, purgatory) = busy("dropped-outside", executor, 100);
        within(Duration::from_secs(10), "drop", move || drop(purgatory));
        assert_answered_before(&log, 140, Instant::now(), name);
    }
}

/// Row "last handle dropped inside a round or a pool batch": the only handle left is held
/// by an operation whose `on_complete` drops it. That drop shuts the purgatory down from
/// inside: every pending operation is answered, nothing hangs.
#[test]
fn last_handle_dropped_inside_a_callback_answers_everything() {
    for (name, executor) in executors() {
        let log = Arc::new(Log::default());
        let purgatory = purgatory("dropped-inside", executor);
        watch_many(&purgatory, &log, 100, LONG, OnComplete::Record);
        let mut holder = Op::new(Duration::from_millis(1), &log, OnComplete::DropHandle);
        holder.handle = Some(purgatory.clone());
        assert!(!purgatory.try_complete_else_watch(holder, [7]).unwrap());
        drop(purgatory);
        assert!(
            wait_until(Duration::from_secs(10), || log.answered() == 101),
            "{name}: {} of 101 answered",
            log.answered()
        );
    }
}

/// Several at once: three outside callers, callbacks inside rounds shutting down, and a
/// drop of the caller's handles, all together. Every outside call returns after the last
/// answer; nothing hangs.
#[test]
fn several_at_once_each_return_after_the_last_answer() {
    for (name, executor) in executors() {
        for round in 0..5 {
            let log = Arc::new(Log::default());
            let purgatory = purgatory("several", executor.clone());
            log.purgatory.set(purgatory.clone()).ok().unwrap();
            log.setting_up.store(true, SeqCst);
            watch_many(
                &purgatory,
                &log,
                30,
                Duration::from_millis(1),
                OnComplete::ShutDownThenSleep(Duration::from_millis(1)),
            );
            watch_many(
                &purgatory,
                &log,
                30,
                Duration::from_millis(1),
                OnComplete::Sleep(Duration::from_millis(1)),
            );
            watch_many(&purgatory, &log, 1_000, LONG, OnComplete::Record);
            log.setting_up.store(false, SeqCst);
            let callers: Vec<_> = (0..3)
                .map(|i| {
                    let purgatory = purgatory.clone();
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_micros(700 * i + round * 100));
                        purgatory.shutdown();
                        drop(purgatory);
                        Instant::now()
                    })
                })
                .collect();
            drop(purgatory);
            let returns: Vec<Instant> = within(Duration::from_secs(20), "the callers", move || {
                callers.into_iter().map(|c| c.join().unwrap()).collect()
            });
            for returned in returns {
                assert_answered_before(&log, 1_060, returned, &format!("{name}, round {round}"));
            }
        }
    }
}
