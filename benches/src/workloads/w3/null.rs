//! The `null` W3 target: no purgatory at all, to measure the load tool's own cost.
//!
//! `watch` keeps the operation in its handle; `force_complete` completes it at once; a
//! handle dropped with its operation still inside (a request left to expire) completes
//! it as expired on the spot. No keys, no timer, no threads. Its CPU time and memory are
//! the floor under every real implementation's figures (generator, completer, sleeps);
//! its expiry lateness is meaningless (about minus the timeout).
//!
//! # Invariants
//! - Every watched operation completes exactly once: by `force_complete`, or when its
//!   handle is dropped. W3-events (`check_and_complete`) is not supported: it completes
//!   nothing.

use std::cell::Cell;

use purgatory::{Completion, DelayedOperation};

use crate::workloads::w3::op::LoadOp;
use crate::workloads::w3::LoadPurgatory;

/// The tool-floor target.
#[derive(Debug, Default)]
pub struct NullPurgatory;

/// Holds a watched operation until it is forced or dropped.
pub struct NullHandle(Cell<Option<LoadOp>>);

impl Drop for NullHandle {
    fn drop(&mut self) {
        if let Some(mut op) = self.0.take() {
            op.on_complete(Completion::Expired);
        }
    }
}

impl LoadPurgatory<LoadOp> for NullPurgatory {
    type Handle = NullHandle;

    fn watch(&self, op: LoadOp, _keys: &[u64]) -> Option<NullHandle> {
        Some(NullHandle(Cell::new(Some(op))))
    }

    fn force_complete(&self, handle: &NullHandle) -> bool {
        match handle.0.take() {
            Some(mut op) => {
                op.on_complete(Completion::Forced);
                true
            }
            None => false,
        }
    }

    fn check_and_complete(&self, _key: u64) -> usize {
        0
    }

    fn shutdown(&self) {}
}
