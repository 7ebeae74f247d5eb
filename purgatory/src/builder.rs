//! Configuration of a [`Purgatory`].
//!
//! # Invariants
//! - The builder is typed by the purgatory it builds (`PurgatoryBuilder<K, O>`), so the
//!   types come from wherever the compiler can see them: `Purgatory::<K, O>::builder()`,
//!   `PurgatoryBuilder::<K, O>::new()`, or the annotation of the variable `build`'s
//!   result goes to. The type parameters are only a marker (`fn() -> (K, O)`): they ask
//!   nothing of `K` and `O` until `build`, and the builder is `Send`, `Sync` and `Debug`
//!   whatever they are.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;

use timer_core::TimerBuilder;

use crate::error::BuildError;
use crate::group::{Group, Member, TimerGroup};
use crate::operation::DelayedOperation;
use crate::purgatory::Purgatory;
use crate::runtime::RuntimeContext;
use crate::state::{PurgePolicy, State};
use crate::watchers::Watchers;

/// Builds a [`Purgatory`]. Defaults follow Kafka's where it has one: tick 1 ms, purge
/// interval 1,000 completed entries still listed; a wheel of 256 buckets a level
/// (Kafka's has 20; see [`TimerBuilder`]'s defaults); plus watcher shards scaled to the
/// machine (see [`default_shards`]), one timer shard per core, expirations run inline
/// on the reaper thread, the system clock.
///
/// The timer's settings (geometry, clock, executor, reaper) come as one value, a
/// [`TimerBuilder`]; the reaper thread is named `<name>-reaper` unless the timer
/// builder names it.
///
/// ```
/// use std::time::Duration;
/// use purgatory::{ManualClock, PurgatoryBuilder, TimerBuilder};
/// # use purgatory::{Completion, DelayedOperation};
/// # struct Op;
/// # impl DelayedOperation for Op {
/// #     fn timeout(&self) -> Duration { Duration::from_secs(1) }
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self, _: Completion) {}
/// # }
/// let clock = ManualClock::new();
/// let purgatory = PurgatoryBuilder::<u32, Op>::new()
///     .name("fetch")
///     .timer(TimerBuilder::new().tick(Duration::from_millis(5)).clock(clock.clone()).reaper(false))
///     .build()
///     .unwrap();
/// # drop(purgatory);
/// ```
///
/// The key and operation types are the builder's, so they can come from an annotation
/// too:
///
/// ```
/// # use std::time::Duration;
/// # use purgatory::{Completion, DelayedOperation, Purgatory, BuildError};
/// # struct Op;
/// # impl DelayedOperation for Op {
/// #     fn timeout(&self) -> Duration { Duration::from_secs(1) }
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self, _: Completion) {}
/// # }
/// # fn main() -> Result<(), BuildError> {
/// let p: Purgatory<u32, Op> = Purgatory::builder().name("produce").build()?;
/// # drop(p);
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct PurgatoryBuilder<K, O> {
    name: String,
    timer: TimerBuilder,
    /// Whether `timer` was called (refused by `build_on`: the group has the timer).
    timer_set: bool,
    purge_interval: usize,
    shards: usize,
    /// The runtime set by `runtime` (feature `tokio`); `None`: the one `build` runs in.
    #[cfg(feature = "tokio")]
    runtime: Option<tokio::runtime::Handle>,
    /// Whether `follow_tokio_time` was set (feature `tokio`).
    #[cfg(feature = "tokio")]
    tokio_time: bool,
    /// The purgatory's key and operation types: a marker only (see the module doc).
    types: PhantomData<fn() -> (K, O)>,
}

impl<K, O> Default for PurgatoryBuilder<K, O> {
    fn default() -> Self {
        PurgatoryBuilder {
            name: "purgatory".to_owned(),
            timer: TimerBuilder::new(),
            timer_set: false,
            purge_interval: 1000,
            shards: default_shards(),
            #[cfg(feature = "tokio")]
            runtime: None,
            #[cfg(feature = "tokio")]
            tokio_time: false,
            types: PhantomData,
        }
    }
}

impl<K, O> fmt::Debug for PurgatoryBuilder<K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("PurgatoryBuilder");
        d.field("name", &self.name)
            .field("timer", &self.timer)
            .field("purge_interval", &self.purge_interval)
            .field("shards", &self.shards);
        #[cfg(feature = "tokio")]
        d.field("runtime", &self.runtime)
            .field("tokio_time", &self.tokio_time);
        d.finish()
    }
}

/// The default number of watcher shards: 8 per core, rounded up to a power of two, at
/// least 16 and at most 512 (Kafka's fixed count).
///
/// Shards exist so that threads on different keys do not meet on one lock; 8 per core
/// keeps that chance small. More shards than that cost without helping: each batch of
/// watches and each event then touches more distinct lock and list lines, mostly cold
/// in this core's cache. Measured on 2 cores (`purgatory-perf w3 --num 3000000 --rate
/// 2000000 --impl ours` with 16 and with 512 shards, two runs each; `docs/benchmarks.md`,
/// round 2): 16 shards 0.96-1.05 CPU-s per 1M requests, 512 shards 1.27-1.28.
pub fn default_shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    cores.saturating_mul(8).next_power_of_two().clamp(16, 512)
}

impl<K, O> PurgatoryBuilder<K, O> {
    /// A builder with the defaults, for a `Purgatory<K, O>` (see the type's doc for
    /// where `K` and `O` may come from).
    pub fn new() -> Self {
        Self::default()
    }

    /// The name, used in logs and for the reaper thread (`<name>-reaper`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// The timer's settings: tick, wheel size, timer shards, clock (a
    /// [`ManualClock`](timer_core::ManualClock) for tests, with `reaper(false)`, driving
    /// expiry through `Purgatory::advance_clock`), executor (where expired operations'
    /// callbacks run: inline on the reaper thread, the default, where expiries kept
    /// waiting 10 ms by others go to stand-in threads, so each is answered within 20 ms,
    /// see `TimerBuilder::stand_in` and `TimerBuilder::max_stand_ins`; or on a pool) and
    /// reaper.
    pub fn timer(mut self, timer: TimerBuilder) -> Self {
        self.timer = timer;
        self.timer_set = true;
        self
    }

    /// Purge once at least this many entries of completed operations are still listed
    /// (and at least as many as the live entries; see `docs/purgatory.md`). At least 1.
    pub fn purge_interval(mut self, entries: usize) -> Self {
        self.purge_interval = entries;
        self
    }

    /// Watcher shards (1 ..= 65,536): more shards, fewer threads meeting on one lock.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }

    /// The tokio runtime whose context the callbacks that answer operations run in
    /// (feature `tokio`; see
    /// [`with_tokio`](crate::with_tokio)). Without it, `build` takes the runtime it is
    /// called in, if any.
    ///
    /// Built with neither, the purgatory has no runtime (its callbacks cannot
    /// `tokio::spawn`): `build` logs a warning that says so and
    /// [`Purgatory::runtime`](crate::Purgatory::runtime) is `None`, but it is no error:
    /// features are additive, and a program that never uses tokio may get this one
    /// through another crate (the argument is in `runtime.rs`). Pass the handle for a
    /// purgatory built before the runtime runs or outside it (a `static`, a synchronous
    /// `main`).
    #[cfg(feature = "tokio")]
    pub fn runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// Follows tokio's clock, paused, advanced and auto-advanced included, for tests on
    /// `#[tokio::test(start_paused = true)]` (feature `tokio`). The timer reads
    /// [`TokioClock`](crate::TokioClock) (this overrides a clock set in
    /// [`timer`](Self::timer)), and instead of a reaper thread a task on the runtime
    /// drives expiry, sleeping on tokio's timer until the next operation is due, so a
    /// paused runtime auto-advances straight to it. Expired operations' callbacks then
    /// run on that task (a runtime worker) unless the timer's executor is a pool; so do
    /// purges. Needs a runtime with its time driver (`enable_time`);
    /// [`BuildError::NoRuntime`] otherwise. When the runtime drops the task (it shuts down first), the purgatory
    /// shuts down too, expiring what is pending: no time passes for it any more.
    #[cfg(feature = "tokio")]
    pub fn follow_tokio_time(mut self) -> Self {
        self.tokio_time = true;
        self
    }
}

impl<K, O> PurgatoryBuilder<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// Checks the configuration and builds the purgatory, starting its reaper if asked.
    pub fn build(self) -> Result<Purgatory<K, O>, BuildError> {
        self.check()?;
        #[cfg(feature = "tokio")]
        let runtime = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        #[cfg(feature = "tokio")]
        let timer = match (&runtime, self.tokio_time) {
            (_, false) => self.timer,
            (Some(handle), true) if crate::tokio_time::has_timers(handle) => self
                .timer
                .clock(crate::TokioClock::new(handle.clone()))
                .reaper(false),
            (_, true) => return Err(BuildError::NoRuntime),
        };
        #[cfg(not(feature = "tokio"))]
        let timer = self.timer;
        let (timer, driver) = timer.build_parts()?;
        let group = Group::private(timer);
        let state = Self::member_of(
            &group,
            false,
            self.name,
            self.shards,
            self.purge_interval,
            #[cfg(feature = "tokio")]
            runtime,
        )
        .expect("a private group has one place");
        let reaper = format!("{}-reaper", state.name);
        let driver = driver.start(group, &reaper).map_err(BuildError::Spawn)?;
        let purgatory = Purgatory::from_parts(Arc::new(driver), state);
        #[cfg(feature = "tokio")]
        warn_if_no_runtime(&purgatory);
        #[cfg(feature = "tokio")]
        if self.tokio_time {
            crate::tokio_time::spawn_driver(&purgatory);
        }
        Ok(purgatory)
    }

    /// Checks the configuration and builds the purgatory on `group`'s timer and threads
    /// (see [`TimerGroup`] for what the purgatories on one group share). Refused: a
    /// `timer` or `follow_tokio_time` set here ([`BuildError::TimerOnGroup`]: set the
    /// timer on the group's builder), a group already full
    /// ([`BuildError::GroupFull`]) or shut down ([`BuildError::GroupShutDown`]).
    pub fn build_on(self, group: &TimerGroup) -> Result<Purgatory<K, O>, BuildError> {
        self.check()?;
        #[cfg(feature = "tokio")]
        if self.tokio_time {
            return Err(BuildError::TimerOnGroup);
        }
        if self.timer_set {
            return Err(BuildError::TimerOnGroup);
        }
        #[cfg(feature = "tokio")]
        let runtime = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        let driver = group.driver();
        if driver.is_shutdown() {
            return Err(BuildError::GroupShutDown);
        }
        let state = Self::member_of(
            driver.target(),
            true,
            self.name,
            self.shards,
            self.purge_interval,
            #[cfg(feature = "tokio")]
            runtime,
        )
        .ok_or_else(|| BuildError::GroupFull(group.max_members()))?;
        // The new handle owns the group with the others (`group.rs`); it comes from an
        // existing owner, `group`, as `Arc::clone` does.
        driver
            .target()
            .owners
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let purgatory = Purgatory::from_parts(Arc::clone(driver), state);
        #[cfg(feature = "tokio")]
        warn_if_no_runtime(&purgatory);
        Ok(purgatory)
    }

    /// The state of a new purgatory, set in the next place of `group` (`None` if every
    /// place is taken).
    fn member_of(
        group: &Group,
        in_group: bool,
        name: String,
        shards: usize,
        purge_interval: usize,
        #[cfg(feature = "tokio")] runtime: Option<tokio::runtime::Handle>,
    ) -> Option<Arc<State<K, O>>> {
        let place = group.take_place()?;
        let state = Arc::new(State::new(
            name,
            Arc::clone(group.timer()),
            place,
            in_group,
            Watchers::new(shards),
            PurgePolicy::new(purge_interval),
            #[cfg(feature = "tokio")]
            RuntimeContext::new(runtime),
            #[cfg(not(feature = "tokio"))]
            RuntimeContext,
        ));
        group.set(place, Arc::clone(&state) as Arc<dyn Member>);
        Some(state)
    }

    fn check(&self) -> Result<(), BuildError> {
        if !(1..=crate::watchers::MAX_SHARDS).contains(&self.shards) {
            return Err(BuildError::InvalidShards(self.shards));
        }
        if self.purge_interval == 0 {
            return Err(BuildError::InvalidPurgeInterval);
        }
        Ok(())
    }
}

/// Warns, once, if a new purgatory has no runtime for its callbacks (`runtime.rs`).
#[cfg(feature = "tokio")]
fn warn_if_no_runtime<K, O>(purgatory: &Purgatory<K, O>)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    let state = purgatory.state();
    state.runtime.warn_if_none(&state.name, &state.user);
}
