//! ListOffsets: where consumers start. Latest is the high watermark (what consumers may
//! read; with no transactions it is also the last stable offset), earliest is the log start
//! offset (it moves with retention), and a timestamp finds the first committed batch
//! holding a record at or after it.
//!
//! Invariants (what keeps a request's cost proportional to its distinct partitions and
//! the log's logarithm, never to mentions times batches):
//! - A partition named more than once is answered INVALID_REQUEST at each mention, with no
//!   lookup, as Kafka does (`duplicatePartitions` in its `handleListOffsetRequest`).
//! - A timestamp is found by binary search over the log's running largest timestamp
//!   ([`PartitionLog::offset_for_timestamp`]), with the partition lock held for that search
//!   only. A request of `--max-partitions-per-request` lookups over a million batches is
//!   about 200,000 comparisons: short enough for an async worker.
//!
//! [`PartitionLog::offset_for_timestamp`]: crate::partition_log::PartitionLog::offset_for_timestamp

use std::collections::HashMap;

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::ResponseError;

use super::topic_ids::topic_ids;
use super::BrokerState;

/// Kafka's special timestamps.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;

/// Answers a ListOffsets request.
pub fn handle(
    state: &BrokerState,
    request: &ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    // Keyed by the name's id, not the name: each name hashed once (`topic_ids.rs`).
    let ids = topic_ids(request.topics.iter().map(|topic| &*topic.name.0));
    let mut mentions: HashMap<(u32, i32), u32> = HashMap::new();
    for (topic, &id) in request.topics.iter().zip(&ids) {
        for p in &topic.partitions {
            *mentions.entry((id, p.partition_index)).or_default() += 1;
        }
    }
    let mut response = ListOffsetsResponse::default();
    response.topics = request
        .topics
        .iter()
        .zip(ids)
        .map(|(topic, id)| {
            let mut answer = ListOffsetsTopicResponse::default();
            answer.name = topic.name.clone();
            answer.partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let mut out = ListOffsetsPartitionResponse::default();
                    out.partition_index = p.partition_index;
                    out.timestamp = -1;
                    out.offset = -1;
                    if version >= 4 {
                        out.leader_epoch = 0;
                    }
                    if mentions[&(id, p.partition_index)] > 1 {
                        out.error_code = ResponseError::InvalidRequest.code();
                        return out;
                    }
                    let Some((_, partition)) = state.partition(&topic.name.0, p.partition_index)
                    else {
                        out.error_code = ResponseError::UnknownTopicOrPartition.code();
                        return out;
                    };
                    match p.timestamp {
                        LATEST => out.offset = partition.high_watermark(),
                        EARLIEST => out.offset = partition.log_start_offset(),
                        at if at >= 0 => {
                            if let Some((offset, timestamp)) = partition.offset_for_timestamp(at) {
                                out.offset = offset;
                                out.timestamp = timestamp;
                            }
                        }
                        _ => out.error_code = ResponseError::InvalidRequest.code(),
                    }
                    out
                })
                .collect();
            answer
        })
        .collect();
    response
}
