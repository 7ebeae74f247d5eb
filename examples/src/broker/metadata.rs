//! Metadata: this broker (node 0) leads every partition of its one topic.
//!
//! Only node 0 is listed as replica and in-sync replica: the simulated followers live inside
//! this process and clients must never try to connect to them. Unknown topics are answered
//! with UNKNOWN_TOPIC_OR_PARTITION (no automatic creation).
//!
//! Invariant: each topic named is answered once, however often the request names it (as
//! Kafka does), so the answer grows with the distinct names, not with the request.

use std::collections::HashSet;

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::BrokerState;

/// The cluster id reported from Metadata v2 on.
pub const CLUSTER_ID: &str = "purgatory-example";

/// The number of topics a raw Metadata body announces (its first field), before decoding:
/// a 32-bit count up to v8, an unsigned varint of the count plus one from v9. `None` for a
/// null list (all topics) or a body too short to tell.
pub fn announced_topics(body: &[u8], version: i16) -> Option<usize> {
    if version < 9 {
        let count = i32::from_be_bytes(body.get(..4)?.try_into().ok()?);
        return usize::try_from(count).ok();
    }
    let mut value: u64 = 0;
    for (i, byte) in body.iter().take(5).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return usize::try_from(value.checked_sub(1)?).ok();
        }
    }
    None
}

/// Answers a Metadata request.
pub fn handle(state: &BrokerState, request: &MetadataRequest, version: i16) -> MetadataResponse {
    let mut broker = MetadataResponseBroker::default();
    broker.node_id = BrokerId(0);
    broker.host = StrBytes::from_string(state.advertised.ip().to_string());
    broker.port = i32::from(state.advertised.port());

    // The names stay slices of the request (no copy); the answer shares them too.
    let names: Vec<Option<StrBytes>> = match &request.topics {
        // v0 has no null list: an empty list means every topic.
        Some(topics) if !(version == 0 && topics.is_empty()) => {
            let mut seen = HashSet::new();
            topics
                .iter()
                .filter(|t| seen.insert(t.name.as_ref()))
                .map(|t| t.name.as_ref().map(|n| n.0.clone()))
                .collect()
        }
        _ => vec![Some(StrBytes::from_string(state.config.topic.clone()))],
    };

    let mut response = MetadataResponse::default();
    response.brokers = vec![broker];
    response.controller_id = BrokerId(0);
    response.cluster_id = Some(StrBytes::from_static_str(CLUSTER_ID));
    response.topics = names.into_iter().map(|name| topic(state, name)).collect();
    response
}

fn topic(state: &BrokerState, name: Option<StrBytes>) -> MetadataResponseTopic {
    let mut topic = MetadataResponseTopic::default();
    match name {
        Some(name) if *name == *state.config.topic => {
            topic.partitions = (0..state.config.partitions)
                .map(|index| {
                    let mut partition = MetadataResponsePartition::default();
                    partition.partition_index = index as i32;
                    partition.leader_id = BrokerId(0);
                    partition.leader_epoch = 0;
                    partition.replica_nodes = vec![BrokerId(0)];
                    partition.isr_nodes = vec![BrokerId(0)];
                    partition
                })
                .collect();
            topic.name = Some(TopicName(name));
        }
        other => {
            topic.error_code = ResponseError::UnknownTopicOrPartition.code();
            topic.name = other.map(TopicName);
        }
    }
    topic
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::protocol::Encodable;

    fn encoded(topics: Option<usize>, version: i16) -> Vec<u8> {
        let mut request = MetadataRequest::default();
        request.topics = topics.map(|n| {
            let mut topic = MetadataRequestTopic::default();
            topic.name = Some(TopicName(StrBytes::from_static_str("demo")));
            vec![topic; n]
        });
        let mut out = bytes::BytesMut::new();
        request.encode(&mut out, version).unwrap();
        out.to_vec()
    }

    #[test]
    fn the_announced_topic_count_is_read_before_decoding() {
        for version in 0..=9 {
            for n in [0, 1, 200, 20_000] {
                let body = encoded(Some(n), version);
                assert_eq!(announced_topics(&body, version), Some(n), "v{version} {n}");
            }
            if version >= 1 {
                assert_eq!(announced_topics(&encoded(None, version), version), None);
            }
        }
        assert_eq!(announced_topics(&[0, 0], 3), None);
        assert_eq!(announced_topics(&[0x80, 0x80], 9), None);
    }
}
