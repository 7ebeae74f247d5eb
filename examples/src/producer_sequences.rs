//! Duplicate detection for idempotent producers (what makes a retried batch harmless),
//! with the state of each producer bounded in count and expired in time.
//!
//! For each producer id the last [`REMEMBERED_BATCHES`] appended batches are remembered with
//! their sequence range and log offsets, as Kafka does. A batch whose producer id, epoch,
//! first and last sequence match a remembered one is a retry: it is not appended again and
//! the original offsets are answered. Producers that are not idempotent (id -1) are not
//! tracked.
//!
//! Invariants:
//! - At most `max_producers` producers are remembered: remembering one more forgets the
//!   one whose last append is the oldest. A broker gives each of its `P` partitions
//!   [`max_producers_per_partition`]`(P)`: [`MAX_PRODUCER_STATES`] shared out, at least
//!   [`MIN_PRODUCERS_PER_PARTITION`] and at most [`MAX_PRODUCERS_PER_PARTITION`] (65,536,
//!   the broker's cap on live producer ids) each. So a broker remembers at most
//!   `max(262,144, 8 x P)` producers, at about 300 bytes each (75 MiB; 240 MiB at the
//!   100,000 partitions a broker may have), however many ids clients use.
//! - A producer whose last append is `expiration` old or more is forgotten (Kafka's
//!   `producer.id.expiration.ms`); expiry runs at each append, oldest first, so it costs
//!   one step per producer forgotten. A partition that receives no append keeps its state
//!   (bounded by the count above) until the next one.
//! - A forgotten (or never seen) producer may start again only at sequence 0: a batch of
//!   an unknown producer whose first sequence is not 0 is refused
//!   ([`ProducerSequences::refuses`]), which the broker answers with
//!   OUT_OF_ORDER_SEQUENCE_NUMBER, as Kafka does since 2.5 (KIP-360; older brokers answered
//!   UNKNOWN_PRODUCER_ID). Otherwise sequences are not checked: out-of-order sequences of
//!   a known producer are appended (this demo broker's limitation).
//!
//! | producer state | a batch with sequence 0 | a batch with another sequence |
//! |---|---|---|
//! | unknown (never seen, expired, or evicted) | appended, remembered | refused |
//! | known, same epoch, matches a remembered batch | answered with its offsets | answered with its offsets |
//! | known, otherwise | appended, remembered | appended, remembered |

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How many recent batches are remembered per producer (Kafka's in-flight limit).
pub const REMEMBERED_BATCHES: usize = 5;

/// How many producers one partition remembers at most.
pub const MAX_PRODUCERS_PER_PARTITION: usize = 1 << 16;

/// How many producers one partition may remember however many partitions share
/// [`MAX_PRODUCER_STATES`].
pub const MIN_PRODUCERS_PER_PARTITION: usize = 8;

/// How many producers a broker's partitions remember together (unless
/// [`MIN_PRODUCERS_PER_PARTITION`] each is more).
pub const MAX_PRODUCER_STATES: usize = 1 << 18;

/// The cap on remembered producers of each of `partitions` partitions.
pub fn max_producers_per_partition(partitions: usize) -> usize {
    (MAX_PRODUCER_STATES / partitions.max(1))
        .clamp(MIN_PRODUCERS_PER_PARTITION, MAX_PRODUCERS_PER_PARTITION)
}

/// How long a producer is remembered after its last append by default: one day, Kafka's
/// `producer.id.expiration.ms` default.
pub const DEFAULT_PRODUCER_EXPIRATION: Duration = Duration::from_secs(24 * 60 * 60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RememberedBatch {
    epoch: i16,
    first_sequence: i32,
    last_sequence: i32,
    base_offset: i64,
    end_offset: i64,
}

/// One remembered producer.
#[derive(Debug)]
struct Producer {
    batches: VecDeque<RememberedBatch>,
    /// Its key in `by_last_append`.
    stamp: u64,
    last_append: Instant,
}

/// Recent batches of the idempotent producers of one partition.
#[derive(Debug)]
pub struct ProducerSequences {
    producers: HashMap<i64, Producer>,
    /// Producer ids by the stamp of their last append, oldest first.
    by_last_append: BTreeMap<u64, i64>,
    next_stamp: u64,
    max_producers: usize,
    expiration: Duration,
}

impl Default for ProducerSequences {
    fn default() -> Self {
        Self::with_limits(MAX_PRODUCERS_PER_PARTITION, DEFAULT_PRODUCER_EXPIRATION)
    }
}

/// Identity of a batch for duplicate detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSequence {
    /// Producer id (-1: not idempotent).
    pub producer_id: i64,
    /// Producer epoch.
    pub epoch: i16,
    /// Sequence of the batch's first record.
    pub first_sequence: i32,
    /// Number of records (offsets) in the batch.
    pub count: i64,
}

impl BatchSequence {
    fn last_sequence(&self) -> i32 {
        // Sequences wrap around at i32::MAX, as in Kafka.
        ((i64::from(self.first_sequence) + self.count - 1) % (i64::from(i32::MAX) + 1)) as i32
    }

    fn tracked(&self) -> bool {
        self.producer_id >= 0 && self.first_sequence >= 0
    }
}

impl ProducerSequences {
    /// Remembers at most `max_producers` (at least 1) producers, each for `expiration`
    /// after its last append.
    pub fn with_limits(max_producers: usize, expiration: Duration) -> Self {
        Self {
            producers: HashMap::new(),
            by_last_append: BTreeMap::new(),
            next_stamp: 0,
            max_producers: max_producers.max(1),
            expiration,
        }
    }

    /// Offsets `(base, end)` of an already appended copy of `batch`, if it is a retry.
    pub fn duplicate_of(&self, batch: &BatchSequence) -> Option<(i64, i64)> {
        if !batch.tracked() {
            return None;
        }
        self.producers
            .get(&batch.producer_id)?
            .batches
            .iter()
            .find(|r| {
                r.epoch == batch.epoch
                    && r.first_sequence == batch.first_sequence
                    && r.last_sequence == batch.last_sequence()
            })
            .map(|r| (r.base_offset, r.end_offset))
    }

    /// Whether `batch` must be refused as out of sequence: its producer is not remembered
    /// (never seen, expired or evicted) and it does not start at sequence 0.
    pub fn refuses(&self, batch: &BatchSequence) -> bool {
        batch.tracked()
            && batch.first_sequence != 0
            && !self.producers.contains_key(&batch.producer_id)
    }

    /// Forgets the producers whose last append is `expiration` old or more at `now`.
    pub fn expire(&mut self, now: Instant) {
        while let Some((&stamp, &id)) = self.by_last_append.first_key_value() {
            let expired = self
                .producers
                .get(&id)
                .is_none_or(|p| now.saturating_duration_since(p.last_append) >= self.expiration);
            if !expired {
                break;
            }
            self.by_last_append.remove(&stamp);
            self.producers.remove(&id);
        }
    }

    /// Remembers a batch appended at `now`, forgetting the least recently appending
    /// producer if that makes one more than `max_producers`.
    pub fn appended(
        &mut self,
        batch: &BatchSequence,
        base_offset: i64,
        end_offset: i64,
        now: Instant,
    ) {
        if !batch.tracked() {
            return;
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let producer = self
            .producers
            .entry(batch.producer_id)
            .or_insert_with(|| Producer {
                batches: VecDeque::new(),
                stamp,
                last_append: now,
            });
        self.by_last_append.remove(&producer.stamp);
        producer.stamp = stamp;
        producer.last_append = now;
        self.by_last_append.insert(stamp, batch.producer_id);
        let recent = &mut producer.batches;
        if recent.front().is_some_and(|r| r.epoch != batch.epoch) {
            recent.clear();
        }
        if recent.len() == REMEMBERED_BATCHES {
            recent.pop_front();
        }
        recent.push_back(RememberedBatch {
            epoch: batch.epoch,
            first_sequence: batch.first_sequence,
            last_sequence: batch.last_sequence(),
            base_offset,
            end_offset,
        });
        if self.producers.len() > self.max_producers {
            if let Some((_, oldest)) = self.by_last_append.pop_first() {
                self.producers.remove(&oldest);
            }
        }
    }

    /// How many producers are remembered.
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Whether no producer is remembered.
    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Instant {
        Instant::now()
    }

    fn seq(producer_id: i64, first_sequence: i32, count: i64) -> BatchSequence {
        BatchSequence {
            producer_id,
            epoch: 0,
            first_sequence,
            count,
        }
    }

    #[test]
    fn a_retried_batch_is_recognised_with_its_original_offsets() {
        let mut state = ProducerSequences::default();
        state.appended(&seq(7, 0, 10), 100, 110, now());
        assert_eq!(state.duplicate_of(&seq(7, 0, 10)), Some((100, 110)));
        assert_eq!(state.duplicate_of(&seq(7, 10, 10)), None);
        assert_eq!(state.duplicate_of(&seq(8, 0, 10)), None);
    }

    #[test]
    fn only_the_last_batches_are_remembered() {
        let mut state = ProducerSequences::default();
        for i in 0..(REMEMBERED_BATCHES as i32 + 1) {
            state.appended(
                &seq(1, i * 2, 2),
                i64::from(i) * 2,
                i64::from(i) * 2 + 2,
                now(),
            );
        }
        assert_eq!(state.duplicate_of(&seq(1, 0, 2)), None);
        assert_eq!(state.duplicate_of(&seq(1, 2, 2)), Some((2, 4)));
    }

    #[test]
    fn producers_that_are_not_idempotent_are_never_duplicates() {
        let mut state = ProducerSequences::default();
        state.appended(&seq(-1, -1, 1), 0, 1, now());
        assert_eq!(state.duplicate_of(&seq(-1, -1, 1)), None);
    }

    #[test]
    fn a_new_epoch_forgets_the_old_batches() {
        let mut state = ProducerSequences::default();
        state.appended(&seq(3, 0, 1), 0, 1, now());
        let mut bumped = seq(3, 0, 1);
        bumped.epoch = 1;
        assert_eq!(state.duplicate_of(&bumped), None);
        state.appended(&bumped, 1, 2, now());
        assert_eq!(state.duplicate_of(&seq(3, 0, 1)), None);
        assert_eq!(state.duplicate_of(&bumped), Some((1, 2)));
    }

    #[test]
    fn the_least_recently_appending_producer_is_forgotten_at_the_cap() {
        let mut state = ProducerSequences::with_limits(3, DEFAULT_PRODUCER_EXPIRATION);
        let at = Instant::now();
        for id in 1..=3 {
            state.appended(&seq(id, 0, 1), id, id + 1, at);
        }
        // Producer 1 appends again: 2 is now the least recent.
        state.appended(&seq(1, 1, 1), 4, 5, at);
        state.appended(&seq(4, 0, 1), 5, 6, at);
        assert_eq!(state.len(), 3);
        assert_eq!(state.duplicate_of(&seq(2, 0, 1)), None);
        assert!(state.refuses(&seq(2, 1, 1)));
        assert_eq!(state.duplicate_of(&seq(1, 1, 1)), Some((4, 5)));
        for id in 5..10_000 {
            state.appended(&seq(id, 0, 1), id, id + 1, at);
        }
        assert_eq!(state.len(), 3);
        assert_eq!(state.by_last_append.len(), 3);
    }

    #[test]
    fn partitions_share_the_broker_wide_count() {
        assert_eq!(max_producers_per_partition(1), MAX_PRODUCERS_PER_PARTITION);
        assert_eq!(max_producers_per_partition(4), MAX_PRODUCERS_PER_PARTITION);
        assert_eq!(max_producers_per_partition(64), 4096);
        assert_eq!(
            max_producers_per_partition(100_000),
            MIN_PRODUCERS_PER_PARTITION
        );
        for partitions in [1, 3, 100, 5_000, 32_768, 100_000] {
            let total = partitions * max_producers_per_partition(partitions);
            assert!(total <= MAX_PRODUCER_STATES.max(MIN_PRODUCERS_PER_PARTITION * partitions));
        }
    }

    #[test]
    fn a_producer_expires_after_its_last_append_and_restarts_only_at_zero() {
        let expiration = Duration::from_secs(60);
        let mut state = ProducerSequences::with_limits(10, expiration);
        let start = Instant::now();
        state.appended(&seq(1, 0, 1), 0, 1, start);
        state.appended(&seq(2, 0, 1), 1, 2, start + Duration::from_secs(30));
        assert!(!state.refuses(&seq(1, 1, 1)));
        state.expire(start + expiration);
        assert_eq!(state.len(), 1);
        assert!(state.refuses(&seq(1, 1, 1)));
        assert!(!state.refuses(&seq(1, 0, 1)));
        assert!(!state.refuses(&seq(2, 1, 1)));
        assert!(
            !state.refuses(&seq(-1, 5, 1)),
            "not idempotent: never refused"
        );
        state.expire(start + Duration::from_secs(200));
        assert!(state.is_empty() && state.by_last_append.is_empty());
    }
}
