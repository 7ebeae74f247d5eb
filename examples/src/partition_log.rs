//! The in-memory log of one partition: stamped record batches in offset order.
//!
//! Invariants:
//! - Batches are contiguous: each batch starts at the previous batch's end offset, the first
//!   at offset 0, and `end_offset` is the last batch's end (the log end offset, LEO).
//! - `position` of a batch is the number of bytes stored before it, so the bytes between two
//!   batch boundaries are a subtraction; `end_position` is the total size of the log.
//! - Batches are never modified or removed once appended (no retention: the demo broker lives
//!   for a test or a measurement).

use bytes::{Bytes, BytesMut};

use crate::record_batch::ProducedBatch;

#[derive(Debug)]
struct StoredBatch {
    base_offset: i64,
    end_offset: i64,
    position: u64,
    max_timestamp: i64,
    bytes: Bytes,
}

/// Offsets given to one appended batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendedBatch {
    /// Offset of the batch's first record.
    pub base_offset: i64,
    /// Offset after the batch's last record.
    pub end_offset: i64,
}

/// An append-only, in-memory partition log.
#[derive(Debug, Default)]
pub struct PartitionLog {
    batches: Vec<StoredBatch>,
    end_offset: i64,
    end_position: u64,
}

impl PartitionLog {
    /// An empty log (log end offset 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a batch at the log end offset, stamping its base offset into its header.
    pub fn append(&mut self, batch: ProducedBatch, leader_epoch: i32) -> AppendedBatch {
        let base_offset = self.end_offset;
        let end_offset = base_offset + batch.offset_count;
        let max_timestamp = batch.max_timestamp;
        let bytes = batch.stamp(base_offset, leader_epoch);
        let size = bytes.len() as u64;
        self.batches.push(StoredBatch {
            base_offset,
            end_offset,
            position: self.end_position,
            max_timestamp,
            bytes,
        });
        self.end_offset = end_offset;
        self.end_position += size;
        AppendedBatch {
            base_offset,
            end_offset,
        }
    }

    /// The log end offset: the offset the next record will get.
    pub fn end_offset(&self) -> i64 {
        self.end_offset
    }

    /// Bytes stored in the whole log.
    pub fn end_position(&self) -> u64 {
        self.end_position
    }

    /// Index of the batch holding `offset`, or `batches.len()` at the log end.
    fn batch_index(&self, offset: i64) -> usize {
        self.batches.partition_point(|b| b.end_offset <= offset)
    }

    /// Byte position where the batch holding `offset` starts; the log size for the log end
    /// offset; `None` for an offset outside `0..=end_offset`.
    pub fn position_of(&self, offset: i64) -> Option<u64> {
        if !(0..=self.end_offset).contains(&offset) {
            return None;
        }
        Some(
            self.batches
                .get(self.batch_index(offset))
                .map_or(self.end_position, |b| b.position),
        )
    }

    /// Byte position of an offset that is a batch boundary (or the log end).
    pub fn boundary_position(&self, offset: i64) -> u64 {
        self.position_of(offset).unwrap_or(self.end_position)
    }

    /// Whole batches from the one holding `from`, ending before `upto`, at most `max_bytes`
    /// in total, except that with `at_least_one` the first batch is returned even when
    /// larger (so a consumer always makes progress, as in Kafka's KIP-74).
    pub fn read(&self, from: i64, upto: i64, max_bytes: usize, at_least_one: bool) -> Bytes {
        let first = self.batch_index(from.max(0));
        let mut chosen = self.batches[first.min(self.batches.len())..]
            .iter()
            .take_while(|b| b.end_offset <= upto);
        let Some(head) = chosen.next() else {
            return Bytes::new();
        };
        if !at_least_one && head.bytes.len() > max_bytes {
            return Bytes::new();
        }
        let mut total = head.bytes.len();
        let mut tail = Vec::new();
        for batch in chosen {
            if total + batch.bytes.len() > max_bytes {
                break;
            }
            total += batch.bytes.len();
            tail.push(&batch.bytes);
        }
        if tail.is_empty() {
            return head.bytes.clone();
        }
        let mut out = BytesMut::with_capacity(total);
        out.extend_from_slice(&head.bytes);
        for bytes in tail {
            out.extend_from_slice(bytes);
        }
        out.freeze()
    }

    /// The first batch below `upto` holding a record with a timestamp at or after
    /// `timestamp_ms`: its base offset and largest timestamp. Batch granularity: a consumer
    /// starting there skips the few earlier records of that batch itself.
    pub fn offset_for_timestamp(&self, timestamp_ms: i64, upto: i64) -> Option<(i64, i64)> {
        self.batches
            .iter()
            .take_while(|b| b.end_offset <= upto)
            .find(|b| b.max_timestamp >= timestamp_ms)
            .map(|b| (b.base_offset, b.max_timestamp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record_batch::encode_batch;
    use kafka_protocol::records::RecordBatchDecoder;

    fn batch(records: usize, timestamp: i64) -> ProducedBatch {
        let values: Vec<Bytes> = (0..records)
            .map(|i| Bytes::from(vec![i as u8; 10]))
            .collect();
        ProducedBatch::parse_all(&encode_batch(&values, timestamp))
            .unwrap()
            .remove(0)
    }

    fn offsets_in(bytes: &Bytes) -> Vec<i64> {
        RecordBatchDecoder::decode_all(&mut bytes.clone())
            .unwrap()
            .into_iter()
            .flat_map(|set| set.records.into_iter().map(|r| r.offset))
            .collect()
    }

    #[test]
    fn appends_get_contiguous_offsets_and_positions() {
        let mut log = PartitionLog::new();
        let a = log.append(batch(3, 1), 0);
        let first_size = log.end_position();
        let b = log.append(batch(2, 2), 0);
        assert_eq!(
            a,
            AppendedBatch {
                base_offset: 0,
                end_offset: 3
            }
        );
        assert_eq!(
            b,
            AppendedBatch {
                base_offset: 3,
                end_offset: 5
            }
        );
        assert_eq!(log.end_offset(), 5);
        assert_eq!(log.position_of(0), Some(0));
        assert_eq!(log.position_of(2), Some(0));
        assert_eq!(log.position_of(3), Some(first_size));
        assert_eq!(log.position_of(5), Some(log.end_position()));
        assert_eq!(log.position_of(6), None);
        assert_eq!(log.position_of(-1), None);
    }

    #[test]
    fn read_returns_whole_batches_below_the_limit_offset() {
        let mut log = PartitionLog::new();
        log.append(batch(3, 1), 0);
        log.append(batch(2, 2), 0);
        log.append(batch(1, 3), 0);
        assert_eq!(
            offsets_in(&log.read(0, 6, usize::MAX, true)),
            vec![0, 1, 2, 3, 4, 5]
        );
        assert_eq!(offsets_in(&log.read(4, 6, usize::MAX, true)), vec![3, 4, 5]);
        assert_eq!(
            offsets_in(&log.read(0, 5, usize::MAX, true)),
            vec![0, 1, 2, 3, 4]
        );
        assert!(log.read(5, 5, usize::MAX, true).is_empty());
        assert!(log.read(6, 6, usize::MAX, true).is_empty());
    }

    #[test]
    fn read_respects_max_bytes_but_always_returns_one_batch() {
        let mut log = PartitionLog::new();
        log.append(batch(3, 1), 0);
        log.append(batch(2, 2), 0);
        assert_eq!(offsets_in(&log.read(0, 5, 1, true)), vec![0, 1, 2]);
        assert!(log.read(0, 5, 1, false).is_empty());
        let first_size = log.position_of(3).unwrap() as usize;
        assert_eq!(
            offsets_in(&log.read(0, 5, first_size + 1, true)),
            vec![0, 1, 2]
        );
        assert_eq!(
            offsets_in(&log.read(0, 5, first_size, false)),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn finds_offsets_by_timestamp_below_the_limit() {
        let mut log = PartitionLog::new();
        log.append(batch(3, 100), 0);
        log.append(batch(2, 200), 0);
        assert_eq!(log.offset_for_timestamp(50, 5), Some((0, 100)));
        assert_eq!(log.offset_for_timestamp(150, 5), Some((3, 200)));
        assert_eq!(log.offset_for_timestamp(150, 3), None);
        assert_eq!(log.offset_for_timestamp(300, 5), None);
    }
}
