//! A purgatory held without keeping it alive: [`WeakPurgatory`], for whatever serves a
//! purgatory without owning it (a task feeding it events, a `Parked` future, a metrics
//! poller), so that the service's last handle still shuts it down.
//!
//! # Invariants
//! - A `WeakPurgatory` never keeps the purgatory alive nor delays its shutdown, and
//!   neither does a handle it upgrades to: such a handle is not an owner
//!   (`State::owners` counts the others). The drop of the last owning handle shuts the
//!   purgatory down (`purgatory.rs`, `shut_down_unowned`) whatever upgraded handles are
//!   in use; their calls are refused from then on, as on any shut-down purgatory.
//! - `upgrade` gives a handle while an owner lives, `None` once the last owner was
//!   dropped (its shutdown begun, or queued on a runtime's blocking pool: it answers
//!   every operation that was pending). A member of a `TimerGroup` is not shut down by
//!   its last owner's drop: it upgrades until the group's shutdown. An upgraded handle that happens to be the last
//!   reference frees the purgatory when dropped, as the last handle does.

use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use timer_core::Driver;

use crate::group::Group;
use crate::operation::DelayedOperation;
use crate::purgatory::Purgatory;
use crate::state::State;

/// A purgatory held without keeping it alive ([`Purgatory::downgrade`]): a task that
/// feeds a purgatory events (a follower reporting acks) holds one, and stops once
/// [`upgrade`](Self::upgrade) finds the purgatory gone, where a `Purgatory` clone would
/// keep it alive and its shutdown from running.
pub struct WeakPurgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    driver: Weak<Driver<Group>>,
    state: Weak<State<K, O>>,
}

impl<K, O> WeakPurgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// A handle to the purgatory, while an owning handle (not an upgraded one) lives;
    /// `None` once the last owner was dropped (its shutdown then has begun, or is queued
    /// on the runtime's blocking pool, and answers what was pending). The handle given
    /// does not own the purgatory: hold it for a call or a batch of calls, not for
    /// ever; the last owner's drop shuts the purgatory down even while it is in use (its
    /// calls are refused from then on). A purgatory shut down by `shutdown` while owners
    /// live still upgrades: its calls are refused or find nothing, as on any handle.
    pub fn upgrade(&self) -> Option<Purgatory<K, O>> {
        let handle = Purgatory::from_shared(self.driver.upgrade()?, self.state.upgrade()?);
        // No owner left: its shutdown has begun (or is queued on a runtime's blocking
        // pool). A member of a `TimerGroup` lives on without owners until the group shuts
        // down (`group.rs`): it upgrades meanwhile, so a `Parked` dropped still cancels
        // its operation.
        let state = handle.state();
        let alive =
            state.owners.load(Ordering::Acquire) > 0 || (state.in_group && !handle.is_shutdown());
        alive.then_some(handle)
    }
}

impl<K, O> Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// A [`WeakPurgatory`]: this purgatory, held without keeping it alive.
    pub fn downgrade(&self) -> WeakPurgatory<K, O> {
        WeakPurgatory {
            driver: Arc::downgrade(self.driver()),
            state: Arc::downgrade(self.shared_state()),
        }
    }
}

impl<K, O> Clone for WeakPurgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    fn clone(&self) -> Self {
        WeakPurgatory {
            driver: Weak::clone(&self.driver),
            state: Weak::clone(&self.state),
        }
    }
}

impl<K, O> std::fmt::Debug for WeakPurgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeakPurgatory")
            .field("alive", &(self.driver.strong_count() > 0))
            .finish()
    }
}
