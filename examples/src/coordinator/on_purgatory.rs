//! The coordinator's sessions on the purgatory: two purgatories, `sessions` (one keyless
//! operation per live member, its deadline moved by each heartbeat) and `joins` (one
//! parked operation per member waiting at its group's barrier, keyed by the group), on
//! one timer and its threads (`TimerGroup`: one reaper and one watchdog for both).
//!
//! # Invariants
//! - A member's session is one operation, watched once when its group's barrier opens;
//!   a heartbeat moves its deadline in place (`reset_timeout`). `true` means the session
//!   is alive with its new deadline; `false` means its timeout had already fired (or
//!   shutdown came): the heartbeat is answered `UNKNOWN_MEMBER_ID`, never `NONE` for a
//!   session that is expiring.
//! - A group's barrier opens exactly once: the join that brings the count to the group's
//!   size checks the group's key after parking itself; a join parked before that is
//!   completed by the check, one parked after it completes at its own first try.
//! - A member joins once; a second join is refused (`REBALANCE_IN_PROGRESS`), so a client
//!   cannot open its group's barrier early by joining twice.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use purgatory::{
    Completion, DelayedOperation, OperationHandle, Purgatory, Reply, TimerGroup, WatchOutcome,
};

use super::protocol::{Stats, NONE, REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID};
use super::{BoxFuture, Config, Coordinator, Record};

/// What the sessions and joins share.
struct Shared {
    config: Config,
    epoch: Instant,
    /// Each member's current deadline, nanoseconds after `epoch`.
    deadlines: Box<[AtomicU64]>,
    /// Each member's session, once its group's barrier opened: set once (a member joins
    /// once), then read by every heartbeat with one load, no lock.
    handles: Box<[OnceLock<OperationHandle<Session>>]>,
    /// Whether each member has joined.
    joined: Box<[AtomicBool]>,
    /// Joins so far, per group.
    group_joins: Box<[AtomicU32]>,
    record: Record,
}

impl Shared {
    fn now_nanos(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A member's session: expires unless heartbeats keep moving its deadline.
pub struct Session {
    member: u32,
    shared: Arc<Shared>,
}

impl DelayedOperation for Session {
    fn timeout(&self) -> Duration {
        self.shared.config.session_timeout
    }

    fn try_complete(&mut self) -> bool {
        false
    }

    fn on_complete(&mut self, how: Completion) {
        if how == Completion::Expired {
            let deadline = self.shared.deadlines[self.member as usize].load(Ordering::Relaxed);
            let late = self.shared.now_nanos().saturating_sub(deadline);
            self.shared.record.expired(Duration::from_nanos(late));
        }
    }
}

/// A join waiting at its group's barrier.
pub struct JoinWait {
    group: u32,
    shared: Arc<Shared>,
    reply: Reply<()>,
}

impl DelayedOperation for JoinWait {
    fn timeout(&self) -> Duration {
        self.shared.config.rebalance_timeout
    }

    fn try_complete(&mut self) -> bool {
        let joined = self.shared.group_joins[self.group as usize].load(Ordering::Acquire);
        joined >= self.shared.config.group_members(self.group)
    }

    fn on_complete(&mut self, how: Completion) {
        self.reply.send(how, ());
    }
}

/// The coordinator on the purgatory.
pub struct OnPurgatory {
    shared: Arc<Shared>,
    sessions: Purgatory<u32, Session>,
    joins: Purgatory<u32, JoinWait>,
}

impl OnPurgatory {
    /// Both purgatories, on one timer, built in the current tokio runtime (their
    /// callbacks run in its context; the joins' answers are awaited on it).
    ///
    /// # Panics
    /// If the operating system cannot spawn the timer's reaper thread.
    pub fn new(config: Config) -> Self {
        let members = config.members as usize;
        let shared = Arc::new(Shared {
            config,
            epoch: Instant::now(),
            deadlines: (0..members).map(|_| AtomicU64::new(0)).collect(),
            handles: (0..members).map(|_| OnceLock::new()).collect(),
            joined: (0..members).map(|_| AtomicBool::new(false)).collect(),
            group_joins: (0..config.groups()).map(|_| AtomicU32::new(0)).collect(),
            record: Record::default(),
        });
        let timer = TimerGroup::new("coordinator");
        let build = "a new timer group takes two purgatories";
        OnPurgatory {
            shared,
            sessions: Purgatory::builder()
                .name("sessions")
                .build_on(&timer)
                .expect(build),
            joins: Purgatory::builder()
                .name("joins")
                .build_on(&timer)
                .expect(build),
        }
    }

    /// Starts `member`'s session: watched keyless, its deadline `session_timeout` away.
    fn start_session(sessions: &Purgatory<u32, Session>, shared: &Arc<Shared>, member: u32) -> u8 {
        let deadline = shared.now_nanos() + nanos(shared.config.session_timeout);
        shared.deadlines[member as usize].store(deadline, Ordering::Relaxed);
        let session = Session {
            member,
            shared: Arc::clone(shared),
        };
        match sessions.watch_keyless(session) {
            Ok(WatchOutcome::Pending(handle)) => {
                // The only set: `join` lets each member through once.
                let _ = shared.handles[member as usize].set(handle);
                NONE
            }
            // Never ready; refused only after shutdown.
            Ok(WatchOutcome::Completed) | Err(_) => REBALANCE_IN_PROGRESS,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Coordinator for OnPurgatory {
    fn join(&self, member: u32) -> BoxFuture<u8> {
        let shared = Arc::clone(&self.shared);
        if member >= shared.config.members {
            return Box::pin(async { UNKNOWN_MEMBER_ID });
        }
        if shared.joined[member as usize].swap(true, Ordering::AcqRel) {
            return Box::pin(async { REBALANCE_IN_PROGRESS });
        }
        let group = member / shared.config.group_size;
        let count = shared.group_joins[group as usize].fetch_add(1, Ordering::AcqRel) + 1;
        let parked = self.joins.park_with([group], |reply| JoinWait {
            group,
            shared: Arc::clone(&shared),
            reply,
        });
        if count == shared.config.group_members(group) {
            self.joins.check_and_complete(&group);
        }
        let sessions = self.sessions.clone();
        Box::pin(async move {
            let Ok(parked) = parked else {
                return REBALANCE_IN_PROGRESS;
            };
            match parked.await {
                Ok(answered) if answered.how == Completion::Ready => {
                    OnPurgatory::start_session(&sessions, &shared, member)
                }
                _ => REBALANCE_IN_PROGRESS,
            }
        })
    }

    fn heartbeat(&self, member: u32) -> u8 {
        let shared = &self.shared;
        let Some(slot) = shared.handles.get(member as usize) else {
            shared.record.unknown();
            return UNKNOWN_MEMBER_ID;
        };
        let Some(handle) = slot.get() else {
            shared.record.unknown();
            return UNKNOWN_MEMBER_ID;
        };
        let timeout = shared.config.session_timeout;
        let deadline = shared.now_nanos() + nanos(timeout);
        if self.sessions.reset_timeout(handle, timeout) {
            shared.deadlines[member as usize].store(deadline, Ordering::Relaxed);
            NONE
        } else {
            shared.record.unknown();
            UNKNOWN_MEMBER_ID
        }
    }

    fn stats(&self) -> Stats {
        self.shared.record.stats()
    }

    fn shutdown(&self) -> BoxFuture<()> {
        // The group's shutdown: both purgatories' waiting operations are answered.
        let joins = self.joins.clone();
        Box::pin(async move { joins.shutdown_async().await })
    }
}
