//! The answer of an operation parked in a purgatory, and the guard that takes the operation
//! back when nobody waits for that answer any more.
//!
//! A [`PendingAnswer`] is the receiving end of the operation's one-shot reply plus, while
//! the operation waits, the purgatory's [`CancelOnDrop`] guard for it. Dropping it before
//! the answer came (the request's future was dropped because its client left, or the task
//! ended) drops the guard, which cancels the operation with `Purgatory::cancel`: its
//! timeout is disarmed and its memory freed at once, and no callback runs, instead of the
//! operation waiting for its own timeout (up to the 24.8 days a client may ask for) to
//! answer nobody.
//!
//! Invariants:
//! - Cancelling is always safe: a handle names only its own operation, and `cancel` of an
//!   operation that already completed (its answer is in flight) returns `None` and does
//!   nothing, so completion and cancellation never both happen.
//! - Once the answer was received (or found gone), the guard is disarmed: the drop does
//!   not touch the purgatory.

use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};

use purgatory::{CancelOnDrop, DelayedOperation};
use tokio::sync::oneshot;

/// The future answer of a parked operation; cancels the operation when dropped unanswered.
pub struct PendingAnswer<K, O, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    answer: oneshot::Receiver<T>,
    /// While the operation waits: cancels it when dropped.
    parked: Option<CancelOnDrop<K, O>>,
}

impl<K, O, T> PendingAnswer<K, O, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// An answer already settled (the operation completed at once or was answered without
    /// the purgatory): nothing to cancel.
    pub fn settled(answer: oneshot::Receiver<T>) -> Self {
        PendingAnswer {
            answer,
            parked: None,
        }
    }

    /// The answer of an operation waiting in a purgatory, with the guard that cancels it
    /// (`Purgatory::cancel_on_drop`).
    pub fn parked(answer: oneshot::Receiver<T>, guard: CancelOnDrop<K, O>) -> Self {
        PendingAnswer {
            answer,
            parked: Some(guard),
        }
    }

    /// The answer arrived or can no longer come: the operation is not waiting any more.
    fn settle(&mut self) {
        if let Some(guard) = self.parked.take() {
            guard.disarm();
        }
    }

    /// The answer if it is there, without waiting.
    pub fn try_recv(&mut self) -> Result<T, oneshot::error::TryRecvError> {
        let received = self.answer.try_recv();
        if !matches!(received, Err(oneshot::error::TryRecvError::Empty)) {
            self.settle();
        }
        received
    }

    /// Blocks the thread until the answer comes (not from inside an async task).
    pub fn blocking_recv(self) -> Result<T, oneshot::error::RecvError> {
        let PendingAnswer { answer, parked } = self;
        let received = answer.blocking_recv();
        // Answered (or never to be): the operation no longer waits.
        if let Some(guard) = parked {
            guard.disarm();
        }
        received
    }
}

impl<K, O, T> Future for PendingAnswer<K, O, T>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    type Output = Result<T, oneshot::error::RecvError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let received = Pin::new(&mut this.answer).poll(cx);
        if received.is_ready() {
            this.settle();
        }
        received
    }
}
