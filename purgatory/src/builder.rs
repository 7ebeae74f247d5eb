//! Configuration of a [`Purgatory`].

use std::hash::Hash;
use std::time::Duration;

use timer_core::{Clock, Executor, TimerBuilder};

use crate::error::BuildError;
use crate::operation::DelayedOperation;
use crate::purgatory::{Inner, Purgatory};
use crate::watchers::Watchers;

/// Builds a [`Purgatory`]. Defaults follow Kafka's: tick 1 ms, wheel size 20, purge
/// interval 1,000 completed entries still listed; plus watcher shards scaled to the
/// machine (see [`default_shards`]), one timer shard per core, expirations run inline
/// on the reaper thread, the system clock.
#[derive(Debug)]
pub struct PurgatoryBuilder {
    name: String,
    timer: TimerBuilder,
    purge_interval: usize,
    shards: usize,
    executor: Executor,
    reaper: bool,
}

impl Default for PurgatoryBuilder {
    fn default() -> Self {
        PurgatoryBuilder {
            name: "purgatory".to_owned(),
            timer: TimerBuilder::new(),
            purge_interval: 1000,
            shards: default_shards(),
            executor: Executor::Inline,
            reaper: true,
        }
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

impl PurgatoryBuilder {
    /// A builder with the defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The name, used in logs and for the reaper thread (`<name>-reaper`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// The timer's tick: the granularity of timeouts (1 us ..= 1 h).
    pub fn tick(mut self, tick: Duration) -> Self {
        self.timer = self.timer.tick(tick);
        self
    }

    /// The timer's buckets per level (2 ..= 65,536).
    pub fn wheel_size(mut self, size: u32) -> Self {
        self.timer = self.timer.wheel_size(size);
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

    /// Timer shards (1 ..= 1,024).
    pub fn timer_shards(mut self, shards: usize) -> Self {
        self.timer = self.timer.shards(shards);
        self
    }

    /// Where expired operations' callbacks run: inline on the reaper thread (default) or
    /// on a pool.
    pub fn executor(mut self, executor: Executor) -> Self {
        self.executor = executor;
        self
    }

    /// The time source; a [`ManualClock`](timer_core::ManualClock) for tests (with
    /// `reaper(false)`, driving expiry through `Purgatory::advance_clock`).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.timer = self.timer.clock(clock);
        self
    }

    /// Whether to start the reaper thread (default true).
    pub fn reaper(mut self, reaper: bool) -> Self {
        self.reaper = reaper;
        self
    }

    /// Checks the configuration and builds the purgatory, starting its reaper if asked.
    pub fn build<K, O>(self) -> Result<Purgatory<K, O>, BuildError>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
        O: DelayedOperation,
    {
        if !(1..=65_536).contains(&self.shards) {
            return Err(BuildError::InvalidShards(self.shards));
        }
        if self.purge_interval == 0 {
            return Err(BuildError::InvalidPurgeInterval);
        }
        let timer = self.timer.reaper(false).build()?;
        // Counters are i64; an interval beyond that means "practically never".
        let purge_interval = self.purge_interval.min(i64::MAX as usize);
        let inner = Inner::new(
            self.name,
            timer,
            Watchers::new(self.shards),
            purge_interval,
            self.executor,
        );
        Purgatory::from_parts(inner, self.reaper).map_err(BuildError::Spawn)
    }
}
