//! What a producer client of the broker suites sends, each call within [`LIMIT`].

use bytes::Bytes;
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
