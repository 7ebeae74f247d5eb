//! Purgatories on one timer: [`TimerGroup`], and the [`Group`] every purgatory's driver
//! drives, whether it has one member (a purgatory built alone, the group private to it)
//! or several (purgatories built on a `TimerGroup`).
//!
//! A broker runs a purgatory per kind of delayed request (produce, fetch, delete records,
//! join, heartbeat, ...). Built alone, each brings its own reaper and watchdog. Built on
//! one group, they share its timer core, its reaper and watchdog, its stand-ins (the
//! relief of late work, `timer-core/src/stand_in.rs`) and its shutdown; each keeps its
//! own op table, watcher lists, counters, name (in logs and metrics) and housekeeping.
//!
//! # How a round reaches each purgatory
//! A timer task ([`Expiry`]) names its operation and its purgatory's place in the group
//! (`member`). The group is the driver's [`Expire`] target: it hands each run of a
//! batch's tasks of one member to that member ([`Member::expire_run`]), and runs every
//! member's `before_round` and `after_round` (its queued cancels, orphans,
//! housekeeping); the next round waits as little as any member asks.
//!
//! # Invariants
//! - A member's place is taken once (`joined` counts the places handed out, `members`
//!   holds each once set) and never given back or reused while the group lives: a task
//!   names the member that added it for as long as it exists. A place is set before the
//!   member's first watch (its `build_on` returns after), so every task's member is
//!   found; a round that runs while a member is being set skips the place (it has no
//!   task yet).
//! - Shutdown is the group's: the driver's protocol (`timer-core/src/driver.rs`) closes
//!   the shared core, waits for every round and every member's answers in progress, and
//!   hands what was pending to [`Group::finish`], which gives each member its own (an
//!   empty list included, so each also empties its watcher lists). A member cannot be
//!   shut down alone: `Purgatory::shutdown` on any member shuts the group down.
//! - Ownership is the group's: `owners` counts the `TimerGroup`'s handles and every
//!   member's owning handles, and the last one's drop shuts the group down, whatever
//!   handles a `WeakPurgatory` upgraded to are in use (their calls are refused from
//!   then on). A member outlives its own last handle while the group has an owner (the
//!   group holds it): its operations are still answered, by their timeouts or the
//!   group's shutdown, and its `WeakPurgatory`s upgrade; none is lost. A purgatory built
//!   alone is the one member of its group, whose owners are its handles: its last one
//!   shuts it down, as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use timer_core::{Driver, Expire, NextRound, TimerBuilder, TimerCore, TimerStats};

use crate::error::BuildError;
use crate::op_table::OpRef;
use crate::state::Expiry;

/// Most purgatories a [`TimerGroup`] takes by default ([`TimerGroupBuilder::max_members`]).
pub const DEFAULT_MAX_MEMBERS: usize = 64;

/// Most purgatories a [`TimerGroup`] can take: every round runs each member's
/// housekeeping, so a round's fixed cost grows with the members. At this limit it does
/// not show yet: a 20 ms timeout's worst lateness measured 1.2-1.8 ms with 1,024 members,
/// as with one (1.2-3.3 ms; two release runs of `tests/limits_many_members.rs`, whose
/// doc has the command). A review's probe, before there was a limit, found 35-112 ms
/// with 16,384 members.
pub const MAX_MEMBERS_LIMIT: usize = 1024;

/// What the group's rounds need of each member, whatever its key and operation types.
pub(crate) trait Member: Send + Sync + 'static {
    /// Expires the operation `first` names, then each task `next` claims while it is
    /// this member's; returns the first claimed task that is another member's (or `None`
    /// when `next` had no more). Claims only when about to expire, so a stand-in takes
    /// over the rest (`stand_in.rs`).
    fn expire_run(&self, first: OpRef, next: &mut dyn FnMut() -> Option<Expiry>) -> Option<Expiry>;

    /// Before every round: the member's queued timer cancels, its orphans.
    fn before_round(&self);

    /// After every round: the member's housekeeping; how long the next round may wait.
    fn after_round(&self) -> NextRound;

    /// Shutdown's last step for this member: expires `pending` (its tasks drained from
    /// the core) as shut down, empties its lists. Returns how many it expired.
    fn expire_pending(&self, pending: Vec<Expiry>) -> usize;
}

/// The target of a purgatory's driver: the timer core and the purgatories on it.
pub(crate) struct Group {
    core: Arc<TimerCore<Expiry>>,
    /// Each member, once its place is set; `joined` places handed out so far.
    members: Box<[OnceLock<Arc<dyn Member>>]>,
    joined: AtomicUsize,
    /// The owning handles: the `TimerGroup`'s and its clones, and every member's owning
    /// handles (`Purgatory::new`, `build`, `build_on`, and their clones; not the handles
    /// a `WeakPurgatory` upgrades to). The last one's drop shuts the group down
    /// (`purgatory.rs`, `weak.rs`); a `WeakPurgatory` of any member upgrades while one
    /// lives. It starts at 1: the first handle, the `TimerGroup` or the purgatory built
    /// alone.
    pub(crate) owners: AtomicUsize,
}

impl Group {
    fn new(core: TimerCore<Expiry>, capacity: usize) -> Self {
        Group {
            core: Arc::new(core),
            members: (0..capacity).map(|_| OnceLock::new()).collect(),
            joined: AtomicUsize::new(0),
            owners: AtomicUsize::new(1),
        }
    }

    /// The group of one purgatory built alone.
    pub(crate) fn private(core: TimerCore<Expiry>) -> Self {
        Self::new(core, 1)
    }

    /// The timer, for a member to hold.
    pub(crate) fn timer(&self) -> &Arc<TimerCore<Expiry>> {
        &self.core
    }

    /// Takes the next place, or `None` if every place is taken.
    pub(crate) fn take_place(&self) -> Option<u32> {
        let mut joined = self.joined.load(Ordering::Relaxed);
        loop {
            if joined >= self.members.len() {
                return None;
            }
            match self.joined.compare_exchange_weak(
                joined,
                joined + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(joined as u32),
                Err(now) => joined = now,
            }
        }
    }

    /// Sets the member in its place (taken by [`take_place`](Self::take_place)).
    pub(crate) fn set(&self, place: u32, member: Arc<dyn Member>) {
        let set = self.members[place as usize].set(member);
        debug_assert!(set.is_ok(), "a place is set once");
    }

    /// The members set so far, in place order.
    fn each(&self) -> impl Iterator<Item = &Arc<dyn Member>> {
        let joined = self.joined.load(Ordering::Acquire).min(self.members.len());
        self.members[..joined].iter().filter_map(OnceLock::get)
    }

    #[inline]
    fn member(&self, place: u32) -> Option<&Arc<dyn Member>> {
        self.members.get(place as usize).and_then(OnceLock::get)
    }

    /// Hands each run of one member's tasks to that member, `first` and then what `next`
    /// yields, until `next` yields nothing.
    #[inline]
    fn expire_runs(&self, first: Expiry, next: &mut dyn FnMut() -> Option<Expiry>) {
        let mut task = Some(first);
        while let Some(expiry) = task {
            task = match self.member(expiry.member) {
                Some(member) => member.expire_run(expiry.op, next),
                // No member has this place: no task can name it (see the module doc).
                None => next(),
            };
        }
    }

    /// Shutdown's last step: each member's pending tasks to it. Returns how many were
    /// expired in all.
    pub(crate) fn finish(&self, pending: Vec<Expiry>) -> usize {
        let joined = self.joined.load(Ordering::Acquire).min(self.members.len());
        let mut per_place: Vec<Vec<Expiry>> = vec![Vec::new(); joined];
        if let [only] = per_place.as_mut_slice() {
            *only = pending;
        } else {
            for expiry in pending {
                if let Some(list) = per_place.get_mut(expiry.member as usize) {
                    list.push(expiry);
                }
            }
        }
        // A place taken but not set yet (a build racing this shutdown) has no task and
        // no watch: its build finds the core closed.
        self.members[..joined]
            .iter()
            .zip(per_place)
            .filter_map(|(member, pending)| Some(member.get()?.expire_pending(pending)))
            .sum()
    }
}

impl Expire for Group {
    type Task = Expiry;

    fn core(&self) -> &TimerCore<Expiry> {
        &self.core
    }

    fn expire(&self, expired: &mut Vec<Expiry>) {
        let mut tasks = expired.drain(..);
        if let Some(first) = tasks.next() {
            self.expire_runs(first, &mut || tasks.next());
        }
    }

    fn expire_one(&self, expiry: Expiry) {
        self.expire_runs(expiry, &mut || None);
    }

    fn expire_claimed(&self, mut claim: impl FnMut() -> Option<Expiry>) {
        if let Some(first) = claim() {
            self.expire_runs(first, &mut claim);
        }
    }

    fn before_round(&self) {
        for member in self.each() {
            member.before_round();
        }
    }

    fn after_round(&self) -> NextRound {
        let mut next = NextRound::at_most(Duration::MAX);
        for member in self.each() {
            let asked = member.after_round();
            next = NextRound {
                queued: next.queued.min(asked.queued),
                empty: next.empty.min(asked.empty),
            };
        }
        next
    }

    fn at_drop(&self, pending: Vec<Expiry>) {
        self.finish(pending);
    }
}

/// Shuts the group `driver` drives down: every member's pending operations are expired
/// (see [`Purgatory::shutdown`](crate::Purgatory::shutdown)).
pub(crate) fn shut_down(driver: &Driver<Group>) {
    let group = driver.target();
    driver.shutdown_with(|pending| group.finish(pending));
}

/// Purgatories that share one timer and its threads: a reaper, a watchdog and the
/// stand-ins it starts for late work, where each purgatory built alone has its own.
///
/// Build purgatories on it with
/// [`PurgatoryBuilder::build_on`](crate::PurgatoryBuilder::build_on); each keeps its own
/// keys, operations, watcher lists, counters, name and housekeeping, and they share:
///
/// | shared by the group | each purgatory's own |
/// |---|---|
/// | the timer (tick, wheel, clock) and its [`TimerStats`] | op table, watcher lists, purges |
/// | the reaper, the watchdog, the stand-ins (relief of late work) | [`stats`](crate::Purgatory::stats), [`pending`](crate::Purgatory::pending), its name in logs and metrics |
/// | shutdown: [`shutdown`](Self::shutdown), or `shutdown` on any member | its handles, `WeakPurgatory`s, parked futures |
///
/// One member's slow callback delays another's timeouts no more than its own: relief
/// follows lateness across the group, as within one purgatory (up to the group's limit
/// of stand-ins at once, 32 by default, for all members together).
///
/// The group shuts down when [`shutdown`](Self::shutdown) (or any member's `shutdown`)
/// is called, or when its last owner is dropped: its last handle and every member's
/// owning handles (not the handles a `WeakPurgatory` upgraded to, which keep no group
/// alive). Every member's pending operations are then expired
/// ([`Completion::Shutdown`]), so every waiting request is answered. Dropping a member's
/// last handle does not shut the group down: that member's operations are still
/// answered, by their timeouts or the group's shutdown.
///
/// [`Completion::Shutdown`]: crate::Completion::Shutdown
///
/// ```
/// # use std::time::Duration;
/// # use purgatory::{Completion, DelayedOperation, Purgatory, TimerGroup};
/// # struct Produce; struct Fetch;
/// # impl DelayedOperation for Produce {
/// #     fn timeout(&self) -> Duration { Duration::from_secs(30) }
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self, _: Completion) {}
/// # }
/// # impl DelayedOperation for Fetch {
/// #     fn timeout(&self) -> Duration { Duration::from_millis(500) }
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self, _: Completion) {}
/// # }
/// let timer = TimerGroup::new("broker-timer");
/// let produce: Purgatory<u32, Produce> = Purgatory::builder().name("produce").build_on(&timer)?;
/// let fetch: Purgatory<u32, Fetch> = Purgatory::builder().name("fetch").build_on(&timer)?;
/// produce.watch(Produce, [7])?;
/// fetch.watch(Fetch, [7])?;
/// timer.shutdown(); // both answered (Completion::Shutdown)
/// assert!(produce.is_shutdown() && fetch.is_shutdown());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TimerGroup {
    /// Taken only by `drop`, which hands it to `release` (or `shut_down_unowned`).
    driver: std::mem::ManuallyDrop<Arc<Driver<Group>>>,
}

impl Clone for TimerGroup {
    fn clone(&self) -> Self {
        // As `Arc::clone`: a new owner comes from an existing one.
        self.driver.target().owners.fetch_add(1, Ordering::Relaxed);
        TimerGroup {
            driver: std::mem::ManuallyDrop::new(Arc::clone(&self.driver)),
        }
    }
}

impl Drop for TimerGroup {
    /// The group's last owning handle (no `TimerGroup` handle and no member's owning
    /// handle left) shuts it down, as a purgatory's last handle does, though handles a
    /// `WeakPurgatory` upgraded to may be in use: with the feature `tokio`, in a
    /// runtime's context, on the runtime's blocking pool, so the drop does not wait for
    /// callbacks on a worker.
    fn drop(&mut self) {
        // SAFETY: `driver` is taken here, once, and `self` is never used again: this is
        // its drop.
        let driver = unsafe { std::mem::ManuallyDrop::take(&mut self.driver) };
        // As `Arc`'s drop: the last owner sees every other owner's work before it.
        if driver.target().owners.fetch_sub(1, Ordering::AcqRel) == 1 {
            crate::purgatory::shut_down_unowned(driver, ());
        } else {
            crate::purgatory::release(driver, ());
        }
    }
}

impl TimerGroup {
    /// A group with the default timer and up to [`DEFAULT_MAX_MEMBERS`] purgatories; its
    /// reaper thread is named `{name}-reaper`.
    ///
    /// # Panics
    /// If the operating system cannot spawn the reaper thread.
    pub fn new(name: &str) -> Self {
        TimerGroup::builder()
            .name(name)
            .build()
            .expect("the default configuration is valid; spawning the reaper failed")
    }

    /// A builder for a configured group.
    pub fn builder() -> TimerGroupBuilder {
        TimerGroupBuilder::default()
    }

    /// The driver, for a member to hold.
    pub(crate) fn driver(&self) -> &Arc<Driver<Group>> {
        &self.driver
    }

    /// Shuts the group down, and so every purgatory on it: as
    /// [`Purgatory::shutdown`](crate::Purgatory::shutdown) (the same waits, the same
    /// table in `docs/purgatory.md`), for all of them at once. Later builds on the group
    /// are refused ([`BuildError::GroupShutDown`]).
    pub fn shutdown(&self) {
        shut_down(&self.driver);
    }

    /// Whether the group's shutdown has begun.
    pub fn is_shutdown(&self) -> bool {
        self.driver.is_shutdown()
    }

    /// Most purgatories the group takes.
    pub fn max_members(&self) -> usize {
        self.driver.target().members.len()
    }

    /// How many purgatories were built on the group.
    pub fn members(&self) -> usize {
        let group = self.driver.target();
        group
            .joined
            .load(Ordering::Acquire)
            .min(group.members.len())
    }

    /// The shared timer's figures (relief included), for all members together.
    pub fn timer_stats(&self) -> TimerStats {
        self.driver.target().core.stats()
    }
}

impl std::fmt::Debug for TimerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerGroup")
            .field("members", &self.members())
            .field("shutdown", &self.is_shutdown())
            .finish_non_exhaustive()
    }
}

/// Configures a [`TimerGroup`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct TimerGroupBuilder {
    name: String,
    timer: TimerBuilder,
    max_members: usize,
}

impl Default for TimerGroupBuilder {
    fn default() -> Self {
        TimerGroupBuilder {
            name: "purgatories".to_owned(),
            timer: TimerBuilder::new(),
            max_members: DEFAULT_MAX_MEMBERS,
        }
    }
}

impl TimerGroupBuilder {
    /// The group's name: its reaper thread is `{name}-reaper` (default `purgatories`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// The shared timer's configuration (tick, wheel, clock, executor, relief), as for a
    /// purgatory built alone ([`PurgatoryBuilder::timer`](crate::PurgatoryBuilder::timer)).
    pub fn timer(mut self, timer: TimerBuilder) -> Self {
        self.timer = timer;
        self
    }

    /// Most purgatories the group takes (1 ..= [`MAX_MEMBERS_LIMIT`], 1,024; default
    /// [`DEFAULT_MAX_MEMBERS`], 64). A build past it is refused
    /// ([`BuildError::GroupFull`]). A place is never given back while the group lives:
    /// a group is for the kinds of request a service has, built at its start, not for a
    /// purgatory made and dropped per client or per tenant.
    pub fn max_members(mut self, max: usize) -> Self {
        self.max_members = max;
        self
    }

    /// Checks the configuration and starts the group's reaper (unless the timer is built
    /// with `reaper(false)`: then drive it with any member's
    /// [`advance_clock`](crate::Purgatory::advance_clock)).
    pub fn build(self) -> Result<TimerGroup, BuildError> {
        if !(1..=MAX_MEMBERS_LIMIT).contains(&self.max_members) {
            return Err(BuildError::InvalidMaxMembers(self.max_members));
        }
        let (core, driver) = self.timer.build_parts()?;
        let group = Group::new(core, self.max_members);
        let reaper = format!("{}-reaper", self.name);
        let driver = driver.start(group, &reaper).map_err(BuildError::Spawn)?;
        Ok(TimerGroup {
            driver: std::mem::ManuallyDrop::new(Arc::new(driver)),
        })
    }
}
