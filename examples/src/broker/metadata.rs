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
