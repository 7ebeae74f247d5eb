//! A group coordinator's sessions (Kafka's `GroupCoordinator`: JoinGroup's barrier,
//! Heartbeat, a session timeout per member), twice: on the purgatory, and on a tokio-util
//! `DelayQueue` written as a careful tokio user writes it. Binary `coordinator`; the
//! server half is [`server`], the load that compares the two is [`load`].
//!
//! - [`on_purgatory`]: each member's session is a keyless operation
//!   (`Purgatory::watch_keyless`) whose deadline each heartbeat moves in place
//!   (`Purgatory::reset_timeout`, Kafka's `DelayedHeartbeat`); a join waits at its
//!   group's barrier as a parked operation on the group's key (`Purgatory::park_with`,
//!   completed by `check_and_complete` when the group is full).
//! - [`on_delay_queue`]: one task on the server's runtime owns a `DelayQueue` of the
//!   sessions; a heartbeat sends it the new deadline (`reset_at`) through a channel, and
//!   is answered at once from a per-member "alive" flag; a join waits on a oneshot that
//!   the group's last joiner fires, under `tokio::time::timeout`.
//!
//! Both answer the same frames ([`protocol`]) and record the same figures: how late each
//! expired session was answered after its deadline, and heartbeats refused for want of a
//! live session.

pub mod load;
pub mod on_delay_queue;
pub mod on_purgatory;
pub mod protocol;
pub mod server;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use self::protocol::Stats;

/// A boxed future, for the object-safe [`Coordinator`].
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What the server needs of a coordinator's sessions.
pub trait Coordinator: Send + Sync + 'static {
    /// Joins `member`'s group: resolves with the error code once every member of the
    /// group has joined (the member's session starts then) or the rebalance timeout
    /// passed.
    fn join(&self, member: u32) -> BoxFuture<u8>;
    /// A heartbeat: `NONE` with the session's deadline moved, or `UNKNOWN_MEMBER_ID`.
    fn heartbeat(&self, member: u32) -> u8;
    /// The figures so far.
    fn stats(&self) -> Stats;
    /// Stops the sessions' timers.
    fn shutdown(&self) -> BoxFuture<()>;
}

/// The shape of the coordinator's groups and its timeouts.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Members in all; member `m` is in group `m / group_size`.
    pub members: u32,
    /// Members per group.
    pub group_size: u32,
    /// A session expires this long after its last heartbeat (or its join).
    pub session_timeout: Duration,
    /// A join waits at most this long for the rest of its group.
    pub rebalance_timeout: Duration,
}

impl Config {
    /// How many groups.
    pub fn groups(&self) -> u32 {
        self.members.div_ceil(self.group_size)
    }

    /// Members of `group` (the last may be short).
    pub fn group_members(&self, group: u32) -> u32 {
        let start = group * self.group_size;
        self.group_size.min(self.members - start)
    }
}

/// The figures both versions record.
#[derive(Debug, Default)]
pub struct Record {
    expired: AtomicU64,
    unknown: AtomicU64,
    /// Microseconds after its deadline each expired session was answered.
    lateness_us: Mutex<Vec<u64>>,
}

impl Record {
    /// A session expired `late` after its deadline.
    pub fn expired(&self, late: Duration) {
        self.expired.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        self.lateness_us.lock().push(us);
    }

    /// A heartbeat found no live session.
    pub fn unknown(&self) {
        self.unknown.fetch_add(1, Ordering::Relaxed);
    }

    /// The figures so far.
    pub fn stats(&self) -> Stats {
        let mut late = self.lateness_us.lock().clone();
        late.sort_unstable();
        let p99 = if late.is_empty() {
            0
        } else {
            late[((late.len() * 99).div_ceil(100)).max(1) - 1]
        };
        Stats {
            expired: self.expired.load(Ordering::Relaxed),
            late_p99_us: p99,
            late_max_us: late.last().copied().unwrap_or(0),
            unknown: self.unknown.load(Ordering::Relaxed),
        }
    }
}
