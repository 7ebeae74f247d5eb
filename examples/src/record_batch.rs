//! Record batches as a producer sends them, checked and stamped with log offsets.
//!
//! The broker keeps batches exactly as produced (Kafka's v2 record-batch format,
//! uncompressed only) and never decodes the records inside them. The header is checked with
//! `kafka-protocol`'s [`RecordBatchDecoder::decode_batch_info`] (magic byte, lengths, CRC),
//! and the two header fields the broker rewrites or needs beyond that are read here at their
//! fixed places in the v2 header.
//!
//! The CRC proves only that the bytes arrived as the client wrote them, not that its header
//! tells the truth: a client can claim any `lastOffsetDelta` and record count and checksum
//! them. The offsets a batch takes in the log are therefore checked against its records as
//! Kafka's `LogValidator` does, and refused with INVALID_RECORD (Kafka's
//! `InvalidRecordException`) when they disagree.
//!
//! Compressed batches are refused (UNSUPPORTED_COMPRESSION_TYPE): their records cannot be
//! counted without decompressing them, and a batch whose count is only a claim can take
//! 2^31 - 1 offsets for 21 bytes of garbage (issue #29's review, finding 1). Decompressing
//! as Kafka does would need four codecs (two of them C libraries) and an output bound the
//! codec's own decompression (`kafka-protocol`'s `compression` module, which decompresses
//! whole into memory) does not have.
//!
//! Invariants of a [`ProducedBatch`]:
//! - `bytes` holds exactly one uncompressed v2 batch whose CRC was valid when it was
//!   parsed; stamping changes only the base offset and the partition leader epoch, which the
//!   CRC does not cover (it starts at the attributes field), so a stamped batch stays valid.
//! - `offset_count >= 1`: a batch occupies `last_offset_delta + 1` offsets of the log, and
//!   `last_offset_delta + 1` is its record count field, which is the number of records its
//!   bytes hold (each record's length prefix walked to the batch's end), and each of those
//!   records holds exactly a record's fields, its offset delta its place in the batch
//!   (`count_records`): a record a consumer cannot read (a zero-length one, say, which
//!   kafka-python's consumer met with `CorruptRecordError` at every poll, stuck at its
//!   offset) is refused with INVALID_RECORD, as Kafka's `InvalidRecordException`.

use std::fmt;

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::RecordBatchDecoder;

/// Where the v2 header fields the broker uses sit, in bytes from the start of a batch.
mod header {
    pub const BASE_OFFSET: usize = 0;
    pub const BATCH_LENGTH: usize = 8;
    /// Bytes before the part the batch-length field counts.
    pub const LENGTH_PREFIX: usize = 12;
    pub const PARTITION_LEADER_EPOCH: usize = 12;
    pub const ATTRIBUTES: usize = 21;
    pub const LAST_OFFSET_DELTA: usize = 23;
    pub const MAX_TIMESTAMP: usize = 35;
    /// The whole fixed header, up to and including the record count; the records follow.
    pub const SIZE: usize = 61;
    /// Attribute bits of the compression codec (0: none).
    pub const COMPRESSION: i16 = 0b111;
    /// Attribute bits of transactional and control batches.
    pub const TRANSACTIONAL_OR_CONTROL: i16 = (1 << 4) | (1 << 5);
}

/// Why the records of a produce request were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// No records at all.
    Empty,
    /// The bytes do not hold whole v2 batches (truncated, bad length, bad CRC).
    Corrupt(String),
    /// A batch of an older message format (magic 0 or 1).
    UnsupportedFormat,
    /// A transactional or control batch: this broker has no transactions.
    Transactional,
    /// A compressed batch (its codec's attribute bits): its records cannot be checked.
    Compressed(i16),
    /// A well-formed batch whose header disagrees with its records (offset range, record
    /// count): Kafka's `InvalidRecordException`.
    Invalid(String),
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::Empty => write!(f, "no record batch"),
            BatchError::Corrupt(why) => write!(f, "corrupt record batch: {why}"),
            BatchError::UnsupportedFormat => write!(f, "message format older than v2"),
            BatchError::Transactional => write!(f, "transactional batches are not supported"),
            BatchError::Compressed(codec) => {
                write!(f, "compressed batches (codec {codec}) are not supported")
            }
            BatchError::Invalid(why) => write!(f, "invalid record batch: {why}"),
        }
    }
}

impl std::error::Error for BatchError {}

/// One checked v2 record batch, ready to be stamped with its base offset.
#[derive(Debug, Clone)]
pub struct ProducedBatch {
    bytes: BytesMut,
    /// How many offsets the batch occupies.
    pub offset_count: i64,
    /// Producer id, or -1 for a producer that is not idempotent.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// Sequence number of the first record (idempotent producers), else -1.
    pub base_sequence: i32,
    /// Largest timestamp in the batch (milliseconds since the epoch).
    pub max_timestamp: i64,
}

impl ProducedBatch {
    /// Splits a produce request's records into checked batches.
    pub fn parse_all(records: &Bytes) -> Result<Vec<ProducedBatch>, BatchError> {
        if records.is_empty() {
            return Err(BatchError::Empty);
        }
        let mut batches = Vec::new();
        let mut rest = records.clone();
        while !rest.is_empty() {
            let total = framed_length(&rest)?;
            let one = rest.split_to(total);
            batches.push(Self::parse_one(one)?);
        }
        Ok(batches)
    }

    fn parse_one(one: Bytes) -> Result<ProducedBatch, BatchError> {
        let infos = RecordBatchDecoder::decode_batch_info(&mut one.clone())
            .map_err(|e| BatchError::Corrupt(e.to_string()))?;
        // decode_batch_info stops (with no entry) at a batch of another magic byte.
        let info = match infos.as_slice() {
            [info] => info,
            [] => return Err(BatchError::UnsupportedFormat),
            _ => {
                return Err(BatchError::Corrupt(
                    "batch length disagrees with content".into(),
                ))
            }
        };
        let attributes = read_i16(&one, header::ATTRIBUTES).unwrap_or(0);
        if attributes & header::TRANSACTIONAL_OR_CONTROL != 0 {
            return Err(BatchError::Transactional);
        }
        if attributes & header::COMPRESSION != 0 {
            return Err(BatchError::Compressed(attributes & header::COMPRESSION));
        }
        let last_offset_delta = read_i32(&one, header::LAST_OFFSET_DELTA).unwrap_or(-1);
        // Kafka's LogValidator.validateBatch: the offset range is not empty and holds
        // exactly the record count.
        if info.record_count <= 0
            || i64::from(last_offset_delta) + 1 != i64::from(info.record_count)
        {
            return Err(BatchError::Invalid(format!(
                "last offset delta {last_offset_delta} for a record count of {}",
                info.record_count
            )));
        }
        let held = count_records(&one[header::SIZE..])?;
        if held != i64::from(info.record_count) {
            return Err(BatchError::Invalid(format!(
                "record count {} for {held} records",
                info.record_count
            )));
        }
        Ok(ProducedBatch {
            // A copy, not a slice: the log keeps the batch, and a slice would keep the whole
            // request frame with it, outside the request budget. Made here, before the
            // partition lock is taken; the per-request cap bounds how many there are.
            bytes: BytesMut::from(&one[..]),
            offset_count: i64::from(last_offset_delta) + 1,
            producer_id: info.producer_id,
            producer_epoch: info.producer_epoch,
            base_sequence: info.base_sequence,
            max_timestamp: read_i64(&one, header::MAX_TIMESTAMP).unwrap_or(-1),
        })
    }

    /// Size of the batch in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Never true: a checked batch has at least its header.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Writes the batch's place in the log and hands back its bytes as stored.
    pub fn stamp(mut self, base_offset: i64, leader_epoch: i32) -> Bytes {
        let at = header::BASE_OFFSET;
        self.bytes[at..at + 8].copy_from_slice(&base_offset.to_be_bytes());
        let at = header::PARTITION_LEADER_EPOCH;
        self.bytes[at..at + 4].copy_from_slice(&leader_epoch.to_be_bytes());
        self.bytes.freeze()
    }
}

/// The whole batches at the start of a produce's `records`, as [`ProducedBatch::parse_all`]
/// splits them, up to the first that is not whole (where `parse_all` refuses the records).
/// The broker counts them before decoding a request (`request_entries.rs`): each is
/// decoded into a [`ProducedBatch`] and a copy of its bytes.
pub fn framed_batches(mut records: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let total = framed_length(records).ok()?;
        let (one, rest) = records.split_at(total);
        records = rest;
        Some(one)
    })
}

/// The size of the batch at the start of `rest` (its offset and length fields included),
/// as its batch-length field gives it: at least a whole header, and all there.
fn framed_length(rest: &[u8]) -> Result<usize, BatchError> {
    let length = read_i32(rest, header::BATCH_LENGTH)
        .ok_or_else(|| BatchError::Corrupt("truncated batch header".into()))?;
    usize::try_from(length)
        .ok()
        .and_then(|l| l.checked_add(header::LENGTH_PREFIX))
        .filter(|&t| t >= header::SIZE && t <= rest.len())
        .ok_or_else(|| BatchError::Corrupt(format!("bad batch length {length}")))
}

/// How many records an uncompressed batch's record section holds, each checked whole as
/// Kafka's `DefaultRecord.readFrom` reads it for `LogValidator`: its length (a zigzag
/// varint) and that many bytes, which hold exactly the record's fields (attributes, a
/// timestamp delta, an offset delta, a key and a value each null (-1) or of a length, and
/// headers, each a key of a length and a value null or of a length); and the last record
/// ends where the batch ends. A record's offset delta must be its place in the batch: a
/// consumer takes the record's offset from it (Kafka checks this for compressed batches;
/// every client writes it so in both).
fn count_records(mut records: &[u8]) -> Result<i64, BatchError> {
    let mut count = 0i64;
    while !records.is_empty() {
        let (length, prefix) = read_varint(records)
            .ok_or_else(|| BatchError::Invalid("truncated record length".into()))?;
        let end = usize::try_from(length)
            .ok()
            .and_then(|l| l.checked_add(prefix))
            .filter(|&end| end <= records.len())
            .ok_or_else(|| BatchError::Invalid(format!("bad record length {length}")))?;
        check_record(&records[prefix..end], count).map_err(|why| {
            BatchError::Invalid(format!("record {count} of {length} bytes: {why}"))
        })?;
        records = &records[end..];
        count += 1;
    }
    Ok(count)
}

/// Checks that `body` (a record without its length) holds exactly a record's fields, and
/// that its offset delta is `index`.
fn check_record(body: &[u8], index: i64) -> Result<(), &'static str> {
    let mut fields = Fields(body);
    fields.take(1).ok_or("no attributes")?;
    fields.varlong().ok_or("bad timestamp delta")?;
    let offset_delta = fields.varint().ok_or("bad offset delta")?;
    if offset_delta != index {
        return Err("offset delta is not the record's place in its batch");
    }
    fields.nullable_bytes().ok_or("bad key")?;
    fields.nullable_bytes().ok_or("bad value")?;
    let headers = fields.varint().ok_or("bad header count")?;
    if headers < 0 {
        return Err("negative header count");
    }
    for _ in 0..headers {
        let key = fields.varint().ok_or("bad header key length")?;
        let key = usize::try_from(key).map_err(|_| "negative header key length")?;
        fields.take(key).ok_or("header key past the record's end")?;
        fields.nullable_bytes().ok_or("bad header value")?;
    }
    if !fields.0.is_empty() {
        return Err("bytes left after the record's fields");
    }
    Ok(())
}

/// The fields of one record, read from the front.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take(&mut self, n: usize) -> Option<()> {
        self.0 = self.0.get(n..)?;
        Some(())
    }

    fn varint(&mut self) -> Option<i64> {
        let (value, used) = read_varint(self.0)?;
        self.take(used)?;
        Some(value)
    }

    fn varlong(&mut self) -> Option<i64> {
        let mut raw = 0u64;
        for (i, &byte) in self.0.iter().take(10).enumerate() {
            raw |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.take(i + 1)?;
                return Some((raw >> 1) as i64 ^ -((raw & 1) as i64));
            }
        }
        None
    }

    /// A length (-1 for null) and that many bytes.
    fn nullable_bytes(&mut self) -> Option<()> {
        match self.varint()? {
            -1 => Some(()),
            length => self.take(usize::try_from(length).ok()?),
        }
    }
}

/// A zigzag-encoded varint of at most 5 bytes (an i32) and how many bytes it took.
fn read_varint(bytes: &[u8]) -> Option<(i64, usize)> {
    let mut raw = 0u64;
    for (i, &byte) in bytes.iter().take(5).enumerate() {
        raw |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let value = (raw >> 1) as i64 ^ -((raw & 1) as i64);
            return Some((value, i + 1));
        }
    }
    None
}

fn read_i16(bytes: &[u8], at: usize) -> Option<i16> {
    Some(i16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn read_i32(bytes: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn read_i64(bytes: &[u8], at: usize) -> Option<i64> {
    Some(i64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// Builds an uncompressed v2 batch of `values` (for the demos, the load tool and tests).
pub fn encode_batch(values: &[Bytes], timestamp_ms: i64) -> Bytes {
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, value)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder starts a new batch wherever `offset - sequence` changes.
            sequence: i as i32,
            timestamp: timestamp_ms,
            key: None,
            value: Some(value.clone()),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    // Encoding uncompressed records into memory cannot fail.
    RecordBatchEncoder::encode(&mut buf, &records, &options).expect("in-memory batch encoding");
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<Bytes> {
        (0..n).map(|i| Bytes::from(format!("value-{i}"))).collect()
    }

    #[test]
    fn parses_one_batch_and_counts_its_offsets() {
        let raw = encode_batch(&values(3), 1_000);
        let batches = ProducedBatch::parse_all(&raw).unwrap();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].offset_count, 3);
        assert_eq!(batches[0].producer_id, -1);
        assert_eq!(batches[0].max_timestamp, 1_000);
        assert_eq!(batches[0].len(), raw.len());
    }

    #[test]
    fn parses_concatenated_batches() {
        let mut raw = BytesMut::new();
        raw.extend_from_slice(&encode_batch(&values(2), 1));
        raw.extend_from_slice(&encode_batch(&values(5), 2));
        let batches = ProducedBatch::parse_all(&raw.freeze()).unwrap();
        let counts: Vec<i64> = batches.iter().map(|b| b.offset_count).collect();
        assert_eq!(counts, vec![2, 5]);
    }

    #[test]
    fn framed_batches_are_the_batches_parse_all_splits() {
        let mut raw = BytesMut::new();
        for n in 1..=4 {
            raw.extend_from_slice(&encode_batch(&values(n), 1));
        }
        let raw = raw.freeze();
        let parsed = ProducedBatch::parse_all(&raw).unwrap();
        let framed: Vec<usize> = framed_batches(&raw).map(<[u8]>::len).collect();
        let lengths: Vec<usize> = parsed.iter().map(ProducedBatch::len).collect();
        assert_eq!(framed, lengths);
        // A cut batch ends the walk there, where parse_all refuses the records.
        let cut = raw.slice(..raw.len() - 1);
        assert_eq!(framed_batches(&cut).count(), 3);
        assert!(ProducedBatch::parse_all(&cut).is_err());
        assert_eq!(framed_batches(&[0u8; 7]).count(), 0);
    }

    #[test]
    fn stamping_keeps_the_batch_valid() {
        let raw = encode_batch(&values(4), 7);
        let batch = ProducedBatch::parse_all(&raw).unwrap().remove(0);
        let stamped = batch.stamp(1_234, 0);
        let infos = RecordBatchDecoder::decode_batch_info(&mut stamped.clone()).unwrap();
        assert_eq!(infos[0].min_offset, 1_234);
        let decoded = RecordBatchDecoder::decode(&mut stamped.clone()).unwrap();
        let offsets: Vec<i64> = decoded.records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![1_234, 1_235, 1_236, 1_237]);
    }

    #[test]
    fn refuses_empty_truncated_and_corrupted_input() {
        assert_eq!(
            ProducedBatch::parse_all(&Bytes::new()).unwrap_err(),
            BatchError::Empty
        );
        let raw = encode_batch(&values(2), 1);
        let truncated = raw.slice(..raw.len() - 1);
        assert!(matches!(
            ProducedBatch::parse_all(&truncated),
            Err(BatchError::Corrupt(_))
        ));
        let mut flipped = BytesMut::from(&raw[..]);
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert!(matches!(
            ProducedBatch::parse_all(&flipped.freeze()),
            Err(BatchError::Corrupt(_))
        ));
        assert!(matches!(
            ProducedBatch::parse_all(&Bytes::from_static(&[0u8; 7])),
            Err(BatchError::Corrupt(_))
        ));
    }

    #[test]
    fn refuses_old_message_formats() {
        let mut old = BytesMut::from(&encode_batch(&values(1), 1)[..]);
        old[16] = 1;
        assert_eq!(
            ProducedBatch::parse_all(&old.freeze()).unwrap_err(),
            BatchError::UnsupportedFormat
        );
    }

    /// `body` behind its length, as a record section holds it (lengths under 64 bytes).
    fn record(body: &[u8]) -> Vec<u8> {
        assert!(body.len() < 64);
        let mut out = vec![(body.len() as u8) << 1];
        out.extend_from_slice(body);
        out
    }

    /// A record's fields: attributes, timestamp delta 0, offset delta `index`, a null key,
    /// the value `x`, and `headers` (already encoded, count first).
    fn fields(index: u8, headers: &[u8]) -> Vec<u8> {
        let mut body = vec![0, 0, index << 1, 1, 2, b'x'];
        body.extend_from_slice(headers);
        body
    }

    #[test]
    fn counts_the_records_the_encoder_writes_and_hand_made_ones() {
        let raw = encode_batch(&values(3), 1);
        assert_eq!(count_records(&raw[header::SIZE..]), Ok(3));
        let mut section = record(&fields(0, &[0]));
        // One header: key "k" (length 1, zigzag 2), a null value.
        section.extend(record(&fields(1, &[2, 2, b'k', 1])));
        assert_eq!(count_records(&section), Ok(2));
    }

    #[test]
    fn refuses_records_a_consumer_cannot_read() {
        let cases: [(&str, Vec<u8>); 8] = [
            ("zero-length record", record(&[])),
            ("zero-length records", [record(&[]), record(&[])].concat()),
            ("fields cut short", record(&fields(0, &[0])[..4])),
            ("no header count", record(&fields(0, &[]))),
            ("bytes after the fields", record(&[fields(0, &[0]), vec![7]].concat())),
            ("offset delta not its place", record(&fields(1, &[0]))),
            ("negative header count", record(&fields(0, &[1]))),
            ("negative header key length", record(&fields(0, &[2, 1, 1]))),
        ];
        for (what, section) in cases {
            assert!(
                matches!(count_records(&section), Err(BatchError::Invalid(_))),
                "{what}: {:?}",
                count_records(&section)
            );
        }
        // A value longer than its record.
        assert!(count_records(&record(&[0, 0, 0, 1, 40, b'x', 0])).is_err());
    }

    #[test]
    fn refuses_a_length_field_longer_than_the_input() {
        let mut raw = BytesMut::from(&encode_batch(&values(1), 1)[..]);
        raw[8..12].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(
            ProducedBatch::parse_all(&raw.freeze()),
            Err(BatchError::Corrupt(_))
        ));
    }
}
