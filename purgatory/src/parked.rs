//! Awaiting a parked operation (cargo feature `tokio`): the [`Reply`] an operation
//! answers through, and [`Parked`], the future of that answer, which cancels the
//! operation when dropped unanswered. `Purgatory::park_with` makes the two as a pair.
//!
//! # States of a `Parked`
//!
//! | state | how it got there | its drop |
//! |---|---|---|
//! | waiting | `park_with` watched the operation | cancels it (`Purgatory::cancel`) |
//! | settled | `park_with` completed it at once; or polled to its answer; or `try_cancel` | nothing |
//!
//! # Invariants
//! - Exactly once: the drop's cancel and a completion both take the operation out of
//!   its slot, which only one of them can do (`slot.rs`). If the cancel wins, no
//!   callback runs and the operation is counted cancelled; if a completion won, its
//!   callbacks ran (or are running on the completing thread) and it is counted as that
//!   completion: the answer then arrives into a channel nobody reads, and is dropped.
//!   [`Parked::try_cancel`] is the same race with both outcomes kept: the operation
//!   back, or `None` and the answer still to await.
//! - The answer channel is tokio's `oneshot`: sending never blocks or waits, so
//!   `on_complete` may reply from any thread, in or out of a runtime.
//! - A `Parked` holds its purgatory weakly: it never keeps a purgatory alive (nor forms a
//!   cycle with one through an operation that holds it). If the purgatory is gone when
//!   the `Parked` is dropped, its shutdown answered the operation: nothing to cancel.
//! - The drop's cancel drops the operation with the purgatory's runtime and the
//!   operation's span entered, as every other path drops operations (`runtime.rs`,
//!   `span.rs`).

use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;

use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::error::WatchError;
use crate::handle::{OperationHandle, WatchOutcome};
use crate::operation::{Completion, DelayedOperation};
use crate::purgatory::Purgatory;
use crate::user_code::Site;
use crate::weak::WeakPurgatory;

/// A reply channel for one operation: the [`Reply`] goes into the operation, which
/// answers through it from `on_complete`; the [`Answer`] goes to
/// [`Purgatory::park`], which returns the future of the answer.
///
/// Deprecated with `park`: [`Purgatory::park_with`] makes the pair itself, so that the
/// operation and its future cannot be mismatched (and no function named `reply` is
/// shadowed by the field an operation keeps it in). For an operation answered outside
/// a purgatory, [`Reply::channel`] makes the same pair.
#[deprecated(
    since = "0.2.0",
    note = "use `Purgatory::park_with`, or `Reply::channel` outside a purgatory"
)]
pub fn reply<T>() -> (Reply<T>, Answer<T>) {
    reply_pair()
}

/// The pair behind `park_with`, `reply` and `Reply::channel`.
fn reply_pair<T>() -> (Reply<T>, Answer<T>) {
    let (sender, receiver) = oneshot::channel();
    (
        Reply {
            sender: Some(sender),
        },
        Answer { receiver },
    )
}

/// The sending half an operation keeps to answer whoever awaits it. Send once, from
/// `on_complete`, with the [`Completion`] it was given.
pub struct Reply<T> {
    sender: Option<oneshot::Sender<Answered<T>>>,
}

impl<T> Reply<T> {
    /// A reply and the [`Answer`] it reaches, for an operation answered outside a
    /// purgatory (a test, or a request answered at once). To park an operation, use
    /// [`Purgatory::park_with`], which makes the pair.
    pub fn channel() -> (Reply<T>, Answer<T>) {
        reply_pair()
    }

    /// Sends the answer; returns whether it reached a waiting [`Parked`] (false if it was
    /// dropped, its client gone, or if this reply was already used).
    pub fn send(&mut self, how: Completion, answer: T) -> bool {
        match self.sender.take() {
            Some(sender) => sender.send(Answered { how, answer }).is_ok(),
            None => false,
        }
    }

    /// Whether nobody waits for the answer any more (the `Parked` was dropped, or the
    /// answer was sent): an operation may then skip building it.
    pub fn is_closed(&self) -> bool {
        self.sender.as_ref().is_none_or(oneshot::Sender::is_closed)
    }
}

impl<T> std::fmt::Debug for Reply<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply")
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// The receiving half of a [`Reply`], waiting on no purgatory: what
/// [`Reply::channel`] makes, what [`Parked::detach`] and [`Refused::into_parts`] give.
/// Awaited, it gives the answer; dropped, it cancels nothing.
#[must_use = "an answer nobody awaits is dropped"]
pub struct Answer<T> {
    receiver: oneshot::Receiver<Answered<T>>,
}

impl<T> Future for Answer<T> {
    type Output = Result<Answered<T>, Unanswered>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.receiver)
            .poll(cx)
            .map(|received| received.map_err(|_| Unanswered))
    }
}

impl<T> std::fmt::Debug for Answer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer").finish_non_exhaustive()
    }
}

/// How a parked operation completed, and what it answered.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Answered<T> {
    /// What completed it.
    pub how: Completion,
    /// What its `on_complete` sent.
    pub answer: T,
}

/// The operation's [`Reply`] was dropped without an answer: its `on_complete` panicked
/// or did not send, or it was handed back uncompleted (`cancel_for_key`, `cancel`) and
/// dropped by whoever took it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unanswered;

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the operation's reply was dropped without an answer")
    }
}

impl std::error::Error for Unanswered {}

/// [`Purgatory::park_with`] refused the operation (see [`WatchError`]): the operation is in
/// the error, the answer is given back with it, so the caller can answer the refused
/// request through the operation's own [`Reply`] and still await it
/// ([`Parked::settled`]).
pub struct Refused<O, T> {
    error: WatchError<O>,
    answer: Answer<T>,
}

impl<O, T> Refused<O, T> {
    /// Why, with the operation; and its answer.
    pub fn into_parts(self) -> (WatchError<O>, Answer<T>) {
        (self.error, self.answer)
    }

    /// Why, with the operation (the answer is dropped).
    pub fn into_error(self) -> WatchError<O> {
        self.error
    }

    /// Why, without the operation.
    pub fn kind(&self) -> crate::WatchErrorKind {
        self.error.kind()
    }
}

impl<O: DelayedOperation, T> Refused<O, T> {
    /// Answers the refused operation here, as `how`: its `on_complete(how)`, then
    /// `on_expiration` if [`how.is_expiry()`](Completion::is_expiry), on this thread,
    /// then its drop; and returns the future of that answer, settled. So one `await`
    /// serves a request refused at once and one parked: with `Completion::Shutdown`, a
    /// request that came during shutdown is answered as the parked ones are.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use purgatory::{Completion, DelayedOperation, Purgatory, Reply};
    ///
    /// struct Poll { reply: Reply<u16> }
    /// impl DelayedOperation for Poll {
    ///     fn timeout(&self) -> Duration { Duration::from_secs(8) }
    ///     fn try_complete(&mut self) -> bool { false }
    ///     fn on_complete(&mut self, how: Completion) {
    ///         self.reply.send(how, if how == Completion::Shutdown { 503 } else { 204 });
    ///     }
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let polls: Purgatory<u32, Poll> = Purgatory::new("polls");
    /// polls.shutdown_async().await;
    /// let parked = polls
    ///     .park_with([7], |reply| Poll { reply })
    ///     .unwrap_or_else(|refused| refused.answer_as(Completion::Shutdown));
    /// assert_eq!(parked.await.unwrap().answer, 503);
    /// # });
    /// ```
    ///
    /// `how` is the caller's to choose (`Shutdown` for a refusal by shutdown, most
    /// often): whatever it is, the operation is counted only as refused
    /// (`PurgatoryStats::refused`), never as completed or expired. This is the caller's
    /// own code, run outside the purgatory: a panic in it reaches the caller.
    pub fn answer_as<K>(self, how: Completion) -> Parked<K, O, T>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
    {
        let Refused { error, answer } = self;
        let mut op = error.into_operation();
        op.on_complete(how);
        if how.is_expiry() {
            op.on_expiration();
        }
        drop(op);
        Parked::settled(answer)
    }
}

impl<O, T> std::fmt::Debug for Refused<O, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<O, T> std::fmt::Display for Refused<O, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl<O, T> std::error::Error for Refused<O, T> {}

/// The future answer of an operation parked in a purgatory ([`Purgatory::park_with`]).
/// Resolves to how it completed and what it answered. Dropped while the operation still
/// waits (its client left, its task ended), it cancels the operation: the timeout is
/// disarmed and the operation dropped at once, with no callback (see the module doc for
/// a completion racing the drop).
///
/// Its drop is a [`Purgatory::cancel`], so the purgatory's locking rule applies to it:
/// never drop a waiting `Parked` inside its own operation's `try_complete` (the cancel
/// would wait for the lock that `try_complete` runs under). It holds its purgatory
/// weakly: it does not keep the purgatory alive.
///
/// Like every future, it may panic if polled again after it gave its answer.
#[must_use = "dropping a Parked cancels its operation"]
pub struct Parked<K, O, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    answer: oneshot::Receiver<Answered<T>>,
    /// While the operation waits: what cancels it.
    waiting: Option<(WeakPurgatory<K, O>, OperationHandle<O>)>,
    /// The answer was taken (by a poll or `try_answer`).
    answered: bool,
}

impl<K, O, T> Parked<K, O, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// An answer no purgatory holds an operation for (one answered at once, or a refused
    /// operation answered by its caller): awaiting it gives the answer, dropping it
    /// cancels nothing.
    pub fn settled(answer: Answer<T>) -> Self {
        Parked {
            answer: answer.receiver,
            waiting: None,
            answered: false,
        }
    }

    /// The answer if it is there, without waiting: `None` while the operation waits
    /// (or its callbacks are still running), and once the answer was taken.
    pub fn try_answer(&mut self) -> Option<Result<Answered<T>, Unanswered>> {
        if self.answered {
            return None;
        }
        let received = match self.answer.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => return None,
            Ok(answered) => Ok(answered),
            Err(oneshot::error::TryRecvError::Closed) => Err(Unanswered),
        };
        self.waiting = None;
        self.answered = true;
        Some(received)
    }

    /// Blocks this thread until the answer comes, for code outside async tasks.
    ///
    /// # Panics
    /// On a thread that runs an async runtime (it would block a worker): await the
    /// `Parked` there instead. The `Parked` is then dropped by the unwinding, which
    /// cancels a waiting operation as any drop does.
    pub fn blocking_answer(mut self) -> Result<Answered<T>, Unanswered> {
        let (_, placeholder) = oneshot::channel();
        let receiver = std::mem::replace(&mut self.answer, placeholder);
        // If this panics, `self` (still waiting) is dropped: its cancel runs.
        let received = receiver.blocking_recv();
        self.waiting = None;
        received.map_err(|_| Unanswered)
    }

    /// The waiting operation's handle (`None` once settled: completed on `park`,
    /// answered, or cancelled).
    pub fn handle(&self) -> Option<OperationHandle<O>> {
        self.waiting.as_ref().map(|(_, handle)| *handle)
    }

    /// Takes the operation back if it still waits (no callback runs; counted cancelled);
    /// `None` if it completed (or its purgatory is gone, whose shutdown answered it), and
    /// then its answer is still to await here. Either way the drop cancels nothing any
    /// more.
    #[must_use = "a cancelled operation is handed back: answer its request or drop it"]
    pub fn try_cancel(&mut self) -> Option<O> {
        let (purgatory, handle) = self.waiting.take()?;
        purgatory.upgrade()?.cancel(&handle)
    }

    /// Lets the operation wait on even if this future is dropped; awaiting the returned
    /// [`Answer`] gives the same answer.
    pub fn detach(mut self) -> Answer<T> {
        self.waiting = None;
        self.take_answer()
    }

    /// The answer's receiver, for a method that consumes `self` (whose drop then finds a
    /// closed placeholder).
    fn take_answer(&mut self) -> Answer<T> {
        let (_, placeholder) = oneshot::channel();
        Answer {
            receiver: std::mem::replace(&mut self.answer, placeholder),
        }
    }
}

impl<K, O, T> Future for Parked<K, O, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    type Output = Result<Answered<T>, Unanswered>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let received = match Pin::new(&mut this.answer).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(received) => received,
        };
        // Answered, or never to be: the operation no longer waits.
        this.waiting = None;
        this.answered = true;
        Poll::Ready(received.map_err(|_| Unanswered))
    }
}

impl<K, O, T> Drop for Parked<K, O, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    fn drop(&mut self) {
        let Some((purgatory, handle)) = self.waiting.take() else {
            return;
        };
        // Gone: its shutdown answered the operation.
        let Some(purgatory) = purgatory.upgrade() else {
            return;
        };
        // Still waiting: taken back and dropped here, in the runtime's context and the
        // operation's span as on every other path. Completed meanwhile: nothing.
        let state = purgatory.state();
        let _runtime = state.runtime.enter();
        if let Some((op, span)) = purgatory.take_back(&handle) {
            span.enter_around(&state.user, || state.user.drop(Site::OperationDrop, op));
            state.after_call();
        }
    }
}

impl<K, O, T> std::fmt::Debug for Parked<K, O, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked")
            .field("waiting", &self.waiting.is_some())
            .finish_non_exhaustive()
    }
}

impl<K, O> Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// Builds an operation around a new [`Reply`] (`make`), [`watch`](Self::watch)es it
    /// on `keys`, and returns the future of its answer, which cancels the operation if
    /// dropped while it waits. The operation and the future are paired by construction:
    /// the operation answers through the `Reply` it was given, from `on_complete`, and
    /// the `Parked` resolves to that answer. Feature `tokio`.
    ///
    /// Refused as `watch` is: the [`Refused`] gives the operation back (holding its
    /// `Reply`) with its answer, so the caller can answer the request through the
    /// operation and still await it ([`Parked::settled`]). `make` runs on the calling
    /// thread before anything is watched: a panic in it reaches the caller, with nothing
    /// watched.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use purgatory::{Completion, DelayedOperation, Purgatory, Reply};
    ///
    /// struct Fetch { reply: Reply<&'static str> }
    /// impl DelayedOperation for Fetch {
    ///     fn timeout(&self) -> Duration { Duration::from_millis(5) }
    ///     fn try_complete(&mut self) -> bool { false }
    ///     fn on_complete(&mut self, how: Completion) {
    ///         self.reply.send(how, "empty fetch");
    ///     }
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let fetches: Purgatory<u32, Fetch> = Purgatory::new("fetch");
    /// let parked = fetches.park_with([7], |reply| Fetch { reply }).unwrap();
    /// let answered = parked.await.unwrap();
    /// assert_eq!((answered.how, answered.answer), (Completion::Expired, "empty fetch"));
    /// # });
    /// ```
    pub fn park_with<I, T, F>(&self, keys: I, make: F) -> Result<Parked<K, O, T>, Refused<O, T>>
    where
        I: IntoIterator<Item = K>,
        F: FnOnce(Reply<T>) -> O,
    {
        let (reply, answer) = reply_pair();
        #[allow(deprecated)]
        self.park(make(reply), keys, answer)
    }

    /// [`watch`](Self::watch)es `op` (which holds the [`Reply`] of `answer`: the pair
    /// that one [`reply()`] call made; with another `Answer`, the future never hears of
    /// the operation) and returns the future of its answer, which cancels the operation
    /// if dropped while it waits.
    /// Refused as `watch` is, with the operation and the answer given back in
    /// [`Refused`]. Feature `tokio`.
    ///
    /// Deprecated: an `Answer` from another `reply()` compiles and its future never
    /// resolves. [`park_with`](Self::park_with) pairs them by construction.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use purgatory::{reply, Completion, DelayedOperation, Purgatory, Reply};
    ///
    /// struct Fetch { reply: Reply<&'static str> }
    /// impl DelayedOperation for Fetch {
    ///     fn timeout(&self) -> Duration { Duration::from_millis(5) }
    ///     fn try_complete(&mut self) -> bool { false }
    ///     fn on_complete(&mut self, how: Completion) {
    ///         self.reply.send(how, "empty fetch");
    ///     }
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let fetches: Purgatory<u32, Fetch> = Purgatory::new("fetch");
    /// # #[allow(deprecated)]
    /// let (reply, answer) = reply();
    /// # #[allow(deprecated)]
    /// let parked = fetches.park(Fetch { reply }, [7], answer).unwrap();
    /// let answered = parked.await.unwrap();
    /// assert_eq!((answered.how, answered.answer), (Completion::Expired, "empty fetch"));
    /// # });
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `park_with(keys, |reply| op)`, which pairs the operation with its answer"
    )]
    pub fn park<I, T>(
        &self,
        op: O,
        keys: I,
        answer: Answer<T>,
    ) -> Result<Parked<K, O, T>, Refused<O, T>>
    where
        I: IntoIterator<Item = K>,
    {
        Self::parked(self.watch(op, keys), answer, self)
    }

    /// [`park_with`](Self::park_with) on no key ([`watch_keyless`](Self::watch_keyless)):
    /// a timer-only operation (a session, a backoff) awaited; answered by its timeout, a
    /// force or shutdown, and cancelled when the future is dropped while it waits. Its
    /// deadline moves with [`reset_timeout`](Self::reset_timeout) on
    /// [`Parked::handle`]. Feature `tokio`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use purgatory::{Completion, DelayedOperation, Purgatory, Reply};
    ///
    /// struct Backoff { reply: Reply<()> }
    /// impl DelayedOperation for Backoff {
    ///     fn timeout(&self) -> Duration { Duration::from_millis(5) }
    ///     fn try_complete(&mut self) -> bool { false }
    ///     fn on_complete(&mut self, how: Completion) { self.reply.send(how, ()); }
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let backoffs: Purgatory<u32, Backoff> = Purgatory::new("backoff");
    /// let parked = backoffs.park_keyless_with(|reply| Backoff { reply }).unwrap();
    /// assert_eq!(parked.await.unwrap().how, Completion::Expired);
    /// # });
    /// ```
    pub fn park_keyless_with<T, F>(&self, make: F) -> Result<Parked<K, O, T>, Refused<O, T>>
    where
        F: FnOnce(Reply<T>) -> O,
    {
        let (reply, answer) = reply_pair();
        Self::parked(self.watch_keyless(make(reply)), answer, self)
    }

    /// The [`Parked`] future of what a watch gave, or the [`Refused`] operation.
    fn parked<T>(
        watched: Result<WatchOutcome<O>, WatchError<O>>,
        answer: Answer<T>,
        purgatory: &Self,
    ) -> Result<Parked<K, O, T>, Refused<O, T>> {
        let waiting = match watched {
            Ok(WatchOutcome::Completed) => None,
            Ok(WatchOutcome::Pending(handle)) => Some((purgatory.downgrade(), handle)),
            Err(error) => return Err(Refused { error, answer }),
        };
        Ok(Parked {
            answer: answer.receiver,
            waiting,
            answered: false,
        })
    }
}
