//! A purgatory held without keeping it alive: [`WeakPurgatory`], for whatever serves a
//! purgatory without owning it (a task feeding it events, a `Parked` future, a metrics
//! poller), so that the service's last handle still shuts it down.
//!
//! # Invariants
//! - A `WeakPurgatory` never keeps the purgatory alive nor delays its shutdown: the drop
//!   of the last `Purgatory` handle shuts it down (`purgatory.rs`, `release`) whatever
//!   weak ones exist. That drop moves the driver out of its `Arc` before shutting down,
//!   so no upgrade can begin once it has begun.
//! - `upgrade` gives a handle while another handle lives, `None` once the last was
//!   dropped (whose shutdown answered every operation). A handle got by `upgrade` is a
//!   handle like any other: if it turns out to be the last, its drop shuts the
//!   purgatory down.

use std::hash::Hash;
use std::sync::{Arc, Weak};

use timer_core::Driver;

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
    driver: Weak<Driver<State<K, O>>>,
}

impl<K, O> WeakPurgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// A handle to the purgatory, if a handle to it still lives; `None` once its last
    /// handle was dropped (and its shutdown answered what was pending). A purgatory shut
    /// down by `shutdown` with handles alive still upgrades: its calls are refused or
    /// find nothing, as on any handle.
    pub fn upgrade(&self) -> Option<Purgatory<K, O>> {
        self.driver.upgrade().map(Purgatory::from_shared)
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
