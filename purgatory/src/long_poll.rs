//! The simple case (cargo feature `tokio`): a long poll with no operation type of its
//! own. [`Purgatory::wait_until`] parks a [`LongPoll`], an operation made of a condition
//! and a timeout, and returns [`Wait`], the future of how it ended.
//!
//! # Invariants
//! - A `LongPoll` is an operation like any other: its condition is its `try_complete`
//!   (run on watch and on every `check_and_complete` of one of its keys, under the
//!   operation's lock, through the door in `user_code.rs`), and its answer is the
//!   [`Completion`] it was given. Every promise of `Parked` holds for `Wait`: it is
//!   watched when `wait_until` returns (not at the first poll), and dropping it
//!   unanswered cancels the operation, exactly once.
//! - A refusal by shutdown resolves as [`Completion::Shutdown`], what a caller answers
//!   either way. It is counted in `PurgatoryStats::refused` (no operation was accepted,
//!   as for any refused watch): `expired_at_shutdown` counts the polls that were waiting. Every other way not to be answered (a refusal for a key whose `Hash`
//!   panicked, no keys, or the operation taken back by `cancel_for_key` or `cancel`) is
//!   a [`WaitError`].

use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::error::WatchErrorKind;
use crate::handle::OperationHandle;
use crate::operation::{Completion, DelayedOperation};
use crate::parked::{Parked, Reply};
use crate::purgatory::Purgatory;

/// The condition of a [`LongPoll`]: true once the poll can be answered.
type Condition = Box<dyn FnMut() -> bool + Send>;

/// An operation made of a condition and a timeout, for [`Purgatory::wait_until`]: a
/// purgatory of long polls is a `Purgatory<K, LongPoll>`.
pub struct LongPoll {
    ready: Condition,
    timeout: Duration,
    reply: Reply<()>,
}

impl DelayedOperation for LongPoll {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn try_complete(&mut self) -> bool {
        (self.ready)()
    }

    fn on_complete(&mut self, how: Completion) {
        self.reply.send(how, ());
    }
}

impl std::fmt::Debug for LongPoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LongPoll")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Why a [`Wait`] ended without a [`Completion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitError {
    /// The purgatory refused the long poll for this reason (never
    /// [`WatchErrorKind::Shutdown`]: a refusal by shutdown resolves as
    /// [`Completion::Shutdown`]).
    Refused(WatchErrorKind),
    /// The long poll was taken back uncompleted (`cancel_for_key` or `cancel`).
    TakenBack,
}

impl std::fmt::Display for WaitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitError::Refused(kind) => write!(f, "long poll refused: {kind}"),
            WaitError::TakenBack => f.write_str("long poll taken back uncompleted"),
        }
    }
}

impl std::error::Error for WaitError {}

/// The future of a long poll ([`Purgatory::wait_until`]): how it ended. Dropped while it
/// waits (its client left), it cancels the long poll, as a dropped [`Parked`] does.
#[must_use = "dropping a Wait cancels its long poll"]
pub struct Wait<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    parked: Result<Parked<K, LongPoll, ()>, Option<WaitError>>,
}

impl<K> Wait<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// The waiting long poll's handle, for `force_complete` or `cancel` (`None` once it
    /// ended, or if it was answered at once or refused).
    pub fn handle(&self) -> Option<OperationHandle<LongPoll>> {
        self.parked.as_ref().ok().and_then(Parked::handle)
    }
}

impl<K> Future for Wait<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    type Output = Result<Completion, WaitError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.parked {
            Ok(parked) => Pin::new(parked)
                .poll(cx)
                .map(|answered| answered.map(|a| a.how).map_err(|_| WaitError::TakenBack)),
            Err(refused) => Poll::Ready(Err(refused.take().expect("polled after it ended"))),
        }
    }
}

impl<K> std::fmt::Debug for Wait<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait")
            .field("waiting", &self.handle().is_some())
            .finish_non_exhaustive()
    }
}

impl<K> Purgatory<K, LongPoll>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A long poll: waits until `ready` returns true, up to `timeout`. `ready` runs now
    /// and on every [`check_and_complete`](Self::check_and_complete) of one of `keys`
    /// (so call that whenever what `ready` reads may have changed). The long poll is
    /// watched before this returns; the returned [`Wait`] resolves to how it ended:
    /// `Ready`, `Expired` (the timeout), `Forced`, or `Shutdown` (also if the purgatory
    /// was already shut down). Dropping it cancels the long poll. Feature `tokio`.
    ///
    /// `ready` is the operation's `try_complete`: keep it short and non-blocking, and
    /// never call this purgatory from it (the locking rule on [`Purgatory`]).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use purgatory::{Completion, LongPoll, Purgatory};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let polls: Purgatory<String, LongPoll> = Purgatory::new("polls");
    /// let offset = Arc::new(AtomicU64::new(0));
    ///
    /// let seen = Arc::clone(&offset);
    /// let wait = polls.wait_until(["orders".to_string()], Duration::from_secs(8), move || {
    ///     seen.load(Ordering::Acquire) > 0
    /// });
    /// // A producer appends, then tells the purgatory.
    /// offset.store(1, Ordering::Release);
    /// polls.check_and_complete("orders");
    /// assert_eq!(wait.await, Ok(Completion::Ready));
    /// # });
    /// ```
    pub fn wait_until<I, F>(&self, keys: I, timeout: Duration, ready: F) -> Wait<K>
    where
        I: IntoIterator<Item = K>,
        F: FnMut() -> bool + Send + 'static,
    {
        let ready: Condition = Box::new(ready);
        let parked = self
            .park_with(keys, |reply| LongPoll {
                ready,
                timeout,
                reply,
            })
            .map_err(|refused| match refused.kind() {
                WatchErrorKind::Shutdown => None,
                kind => Some(WaitError::Refused(kind)),
            });
        Wait {
            parked: match parked {
                Ok(parked) => Ok(parked),
                Err(Some(error)) => Err(Some(error)),
                // Shut down: resolve as a shutdown's answer would.
                Err(None) => Ok(Parked::settled(answered(Completion::Shutdown))),
            },
        }
    }
}

/// An answer already given: `how`.
fn answered(how: Completion) -> crate::parked::Answer<()> {
    let (mut reply, answer) = Reply::channel();
    reply.send(how, ());
    answer
}
