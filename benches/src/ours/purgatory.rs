//! `purgatory::Purgatory` as a W3 load target.
//!
//! # Invariants
//! - Keys are `u64`; the adapter passes the request's key slice by value, nothing else.
//! - A refused watch (only possible after shutdown) completes nothing and returns `None`;
//!   the run then reports fewer completions than requests.

use purgatory::{DelayedOperation, OperationHandle, Purgatory, WatchOutcome};

use crate::workloads::w3::LoadPurgatory;

/// Our purgatory with `u64` keys.
pub type OurPurgatory<O> = Purgatory<u64, O>;

impl<O: DelayedOperation> LoadPurgatory<O> for Purgatory<u64, O> {
    type Handle = OperationHandle<O>;

    #[inline]
    fn watch(&self, op: O, keys: &[u64]) -> Option<OperationHandle<O>> {
        match Purgatory::watch(self, op, keys.iter().copied()) {
            Ok(WatchOutcome::Pending(handle)) => Some(handle),
            Ok(WatchOutcome::Completed) | Err(_) => None,
        }
    }

    fn watch_batch(&self, batch: &mut Vec<(O, &[u64])>, out: &mut Vec<Option<Self::Handle>>) {
        let results = Purgatory::watch_batch(
            self,
            batch.drain(..).map(|(op, keys)| (op, keys.iter().copied())),
        );
        out.extend(results.into_iter().map(|r| match r {
            Ok(WatchOutcome::Pending(handle)) => Some(handle),
            Ok(WatchOutcome::Completed) | Err(_) => None,
        }));
    }

    #[inline]
    fn force_complete(&self, handle: &OperationHandle<O>) -> bool {
        Purgatory::force_complete(self, handle)
    }

    fn force_complete_batch(&self, handles: &[OperationHandle<O>]) -> usize {
        Purgatory::force_complete_batch(self, handles)
    }

    #[inline]
    fn check_and_complete(&self, key: u64) -> usize {
        Purgatory::check_and_complete(self, &key)
    }

    fn shutdown(&self) {
        Purgatory::shutdown(self)
    }
}
