//! The guard that takes a waiting operation back when the request it serves goes away:
//! [`CancelOnDrop`], made by [`Purgatory::cancel_on_drop`].

use std::hash::Hash;

use crate::handle::OperationHandle;
use crate::operation::DelayedOperation;
use crate::purgatory::Purgatory;
use crate::user_code::Site;

impl<K, O> Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// A guard that [`cancel`](Self::cancel)s the operation `handle` names when dropped
    /// (unless disarmed): for a request future that may be dropped because its client
    /// left.
    pub fn cancel_on_drop(&self, handle: OperationHandle<O>) -> CancelOnDrop<K, O> {
        CancelOnDrop::new(self.clone(), handle)
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
#[must_use = "dropping the guard cancels the operation at once"]
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
    #[must_use]
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
            // Still waiting: taken back and dropped here (in the purgatory's runtime and
            // the operation's span, as on every other path). Already answered: nothing.
            let state = self.purgatory.state();
            let _runtime = state.runtime.enter();
            if let Some((op, span)) = self.purgatory.take_back(&handle) {
                span.enter_around(&state.user, || state.user.drop(Site::OperationDrop, op));
                state.after_call();
            }
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
