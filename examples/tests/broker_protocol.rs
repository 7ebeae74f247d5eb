//! The broker at the wire level (raw `kafka-protocol` requests): version negotiation, error
//! codes, ordering on a connection, many waiting connections, and bad input that must close
//! only its own connection. Every wait is bounded.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, FetchRequest, InitProducerIdRequest,
    ListOffsetsRequest, MetadataRequest, ProduceRequest, ResponseHeader,
};
use kafka_protocol::protocol::Decodable;
use kafka_protocol::ResponseError;
use purgatory_examples::broker::{Broker, BrokerConfig};
use purgatory_examples::followers::FollowerConfig;
use purgatory_examples::huge_allocations::HugeAllocationsMappedLazily;
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::{requests, WireClient};
use tokio::time::timeout;

#[global_allocator]
static ALLOCATOR: HugeAllocationsMappedLazily = HugeAllocationsMappedLazily;

const LIMIT: Duration = Duration::from_secs(20);

async fn start(followers: usize, max_frame_bytes: usize) -> Broker {
    Broker::start(BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        partitions: 2,
        followers: FollowerConfig {
            count: followers,
            lag: Duration::from_millis(20),
            stalled: false,
        },
        max_frame_bytes,
        ..BrokerConfig::default()
    })
    .await
    .unwrap()
}

async fn connect(addr: SocketAddr) -> WireClient {
    timeout(LIMIT, WireClient::connect(addr))
        .await
        .unwrap()
        .unwrap()
}

fn batch(values: &[&str]) -> Bytes {
    let values: Vec<Bytes> = values.iter().map(|v| Bytes::from(v.to_string())).collect();
    encode_batch(&values, 1_000)
}

/// Sends `bytes` on a fresh connection and tells whether the broker closed it without a word.
async fn closes_connection(addr: SocketAddr, bytes: &[u8]) -> bool {
    let mut client = connect(addr).await;
    client.send_raw(bytes).await.unwrap();
    matches!(
        timeout(LIMIT, client.read_raw()).await,
        Ok(Ok(None) | Err(_))
    )
}

/// The broker still answers a fresh connection.
async fn still_serves(addr: SocketAddr) {
    let mut client = connect(addr).await;
    let metadata = timeout(LIMIT, client.call(1, &MetadataRequest::default()))
        .await
        .expect("metadata timed out")
        .expect("metadata failed");
    assert_eq!(metadata.brokers.len(), 1);
}

fn frame(api_key: i16, version: i16, body: &[u8]) -> Vec<u8> {
    // Header v1: key, version, correlation id, null client id.
    let mut payload = Vec::new();
    payload.extend_from_slice(&api_key.to_be_bytes());
    payload.extend_from_slice(&version.to_be_bytes());
    payload.extend_from_slice(&7i32.to_be_bytes());
    payload.extend_from_slice(&(-1i16).to_be_bytes());
    payload.extend_from_slice(body);
    let mut out = (payload.len() as i32).to_be_bytes().to_vec();
    out.extend(payload);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_versions_advertises_only_what_is_implemented() {
    let broker = start(0, 1 << 20).await;
    let mut client = connect(broker.local_addr()).await;
    let response = client
        .call(3, &ApiVersionsRequest::default())
        .await
        .unwrap();
    assert_eq!(response.error_code, 0);
    let mut keys: Vec<i16> = response.api_keys.iter().map(|k| k.api_key).collect();
    keys.sort_unstable();
    assert_eq!(keys, vec![0, 1, 2, 3, 18, 22]);
    let fetch = response.api_keys.iter().find(|k| k.api_key == 1).unwrap();
    assert!(fetch.min_version <= 4 && fetch.max_version < 13);

    // A too-new ApiVersions gets UNSUPPORTED_VERSION in a v0 answer, and the list.
    let mut raw = connect(broker.local_addr()).await;
    raw.send_raw(&frame(ApiKey::ApiVersions as i16, 99, &[]))
        .await
        .unwrap();
    let mut answer = timeout(LIMIT, raw.read_raw())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let header = ResponseHeader::decode(&mut answer, 0).unwrap();
    assert_eq!(header.correlation_id, 7);
    let body = ApiVersionsResponse::decode(&mut answer, 0).unwrap();
    assert_eq!(body.error_code, ResponseError::UnsupportedVersion.code());
    assert_eq!(body.api_keys.len(), keys.len());
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topics_partitions_and_offsets_get_their_error_codes() {
    let broker = start(0, 1 << 20).await;
    let mut client = connect(broker.local_addr()).await;

    let produce = requests::produce("nope", 0, 1, 1000, batch(&["x"]));
    let answer = client.call(7, &produce).await.unwrap();
    let code = answer.responses[0].partition_responses[0].error_code;
    assert_eq!(code, ResponseError::UnknownTopicOrPartition.code());

    let produce = requests::produce("demo", 5, 1, 1000, batch(&["x"]));
    let answer = client.call(7, &produce).await.unwrap();
    let code = answer.responses[0].partition_responses[0].error_code;
    assert_eq!(code, ResponseError::UnknownTopicOrPartition.code());

    let corrupt = requests::produce("demo", 0, 1, 1000, Bytes::from_static(b"not a batch"));
    let answer = client.call(7, &corrupt).await.unwrap();
    let code = answer.responses[0].partition_responses[0].error_code;
    assert_eq!(code, ResponseError::CorruptMessage.code());

    let bad_acks = requests::produce("demo", 0, 2, 1000, batch(&["x"]));
    let answer = client.call(7, &bad_acks).await.unwrap();
    let code = answer.responses[0].partition_responses[0].error_code;
    assert_eq!(code, ResponseError::InvalidRequiredAcks.code());

    let fetch = requests::fetch("demo", 9, 0, 1, 5000);
    let answer = timeout(LIMIT, client.call(4, &fetch))
        .await
        .unwrap()
        .unwrap();
    let code = answer.responses[0].partitions[0].error_code;
    assert_eq!(code, ResponseError::UnknownTopicOrPartition.code());

    let beyond = requests::fetch("demo", 0, 50, 1, 5000);
    let answer = timeout(LIMIT, client.call(12, &beyond))
        .await
        .unwrap()
        .unwrap();
    let code = answer.responses[0].partitions[0].error_code;
    assert_eq!(code, ResponseError::OffsetOutOfRange.code());

    let mut metadata = MetadataRequest::default();
    let mut wanted = kafka_protocol::messages::metadata_request::MetadataRequestTopic::default();
    wanted.name = Some(kafka_protocol::messages::TopicName(
        "nope".to_string().into(),
    ));
    metadata.topics = Some(vec![wanted]);
    let answer = client.call(9, &metadata).await.unwrap();
    assert_eq!(
        answer.topics[0].error_code,
        ResponseError::UnknownTopicOrPartition.code()
    );

    let list = requests::list_offsets("nope", 0, -1);
    let answer = client.call(6, &list).await.unwrap();
    let code = answer.topics[0].partitions[0].error_code;
    assert_eq!(code, ResponseError::UnknownTopicOrPartition.code());
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_advertised_version_round_trips() {
    let broker = start(0, 1 << 20).await;
    let mut client = connect(broker.local_addr()).await;
    for version in 0..=3 {
        let answer = client
            .call(version, &ApiVersionsRequest::default())
            .await
            .unwrap();
        assert_eq!(answer.error_code, 0, "ApiVersions v{version}");
    }
    for version in 0..=9 {
        let mut request = MetadataRequest::default();
        if version >= 1 {
            request.topics = None;
        } else {
            request.topics = Some(Vec::new());
        }
        let answer = client.call(version, &request).await.unwrap();
        assert_eq!(answer.topics.len(), 1, "Metadata v{version}");
        assert_eq!(answer.topics[0].partitions.len(), 2);
    }
    for version in 0..=4 {
        let mut request = InitProducerIdRequest::default();
        request.transactional_id = None;
        let answer = client.call(version, &request).await.unwrap();
        assert_eq!(answer.error_code, 0, "InitProducerId v{version}");
        assert!(answer.producer_id.0 >= 0);
    }
    let mut offset = 0;
    for version in 3..=9 {
        let request = requests::produce("demo", 1, 1, 1000, batch(&["v"]));
        let answer = client.call(version, &request).await.unwrap();
        let partition = &answer.responses[0].partition_responses[0];
        assert_eq!(partition.error_code, 0, "Produce v{version}");
        assert_eq!(partition.base_offset, offset);
        offset += 1;
    }
    for version in 4..=12 {
        let request = requests::fetch("demo", 1, 0, 1, 1000);
        let answer = client.call(version, &request).await.unwrap();
        let partition = &answer.responses[0].partitions[0];
        assert_eq!(partition.error_code, 0, "Fetch v{version}");
        assert_eq!(partition.high_watermark, offset);
        assert!(!partition.records.as_ref().unwrap().is_empty());
    }
    for version in 1..=6 {
        let answer = client
            .call(version, &requests::list_offsets("demo", 1, -1))
            .await
            .unwrap();
        assert_eq!(
            answer.topics[0].partitions[0].offset, offset,
            "ListOffsets v{version}"
        );
        let answer = client
            .call(version, &requests::list_offsets("demo", 1, -2))
            .await
            .unwrap();
        assert_eq!(answer.topics[0].partitions[0].offset, 0);
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_on_a_connection_keep_the_request_order() {
    let broker = start(0, 1 << 20).await;
    let mut client = connect(broker.local_addr()).await;
    // A long poll that will expire, then a metadata request behind it, pipelined.
    client
        .send(4, &requests::fetch("demo", 0, 0, 1, 300))
        .await
        .unwrap();
    let mut all_topics = MetadataRequest::default();
    all_topics.topics = None;
    client.send(1, &all_topics).await.unwrap();
    // An acks=0 produce is never answered: the next answer belongs to the next request.
    client
        .send(
            3,
            &requests::produce("demo", 0, 0, 1000, batch(&["silent"])),
        )
        .await
        .unwrap();
    client
        .send(1, &requests::list_offsets("demo", 0, -1))
        .await
        .unwrap();

    let started = Instant::now();
    let fetched = timeout(LIMIT, client.receive::<FetchRequest>())
        .await
        .unwrap()
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(fetched.responses[0].partitions[0]
        .records
        .as_ref()
        .unwrap()
        .is_empty());
    let metadata = timeout(LIMIT, client.receive::<MetadataRequest>())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(metadata.topics.len(), 1);
    // The WireClient expects an answer per request sent; skip the acks=0 produce.
    let mut raw_answer = timeout(LIMIT, client.read_raw())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let header = ResponseHeader::decode(&mut raw_answer, 0).unwrap();
    assert_eq!(
        header.correlation_id, 4,
        "the list-offsets answer comes right after metadata"
    );
    let list = kafka_protocol::messages::ListOffsetsResponse::decode(&mut raw_answer, 1).unwrap();
    assert_eq!(
        list.topics[0].partitions[0].offset, 1,
        "the acks=0 produce was appended: {list:?}"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_wait_at_once_and_one_append_answers_them_all() {
    const WAITING: usize = 300;
    let broker = start(0, 1 << 20).await;
    let addr = broker.local_addr();
    let mut waiting = Vec::with_capacity(WAITING);
    for _ in 0..WAITING {
        let mut client = connect(addr).await;
        client
            .send(4, &requests::fetch("demo", 0, 0, 1, 30_000))
            .await
            .unwrap();
        waiting.push(client);
    }
    // Every poll is parked in the purgatory (none was answered: there is no data).
    let deadline = Instant::now() + LIMIT;
    while broker.stats().leader.fetch.pending < WAITING && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(broker.stats().leader.fetch.pending, WAITING);

    let mut producer = connect(addr).await;
    let produced_at = Instant::now();
    producer
        .call(3, &requests::produce("demo", 0, 1, 1000, batch(&["all"])))
        .await
        .unwrap();
    let answers = waiting
        .into_iter()
        .map(|mut client| tokio::spawn(async move { client.receive::<FetchRequest>().await }));
    for answer in answers {
        let answer = timeout(LIMIT, answer).await.unwrap().unwrap().unwrap();
        assert!(!answer.responses[0].partitions[0]
            .records
            .as_ref()
            .unwrap()
            .is_empty());
    }
    assert!(
        produced_at.elapsed() < Duration::from_secs(15),
        "long polls answered at max_wait"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_closes_only_its_own_connection() {
    let broker = start(0, 64 * 1024).await;
    let addr = broker.local_addr();
    // A connection that waits through all of it and must still be answered.
    let mut bystander = connect(addr).await;
    bystander
        .send(4, &requests::fetch("demo", 0, 0, 1, 30_000))
        .await
        .unwrap();

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("negative frame size", (-5i32).to_be_bytes().to_vec()),
        ("oversize frame", (1i32 << 20).to_be_bytes().to_vec()),
        ("frame shorter than a header", vec![0, 0, 0, 2, 0, 3]),
        ("unknown API key", frame(999, 0, &[])),
        (
            "API not implemented",
            frame(ApiKey::OffsetCommit as i16, 2, &[]),
        ),
        (
            "Fetch version with topic ids",
            frame(ApiKey::Fetch as i16, 13, &[]),
        ),
        (
            "truncated Produce body",
            frame(ApiKey::Produce as i16, 3, &[0, 0]),
        ),
        (
            "Metadata announcing 2^31 topics",
            frame(ApiKey::Metadata as i16, 0, &i32::MAX.to_be_bytes()),
        ),
        (
            "Fetch announcing 2^31 topics",
            frame(
                ApiKey::Fetch as i16,
                4,
                &[&[0xff; 4][..], &[0; 13], &i32::MAX.to_be_bytes()].concat(),
            ),
        ),
        (
            "Produce announcing 2^31 topics",
            frame(
                ApiKey::Produce as i16,
                3,
                &[&[0xff, 0xff, 0, 1, 0, 0, 0, 1][..], &i32::MAX.to_be_bytes()].concat(),
            ),
        ),
    ];
    for (name, bytes) in &cases {
        assert!(
            closes_connection(addr, bytes).await,
            "{name}: connection left open"
        );
    }

    // Random garbage after a valid prefix, for every implemented API and version.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for api in purgatory_examples::broker::api_versions::SUPPORTED {
        for version in api.min..=api.max {
            for _ in 0..8 {
                let len = (next() % 64) as usize;
                let body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                let mut client = connect(addr).await;
                client
                    .send_raw(&frame(api.key as i16, version, &body))
                    .await
                    .unwrap();
                // Either an answer or a close; never a hang, never a crash.
                let _ = timeout(LIMIT, client.read_raw())
                    .await
                    .expect("no answer nor close");
            }
        }
    }

    still_serves(addr).await;
    let mut producer = connect(addr).await;
    producer
        .call(
            3,
            &requests::produce("demo", 0, 1, 1000, batch(&["still here"])),
        )
        .await
        .unwrap();
    let answer = timeout(LIMIT, bystander.receive::<FetchRequest>())
        .await
        .unwrap()
        .unwrap();
    assert!(!answer.responses[0].partitions[0]
        .records
        .as_ref()
        .unwrap()
        .is_empty());
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_see_only_committed_data() {
    let broker = Broker::start(BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        followers: FollowerConfig {
            count: 2,
            lag: Duration::ZERO,
            stalled: true,
        },
        ..BrokerConfig::default()
    })
    .await
    .unwrap();
    let mut client = connect(broker.local_addr()).await;
    let answer = client
        .call(
            3,
            &requests::produce("demo", 0, 1, 1000, batch(&["uncommitted"])),
        )
        .await
        .unwrap();
    assert_eq!(answer.responses[0].partition_responses[0].error_code, 0);
    let fetched = client
        .call(11, &requests::fetch("demo", 0, 0, 1, 100))
        .await
        .unwrap();
    let partition = &fetched.responses[0].partitions[0];
    assert_eq!(partition.error_code, 0);
    assert_eq!(partition.high_watermark, 0);
    assert!(partition.records.as_ref().unwrap().is_empty());
    let latest = client
        .call(2, &requests::list_offsets("demo", 0, -1))
        .await
        .unwrap();
    assert_eq!(latest.topics[0].partitions[0].offset, 0);
    let _unused: Option<ProduceRequest> = None;
    let _unused: Option<ListOffsetsRequest> = None;
    broker.shutdown().await;
}
