//! The operation a user parks in the purgatory.
//!
//! # Contract (kept by the framework, not the user)
//! - `try_complete` never runs concurrently with itself or with `on_complete` for the same
//!   operation: each operation sits behind its own lock, and `&mut self` says so.
//! - `on_complete` runs exactly once for every operation the purgatory accepted, whoever
//!   completes it: the check inside `try_complete_else_watch`, an event
//!   (`check_and_complete`), a forced completion, the timeout, or shutdown (which expires).
//!   It does not run for an operation handed back by `cancel_for_key` or refused with an
//!   error: the caller owns answering those.
//! - `on_expiration` runs in addition, right after `on_complete`, exactly when the timeout
//!   or shutdown completed the operation (`Completion::Expired` or `Completion::Shutdown`).
//! - `Completion::Shutdown` is given exactly to the operations counted in
//!   `PurgatoryStats::expired_at_shutdown`, `Completion::Expired` exactly to those counted
//!   in `expired`: the callback, the stats and the metrics never disagree.
//! - Right after its callbacks the operation value is dropped, so whatever it holds (a
//!   request payload, a response sender) is freed at completion, not at the next purge.
//! - No purgatory lock (watcher shard or timer) is held while any of these run.
//! - `on_complete`, `on_expiration` and the drop run with the `tracing` span that was
//!   current at the watch entered, whichever thread runs them (`span.rs`).

use std::time::Duration;

/// What completed an operation; passed to [`DelayedOperation::on_complete`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Completion {
    /// `try_complete` returned true (on watch, or on an event for one of its keys).
    Ready,
    /// [`Purgatory::force_complete`](crate::Purgatory::force_complete) completed it.
    Forced,
    /// Its timeout passed first.
    Expired,
    /// The purgatory shut down (or its last handle was dropped) before its timeout or an
    /// event completed it. Answered like a timeout (`on_expiration` runs too), but told
    /// apart so a service can answer "shutting down" (a 503) rather than "nothing came"
    /// (a 204). Counted in `PurgatoryStats::expired_at_shutdown`.
    ///
    /// Exactly the operations whose timer shutdown drained (their timeout had not come):
    /// a timeout that came first is `Expired`, even if the answer goes out after shutdown
    /// began (an operation whose `try_complete` was running when its timeout came is
    /// answered as it returns).
    Shutdown,
}

impl Completion {
    /// Whether the operation completed without being ready: its timeout
    /// ([`Expired`](Self::Expired)) or shutdown ([`Shutdown`](Self::Shutdown)), the
    /// completions after which `on_expiration` runs.
    #[inline]
    pub fn is_expiry(self) -> bool {
        matches!(self, Completion::Expired | Completion::Shutdown)
    }
}

/// A request that cannot be answered yet: a produce waiting for replicas, a fetch waiting
/// for bytes.
///
/// The common case is an operation that owns its response sender and answers from
/// `on_complete`:
///
/// ```
/// use std::time::Duration;
/// use purgatory::{Completion, DelayedOperation};
///
/// struct DelayedFetch {
///     min_bytes: usize,
///     available: std::sync::Arc<std::sync::atomic::AtomicUsize>,
///     reply: crossbeam_channel::Sender<Result<usize, &'static str>>,
/// }
///
/// impl DelayedOperation for DelayedFetch {
///     fn timeout(&self) -> Duration {
///         Duration::from_millis(500)
///     }
///     fn try_complete(&mut self) -> bool {
///         self.available.load(std::sync::atomic::Ordering::Acquire) >= self.min_bytes
///     }
///     fn on_complete(&mut self, how: Completion) {
///         let bytes = self.available.load(std::sync::atomic::Ordering::Acquire);
///         let _ = self.reply.send(match how {
///             Completion::Expired if bytes == 0 => Err("nothing arrived"),
///             _ => Ok(bytes),
///         });
///     }
/// }
/// ```
///
/// # Threads and `tracing` spans
/// `on_complete`, `on_expiration` and the operation's drop run on whichever thread
/// answers it: the caller's for a watch that completes at once, an event or a force;
/// the reaper thread (or a stand-in, or the expiry pool) for a timeout; the thread that
/// shuts the purgatory down (`docs/purgatory.md`, "Which thread runs what"). Wherever
/// they run, the [`tracing`] span that was current when the operation was watched is
/// entered around them (and closed once they are done), so what they log belongs to the
/// request: a fetch watched inside its request's span logs its expiry in that span, from
/// the reaper. `try_complete` runs in the calling thread's own span: a watch's is that
/// span already, a check's is the span of the event that made the check. With no
/// subscriber set, nothing is captured (one relaxed load per watch).
pub trait DelayedOperation: Send + 'static {
    /// How long the operation may wait; read once, when it is watched. The deadline is
    /// rounded up to the timer's tick (a zero timeout expires at the next tick boundary);
    /// huge timeouts are clamped by the timer. A panic here refuses the operation
    /// ([`WatchError::TimeoutPanicked`](crate::WatchError::TimeoutPanicked)).
    fn timeout(&self) -> Duration;

    /// Whether the operation can complete now. Keep it cheap and non-blocking: it runs on
    /// the thread that calls `try_complete_else_watch` or `check_and_complete`, holding
    /// this operation's lock. A panic here is caught, reported, and counts as "not
    /// ready".
    ///
    /// From here, never call a purgatory method that waits for another operation's lock
    /// (`check_and_complete`, `force_complete`, `cancel`, `cancel_for_key`, `watch_batch`,
    /// or dropping a waiting `Parked` or an armed `CancelOnDrop`): two `try_complete`s
    /// that check each other's key would wait for each other forever (the locking rule
    /// on [`Purgatory`](crate::Purgatory)). Nor `shutdown`, which waits for callbacks in
    /// progress, one of which may be waiting for this operation's lock.
    fn try_complete(&mut self) -> bool;

    /// Answers the request. Runs exactly once per accepted operation. A panic here is
    /// caught and reported; the operation still counts as completed.
    fn on_complete(&mut self, how: Completion);

    /// Runs after `on_complete` when the timeout or shutdown completed the operation
    /// ([`Completion::is_expiry`]; metrics, logs).
    fn on_expiration(&mut self) {}
}
