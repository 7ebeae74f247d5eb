//! Relief by lateness: with the default inline executor, every due task is started within
//! a bound of its due time (20 ms by default) whatever holds the driving thread (one
//! callback that blocks, many short ones that add up, a panic printing its backtrace, a
//! slow subscriber or recorder, an owner's hook), as long as at most
//! [`DEFAULT_MAX_STAND_INS`] callbacks are held at once. The cost: a watchdog thread that
//! sleeps on an alarm while the driving threads keep up, the alarm armed when work
//! begins and put off as a driving thread goes to sleep in the core (on Linux a
//! `timerfd`, `alarm.rs`: a system call about once a `late` under a steady load, once a
//! round when rounds are further apart); one clock reading per batch, and per hook only
//! when the look has been put off past the thread's last reading (about once a `late`
//! under a steady load, [`StandIn::begin_hook`]); per task nothing but its claim and one
//! store on its thread's own line.
//! Where the alarm cannot move without waking the watchdog (another system, or no
//! descriptor to be had), the watchdog instead looks every half bound while expiry is
//! under way (about 100 wake-ups a second, 45 us of CPU each on the project's VM:
//! `benches/examples/timed_wake.rs`).
//!
//! # The rule
//! Work that another thread could take over is *late* once it has waited `late` (half the
//! bound, [`Timing`]):
//! - a batch's unclaimed tasks, from the moment the oldest of them came due (its bucket's
//!   due time, as the round that fired it read the clock: a batch fired late is late from
//!   the start; on a clock other than [`SystemClock`](crate::SystemClock), whose time need
//!   not be real time, from the moment it fired);
//! - the timer's earliest due bucket, while no driving thread is in the core to fire it
//!   (each is in a batch or in a round's hook), from its due time.
//!
//! At each look the watchdog starts stand-ins for late work. For a batch that did not
//! move since the last look (no thread on it claimed twice, the batch's claims grew by no
//! more than one a thread, once being the claim that may have led a thread into the task
//! it is held in, and no thread on it is runnable: on Linux the watchdog reads the state
//! of such threads, so that one the busy cores have not run is not taken for one held in
//! a wait), as many threads again as are held there, at least two, less those still
//! starting for it, so a run of held tasks is met in a few looks rather than one look
//! each. For a batch that moves but is still late (many short tasks adding up), one more
//! a look, and for the rounds one, both only while fewer threads are on moving batches
//! than twice the cores: past that the cores are busy with what is due, and a thread more
//! would share them, not add to them. While anything is late it looks again every `ramp` (a twentieth of the
//! bound); otherwise at the moment the first batch under way would become late, and,
//! without a quiet alarm, at least every `look` (half the bound). A batch that would
//! become late before the watchdog's next look arms the alarm for that moment (see
//! [`StandIn::begin`]; without a quiet alarm it wakes the watchdog to plan it), and a
//! hook for `late` from its beginning; a driving thread about to sleep in the core puts
//! the look off to `late` after its wake (or calls it off, for a sleep without a
//! deadline) if nothing else is under way and it will not be back before the look
//! ([`StandIn::sleeps_in_core`]): nothing can be late while a thread is in the core and
//! no batch has unclaimed tasks. So relief of a
//! batch or of the rounds begins about `late` after the work came due, and each further
//! held thread is met within a `ramp` or two. Measured in a release build: one callback
//! blocked, the others 10.5-12 ms late; sixteen at once, 15-19 ms in most runs (some
//! past the bound on a busy 2-core machine, up to 50 ms); fifty of 19 ms due 2 ms apart,
//! 11-15.5 ms (`purgatory/tests/on_time.rs`).
//!
//! A stand-in takes the work it was handed (claims from the batch, or runs a round), then,
//! until there is none: claims from any late batch, or runs rounds (each waiting at most
//! `look`, so it looks that often whether it is still needed) while no driving thread in
//! a lower slot is in the core. Then it parks for [`LINGER`] (a second), and the
//! watchdog's next relief wakes it rather than starting a thread; after that it leaves.
//! At most [`DEFAULT_MAX_STAND_INS`] stand-ins run or park at once
//! ([`DriverConfig::max_stand_ins`](crate::DriverConfig::max_stand_ins) sets it): past
//! that, late work waits for a thread to come back, the limit is counted
//! ([`TimerStats::stand_in_limit_reached`](crate::TimerStats)), a warning reported, and
//! the watchdog looks every `look` until a slot is free. (The limit counts as reached only
//! where relief was needed: a late batch whose threads are all held, or the rounds; not
//! for a spare.) A thread that cannot start is reported once with the count of failures,
//! and the looks slow to `look` until one starts.
//!
//! # Driving slots
//! Each driving thread (the reaper in slot 0, stand-ins in the others) owns a
//! [`DrivingSlot`]:
//!
//! | field | written by | read by |
//! |---|---|---|
//! | `in_use` | the watchdog taking a slot for a stand-in (a compare-and-swap), the stand-in leaving it | the watchdog; stand-ins looking for rounds to run or batches to join |
//! | `phase` | its thread: `IN_BATCH` at a batch's begin, `IN_HOOK` at a hook's, `IN_CORE` at their end, `PARKED` when it waits for work (under `mailbox`), `IN_CORE` when it leaves from there (a compare-and-swap); the watchdog: claims a parked slot (a compare-and-swap from `PARKED`) and marks a slot as on the work it posts | the watchdog; stand-ins |
//! | `steps` | its thread alone: +1 at each task claimed | the watchdog: how far it moved since the last look |
//! | `batch` | its thread at a batch's begin and end (under its lock); the watchdog, as it posts work | the watchdog and stand-ins, to join a late batch |
//! | `mailbox` | the watchdog, posting a stand-in's work (under the control lock, then this lock) | the stand-in, taking it (under this lock; parked, it waits on `doorbell`) |
//! | `tid` | its thread, when it starts | the watchdog, to read its state when its batch stalls |
//!
//! | phase | means | counts as |
//! |---|---|---|
//! | `IN_CORE` | in the core (firing, waiting for the next bucket) or the driver's own code between | able to fire what comes due |
//! | `IN_BATCH` | expiring a batch, one claimed task at a time (user code) | on that batch; may be held |
//! | `IN_HOOK` | in a round's hook (`before_round`, `after_round`: user code) | not firing; may be held |
//! | `PARKED` | a stand-in with nothing to do, waiting for work | free for the next relief; not under way |
//!
//! The watchdog's plan, `planned` (nanoseconds since `epoch`):
//!
//! | value | means | set by |
//! |---|---|---|
//! | [`IDLE`] | it sleeps until work begins | the watchdog, after a look with nothing under way ([`IDLE_AFTER`] such looks without a quiet alarm); a driving thread about to sleep in the core until woken, nothing else under way (a quiet alarm only) |
//! | a time | it looks then | the watchdog, before each sleep; a thread beginning work that would be late before it; a driving thread about to sleep in the core past it, nothing else under way, putting it off (a quiet alarm only) |
//! | [`NOW`] | it was woken to look at once | a thread beginning work it would otherwise look at too late (without a quiet alarm); shutdown |
//!
//! Every write of `planned` is made under the control lock together with the alarm's
//! (none for [`IDLE`], a passed deadline for [`NOW`]), so outside that lock the alarm
//! holds the plan; the watchdog sleeps on the alarm without the lock.
//!
//! # Invariants
//! - Every task of a batch is claimed exactly once, by its thread or a stand-in
//!   (`shared_batch.rs`), and expired by the claimer; nothing else moves a task. A batch
//!   is let go by its owner only once every task is claimed, so whoever drops the last
//!   reference (the watchdog's look included) drops no task.
//! - The work a stand-in takes over is counted as a round by the stand-in itself, before
//!   its first claim, until it finished it, so a shutdown from outside waits for it as
//!   for any round. A stand-in that counts itself after shutdown saw no round left finds
//!   nothing to claim: the batch's owner (counted in its round) ended its round only once
//!   every task was claimed, and every claimer counted itself before claiming.
//! - Work posted to a slot is taken by its stand-in: the watchdog posts to a slot it
//!   took, whose thread it then starts, or to a parked one it claimed from `PARKED`; a
//!   parked stand-in leaves only by moving its slot out of `PARKED` itself, so a claim and
//!   a leave cannot both succeed (the loom model below checks it).
//! - The watchdog never runs user code and never waits for it: it reads atomics, the
//!   slots' batch locks (held only to swap a pointer), the state of threads that look
//!   held (`/proc`), and the core's clock only if it is this crate's (for a user clock,
//!   its last reading plus the real time since, `TimerCore::overdue_nanos`); the last
//!   reference to the driver's state, if it holds it when it stops, goes to a thread of
//!   its own to be dropped (the owner's target is user code); its
//!   only waits are its own timed sleeps and the control lock, which nobody holds around
//!   user code. Its reports (the limit reached, a thread that could not start, stand-ins
//!   started) go to a reporter thread of their own ([`Reports`]), so a slow or blocked
//!   subscriber delays neither relief nor shutdown.
//! - No stand-in is started or handed work after shutdown stopped the watchdog: work is
//!   handed (and a stand-in spawned, its handle kept) under the control lock, after
//!   checking `Control::stopped` there; shutdown sets `stopped` and takes the handles
//!   under that lock, and wakes every parked stand-in, which leaves. A stand-in running
//!   then stops after its round, and an outside shutdown joins it.
//! - No work goes unwatched past its time: the watchdog publishes its plan and then reads
//!   every slot; a thread beginning work publishes its phase and batch and then reads the
//!   plan, arming the alarm (or waking the watchdog) if it would look too late. A thread
//!   putting the look off publishes the later plan and then reads every slot, keeping
//!   the plan if any is under way. `SeqCst` on all sides, so one sees the other
//!   (`sleep_until`, `put_off_if_quiet`; the loom models below check both).

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::alarm::Alarm;
use crate::core::TimerCore;
use crate::shared_batch::SharedBatch;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex};

/// The default bound: how late a due timeout may be started because of other code on
/// the driving threads, with up to [`DEFAULT_MAX_STAND_INS`] callbacks held at once.
pub const DEFAULT_STAND_IN_BOUND: Duration = Duration::from_millis(20);

/// The default limit of stand-in threads at once: so up to this many callbacks may be
/// held at once with every other timeout still on time.
pub const DEFAULT_MAX_STAND_INS: usize = 32;

/// The largest limit [`DriverConfig::max_stand_ins`](crate::DriverConfig::max_stand_ins)
/// accepts.
pub const MAX_STAND_INS_LIMIT: usize = 1024;

/// Looks with nothing under way after which the watchdog sleeps without a deadline.
const IDLE_AFTER: u32 = 4;

/// `StandIn::planned` while the watchdog sleeps without a deadline.
const IDLE: u64 = u64::MAX;

/// `StandIn::planned` once woken to look at once.
const NOW: u64 = 0;

/// How much earlier than the next work's relief a driving thread about to sleep puts
/// the watchdog's look off to ([`StandIn::sleeps_in_core`]).
const PUT_OFF_MARGIN: Duration = Duration::from_micros(100);

/// A driving thread in the core, or in the driver's own code between user code.
const IN_CORE: usize = 0;
/// A driving thread expiring a batch.
const IN_BATCH: usize = 1;
/// A driving thread in a round's hook.
const IN_HOOK: usize = 2;
/// A stand-in with nothing to do, waiting (up to [`LINGER`]) for the watchdog's next
/// relief rather than leaving at once.
const PARKED: usize = 3;

/// How long a stand-in with nothing to do waits for more before it leaves: relief that
/// comes again soon (callbacks slow for a while) wakes a thread rather than starting one.
#[cfg(not(loom))]
const LINGER: Duration = Duration::from_secs(1);
/// Under loom (no time) a parked stand-in tries to leave at once, and the models explore
/// that against the watchdog's hand-over.
#[cfg(loom)]
const LINGER: Duration = Duration::ZERO;

/// The watchdog's periods, from the bound.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// How long work may wait before a stand-in takes it over.
    late: Duration,
    /// The longest gap between two looks while work is under way.
    look: Duration,
    /// The gap between two looks while work is late.
    ramp: Duration,
}

impl Timing {
    /// The periods for `bound` (each at least 500 us, so that even the smallest bound a
    /// builder accepts, 1 ms, looks at most 2,000 times a second; a bound over an hour
    /// counts as an hour, so no period overflows a clock reading).
    pub(crate) fn of(bound: Duration) -> Self {
        let floor = Duration::from_micros(500);
        let bound = bound.min(Duration::from_secs(3600));
        Timing {
            late: (bound / 2).max(floor),
            look: (bound / 2).max(floor),
            ramp: (bound / 20).max(floor),
        }
    }
}

/// What a stand-in is started for.
pub(crate) enum Work<T> {
    /// The unclaimed tasks of a late batch (counted as a round by whoever starts it).
    Batch(Arc<SharedBatch<T>>),
    /// The rounds, while every driving thread is held in user code.
    Rounds,
}

/// One driving thread's slot (see the module doc), on a line of its own: its thread
/// writes `steps` once per task.
#[repr(align(128))]
pub(crate) struct DrivingSlot<T> {
    in_use: AtomicBool,
    phase: AtomicUsize,
    steps: AtomicU64,
    /// `steps` when its thread last began a batch: what a look measures its moves from
    /// when the batch began after the last look (with a quiet alarm, that look may be
    /// long ago).
    begun: AtomicU64,
    batch: Mutex<Option<Arc<SharedBatch<T>>>>,
    /// The work the watchdog hands the stand-in of this slot (started for it, or woken
    /// from `PARKED`), and where that stand-in waits for it.
    mailbox: Mutex<Option<Work<T>>>,
    doorbell: Condvar,
    /// Its thread's id in the kernel (Linux; 0 elsewhere, or not known yet), for the
    /// watchdog to tell a thread held in a wait from one the cores have not run
    /// ([`runnable`]).
    tid: AtomicU64,
}

impl<T> DrivingSlot<T> {
    fn new() -> Self {
        DrivingSlot {
            in_use: AtomicBool::new(false),
            phase: AtomicUsize::new(IN_CORE),
            steps: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            batch: Mutex::new(None),
            mailbox: Mutex::new(None),
            doorbell: Condvar::default(),
            tid: AtomicU64::new(0),
        }
    }

    /// One step of its thread (only its thread calls this: a plain increment).
    #[inline]
    fn step(&self) {
        self.steps
            .store(self.steps.load(Relaxed).wrapping_add(1), Relaxed);
    }

    /// Its batch, if its thread is in one.
    fn batch(&self) -> Option<Arc<SharedBatch<T>>> {
        if self.phase.load(SeqCst) != IN_BATCH {
            return None;
        }
        self.batch.lock().clone()
    }
}

/// One driving slot's step counter, held by its thread (see [`StandIn::steps`]).
pub(crate) struct Steps<'a, T>(&'a DrivingSlot<T>);

impl<T> Steps<'_, T> {
    /// Its thread claims a task of its batch (or finds none left).
    #[inline]
    pub(crate) fn step(&self) {
        self.0.step();
    }
}

/// What the control lock guards.
struct Control {
    /// Shutdown stopped the watchdog: no stand-in starts any more.
    stopped: bool,
    /// The watchdog's and the stand-ins' threads, for shutdown to join.
    threads: Vec<JoinHandle<()>>,
}

impl Control {
    /// Keeps a started thread's handle for shutdown to join, forgetting those finished.
    fn keep(&mut self, handle: JoinHandle<()>) {
        self.threads.retain(|thread| !thread.is_finished());
        self.threads.push(handle);
    }
}

/// The relief machinery of one driver (see the module doc).
pub(crate) struct StandIn<T> {
    timing: Timing,
    slots: Box<[DrivingSlot<T>]>,
    control: Mutex<Control>,
    /// What the watchdog sleeps on: set to `planned` (none for [`IDLE`], now for
    /// [`NOW`]) under the control lock, by whoever writes `planned`.
    alarm: Alarm,
    /// The alarm moves without waking the watchdog (`alarm.rs`): the driving threads
    /// then arm it for their work and put it off as they go to sleep in the core, and
    /// the watchdog sleeps whenever nothing is under way. Otherwise it keeps looking
    /// every `look` while tasks are claimed, and a thread beginning work it would look
    /// at too late wakes it.
    quiet_alarm: bool,
    /// When the watchdog looks next, in nanoseconds since `epoch`: [`IDLE`] while it
    /// sleeps without a deadline (nothing under way), [`NOW`] once woken to look at once.
    /// Written under the control lock.
    planned: AtomicU64,
    /// The origin of `planned`.
    epoch: Instant,
    /// Every slot was taken at the last attempt to relieve (counted and warned once per
    /// time the limit is reached).
    saturated: AtomicBool,
    /// Shutdown stopped the watchdog (`Control::stopped`, readable without the lock by
    /// parked stand-ins).
    stopping: AtomicBool,
    /// Slots ever taken (the highest index taken, plus one): the ones looks read, so a
    /// timer whose reaper never needed relief scans one slot, not the limit's worth.
    used: AtomicUsize,
    /// Most threads moving on batches (twice the cores, at least 4) beside which a look
    /// still starts a stand-in for a late batch whose threads all move, or for the
    /// rounds: more would share the cores, not their time, if the tasks compute.
    steady_cap: usize,
    reports: Arc<Reports>,
    /// The name of the driver's threads, for the stand-ins'.
    name: String,
}

impl<T> StandIn<T> {
    /// Relief for a driver whose threads are named `name`: a promise of `bound`, with up
    /// to `max_stand_ins` stand-ins at once (clamped to `1..=`[`MAX_STAND_INS_LIMIT`]).
    pub(crate) fn new(bound: Duration, max_stand_ins: usize, name: String) -> Self {
        let drivers = 1 + max_stand_ins.clamp(1, MAX_STAND_INS_LIMIT);
        let slots: Box<[DrivingSlot<T>]> = (0..drivers).map(|_| DrivingSlot::new()).collect();
        // Slot 0 is the reaper's, from its start.
        slots[0].in_use.store(true, Relaxed);
        let alarm = Alarm::new();
        let quiet_alarm = alarm.moves_quietly();
        StandIn {
            timing: Timing::of(bound),
            slots,
            control: Mutex::new(Control {
                stopped: false,
                threads: Vec::new(),
            }),
            alarm,
            quiet_alarm,
            planned: AtomicU64::new(IDLE),
            epoch: Instant::now(),
            saturated: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            used: AtomicUsize::new(1),
            steady_cap: std::thread::available_parallelism()
                .map_or(2, usize::from)
                .saturating_mul(2)
                .max(4),
            reports: Arc::default(),
            name,
        }
    }

    /// The longest a stand-in's round waits (it looks that often whether it is still
    /// needed).
    pub(crate) fn look_period(&self) -> Duration {
        self.timing.look
    }

    /// Slot `index`'s thread begins expiring `batch`, `now`.
    pub(crate) fn begin(&self, index: usize, batch: &Arc<SharedBatch<T>>, now: Instant) {
        let slot = &self.slots[index];
        *slot.batch.lock() = Some(Arc::clone(batch));
        slot.begun.store(slot.steps.load(Relaxed), Relaxed);
        slot.phase.store(IN_BATCH, SeqCst);
        // The batch may be late before the watchdog's next look: then it looks as soon
        // as it is, or a ramp from now if it is late already (see `sleep_until` for the
        // other side of this handshake): the alarm set for then, or, where the alarm
        // cannot move quietly, the watchdog woken to plan it.
        let relief_at = (batch.due_at() + self.timing.late).max(now + self.timing.ramp);
        if self.before_plan(relief_at, self.planned_look()) {
            if self.quiet_alarm {
                self.arm(relief_at);
            } else {
                self.wake_watchdog();
            }
        }
    }

    /// Slot `index`'s thread finished its batch (every task claimed).
    pub(crate) fn end(&self, index: usize) {
        let slot = &self.slots[index];
        slot.phase.store(IN_CORE, SeqCst);
        drop(slot.batch.lock().take());
    }

    /// Slot `index`'s step counter, for its thread about to claim the tasks of a batch:
    /// each [`Steps::step`] is then one increment, the slot looked up (and its index
    /// bounds-checked) once a batch rather than once a claim.
    #[inline]
    pub(crate) fn steps(&self, index: usize) -> Steps<'_, T> {
        Steps(&self.slots[index])
    }

    /// Slot `index`'s thread begins a round's hook (user code, with no batch). End it
    /// with [`end_hook`](Self::end_hook).
    ///
    /// `floor` is the thread's own, kept from hook to hook (0 at first): the relief of
    /// its last hook that read the clock, in nanoseconds since `epoch` like the plan, no
    /// later than this hook's. While the watchdog's look is planned no later than it
    /// (or is [`NOW`]), the hook needs no alarm and reads no clock: the look is put off
    /// about once a `late` under a steady load, so most hooks (both of a round, rounds
    /// 1 ms apart) skip the reading, the instant's add and the comparison with the plan
    /// as instants, about 70 instructions each.
    #[inline]
    pub(crate) fn begin_hook(&self, index: usize, floor: &mut u64) {
        self.slots[index].phase.store(IN_HOOK, SeqCst);
        if self.quiet_alarm {
            let planned = self.planned_look();
            // Held here, it holds up the rounds: their due work is late a `late` from
            // now at the latest, and `floor` is no later than that. A look planned no
            // later than `floor` comes no later than this hook's relief: no alarm.
            // (`NOW` is 0: no later than any floor.)
            if *floor >= planned {
                debug_assert!(!self.before_plan(Instant::now() + self.timing.late, planned));
                return;
            }
            self.hook_relief(floor, planned);
        } else if self.planned_look() == IDLE {
            self.wake_watchdog();
        }
    }

    /// [`begin_hook`](Self::begin_hook)'s relief, read from the clock when `floor` is
    /// earlier than the plan `planned`: the alarm is armed for it if the look would come
    /// too late, and it is the thread's new floor. Out of line, so that a hook that
    /// skips it is inlined with no frame of its own.
    #[cold]
    #[inline(never)]
    fn hook_relief(&self, floor: &mut u64, planned: u64) {
        let relief_at = Instant::now() + self.timing.late;
        *floor = self.nanos_at(relief_at);
        if self.before_plan(relief_at, planned) {
            self.arm(relief_at);
        }
    }

    /// Slot `index`'s thread finished a round's hook.
    #[inline]
    pub(crate) fn end_hook(&self, index: usize) {
        self.slots[index].phase.store(IN_CORE, SeqCst);
    }

    /// Slot `index`'s thread is in the core and about to sleep there until `wake` at the
    /// latest (`None`: until woken). Nothing is late while it sleeps, unless another
    /// driving thread is in a batch or a hook (no batch of its has unclaimed tasks, and
    /// it is in the core to fire what comes due). So with a quiet alarm, if the
    /// watchdog's look would come before this thread is back (a ramp before it), the
    /// look is put off to a `late` after its wake (the earliest its next work can be
    /// late), or called off if it sleeps until woken; unless another thread is under
    /// way. A driver that keeps up then never wakes the watchdog, and moves its alarm
    /// about once a `late` under a steady load (rounds a few milliseconds apart) or once
    /// a round when they are further apart. A move is a system call: a move a round
    /// (two, with the arm) cost the reaper about what the watchdog's wake-ups had cost,
    /// 25-45 us each on the project's VM (`docs/benchmarks.md`, round 17).
    #[inline]
    pub(crate) fn sleeps_in_core(&self, index: usize, wake: Option<Instant>) {
        debug_assert_eq!(self.slots[index].phase.load(Relaxed), IN_CORE);
        if !self.quiet_alarm {
            return;
        }
        // A plain load: this read only spares the lock when there is nothing to put
        // off (the decision is made under it). (Loom lets a read-modify-write, the
        // handshake's read there, write back a value older than a store made under the
        // lock meanwhile, which no real run can: a stop's `NOW` put off in the models.)
        let planned = self.planned.load(SeqCst);
        if planned == IDLE || planned == NOW {
            return;
        }
        match wake {
            // Back in the core before the look: the round then decides.
            Some(wake) if self.before_plan(wake + self.timing.ramp, planned) => {}
            // Its next work begins at `wake` at the earliest, so is late `late` after
            // it at the earliest (a little before: the two readings of the clock that
            // turn the wheel's times into instants differ by nanoseconds, and a look
            // later than a batch's relief would make the batch arm the alarm again).
            Some(wake) => {
                let next_relief = wake + self.timing.late;
                self.put_off_if_quiet(next_relief.checked_sub(PUT_OFF_MARGIN));
            }
            None => self.put_off_if_quiet(None),
        }
    }

    /// Moves the watchdog's look to `at`, if that is earlier than its plan: the alarm
    /// is set, the watchdog not woken (a quiet alarm only).
    fn arm(&self, at: Instant) {
        let _control = self.control.lock();
        let want = self.nanos_at(at).max(1);
        if want < self.planned.load(SeqCst) {
            self.planned.store(want, SeqCst);
            self.alarm.set(Some(at));
        }
    }

    /// Puts the watchdog's planned look off to `to` (`None`: off), unless a driving
    /// thread is in a batch or a hook, or the look is planned later already. The new
    /// plan is published before the slots are read: a thread beginning work publishes
    /// its phase before it reads the plan, so (all `SeqCst`) either it is seen here and
    /// the plan stands, or it reads the new one and arms the alarm for itself if it
    /// needs it earlier (the loom models below check it).
    fn put_off_if_quiet(&self, to: Option<Instant>) {
        let _control = self.control.lock();
        let planned = self.planned.load(SeqCst);
        if planned == IDLE || planned == NOW {
            return;
        }
        let plan = to.map_or(IDLE, |at| self.nanos_at(at).max(1));
        if plan <= planned {
            return;
        }
        self.planned.store(plan, SeqCst);
        if self.under_way() {
            // The alarm still holds the plan.
            self.planned.store(planned, SeqCst);
        } else {
            self.alarm.set(to);
        }
    }

    /// The watchdog's next look (`planned`), read for the handshake with `sleep_until`.
    #[inline]
    fn planned_look(&self) -> u64 {
        handshake_read(
            || self.planned.load(SeqCst),
            || self.planned.fetch_add(0, SeqCst),
        )
    }

    /// `at` in nanoseconds since `epoch` (0 before it; `epoch` is the watchdog's start,
    /// and a `u64` of nanoseconds lasts 584 years from there).
    #[inline]
    fn nanos_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Whether `nanos_at(at) < planned`, for the looks a driving thread compares with
    /// the plan as it begins work or goes to sleep (four a round), worked out as
    /// instants: `epoch` plus `planned` is an add, where `at`'s nanoseconds are a
    /// subtraction of instants and a conversion (about 55 instructions, a third of a
    /// batch's `begin`). The same answer: before `epoch` (where `nanos_at` is 0) `at`
    /// is before every plan but [`NOW`], and after it both count the same nanoseconds.
    #[inline]
    fn before_plan(&self, at: Instant, planned: u64) -> bool {
        planned != NOW
            && self
                .epoch
                .checked_add(Duration::from_nanos(planned))
                .is_none_or(|look| at < look)
    }

    /// Makes the watchdog look at once.
    #[cold]
    fn wake_watchdog(&self) {
        let _control = self.control.lock();
        self.planned.store(NOW, SeqCst);
        self.alarm.set(Some(Instant::now()));
    }

    /// A late batch with tasks left to claim, for a stand-in looking for work.
    pub(crate) fn late_batch(&self) -> Option<Arc<SharedBatch<T>>> {
        let now = Instant::now();
        self.live()
            .iter()
            .filter(|slot| slot.in_use.load(SeqCst))
            .filter_map(DrivingSlot::batch)
            .find(|batch| {
                batch.has_unclaimed()
                    && now.saturating_duration_since(batch.due_at()) >= self.timing.late
            })
    }

    /// Whether a driving thread in a slot below `me` is in the core, able to fire what
    /// comes due: a stand-in that finds one leaves the rounds to it. (Below, not other:
    /// two stand-ins in the core at once would each leave them to the other.)
    pub(crate) fn rounds_covered(&self, me: usize) -> bool {
        self.slots[..me]
            .iter()
            .any(|slot| slot.in_use.load(SeqCst) && slot.phase.load(SeqCst) == IN_CORE)
    }

    /// A stand-in leaves its slot.
    pub(crate) fn leave(&self, index: usize) {
        let slot = &self.slots[index];
        drop(slot.batch.lock().take());
        slot.phase.store(IN_CORE, SeqCst);
        slot.in_use.store(false, SeqCst);
    }

    /// Stops the watchdog: no stand-in starts or is woken with work after this, and
    /// those parked leave.
    pub(crate) fn stop(&self) {
        {
            let mut control = self.control.lock();
            control.stopped = true;
            // `NOW`, which nothing but the watchdog's next look replaces: a driving
            // thread still in a round cannot put the look (and this wake) off.
            self.planned.store(NOW, SeqCst);
            self.alarm.set(Some(Instant::now()));
        }
        self.stopping.store(true, SeqCst);
        for slot in self.slots.iter() {
            // Under its lock: a stand-in that has just seen no stop is in its wait.
            let _mailbox = slot.mailbox.lock();
            slot.doorbell.notify_all();
        }
    }

    /// The next work of the stand-in in slot `index`: what the watchdog handed it, or, if
    /// nothing is there, what it hands it while it waits parked (up to [`LINGER`]).
    /// `None`: nothing came, or shutdown began; the stand-in leaves.
    pub(crate) fn next_work(&self, index: usize) -> Option<Work<T>> {
        let slot = &self.slots[index];
        let mut mailbox = slot.mailbox.lock();
        if let Some(work) = mailbox.take() {
            return Some(work);
        }
        // Parked under the mailbox lock: the watchdog hands work to a parked slot only
        // after claiming it (a compare-and-swap away from `PARKED`), then posts it here
        // under this lock.
        drop(slot.batch.lock().take());
        slot.phase.store(PARKED, SeqCst);
        let deadline = Instant::now() + LINGER;
        loop {
            if let Some(work) = mailbox.take() {
                return Some(work);
            }
            let leaving = self.stopping.load(SeqCst) || Instant::now() >= deadline;
            if leaving
                && slot
                    .phase
                    .compare_exchange(PARKED, IN_CORE, SeqCst, Relaxed)
                    .is_ok()
            {
                return None;
            }
            // Not leaving, or claimed by the watchdog meanwhile: its work is on the way.
            let until = (!leaving).then_some(deadline);
            mailbox = slot.doorbell.wait_until(mailbox, until);
        }
    }

    /// Gives back every thread to join, once: the watchdog's first, then the
    /// stand-ins'. Called after [`stop`](Self::stop) by an outside shutdown; an inside
    /// one leaves them for the next outside call.
    pub(crate) fn take_threads(&self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut self.control.lock().threads)
    }

    /// Keeps the watchdog's handle for shutdown (started with the driver, before
    /// anyone can shut it down).
    pub(crate) fn keep_watchdog(&self, handle: JoinHandle<()>) {
        self.control.lock().keep(handle);
    }

    /// The name of a stand-in's thread.
    pub(crate) fn thread_name(&self) -> String {
        format!("{}-stand-in", self.name)
    }

    /// The thread of slot `index` (the calling thread) tells the watchdog who it is.
    pub(crate) fn register(&self, index: usize) {
        self.slots[index].tid.store(current_tid(), Relaxed);
    }

    /// The name of the driver's threads.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The name of the watchdog's thread.
    pub(crate) fn watchdog_name(&self) -> String {
        format!("{}-watchdog", self.name)
    }

    /// Reports that the watchdog (or a stand-in) could not start (through the
    /// reporter).
    pub(crate) fn report_spawn_failure(&self, what: &'static str, error: &std::io::Error) {
        self.report(|pending| {
            pending.failures += 1;
            pending.last_failure = Some((what, error.to_string()));
        });
    }

    /// Adds a report for the reporter, starting one if none runs (see [`Reports`]).
    fn report(&self, add: impl FnOnce(&mut Pending)) {
        if self.reports.add(add) {
            self.start_reporter();
        }
    }

    #[cfg(not(loom))]
    fn start_reporter(&self) {
        let reports = Arc::clone(&self.reports);
        let name = self.name.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{}-report", self.name))
            .spawn(move || reports.run(|pending| emit(&name, pending)));
        if spawned.is_err() {
            self.reports.not_started();
        }
    }

    /// Under loom no thread is spawned outside a model's own (the models drive
    /// [`Reports`] themselves).
    #[cfg(loom)]
    fn start_reporter(&self) {
        self.reports.not_started();
    }

    /// The watchdog's loop (see the module doc): `relieve` starts a stand-in for `work`
    /// in slot `free` (taken, and marked as on that work) and returns its thread, or
    /// `None` if it could not start. Returns when shutdown stops it.
    pub(crate) fn watch(
        &self,
        core: &TimerCore<T>,
        mut relieve: impl FnMut(usize) -> Option<JoinHandle<()>>,
    ) {
        let mut eyes = Eyes::new(self.slots.len());
        // After a look: the next one (`None`: nothing under way for a while, sleep
        // until work begins).
        let mut next: Option<Instant> = None;
        loop {
            if !self.sleep_until(next, &mut eyes) {
                return;
            }
            let now = Instant::now();
            next = match self.look_at(core, now, &mut eyes, &mut relieve) {
                // At the limit, or unable to start a thread, no look can start anything:
                // looks slow down to `look` until one does.
                Seen::Late if eyes.slow => now.checked_add(self.timing.look),
                Seen::Late => now.checked_add(self.timing.ramp),
                Seen::UnderWay(due) => {
                    eyes.quiet = 0;
                    Some(due)
                }
                // With a quiet alarm, the next work arms it: nothing to look at till then.
                Seen::Quiet if self.quiet_alarm => None,
                Seen::Quiet => {
                    eyes.quiet += 1;
                    if eyes.quiet >= IDLE_AFTER {
                        eyes.quiet = 0;
                        None
                    } else {
                        now.checked_add(self.timing.look)
                    }
                }
            };
        }
    }

    /// The watchdog's sleep until `next` (`None`: until work begins), or until woken to
    /// look at once. Returns false once shutdown stopped it.
    ///
    /// The handshake with a driving thread: the watchdog publishes its plan (`planned`)
    /// and then reads every slot's phase and batch; a thread beginning work publishes its
    /// phase and batch and then reads the plan, and wakes the watchdog if it would look
    /// too late (idle, or after the batch becomes late). All `SeqCst`: one of the two
    /// sees the other, so no work goes unwatched past its time (the loom model below
    /// checks it). The wake comes under the control lock, held here from the plan to the
    /// wait, so it cannot fall in between.
    fn sleep_until(&self, next: Option<Instant>, eyes: &mut Eyes) -> bool {
        let mut at = next;
        loop {
            let control = self.control.lock();
            if control.stopped {
                return false;
            }
            // Whether this sleep changed the plan: if not, the alarm holds it already.
            let mut replanned = false;
            loop {
                let planned = self.planned.load(SeqCst);
                if planned == NOW {
                    // Woken: look at once.
                    let looking = self.nanos_at(Instant::now()).max(1);
                    self.planned.store(looking, SeqCst);
                    eyes.looked_on = looking;
                    return true;
                }
                if planned != IDLE && planned != eyes.looked_on {
                    // A driving thread moved the look (`arm`, or a put-off): earlier
                    // counts. (The plan this watchdog last looked on is its own, passed:
                    // taken for an arm, it would look again at once, without end.)
                    let theirs = self.epoch + Duration::from_nanos(planned);
                    if at.is_none_or(|at| theirs < at) {
                        at = Some(theirs);
                    }
                }
                if at.is_some_and(|at| Instant::now() >= at) {
                    eyes.looked_on = planned;
                    return true;
                }
                let plan = at.map_or(IDLE, |at| self.nanos_at(at).max(1));
                if plan == planned {
                    break;
                }
                self.planned.store(plan, SeqCst);
                replanned = true;
                // Work that began before the plan was published read the old one: it
                // is looked at here.
                if let Some(relief) = self.first_relief() {
                    // (A batch late already was looked at just now: the next look is a
                    // ramp away, as after any late look, or a look away when looks can
                    // start nothing.)
                    let floor = if eyes.slow {
                        self.timing.look
                    } else {
                        self.timing.ramp
                    };
                    let relief = relief.max(Instant::now() + floor);
                    if at.is_none_or(|at| relief < at) {
                        at = Some(relief);
                        continue;
                    }
                }
                if at.is_none() && self.under_way() {
                    // Not idle after all: look again a whole period from now.
                    at = Instant::now().checked_add(self.timing.look);
                    continue;
                }
                break;
            }
            // The alarm holds the plan; sleep on it without the control lock, which
            // driving threads take to move it. A move or a stop that comes between the
            // unlock and the wait is not lost: the alarm's deadline has passed then.
            if replanned {
                self.alarm.set(at);
            }
            drop(control);
            self.alarm.wait();
            if at.is_none() {
                // After a sleep without a deadline, the last look is no measure.
                eyes.forget();
            }
        }
    }

    /// When the earliest batch under way with unclaimed tasks becomes late (for the
    /// watchdog's side of the handshake).
    fn first_relief(&self) -> Option<Instant> {
        self.live()
            .iter()
            .filter(|slot| {
                handshake_read(
                    || slot.phase.load(SeqCst),
                    || slot.phase.fetch_add(0, SeqCst),
                ) == IN_BATCH
            })
            .filter_map(|slot| slot.batch.lock().clone())
            .filter(|batch| batch.has_unclaimed())
            .map(|batch| batch.due_at() + self.timing.late)
            .min()
    }

    /// Whether any driving thread is in a batch or a hook.
    fn under_way(&self) -> bool {
        self.live().iter().any(|slot| {
            let phase = handshake_read(
                || slot.phase.load(SeqCst),
                || slot.phase.fetch_add(0, SeqCst),
            );
            phase == IN_BATCH || phase == IN_HOOK
        })
    }

    /// One look at every driving slot and the core: starts the stand-ins late work
    /// needs, and says when to look next.
    fn look_at(
        &self,
        core: &TimerCore<T>,
        now: Instant,
        eyes: &mut Eyes,
        relieve: &mut impl FnMut(usize) -> Option<JoinHandle<()>>,
    ) -> Seen {
        let Timing { late, look, ramp } = self.timing;
        // The batches under way, each with the threads on it and how many of them made
        // a step since the last look (a stand-in not started yet is on it, not moving).
        let mut batches: Vec<OnBatch<T>> = Vec::new();
        let mut in_core = false;
        let mut busy = false;
        let mut stepped = false;
        // Threads on batches that move: while there are twice the cores of them, the
        // cores are busy with what is due, and more threads would share them, not add to
        // them.
        let mut computing = 0;
        for (i, slot) in self.live().iter().enumerate() {
            if !slot.in_use.load(SeqCst) {
                eyes.seen[i] = FRESH;
                eyes.unstarted[i] = None;
                continue;
            }
            let steps = slot.steps.load(Relaxed);
            // Moving: two claims or more since the last look (one may be the claim that
            // led it into the task it is held in now, so it finished at least one). A
            // stand-in counts from its steps when it was started (no claim yet: not
            // running, not moving); with a quiet alarm, a slot whose batch began after
            // the last look from its steps then; without one, a slot not seen since an
            // idle sleep as moving (woken by the batch's beginning, the look has no
            // time to judge by).
            let mut started = true;
            let base = match eyes.unstarted[i] {
                Some(at_start) if at_start == steps => {
                    started = false;
                    at_start
                }
                Some(at_start) => {
                    eyes.unstarted[i] = None;
                    at_start
                }
                // With a quiet alarm, a slot that began its batch after the last look
                // (which may be long ago: the driving threads moved the look while they
                // kept up) counts its moves from the batch's beginning.
                None if self.quiet_alarm => {
                    let begun = slot.begun.load(Relaxed);
                    let seen = eyes.seen[i];
                    if seen == FRESH || begun.wrapping_sub(seen) < u64::MAX / 2 {
                        begun
                    } else {
                        seen
                    }
                }
                None => eyes.seen[i],
            };
            let moved = base == FRESH || steps.wrapping_sub(base) >= 2;
            stepped |= eyes.seen[i] != steps;
            eyes.seen[i] = steps;
            match slot.phase.load(SeqCst) {
                IN_CORE => in_core = true,
                PARKED => {}
                IN_BATCH => {
                    busy = true;
                    if let Some(batch) = slot.batch.lock().clone() {
                        match batches.iter_mut().find(|on| Arc::ptr_eq(&on.batch, &batch)) {
                            Some(on) => {
                                on.threads += 1;
                                on.moving += usize::from(moved);
                                on.starting += usize::from(!started);
                                if started {
                                    on.held.push(i);
                                }
                            }
                            None => batches.push(OnBatch {
                                batch,
                                threads: 1,
                                moving: usize::from(moved),
                                starting: usize::from(!started),
                                held: if started { vec![i] } else { Vec::new() },
                            }),
                        }
                    }
                }
                _ => busy = true,
            }
        }
        if !busy {
            // Without a quiet alarm, quiet only when nothing was claimed since the last
            // look either: under a steady load it keeps looking every `look` rather than
            // sleeping and being woken by the next batch. With one, the next batch arms
            // it without a wake.
            return if stepped && !self.quiet_alarm {
                Seen::UnderWay(now + look)
            } else {
                Seen::Quiet
            };
        }
        // Each batch's progress since the last look: claims beyond the one each thread on
        // it may have made into the task it is held in. Under load that starves the
        // threads (the cores busy with what is due), a thread may make no claim in a look
        // while the batch as a whole moves: it is the batch that must stall.
        let last = std::mem::take(&mut eyes.claims);
        for on in &mut batches {
            let claims = on.batch.claims();
            let key = (Arc::as_ptr(&on.batch) as usize, on.batch.due_at());
            let before = last.iter().find(|(k, _)| *k == key).map(|(_, c)| *c);
            // (A batch not seen at the last look goes by its threads' own claims.)
            let progress = before.map_or(0, |before| claims.saturating_sub(before));
            // (And a thread the kernel has runnable is not held: it waits for a core, not
            // for its callback.)
            let runnable = || {
                on.held
                    .iter()
                    .any(|&i| runnable(self.slots[i].tid.load(Relaxed)))
            };
            if on.moving > 0 || progress > on.threads || runnable() {
                on.moving = on.moving.max(1);
                computing += on.threads;
            }
            eyes.claims.push((key, claims));
        }
        let mut is_late = false;
        let mut due = now + look;
        for OnBatch {
            batch,
            threads,
            moving,
            starting,
            ..
        } in batches
        {
            if !batch.has_unclaimed() {
                continue;
            }
            let since = batch.due_at();
            if now.saturating_duration_since(since) < late {
                due = due.min(since + late);
                continue;
            }
            is_late = true;
            // Nobody on it moved in a whole look: as many threads again as are held
            // (at least two), so that a run of held tasks is met in a few looks (the
            // threads still starting for it are not held, nor counted again). Someone
            // moves but it is still late (many short tasks adding up): one more, once
            // per `late`.
            let held = threads - starting;
            let (wanted, needed) = if moving == 0 {
                // Held: as many again, less those already starting for it; the first of
                // them is needed (nobody else will claim the rest), the others spares.
                (held.max(2).saturating_sub(starting), starting == 0)
            } else if computing < self.steady_cap && eyes.steady_due(now, ramp) {
                // Moving but late: one more a look, while fewer threads move than twice
                // the cores (more would share the cores, not their time, when the tasks
                // compute).
                computing += 1;
                (1, false)
            } else {
                (0, false)
            };
            for i in 0..wanted {
                match self.start(core, Work::Batch(Arc::clone(&batch)), relieve) {
                    Ok((free, steps)) => eyes.started(free, steps),
                    Err(refused) => {
                        eyes.refused(refused, needed && i == 0, core, self);
                        break;
                    }
                }
            }
        }
        if !in_core && computing < self.steady_cap {
            if let Some(overdue) = core.overdue_nanos() {
                let late_nanos = late.as_nanos() as i128;
                if overdue >= late_nanos {
                    is_late = true;
                    match self.start(core, Work::Rounds, relieve) {
                        Ok((free, steps)) => eyes.started(free, steps),
                        Err(refused) => eyes.refused(refused, true, core, self),
                    }
                } else {
                    let until = u64::try_from(late_nanos - overdue).unwrap_or(u64::MAX);
                    due = due.min(now + Duration::from_nanos(until).min(look));
                }
            }
        }
        if is_late {
            Seen::Late
        } else {
            Seen::UnderWay(due.max(now + ramp))
        }
    }

    /// Hands `work` to a stand-in: a parked one if there is one, else a new one in a free
    /// slot (`spawn` starts its thread, or returns `None`). Returns the slot and its
    /// steps before the hand-over, or why not.
    fn start(
        &self,
        core: &TimerCore<T>,
        work: Work<T>,
        spawn: &mut impl FnMut(usize) -> Option<JoinHandle<()>>,
    ) -> Result<(usize, u64), Refused> {
        // Under the control lock, which shutdown takes to stop the watchdog: a stand-in
        // is handed work (and started) before the stop, and joined, or not at all.
        let mut control = self.control.lock();
        if control.stopped {
            return Err(Refused::Stopped);
        }
        let (index, spawned) = match self.take_parked() {
            Some(parked) => (parked, false),
            None => match self.take_slot() {
                Some(free) => (free, true),
                None => return Err(Refused::Limit),
            },
        };
        let slot = &self.slots[index];
        // Read before the thread can step (only it writes them).
        let steps = slot.steps.load(Relaxed);
        self.post(index, work);
        if spawned {
            match spawn(index) {
                Some(thread) => control.keep(thread),
                None => {
                    drop(control);
                    drop(slot.mailbox.lock().take());
                    self.leave(index);
                    return Err(Refused::Spawn);
                }
            }
        }
        drop(control);
        self.saturated.store(false, Relaxed);
        core.relief().started.fetch_add(1, Relaxed);
        self.report(|pending| pending.started += 1);
        Ok((index, steps))
    }

    /// The limit was reached where relief was needed (a late batch whose every thread is
    /// held, or the rounds): counted and reported once until a stand-in starts again.
    fn limit_reached(&self, core: &TimerCore<T>) {
        if !self.saturated.swap(true, Relaxed) {
            core.relief().limit_reached.fetch_add(1, Relaxed);
            self.report(|pending| pending.limit_reached += 1);
        }
    }

    /// Posts `work` to slot `index` (taken, or claimed from `PARKED`), marking the slot as
    /// on it, so that the next look counts its thread there.
    fn post(&self, index: usize, work: Work<T>) {
        let slot = &self.slots[index];
        match &work {
            Work::Batch(batch) => {
                *slot.batch.lock() = Some(Arc::clone(batch));
                slot.phase.store(IN_BATCH, SeqCst);
            }
            Work::Rounds => slot.phase.store(IN_CORE, SeqCst),
        }
        let mut mailbox = slot.mailbox.lock();
        *mailbox = Some(work);
        slot.doorbell.notify_all();
    }

    /// Claims a parked stand-in's slot for work (it stays in use).
    fn take_parked(&self) -> Option<usize> {
        (1..self.slots.len()).find(|&i| {
            self.slots[i]
                .phase
                .compare_exchange(PARKED, IN_CORE, SeqCst, Relaxed)
                .is_ok()
        })
    }

    /// Takes a free slot for a stand-in (the watchdog alone takes slots).
    fn take_slot(&self) -> Option<usize> {
        let free = (1..self.slots.len()).find(|&i| {
            self.slots[i]
                .in_use
                .compare_exchange(false, true, SeqCst, Relaxed)
                .is_ok()
        })?;
        self.used.fetch_max(free + 1, Release);
        Some(free)
    }

    /// The slots ever taken (see `used`).
    #[inline]
    fn live(&self) -> &[DrivingSlot<T>] {
        &self.slots[..self.used.load(Acquire)]
    }
}

/// Emits `pending` reports of the driver whose threads are named `name`, on the
/// reporter thread, each event through the door (a subscriber that panics loses it).
#[cfg(not(loom))]
fn emit(name: &str, pending: Pending) {
    use crate::user_code::event;
    if pending.started > 0 {
        event(|| {
            tracing::debug!(
                target: "timer_core",
                driver = name,
                started = pending.started,
                "stand-ins started to relieve late expiry"
            )
        });
    }
    if pending.limit_reached > 0 {
        event(|| {
            tracing::warn!(
                target: "timer_core",
                driver = name,
                times = pending.limit_reached,
                "every stand-in slot was taken: expiry behind the held callbacks waits for one of them (see max_stand_ins)"
            )
        });
    }
    if let Some((what, error)) = &pending.last_failure {
        let times = pending.failures;
        event(|| tracing::error!(target: "timer_core", driver = name, times, %error, "{what}"));
    }
}

/// A read of the idle handshake: `SeqCst` loads; under loom read-modify-writes (`rmw`),
/// since loom lets both sides of a store-then-load pair read the old value, which no real
/// run can (the same workaround as `work.rs`).
#[inline(always)]
fn handshake_read<R>(load: impl FnOnce() -> R, rmw: impl FnOnce() -> R) -> R {
    #[cfg(loom)]
    {
        let _ = load;
        rmw()
    }
    #[cfg(not(loom))]
    {
        let _ = rmw;
        load()
    }
}

/// `Eyes::seen` of a slot no thread has stepped in since the watchdog last saw it taken:
/// a stand-in just started is not held at its first look.
const FRESH: u64 = u64::MAX;

/// What the watchdog remembers between looks.
struct Eyes {
    /// Each slot's steps at the last look (`FRESH` for a slot not in use then).
    seen: Vec<u64>,
    /// For a stand-in started and not seen to step since: its slot's steps then.
    unstarted: Vec<Option<u64>>,
    /// Looks in a row with nothing under way.
    quiet: u32,
    /// When a stand-in was last started for a late batch whose threads were all making
    /// steps (at most one per `late`).
    last_steady: Option<Instant>,
    /// The last look could start nothing it needed (the limit, or no thread): the next
    /// looks come every `look`, not every `ramp`, until one starts something.
    slow: bool,
    /// The claims of each batch under way at the last look, by batch (its address and
    /// the due time of its fill).
    claims: Vec<((usize, Instant), usize)>,
    /// The plan (`StandIn::planned`) the watchdog last returned from its sleep to look
    /// on: its own, passed, until a driving thread or the next plan replaces it.
    looked_on: u64,
}

impl Eyes {
    fn new(slots: usize) -> Self {
        Eyes {
            seen: vec![FRESH; slots],
            unstarted: vec![None; slots],
            quiet: 0,
            last_steady: None,
            slow: false,
            claims: Vec::new(),
            looked_on: NOW,
        }
    }

    /// A start was refused; `needed`: the work had no other thread (the limit then
    /// counts as reached).
    fn refused<T>(&mut self, refused: Refused, needed: bool, core: &TimerCore<T>, of: &StandIn<T>) {
        match refused {
            Refused::Limit if needed => {
                of.limit_reached(core);
                self.slow = true;
            }
            Refused::Spawn => self.slow = true,
            Refused::Limit | Refused::Stopped => {}
        }
    }

    /// A stand-in was started in slot `index`, whose steps were `steps` before: it is
    /// not running until they move.
    fn started(&mut self, index: usize, steps: u64) {
        self.slow = false;
        self.seen[index] = FRESH;
        self.unstarted[index] = Some(steps);
    }

    /// Forgets every slot's steps (after an idle sleep, the last look is no measure).
    fn forget(&mut self) {
        self.seen.fill(FRESH);
        self.quiet = 0;
    }

    /// Whether a stand-in may be started for a late batch whose threads all make steps
    /// (at most one per `late`), and if so notes it.
    fn steady_due(&mut self, now: Instant, late: Duration) -> bool {
        let due = self
            .last_steady
            .is_none_or(|last| now.saturating_duration_since(last) >= late);
        if due {
            self.last_steady = Some(now);
        }
        due
    }
}

/// A batch under way, as one look saw it.
struct OnBatch<T> {
    batch: Arc<SharedBatch<T>>,
    /// Driving threads on it (a stand-in started for it and not running yet included).
    threads: usize,
    /// Those that made a step since the last look.
    moving: usize,
    /// Stand-ins started for it and not running yet.
    starting: usize,
    /// The slots of the threads on it that are running (their claims may be held).
    held: Vec<usize>,
}

/// The calling thread's id in the kernel (Linux), or 0.
fn current_tid() -> u64 {
    #[cfg(all(target_os = "linux", not(loom)))]
    {
        // SAFETY: `gettid` takes nothing and cannot fail.
        u64::try_from(unsafe { libc::gettid() }).unwrap_or(0)
    }
    #[cfg(not(all(target_os = "linux", not(loom))))]
    {
        0
    }
}

/// Whether the thread `tid` of this process is runnable (`R`: on a core or waiting for
/// one) rather than waiting for something (`S`, `D`: sleeping, blocked), by its
/// `/proc/self/task/<tid>/stat` (Linux). Unknown (another system, no `/proc`, a thread
/// gone): false, so it counts as held, as its claims say. Only for threads that made no
/// claim for a look on a batch still late: a few reads a relief, none in steady work.
fn runnable(tid: u64) -> bool {
    if tid == 0 {
        return false;
    }
    let Ok(stat) = std::fs::read(format!("/proc/self/task/{tid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may hold any
    // byte: after the last `)`.
    stat.iter()
        .rposition(|&b| b == b')')
        .and_then(|end| stat.get(end + 2))
        .is_some_and(|&state| state == b'R')
}

/// Why a stand-in was not handed work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refused {
    /// Every slot is taken.
    Limit,
    /// Shutdown stopped the watchdog.
    Stopped,
    /// No thread could be started.
    Spawn,
}

/// What one look saw.
enum Seen {
    /// Nothing under way.
    Quiet,
    /// Work under way, none of it late: look again at this moment.
    UnderWay(Instant),
    /// Work late (relieved, or waiting for a slot).
    Late,
}

/// The relief machinery's reports, emitted on a reporter thread of their own (at most one
/// at a time, started when a report is added and none runs, gone when none is left): the
/// subscriber is user code, and neither the watchdog nor a driving thread nor shutdown
/// waits for it. Reports pile up as counts while the reporter is busy, so a slow
/// subscriber gets fewer, larger reports, never a backlog. (The counts go to the stats at
/// once, `TimerStats::stand_ins`.)
///
/// The hand-over: an adder writes its report under the lock, then sets `running`; if it
/// was set, the reporter running takes it. The reporter takes everything pending under
/// the lock, emits it, and once it finds nothing, clears `running` and looks again: a
/// report added between its take and its clear either saw `running` clear (and started a
/// reporter of its own) or is found by this second look. `SeqCst` on both sides; the loom
/// model below checks that no report is left behind.
#[derive(Default)]
pub(crate) struct Reports {
    pending: Mutex<Pending>,
    /// A reporter thread runs.
    running: AtomicBool,
}

/// Reports not emitted yet.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(crate) started: u64,
    pub(crate) limit_reached: u64,
    /// Threads that could not start, and the last one's error (one report for all).
    pub(crate) failures: u64,
    pub(crate) last_failure: Option<(&'static str, String)>,
}

impl Pending {
    // (Under loom no reporter runs outside the models, which drive `Reports` themselves.)
    #[cfg_attr(loom, allow(dead_code))]
    fn is_empty(&self) -> bool {
        self.started == 0 && self.limit_reached == 0 && self.failures == 0
    }
}

impl Reports {
    /// Adds a report (`add` writes it into the pending ones); returns whether the caller
    /// must start a reporter (none runs), which then calls [`run`](Self::run).
    #[must_use]
    pub(crate) fn add(&self, add: impl FnOnce(&mut Pending)) -> bool {
        add(&mut self.pending.lock());
        !self.running.swap(true, SeqCst)
    }

    /// A reporter could not start: the reports stay pending for the next one.
    pub(crate) fn not_started(&self) {
        self.running.swap(false, SeqCst);
    }

    /// The reporter's loop: emits what is pending until nothing is.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn run(&self, mut emit: impl FnMut(Pending)) {
        loop {
            let pending = std::mem::take(&mut *self.pending.lock());
            if !pending.is_empty() {
                emit(pending);
                continue;
            }
            // (A swap, not a store: a plain store may land between the read and the
            // write of an adder's swap under loom, which real hardware never does,
            // tokio-rs/loom#254.)
            self.running.swap(false, SeqCst);
            // A report added since the take, whose adder saw `running` still set, is
            // this reporter's: look again, unless a new reporter took over meanwhile.
            let empty = self.pending.lock().is_empty();
            if empty || self.running.swap(true, SeqCst) {
                return;
            }
        }
    }
}

/// The hand-overs of relief, modelled. Run with `RUSTFLAGS="--cfg loom" cargo test -p
/// purgatory-timer --lib --release stand_in`.
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// `before_plan` answers what `nanos_at(at) < planned` answers, for instants before,
    /// at and after the epoch and plans from `NOW` to `IDLE`.
    #[test]
    fn a_look_compared_as_instants_answers_as_in_nanoseconds() {
        let stand_in: StandIn<u8> = StandIn::new(Duration::from_millis(20), 1, "t".into());
        let epoch = stand_in.epoch;
        let mut instants = vec![epoch];
        for nanos in [1, 999, 1_000_000, 3_600_000_000_000] {
            let d = Duration::from_nanos(nanos);
            instants.push(epoch + d);
            instants.extend(epoch.checked_sub(d));
        }
        let plans = [
            NOW,
            1,
            998,
            999,
            1_000,
            1_000_000,
            u64::MAX / 2,
            IDLE - 1,
            IDLE,
        ];
        for &at in &instants {
            for &planned in &plans {
                assert_eq!(
                    stand_in.before_plan(at, planned),
                    stand_in.nanos_at(at) < planned,
                    "at {:?} from the epoch, plan {planned}",
                    at.checked_duration_since(epoch)
                );
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use std::sync::atomic::Ordering::SeqCst as Std;

    use loom::sync::Arc;

    use super::*;

    /// A report added while the reporter finishes is emitted: by that reporter or by one
    /// its adder starts; never lost, never emitted twice.
    #[test]
    fn no_report_is_left_behind() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let reports = Arc::new(Reports::default());
            let emitted = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let run = |reports: Arc<Reports>, emitted: Arc<std::sync::atomic::AtomicU64>| {
                loom::thread::spawn(move || {
                    reports.run(|pending| {
                        emitted.fetch_add(pending.started, Std);
                    })
                })
            };
            // A first report starts the first reporter.
            assert!(reports.add(|p| p.started += 1));
            let first = run(Arc::clone(&reports), Arc::clone(&emitted));
            // A second report races its finish.
            let second = reports
                .add(|p| p.started += 1)
                .then(|| run(Arc::clone(&reports), Arc::clone(&emitted)));
            first.join().unwrap();
            if let Some(second) = second {
                second.join().unwrap();
            }
            assert_eq!(emitted.load(Std), 2, "each report emitted once");
        });
    }

    /// The hand-over to a parked stand-in: the watchdog claims the slot and posts work
    /// while the stand-in, having waited its while, tries to leave. Either it gets the
    /// work, or the claim fails and it leaves; never a claim whose work nobody takes, nor
    /// a stand-in waiting for work that never comes (a deadlock in the model).
    #[test]
    fn a_parked_stand_in_takes_the_work_or_leaves_unclaimed() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let stand_in: Arc<StandIn<()>> =
                Arc::new(StandIn::new(Duration::from_millis(20), 1, "m".into()));
            stand_in.slots[1].in_use.store(true, SeqCst);
            let parked = {
                let stand_in = Arc::clone(&stand_in);
                loom::thread::spawn(move || stand_in.next_work(1).is_some())
            };
            let handed = match stand_in.take_parked() {
                Some(index) => {
                    stand_in.post(index, Work::Rounds);
                    true
                }
                None => false,
            };
            assert_eq!(parked.join().unwrap(), handed, "the work handed was taken");
        });
    }

    /// The handshake of `sleep_until` and a hook's begin: a hook that begins while the
    /// watchdog goes idle is seen by it, or wakes it (a lost wake deadlocks the model).
    #[test]
    fn a_hook_never_begins_unwatched() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let stand_in: Arc<StandIn<()>> =
                Arc::new(StandIn::new(Duration::from_millis(20), 1, "m".into()));
            // Not idle yet: the worker may read the old plan.
            stand_in.planned.store(1, SeqCst);
            let worker = {
                let stand_in = Arc::clone(&stand_in);
                loom::thread::spawn(move || stand_in.begin_hook(0, &mut 0))
            };
            let mut eyes = Eyes::new(2);
            assert!(stand_in.sleep_until(None, &mut eyes), "the watchdog looks");
            worker.join().unwrap();
        });
    }

    /// The handshake of a driving thread about to sleep in the core (`sleeps_in_core`,
    /// which puts the watchdog's look off, to `wake`'s relief or altogether) and a batch
    /// beginning on another slot, which would leave the look where it is if it read the
    /// plan before it was put off: either the put-off sees the batch and keeps the plan,
    /// or the batch reads the later plan and arms the alarm itself. Never a batch under
    /// way with its look planned after it would be late.
    fn a_batch_beginning_while_the_look_is_put_off_stays_watched(wake: Option<Duration>) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(move || {
            let stand_in: Arc<StandIn<u8>> =
                Arc::new(StandIn::new(Duration::from_millis(20), 1, "m".into()));
            assert!(stand_in.quiet_alarm, "loom models the quiet alarm");
            // A stand-in's slot, taken as the watchdog takes it.
            assert_eq!(stand_in.take_slot(), Some(1));
            // The reaper's last batch armed a look an hour from now.
            let armed = Instant::now() + Duration::from_secs(3600);
            stand_in.arm(armed);
            let mut tasks = vec![1u8];
            let mut batch = SharedBatch::new();
            // Due after the look planned (a thread that reads that plan arms nothing),
            // before the reaper's next wake.
            let due = armed + Duration::from_secs(60);
            batch.refill(&mut tasks, due);
            let batch = std::sync::Arc::new(batch);
            let stand_in_b = Arc::clone(&stand_in);
            let begins = loom::thread::spawn(move || stand_in_b.begin(1, &batch, Instant::now()));
            stand_in.sleeps_in_core(0, wake.map(|wake| armed + wake));
            begins.join().unwrap();
            let planned = stand_in.planned.load(SeqCst);
            assert_ne!(planned, IDLE, "a batch under way with no look planned");
            let look = stand_in.epoch + Duration::from_nanos(planned);
            assert_eq!(
                stand_in.alarm.deadline(),
                Some(look),
                "the alarm holds the plan"
            );
            assert!(look <= due + stand_in.timing.late, "the look comes in time");
        });
    }

    /// Shutdown stops the watchdog (its alarm set to now) while the reaper, still in a
    /// round, puts the look off as it goes to sleep in the core: the watchdog still
    /// wakes and returns (a put-off that moved the alarm past the stop, as a `timerfd`
    /// moved again before its sleeper runs, would leave it asleep, and shutdown, which
    /// joins it, hung: a deadlock in the model).
    #[test]
    fn a_stop_is_never_put_off() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let stand_in: Arc<StandIn<u8>> =
                Arc::new(StandIn::new(Duration::from_millis(20), 1, "m".into()));
            let far = Instant::now() + Duration::from_secs(3600);
            stand_in.arm(far);
            let watchdog = {
                let stand_in = Arc::clone(&stand_in);
                loom::thread::spawn(move || {
                    let mut eyes = Eyes::new(2);
                    stand_in.sleep_until(Some(far), &mut eyes)
                })
            };
            let reaper = {
                let stand_in = Arc::clone(&stand_in);
                loom::thread::spawn(move || stand_in.sleeps_in_core(0, None))
            };
            stand_in.stop();
            reaper.join().unwrap();
            assert!(!watchdog.join().unwrap(), "the watchdog sees the stop");
        });
    }

    /// The reaper sleeps until woken: the look is called off.
    #[test]
    fn a_batch_beginning_while_the_look_is_called_off_stays_watched() {
        a_batch_beginning_while_the_look_is_put_off_stays_watched(None);
    }

    /// The reaper sleeps two hours: the look is put off past the batch's relief.
    #[test]
    fn a_batch_beginning_while_the_look_is_put_off_past_it_stays_watched() {
        a_batch_beginning_while_the_look_is_put_off_stays_watched(Some(Duration::from_secs(7200)));
    }

    /// The handshake of `sleep_until` and a batch's begin: a batch already late when it
    /// begins, while the watchdog plans its next look an hour away, is seen by it, or
    /// wakes it.
    #[test]
    fn a_late_batch_never_waits_for_a_far_look() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let stand_in: Arc<StandIn<u8>> =
                Arc::new(StandIn::new(Duration::from_millis(20), 1, "m".into()));
            stand_in.planned.store(1, SeqCst);
            let mut tasks = vec![1u8, 2];
            let mut batch = SharedBatch::new();
            // Due a second ago: late at once.
            let due = Instant::now().checked_sub(Duration::from_secs(1)).unwrap();
            batch.refill(&mut tasks, due);
            let batch = std::sync::Arc::new(batch);
            let worker = {
                let stand_in = Arc::clone(&stand_in);
                loom::thread::spawn(move || stand_in.begin(0, &batch, Instant::now()))
            };
            let mut eyes = Eyes::new(2);
            let far = Instant::now() + Duration::from_secs(3600);
            assert!(
                stand_in.sleep_until(Some(far), &mut eyes),
                "the watchdog looks"
            );
            worker.join().unwrap();
        });
    }
}
