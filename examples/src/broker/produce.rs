//! Produce: appends each partition's batches, then answers according to `acks`.
//!
//! - acks=0: no answer at all.
//! - acks=1: answered once the leader appended.
//! - acks=-1 (all): a [`DelayedProduce`](crate::delayed_produce::DelayedProduce) waits in
//!   the purgatory until every in-sync follower has the request's last offset in each
//!   partition, or answers REQUEST_TIMED_OUT at the request's `timeout_ms` capped by
//!   `--max-produce-wait-ms` (default 30 s, Kafka's `request.timeout.ms`). Only the topic
//!   names the answer echoes are kept across the wait, not the decoded request.
//!
//! Partitions with an error (compressed batches: UNSUPPORTED_COMPRESSION_TYPE, 76; unknown
//! partition, corrupt or old-format batches, batches whose
//! offsets disagree with their records or would pass `i64::MAX`: INVALID_RECORD; a producer
//! id this broker did not hand out or has retired: UNKNOWN_PRODUCER_ID; a producer whose
//! state the partition forgot, after `--producer-id-expiration-ms` without an append there
//! or evicted at the cap, at a sequence other than 0: OUT_OF_ORDER_SEQUENCE_NUMBER) get it
//! in their answer and are not waited on; the others are appended.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::ResponseError;

use super::BrokerState;
use crate::delayed_produce::ReplicaWait;
use crate::leader::AppendRefused;
use crate::record_batch::{BatchError, ProducedBatch};

const ACKS_NONE: i16 = 0;
const ACKS_LEADER: i16 = 1;
const ACKS_ALL: i16 = -1;

/// What became of one partition of the request.
struct PartitionResult {
    topic: usize,
    partition_index: i32,
    error: Option<ResponseError>,
    base_offset: i64,
}

/// Handles a produce request; `None` means no answer (acks=0).
pub async fn handle(
    state: &BrokerState,
    mut request: ProduceRequest,
    version: i16,
    peer: IpAddr,
) -> Option<ProduceResponse> {
    let acks = request.acks;
    let refuse_all = if request.transactional_id.is_some() {
        Some(ResponseError::TransactionalIdAuthorizationFailed)
    } else if ![ACKS_NONE, ACKS_LEADER, ACKS_ALL].contains(&acks) {
        Some(ResponseError::InvalidRequiredAcks)
    } else {
        None
    };

    let mut results = Vec::new();
    let mut waits = Vec::new();
    // The producer ids this request named that are live: each is checked (and refreshed)
    // once per request, however many batches name it.
    let mut named_ids = HashSet::new();
    let timeout_ms = request.timeout_ms;
    for (topic_index, topic) in request.topic_data.iter().enumerate() {
        for data in &topic.partition_data {
            let mut result = PartitionResult {
                topic: topic_index,
                partition_index: data.index,
                error: refuse_all,
                base_offset: -1,
            };
            if result.error.is_none() {
                match append(
                    state,
                    peer,
                    &mut named_ids,
                    &topic.name.0,
                    data.index,
                    data.records.as_ref(),
                ) {
                    Ok((wait, base_offset)) => {
                        result.base_offset = base_offset;
                        waits.push((results.len(), wait));
                    }
                    Err(error) => result.error = Some(error),
                }
            }
            results.push(result);
        }
    }

    // The answer echoes only the topic names (slices of the frame, which the answer shares
    // and the request budget counts): the decoded request, up to
    // `--max-partitions-per-request` entries, is not kept across the wait.
    let topics = std::mem::take(&mut request.topic_data);
    drop(request);
    let names: Vec<TopicName> = topics.into_iter().map(|t| t.name).collect();
    match acks {
        ACKS_NONE if refuse_all.is_none() => return None,
        ACKS_ALL if refuse_all.is_none() && !waits.is_empty() => {
            let timeout =
                Duration::from_millis(timeout_ms.max(0) as u64).min(state.config.max_produce_wait);
            let (indexes, waits): (Vec<usize>, Vec<ReplicaWait>) = waits.into_iter().unzip();
            let answer = state.leader.wait_for_replicas(timeout, waits).await;
            let acknowledged = match answer {
                Ok(done) => done.answer.acknowledged,
                Err(_) => vec![false; indexes.len()],
            };
            for (index, acked) in indexes.into_iter().zip(acknowledged) {
                if !acked {
                    results[index].error = Some(ResponseError::RequestTimedOut);
                }
            }
        }
        _ => {}
    }
    Some(response(names, results, version))
}

/// Appends one partition's records; returns what acks=all must wait for and the base offset.
fn append(
    state: &BrokerState,
    peer: IpAddr,
    named_ids: &mut HashSet<i64>,
    topic: &str,
    partition_index: i32,
    records: Option<&bytes::Bytes>,
) -> Result<(ReplicaWait, i64), ResponseError> {
    let (key, partition) = state
        .partition(topic, partition_index)
        .ok_or(ResponseError::UnknownTopicOrPartition)?;
    let records = records.ok_or(ResponseError::CorruptMessage)?;
    let batches = ProducedBatch::parse_all(records).map_err(|e| match e {
        BatchError::UnsupportedFormat => ResponseError::UnsupportedForMessageFormat,
        BatchError::Transactional | BatchError::Invalid(_) => ResponseError::InvalidRecord,
        // Kafka's answer (76) to a batch in a codec the broker will not take.
        BatchError::Compressed(_) => ResponseError::UnsupportedCompressionType,
        BatchError::Empty | BatchError::Corrupt(_) => ResponseError::CorruptMessage,
    })?;
    // An idempotent batch names its producer id; only ids handed out, to this client's
    // address, may be named, or a client could take another's next batches for retries
    // of its own. Naming it counts as
    // a use, once per request: ids used recently are retired last (`producer_ids.rs`).
    let now = Instant::now();
    for batch in &batches {
        let id = batch.producer_id;
        if id >= 0 && !named_ids.contains(&id) {
            if !state.producer_ids.produces(id, peer, now) {
                return Err(ResponseError::UnknownProducerId);
            }
            named_ids.insert(id);
        }
    }
    let appended = state.leader.append(key, batches).map_err(|e| match e {
        AppendRefused::UnknownPartition => ResponseError::UnknownTopicOrPartition,
        // Out of offsets: the batches are no more appendable than an invalid one.
        AppendRefused::OffsetSpaceExhausted => ResponseError::InvalidRecord,
        // The producer's state expired (or was evicted) and it does not start again at 0.
        AppendRefused::OutOfOrderSequence => ResponseError::OutOfOrderSequenceNumber,
    })?;
    let wait = ReplicaWait {
        key,
        partition: partition.clone(),
        required_offset: appended.end_offset,
    };
    Ok((wait, appended.base_offset))
}

fn response(names: Vec<TopicName>, results: Vec<PartitionResult>, version: i16) -> ProduceResponse {
    let mut topics: Vec<TopicProduceResponse> = names
        .into_iter()
        .map(|name| {
            let mut answer = TopicProduceResponse::default();
            answer.name = name;
            answer
        })
        .collect();
    for result in results {
        let mut answer = PartitionProduceResponse::default();
        answer.index = result.partition_index;
        answer.error_code = result.error.map_or(0, |e| e.code());
        answer.base_offset = result.base_offset;
        answer.log_append_time_ms = -1;
        if version >= 5 {
            answer.log_start_offset = 0;
        }
        topics[result.topic].partition_responses.push(answer);
    }
    let mut response = ProduceResponse::default();
    response.responses = topics;
    response
}
