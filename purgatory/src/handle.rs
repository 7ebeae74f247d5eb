//! Names of watched operations a caller holds: the handle, what a watch gave, and a
//! guard that takes a waiting operation back when the request it serves goes away.
//!
//! # Invariants
//! - A handle is a plain 16-byte value: an [`OpRef`] (slot and generation) and the
//!   purgatory's identity. It holds no memory of the operation and names nothing once
//!   the operation was taken (a later operation in the same slot is never mistaken for
//!   it, see `op_table.rs`); another purgatory honours it never.

use std::hash::Hash;
use std::marker::PhantomData;

use crate::op_table::OpRef;
use crate::operation::DelayedOperation;
use crate::purgatory::Purgatory;

/// A watched operation, for [`Purgatory::force_complete`], [`Purgatory::cancel`] and
/// [`Purgatory::is_completed`]. A plain 16-byte value: it holds no memory of the
/// operation, and once the operation is completed it names nothing (a later operation
/// is never mistaken for it). A handle given to another purgatory than the one that
/// issued it completes nothing.
pub struct OperationHandle<O> {
    pub(crate) op: OpRef,
    pub(crate) purgatory: u64,
    _op: PhantomData<fn() -> O>,
}

impl<O> OperationHandle<O> {
    pub(crate) fn new(op: OpRef, purgatory: u64) -> Self {
        OperationHandle {
            op,
            purgatory,
            _op: PhantomData,
        }
    }
}

impl<O> Clone for OperationHandle<O> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<O> Copy for OperationHandle<O> {}

impl<O> std::fmt::Debug for OperationHandle<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperationHandle").finish_non_exhaustive()
    }
}

/// What [`Purgatory::watch`] did with an operation.
pub enum WatchOutcome<O> {
    /// `try_complete` succeeded at once; `on_complete` has run.
    Completed,
    /// The operation waits on its keys and its timeout.
    Pending(OperationHandle<O>),
}

impl<O> std::fmt::Debug for WatchOutcome<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatchOutcome::Completed => f.write_str("Completed"),
            WatchOutcome::Pending(_) => f.write_str("Pending(..)"),
        }
    }
}

/// Takes a waiting operation back ([`Purgatory::cancel`]) when dropped, unless
/// [`disarm`](Self::disarm)ed: hold it in the request's future, so a future dropped
/// because its client went away frees the operation (and what it holds) at once
/// instead of at its timeout. Made by [`Purgatory::cancel_on_drop`].
///
/// ```
/// # use std::time::Duration;
/// # use purgatory::{Completion, DelayedOperation, Purgatory, WatchOutcome};
/// # struct Fetch;
/// # impl DelayedOperation for Fetch {
/// #     fn timeout(&self) -> Duration { Duration::from_secs(30) }
/// #     fn try_complete(&mut self) -> bool { false }
/// #     fn on_complete(&mut self, _: Completion) {}
/// # }
/// let fetches: Purgatory<u32, Fetch> = Purgatory::new("fetch");
/// if let WatchOutcome::Pending(handle) = fetches.watch(Fetch, [7]).unwrap() {
///     let guard = fetches.cancel_on_drop(handle);
///     // ... await the answer; if this future is dropped first, so is `guard` ...
///     drop(guard);
///     assert!(fetches.is_completed(&handle));
///     assert_eq!(fetches.stats().cancelled, 1);
/// }
/// ```
pub struct CancelOnDrop<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    purgatory: Purgatory<K, O>,
    handle: Option<OperationHandle<O>>,
}

impl<K, O> CancelOnDrop<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    pub(crate) fn new(purgatory: Purgatory<K, O>, handle: OperationHandle<O>) -> Self {
        CancelOnDrop {
            purgatory,
            handle: Some(handle),
        }
    }

    /// The operation's handle.
    pub fn handle(&self) -> OperationHandle<O> {
        self.handle.expect("a guard holds its handle until dropped")
    }

    /// Lets the operation go on waiting; returns its handle.
    pub fn disarm(mut self) -> OperationHandle<O> {
        self.handle
            .take()
            .expect("a guard holds its handle until dropped")
    }
}

impl<K, O> Drop for CancelOnDrop<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            // Still waiting: taken back and dropped here. Already answered: nothing.
            drop(self.purgatory.cancel(&handle));
        }
    }
}

impl<K, O> std::fmt::Debug for CancelOnDrop<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelOnDrop")
            .field("armed", &self.handle.is_some())
            .finish_non_exhaustive()
    }
}
