//! A hierarchical timing wheel (Kafka's `TimingWheel` and `SystemTimer`) whose non-empty
//! buckets sit in a delay queue ordered by expiration, so the clock jumps straight to the
//! next due bucket and an idle timer does no work.
//!
//! # Layers
//! - [`Wheel`]: the pure data structure, single-threaded, time in integer ticks. O(1)
//!   insert and O(1) cancel by generation-checked key; overflow levels created on demand;
//!   entries cascade down as their coarse buckets come due.
//! - [`TimerCore`]: thread-safe and thread-free: sharded wheels behind `parking_lot`
//!   locks and a [`Clock`]; add, cancel, and advance into a buffer.
//! - [`Driver`]: runs a core: a reaper thread that sleeps until the earliest bucket is
//!   due, the [`Executor`], caught panics, and a shutdown that waits for all of it. What
//!   expiry means is the owner's ([`Expire`]).
//! - [`Timer`]: a core and a driver whose expired tasks run themselves ([`TimerTask`]).
//!   Built by [`TimerBuilder`], which also builds the parts for other owners (a
//!   purgatory drives its own core this way).
//!
//! # Guarantees
//! - Every added task either runs exactly once or is handed back (by a winning `cancel`,
//!   or by `shutdown`); a stale handle touches nothing.
//! - A task never runs before its deadline on the timer's clock, and runs at most one tick
//!   after it (plus scheduling delay).
//! - A panicking task is caught, logged through `tracing` and counted; the timer goes on.
//!
//! # Example
//! ```
//! use std::sync::mpsc;
//! use std::time::Duration;
//! use timer_core::TimerBuilder;
//!
//! // One timer holds one task type; boxed closures let tasks differ.
//! type Task = Box<dyn FnOnce() + Send>;
//! let timer = TimerBuilder::new().build::<Task>().unwrap();
//! let (tx, rx) = mpsc::channel();
//! let tx2 = tx.clone();
//! timer.add(Duration::from_millis(5), Box::new(move || tx.send("fired").unwrap())).unwrap();
//! let handle = timer
//!     .add(Duration::from_secs(60), Box::new(move || tx2.send("never").unwrap()))
//!     .unwrap();
//! assert!(timer.cancel(handle).is_some());
//! assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), "fired");
//! ```

#![warn(missing_docs)]
// On docs.rs (`--cfg docsrs`, nightly): each item behind a cargo feature gets its
// "Available on crate feature X only" badge.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod alarm;
mod builder;
mod clock;
mod core;
mod driver;
mod error;
mod executor;
mod shared_batch;
mod sleeper;
mod stand_in;
mod sync;
mod timer;
mod user_code;
mod wheel;
mod work;

pub use builder::TimerBuilder;
pub use clock::{Clock, ManualClock, SystemClock};
pub use core::{TimerCore, TimerHandle, TimerStats};
pub use driver::{Driver, DriverConfig, DriverWork, Expire, NextRound};
pub use error::{AddError, BuildError};
pub use executor::Executor;
pub use stand_in::{DEFAULT_MAX_STAND_INS, DEFAULT_STAND_IN_BOUND, MAX_STAND_INS_LIMIT};
pub use timer::Timer;
pub use user_code::{drop_panic_payload, panic_message};
pub use wheel::{SlotKey, Wheel};

/// The loom-checked cell of both crates' hand-over protocols (this crate's shared
/// batches, the purgatory's slots): not part of the API.
#[doc(hidden)]
pub use sync::UnsafeCell;

/// The package README's examples, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Work the timer runs once, when its delay has passed.
///
/// Implemented for every `FnOnce() + Send + 'static` closure; implement it for your own
/// type to avoid boxing (the timer stores tasks inline, so a pointer-sized task keeps each
/// pending entry at 32 bytes).
pub trait TimerTask: Send + 'static {
    /// Runs the task. Called at most once, outside every timer lock.
    fn run(self);
}

impl<F: FnOnce() + Send + 'static> TimerTask for F {
    fn run(self) {
        self()
    }
}
