//! One partition as the leader sees it: its log, its replicas' progress, its producers.
//!
//! Invariants:
//! - All mutable state sits behind one mutex; `high_watermark` and `committed_position`
//!   mirror it in atomics, written only while the mutex is held and only upwards, so delayed
//!   operations can check their condition without taking the lock.
//! - The high watermark is always a batch boundary (followers copy whole batches), so
//!   `committed_position` is exactly the number of bytes below the high watermark.
//! - No method calls out (no purgatory, no callback) while holding the lock: callers fire
//!   `check_and_complete` after these methods return, never from inside them.
//! - The log end offset never passes `i64::MAX`: an append whose batches' offsets (retries
//!   included, to decide before appending any) would take it there is refused whole.
//! - Idempotent producers' state is bounded and expires (`producer_sequences.rs`): an
//!   append first forgets the producers expired at its time, and one whose batch names a
//!   producer not remembered at a sequence other than 0 is refused whole
//!   ([`AppendError::OutOfOrderSequence`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::partition_log::PartitionLog;
use crate::producer_sequences::{
    BatchSequence, ProducerSequences, DEFAULT_PRODUCER_EXPIRATION, MAX_PRODUCERS_PER_PARTITION,
};
use crate::record_batch::ProducedBatch;
use crate::replication::ReplicaProgress;

/// The purgatory key of a partition: its index in the broker's partition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey(pub u32);

impl PartitionKey {
    /// Each key of `keys` once, in key order: what an operation waiting on several
    /// partitions is watched on.
    pub fn distinct(keys: impl IntoIterator<Item = PartitionKey>) -> Vec<PartitionKey> {
        let mut keys: Vec<PartitionKey> = keys.into_iter().collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

/// The leader epoch this broker stamps into batches (it is always the leader).
pub const LEADER_EPOCH: i32 = 0;

#[derive(Debug)]
struct PartitionState {
    log: PartitionLog,
    replicas: ReplicaProgress,
    producers: ProducerSequences,
}

/// Why an append was refused (nothing of it was appended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendError {
    /// The log end offset would pass `i64::MAX`.
    OffsetSpaceExhausted,
    /// A batch names an idempotent producer this partition does not remember (never seen,
    /// or expired) at a sequence other than 0.
    OutOfOrderSequence,
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Offset of the first record of the request's records.
    pub base_offset: i64,
    /// Offset after the request's furthest record (a retry's original counts where it lies
    /// in the log): acks=all waits for the high watermark to reach it.
    pub end_offset: i64,
    /// The new log end offset (what followers will copy up to).
    pub log_end_offset: i64,
    /// Whether the high watermark moved (only without followers).
    pub high_watermark_advanced: bool,
}

/// Committed data read for a consumer.
#[derive(Debug, Clone)]
pub struct CommittedRead {
    /// Whole batches below the high watermark.
    pub records: Bytes,
    /// The high watermark when the data was read.
    pub high_watermark: i64,
    /// The log start offset when the data was read.
    pub log_start_offset: i64,
    /// What `records` keep alive however long they are kept (see
    /// [`PartitionLog::read_keeping`]): their segment, or themselves.
    pub keeps: usize,
}

/// A partition led by this broker.
#[derive(Debug)]
pub struct Partition {
    state: Mutex<PartitionState>,
    high_watermark: AtomicI64,
    committed_position: AtomicU64,
}

impl Partition {
    /// An empty partition with `followers` in-sync followers that keeps everything.
    pub fn new(followers: usize) -> Self {
        Self::with_retention(followers, u64::MAX)
    }

    /// An empty partition whose log keeps about `retention_bytes` of committed batches
    /// (see [`PartitionLog::apply_retention`]).
    pub fn with_retention(followers: usize, retention_bytes: u64) -> Self {
        Self::with_limits(
            followers,
            retention_bytes,
            MAX_PRODUCERS_PER_PARTITION,
            DEFAULT_PRODUCER_EXPIRATION,
        )
    }

    /// Like [`Partition::with_retention`], remembering at most `max_producers` idempotent
    /// producers, each until `producer_expiration` after its last append (Kafka's
    /// `producer.id.expiration.ms`).
    pub fn with_limits(
        followers: usize,
        retention_bytes: u64,
        max_producers: usize,
        producer_expiration: Duration,
    ) -> Self {
        Self {
            state: Mutex::new(PartitionState {
                log: PartitionLog::with_retention(retention_bytes),
                replicas: ReplicaProgress::new(followers),
                producers: ProducerSequences::with_limits(max_producers, producer_expiration),
            }),
            high_watermark: AtomicI64::new(0),
            committed_position: AtomicU64::new(0),
        }
    }

    /// Appends the batches of one produce request, skipping retried batches of idempotent
    /// producers (their original offsets are answered); all or nothing.
    pub fn append(&self, batches: Vec<ProducedBatch>) -> Result<Appended, AppendError> {
        let now = Instant::now();
        let mut state = self.state.lock();
        batches
            .iter()
            .try_fold(state.log.end_offset(), |end, b| {
                end.checked_add(b.offset_count)
            })
            .ok_or(AppendError::OffsetSpaceExhausted)?;
        state.producers.expire(now);
        // A producer not remembered may only start at sequence 0; a later batch of the same
        // request may continue what an earlier one starts.
        let sequence_of = |batch: &ProducedBatch| BatchSequence {
            producer_id: batch.producer_id,
            epoch: batch.producer_epoch,
            first_sequence: batch.base_sequence,
            count: batch.offset_count,
        };
        // One pass with the producers seen so far (a request may hold a million batches).
        let mut seen = HashSet::new();
        for batch in &batches {
            if state.producers.refuses(&sequence_of(batch)) && !seen.contains(&batch.producer_id) {
                return Err(AppendError::OutOfOrderSequence);
            }
            if batch.producer_id >= 0 {
                seen.insert(batch.producer_id);
            }
        }
        let mut base_offset = None;
        // The end of the furthest batch, new or a retry's original: a request whose last
        // batch retries an earlier one waits for its new batches too (issue #38, finding 8;
        // the last batch's end acknowledged them before they were replicated).
        let mut end_offset = None;
        for batch in batches {
            let sequence = sequence_of(&batch);
            let (base, end) = match state.producers.duplicate_of(&sequence) {
                Some(original) => original,
                None => {
                    let appended = state.log.append(batch, LEADER_EPOCH);
                    state.producers.appended(
                        &sequence,
                        appended.base_offset,
                        appended.end_offset,
                        now,
                    );
                    (appended.base_offset, appended.end_offset)
                }
            };
            base_offset.get_or_insert(base);
            end_offset = end_offset.max(Some(end));
        }
        let end_offset = end_offset.unwrap_or_else(|| state.log.end_offset());
        let log_end_offset = state.log.end_offset();
        state.replicas.leader_appended(log_end_offset);
        let high_watermark_advanced = self.publish_high_watermark(&mut state);
        Ok(Appended {
            base_offset: base_offset.unwrap_or(end_offset),
            end_offset,
            log_end_offset,
            high_watermark_advanced,
        })
    }

    /// Follower `follower` has copied everything below `offset`. Returns whether the high
    /// watermark moved.
    pub fn follower_reached(&self, follower: usize, offset: i64) -> bool {
        let mut state = self.state.lock();
        state.replicas.follower_reached(follower, offset);
        self.publish_high_watermark(&mut state)
    }

    /// Publishes a moved high watermark, then lets retention drop what lies below it.
    fn publish_high_watermark(&self, state: &mut PartitionState) -> bool {
        let high_watermark = state.replicas.high_watermark();
        if high_watermark <= self.high_watermark.load(Ordering::Relaxed) {
            return false;
        }
        state.log.apply_retention(high_watermark);
        let position = state.log.boundary_position(high_watermark);
        debug_assert!(position >= self.committed_position.load(Ordering::Relaxed));
        // Position first: a reader that sees the new high watermark sees its bytes too.
        self.committed_position.store(position, Ordering::Release);
        self.high_watermark.store(high_watermark, Ordering::Release);
        true
    }

    /// The high watermark: consumers see offsets below it; acks=all waits for it.
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark.load(Ordering::Acquire)
    }

    /// Bytes of the log below the high watermark.
    pub fn committed_position(&self) -> u64 {
        self.committed_position.load(Ordering::Acquire)
    }

    /// The leader's log end offset.
    pub fn log_end_offset(&self) -> i64 {
        self.state.lock().log.end_offset()
    }

    /// The first offset the log still holds (0 until retention drops a segment).
    pub fn log_start_offset(&self) -> i64 {
        self.state.lock().log.start_offset()
    }

    /// How many idempotent producers this partition remembers.
    pub fn producer_states(&self) -> usize {
        self.state.lock().producers.len()
    }

    /// Bytes the log holds, its batch index included (what retention keeps).
    pub fn log_bytes(&self) -> u64 {
        self.state.lock().log.held_bytes()
    }

    /// Byte position of the batch holding `offset` (see [`PartitionLog::position_of`]).
    pub fn position_of(&self, offset: i64) -> Option<u64> {
        self.state.lock().log.position_of(offset)
    }

    /// Committed batches from the one holding `from`, at most `max_bytes` (see
    /// [`PartitionLog::read`] for `at_least_one`).
    pub fn read_committed(&self, from: i64, max_bytes: usize, at_least_one: bool) -> CommittedRead {
        let state = self.state.lock();
        let high_watermark = state.replicas.high_watermark();
        let read = state
            .log
            .read_parts(from, high_watermark, max_bytes, at_least_one);
        let log_start_offset = state.log.start_offset();
        // Any copy the read needs is made once the lock is released: appends do not wait
        // for it.
        drop(state);
        let (records, keeps) = read.finish();
        CommittedRead {
            records,
            high_watermark,
            log_start_offset,
            keeps,
        }
    }

    /// First committed batch with a record at or after `timestamp_ms` (offset, timestamp).
    pub fn offset_for_timestamp(&self, timestamp_ms: i64) -> Option<(i64, i64)> {
        let state = self.state.lock();
        let high_watermark = state.replicas.high_watermark();
        state.log.offset_for_timestamp(timestamp_ms, high_watermark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record_batch::encode_batch;

    fn batch(records: usize) -> Vec<ProducedBatch> {
        let values: Vec<Bytes> = (0..records).map(|_| Bytes::from_static(b"abc")).collect();
        ProducedBatch::parse_all(&encode_batch(&values, 1)).unwrap()
    }

    #[test]
    fn without_followers_an_append_is_committed_at_once() {
        let partition = Partition::new(0);
        let appended = partition.append(batch(3)).unwrap();
        assert_eq!((appended.base_offset, appended.end_offset), (0, 3));
        assert!(appended.high_watermark_advanced);
        assert_eq!(partition.high_watermark(), 3);
        assert_eq!(
            partition.committed_position(),
            partition.position_of(3).unwrap()
        );
    }

    #[test]
    fn followers_move_the_high_watermark_and_reads_stop_below_it() {
        let partition = Partition::new(2);
        let first = partition.append(batch(2)).unwrap();
        partition.append(batch(2)).unwrap();
        assert!(!first.high_watermark_advanced);
        assert!(partition
            .read_committed(0, usize::MAX, true)
            .records
            .is_empty());
        assert!(!partition.follower_reached(0, 4));
        assert!(partition.follower_reached(1, 2));
        assert_eq!(partition.high_watermark(), 2);
        let read = partition.read_committed(0, usize::MAX, true);
        assert_eq!(read.high_watermark, 2);
        assert_eq!(read.records.len() as u64, partition.committed_position());
    }

    #[test]
    fn a_retried_idempotent_batch_is_not_appended_twice() {
        use kafka_protocol::records::{
            Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
        };
        let record = Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 42,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: 0,
            timestamp: 1,
            key: None,
            value: Some(Bytes::from_static(b"x")),
            headers: Default::default(),
        };
        let mut buf = bytes::BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut buf, [&record], &options).unwrap();
        let raw = buf.freeze();
        let partition = Partition::new(0);
        let first = partition
            .append(ProducedBatch::parse_all(&raw).unwrap())
            .unwrap();
        let retry = partition
            .append(ProducedBatch::parse_all(&raw).unwrap())
            .unwrap();
        assert_eq!((first.base_offset, first.end_offset), (0, 1));
        assert_eq!((retry.base_offset, retry.end_offset), (0, 1));
        assert_eq!(partition.log_end_offset(), 1);
    }

    /// Issue #38, finding 8: a request whose batches end with a retry of an earlier batch
    /// waits for its new batch. Before, its end was the retry's original end, so acks=all
    /// answered at once while the new batch was not yet replicated.
    #[test]
    fn a_request_ending_with_a_retry_ends_after_its_new_batches() {
        let partition = Partition::new(0);
        let idempotent = |sequence: i32| {
            let mut one = batch(1);
            one[0].producer_id = 9;
            one[0].base_sequence = sequence;
            one
        };
        assert_eq!(partition.append(idempotent(0)).unwrap().end_offset, 1);
        let appended = partition
            .append([idempotent(1), idempotent(0)].concat())
            .unwrap();
        assert_eq!(partition.log_end_offset(), 2, "the retry appended nothing");
        assert_eq!(
            (appended.base_offset, appended.end_offset),
            (1, 2),
            "from the request's first batch to its furthest"
        );
    }

    #[test]
    fn an_unknown_producer_must_start_at_sequence_zero_even_within_one_request() {
        let partition = Partition::new(0);
        let mut first = batch(1);
        first[0].producer_id = 9;
        first[0].base_sequence = 0;
        let mut next = batch(1);
        next[0].producer_id = 9;
        next[0].base_sequence = 1;
        // Sequence 1 alone: unknown producer, refused; after 0 in the same request: taken.
        assert_eq!(
            partition.append(next.clone()),
            Err(AppendError::OutOfOrderSequence)
        );
        assert_eq!(partition.log_end_offset(), 0);
        let both = [first, next].concat();
        assert_eq!(partition.append(both).unwrap().end_offset, 2);
        assert_eq!(partition.producer_states(), 1);
    }

    #[test]
    fn an_append_past_the_last_offset_is_refused_whole() {
        let partition = Partition::new(0);
        partition.append(batch(1)).unwrap();
        let mut huge = batch(1);
        // A count that fills the offset space (record_batch.rs refuses such batches first;
        // this is the partition's own guard).
        huge[0].offset_count = i64::MAX;
        let both = [batch(1), huge].concat();
        assert_eq!(
            partition.append(both),
            Err(AppendError::OffsetSpaceExhausted)
        );
        assert_eq!(partition.log_end_offset(), 1);
        assert_eq!(partition.append(batch(2)).unwrap().end_offset, 3);
    }
}
