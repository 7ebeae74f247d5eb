//! The `broker` binary as a process of its own, where what is measured must not mix with
//! the test's own memory: the counters it prints when stopped, and its peak memory under
//! requests whose answers used to be far larger than they are (issue #14). Loopback only;
//! every wait is bounded, and the child is killed if a test fails.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use purgatory_examples::load::process_usage;
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::requests;
use tokio::time::timeout;

mod support;
use support::process::BrokerProcess;
use support::{connect, LIMIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_counters_are_printed_after_shutdown_expired_what_waited() {
    const WAITING: usize = 3;
    let broker = BrokerProcess::start(&[]);
    let mut clients = Vec::with_capacity(WAITING);
    for _ in 0..WAITING {
        let mut client = connect(broker.addr).await;
        client
            .send(4, &requests::fetch("demo", 0, 0, 1, 60_000))
            .await
            .unwrap();
        clients.push(client);
    }
    // A request on each connection is read before the next; a metadata call after the
    // polls, on a connection of its own, is no proof they are parked: give them a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let printed = tokio::task::spawn_blocking(move || broker.interrupt())
        .await
        .unwrap();
    assert!(
        printed.contains("fetch purgatory 0 completed / 0 expired / 3 expired at shutdown"),
        "{printed}"
    );
    drop(clients);
}

/// Peak resident memory the broker gained, MiB, since `before`.
fn peak_growth_mib(broker: &BrokerProcess, before: process_usage::ProcessUsage) -> u64 {
    let after = process_usage::read(broker.pid()).unwrap();
    after.peak_rss_kib.saturating_sub(before.peak_rss_kib) / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_naming_one_partition_4000_times_leaves_the_broker_memory_flat() {
    let broker = BrokerProcess::start(&[]);
    let mut client = connect(broker.addr).await;
    // 256 KiB of committed data in partition 0.
    let value = Bytes::from(vec![b'x'; 64 * 1024]);
    for _ in 0..4 {
        let produce = requests::produce(
            "demo",
            0,
            1,
            1000,
            encode_batch(std::slice::from_ref(&value), 1_000),
        );
        client.call(7, &produce).await.unwrap();
    }
    let before = process_usage::read(broker.pid()).unwrap();
    // A 64 KB fetch naming partition 0 4,000 times, asking for 2 GiB: one partition's
    // worth comes back (it was 4,000 copies, 1 GB, and a 1.56 GB peak).
    let mut fetch = requests::fetch("demo", 0, 0, 1, 0);
    fetch.max_bytes = i32::MAX;
    let mut wanted = FetchPartition::default();
    wanted.partition_max_bytes = i32::MAX;
    fetch.topics[0].partitions = vec![wanted; 4000];
    let answer = timeout(LIMIT, client.call(4, &fetch))
        .await
        .unwrap()
        .unwrap();
    let records = answer.responses[0].partitions[0].records.as_ref().unwrap();
    assert_eq!(answer.responses[0].partitions.len(), 1);
    assert!(records.len() >= 4 * value.len() && records.len() < 5 * value.len());
    let grown = peak_growth_mib(&broker, before);
    assert!(grown < 32, "the peak grew by {grown} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_request_naming_the_topic_a_million_times_is_refused_cheaply() {
    let broker = BrokerProcess::start(&[]);
    let before = process_usage::read(broker.pid()).unwrap();
    // 6 MB naming the topic 1,000,000 times: over the cap, refused before decoding (it was
    // answered with a million topics, a 490 MB peak and 274 MB left resident).
    let mut topic = MetadataRequestTopic::default();
    topic.name = Some(TopicName(StrBytes::from_static_str("demo")));
    let mut metadata = MetadataRequest::default();
    metadata.topics = Some(vec![topic; 1_000_000]);
    let mut client = connect(broker.addr).await;
    client.send(1, &metadata).await.unwrap();
    let closed = timeout(LIMIT, client.read_raw()).await.unwrap();
    let answered = closed
        .as_ref()
        .ok()
        .and_then(|frame| frame.as_ref().map(Bytes::len));
    assert!(answered.is_none(), "answered with {answered:?} bytes");
    let grown = peak_growth_mib(&broker, before);
    assert!(grown < 32, "the peak grew by {grown} MiB");
    // The broker still serves.
    let mut client = connect(broker.addr).await;
    let answer = client.call(1, &MetadataRequest::default()).await.unwrap();
    assert_eq!(answer.brokers.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_of_an_8_mib_batch_share_the_log_bytes() {
    const READERS: usize = 20;
    let broker = BrokerProcess::start(&[]);
    let mut producer = connect(broker.addr).await;
    let batch = encode_batch(&[Bytes::from(vec![b'x'; 8 << 20])], 1_000);
    let produced = producer
        .call(7, &requests::produce("demo", 0, 1, 1000, batch))
        .await
        .unwrap();
    assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);
    drop(producer);
    // Let the produce's own buffers go back before the baseline.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = process_usage::read(broker.pid()).unwrap();
    // 20 clients each ask for 1 byte (the first batch comes whole, 8 MiB) and read
    // nothing: each answer waits in the broker until the write timeout (30 s by default).
    let mut readers = Vec::with_capacity(READERS);
    for _ in 0..READERS {
        let mut client = connect(broker.addr).await;
        let mut fetch = requests::fetch("demo", 0, 0, 1, 0);
        fetch.max_bytes = 1;
        fetch.topics[0].partitions[0].partition_max_bytes = 1;
        client.send(4, &fetch).await.unwrap();
        readers.push(client);
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = process_usage::read(broker.pid()).unwrap();
    let grown = after.rss_kib.saturating_sub(before.rss_kib) / 1024;
    // Copies would be 20 x 8 MiB = 160 MiB.
    assert!(
        grown < 40,
        "{READERS} unread 8 MiB answers grew the RSS by {grown} MiB"
    );
    drop(readers);
}
