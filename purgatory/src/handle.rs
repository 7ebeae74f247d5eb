//! Names of watched operations a caller holds: the handle and what a watch gave (the
//! guard that cancels on drop is `guard.rs`).
//!
//! # Invariants
//! - A handle is a plain 16-byte value: an [`OpRef`] (slot and generation) and the
//!   purgatory's identity. It holds no memory of the operation and names nothing once
//!   the operation was taken (a later operation in the same slot is never mistaken for
//!   it, see `op_table.rs`); another purgatory honours it never.

use std::marker::PhantomData;

use crate::op_table::OpRef;

/// A watched operation, for [`Purgatory::force_complete`], [`Purgatory::cancel`] and
/// [`Purgatory::is_completed`]. A plain 16-byte value: it holds no memory of the
/// operation, and once the operation is completed it names nothing (a later operation
/// is never mistaken for it). A handle given to another purgatory than the one that
/// issued it completes nothing.
///
/// [`Purgatory::force_complete`]: crate::Purgatory::force_complete
/// [`Purgatory::cancel`]: crate::Purgatory::cancel
/// [`Purgatory::is_completed`]: crate::Purgatory::is_completed
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

/// What [`Purgatory::watch`](crate::Purgatory::watch) did with an operation.
#[must_use = "a pending outcome holds the only handle to the operation; `try_complete_else_watch` is the call that needs none"]
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
