//! The leader side of replication with the purgatory in the request path: partitions,
//! simulated followers, and the two purgatories (acks=all produces, long-poll fetches).
//!
//! This is what the broker and both small examples share; it knows nothing of the wire
//! protocol.
//!
//! Event flow (and the one locking rule it follows: `check_and_complete` is only called
//! after the partition's lock has been released, since the operations' `try_complete`
//! read the partitions):
//! - append: the partition appends under its lock; then the followers are told; then, if the
//!   high watermark moved (no followers), both purgatories are checked for that partition.
//! - follower advance (on the follower's thread, one report for every notice due, see
//!   `followers.rs`): the partition records it under its lock; then the produce purgatory is
//!   checked for that partition, and, if the high watermark moved, the fetch purgatory too.
//! - every check goes through [`CheckRounds`] (one per purgatory): an event that finds a
//!   check of its partition running asks for one more round instead of running its own, so
//!   a flood of appends or follower reports costs one check per round of events, not one
//!   per event, however many operations are parked on the partition.
//! - a produce or fetch that cannot be answered yet is handed to its purgatory with
//!   `Purgatory::park_with`; its answer arrives through the operation's `Reply`, from
//!   whichever thread completed it (an event, the reaper on timeout, or this call). The
//!   caller holds the [`Parked`] future: dropping it unanswered (the client left) cancels
//!   the operation.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use purgatory::{
    Completion, DelayedOperation, Parked, Purgatory, PurgatoryStats, Reply, WatchErrorKind,
};

use crate::check_rounds::CheckRounds;
use crate::delayed_fetch::{
    checking_partition, with_no_partition_named, BytesWait, DelayedFetch, FetchCompletion,
};
use crate::delayed_produce::{DelayedProduce, ProduceCompletion, ReplicaWait};
use crate::followers::{FollowerConfig, FollowerListener, FollowerSet};
use crate::partition::{AppendError, Appended, Partition, PartitionKey};
use crate::record_batch::ProducedBatch;

/// Why [`Leader::append`] appended nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendRefused {
    /// No partition has that key.
    UnknownPartition,
    /// The batches would take the log end offset past `i64::MAX`.
    OffsetSpaceExhausted,
    /// A batch names a producer the partition does not remember at a sequence other than 0.
    OutOfOrderSequence,
}

type ProducePurgatory = Purgatory<PartitionKey, DelayedProduce>;
type FetchPurgatory = Purgatory<PartitionKey, DelayedFetch>;

/// The answer of an acks=all produce handed to the purgatory.
pub type ProduceAnswer = Parked<PartitionKey, DelayedProduce, ProduceCompletion>;
/// The answer of a long-poll fetch handed to the purgatory.
pub type FetchAnswer = Parked<PartitionKey, DelayedFetch, FetchCompletion>;

/// Hands the operation `make` builds around its reply to `purgatory`, watched on `keys`;
/// dropping the result unanswered cancels the operation.
fn park<O: DelayedOperation, T>(
    purgatory: &Purgatory<PartitionKey, O>,
    keys: Vec<PartitionKey>,
    make: impl FnOnce(Reply<T>) -> O,
) -> Parked<PartitionKey, O, T> {
    match purgatory.park_with(keys, make) {
        Ok(parked) => parked,
        Err(refused) => {
            // Shut down (or nothing to wait on): answered here with the state as it is,
            // through the same future.
            let how = match refused.kind() {
                WatchErrorKind::Shutdown => Completion::Shutdown,
                _ => Completion::Expired,
            };
            refused.answer_as(how)
        }
    }
}

/// The two purgatories of a leader.
struct Purgatories {
    produce: ProducePurgatory,
    fetch: FetchPurgatory,
}

/// Fires the purgatories when replicas make progress.
struct CommitEvents {
    partitions: Arc<[Arc<Partition>]>,
    produce_checks: CheckRounds,
    fetch_checks: CheckRounds,
}

impl CommitEvents {
    fn high_watermark_moved(&self, key: PartitionKey) {
        self.produce_checks.request(key.0 as usize);
        self.fetch_checks.request(key.0 as usize);
    }

    /// Stops the checker threads; later events check nothing.
    fn stop_checks(&self) {
        self.produce_checks.stop();
        self.fetch_checks.stop();
    }
}

impl FollowerListener for CommitEvents {
    fn follower_reached(&self, key: PartitionKey, follower: usize, offset: i64) {
        let Some(partition) = self.partitions.get(key.0 as usize) else {
            return;
        };
        let moved = partition.follower_reached(follower, offset);
        // Every follower advance may complete an acks=all produce (the spec's event);
        // fetches only care about the high watermark.
        self.produce_checks.request(key.0 as usize);
        if moved {
            self.fetch_checks.request(key.0 as usize);
        }
    }
}

/// Purgatory counters of a leader.
#[derive(Debug, Clone, Copy)]
pub struct LeaderStats {
    /// The acks=all produce purgatory.
    pub produce: PurgatoryStats,
    /// The long-poll fetch purgatory.
    pub fetch: PurgatoryStats,
}

/// Partitions led here, their simulated followers, and the purgatories.
pub struct Leader {
    events: Arc<CommitEvents>,
    purgatories: Arc<Purgatories>,
    followers: Mutex<FollowerSet>,
}

impl Leader {
    /// Starts a leader of `partitions` empty partitions with `followers` simulated followers.
    pub fn start(partitions: usize, followers: FollowerConfig) -> Leader {
        Self::start_with_retention(partitions, followers, u64::MAX)
    }

    /// Like [`Leader::start`], each partition keeping about `retention_bytes` (see
    /// [`PartitionLog`](crate::partition_log::PartitionLog)).
    pub fn start_with_retention(
        partitions: usize,
        followers: FollowerConfig,
        retention_bytes: u64,
    ) -> Leader {
        let expiration = crate::producer_sequences::DEFAULT_PRODUCER_EXPIRATION;
        Self::start_with_limits(partitions, followers, retention_bytes, expiration)
    }

    /// Like [`Leader::start_with_retention`], each partition forgetting an idempotent
    /// producer `producer_expiration` after its last append there, and remembering at most
    /// [`max_producers_per_partition`](crate::producer_sequences::max_producers_per_partition).
    pub fn start_with_limits(
        partitions: usize,
        followers: FollowerConfig,
        retention_bytes: u64,
        producer_expiration: std::time::Duration,
    ) -> Leader {
        let in_sync = followers.count;
        let max_producers = crate::producer_sequences::max_producers_per_partition(partitions);
        let partitions: Arc<[Arc<Partition>]> = (0..partitions)
            .map(|_| {
                Arc::new(Partition::with_limits(
                    in_sync,
                    retention_bytes,
                    max_producers,
                    producer_expiration,
                ))
            })
            .collect();
        let purgatories = Arc::new(Purgatories {
            produce: Purgatory::new("produce"),
            fetch: Purgatory::new("fetch"),
        });
        let keys = partitions.len();
        let produce = Arc::clone(&purgatories);
        let fetch = Arc::clone(&purgatories);
        let events = Arc::new(CommitEvents {
            partitions,
            produce_checks: CheckRounds::start(
                "produce-checks",
                keys,
                Box::new(move |key| {
                    produce
                        .produce
                        .check_and_complete(&PartitionKey(key as u32));
                }),
            ),
            fetch_checks: CheckRounds::start(
                "fetch-checks",
                keys,
                Box::new(move |key| {
                    // Named to the fetches it tries: each re-reads this partition only.
                    let key = PartitionKey(key as u32);
                    checking_partition(key, || fetch.fetch.check_and_complete(&key));
                }),
            ),
        });
        let listener: Arc<dyn FollowerListener> = events.clone();
        let followers = Mutex::new(FollowerSet::start(followers, listener));
        Leader {
            events,
            purgatories,
            followers,
        }
    }

    /// Number of partitions.
    pub fn partition_count(&self) -> usize {
        self.events.partitions.len()
    }

    /// The partition with key `key`.
    pub fn partition(&self, key: PartitionKey) -> Option<&Arc<Partition>> {
        self.events.partitions.get(key.0 as usize)
    }

    /// Appends a produce request's batches to partition `key` and tells the followers.
    /// Refused whole for an unknown partition or when the batches would take the log end
    /// offset past `i64::MAX`.
    pub fn append(
        &self,
        key: PartitionKey,
        batches: Vec<ProducedBatch>,
    ) -> Result<Appended, AppendRefused> {
        let appended = self
            .partition(key)
            .ok_or(AppendRefused::UnknownPartition)?
            .append(batches)
            .map_err(|e| match e {
                AppendError::OffsetSpaceExhausted => AppendRefused::OffsetSpaceExhausted,
                AppendError::OutOfOrderSequence => AppendRefused::OutOfOrderSequence,
            })?;
        self.followers
            .lock()
            .leader_appended(key, appended.log_end_offset);
        if appended.high_watermark_advanced {
            self.events.high_watermark_moved(key);
        }
        Ok(appended)
    }

    /// Waits (up to `timeout`) until every partition of `waits` has its required offset on
    /// every in-sync replica. The answer comes through the returned [`ProduceAnswer`];
    /// dropping it unanswered cancels the wait (the records stay appended).
    pub fn wait_for_replicas(&self, timeout: Duration, waits: Vec<ReplicaWait>) -> ProduceAnswer {
        let keys = PartitionKey::distinct(waits.iter().map(|w| w.key));
        park(&self.purgatories.produce, keys, |reply| {
            DelayedProduce::new(timeout, waits, reply)
        })
    }

    /// Waits (up to `max_wait`) until `min_bytes` of committed data lie past the fetch
    /// positions of `waits`. The answer comes through the returned [`FetchAnswer`];
    /// dropping it unanswered cancels the wait.
    pub fn wait_for_bytes(
        &self,
        max_wait: Duration,
        min_bytes: u64,
        waits: Vec<BytesWait>,
    ) -> FetchAnswer {
        let keys = PartitionKey::distinct(waits.iter().map(|w| w.key));
        // The park's own tries count every partition, even if called from inside a check.
        with_no_partition_named(|| {
            park(&self.purgatories.fetch, keys, |reply| {
                DelayedFetch::new(max_wait, min_bytes, waits, reply)
            })
        })
    }

    /// Counters of both purgatories.
    pub fn stats(&self) -> LeaderStats {
        LeaderStats {
            produce: self.purgatories.produce.stats(),
            fetch: self.purgatories.fetch.stats(),
        }
    }

    /// Stops the followers and the checks, then shuts both purgatories down (every
    /// waiting request is answered as expired). Idempotent.
    pub fn shutdown(&self) {
        self.stop_followers();
        self.purgatories.produce.shutdown();
        self.purgatories.fetch.shutdown();
    }

    /// Stops the follower threads, then the checker threads (joins them: it blocks, for
    /// one report or one check at most, whatever the followers still had to copy, and for
    /// the checks an append runs inline on its own thread). Idempotent.
    pub fn stop_followers(&self) {
        self.followers.lock().shutdown();
        self.events.stop_checks();
    }

    /// Shuts both purgatories down without blocking the task's thread (their
    /// `shutdown_async`): every waiting request is answered as expired when this returns.
    /// Idempotent.
    pub async fn shutdown_purgatories(&self) {
        self.purgatories.produce.shutdown_async().await;
        self.purgatories.fetch.shutdown_async().await;
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record_batch::encode_batch;
    use bytes::Bytes;
    use std::time::Instant;

    fn one_batch(records: usize) -> Vec<ProducedBatch> {
        let values: Vec<Bytes> = (0..records).map(|_| Bytes::from_static(b"v")).collect();
        ProducedBatch::parse_all(&encode_batch(&values, 1)).unwrap()
    }

    fn followers(count: usize, lag_ms: u64, stalled: bool) -> FollowerConfig {
        FollowerConfig {
            count,
            lag: Duration::from_millis(lag_ms),
            stalled,
        }
    }

    #[test]
    fn acks_all_completes_once_the_followers_caught_up() {
        let leader = Leader::start(1, followers(2, 20, false));
        let key = PartitionKey(0);
        let appended = leader.append(key, one_batch(3)).unwrap();
        let started = Instant::now();
        let answer = leader.wait_for_replicas(
            Duration::from_secs(30),
            vec![ReplicaWait {
                key,
                partition: leader.partition(key).unwrap().clone(),
                required_offset: appended.end_offset,
            }],
        );
        let done = answer.blocking_answer().unwrap().answer;
        assert_eq!(done.how, Completion::Ready);
        assert_eq!(done.acknowledged, vec![true]);
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(leader.partition(key).unwrap().high_watermark(), 3);
    }

    #[test]
    fn acks_all_expires_when_followers_are_stalled() {
        let leader = Leader::start(1, followers(1, 0, true));
        let key = PartitionKey(0);
        let appended = leader.append(key, one_batch(1)).unwrap();
        let answer = leader.wait_for_replicas(
            Duration::from_millis(30),
            vec![ReplicaWait {
                key,
                partition: leader.partition(key).unwrap().clone(),
                required_offset: appended.end_offset,
            }],
        );
        let done = answer.blocking_answer().unwrap().answer;
        assert_eq!(done.how, Completion::Expired);
        assert_eq!(done.acknowledged, vec![false]);
    }

    /// Waits of every partition below `partitions`, from its start, with no byte limit.
    fn from_the_start(leader: &Leader, partitions: u32) -> Vec<BytesWait> {
        (0..partitions)
            .map(|k| BytesWait {
                key: PartitionKey(k),
                partition: leader.partition(PartitionKey(k)).unwrap().clone(),
                start_position: 0,
                max_bytes: u64::MAX,
            })
            .collect()
    }

    /// `wait`'s answer, polled every millisecond until `deadline`; `None` if none came.
    fn answered_within(
        wait: &mut crate::leader::FetchAnswer,
        deadline: Instant,
    ) -> Option<FetchCompletion> {
        loop {
            if let Some(answer) = wait.try_answer() {
                return Some(answer.unwrap().answer);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A check credits the partition it names: a fetch over two partitions, each holding
    /// half its `min_bytes`, is answered once the second is appended to (a check naming
    /// another partition than the one that moved would leave it waiting; the ledger below
    /// cannot see that, since a name the fetch does not wait on makes it recount).
    #[test]
    fn a_fetch_over_two_partitions_is_answered_when_the_second_brings_its_bytes() {
        let leader = Leader::start(2, followers(0, 0, false));
        let batch = encode_batch(&[Bytes::from_static(b"v")], 1).len() as u64;
        let waits = from_the_start(&leader, 2);
        let mut wait = leader.wait_for_bytes(Duration::from_secs(60), 2 * batch, waits);
        leader.append(PartitionKey(0), one_batch(1)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(wait.try_answer().is_none(), "answered with half its bytes");
        leader.append(PartitionKey(1), one_batch(1)).unwrap();
        let done = answered_within(&mut wait, Instant::now() + Duration::from_secs(5))
            .expect("its bytes are there, yet it waits");
        assert_eq!((done.how, done.available), (Completion::Ready, 2 * batch));
    }

    /// A fetch parked from inside a check of another partition (as an `on_complete` that
    /// parks again would be) counts the bytes already there on all its partitions.
    #[test]
    fn a_fetch_parked_inside_a_check_counts_every_partition() {
        let leader = Leader::start(2, followers(0, 0, false));
        leader.append(PartitionKey(1), one_batch(1)).unwrap();
        let waits = from_the_start(&leader, 2);
        let wait = checking_partition(PartitionKey(0), || {
            leader.wait_for_bytes(Duration::from_secs(2), 1, waits)
        });
        let done = wait.blocking_answer().unwrap().answer;
        assert_eq!(done.how, Completion::Ready);
    }

    /// A small xorshift generator: the tests' randomness, seeded per test.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Ledger of wide fetches (issue #38, finding 4: a check re-reads the partition it
    /// checks, not all of a fetch's): fetches over random sets of partitions (repeats
    /// included) with random `min_bytes`, appends to random partitions from two threads.
    /// Once the appends are done, every fetch whose partitions hold its `min_bytes` is
    /// answered `Ready` (no lost wake-up), and none was answered with fewer.
    #[test]
    fn ledger_wide_fetches_complete_once_their_bytes_are_there_whoever_appended() {
        const PARTITIONS: u32 = 16;
        for seed in 1..=8u64 {
            let leader = Arc::new(Leader::start(PARTITIONS as usize, followers(0, 0, false)));
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let batch = encode_batch(&[Bytes::from_static(b"v")], 1).len() as u64;
            let mut fetches = Vec::new();
            for _ in 0..200 {
                let spans = 1 + next(&mut rng) % 6;
                let waits: Vec<BytesWait> = (0..spans)
                    .map(|_| {
                        let key = PartitionKey((next(&mut rng) % PARTITIONS as u64) as u32);
                        let partition = leader.partition(key).unwrap().clone();
                        BytesWait {
                            key,
                            start_position: partition.committed_position(),
                            partition,
                            max_bytes: batch * (1 + next(&mut rng) % 4),
                        }
                    })
                    .collect();
                let min_bytes = 1 + next(&mut rng) % (batch * 12);
                let wait = leader.wait_for_bytes(Duration::from_secs(60), min_bytes, waits.clone());
                fetches.push((min_bytes, waits, wait));
            }
            let appenders: Vec<_> = (0..2u64)
                .map(|t| {
                    let leader = Arc::clone(&leader);
                    std::thread::spawn(move || {
                        let mut rng = (seed << 8 | t).wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
                        for _ in 0..300 {
                            let key = PartitionKey((next(&mut rng) % PARTITIONS as u64) as u32);
                            leader.append(key, one_batch(1)).unwrap();
                        }
                    })
                })
                .collect();
            for appender in appenders {
                appender.join().unwrap();
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            for (min_bytes, waits, mut wait) in fetches {
                let there: u64 = waits.iter().map(BytesWait::available).sum();
                if there >= min_bytes {
                    let done = answered_within(&mut wait, deadline).unwrap_or_else(|| {
                        panic!("seed {seed}: a fetch with its bytes there was not answered")
                    });
                    assert_eq!(done.how, Completion::Ready, "seed {seed}");
                    assert!(done.available >= min_bytes, "seed {seed}");
                } else {
                    assert!(wait.try_answer().is_none(), "seed {seed}: answered with {there} of {min_bytes} bytes");
                }
            }
            leader.shutdown();
        }
    }

    #[test]
    fn a_fetch_waits_for_an_append_and_shutdown_answers_the_rest() {
        let leader = Leader::start(1, followers(0, 0, false));
        let key = PartitionKey(0);
        let partition = leader.partition(key).unwrap().clone();
        let wait = BytesWait {
            key,
            partition: partition.clone(),
            start_position: 0,
            max_bytes: u64::MAX,
        };
        let mut first = leader.wait_for_bytes(Duration::from_secs(60), 1, vec![wait.clone()]);
        assert!(first.try_answer().is_none());
        leader.append(key, one_batch(1)).unwrap();
        let done = first.blocking_answer().unwrap().answer;
        assert_eq!(done.how, Completion::Ready);
        assert_eq!(done.available, partition.committed_position());

        let beyond = BytesWait {
            start_position: partition.committed_position(),
            ..wait
        };
        let second = leader.wait_for_bytes(Duration::from_secs(60), 1, vec![beyond]);
        leader.shutdown();
        assert_eq!(second.blocking_answer().unwrap().how, Completion::Shutdown);
        let fetch = leader.stats().fetch;
        assert_eq!((fetch.expired, fetch.expired_at_shutdown), (0, 1));
    }
}
