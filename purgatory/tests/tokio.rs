//! The tokio face (cargo feature `tokio`): callbacks run in the runtime's context on every
//! path, the parked future (its answer, its cancel, the race of the two), the shutdown
//! and last drop that do not block a worker, and the clock that follows tokio's.
//!
//! Every contract test runs on a current-thread and a multi-thread runtime.
#![cfg(feature = "tokio")]

mod probe;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::Duration;

use probe::DropBomb;
use purgatory::{
    Completion, DelayedOperation, Executor, Parked, Purgatory, PurgatoryBuilder, Reply,
    TimerBuilder, WatchOutcome,
};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

/// Long enough never to be reached by a passing test.
const PATIENCE: Duration = Duration::from_secs(20);

fn runtimes() -> [(&'static str, Runtime); 2] {
    [
        (
            "current-thread",
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        ),
        (
            "multi-thread",
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
        ),
    ]
}

/// Answers through a task it spawns from `on_complete` (which panics outside a runtime's
/// context), so an answer that arrives proves the callback had the context.
struct Spawns {
    id: u32,
    ready: Arc<AtomicBool>,
    timeout: Duration,
    answers: mpsc::UnboundedSender<(u32, Completion)>,
}

impl DelayedOperation for Spawns {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
    fn on_complete(&mut self, how: Completion) {
        let answers = self.answers.clone();
        let id = self.id;
        tokio::spawn(async move {
            let _ = answers.send((id, how));
        });
    }
}

struct Fixture {
    answers: mpsc::UnboundedReceiver<(u32, Completion)>,
    sender: mpsc::UnboundedSender<(u32, Completion)>,
    ready: Arc<AtomicBool>,
}

impl Fixture {
    fn new() -> Self {
        let (sender, answers) = mpsc::unbounded_channel();
        Fixture {
            answers,
            sender,
            ready: Arc::new(AtomicBool::new(false)),
        }
    }

    fn op(&self, id: u32, timeout: Duration) -> Spawns {
        Spawns {
            id,
            ready: Arc::clone(&self.ready),
            timeout,
            answers: self.sender.clone(),
        }
    }

    async fn answer(&mut self, what: &str) -> (u32, Completion) {
        tokio::time::timeout(PATIENCE, self.answers.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer (did on_complete lack the runtime?)"))
            .expect("senders live")
    }
}

fn pending<O: DelayedOperation>(outcome: WatchOutcome<O>) -> purgatory::OperationHandle<O> {
    match outcome {
        WatchOutcome::Pending(handle) => handle,
        WatchOutcome::Completed => panic!("expected a waiting operation"),
    }
}

/// Every path of the contract on one runtime: an event and a force from a task and from
/// a plain thread, an expiry on the reaper and on a pool, a shutdown from a plain thread,
/// the drop of the last handle on a plain thread.
#[test]
fn every_callback_path_runs_in_the_runtimes_context() {
    for (flavour, runtime) in runtimes() {
        runtime.block_on(async {
            let mut f = Fixture::new();
            let p: Purgatory<u32, Spawns> = Purgatory::new(flavour);
            let long = Duration::from_secs(3600);

            // An event from a task, then from a plain thread.
            p.try_complete_else_watch(f.op(1, long), [1]).unwrap();
            f.ready.store(true, Ordering::Release);
            assert_eq!(p.check_and_complete(&1), 1);
            assert_eq!(f.answer("event in a task").await, (1, Completion::Ready));
            f.ready.store(false, Ordering::Release);
            p.try_complete_else_watch(f.op(2, long), [2]).unwrap();
            f.ready.store(true, Ordering::Release);
            let outside = p.clone();
            std::thread::spawn(move || outside.check_and_complete(&2))
                .join()
                .unwrap();
            assert_eq!(
                f.answer("event on a plain thread").await,
                (2, Completion::Ready)
            );
            f.ready.store(false, Ordering::Release);

            // On the watch itself, from a plain thread.
            f.ready.store(true, Ordering::Release);
            let (outside, op) = (p.clone(), f.op(3, long));
            std::thread::spawn(move || outside.watch(op, [3]).map(|_| ()).ok())
                .join()
                .unwrap();
            assert_eq!(
                f.answer("watch on a plain thread").await,
                (3, Completion::Ready)
            );
            f.ready.store(false, Ordering::Release);

            // A force from a plain thread.
            let handle = pending(p.watch(f.op(4, long), [4]).unwrap());
            let outside = p.clone();
            assert!(std::thread::spawn(move || outside.force_complete(&handle))
                .join()
                .unwrap());
            assert_eq!(f.answer("force").await, (4, Completion::Forced));

            // An expiry on the reaper thread.
            p.try_complete_else_watch(f.op(5, Duration::from_millis(5)), [5])
                .unwrap();
            assert_eq!(
                f.answer("expiry on the reaper").await,
                (5, Completion::Expired)
            );

            // A shutdown from a plain thread.
            p.try_complete_else_watch(f.op(6, long), [6]).unwrap();
            let outside = p.clone();
            std::thread::spawn(move || outside.shutdown())
                .join()
                .unwrap();
            assert_eq!(f.answer("shutdown").await, (6, Completion::Shutdown));
            assert_eq!(p.stats().panicked, 0, "{flavour}");

            // An expiry on a pool thread, and the last handle dropped on a plain thread.
            let pooled: Purgatory<u32, Spawns> = PurgatoryBuilder::new()
                .timer(TimerBuilder::new().executor(Executor::pool(1).unwrap()))
                .build()
                .unwrap();
            pooled
                .try_complete_else_watch(f.op(7, Duration::from_millis(5)), [7])
                .unwrap();
            assert_eq!(f.answer("expiry on a pool").await, (7, Completion::Expired));
            pooled.try_complete_else_watch(f.op(8, long), [8]).unwrap();
            std::thread::spawn(move || drop(pooled)).join().unwrap();
            assert_eq!(f.answer("last drop").await, (8, Completion::Shutdown));
        });
    }
}

/// A purgatory built outside any runtime, given a handle: the contract holds for it.
#[test]
fn a_named_runtime_is_used_by_a_purgatory_built_outside_it() {
    for (flavour, runtime) in runtimes() {
        let mut f = Fixture::new();
        let p: Purgatory<u32, Spawns> = PurgatoryBuilder::new()
            .name(flavour)
            .runtime(runtime.handle().clone())
            .build()
            .unwrap();
        p.try_complete_else_watch(f.op(1, Duration::from_millis(5)), [1])
            .unwrap();
        let answered = runtime.block_on(f.answer("expiry"));
        assert_eq!(answered, (1, Completion::Expired));
        // Without a runtime at build, none is entered: the spawn panics, caught.
        let bare: Purgatory<u32, Spawns> = Purgatory::new("bare");
        bare.try_complete_else_watch(f.op(2, Duration::from_secs(60)), [2])
            .ok();
        bare.shutdown();
        assert_eq!(
            bare.stats().panicked,
            1,
            "{flavour}: callbacks had no runtime"
        );
    }
}

/// Collects the purgatory's warnings (target `purgatory`, level WARN) made on the threads
/// where it is the default subscriber, each as its fields written out.
#[derive(Clone, Default)]
struct Warnings(Arc<std::sync::Mutex<Vec<String>>>);

impl Warnings {
    /// Runs `f` with this as the thread's subscriber; returns what `f` returned and the
    /// warnings made meanwhile.
    fn during<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
        let warnings = Warnings::default();
        let out = tracing::subscriber::with_default(warnings.clone(), f);
        let seen = std::mem::take(&mut *warnings.0.lock().unwrap());
        (out, seen)
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "purgatory" && *metadata.level() == tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0 += &format!("{}={value:?} ", field.name());
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A purgatory built outside any runtime and given none says so: one warning at build,
/// naming the fix, and `runtime()` is `None`. One built inside a runtime, or given one,
/// has it, and builds without a warning.
#[test]
fn a_purgatory_built_without_a_runtime_warns_and_has_none() {
    let (bare, warned) = Warnings::during(|| Purgatory::<u32, Spawns>::new("bare"));
    assert!(bare.runtime().is_none());
    assert_eq!(warned.len(), 1, "{warned:?}");
    for hint in [
        "purgatory=bare",
        "build it inside the runtime",
        "PurgatoryBuilder::runtime(handle)",
    ] {
        assert!(warned[0].contains(hint), "{hint:?} not in {warned:?}");
    }
    for (flavour, runtime) in runtimes() {
        let (inside, warned) =
            Warnings::during(|| runtime.block_on(async { Purgatory::<u32, Spawns>::new(flavour) }));
        assert!(inside.runtime().is_some(), "{flavour}");
        assert_eq!(warned, Vec::<String>::new(), "{flavour}");
        let (given, warned) = Warnings::during(|| {
            Purgatory::<u32, Spawns>::builder()
                .runtime(runtime.handle().clone())
                .build()
                .unwrap()
        });
        assert!(given.runtime().is_some(), "{flavour}");
        assert_eq!(warned, Vec::<String>::new(), "{flavour}");
    }
}

/// An operation answering through a [`Reply`].
struct Fetch {
    ready: Arc<AtomicBool>,
    timeout: Duration,
    reply: Reply<u32>,
    completions: Arc<AtomicU64>,
}

impl DelayedOperation for Fetch {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
    fn on_complete(&mut self, how: Completion) {
        self.completions.fetch_add(1, Ordering::Relaxed);
        self.reply.send(how, 42);
    }
}

/// What `park_with` builds a fetch with: one waiting up to `timeout` for `ready`.
fn fetch(ready: &Arc<AtomicBool>, timeout: Duration) -> impl FnOnce(Reply<u32>) -> Fetch {
    fetch_counted(ready, timeout, &Arc::new(AtomicU64::new(0)))
}

/// [`fetch`], counting its `on_complete`s in `completions`.
fn fetch_counted(
    ready: &Arc<AtomicBool>,
    timeout: Duration,
    completions: &Arc<AtomicU64>,
) -> impl FnOnce(Reply<u32>) -> Fetch {
    let (ready, completions) = (Arc::clone(ready), Arc::clone(completions));
    move |reply| Fetch {
        ready,
        timeout,
        reply,
        completions,
    }
}

#[test]
fn a_parked_operation_is_awaited_to_its_answer_on_every_outcome() {
    for (flavour, runtime) in runtimes() {
        runtime.block_on(async {
            let p: Purgatory<u32, Fetch> = Purgatory::new(flavour);
            let ready = Arc::new(AtomicBool::new(false));

            // Ready on an event.
            let parked = p
                .park_with([1], fetch(&ready, Duration::from_secs(60)))
                .unwrap();
            assert!(parked.handle().is_some());
            ready.store(true, Ordering::Release);
            p.check_and_complete(&1);
            let answered = parked.await.unwrap();
            assert_eq!((answered.how, answered.answer), (Completion::Ready, 42));

            // Ready at once: settled, nothing to cancel.
            let parked = p
                .park_with([1], fetch(&ready, Duration::from_secs(60)))
                .unwrap();
            assert!(parked.handle().is_none());
            assert_eq!(parked.await.unwrap().how, Completion::Ready);
            ready.store(false, Ordering::Release);

            // Expired on the reaper.
            let parked = p
                .park_with([1], fetch(&ready, Duration::from_millis(5)))
                .unwrap();
            assert_eq!(parked.await.unwrap().how, Completion::Expired);

            // Forced.
            let parked = p
                .park_with([1], fetch(&ready, Duration::from_secs(60)))
                .unwrap();
            assert!(p.force_complete(&parked.handle().unwrap()));
            assert_eq!(parked.await.unwrap().how, Completion::Forced);

            // Handed back by cancel_for_key and dropped: unanswered.
            let parked = p
                .park_with([9], fetch(&ready, Duration::from_secs(60)))
                .unwrap();
            drop(p.cancel_for_key(&9));
            assert_eq!(parked.await, Err(purgatory::Unanswered));

            // Refused after shutdown: the operation and the answer come back; the caller
            // answers through the operation's reply and awaits as usual.
            p.shutdown();
            let refused = p
                .park_with([1], fetch(&ready, Duration::from_secs(60)))
                .expect_err("shut down");
            assert_eq!(refused.kind(), purgatory::WatchErrorKind::Shutdown);
            let (error, answer) = refused.into_parts();
            let mut op = error.into_operation();
            op.on_complete(Completion::Shutdown);
            let answered = Parked::<u32, Fetch, u32>::settled(answer).await.unwrap();
            assert_eq!((answered.how, answered.answer), (Completion::Shutdown, 42));
        });
    }
}

/// `make` runs before anything is watched: its panic reaches the caller and leaves
/// nothing behind. The deprecated `park` with its own `reply()` pair still works.
#[test]
fn park_with_pairs_the_operation_and_a_panic_in_make_watches_nothing() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let p: Purgatory<u32, Fetch> = Purgatory::new("park_with");
        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.park_with([1], |_reply: Reply<u32>| -> Fetch { panic!("make panics") })
        }));
        assert!(made.is_err());
        let stats = p.stats();
        assert_eq!((stats.pending, stats.watched, stats.panicked), (0, 0, 0));

        let ready = Arc::new(AtomicBool::new(false));
        #[allow(deprecated)]
        let parked = {
            let (reply, answer) = purgatory::reply();
            p.park(fetch(&ready, Duration::from_millis(5))(reply), [1], answer)
                .unwrap()
        };
        assert_eq!(parked.await.unwrap().how, Completion::Expired);
    });
}

#[test]
fn dropping_or_cancelling_a_parked_operation_takes_it_back_without_callbacks() {
    for (flavour, runtime) in runtimes() {
        runtime.block_on(async {
            let p: Purgatory<u32, Fetch> = Purgatory::new(flavour);
            let ready = Arc::new(AtomicBool::new(false));
            let completions = Arc::new(AtomicU64::new(0));
            let parked = p
                .park_with(
                    [1],
                    fetch_counted(&ready, Duration::from_secs(60), &completions),
                )
                .unwrap();
            let handle = parked.handle().unwrap();
            drop(parked);
            assert!(p.is_completed(&handle));
            assert_eq!(p.stats().cancelled, 1);
            assert_eq!(completions.load(Ordering::Relaxed), 0);

            let mut parked = p
                .park_with([1], fetch(&ready, Duration::from_secs(60)))
                .unwrap();
            let back = parked.try_cancel().expect("it waited");
            assert_eq!(back.completions.load(Ordering::Relaxed), 0);
            assert_eq!(p.stats().cancelled, 2);
            drop(back);
            assert_eq!(parked.await, Err(purgatory::Unanswered));

            // Detached: its drop cancels nothing; the answer still comes.
            let detached = p
                .park_with([1], fetch(&ready, Duration::from_millis(5)))
                .unwrap()
                .detach();
            assert_eq!(detached.await.unwrap().how, Completion::Expired);
            assert_eq!(p.stats().cancelled, 2);
        });
    }
}

/// A parked future dropped (or `try_cancel`led) while another thread forces its
/// operation: every operation ends exactly one way, its callback ran or it was
/// cancelled, never both, never neither, and an answer that won the race is delivered to
/// `try_cancel`'s caller.
#[test]
fn a_cancel_racing_a_completion_ends_each_operation_exactly_once() {
    const ROUNDS: u64 = 4_000;
    for (flavour, runtime) in runtimes() {
        runtime.block_on(async {
            let p: Purgatory<u32, Fetch> = Purgatory::new(flavour);
            let ready = Arc::new(AtomicBool::new(false));
            let completions = Arc::new(AtomicU64::new(0));
            let (handles, forced) = std_mpsc::channel();
            let forcer = {
                let p = p.clone();
                std::thread::spawn(move || {
                    for handle in forced {
                        p.force_complete(&handle);
                    }
                })
            };
            let (mut answered_after_try, mut taken_back) = (0, 0);
            for round in 0..ROUNDS {
                let op = fetch_counted(&ready, Duration::from_secs(60), &completions);
                let mut parked = p.park_with([round as u32 % 64], op).unwrap();
                handles.send(parked.handle().unwrap()).unwrap();
                if round % 2 == 0 {
                    tokio::task::yield_now().await;
                    drop(parked);
                } else {
                    match parked.try_cancel() {
                        Some(_) => taken_back += 1,
                        None => {
                            let answered = parked.await.expect("the force answered");
                            assert_eq!(answered.how, Completion::Forced);
                            answered_after_try += 1;
                        }
                    }
                }
            }
            drop(handles);
            forcer.join().unwrap();
            let stats = p.stats();
            let ran = completions.load(Ordering::Relaxed);
            assert_eq!(ran, stats.forced, "{flavour}");
            assert_eq!(
                stats.forced + stats.cancelled,
                ROUNDS,
                "{flavour}: {stats:?}"
            );
            assert_eq!(taken_back + answered_after_try, ROUNDS / 2, "{flavour}");
            assert_eq!(stats.pending, 0);
        });
    }
}

/// The answer without awaiting: `try_answer` while it waits and once it came, and
/// `blocking_answer` from a plain thread.
#[test]
fn a_parked_answer_is_read_without_awaiting_too() {
    let p: Purgatory<u32, Fetch> = Purgatory::new("sync");
    let ready = Arc::new(AtomicBool::new(false));
    let mut parked = p
        .park_with([1], fetch(&ready, Duration::from_secs(60)))
        .unwrap();
    assert!(parked.try_answer().is_none(), "it waits");
    let handle = parked.handle().unwrap();
    assert!(p.force_complete(&handle));
    assert_eq!(
        parked.try_answer().unwrap().unwrap().how,
        Completion::Forced
    );
    assert!(parked.handle().is_none(), "settled");
    drop(parked);
    assert_eq!(p.stats().cancelled, 0);

    let parked = p
        .park_with([1], fetch(&ready, Duration::from_millis(5)))
        .unwrap();
    let answered = std::thread::spawn(move || parked.blocking_answer())
        .join()
        .unwrap();
    assert_eq!(answered.unwrap().how, Completion::Expired);
}

/// Blocks in `on_complete` until released (or `PATIENCE` passes), and records which.
struct Blocks {
    release: Arc<std::sync::Mutex<std_mpsc::Receiver<()>>>,
    released: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
}

impl DelayedOperation for Blocks {
    fn timeout(&self) -> Duration {
        Duration::from_secs(3600)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {
        let got = self.release.lock().unwrap().recv_timeout(PATIENCE).is_ok();
        if got {
            self.released.fetch_add(1, Ordering::Relaxed);
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
    }
}

/// The last handle dropped in a task, and `shutdown_async`, leave the worker free: the
/// test releases the blocked callbacks only after the drop (or from another task while
/// the shutdown is awaited); had either blocked the thread, the callbacks would have
/// timed out unreleased.
#[test]
fn the_last_drop_and_shutdown_async_do_not_block_the_worker() {
    for (flavour, runtime) in runtimes() {
        for use_async_shutdown in [false, true] {
            let (release, releases) = std_mpsc::channel();
            let releases = Arc::new(std::sync::Mutex::new(releases));
            let released = Arc::new(AtomicU64::new(0));
            let answered = Arc::new(AtomicU64::new(0));
            const OPS: u64 = 3;
            runtime.block_on(async {
                let p: Purgatory<u32, Blocks> = Purgatory::new(flavour);
                for key in 0..OPS as u32 {
                    let op = Blocks {
                        release: Arc::clone(&releases),
                        released: Arc::clone(&released),
                        answered: Arc::clone(&answered),
                    };
                    p.try_complete_else_watch(op, [key]).unwrap();
                }
                if use_async_shutdown {
                    // Another task on this runtime releases the callbacks: it runs only if
                    // the shutdown leaves the (current-thread) worker free.
                    let release = release.clone();
                    tokio::spawn(async move {
                        for _ in 0..OPS {
                            release.send(()).unwrap();
                        }
                    });
                    p.shutdown_async().await;
                    assert_eq!(answered.load(Ordering::Relaxed), OPS, "{flavour}");
                } else {
                    drop(p); // returns at once; the shutdown runs on the blocking pool
                    for _ in 0..OPS {
                        release.send(()).unwrap();
                    }
                    let deadline = tokio::time::Instant::now() + PATIENCE;
                    while answered.load(Ordering::Relaxed) < OPS {
                        assert!(tokio::time::Instant::now() < deadline, "never answered");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            });
            assert_eq!(
                released.load(Ordering::Relaxed),
                OPS,
                "{flavour}, async shutdown {use_async_shutdown}: a callback waited in vain"
            );
        }
    }
}

/// Outside any runtime there is no pool to move the last drop to: it shuts down inline,
/// and every operation was answered when it returns.
#[test]
fn a_last_drop_outside_any_runtime_shuts_down_inline() {
    let answered = Arc::new(AtomicU64::new(0));
    let (release, releases) = std_mpsc::channel();
    release.send(()).unwrap();
    let p: Purgatory<u32, Blocks> = Purgatory::new("inline");
    p.try_complete_else_watch(
        Blocks {
            release: Arc::new(std::sync::Mutex::new(releases)),
            released: Arc::new(AtomicU64::new(0)),
            answered: Arc::clone(&answered),
        },
        [1],
    )
    .unwrap();
    drop(p);
    assert_eq!(
        answered.load(Ordering::Relaxed),
        1,
        "answered before the drop returned"
    );
}

/// Paused time: the purgatory's clock is tokio's, and auto-advance goes straight to the
/// next expiry.
#[tokio::test(start_paused = true)]
async fn paused_time_auto_advances_to_an_expiry() {
    let p: Purgatory<u32, Fetch> = PurgatoryBuilder::new().follow_tokio_time().build().unwrap();
    let ready = Arc::new(AtomicBool::new(false));
    let start = tokio::time::Instant::now();
    let parked = p
        .park_with([1], fetch(&ready, Duration::from_secs(30)))
        .unwrap();
    assert_eq!(parked.await.unwrap().how, Completion::Expired);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited <= Duration::from_millis(30_002),
        "{waited:?}"
    );

    // A task sleeping an hour: the expiry comes at 10 s of it.
    let parked = p
        .park_with([1], fetch(&ready, Duration::from_secs(10)))
        .unwrap();
    let start = tokio::time::Instant::now();
    let expired_at = tokio::spawn(async move {
        parked.await.unwrap();
        tokio::time::Instant::now()
    });
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let at = expired_at.await.unwrap() - start;
    assert!(
        at >= Duration::from_secs(10) && at <= Duration::from_millis(10_002),
        "{at:?}"
    );
}

/// A reset to an earlier deadline wakes the task that drives the timer (it sleeps toward
/// the old deadline, at most `REAPER_WAIT`, 200 ms): the parked fetch expires at the new
/// deadline, 10 ms after the reset, not at the driver's next look.
#[tokio::test(start_paused = true)]
async fn paused_time_a_reset_to_an_earlier_deadline_wakes_the_driving_task() {
    let p: Purgatory<u32, Fetch> = PurgatoryBuilder::new().follow_tokio_time().build().unwrap();
    let ready = Arc::new(AtomicBool::new(false));
    let parked = p
        .park_with([1], fetch(&ready, Duration::from_secs(3_600)))
        .unwrap();
    let handle = parked.handle().unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let start = tokio::time::Instant::now();
    assert!(p.reset_timeout(&handle, Duration::from_millis(10)));
    let expired_at = tokio::spawn(async move {
        parked.await.unwrap();
        tokio::time::Instant::now()
    });
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    let at = expired_at.await.unwrap() - start;
    assert!(
        at >= Duration::from_millis(10) && at <= Duration::from_millis(12),
        "{at:?}"
    );
    p.shutdown_async().await;
}

#[tokio::test(start_paused = true)]
async fn paused_time_moves_with_advance() {
    let p: Purgatory<u32, Fetch> = PurgatoryBuilder::new().follow_tokio_time().build().unwrap();
    let ready = Arc::new(AtomicBool::new(false));
    let mut parked = p
        .park_with([1], fetch(&ready, Duration::from_secs(10)))
        .unwrap();
    let handle = parked.handle().unwrap();
    tokio::time::advance(Duration::from_secs(9)).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!p.is_completed(&handle), "9 s of a 10 s timeout");
    assert!(futures_poll_once(&mut parked).is_none());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(parked.await.unwrap().how, Completion::Expired);
    // A shutdown ends the driving task; nothing is left waiting.
    p.shutdown_async().await;
    assert!(p.is_shutdown());
}

#[test]
fn following_tokio_time_needs_a_runtime() {
    let built = PurgatoryBuilder::<u32, Fetch>::new()
        .follow_tokio_time()
        .build();
    assert!(matches!(built, Err(purgatory::BuildError::NoRuntime)));
}

/// Polls `future` once with a no-op waker.
fn futures_poll_once<F: std::future::Future + Unpin>(future: &mut F) -> Option<F::Output> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    match std::pin::Pin::new(future).poll(&mut cx) {
        std::task::Poll::Ready(out) => Some(out),
        std::task::Poll::Pending => None,
    }
}

/// A runtime built without its time driver cannot drive a purgatory on tokio's time:
/// refused at build, not a driving task that panics at its first wait.
#[test]
fn following_tokio_time_needs_the_runtimes_time_driver() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let built = Purgatory::<u32, Fetch>::builder()
        .runtime(runtime.handle().clone())
        .follow_tokio_time()
        .build();
    assert!(matches!(built, Err(purgatory::BuildError::NoRuntime)));
}

/// When the runtime goes, a purgatory on its time shuts down with it: what was pending is
/// answered (expired), later watches are refused, nothing waits for a time that no
/// longer passes.
#[test]
fn a_purgatory_on_tokio_time_shuts_down_with_its_runtime() {
    for (flavour, runtime) in runtimes() {
        let p: Purgatory<u32, Fetch> = runtime
            .block_on(async { PurgatoryBuilder::new().follow_tokio_time().build().unwrap() });
        let ready = Arc::new(AtomicBool::new(false));
        let parked = p
            .park_with([1], fetch(&ready, Duration::from_secs(3600)))
            .unwrap();
        drop(runtime);
        assert!(p.is_shutdown(), "{flavour}");
        assert_eq!(p.stats().expired_at_shutdown, 1, "{flavour}");
        assert_eq!(parked.blocking_answer().unwrap().how, Completion::Shutdown);
        assert!(
            p.park_with([1], fetch(&ready, Duration::from_secs(1)))
                .is_err(),
            "{flavour}: refused"
        );
    }
}

/// `blocking_answer` on a runtime's thread panics, and the unwinding drops the `Parked`,
/// which cancels its operation as any drop does.
#[test]
fn blocking_answer_on_a_runtime_thread_panics_and_still_cancels() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let p: Purgatory<u32, Fetch> = runtime.block_on(async { Purgatory::new("blocking") });
    let ready = Arc::new(AtomicBool::new(false));
    let parked = p
        .park_with([1], fetch(&ready, Duration::from_secs(3600)))
        .unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(async move { parked.blocking_answer() })
    }));
    assert!(panicked.is_err());
    let stats = p.stats();
    assert_eq!((stats.cancelled, stats.pending), (1, 0), "{stats:?}");
}

/// Counts the drops that saw a runtime's context.
struct DropsInContext {
    in_context: Arc<AtomicU64>,
    reply: Reply<()>,
}

impl DelayedOperation for DropsInContext {
    fn timeout(&self) -> Duration {
        Duration::from_secs(3600)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, how: Completion) {
        self.reply.send(how, ());
    }
}

impl Drop for DropsInContext {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            self.in_context.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A `Parked` (or a `CancelOnDrop` guard) dropped on a plain thread drops its cancelled
/// operation in the purgatory's runtime, as every other path does.
#[test]
fn a_cancelled_operation_is_dropped_in_the_runtimes_context() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let p: Purgatory<u32, DropsInContext> = PurgatoryBuilder::new()
        .runtime(runtime.handle().clone())
        .build()
        .unwrap();
    let in_context = Arc::new(AtomicU64::new(0));
    let parked = p
        .park_with([1], |reply| DropsInContext {
            in_context: Arc::clone(&in_context),
            reply,
        })
        .unwrap();
    std::thread::spawn(move || drop(parked)).join().unwrap();
    let (reply_to, _answer) = Reply::channel();
    let op = DropsInContext {
        in_context: Arc::clone(&in_context),
        reply: reply_to,
    };
    let guard = p.cancel_on_drop(pending(p.watch(op, [2]).unwrap()));
    std::thread::spawn(move || drop(guard)).join().unwrap();
    assert_eq!(p.stats().cancelled, 2);
    assert_eq!(in_context.load(Ordering::Relaxed), 2);
}

/// Once the answer was taken, `try_answer` says so by `None`, not by a false
/// "unanswered".
#[test]
fn try_answer_after_the_answer_was_taken_gives_nothing() {
    let p: Purgatory<u32, Fetch> = Purgatory::new("taken");
    let ready = Arc::new(AtomicBool::new(true));
    let mut parked = p
        .park_with([1], fetch(&ready, Duration::from_secs(60)))
        .unwrap();
    assert_eq!(parked.try_answer().unwrap().unwrap().how, Completion::Ready);
    assert!(parked.try_answer().is_none());
}

/// A waiting `Parked` does not keep its purgatory alive: dropping every handle shuts it
/// down, which answers the operation; the `Parked`'s drop then finds nothing to cancel.
#[test]
fn a_waiting_parked_does_not_keep_its_purgatory_alive() {
    let p: Purgatory<u32, Fetch> = Purgatory::new("weak");
    let ready = Arc::new(AtomicBool::new(false));
    let completions = Arc::new(AtomicU64::new(0));
    let parked = p
        .park_with(
            [1],
            fetch_counted(&ready, Duration::from_secs(3600), &completions),
        )
        .unwrap();
    drop(p);
    assert_eq!(
        completions.load(Ordering::Relaxed),
        1,
        "answered by the shutdown"
    );
    assert_eq!(parked.blocking_answer().unwrap().how, Completion::Shutdown);
}

/// Issue #27, finding 1 on tokio time: a key whose `Drop` panics in a purge run by the
/// driving task must not end the task (which would shut the purgatory down, answering a
/// 2 s operation at once and refusing every later watch).
#[tokio::test(start_paused = true)]
async fn a_key_drop_that_panics_in_a_purge_does_not_end_the_driving_task() {
    let p: Purgatory<DropBomb, Fetch> = PurgatoryBuilder::new()
        .purge_interval(1)
        .follow_tokio_time()
        .build()
        .unwrap();
    let ready = Arc::new(AtomicBool::new(false));
    let (bomb, _armed) = DropBomb::armed(1);
    let first = p
        .park_with([bomb], fetch(&ready, Duration::from_secs(60)))
        .unwrap();
    let handle = first.handle().unwrap();
    assert!(p.force_complete(&handle));
    // The driving task's next round purges the stale entry and drops the armed key.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(p.stats().panicked, 1, "the purge dropped the key");
    assert!(!p.is_shutdown(), "the driving task goes on");
    let start = tokio::time::Instant::now();
    let parked = p
        .park_with([DropBomb::plain(2)], fetch(&ready, Duration::from_secs(2)))
        .expect("accepted");
    assert_eq!(parked.await.unwrap().how, Completion::Expired);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited <= Duration::from_millis(2_002),
        "{waited:?}"
    );
    drop(first);
}

/// `park_keyless_with`: a timer-only operation awaited. Answered by its timeout (moved by
/// `reset_timeout` on its handle), cancelled when dropped while it waits, and refused
/// with its answer after shutdown; it lists nothing.
#[tokio::test(start_paused = true)]
async fn a_keyless_parked_operation_expires_moves_with_a_reset_and_cancels_on_drop() {
    let p: Purgatory<u32, Fetch> = PurgatoryBuilder::new().follow_tokio_time().build().unwrap();
    let ready = Arc::new(AtomicBool::new(true));
    // Ready or not, an event can never reach it: only its deadline does.
    let parked = p
        .park_keyless_with(fetch(
            &Arc::new(AtomicBool::new(false)),
            Duration::from_secs(10),
        ))
        .unwrap();
    let handle = parked.handle().unwrap();
    assert_eq!(p.stats().watched, 0, "no watcher entry");
    let start = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(p.reset_timeout(&handle, Duration::from_secs(10)));
    let answered = parked.await.unwrap();
    assert_eq!(answered.how, Completion::Expired);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(15) && waited <= Duration::from_millis(15_002),
        "{waited:?}: the reset moved the deadline to 15 s"
    );
    // Ready at once: answered in the call, nothing left waiting.
    let at_once = p
        .park_keyless_with(fetch(&ready, Duration::from_secs(10)))
        .unwrap();
    assert!(at_once.handle().is_none());
    assert_eq!(at_once.await.unwrap().how, Completion::Ready);
    // Dropped while it waits: cancelled, its timer disarmed.
    let dropped = p
        .park_keyless_with(fetch(
            &Arc::new(AtomicBool::new(false)),
            Duration::from_secs(10),
        ))
        .unwrap();
    drop(dropped);
    assert_eq!((p.pending(), p.stats().cancelled), (0, 1));
    // After shutdown: refused, the answer given back with the operation.
    p.shutdown_async().await;
    let Err(refused) = p.park_keyless_with(fetch(&ready, Duration::from_secs(10))) else {
        panic!("accepted after shutdown");
    };
    assert_eq!(refused.kind(), purgatory::WatchErrorKind::Shutdown);
}
