//! ListOffsets: where consumers start. Latest is the high watermark (what consumers may
//! read; with no transactions it is also the last stable offset), earliest is 0, and a
//! timestamp finds the first committed batch holding a record at or after it.

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::ResponseError;

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
    let mut response = ListOffsetsResponse::default();
    response.topics = request
        .topics
        .iter()
        .map(|topic| {
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
                    let Some((_, partition)) = state.partition(&topic.name.0, p.partition_index)
                    else {
                        out.error_code = ResponseError::UnknownTopicOrPartition.code();
                        return out;
                    };
                    match p.timestamp {
                        LATEST => out.offset = partition.high_watermark(),
                        EARLIEST => out.offset = 0,
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
