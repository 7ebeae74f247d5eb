//! Configuration of a [`Timer`].

use std::time::Duration;

use crate::clock::{Clock, ClockChoice, SystemClock, TimerClock};
use crate::core::TimerCore;
use crate::driver::DriverConfig;
use crate::error::BuildError;
use crate::executor::Executor;
use crate::timer::{RunTasks, Timer};
use crate::TimerTask;

/// Builds a [`Timer`], or the parts of one for an owner that drives its own expiry.
///
/// Two groups of settings, as the timer has two parts: the core's geometry and clock
/// (`tick`, `wheel_size`, `shards`, `clock`; [`build_core`](Self::build_core)), and how
/// it is driven (`executor`, `reaper`, `thread_name`: a [`DriverConfig`]). Defaults: tick
/// 1 ms (Kafka's), wheel size 256, one shard per available core (at least 2), the system
/// clock, expired tasks run inline on a reaper thread named `timer-reaper`.
///
/// Kafka's wheel size is 20. An entry is placed once more for each level it starts
/// above level 0, so the wider default places a 200 ms timeout once where Kafka's
/// geometry places it twice, and timeouts up to 65 s at most twice (Kafka's: up to four
/// times); `wheel_size(20)` gives Kafka's geometry. A level costs 16 bytes a bucket and
/// up to 16 more in the bucket queue (up to 8 KiB per level and shard at 256). A timeout
/// under 256 ms sits in a bucket one tick wide from the start; a bucket that batch
/// cancels empty leaves the queue's front, so the driver's next sleep skips it (see
/// `docs/timer.md`, "The bucket queue", for the limits): where most operations complete
/// early, the finer buckets do not make the purgatory's reaper wake more often (round 19
/// of `docs/benchmarks.md`: fewer times than with 20).
#[derive(Clone)]
#[must_use = "a builder does nothing until it is built"]
pub struct TimerBuilder {
    tick: Duration,
    wheel_size: u32,
    shards: Option<usize>,
    clock: Option<ClockChoice>,
    driver: DriverConfig,
}

impl Default for TimerBuilder {
    fn default() -> Self {
        TimerBuilder {
            tick: Duration::from_millis(1),
            wheel_size: 256,
            shards: None,
            clock: None,
            driver: DriverConfig::new(),
        }
    }
}

impl TimerBuilder {
    /// A builder with the defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The resolution of the finest level (1 us ..= 1 h).
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Buckets per level (2 ..= 65,536).
    pub fn wheel_size(mut self, wheel_size: u32) -> Self {
        self.wheel_size = wheel_size;
        self
    }

    /// Number of independent wheels (1 ..= 1,024). Each thread adds to one of them.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The time source; [`ManualClock`](crate::ManualClock) for tests. A clock other than
    /// this crate's two is user code: a read that panics is caught and counted
    /// (`TimerStats::clock_panics`) and the last good reading stands in.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(ClockChoice::of(clock));
        self
    }

    /// Where expired tasks run (see [`DriverConfig::executor`]).
    pub fn executor(mut self, executor: Executor) -> Self {
        self.driver = self.driver.executor(executor);
        self
    }

    /// Whether to start a reaper thread that drives the clock (default true). Without
    /// one, the owner calls [`Timer::advance_clock`].
    pub fn reaper(mut self, reaper: bool) -> Self {
        self.driver = self.driver.reaper(reaper);
        self
    }

    /// The reaper thread's name.
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.driver = self.driver.thread_name(name);
        self
    }

    /// With the inline executor and a reaper thread: the bound on how late a due task is
    /// started because of other code on the driving threads (default 20 ms,
    /// [`DEFAULT_STAND_IN_BOUND`](crate::DEFAULT_STAND_IN_BOUND)): a stand-in thread
    /// takes over work that has waited half of it. At least 1 ms
    /// ([`BuildError::InvalidStandInBound`] otherwise). `None`: never. See
    /// [`DriverConfig::stand_in`].
    pub fn stand_in(mut self, bound: Option<Duration>) -> Self {
        self.driver = self.driver.stand_in(bound);
        self
    }

    /// With stand-ins: how many may run at once (1 ..= 1,024; default 32,
    /// [`DEFAULT_MAX_STAND_INS`](crate::DEFAULT_MAX_STAND_INS)), so how many callbacks
    /// may be held at once with every other due task still on time. See
    /// [`DriverConfig::max_stand_ins`].
    pub fn max_stand_ins(mut self, max: usize) -> Self {
        self.driver = self.driver.max_stand_ins(max);
        self
    }

    /// Checks the configuration and builds the timer (starting its reaper if asked).
    pub fn build<T: TimerTask>(self) -> Result<Timer<T>, BuildError> {
        let (core, driver) = self.build_parts()?;
        let driver = driver
            .start(RunTasks::new(core), "timer-reaper")
            .map_err(BuildError::Spawn)?;
        Ok(Timer::from_driver(driver))
    }

    /// Checks the geometry and builds the core alone: no thread, nothing runs tasks (the
    /// driver settings are ignored).
    pub fn build_core<T>(self) -> Result<TimerCore<T>, BuildError> {
        self.build_parts().map(|(core, _)| core)
    }

    /// Checks the geometry and builds the core, and gives back the driver settings, for
    /// an owner that starts a [`Driver`](crate::Driver) over its own
    /// [`Expire`](crate::Expire) target holding the core.
    pub fn build_parts<T>(self) -> Result<(TimerCore<T>, DriverConfig), BuildError> {
        if self.tick < Duration::from_micros(1) || self.tick > Duration::from_secs(3600) {
            return Err(BuildError::InvalidTick(self.tick));
        }
        if !(2..=65_536).contains(&self.wheel_size) {
            return Err(BuildError::InvalidWheelSize(self.wheel_size));
        }
        let shards = self.shards.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .max(2)
        });
        if !(1..=1024).contains(&shards) {
            return Err(BuildError::InvalidShards(shards));
        }
        let stand_ins = self.driver.max_stand_ins_setting();
        if !(1..=crate::MAX_STAND_INS_LIMIT).contains(&stand_ins) {
            return Err(BuildError::InvalidStandIns(stand_ins));
        }
        if let Some(bound) = self.driver.stand_in_setting() {
            if bound < Duration::from_millis(1) {
                return Err(BuildError::InvalidStandInBound(bound));
            }
        }
        let clock = TimerClock::new(
            self.clock
                .unwrap_or_else(|| ClockChoice::System(SystemClock::new())),
        );
        let core = TimerCore::new(self.wheel_size, shards, self.tick, clock);
        Ok((core, self.driver))
    }
}

impl std::fmt::Debug for TimerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerBuilder")
            .field("tick", &self.tick)
            .field("wheel_size", &self.wheel_size)
            .field("shards", &self.shards)
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}
