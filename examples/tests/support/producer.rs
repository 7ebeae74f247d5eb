//! What a producer client of the broker suites sends, each call within [`LIMIT`].

use bytes::Bytes;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};
use purgatory_examples::wire_client::{requests, WireClient};
use tokio::time::timeout;

use super::LIMIT;

/// Produces `records` (acks=1) and returns the partition's error code and base offset.
pub async fn produce(client: &mut WireClient, version: i16, records: Bytes) -> (i16, i64) {
    let answer = timeout(
        LIMIT,
        client.call(version, &requests::produce("demo", 0, 1, 1000, records)),
    )
    .await
    .unwrap()
    .unwrap();
    let partition = &answer.responses[0].partition_responses[0];
    (partition.error_code, partition.base_offset)
}

/// InitProducerId (v4, no transactional id) on `client`: its answer, which must not be an
/// error.
pub async fn init_producer_id_answer(client: &mut WireClient) -> InitProducerIdResponse {
    let mut request = InitProducerIdRequest::default();
    request.transactional_id = None;
    let answer = timeout(LIMIT, client.call(4, &request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.error_code, 0);
    answer
}

/// A fresh producer id from InitProducerId (v4, no transactional id).
pub async fn init_producer_id(client: &mut WireClient) -> i64 {
    init_producer_id_answer(client).await.producer_id.0
}
