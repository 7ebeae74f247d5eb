//! What one purgatory shares between its handles, its reaper and its pool: the op table,
//! the watcher lists, the timer core, the counters, and the small records its policies
//! keep (where the next purge step starts; with the feature `metrics`, its series in the
//! recorder, `series.rs`). The protocols that use it each have their file above this
//! one: watching (`watch.rs`), completing
//! (`completion.rs`), expiring and the reaper's rounds (`expiry.rs`), purging
//! (`purge.rs`), publishing (`metrics.rs`). This file imports none of them.
//!
//! # Lock order
//! An operation's slot (its lock bit, `slot.rs`) is held before a watcher shard lock, a
//! timer shard lock, a cancel-queue lock or a free-list lock is taken, never waited for
//! while one of them is held; the slots held together by one watch chunk are its own new
//! slots, which nobody else can be waiting for. Watcher shard, timer shard and free-list
//! locks are leaves: nothing is locked while one is held, but the op table's lock of the
//! slots set aside under a free-list lock (a vacate while a segment is being emptied,
//! `op_table/give_back.rs`), itself a leaf. A cancel-queue lock is held while its handles
//! are applied, so a timer shard lock is taken under it (never the other way round; see
//! `cancels.rs`). The op table's growth lock (making and giving back its segments,
//! `op_table.rs`) is taken with no lock held but slots, and the free-list locks are taken
//! under it (never the other way round). No lock but the
//! operation's own slot is held while user code runs (its `try_complete`), except a
//! key's `Eq` under a watcher shard lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use timer_core::{TimerCore, TimerTask};

use crate::cancels::DeferredCancels;
use crate::counters::Counters;
use crate::op_table::{OpRef, OpTable};
use crate::operation::DelayedOperation;
use crate::runtime::RuntimeContext;
use crate::sync::Mutex;
use crate::user_code::UserCode;
use crate::watchers::{PurgeCursor, Watchers};

/// Source of purgatory identities, so a handle is only honoured by its own purgatory.
static NEXT_PURGATORY_ID: AtomicU64 = AtomicU64::new(0);

pub(crate) struct State<K, O: DelayedOperation> {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) table: OpTable<O>,
    /// The timer: this purgatory's own, or the one it shares with the other members of
    /// its [`TimerGroup`](crate::TimerGroup) (`group.rs`).
    pub(crate) timer: Arc<TimerCore<Expiry>>,
    /// This purgatory's place in its group: what its timer tasks carry, so the group's
    /// rounds hand each expiry to its own purgatory.
    pub(crate) member: u32,
    /// On a `TimerGroup`'s shared timer: counts what its watches accept, for `pending`
    /// (`stats.rs`).
    pub(crate) in_group: bool,
    pub(crate) watchers: Watchers<K>,
    pub(crate) counters: Counters,
    pub(crate) purge: PurgePolicy,
    /// Timer cancels of completed operations, applied in batches (see `cancels.rs`).
    pub(crate) cancels: DeferredCancels,
    /// The runtime whose context user code runs in (`runtime.rs`).
    pub(crate) runtime: RuntimeContext,
    /// The door every call into user code goes through (`user_code.rs`), with the count
    /// of the panics it caught.
    pub(crate) user: UserCode,
    #[cfg(feature = "metrics")]
    pub(crate) metrics: crate::series::Series,
    /// Housekeeping passes left during which the timer's give-back is looked at
    /// (`housekeeping.rs`).
    pub(crate) timer_looks: std::sync::atomic::AtomicU8,
}

impl<K, O: DelayedOperation> State<K, O> {
    pub(crate) fn new(
        name: String,
        timer: Arc<TimerCore<Expiry>>,
        member: u32,
        in_group: bool,
        watchers: Watchers<K>,
        purge: PurgePolicy,
        runtime: RuntimeContext,
    ) -> Self {
        let user = UserCode::default();
        #[cfg(feature = "metrics")]
        let metrics = crate::series::Series::new(&name, &user);
        State {
            id: NEXT_PURGATORY_ID.fetch_add(1, Ordering::Relaxed),
            name,
            table: OpTable::new(),
            timer,
            member,
            in_group,
            watchers,
            counters: Counters::default(),
            purge,
            cancels: DeferredCancels::default(),
            runtime,
            user,
            #[cfg(feature = "metrics")]
            metrics,
            timer_looks: std::sync::atomic::AtomicU8::new(0),
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone, O: DelayedOperation> State<K, O> {
    /// At the end of every call of the API that may change the figures: with the feature
    /// `metrics`, publishes them again if shutdown already published its final ones
    /// (`metrics.rs`, `publish_if_closed`); nothing without it.
    #[inline(always)]
    pub(crate) fn after_call(&self) {
        #[cfg(feature = "metrics")]
        self.publish_if_closed();
    }
}

/// The timer task of one watched operation: the name of the operation to expire, and
/// the purgatory of its group it is in (`group.rs`). 12 bytes: a timer entry is 40
/// bytes with or without the member (an `Option` of an `OpRef` alone takes 12 too).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expiry {
    pub(crate) op: OpRef,
    pub(crate) member: u32,
}

impl TimerTask for Expiry {
    /// Never called: the group's driver hands expiries to their purgatory's `expire_run`
    /// (`group.rs`, `expiry.rs`), which needs the op table and counters a task does not
    /// carry.
    fn run(self) {}
}

/// When to purge, and where the next purge step starts (the policy is `purge.rs`'s).
pub(crate) struct PurgePolicy {
    /// Completed entries still listed before a purge is considered.
    pub(crate) interval: i64,
    /// The shard the next purge step visits, and where in it the step resumes (read and
    /// written once per `purge_some`).
    pub(crate) position: Mutex<(usize, PurgeCursor)>,
}

impl PurgePolicy {
    pub(crate) fn new(interval: usize) -> Self {
        PurgePolicy {
            // Counts are i64; an interval beyond that means "practically never".
            interval: interval.min(i64::MAX as usize) as i64,
            position: Mutex::new((0, PurgeCursor::default())),
        }
    }
}
