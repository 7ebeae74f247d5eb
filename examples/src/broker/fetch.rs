//! Fetch: a long poll through the purgatory. Answered at once when `min_bytes` of committed
//! data are already there (or on an error, or when `max_wait_ms` is 0); otherwise a
//! [`DelayedFetch`](crate::delayed_fetch::DelayedFetch) waits until enough is committed or
//! `max_wait_ms` passes, and the answer carries what is committed by then.
//!
//! Consumers see only batches below the high watermark. Fetch sessions (v7+) are never
//! created: every answer has session id 0, so clients send full fetches, and an incremental
//! fetch naming a session gets FETCH_SESSION_ID_NOT_FOUND.

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse};
use kafka_protocol::ResponseError;

use super::BrokerState;
use crate::delayed_fetch::BytesWait;
use crate::partition::{Partition, PartitionKey};

/// A partition of the request, checked.
struct Wanted {
    topic: usize,
    partition_index: i32,
    fetch_offset: i64,
    max_bytes: usize,
    found: Result<(PartitionKey, Arc<Partition>, u64), ResponseError>,
}

/// Answers a fetch request, waiting in the purgatory when it must.
pub async fn handle(state: &BrokerState, request: &FetchRequest, version: i16) -> FetchResponse {
    if version >= 7 && request.session_id != 0 {
        let mut response = FetchResponse::default();
        response.error_code = ResponseError::FetchSessionIdNotFound.code();
        return response;
    }
    let wanted: Vec<Wanted> = request
        .topics
        .iter()
        .enumerate()
        .flat_map(|(topic_index, topic)| {
            topic.partitions.iter().map(move |p| Wanted {
                topic: topic_index,
                partition_index: p.partition,
                fetch_offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes.max(0) as usize,
                found: locate(state, &topic.topic.0, p.partition, p.fetch_offset),
            })
        })
        .collect();

    let waits: Vec<BytesWait> = wanted
        .iter()
        .filter_map(|w| {
            let (key, partition, start_position) = w.found.as_ref().ok()?;
            Some(BytesWait {
                key: *key,
                partition: partition.clone(),
                start_position: *start_position,
                max_bytes: w.max_bytes as u64,
            })
        })
        .collect();
    let any_error = wanted.iter().any(|w| w.found.is_err());
    let min_bytes = request.min_bytes.max(0) as u64;
    let available: u64 = waits.iter().map(BytesWait::available).sum();
    if !any_error && !waits.is_empty() && request.max_wait_ms > 0 && available < min_bytes {
        let max_wait = Duration::from_millis(request.max_wait_ms as u64);
        // Whatever ends the wait (bytes, max_wait, shutdown), the answer is what is there now.
        let _ = state
            .leader
            .wait_for_bytes(max_wait, min_bytes, waits)
            .await;
    }
    response(request, wanted, version)
}

/// Finds a fetched partition and the byte position of its fetch offset.
fn locate(
    state: &BrokerState,
    topic: &str,
    partition_index: i32,
    fetch_offset: i64,
) -> Result<(PartitionKey, Arc<Partition>, u64), ResponseError> {
    let (key, partition) = state
        .partition(topic, partition_index)
        .ok_or(ResponseError::UnknownTopicOrPartition)?;
    let position = partition
        .position_of(fetch_offset)
        .ok_or(ResponseError::OffsetOutOfRange)?;
    Ok((key, partition.clone(), position))
}

fn response(request: &FetchRequest, wanted: Vec<Wanted>, version: i16) -> FetchResponse {
    let mut topics: Vec<FetchableTopicResponse> = request
        .topics
        .iter()
        .map(|topic| {
            let mut answer = FetchableTopicResponse::default();
            answer.topic = topic.topic.clone();
            answer
        })
        .collect();
    // The whole answer stays within max_bytes, except that its first batch is always sent.
    let mut budget = request.max_bytes.max(0) as usize;
    let mut first = true;
    for w in wanted {
        let mut data = PartitionData::default();
        data.partition_index = w.partition_index;
        match &w.found {
            Err(error) => {
                data.error_code = error.code();
                data.high_watermark = -1;
                data.last_stable_offset = -1;
                data.records = Some(bytes::Bytes::new());
            }
            Ok((_, partition, _)) => {
                let limit = if first {
                    w.max_bytes
                } else {
                    w.max_bytes.min(budget)
                };
                let read = partition.read_committed(w.fetch_offset, limit, first);
                let high_watermark = read.high_watermark;
                let records = read.records;
                if !records.is_empty() {
                    first = false;
                    budget = budget.saturating_sub(records.len());
                }
                data.high_watermark = high_watermark;
                data.last_stable_offset = high_watermark;
                data.records = Some(records);
            }
        }
        if version >= 5 {
            data.log_start_offset = 0;
        }
        topics[w.topic].partitions.push(data);
    }
    let mut response = FetchResponse::default();
    response.responses = topics;
    response
}
