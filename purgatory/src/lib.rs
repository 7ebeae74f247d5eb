//! Kafka's delayed-operation purgatory for Rust: park a request that cannot be answered
//! yet, complete it the moment an event makes it ready, or expire it on its timeout,
//! exactly once, for millions of requests at once.
//!
//! - [`DelayedOperation`]: what you implement (`try_complete`, `on_complete`,
//!   `on_expiration`, `timeout`).
//! - [`Purgatory`]: holds operations in per-key watcher lists
//!   (`try_complete_else_watch`, `check_and_complete`, `cancel_for_key`) over a
//!   hierarchical timing wheel ([`timer_core`]).
//! - On tokio (cargo feature `tokio`): callbacks in the runtime's context on every path,
//!   `Purgatory::park_with` (the future of an operation's answer, cancelling it when
//!   dropped), `shutdown_async`, a last drop that does not block a worker, and a clock
//!   that follows tokio's paused time: the chapter `purgatory::with_tokio`.
//!
//! # Guarantees
//! Every accepted operation completes exactly once: by `try_complete` succeeding, by a
//! forced completion, or by its timeout (or shutdown, which expires what is pending),
//! never two of these, never none. `try_complete` never runs concurrently with itself or
//! `on_complete` for one operation. No purgatory lock is held while callbacks run
//! (`try_complete` runs under its own operation's, see the locking rule on
//! [`Purgatory`]). Callbacks run in the `tracing` span that was current when their
//! operation was watched, whichever thread runs them (see [`DelayedOperation`]).
//!
//! Every call into user code (an operation's methods and drop, a key's `Hash`, `Eq` and
//! `Drop`, the clock, the metrics recorder, the tracing subscriber) goes through one door
//! that catches a panic, reports and counts it, and leaves nothing half done: the
//! operation is answered, or handed back in an error, and the reaper goes on. With the
//! default configuration, every due timeout is answered within 20 ms of its deadline
//! whatever other callbacks do, up to 32 of them held at once: work that has waited
//! 10 ms goes to stand-in threads ([`DEFAULT_STAND_IN_BOUND`],
//! [`DEFAULT_MAX_STAND_INS`]). The table of every kind of user code, and where each
//! promise stops, is in `docs/purgatory.md` ("User code that panics or stalls",
//! "Isolation").
//!
//! # Example
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use purgatory::{Completion, DelayedOperation, Purgatory};
//!
//! /// An acks=all produce: done when the follower reaches `offset`.
//! struct DelayedProduce {
//!     offset: u64,
//!     follower: Arc<AtomicU64>,
//!     reply: crossbeam_channel::Sender<&'static str>,
//! }
//!
//! impl DelayedOperation for DelayedProduce {
//!     fn timeout(&self) -> Duration { Duration::from_secs(30) }
//!     fn try_complete(&mut self) -> bool {
//!         self.follower.load(Ordering::Acquire) >= self.offset
//!     }
//!     fn on_complete(&mut self, how: Completion) {
//!         let _ = self.reply.send(match how {
//!             Completion::Expired => "request timed out",
//!             Completion::Shutdown => "broker shutting down",
//!             Completion::Ready | Completion::Forced => "acknowledged",
//!         });
//!     }
//! }
//!
//! let purgatory: Purgatory<&str, DelayedProduce> = Purgatory::new("produce");
//! let follower = Arc::new(AtomicU64::new(0));
//! let (tx, rx) = crossbeam_channel::unbounded();
//! let op = DelayedProduce { offset: 10, follower: follower.clone(), reply: tx };
//! assert_eq!(purgatory.try_complete_else_watch(op, ["topic-0"]).unwrap(), false);
//! follower.store(10, Ordering::Release);              // the follower caught up
//! assert_eq!(purgatory.check_and_complete(&"topic-0"), 1);
//! assert_eq!(rx.recv().unwrap(), "acknowledged");
//! ```

#![warn(missing_docs)]
// On docs.rs (`--cfg docsrs`, nightly): each item behind a cargo feature gets its
// "Available on crate feature X only" badge.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod cancels;
mod completion;
mod counters;
mod discard;
mod error;
mod expiry;
mod group;
mod guard;
mod handle;
mod housekeeping;
#[cfg(feature = "tokio")]
mod long_poll;
#[cfg(feature = "metrics")]
mod metrics;
mod op_list;
mod op_table;
mod operation;
#[cfg(feature = "tokio")]
mod parked;
mod pins;
mod purgatory;
mod purge;
mod runtime;
#[cfg(feature = "metrics")]
mod series;
mod slot;
mod span;
mod state;
mod stats;
mod sync;
#[cfg(feature = "tokio")]
mod tokio_time;
mod user_code;
mod watch;
mod watchers;
mod weak;
#[cfg(feature = "tokio")]
#[doc = include_str!("with_tokio.md")]
pub mod with_tokio {}

pub use builder::{default_shards, PurgatoryBuilder};
pub use error::{BuildError, WatchError, WatchErrorKind};
pub use group::{TimerGroup, TimerGroupBuilder, DEFAULT_MAX_MEMBERS, MAX_MEMBERS_LIMIT};
pub use guard::CancelOnDrop;
pub use handle::{OperationHandle, WatchOutcome};
#[cfg(feature = "tokio")]
pub use long_poll::{LongPoll, Wait, WaitError};
pub use operation::{Completion, DelayedOperation};
#[cfg(feature = "tokio")]
#[allow(deprecated)]
pub use parked::reply;
#[cfg(feature = "tokio")]
pub use parked::{Answer, Answered, Parked, Refused, Reply, Unanswered};
pub use purgatory::Purgatory;
pub use stats::PurgatoryStats;
pub use timer_core::{
    Clock, Executor, ManualClock, SystemClock, TimerBuilder, TimerStats, DEFAULT_MAX_STAND_INS,
    DEFAULT_STAND_IN_BOUND,
};
#[cfg(feature = "tokio")]
pub use tokio_time::TokioClock;
pub use weak::WeakPurgatory;

/// The package README's examples, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
