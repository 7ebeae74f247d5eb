//! `timer_core::Timer` as a W1 churn timer, and the clock W2 shares with its peers.
//!
//! # Invariants
//! - [`ChurnTask`] is a `u32`, so each pending entry in our slab is 32 bytes, like the
//!   `u32` payload every peer stores.
//! - [`OurChurnTimer`] runs on a [`ManualClock`] that never moves and has no reaper, so
//!   nothing expires while W1 measures adds and cancels.

use std::time::{Duration, Instant};

use timer_core::{
    AddError, Clock, ManualClock, SlotKey, Timer, TimerBuilder, TimerHandle, TimerTask, Wheel,
};

use crate::workloads::w1::{BatchChurnTimer, ChurnTimer, SharedChurnTimer};

/// The W1 payload: a task id; running it does nothing.
#[derive(Debug)]
pub struct ChurnTask(pub u32);

impl TimerTask for ChurnTask {
    fn run(self) {}
}

/// Our timer on a frozen manual clock, with the default configuration otherwise (tick
/// 1 ms, wheel size 256, one shard per core).
pub struct OurChurnTimer {
    timer: Timer<ChurnTask>,
    /// Buffers of the batch calls, kept between calls so a batch allocates nothing.
    batch: Vec<(Duration, ChurnTask)>,
    results: Vec<Result<TimerHandle, AddError<ChurnTask>>>,
    cancelled: Vec<ChurnTask>,
}

impl OurChurnTimer {
    /// Builds the timer (manual clock at zero, no reaper).
    pub fn new() -> Result<Self, timer_core::BuildError> {
        let timer = TimerBuilder::new()
            .clock(ManualClock::new())
            .reaper(false)
            .build()?;
        Ok(OurChurnTimer {
            timer,
            batch: Vec::new(),
            results: Vec::new(),
            cancelled: Vec::new(),
        })
    }

    /// The timer inside.
    pub fn timer(&self) -> &Timer<ChurnTask> {
        &self.timer
    }
}

impl SharedChurnTimer for OurChurnTimer {
    type Handle = TimerHandle;

    #[inline]
    fn add(&self, delay_ms: u64, task: u32) -> TimerHandle {
        match self
            .timer
            .add(Duration::from_millis(delay_ms), ChurnTask(task))
        {
            Ok(handle) => handle,
            Err(_) => unreachable!("the timer is never shut down during W1"),
        }
    }

    #[inline]
    fn cancel(&self, handle: TimerHandle) -> bool {
        self.timer.cancel(handle).is_some()
    }

    fn pending(&self) -> usize {
        self.timer.len()
    }
}

impl ChurnTimer for OurChurnTimer {
    type Handle = TimerHandle;

    #[inline]
    fn add(&mut self, delay_ms: u64, task: u32) -> TimerHandle {
        SharedChurnTimer::add(self, delay_ms, task)
    }

    #[inline]
    fn cancel(&mut self, handle: TimerHandle) -> bool {
        SharedChurnTimer::cancel(self, handle)
    }

    fn pending(&self) -> usize {
        SharedChurnTimer::pending(self)
    }
}

impl BatchChurnTimer for OurChurnTimer {
    type Handle = TimerHandle;

    fn add_batch(&mut self, tasks: &[(u64, u32)], out: &mut Vec<TimerHandle>) {
        self.batch.extend(
            tasks
                .iter()
                .map(|&(delay_ms, id)| (Duration::from_millis(delay_ms), ChurnTask(id))),
        );
        self.timer.add_batch(&mut self.batch, &mut self.results);
        out.extend(self.results.drain(..).map(|r| match r {
            Ok(handle) => handle,
            Err(_) => unreachable!("the timer is never shut down during W1"),
        }));
    }

    fn cancel_batch(&mut self, handles: &mut [TimerHandle]) -> usize {
        let won = self.timer.cancel_batch(handles, &mut self.cancelled);
        self.cancelled.clear();
        won
    }

    fn pending(&self) -> usize {
        self.timer.len()
    }
}

/// Our bare single-threaded [`Wheel`] (tick = 1 ms, size 256, the timer's default),
/// without the `Timer`'s lock, clock and shards: a diagnostic W1 implementation (`wheel`)
/// that separates the data structure's cost from the thread-safe wrapper's.
pub struct OurBareWheel {
    wheel: Wheel<u32>,
}

impl Default for OurBareWheel {
    fn default() -> Self {
        OurBareWheel {
            wheel: Wheel::new(256, 0),
        }
    }
}

impl ChurnTimer for OurBareWheel {
    type Handle = SlotKey;

    #[inline]
    fn add(&mut self, delay_ms: u64, task: u32) -> SlotKey {
        self.wheel.insert(delay_ms, task)
    }

    #[inline]
    fn cancel(&mut self, handle: SlotKey) -> bool {
        self.wheel.cancel(handle).is_some()
    }

    fn pending(&self) -> usize {
        self.wheel.len()
    }
}

/// Our bare wheel behind a `parking_lot::Mutex` locked once per call: the `wheel`
/// diagnostic plus exactly the lock a `Timer` shard takes, to tell the lock's cost from
/// the rest of the `Timer` (clock read, tick conversion, shard choice, counters).
#[derive(Default)]
pub struct OurLockedWheel(parking_lot::Mutex<OurBareWheel>);

impl ChurnTimer for OurLockedWheel {
    type Handle = SlotKey;

    #[inline]
    fn add(&mut self, delay_ms: u64, task: u32) -> SlotKey {
        // Through `&self` and the lock, as a shared timer is used, not `get_mut`.
        let wheel: &parking_lot::Mutex<OurBareWheel> = &self.0;
        wheel.lock().add(delay_ms, task)
    }

    #[inline]
    fn cancel(&mut self, handle: SlotKey) -> bool {
        let wheel: &parking_lot::Mutex<OurBareWheel> = &self.0;
        wheel.lock().cancel(handle)
    }

    fn pending(&self) -> usize {
        self.0.lock().pending()
    }
}

/// A monotonic clock whose origin is an `Instant` the caller chose, so deadlines given
/// to our timer and instants given to the peers mean exactly the same moment.
#[derive(Clone, Copy, Debug)]
pub struct OriginClock(pub Instant);

impl Clock for OriginClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}
