//! A purgatory held without keeping it alive: [`WeakPurgatory`], for whatever serves a
//! purgatory without owning it (a task feeding it events, a `Parked` future, a metrics
//! poller), so that the service's last handle still shuts it down.
//!
//! # Invariants
//! - A `WeakPurgatory` never keeps the purgatory alive nor delays its shutdown, and
//!   neither does a handle it upgrades to: such a handle is not an owner
//!   (`Group::owners` counts the others, for every member of the group). The drop of
//!   the last owning handle shuts the purgatory down (`purgatory.rs`,
//!   `shut_down_unowned`) whatever upgraded handles are in use; their calls are refused
//!   from then on, as on any shut-down purgatory.
//! - `upgrade` gives a handle while an owner lives, `None` once the last owner was
//!   dropped (its shutdown begun, or queued on a runtime's blocking pool: it answers
//!   every operation that was pending). For a member of a `TimerGroup`, the owners are
//!   the group's: the `TimerGroup`'s handles and every member's owning handles. It
//!   upgrades while one of them lives, and its upgraded handles keep the group alive no
//!   more than any other purgatory's. An upgraded handle that happens to be the last
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
    ///
    /// For a purgatory on a [`TimerGroup`](crate::TimerGroup), the owners are the
    /// group's: its `TimerGroup` handles and every member's owning handles. It upgrades
    /// while one of them lives (its own last handle gone or not), and the last one's drop
    /// shuts the whole group down. `shutdown` on the handle given shuts the group down
    /// too, as on any member.
    pub fn upgrade(&self) -> Option<Purgatory<K, O>> {
        let handle = Purgatory::from_shared(self.driver.upgrade()?, self.state.upgrade()?);
        // No owner left: its group's shutdown has begun (or is queued on a runtime's
        // blocking pool). The owners are the group's (`group.rs`): a member of a
        // `TimerGroup` upgrades while the group has one, its own last handle gone or not.
        let alive = handle.driver().target().owners.load(Ordering::Acquire) > 0;
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
