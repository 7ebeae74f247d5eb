//! Every call the timer makes into user code is a fault point, tested the way SQLite tests
//! allocation failure: each scenario runs once to count the calls into user code (tasks'
//! `run` and `Drop`, the clock, the wake hook, an owner's `Expire` target, the tracing
//! subscriber), then once per call with that call panicking and once with it stalling,
//! and the ledger is checked after every run:
//! - every task added is run exactly once, or handed back (a winning cancel, shutdown,
//!   an add refused after shutdown), or dropped unrun where the table of
//!   `src/user_code.rs` says so (a timer dropped with tasks pending; the rest of a batch
//!   whose owner's handler let a panic escape); each is dropped exactly once;
//! - no panic reaches the caller of any call, and no round lets one escape (a round here
//!   is `advance_clock` on the test thread, what a reaper runs); a task added after the
//!   fault still runs at its deadline;
//! - `stats()` counts the caught panic (`panicked` for a task, `clock_panics` for the
//!   clock).
//!
//! `cargo test -p purgatory-timer --test faults -- --nocapture` prints the call sites.

#[path = "support/injector.rs"]
mod injector;

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use injector::{point, quiet, Fault, Kind, Run, Subscriber};
use timer_core::{
    Clock, Executor, Expire, ManualClock, SystemClock, Timer, TimerBuilder, TimerCore, TimerHandle,
    TimerTask,
};

const MS: Duration = Duration::from_millis(1);
const TASKS: usize = 64;

/// What became of each task.
#[derive(Default)]
struct Ledger {
    runs: Vec<AtomicU32>,
    drops: Vec<AtomicU32>,
}

impl Ledger {
    fn new() -> Arc<Self> {
        Arc::new(Ledger {
            runs: (0..TASKS).map(|_| AtomicU32::new(0)).collect(),
            drops: (0..TASKS).map(|_| AtomicU32::new(0)).collect(),
        })
    }
}

/// A task: its `run` and its `Drop` are fault points.
struct Task {
    id: usize,
    ledger: Arc<Ledger>,
}

impl TimerTask for Task {
    fn run(self) {
        self.ledger.runs[self.id].fetch_add(1, SeqCst);
        point(Kind::TaskRun);
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.ledger.drops[self.id].fetch_add(1, SeqCst);
        point(Kind::TaskDrop);
    }
}

/// A clock whose every read is a fault point.
#[derive(Clone)]
struct FaultyClock(ManualClock);

impl Clock for FaultyClock {
    fn now(&self) -> Duration {
        let now = self.0.now();
        point(Kind::Clock);
        now
    }
}

/// The system clock, every read a fault point (for the scenarios with a reaper).
#[derive(Clone, Copy)]
struct FaultySystemClock(SystemClock);

impl Clock for FaultySystemClock {
    fn now(&self) -> Duration {
        let now = self.0.now();
        point(Kind::Clock);
        now
    }
}

/// What the test knows became of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Unused,
    /// Added: runs exactly once (unless `unrun_allowed`).
    Added,
    /// Handed back to the test (cancel, shutdown, refused add).
    HandedBack,
}

/// One scenario's world: the ledger, the clock, the fates, the panics that reached it.
struct World {
    name: String,
    clock: ManualClock,
    ledger: Arc<Ledger>,
    fate: Vec<Fate>,
    propagated: Vec<&'static str>,
    /// Tasks may be dropped unrun by the timer (see the module doc).
    unrun_allowed: bool,
    /// The timer's counts of caught panics (tasks', the clock's), read before its drop.
    counted: Option<(u64, u64)>,
}

impl World {
    fn new(name: String) -> Self {
        World {
            name,
            clock: ManualClock::new(),
            ledger: Ledger::new(),
            fate: vec![Fate::Unused; TASKS],
            propagated: Vec::new(),
            unrun_allowed: false,
            counted: None,
        }
    }

    fn builder(&self) -> TimerBuilder {
        TimerBuilder::new()
            .shards(2)
            .clock(FaultyClock(self.clock.clone()))
            .reaper(false)
    }

    /// A timer driven by its reaper on the system clock, with stand-ins that relieve it
    /// after 1 ms (so that an injected stall hands work to a stand-in).
    fn reaper_builder(&self) -> TimerBuilder {
        TimerBuilder::new()
            .shards(2)
            .clock(FaultySystemClock(SystemClock::default()))
            .stand_in(Some(MS))
    }

    /// Waits (at most 5 s) until every task added was run or dropped by the timer.
    fn settled(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let settled = || {
            self.fate.iter().enumerate().all(|(id, fate)| {
                *fate != Fate::Added
                    || self.ledger.runs[id].load(SeqCst) > 0
                    || self.ledger.drops[id].load(SeqCst) > 0
            })
        };
        while !settled() && std::time::Instant::now() < deadline {
            std::thread::sleep(MS);
        }
    }

    fn task(&mut self) -> Task {
        let id = self
            .fate
            .iter()
            .position(|f| *f == Fate::Unused)
            .expect("fewer than TASKS tasks");
        self.fate[id] = Fate::Added;
        Task {
            id,
            ledger: Arc::clone(&self.ledger),
        }
    }

    fn call<R>(&mut self, what: &'static str, f: impl FnOnce() -> R) -> Option<R> {
        injector::call(&mut self.propagated, what, f)
    }

    fn handed_back(&mut self, task: Task) {
        self.fate[task.id] = Fate::HandedBack;
        quiet(|| drop(task));
    }

    fn add(&mut self, core: &TimerCore<Task>, delay: Duration) -> Option<TimerHandle> {
        let task = self.task();
        match self.call("add", || core.add(delay, task))? {
            Ok(handle) => Some(handle),
            Err(refused) => {
                self.handed_back(refused.into_task());
                None
            }
        }
    }

    fn cancel(&mut self, core: &TimerCore<Task>, handle: TimerHandle) {
        if let Some(Some(task)) = self.call("cancel", || core.cancel(handle)) {
            self.handed_back(task);
        }
    }

    /// A task added now runs at its deadline (or a round later, if the round's clock read
    /// was the one faulted).
    fn still_running(&mut self, timer: &Timer<Task>) {
        let Some(_) = self.add(timer, MS) else {
            return; // the add's clock read... never refuses; shut down: nothing to check
        };
        let id = self.fate.iter().rposition(|f| *f != Fate::Unused).unwrap();
        self.clock.advance(2 * MS);
        self.call("advance_clock", || timer.advance_clock(Duration::ZERO));
        if self.ledger.runs[id].load(SeqCst) == 0 {
            self.call("advance_clock", || timer.advance_clock(Duration::ZERO));
        }
        assert_eq!(
            self.ledger.runs[id].load(SeqCst),
            1,
            "{}: a task added later did not run at its deadline",
            self.name
        );
    }

    /// Shuts `timer` down (its pending tasks handed back), counts its panics, drops it.
    fn shut_down_and_drop(&mut self, timer: Timer<Task>) {
        if let Some(pending) = self.call("shutdown", || timer.shutdown()) {
            for task in pending {
                self.handed_back(task);
            }
        }
        self.count(timer.stats());
        self.call("drop", move || drop(timer));
    }

    fn count(&mut self, stats: timer_core::TimerStats) {
        self.counted = Some((stats.panicked, stats.clock_panics));
    }

    fn check(self, run: &Run) {
        let context = format!("{}, fault {:?}", self.name, run.hit());
        assert!(
            self.propagated.is_empty(),
            "{context}: a panic reached the caller of {:?}",
            self.propagated
        );
        for (id, fate) in self.fate.iter().enumerate() {
            let runs = self.ledger.runs[id].load(SeqCst);
            let drops = self.ledger.drops[id].load(SeqCst);
            let ok = match fate {
                Fate::Unused => continue,
                Fate::Added => runs == 1 || (self.unrun_allowed && runs == 0),
                Fate::HandedBack => runs == 0,
            };
            assert!(ok, "{context}: task {id} ({fate:?}) ran {runs} times");
            assert_eq!(
                drops, 1,
                "{context}: task {id} ({fate:?}) dropped {drops} times"
            );
        }
        if let Some((task_panics, clock_panics)) = self.counted {
            // A task's drop at the end of its own `run` panics inside `run` (counted);
            // elsewhere (dropped unrun) it is not a task's panic.
            let expected: &[(u64, u64)] = match run.hit() {
                Some((Kind::TaskRun, true)) => &[(1, 0)],
                Some((Kind::TaskDrop, true)) => &[(1, 0), (0, 0)],
                Some((Kind::Clock, true)) => &[(0, 1)],
                _ => &[(0, 0)],
            };
            assert!(
                expected.contains(&(task_panics, clock_panics)),
                "{context}: panics counted: {:?}",
                (task_panics, clock_panics)
            );
        }
    }
}

/// Adds, a batch add, cancels (one and a batch), rounds that run tasks, shutdown (its
/// pending tasks handed back) and an add after it.
fn run_and_cancel(name: String) -> World {
    let mut w = World::new(name);
    let timer: Timer<Task> = w.builder().build().expect("valid");
    let mut handles = Vec::new();
    for delay in 1..=6 {
        handles.extend(w.add(&timer, delay * MS));
    }
    let mut batch: Vec<(Duration, Task)> = (0..4u32).map(|i| (i * 2 * MS, w.task())).collect();
    let mut added = Vec::new();
    w.call("add_batch", || timer.add_batch(&mut batch, &mut added));
    if let Some(&handle) = handles.get(1) {
        w.cancel(&timer, handle);
    }
    let mut cancels: Vec<TimerHandle> = handles.iter().skip(3).take(2).copied().collect();
    let mut cancelled = Vec::new();
    w.call("cancel_batch", || {
        timer.cancel_batch(&mut cancels, &mut cancelled)
    });
    for task in cancelled {
        w.handed_back(task);
    }
    w.clock.advance(3 * MS);
    w.call("advance_clock", || timer.advance_clock(Duration::ZERO));
    w.clock.advance(10 * MS);
    w.call("advance_clock", || timer.advance_clock(Duration::ZERO));
    w.still_running(&timer);
    for _ in 0..2 {
        w.add(&timer, Duration::from_secs(60));
    }
    if let Some(pending) = w.call("shutdown", || timer.shutdown()) {
        for task in pending {
            w.handed_back(task);
        }
    }
    w.add(&timer, MS);
    w.count(timer.stats());
    w.call("drop", move || drop(timer));
    w
}

/// A timer dropped with tasks pending: they are dropped unrun, each through the door.
fn dropped_with_tasks(name: String) -> World {
    let mut w = World::new(name);
    w.unrun_allowed = true;
    let timer: Timer<Task> = w.builder().build().expect("valid");
    for delay in [1, 60_000, 60_000, 60_000] {
        w.add(&timer, delay * MS);
    }
    w.clock.advance(MS);
    w.call("advance_clock", || timer.advance_clock(Duration::ZERO));
    w.count(timer.stats());
    w.call("drop", move || drop(timer));
    w
}

/// Tasks run on a pool; shutdown waits for them.
fn on_a_pool(name: String) -> World {
    let mut w = World::new(name);
    let timer: Timer<Task> = w
        .builder()
        .executor(Executor::pool(1).expect("a pool"))
        .build()
        .expect("valid");
    for _ in 0..4 {
        w.add(&timer, MS);
    }
    w.clock.advance(MS);
    w.call("advance_clock", || timer.advance_clock(Duration::ZERO));
    w.shut_down_and_drop(timer);
    w
}

/// A core with a wake hook: every add that queues an earlier task, `wake` and shutdown
/// call it.
fn wake_hook(name: String) -> World {
    let mut w = World::new(name);
    let core: TimerCore<Task> = w.builder().build_core().expect("valid");
    core.set_wake_hook(|| point(Kind::WakeHook));
    for delay in [5, 3, 8, 1] {
        w.add(&core, delay * MS);
    }
    w.call("wake", || core.wake());
    if let Some(pending) = w.call("shutdown", || core.shutdown()) {
        for task in pending {
            w.handed_back(task);
        }
    }
    w.add(&core, MS);
    w
}

/// An owner's `Expire` target whose every hook is user code, driven by a `Driver`: its
/// handler runs each task without catching (a task's panic escapes the handler, and the
/// driver drops the rest of that batch, as documented).
struct Target {
    core: TimerCore<Task>,
}

impl Expire for Target {
    type Task = Task;

    fn core(&self) -> &TimerCore<Task> {
        &self.core
    }
    fn expire(&self, expired: &mut Vec<Task>) {
        point(Kind::ExpireTarget);
        while let Some(task) = expired.pop() {
            task.run();
        }
    }
    fn before_round(&self) {
        point(Kind::ExpireTarget);
    }
    fn after_round(&self) -> timer_core::NextRound {
        point(Kind::ExpireTarget);
        timer_core::NextRound::at_most(Duration::MAX)
    }
    fn at_drop(&self, pending: Vec<Task>) {
        drop(pending);
        point(Kind::ExpireTarget);
    }
}

fn owners_target(name: String) -> World {
    let mut w = World::new(name);
    w.unrun_allowed = true;
    let (core, config) = w.builder().build_parts::<Task>().expect("valid");
    let driver = config
        .start(Target { core }, "unused")
        .expect("no thread to spawn");
    for delay in [1, 1, 2, 60_000] {
        w.add(&driver.target().core, delay * MS);
    }
    w.clock.advance(2 * MS);
    w.call("advance_clock", || driver.advance_clock(Duration::ZERO));
    w.call("drop", move || drop(driver));
    w
}

/// A timer driven by its reaper (with stand-ins): tasks are handed out one at a time
/// (`Timer`'s `expire_one`), and its rounds' clock reads are faults too.
fn on_the_reaper(name: String) -> World {
    let mut w = World::new(name);
    let timer: Timer<Task> = w.reaper_builder().build().expect("valid");
    for delay in [1, 1, 1, 2, 3] {
        w.add(&timer, delay * MS);
    }
    w.settled();
    w.add(&timer, Duration::from_secs(60));
    w.shut_down_and_drop(timer);
    w
}

/// An owner's target without `expire_one`, driven by a reaper with stand-ins: the
/// default `expire_one` hands `expire` a batch of one, and a panic escaping it leaves
/// the task to be dropped through the driver's catch.
fn owners_target_on_a_reaper(name: String) -> World {
    let mut w = World::new(name);
    w.unrun_allowed = true;
    let (core, config) = w.reaper_builder().build_parts::<Task>().expect("valid");
    let driver = config
        .start(Target { core }, "faults-reaper")
        .expect("a reaper");
    for delay in [1, 1, 2] {
        w.add(&driver.target().core, delay * MS);
    }
    w.settled();
    // Pending at the drop: dropped unrun, through the door.
    w.add(&driver.target().core, Duration::from_secs(60));
    w.call("drop", move || drop(driver));
    w
}

type Scenario = fn(String) -> World;

const SCENARIOS: &[(&str, Scenario)] = &[
    ("run-and-cancel", run_and_cancel),
    ("dropped-with-tasks", dropped_with_tasks),
    ("pool", on_a_pool),
    ("wake-hook", wake_hook),
    ("owners-target", owners_target),
    ("reaper", on_the_reaper),
    ("owners-target-on-a-reaper", owners_target_on_a_reaper),
];

#[test]
fn every_call_into_user_code_fails_in_turn_and_nothing_is_lost() {
    static SUBSCRIBER: std::sync::Once = std::sync::Once::new();
    SUBSCRIBER.call_once(|| {
        tracing::subscriber::set_global_default(Subscriber).expect("the only subscriber");
    });
    let stall = if std::env::var_os("FAULTS_FULL").is_some() {
        Duration::from_millis(50)
    } else {
        Duration::from_millis(2)
    };
    let mut sites = std::collections::BTreeMap::new();
    let (mut calls, mut injected) = (0, 0);
    for (scenario_name, scenario) in SCENARIOS {
        let census = Run::census();
        let world = scenario(format!("{scenario_name}-census"));
        let counted = census.calls();
        for (site, n) in census.sites() {
            *sites.entry(site).or_insert(0) += n;
        }
        world.check(&census);
        drop(census);
        calls += counted;
        for at in 1..=counted {
            for fault in [Fault::Panic, Fault::Stall(stall)] {
                let run = Run::faulting(at, fault);
                let world = scenario(format!("{scenario_name}-{fault:?}-{at}"));
                world.check(&run);
                injected += u64::from(run.hit().is_some());
            }
        }
    }
    let places: std::collections::BTreeSet<_> = sites.keys().map(|(_, site)| site).collect();
    println!(
        "timer fault injection: {} scenarios, {calls} calls into user code from {} call \
         sites, {injected} faults injected",
        SCENARIOS.len(),
        places.len()
    );
    for ((kind, site), n) in &sites {
        println!("  {kind:?} from {site}: {n}");
    }
    let kinds: std::collections::BTreeSet<Kind> = sites.keys().map(|(kind, _)| *kind).collect();
    for kind in [
        Kind::TaskRun,
        Kind::TaskDrop,
        Kind::Clock,
        Kind::WakeHook,
        Kind::ExpireTarget,
        Kind::Subscriber,
    ] {
        assert!(kinds.contains(&kind), "no scenario reaches {kind:?}");
    }
}
