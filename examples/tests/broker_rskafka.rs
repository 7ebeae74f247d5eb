//! End to end: the broker started in-process on an ephemeral loopback port, driven by the
//! rskafka client. Behavioural assertions with generous margins; every wait is bounded.

use std::time::{Duration, Instant};

use purgatory_examples::broker::{Broker, BrokerConfig};
use purgatory_examples::followers::FollowerConfig;
use purgatory_examples::huge_allocations::HugeAllocationsMappedLazily;
use rskafka::client::error::{Error as ClientError, ProtocolError};
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::ClientBuilder;
use rskafka::record::Record;
use tokio::time::timeout;

#[global_allocator]
static ALLOCATOR: HugeAllocationsMappedLazily = HugeAllocationsMappedLazily;

/// Upper bound on any single client call in these tests.
const CALL_LIMIT: Duration = Duration::from_secs(30);

fn config(followers: usize, delay_ms: u64, stalled: bool) -> BrokerConfig {
    BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        followers: FollowerConfig {
            count: followers,
            lag: Duration::from_millis(delay_ms),
            stalled,
        },
        ..BrokerConfig::default()
    }
}

async fn partition_client(broker: &Broker) -> PartitionClient {
    let client = timeout(
        CALL_LIMIT,
        ClientBuilder::new(vec![broker.local_addr().to_string()]).build(),
    )
    .await
    .expect("client setup timed out")
    .expect("client setup failed");
    timeout(
        CALL_LIMIT,
        client.partition_client("demo", 0, UnknownTopicHandling::Error),
    )
    .await
    .expect("partition client timed out")
    .expect("partition client failed")
}

fn record(value: &str) -> Record {
    Record {
        key: None,
        value: Some(value.as_bytes().to_vec()),
        headers: Default::default(),
        timestamp: chrono::DateTime::from_timestamp_millis(1_700_000_000_000).unwrap(),
    }
}

fn values(records: &[rskafka::record::RecordAndOffset]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.record.value.clone().unwrap_or_default()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_produce_is_answered_after_the_followers_caught_up_and_not_before() {
    let delay = Duration::from_millis(300);
    let broker = Broker::start(config(2, delay.as_millis() as u64, false))
        .await
        .unwrap();
    let partition = partition_client(&broker).await;

    let started = Instant::now();
    let offsets = timeout(
        CALL_LIMIT,
        partition.produce(
            vec![record("a"), record("b"), record("c")],
            Compression::NoCompression,
        ),
    )
    .await
    .expect("produce timed out")
    .expect("produce failed");
    let elapsed = started.elapsed();
    assert_eq!(offsets, vec![0, 1, 2]);
    assert!(
        elapsed >= delay,
        "acks=all answered after {elapsed:?}, before the followers copied"
    );

    // Once acknowledged, the records are committed: consumers see them.
    let latest = timeout(CALL_LIMIT, partition.get_offset(OffsetAt::Latest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest, 3);
    let (records, high_watermark) =
        timeout(CALL_LIMIT, partition.fetch_records(0, 1..1_000_000, 100))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(values(&records), vec!["a", "b", "c"]);
    assert_eq!(high_watermark, 3);
    let stats = broker.stats().leader.produce;
    assert_eq!((stats.completed, stats.expired), (1, 0));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_stalled_followers_acks_all_produce_is_answered_with_a_timeout() {
    // rskafka always asks for a 30 s produce timeout; the broker caps it for this test.
    let cap = Duration::from_millis(500);
    let broker = Broker::start(BrokerConfig {
        max_produce_wait: cap,
        ..config(2, 10, true)
    })
    .await
    .unwrap();
    let partition = partition_client(&broker).await;

    let started = Instant::now();
    let result = timeout(
        CALL_LIMIT,
        partition.produce(vec![record("never committed")], Compression::NoCompression),
    )
    .await
    .expect("produce was never answered");
    let elapsed = started.elapsed();
    match result {
        Err(ClientError::ServerError {
            protocol_error: ProtocolError::RequestTimedOut,
            ..
        }) => {}
        other => panic!("expected REQUEST_TIMED_OUT, got {other:?}"),
    }
    assert!(
        elapsed >= cap,
        "timed out after {elapsed:?}, before the request's timeout"
    );
    // Consumers never see uncommitted data.
    let latest = timeout(CALL_LIMIT, partition.get_offset(OffsetAt::Latest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest, 0);
    assert_eq!(broker.stats().leader.produce.expired, 1);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_on_an_empty_partition_is_answered_right_after_a_produce() {
    let max_wait = Duration::from_secs(10);
    let broker = Broker::start(config(1, 20, false)).await.unwrap();
    let consumer = partition_client(&broker).await;
    let producer = partition_client(&broker).await;

    let poll = tokio::spawn(async move {
        let (records, _) = consumer
            .fetch_records(0, 1..1_000_000, max_wait.as_millis() as i32)
            .await
            .expect("fetch failed");
        (records, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !poll.is_finished(),
        "the fetch was answered before any data existed"
    );

    let produced_at = Instant::now();
    timeout(
        CALL_LIMIT,
        producer.produce(vec![record("wake up")], Compression::NoCompression),
    )
    .await
    .unwrap()
    .unwrap();
    let (records, answered_at) = timeout(CALL_LIMIT, poll).await.unwrap().unwrap();
    let waited = answered_at.duration_since(produced_at);
    assert_eq!(values(&records), vec!["wake up"]);
    assert!(
        waited < max_wait / 2,
        "answered {waited:?} after the produce"
    );
    assert!(broker.stats().leader.fetch.completed >= 1);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_wanting_more_than_arrives_is_answered_at_max_wait() {
    let max_wait = Duration::from_millis(1500);
    let broker = Broker::start(config(0, 0, false)).await.unwrap();
    let consumer = partition_client(&broker).await;
    let producer = partition_client(&broker).await;

    let started = Instant::now();
    let poll = tokio::spawn(async move {
        let (records, _) = consumer
            .fetch_records(0, 1_000_000..2_000_000, max_wait.as_millis() as i32)
            .await
            .expect("fetch failed");
        (records, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    timeout(
        CALL_LIMIT,
        producer.produce(vec![record("small")], Compression::NoCompression),
    )
    .await
    .unwrap()
    .unwrap();
    let (records, answered_at) = timeout(CALL_LIMIT, poll).await.unwrap().unwrap();
    let waited = answered_at.duration_since(started);
    assert!(
        waited >= max_wait,
        "answered after {waited:?}, before max_wait"
    );
    assert_eq!(
        values(&records),
        vec!["small"],
        "the answer carries what arrived"
    );
    assert!(broker.stats().leader.fetch.expired >= 1);
    broker.shutdown().await;
}
