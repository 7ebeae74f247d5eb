//! The driver: what turns a thread-free [`TimerCore`] into a running timer. It owns the
//! reaper thread, the executor choice, the containment of panics from expiry work, and
//! the shutdown protocol, for every owner of a core: [`Timer`](crate::Timer) (whose
//! expired tasks run themselves) and layers above it such as a purgatory (whose expired
//! tasks name work the owner does).
//!
//! The owner says what expiry means by implementing [`Expire`]: the driver calls
//! [`Expire::expire`] with each batch the core hands out on a pool or on a thread in
//! [`Driver::advance_clock`], [`Expire::expire_one`] with each task of a batch the reaper
//! (or a stand-in) expires inline, and [`Expire::before_round`] /
//! [`Expire::after_round`] around each round, for bookkeeping of its own (the purgatory
//! flushes queued cancels and purges there). Every one of these is user code to the
//! driver: it goes through the door (`user_code.rs`).
//!
//! # Invariants
//! - A round is: `before_round`, one advance of the core (as
//!   [`TimerCore::advance_into`], waiting as the last round's [`NextRound`] allows), the
//!   batch to the executor, `after_round`. Rounds run on the reaper thread (if started),
//!   on stand-ins (`stand_in.rs`), and on any thread that calls [`Driver::advance_clock`].
//! - With the inline executor, the reaper and its stand-ins expire a batch one task at a
//!   time, each claimed from a [`SharedBatch`] exactly once, so that stand-ins can take
//!   over the rest of a batch that has grown late, whatever holds its thread
//!   (`stand_in.rs`).
//! - `rounds` counts rounds in progress, pool batches not yet finished and stand-ins'
//!   stolen batches; `work` (striped, `work.rs`) counts owners' [`DriverWork`]. A round is
//!   counted before it takes anything out of the core, a stolen batch before its stand-in
//!   is spawned, an owner's work before it takes its task over; so a shutdown that sees
//!   both at zero after closing the core knows that every task fired before the close
//!   has been expired (and every answer an owner took over made), and that nothing fires
//!   after it.
//! - A panic escaping the target's hooks (`expire`, `expire_one`, `before_round`,
//!   `after_round`, `at_drop`) is caught, reported through `tracing` (target
//!   `timer_core`) and the driver goes on; a driving thread never unwinds. (Owners catch
//!   per task, so one panic does not skip the rest of a batch; this is the backstop.)
//! - Shutdown is one protocol for every caller, by where the call comes from. "Inside"
//!   means inside this driver's expiry work: a round on a driving thread (its hooks
//!   included), a pool batch, an owner's [`work`](Driver::work), or the first caller's
//!   `finish` (marked per thread while it runs).
//!
//!   | caller | returns when | done by then |
//!   |---|---|---|
//!   | outside, first | the core is closed, the reaper, the watchdog and the stand-ins joined, every round, pool batch and owner's work finished, and `finish` ran on what was pending | every task that fired ran; the pending went to `finish` |
//!   | outside, while another call runs or after it | the first call's `finish` ran and every round, pool batch and owner's work finished (a first caller inside a round could not wait for that round) | the same |
//!   | inside, first | the core is closed and `finish` ran on what was pending; rounds in progress, its own included, are not waited for, nor the driving threads joined (they stop by themselves; an outside call joins them) | the pending went to `finish`; the rest of the rounds in progress is done after it returns, before any outside call returns |
//!   | inside, while another call runs | at once | nothing more: the running call waits for this expiry work, or is its caller up this stack |
//!
//!   Dropping the [`Driver`] is a call from where the drop happens (the last owner's
//!   handle dropped in a callback is "inside"), with [`Expire::at_drop`] as `finish`.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::core::{Fired, TimerCore};
use crate::executor::Executor;
use crate::shared_batch::{give_back_batch, SharedBatch};
use crate::stand_in::{StandIn, Work, DEFAULT_MAX_STAND_INS, DEFAULT_STAND_IN_BOUND};
use crate::sync::{Condvar, Mutex};
use crate::user_code::{caught, drop_each};
use crate::work::WorkCounts;

/// What a driver drives: a core, and what to do with the tasks that expire from it.
pub trait Expire: Send + Sync + 'static {
    /// The core's task type.
    type Task: Send + 'static;

    /// The core the driver advances.
    fn core(&self) -> &TimerCore<Self::Task>;

    /// Handles a batch of expired tasks (leaving `expired` empty): on the pool, in
    /// `advance_clock`, and on a reaper without stand-ins. Catch panics per task here: a
    /// panic that escapes is caught by the driver, and the tasks left in `expired` are
    /// dropped unhandled (each through the driver's catch).
    fn expire(&self, expired: &mut Vec<Self::Task>);

    /// Handles one expired task, on a driving thread: a reaper with the inline executor
    /// and stand-ins hands its batches out one task at a time, so that a stand-in can
    /// take over the rest of a batch while one task's code runs long (`stand_in.rs`).
    /// Catch panics here. The default hands `expire` a batch of one, with the same
    /// backstop as for a batch.
    fn expire_one(&self, task: Self::Task) {
        expire_alone(self, task);
    }

    /// Handles the tasks `claim` hands out, one at a time, until it returns `None`: the
    /// tasks of a batch the reaper (or a stand-in taking it over) hands out one by one.
    /// The default is [`expire_one`](Self::expire_one) on each; a target overrides it to
    /// set something up once for all of them. Claim each task only when about to handle
    /// it: the tasks not claimed yet are what a stand-in takes over.
    fn expire_claimed(&self, mut claim: impl FnMut() -> Option<Self::Task>) {
        while let Some(task) = claim() {
            self.expire_one(task);
        }
    }

    /// Runs at the start of every round, before the core is advanced.
    fn before_round(&self) {}

    /// Runs at the end of every round; returns how long the reaper's next round may wait
    /// for a timeout. The default waits for the earliest bucket however far away.
    fn after_round(&self) -> NextRound {
        NextRound::at_most(Duration::MAX)
    }

    /// What becomes of the tasks still pending when the driver is dropped without an
    /// explicit shutdown: dropped unrun, unless the owner overrides this.
    fn at_drop(&self, pending: Vec<Self::Task>) {
        drop(pending);
    }
}

/// [`Expire::expire_one`]'s default: `target.expire` on a batch of one. A panic that
/// escapes it is caught, and the task, if it is still in the batch, dropped on its own
/// catch (dropped while unwinding instead, a task whose `Drop` panicked too would abort
/// the process).
fn expire_alone<E: Expire + ?Sized>(target: &E, task: E::Task) {
    let mut batch = vec![task];
    let handled = caught("expiry handler panicked; its task is dropped", || {
        target.expire(&mut batch)
    });
    if handled.is_none() {
        drop_each("an expired task dropped after its handler panicked", batch);
    }
}

/// How long a round may wait when nothing is due, as [`Expire::after_round`] decides it
/// for the next round: one bound while the core has tasks queued, another while it has
/// none. The core picks the bound when the round starts to wait, not when it was decided,
/// and a round waiting under `empty` ends at the first add if `queued` is shorter, so a
/// target that wants to look at its state every `queued` while work is pending gets that
/// from the first add on, even if the add raced the decision. Nor does a round wait under
/// `empty` on a core that cancels emptied after the decision: when an advance (the
/// round's own, or another driving thread's) has left a shard idle since the target
/// decided, a round that finds the core empty returns without waiting, and the target
/// decides again (cancels a target applies in `before_round`, say, may leave a due
/// bucket empty, and the core with it once the round takes the bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextRound {
    /// The longest wait while at least one task is queued.
    pub queued: Duration,
    /// The longest wait while no task is queued.
    pub empty: Duration,
}

impl NextRound {
    /// The same bound whether or not anything is queued (`Duration::ZERO` to come
    /// straight back, `Duration::MAX` to wait for the earliest bucket, or while none is
    /// queued for the first add, however far away).
    pub const fn at_most(wait: Duration) -> Self {
        NextRound {
            queued: wait,
            empty: wait,
        }
    }

    /// Both bounds capped at `wait`.
    #[must_use]
    pub fn min(self, wait: Duration) -> Self {
        NextRound {
            queued: self.queued.min(wait),
            empty: self.empty.min(wait),
        }
    }
}

/// A round's wait as its driving thread carries it from the round that decided it: the
/// target's [`NextRound`], and what [`TimerCore::idled`] read just before the target
/// decided (see `TimerCore::advance_with`: a core found empty after an advance has left
/// a shard idle since then is not waited on under `empty`).
#[derive(Clone, Copy, Debug)]
struct Plan {
    wait: NextRound,
    idled: u64,
}

impl Plan {
    /// `wait`, decided now (by a caller that passes its own bound).
    fn now<E: Expire>(shared: &Shared<E>, wait: NextRound) -> Self {
        Plan {
            wait,
            idled: shared.target.core().idled(),
        }
    }
}

/// How a driver runs: the executor, whether to start a reaper thread, and its name.
#[derive(Clone, Debug)]
#[must_use = "a driver configuration does nothing until `start` is called"]
pub struct DriverConfig {
    executor: Executor,
    manual: bool,
    thread_name: Option<String>,
    stand_in: Option<Duration>,
    max_stand_ins: usize,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            executor: Executor::Inline,
            manual: false,
            thread_name: None,
            stand_in: Some(DEFAULT_STAND_IN_BOUND),
            max_stand_ins: DEFAULT_MAX_STAND_INS,
        }
    }
}

impl DriverConfig {
    /// The defaults: expired work runs inline on a reaper thread.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where expired work runs.
    pub fn executor(mut self, executor: Executor) -> Self {
        self.executor = executor;
        self
    }

    /// Whether to start a reaper thread (default true). Without one, the owner calls
    /// [`Driver::advance_clock`].
    pub fn reaper(mut self, reaper: bool) -> Self {
        self.manual = !reaper;
        self
    }

    /// The reaper thread's name (default: the one the owner gives when it starts the
    /// driver).
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.thread_name = Some(name.into());
        self
    }

    /// With the inline executor and a reaper thread: the bound on how late a due task is
    /// started because of other code on the driving threads (default 20 ms,
    /// [`DEFAULT_STAND_IN_BOUND`]). Work that has waited
    /// half of it (a batch's unclaimed tasks, or a due bucket while every driving thread
    /// is in user code) is taken over by a stand-in thread, whatever holds the driving
    /// thread (`stand_in.rs`). `None`: no stand-in; expiry then waits for slow code. A
    /// pool executor, or a driver without a reaper, has none either way.
    ///
    /// The watchdog that hands work to stand-ins is a thread, and on Linux it sleeps on
    /// a `timerfd` (one file descriptor per driver) that the driving threads move while
    /// they keep up, so it does not wake. Where none can be made (the descriptor limit
    /// reached, another system) it looks every half bound while expiry goes on instead.
    pub fn stand_in(mut self, bound: Option<Duration>) -> Self {
        self.stand_in = bound;
        self
    }

    /// With stand-ins: how many may run at once (default 32,
    /// [`DEFAULT_MAX_STAND_INS`]; clamped to `1..=1024`,
    /// [`MAX_STAND_INS_LIMIT`](crate::MAX_STAND_INS_LIMIT)). Up to this many callbacks
    /// held at once, every other due task is still started within the bound; past it,
    /// the work behind them waits for one to come back, counted in
    /// [`TimerStats::stand_in_limit_reached`](crate::TimerStats) and reported (a
    /// warning, target `timer_core`). Each stand-in is a thread while it runs; none is
    /// kept when nothing is late.
    pub fn max_stand_ins(mut self, max: usize) -> Self {
        self.max_stand_ins = max;
        self
    }

    /// The configured limit of stand-ins (before clamping), for a builder's checks.
    pub(crate) fn max_stand_ins_setting(&self) -> usize {
        self.max_stand_ins
    }

    /// The configured stand-in bound, for a builder's checks.
    pub(crate) fn stand_in_setting(&self) -> Option<Duration> {
        self.stand_in
    }

    /// Starts a driver for `target` (and its reaper thread, named `default_name` unless a
    /// name was set).
    pub fn start<E: Expire>(self, target: E, default_name: &str) -> std::io::Result<Driver<E>> {
        let name = self.thread_name.unwrap_or_else(|| default_name.to_owned());
        let stand_in = match (&self.executor, self.manual, self.stand_in) {
            (Executor::Inline, false, Some(bound)) => {
                Some(StandIn::new(bound, self.max_stand_ins, name.clone()))
            }
            _ => None,
        };
        let shared = Arc::new(Shared {
            target,
            executor: self.executor,
            rounds: Mutex::new(0),
            rounds_done: Condvar::default(),
            stand_in,
            work: WorkCounts::default(),
        });
        let reaper = if self.manual {
            None
        } else {
            let for_thread = Arc::clone(&shared);
            Some(
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || reaper_loop(&for_thread))?,
            )
        };
        if let Some(stand_in) = &shared.stand_in {
            shared.start_watchdog(stand_in);
        }
        Ok(Driver {
            shared,
            reaper: parking_lot::Mutex::new(reaper),
            stop: Mutex::new(Stop::Open),
            stopped: Condvar::default(),
        })
    }
}

/// Where a driver is in its shutdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Open,
    Closing,
    Done,
}

/// What the reaper thread and pool batches share with the driver.
struct Shared<E: Expire> {
    target: E,
    executor: Executor,
    /// Rounds in progress plus pool batches (and stand-ins' stolen batches) not yet
    /// finished.
    rounds: Mutex<usize>,
    rounds_done: Condvar,
    /// With the inline executor and a reaper: the watchdog and stand-ins (`stand_in.rs`).
    stand_in: Option<StandIn<E::Task>>,
    /// Owners' work outside the rounds ([`DriverWork`], `work.rs`).
    work: WorkCounts,
}

#[cfg(not(loom))]
thread_local! {
    /// The driver (by the address of its shared state) whose expiry work runs on this
    /// thread right now, if any.
    static EXPIRING: Cell<usize> = const { Cell::new(0) };
}

// Loom runs every model thread on one OS thread: a std thread-local would be shared.
#[cfg(loom)]
loom::thread_local! {
    static EXPIRING: Cell<usize> = Cell::new(0);
}

/// A thread-free core made to run: a reaper thread (unless built without one), the
/// executor, caught panics, and a shutdown that waits for all of it. See the module doc.
pub struct Driver<E: Expire> {
    shared: Arc<Shared<E>>,
    reaper: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
    stop: Mutex<Stop>,
    stopped: Condvar,
}

impl<E: Expire> Driver<E> {
    /// What this driver drives.
    pub fn target(&self) -> &E {
        &self.shared.target
    }

    /// Runs one round: expires what is due, or, if nothing is, waits up to `max_wait`
    /// for the earliest bucket (or an earlier add, or shutdown) and expires what is due
    /// then. Returns how many tasks expired. A round that leaves the core empty by
    /// taking due buckets whose tasks were all cancelled returns 0 without waiting (see
    /// [`NextRound`]). For owners without a reaper thread (for example on a manual
    /// clock); harmless beside one.
    pub fn advance_clock(&self, max_wait: Duration) -> usize {
        let plan = Plan::now(&self.shared, NextRound::at_most(max_wait));
        self.shared.round(plan, &mut Vec::new(), None).0
    }

    /// One round that never waits, for a driver that waits elsewhere (an async task; see
    /// [`TimerCore::set_wake_hook`]): expires what is due and returns how many, and the
    /// target's [`NextRound`] (how long it may wait before the next round, besides the
    /// earliest bucket).
    pub fn round_now(&self) -> (usize, NextRound) {
        let plan = Plan::now(&self.shared, NextRound::at_most(Duration::ZERO));
        let (fired, next) = self.shared.round(plan, &mut Vec::new(), None);
        (fired, next.wait)
    }

    /// Whether shutdown has begun.
    pub fn is_shutdown(&self) -> bool {
        self.shared.target.core().is_shutdown()
    }

    /// Shuts down: closes the core (later adds are refused, sleepers woken), joins the
    /// reaper, waits for every round and pool batch in progress, then runs `finish` on
    /// the tasks still pending and returns its result. Only the first caller runs
    /// `finish` (`Some`); every later or concurrent caller gets `None`, after waiting for
    /// the first caller's `finish` and for every round and pool batch. A caller inside
    /// this driver's own expiry work (`finish` included) never waits for a round (it may
    /// be one): see the table in the module doc.
    pub fn shutdown_with<R>(&self, finish: impl FnOnce(Vec<E::Task>) -> R) -> Option<R> {
        let inside = self.is_expiring_here();
        {
            let mut stop = self.stop.lock();
            if *stop != Stop::Open {
                if inside {
                    // Expiry work of this driver cannot wait: the shutdown that runs is
                    // waiting for it, or is its caller up this very stack.
                    return None;
                }
                while *stop != Stop::Done {
                    stop = self.stopped.wait_until(stop, None);
                }
                drop(stop);
                // The first caller may have been inside a round or a pool batch, which it
                // could not wait for: its round's remaining work is before this return,
                // and the driving threads it left are joined here.
                self.join_driving_threads();
                self.shared.wait_for_rounds();
                return None;
            }
            *stop = Stop::Closing;
        }
        // Done when this scope ends, even by a panic in `finish` (user code may run
        // there), so no other caller waits forever.
        let _done = StopDone(self);
        let core = self.shared.target.core();
        core.close();
        // From outside, join the driving threads: each stops after its round (the core is
        // closed). From inside, join none: a driving thread may be in a round (a stand-in
        // runs beside a reaper stuck in one task), which an inside call does not wait
        // for; they stop by themselves, and an outside call joins them.
        if !inside {
            // First, while the watchdog may still relieve a round stuck in user code.
            self.join_reaper();
        }
        if let Some(stand_in) = &self.shared.stand_in {
            // No stand-in starts from now on.
            stand_in.stop();
        }
        if !inside {
            self.join_driving_threads();
            self.shared.wait_for_rounds();
        }
        let pending = core.drain();
        // `finish` is this driver's expiry work too (it may run callbacks): one of them
        // that shuts down again is inside, and returns at once instead of waiting for
        // this call, its caller.
        let _inside = ExpiringHere::enter(&self.shared);
        Some(finish(pending))
    }

    /// Joins the reaper, the watchdog and the stand-ins, those no earlier call joined
    /// (each stops after its round once the core is closed). Outside callers only.
    fn join_driving_threads(&self) {
        self.join_reaper();
        if let Some(stand_in) = &self.shared.stand_in {
            for thread in stand_in.take_threads() {
                if thread.thread().id() != std::thread::current().id() {
                    let _ = thread.join();
                }
            }
        }
    }

    fn join_reaper(&self) {
        if let Some(reaper) = self.reaper.lock().take() {
            if reaper.thread().id() != std::thread::current().id() {
                let _ = reaper.join();
            }
        }
    }

    fn is_expiring_here(&self) -> bool {
        EXPIRING.with(Cell::get) == Arc::as_ptr(&self.shared) as usize
    }
}

impl<E: Expire> Driver<E> {
    /// Marks work that a shutdown must wait for, done outside a round on the calling
    /// thread until the guard is dropped: an owner answering something it took over (the
    /// purgatory: an expiry that fired while it held the operation, an operation an event
    /// or a force took out of its slot). Shutdown waits for it as for a round (unless
    /// called from inside it), and the thread is inside this driver's expiry work
    /// meanwhile (a shutdown it calls does not wait for itself). Take it before taking the
    /// thing over, so that a shutdown that begins after that waits for its answer. Cheap:
    /// a count on the calling thread's stripe (`work.rs`), no lock.
    #[inline]
    pub fn work(&self) -> DriverWork<'_, E> {
        let stripe = self.shared.work.begin();
        DriverWork {
            _inside: ExpiringHere::enter(&self.shared),
            shared: &self.shared,
            stripe,
            _here: PhantomData,
        }
    }
}

/// Work a [`Driver`]'s shutdown waits for, until dropped (see [`Driver::work`]). Dropped
/// on the thread that took it.
#[must_use = "the work ends when the guard is dropped"]
pub struct DriverWork<'a, E: Expire> {
    // `Drop::drop` ends the work (a waiting shutdown may go on) before the fields drop;
    // then `_inside` unmarks the thread. Between the two it only returns.
    _inside: ExpiringHere,
    shared: &'a Shared<E>,
    stripe: usize,
    /// Not `Send`: the thread-local mark must be undone on its own thread.
    _here: PhantomData<*const ()>,
}

impl<E: Expire> Drop for DriverWork<'_, E> {
    fn drop(&mut self) {
        if self.shared.work.end(self.stripe) {
            // A shutdown waits: wake it (under its lock, see `work.rs`).
            let _rounds = self.shared.rounds.lock();
            self.shared.rounds_done.notify_all();
        }
    }
}

impl<E: Expire> std::fmt::Debug for DriverWork<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DriverWork")
    }
}

impl<E: Expire> Drop for Driver<E> {
    /// Shuts down, handing what is still pending to [`Expire::at_drop`].
    fn drop(&mut self) {
        let target = &self.shared.target;
        self.shutdown_with(|pending| {
            caught("the expiry target's at_drop panicked", || {
                target.at_drop(pending)
            })
        });
    }
}

impl<E: Expire> std::fmt::Debug for Driver<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("executor", &self.shared.executor)
            .field("shutdown", &self.is_shutdown())
            .finish_non_exhaustive()
    }
}

impl<E: Expire> Shared<E> {
    /// One round (see the module doc), with `batch` as the inline executor's buffer, on
    /// driving slot `driving` (the reaper's and stand-ins' rounds; `None` for a caller of
    /// `advance_clock`); returns how many tasks expired and the next round's plan (its
    /// longest wait, and the count of idled shards its target decided it at).
    fn round(
        self: &Arc<Self>,
        plan: Plan,
        batch: &mut Vec<E::Task>,
        mut driving: Option<&mut Driving<E::Task>>,
    ) -> (usize, Plan) {
        *self.rounds.lock() += 1;
        let _done = RoundDone(self);
        // The whole round is this driver's expiry work: the owner's hooks may run user
        // code too (the purgatory completes there what a holder left, and purges keys).
        let _inside = ExpiringHere::enter(self);
        // A driving thread's hooks are watched by the stand-in too (user code runs there).
        let watched = match (&self.stand_in, &driving) {
            (Some(stand_in), Some(driving)) => Some((stand_in, driving.slot)),
            _ => None,
        };
        // The driving thread's relief floor, carried from round to round
        // (`StandIn::begin_hook`).
        let mut floor = driving.as_ref().map_or(0, |driving| driving.relief_floor);
        self.hook(watched, &mut floor, || {
            caught("the expiry target's before_round panicked", || {
                self.target.before_round()
            });
        });
        // In the core, about to sleep there until the next bucket: the watchdog's look
        // may be called off (`StandIn::sleeps_in_core`).
        let Fired {
            count: fired,
            overdue,
        } = self
            .target
            .core()
            .advance_with(plan.wait, plan.idled, batch, |wake| {
                if let Some((stand_in, slot)) = watched {
                    stand_in.sleeps_in_core(slot, wake);
                }
            });
        if fired > 0 {
            match &self.executor {
                Executor::Inline => match (&self.stand_in, driving.as_deref_mut()) {
                    (Some(stand_in), Some(driving)) => {
                        self.expire_shared(stand_in, driving, batch, overdue);
                    }
                    _ => self.expire(batch),
                },
                Executor::Pool(pool) => {
                    *self.rounds.lock() += 1;
                    let shared = Arc::clone(self);
                    let mut batch = std::mem::take(batch);
                    pool.spawn(move || {
                        let _done = RoundDone(&shared);
                        shared.expire(&mut batch);
                    });
                }
            }
        }
        // A burst fired at once is not kept for the driver's life (`shared_batch.rs`).
        give_back_batch(batch, fired);
        if let Some(done) = driving
            .as_deref_mut()
            .and_then(|driving| Arc::get_mut(&mut driving.batch))
        {
            done.give_back(fired);
        }
        // Read before the target decides: whatever an advance empties from now on, the
        // decision may not have seen.
        let idled = self.target.core().idled();
        let next = self.hook(watched, &mut floor, || {
            caught("the expiry target's after_round panicked", || {
                self.target.after_round()
            })
        });
        if let Some(driving) = driving {
            driving.relief_floor = floor;
        }
        let wait = next.unwrap_or(plan.wait);
        (fired, Plan { wait, idled })
    }

    /// Runs a round's hook `f`, watched by the stand-in on slot `watched` (if any), with
    /// the driving thread's relief floor `floor` (`StandIn::begin_hook`).
    #[inline]
    fn hook<R>(
        self: &Arc<Self>,
        watched: Option<(&StandIn<E::Task>, usize)>,
        floor: &mut u64,
        f: impl FnOnce() -> R,
    ) -> R {
        let Some((stand_in, slot)) = watched else {
            return f();
        };
        stand_in.begin_hook(slot, floor);
        let result = f();
        stand_in.end_hook(slot);
        result
    }

    /// Hands `batch` to the target, marking this thread as inside this driver's expiry
    /// and containing a panic that escapes.
    fn expire(self: &Arc<Self>, batch: &mut Vec<E::Task>) {
        let _inside = ExpiringHere::enter(self);
        let handled = caught(
            "expiry handler panicked; the rest of its batch is dropped",
            || self.target.expire(batch),
        );
        if handled.is_none() {
            drop_each(
                "an expired task dropped after its handler panicked",
                batch.drain(..),
            );
        }
    }

    /// Expires `batch` on a driving thread, one task at a time from its [`SharedBatch`]
    /// (refilled in place unless a stand-in still holds the last one), so that a stand-in
    /// can take over the rest if one task's code runs long.
    fn expire_shared(
        self: &Arc<Self>,
        stand_in: &StandIn<E::Task>,
        driving: &mut Driving<E::Task>,
        batch: &mut Vec<E::Task>,
        overdue: Duration,
    ) {
        // When the oldest of its tasks came due (its bucket, `overdue` before the round
        // read the clock): those not claimed yet are that late and growing
        // (`stand_in.rs`).
        let now = std::time::Instant::now();
        let due_at = now.checked_sub(overdue).unwrap_or(now);
        match Arc::get_mut(&mut driving.batch) {
            Some(reused) => reused.refill(batch, due_at),
            None => {
                let mut fresh = SharedBatch::new();
                fresh.refill(batch, due_at);
                driving.batch = Arc::new(fresh);
            }
        }
        self.help(stand_in, driving.slot, &driving.batch, now);
    }

    /// Expires what is left of `batch` on driving slot `slot`, watched (its own batch, or
    /// one a stand-in takes over), beginning `now`.
    fn help(
        self: &Arc<Self>,
        stand_in: &StandIn<E::Task>,
        slot: usize,
        batch: &Arc<SharedBatch<E::Task>>,
        now: std::time::Instant,
    ) {
        stand_in.begin(slot, batch, now);
        self.expire_claimed(batch, stand_in, slot);
        stand_in.end(slot);
    }

    /// Claims and expires the tasks of `batch` until none is left, each claim a step of
    /// slot `slot` (what the watchdog sees move). A panic escaping the target's
    /// `expire_one` is caught and reported; the claims go on.
    fn expire_claimed(
        self: &Arc<Self>,
        batch: &SharedBatch<E::Task>,
        stand_in: &StandIn<E::Task>,
        slot: usize,
    ) {
        let _inside = ExpiringHere::enter(self);
        let steps = stand_in.steps(slot);
        // The step first: the task is then claimed straight into the return value, not
        // kept aside across the step (about 10 instructions a claim). The watchdog reads
        // the steps without ordering them against the claims either way.
        let claim = || {
            steps.step();
            batch.claim()
        };
        let all = || self.target.expire_claimed(claim);
        // Again after a panic only while something is left: a target that panics after
        // its last claim would otherwise be called without end.
        while caught("expiry handler panicked; the batch goes on", all).is_none()
            && batch.has_unclaimed()
        {}
    }

    /// Starts the watchdog thread, with the reaper. If it cannot start, the reaper runs
    /// without stand-ins (reported).
    fn start_watchdog(self: &Arc<Self>, stand_in: &StandIn<E::Task>) {
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(stand_in.watchdog_name())
            .spawn(move || {
                let stand_in = shared.stand_in.as_ref().expect("started with one");
                let dropper = format!("{}-drop", stand_in.name());
                stand_in.watch(shared.target.core(), |free| shared.relieve(stand_in, free));
                // The last reference (a driver dropped from inside its own expiry work,
                // which does not join the watchdog) drops the target: user code, which
                // the watchdog never runs. It goes to a thread of its own (or, if none
                // can start, is dropped here after all, the watchdog stopped).
                if let Some(last) = Arc::into_inner(shared) {
                    let _ = std::thread::Builder::new()
                        .name(dropper)
                        .spawn(move || drop(last));
                }
            });
        match spawned {
            Ok(thread) => stand_in.keep_watchdog(thread),
            Err(error) => crate::user_code::event(
                || tracing::error!(target: "timer_core", %error, "the stand-in watchdog could not start"),
            ),
        }
    }

    /// Starts a stand-in's thread in slot `free` (taken for it, its first work posted
    /// there): it takes each work the watchdog hands it (claims the rest of a batch, or
    /// runs a round), then any late work there is, then waits parked for more a while
    /// (`stand_in.rs`). Returns its thread, or `None` if it could not start (the
    /// watchdog takes the work back and tries again at its next look).
    fn relieve(
        self: &Arc<Self>,
        stand_in: &StandIn<E::Task>,
        free: usize,
    ) -> Option<std::thread::JoinHandle<()>> {
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(stand_in.thread_name())
            .spawn(move || {
                let stand_in = shared.stand_in.as_ref().expect("started with one");
                stand_in.register(free);
                while let Some(work) = stand_in.next_work(free) {
                    if let Work::Batch(batch) = work {
                        // Counted before its first claim: a shutdown that already saw no
                        // round left finds the batch's owner done with it, every task
                        // claimed (`stand_in.rs`).
                        *shared.rounds.lock() += 1;
                        let _done = RoundDone(&shared);
                        shared.help(stand_in, free, &batch, std::time::Instant::now());
                    }
                    shared.stand_in_rounds(stand_in, free);
                    if shared.target.core().is_shutdown() {
                        break;
                    }
                }
                stand_in.leave(free);
            });
        match spawned {
            Ok(thread) => Some(thread),
            Err(error) => {
                stand_in.report_spawn_failure("a stand-in could not start", &error);
                None
            }
        }
    }

    /// A stand-in's work after what it was started for: claims from any late batch, or
    /// runs rounds (each waiting at most the watchdog's `look`, so that it looks that
    /// often whether it is still needed) while no other driving thread is in the core.
    /// Returns when neither is needed, or at shutdown.
    fn stand_in_rounds(self: &Arc<Self>, stand_in: &StandIn<E::Task>, slot: usize) {
        let mut driving = Driving {
            slot,
            batch: Arc::new(SharedBatch::new()),
            relief_floor: 0,
        };
        let mut buffer = Vec::new();
        let mut plan = Plan::now(self, NextRound::at_most(Duration::ZERO));
        let look = stand_in.look_period();
        loop {
            if self.target.core().is_shutdown() {
                return;
            }
            if let Some(batch) = stand_in.late_batch() {
                // Counted before the first claim: a shutdown that already saw no round
                // left finds its owner done with it, every task claimed (`stand_in.rs`).
                *self.rounds.lock() += 1;
                let _done = RoundDone(self);
                self.help(stand_in, slot, &batch, std::time::Instant::now());
                continue;
            }
            if stand_in.rounds_covered(slot) {
                return;
            }
            (_, plan) = self.round(plan, &mut buffer, Some(&mut driving));
            plan.wait = plan.wait.min(look);
        }
    }

    /// Waits until no round, pool batch, stolen batch or owner's work is in progress.
    fn wait_for_rounds(&self) {
        let mut rounds = self.rounds.lock();
        loop {
            while *rounds > 0 {
                rounds = self.rounds_done.wait_until(rounds, None);
            }
            // Held from this look to the wait: a worker's wake cannot fall in between.
            if !self.work.wait_for_any() {
                return;
            }
            rounds = self.rounds_done.wait_until(rounds, None);
        }
    }
}

/// Marks this thread as running expiry work of one driver (a round's batch, a pool
/// batch, shutdown's `finish`) until dropped, also when unwinding; restores what was
/// marked before (expiry work of another driver may nest).
struct ExpiringHere {
    outer: usize,
}

impl ExpiringHere {
    fn enter<E: Expire>(shared: &Arc<Shared<E>>) -> Self {
        let outer = EXPIRING.with(|e| e.replace(Arc::as_ptr(shared) as usize));
        ExpiringHere { outer }
    }
}

impl Drop for ExpiringHere {
    fn drop(&mut self) {
        EXPIRING.with(|e| e.set(self.outer));
    }
}

/// Marks a driver's shutdown done and wakes the callers waiting for it, when dropped
/// (also when unwinding).
struct StopDone<'a, E: Expire>(&'a Driver<E>);

impl<E: Expire> Drop for StopDone<'_, E> {
    fn drop(&mut self) {
        *self.0.stop.lock() = Stop::Done;
        self.0.stopped.notify_all();
    }
}

/// Ends one counted round, pool batch or stolen batch when dropped (also when
/// unwinding).
struct RoundDone<'a, E: Expire>(&'a Shared<E>);

impl<E: Expire> Drop for RoundDone<'_, E> {
    fn drop(&mut self) {
        let mut rounds = self.0.rounds.lock();
        *rounds -= 1;
        if *rounds == 0 {
            self.0.rounds_done.notify_all();
        }
    }
}

/// A driving thread's own: its slot (`stand_in.rs`) and the batch it refills each round.
struct Driving<T> {
    slot: usize,
    batch: Arc<SharedBatch<T>>,
    /// The relief of this thread's last hook that read the clock (nanoseconds on the
    /// stand-in's clock; 0 before the first): no later than any hook's it begins from
    /// now on (`StandIn::begin_hook`).
    relief_floor: u64,
}

fn reaper_loop<E: Expire>(shared: &Arc<Shared<E>>) {
    let mut batch = Vec::new();
    // Slot 0 is the reaper's.
    let mut driving = Driving {
        slot: 0,
        batch: Arc::new(SharedBatch::new()),
        relief_floor: 0,
    };
    // The first round waits for nothing; its `after_round` (watched, like every hook of
    // a round, see `Shared::hook`) says how long the next may wait.
    let mut plan = Plan::now(shared, NextRound::at_most(Duration::ZERO));
    if let Some(stand_in) = &shared.stand_in {
        stand_in.register(0);
    }
    while !shared.target.core().is_shutdown() {
        (_, plan) = shared.round(plan, &mut batch, Some(&mut driving));
    }
}
