//! Duplicate detection for idempotent producers (what makes a retried batch harmless).
//!
//! For each producer id the last [`REMEMBERED_BATCHES`] appended batches are remembered with
//! their sequence range and log offsets, as Kafka does. A batch whose producer id, epoch,
//! first and last sequence match a remembered one is a retry: it is not appended again and
//! the original offsets are answered. Anything else is appended (this demo broker does not
//! refuse out-of-order sequences). Producers that are not idempotent (id -1) are not tracked.

use std::collections::{HashMap, VecDeque};

/// How many recent batches are remembered per producer (Kafka's in-flight limit).
pub const REMEMBERED_BATCHES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RememberedBatch {
    epoch: i16,
    first_sequence: i32,
    last_sequence: i32,
    base_offset: i64,
    end_offset: i64,
}

/// Recent batches of every idempotent producer of one partition.
#[derive(Debug, Default)]
pub struct ProducerSequences {
    recent: HashMap<i64, VecDeque<RememberedBatch>>,
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
    /// Offsets `(base, end)` of an already appended copy of `batch`, if it is a retry.
    pub fn duplicate_of(&self, batch: &BatchSequence) -> Option<(i64, i64)> {
        if !batch.tracked() {
            return None;
        }
        self.recent
            .get(&batch.producer_id)?
            .iter()
            .find(|r| {
                r.epoch == batch.epoch
                    && r.first_sequence == batch.first_sequence
                    && r.last_sequence == batch.last_sequence()
            })
            .map(|r| (r.base_offset, r.end_offset))
    }

    /// Remembers an appended batch.
    pub fn appended(&mut self, batch: &BatchSequence, base_offset: i64, end_offset: i64) {
        if !batch.tracked() {
            return;
        }
        let recent = self.recent.entry(batch.producer_id).or_default();
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        state.appended(&seq(7, 0, 10), 100, 110);
        assert_eq!(state.duplicate_of(&seq(7, 0, 10)), Some((100, 110)));
        assert_eq!(state.duplicate_of(&seq(7, 10, 10)), None);
        assert_eq!(state.duplicate_of(&seq(8, 0, 10)), None);
    }

    #[test]
    fn only_the_last_batches_are_remembered() {
        let mut state = ProducerSequences::default();
        for i in 0..(REMEMBERED_BATCHES as i32 + 1) {
            state.appended(&seq(1, i * 2, 2), i64::from(i) * 2, i64::from(i) * 2 + 2);
        }
        assert_eq!(state.duplicate_of(&seq(1, 0, 2)), None);
        assert_eq!(state.duplicate_of(&seq(1, 2, 2)), Some((2, 4)));
    }

    #[test]
    fn producers_that_are_not_idempotent_are_never_duplicates() {
        let mut state = ProducerSequences::default();
        state.appended(&seq(-1, -1, 1), 0, 1);
        assert_eq!(state.duplicate_of(&seq(-1, -1, 1)), None);
    }

    #[test]
    fn a_new_epoch_forgets_the_old_batches() {
        let mut state = ProducerSequences::default();
        state.appended(&seq(3, 0, 1), 0, 1);
        let mut bumped = seq(3, 0, 1);
        bumped.epoch = 1;
        assert_eq!(state.duplicate_of(&bumped), None);
        state.appended(&bumped, 1, 2);
        assert_eq!(state.duplicate_of(&seq(3, 0, 1)), None);
        assert_eq!(state.duplicate_of(&bumped), Some((1, 2)));
    }
}
