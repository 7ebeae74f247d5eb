//! Counting a request's entries in its raw body, before it is decoded.
//!
//! Decoding turns every entry of a request into a heap value several times its size on the
//! wire: an empty Produce topic is 3 bytes on the wire and about 100 bytes decoded (a name,
//! a vector, a map of tagged fields), so an 8 MiB frame of them decoded into 275 MB (issue
//! #29's review, finding 3). The per-request cap (`--max-partitions-per-request`) is
//! therefore checked on the raw bytes: [`count`] walks a Produce (v3-9), Fetch (v4-12),
//! ListOffsets (v1-6), Metadata (v0-9), InitProducerId (v0-4) or ApiVersions (v0-3) body
//! field by field, without allocating, and counts its entries (a Produce's record batches
//! included); [`count_header`] counts a
//! request header's tagged fields (which decode into a map entry each, whatever the API).
//!
//! Invariants:
//! - An entry is a topic, a partition (of a Fetch: also a forgotten topic and each of its
//!   partitions), a record batch of a Produce partition after its first, or a tagged field
//!   at any level (header included): everything that decodes into its own heap value. A
//!   partition's first batch is counted with it (real clients send one batch per partition
//!   per request); each further one decodes into its own checked batch and copy of its
//!   bytes, so a records field of a million 68-byte batches is a million entries (the
//!   second review of issue #29, finding 1). Batches are walked by their length fields
//!   only, as `record_batch::framed_batches` splits them, up to the first that is not
//!   whole (whose partition is refused, not its request). So a request that passes the
//!   cap decodes into at most `cap` entries, each of a bounded size (its strings stay
//!   slices of the frame; a batch's copy is its own size).
//! - The header and the body share one cap (`connection.rs` passes the body what the
//!   header left).
//! - The walk stops as soon as the count passes `cap` (it never reads more than `cap + 1`
//!   entries), and at the first field the body is too short for.
//! - `Err` means the body does not hold the fields its version has (the decoder would refuse
//!   it too); the tests check the walk against the codec's own encoding for every version
//!   the broker serves (`api_versions.rs`). Serving a newer version means adding its fields
//!   here, or its requests are refused as malformed.

use crate::record_batch::framed_batches;

/// Why a body's entries could not be counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalkError {
    /// The body ends inside a field.
    Truncated,
    /// A length below -1 or a varint longer than 5 bytes.
    BadLength,
}

/// Which request a body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Produce,
    Fetch,
    ListOffsets,
    Metadata,
    InitProducerId,
    ApiVersions,
}

impl Kind {
    /// The first version in the flexible (compact, tagged) encoding.
    fn first_flexible(self) -> i16 {
        match self {
            Kind::Produce => 9,
            Kind::Fetch => 12,
            Kind::ListOffsets => 6,
            Kind::Metadata => 9,
            Kind::InitProducerId => 2,
            Kind::ApiVersions => 3,
        }
    }
}

/// The entries of a `kind` body of `version`, or a number above `cap` as soon as the walk
/// has seen more than `cap`.
pub fn count(kind: Kind, body: &[u8], version: i16, cap: usize) -> Result<usize, WalkError> {
    let mut walk = Walk {
        rest: body,
        flexible: version >= kind.first_flexible(),
        entries: 0,
        cap,
    };
    let result = match kind {
        Kind::Produce => walk.produce(),
        Kind::Fetch => walk.fetch(version),
        Kind::ListOffsets => walk.list_offsets(version),
        Kind::Metadata => walk.metadata(version),
        Kind::InitProducerId => walk.init_producer_id(version),
        Kind::ApiVersions => walk.api_versions(version),
    };
    walk.finish(result)
}

/// The tagged fields of a request header of `header_version` at the start of `frame` (none
/// before v2), or a number above `cap` as soon as the walk has seen more than `cap`.
pub fn count_header(frame: &[u8], header_version: i16, cap: usize) -> Result<usize, WalkError> {
    let mut walk = Walk {
        rest: frame,
        // The client id stays a 16-bit-length string even in header v2.
        flexible: false,
        entries: 0,
        cap,
    };
    let result = (|| {
        walk.skip(2 + 2 + 4)?; // api key, version, correlation id
        if header_version >= 1 {
            walk.string()?; // client_id
        }
        if header_version >= 2 {
            walk.flexible = true;
            walk.tagged()?;
        }
        Ok(())
    })();
    walk.finish(result)
}

enum Stop {
    OverCap,
    Bad(WalkError),
}

impl From<WalkError> for Stop {
    fn from(e: WalkError) -> Self {
        Stop::Bad(e)
    }
}

struct Walk<'a> {
    rest: &'a [u8],
    flexible: bool,
    entries: usize,
    cap: usize,
}

impl Walk<'_> {
    fn finish(&self, result: Result<(), Stop>) -> Result<usize, WalkError> {
        match result {
            Ok(()) | Err(Stop::OverCap) => Ok(self.entries),
            Err(Stop::Bad(e)) => Err(e),
        }
    }

    fn metadata(&mut self, version: i16) -> Result<(), Stop> {
        self.array(|w| {
            w.string()?; // name
            w.tagged()
        })?;
        if version >= 4 {
            self.skip(1)?; // allow_auto_topic_creation
        }
        if version >= 8 {
            self.skip(2)?; // include cluster and topic authorized operations
        }
        self.tagged()
    }

    fn init_producer_id(&mut self, version: i16) -> Result<(), Stop> {
        self.string()?; // transactional_id
        self.skip(4)?; // transaction_timeout_ms
        if version >= 3 {
            self.skip(8 + 2)?; // producer_id, producer_epoch
        }
        self.tagged()
    }

    fn api_versions(&mut self, version: i16) -> Result<(), Stop> {
        if version >= 3 {
            self.string()?; // client_software_name
            self.string()?; // client_software_version
        }
        self.tagged()
    }

    fn produce(&mut self) -> Result<(), Stop> {
        self.string()?; // transactional_id
        self.skip(2 + 4)?; // acks, timeout_ms
        self.array(|w| {
            w.string()?; // name
            w.array(|w| {
                w.skip(4)?; // index
                w.records()?;
                w.tagged()
            })?;
            w.tagged()
        })?;
        self.tagged()
    }

    fn fetch(&mut self, version: i16) -> Result<(), Stop> {
        // replica_id, max_wait_ms, min_bytes, max_bytes (v3+), isolation_level (v4+).
        self.skip(4 + 4 + 4 + 4 + 1)?;
        if version >= 7 {
            self.skip(4 + 4)?; // session_id, session_epoch
        }
        self.array(|w| {
            w.string()?; // topic (v < 13)
            w.array(|w| {
                let mut fixed = 4 + 8 + 4; // partition, fetch_offset, partition_max_bytes
                if version >= 9 {
                    fixed += 4; // current_leader_epoch
                }
                if version >= 12 {
                    fixed += 4; // last_fetched_epoch
                }
                if version >= 5 {
                    fixed += 8; // log_start_offset
                }
                w.skip(fixed)?;
                w.tagged()
            })?;
            w.tagged()
        })?;
        if version >= 7 {
            self.array(|w| {
                w.string()?; // forgotten topic
                w.array(|w| Ok(w.skip(4)?))?; // its partitions
                w.tagged()
            })?;
        }
        if version >= 11 {
            self.string()?; // rack_id
        }
        self.tagged()
    }

    fn list_offsets(&mut self, version: i16) -> Result<(), Stop> {
        self.skip(4)?; // replica_id
        if version >= 2 {
            self.skip(1)?; // isolation_level
        }
        self.array(|w| {
            w.string()?; // name
            w.array(|w| {
                // partition_index, current_leader_epoch (v4+), timestamp.
                w.skip(if version >= 4 { 4 + 4 + 8 } else { 4 + 8 })?;
                w.tagged()
            })?;
            w.tagged()
        })?;
        self.tagged()
    }

    fn entry(&mut self) -> Result<(), Stop> {
        self.entries += 1;
        if self.entries > self.cap {
            return Err(Stop::OverCap);
        }
        Ok(())
    }

    fn skip(&mut self, n: usize) -> Result<(), WalkError> {
        if self.rest.len() < n {
            return Err(WalkError::Truncated);
        }
        self.rest = &self.rest[n..];
        Ok(())
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], WalkError> {
        let bytes = self.rest.get(..N).ok_or(WalkError::Truncated)?;
        let out = bytes.try_into().map_err(|_| WalkError::Truncated)?;
        self.rest = &self.rest[N..];
        Ok(out)
    }

    fn uvarint(&mut self) -> Result<u64, WalkError> {
        let mut value = 0u64;
        for i in 0..5 {
            let [byte] = self.fixed::<1>()?;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WalkError::BadLength)
    }

    /// A length or count: `None` for null (-1), else the value.
    fn length(&mut self, wide: bool) -> Result<Option<usize>, WalkError> {
        let raw: i64 = if self.flexible {
            self.uvarint()? as i64 - 1
        } else if wide {
            i64::from(i32::from_be_bytes(self.fixed()?))
        } else {
            i64::from(i16::from_be_bytes(self.fixed()?))
        };
        match raw {
            -1 => Ok(None),
            n if n < -1 => Err(WalkError::BadLength),
            n => Ok(Some(n as usize)),
        }
    }

    fn string(&mut self) -> Result<(), WalkError> {
        let length = self.length(false)?.unwrap_or(0);
        self.skip(length)
    }

    /// A Produce partition's records: each whole batch after the first is an entry.
    fn records(&mut self) -> Result<(), Stop> {
        let length = self.length(true)?.unwrap_or(0);
        let rest = self.rest;
        let records = rest.get(..length).ok_or(WalkError::Truncated)?;
        self.rest = &rest[length..];
        for _ in framed_batches(records).skip(1) {
            self.entry()?;
        }
        Ok(())
    }

    /// An array whose every element is an entry.
    fn array(
        &mut self,
        mut element: impl FnMut(&mut Self) -> Result<(), Stop>,
    ) -> Result<(), Stop> {
        let count = self.length(true)?.unwrap_or(0);
        for _ in 0..count {
            self.entry()?;
            element(self)?;
        }
        Ok(())
    }

    /// The tagged fields of a flexible version: each one is an entry.
    fn tagged(&mut self) -> Result<(), Stop> {
        if !self.flexible {
            return Ok(());
        }
        let count = self.uvarint()?;
        for _ in 0..count {
            self.entry()?;
            self.uvarint()?; // tag
            let size = self.uvarint()?;
            self.skip(usize::try_from(size).map_err(|_| WalkError::BadLength)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{
        FetchRequest, ListOffsetsRequest, ProduceRequest, TopicName, TransactionalId,
    };
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn name() -> TopicName {
        TopicName(StrBytes::from_static_str("demo"))
    }

    fn encode(request: &impl Encodable, version: i16) -> Vec<u8> {
        let mut out = BytesMut::new();
        request.encode(&mut out, version).unwrap();
        out.to_vec()
    }

    fn produce(topics: usize, partitions: usize) -> ProduceRequest {
        let mut partition = PartitionProduceData::default();
        partition.records = Some(Bytes::from_static(b"abcdefgh"));
        let mut topic = TopicProduceData::default();
        topic.name = name();
        topic.partition_data = vec![partition; partitions];
        let mut request = ProduceRequest::default();
        request.transactional_id = Some(TransactionalId(StrBytes::from_static_str("tx")));
        request.topic_data = vec![topic; topics];
        request
    }

    #[test]
    fn counts_produce_entries_in_every_version() {
        for version in 3..=9 {
            for (topics, partitions) in [(0, 0), (1, 1), (3, 4), (50, 0)] {
                let body = encode(&produce(topics, partitions), version);
                let expected = topics + topics * partitions;
                assert_eq!(
                    count(Kind::Produce, &body, version, 1_000),
                    Ok(expected),
                    "v{version} {topics}x{partitions}"
                );
            }
        }
    }

    #[test]
    fn counts_every_produce_batch_after_a_partitions_first() {
        use crate::record_batch::encode_batch;
        let one = encode_batch(&[Bytes::from_static(b"x")], 1);
        for version in 3..=9 {
            for batches in [0, 1, 2, 5] {
                let mut request = produce(2, 3);
                let records = Bytes::from(one.repeat(batches));
                for topic in &mut request.topic_data {
                    for partition in &mut topic.partition_data {
                        partition.records = Some(records.clone());
                    }
                }
                let body = encode(&request, version);
                let expected = 2 + 6 + 6 * batches.saturating_sub(1);
                assert_eq!(
                    count(Kind::Produce, &body, version, 1_000),
                    Ok(expected),
                    "v{version}, {batches} batches a partition"
                );
                // Past the cap, the walk stops inside the records.
                assert_eq!(count(Kind::Produce, &body, version, 3), Ok(expected.min(4)));
            }
            // The walk stops at a batch that is not whole: the partition is refused later,
            // its request is not.
            let mut request = produce(1, 1);
            let mut cut = one.repeat(4);
            cut.pop();
            request.topic_data[0].partition_data[0].records = Some(Bytes::from(cut));
            let body = encode(&request, version);
            assert_eq!(count(Kind::Produce, &body, version, 1_000), Ok(2 + 2));
        }
    }

    #[test]
    fn counts_fetch_entries_in_every_version() {
        for version in 4..=12 {
            let mut topic = FetchTopic::default();
            topic.topic = name();
            topic.partitions = vec![FetchPartition::default(); 3];
            let mut forgotten = ForgottenTopic::default();
            forgotten.topic = name();
            forgotten.partitions = vec![1, 2];
            let mut request = FetchRequest::default();
            request.topics = vec![topic; 2];
            if version >= 7 {
                request.forgotten_topics_data = vec![forgotten; 2];
            }
            if version >= 11 {
                request.rack_id = StrBytes::from_static_str("rack");
            }
            let body = encode(&request, version);
            let expected = 2 + 6 + if version >= 7 { 2 + 4 } else { 0 };
            assert_eq!(
                count(Kind::Fetch, &body, version, 1_000),
                Ok(expected),
                "v{version}"
            );
        }
    }

    #[test]
    fn counts_list_offsets_entries_in_every_version() {
        for version in 1..=6 {
            let mut topic = ListOffsetsTopic::default();
            topic.name = name();
            topic.partitions = vec![ListOffsetsPartition::default(); 5];
            let mut request = ListOffsetsRequest::default();
            request.topics = vec![topic; 4];
            let body = encode(&request, version);
            assert_eq!(
                count(Kind::ListOffsets, &body, version, 1_000),
                Ok(24),
                "v{version}"
            );
        }
    }

    #[test]
    fn stops_past_the_cap_and_refuses_short_bodies() {
        let body = encode(&produce(100, 100), 9);
        assert_eq!(count(Kind::Produce, &body, 9, 10), Ok(11));
        let body = encode(&produce(2, 2), 7);
        assert_eq!(
            count(Kind::Produce, &body[..body.len() - 1], 7, 100),
            Err(WalkError::Truncated)
        );
        // An array announcing 2^31 - 1 topics in four bytes: counted up to the cap only.
        let mut huge = encode(&produce(0, 0), 7);
        let at = huge.len() - 4;
        huge[at..].copy_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(
            count(Kind::Produce, &huge, 7, 10),
            Err(WalkError::Truncated)
        );
    }

    #[test]
    fn counts_metadata_init_producer_id_and_api_versions_entries() {
        use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
        use kafka_protocol::messages::{
            ApiVersionsRequest, InitProducerIdRequest, MetadataRequest,
        };
        for version in 0..=9 {
            let mut topic = MetadataRequestTopic::default();
            topic.name = Some(name());
            let mut request = MetadataRequest::default();
            request.topics = Some(vec![topic; 7]);
            let body = encode(&request, version);
            assert_eq!(
                count(Kind::Metadata, &body, version, 100),
                Ok(7),
                "v{version}"
            );
            if version >= 1 {
                request.topics = None;
                let body = encode(&request, version);
                assert_eq!(count(Kind::Metadata, &body, version, 100), Ok(0));
            }
        }
        for version in 0..=4 {
            let mut request = InitProducerIdRequest::default();
            request.transactional_id = None;
            if version >= 2 {
                request.unknown_tagged_fields.insert(3, Bytes::new());
            }
            let body = encode(&request, version);
            let expected = usize::from(version >= 2);
            assert_eq!(
                count(Kind::InitProducerId, &body, version, 100),
                Ok(expected),
                "v{version}"
            );
        }
        for version in 0..=3 {
            let mut request = ApiVersionsRequest::default();
            if version >= 3 {
                request.client_software_name = StrBytes::from_static_str("client");
                request.client_software_version = StrBytes::from_static_str("1.0");
                for tag in 0..5 {
                    request.unknown_tagged_fields.insert(tag, Bytes::new());
                }
            }
            let body = encode(&request, version);
            let expected = if version >= 3 { 5 } else { 0 };
            assert_eq!(
                count(Kind::ApiVersions, &body, version, 100),
                Ok(expected),
                "v{version}"
            );
        }
    }

    #[test]
    fn counts_request_header_tagged_fields() {
        use kafka_protocol::messages::RequestHeader;
        for header_version in 1..=2 {
            let mut header = RequestHeader::default();
            header.request_api_version = 9;
            header.client_id = Some(StrBytes::from_static_str("client"));
            if header_version >= 2 {
                for tag in 0..20 {
                    header.unknown_tagged_fields.insert(tag, Bytes::new());
                }
            }
            let mut frame = encode(&header, header_version);
            frame.extend_from_slice(b"the body follows");
            let expected = if header_version >= 2 { 20 } else { 0 };
            assert_eq!(count_header(&frame, header_version, 100), Ok(expected));
            assert_eq!(
                count_header(&frame, header_version, 10),
                Ok(expected.min(11))
            );
        }
    }

    #[test]
    fn counts_unknown_tagged_fields() {
        let mut request = produce(1, 1);
        request
            .unknown_tagged_fields
            .insert(7, Bytes::from_static(b"x"));
        request.unknown_tagged_fields.insert(8, Bytes::new());
        let body = encode(&request, 9);
        assert_eq!(count(Kind::Produce, &body, 9, 100), Ok(4));
    }
}
