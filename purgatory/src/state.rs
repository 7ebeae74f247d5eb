//! What one purgatory shares between its handles, its reaper and its pool: the op table,
//! the watcher lists, the timer core, the counters. The protocols that use it each have
//! their file: watching (`watch.rs`), completing (`completion.rs`), expiring and the
//! reaper's rounds (`expiry.rs`), purging (`purge.rs`).
//!
//! # Lock order
//! An operation's slot lock (`op_table.rs`) is taken before a watcher shard lock, a
//! timer shard lock or a cancel-queue lock, never while holding one of them; the slot
//! locks of one watch chunk are its own new slots, which nobody else can be waiting
//! for. Watcher shard, timer shard and cancel-queue locks are leaves: nothing is locked
//! while one is held. No lock but the operation's own is held while user code runs (its
//! `try_complete`), except a key's `Hash`/`Eq`/`Drop` under a watcher shard lock.

use std::sync::atomic::{AtomicU64, Ordering};

use timer_core::TimerCore;

use crate::cancels::DeferredCancels;
use crate::counters::Counters;
use crate::expiry::Expiry;
use crate::op_table::OpTable;
use crate::operation::DelayedOperation;
use crate::purge::PurgePolicy;
use crate::watchers::Watchers;

/// Source of purgatory identities, so a handle is only honoured by its own purgatory.
static NEXT_PURGATORY_ID: AtomicU64 = AtomicU64::new(0);

pub(crate) struct State<K, O: DelayedOperation> {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) table: OpTable<O>,
    pub(crate) timer: TimerCore<Expiry>,
    pub(crate) watchers: Watchers<K>,
    pub(crate) counters: Counters,
    pub(crate) purge: PurgePolicy,
    /// Timer cancels of completed operations, applied in batches (see `cancels.rs`).
    pub(crate) cancels: DeferredCancels,
    #[cfg(feature = "metrics")]
    pub(crate) metrics: crate::metrics::Schedule,
}

impl<K, O: DelayedOperation> State<K, O> {
    pub(crate) fn new(
        name: String,
        timer: TimerCore<Expiry>,
        watchers: Watchers<K>,
        purge: PurgePolicy,
    ) -> Self {
        State {
            id: NEXT_PURGATORY_ID.fetch_add(1, Ordering::Relaxed),
            name,
            table: OpTable::new(),
            timer,
            watchers,
            counters: Counters::default(),
            purge,
            cancels: DeferredCancels::default(),
            #[cfg(feature = "metrics")]
            metrics: Default::default(),
        }
    }
}
