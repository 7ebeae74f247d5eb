//! The broker against hostile or careless clients (issue #14): clients that leave while
//! their request waits in a purgatory, idle connections, requests stalled half-way,
//! connections beyond the cap, and requests whose answer would be far larger than they
//! are. Raw frames through the wire client over 127.0.0.1; every wait is bounded and every
//! loop counted.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{FetchRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use purgatory_examples::broker::BrokerConfig;
use purgatory_examples::followers::FollowerConfig;
use purgatory_examples::huge_allocations::HugeAllocationsMappedLazily;
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::{requests, WireClient};
use tokio::time::timeout;

mod support;
use support::{config, connect, eventually, start, LIMIT};

#[global_allocator]
static ALLOCATOR: HugeAllocationsMappedLazily = HugeAllocationsMappedLazily;

/// The longest a waiting request may outlive its client (the "within a second").
const CLOSED_WITHIN: Duration = Duration::from_secs(1);

fn batch(value: &[u8]) -> Bytes {
    encode_batch(&[Bytes::copy_from_slice(value)], 1_000)
}

/// Whether the broker closes `client`'s connection within `within` (an answer or silence
/// is not a close).
async fn closed_by_broker(client: &mut WireClient, within: Duration) -> bool {
    matches!(
        timeout(within, client.read_raw()).await,
        Ok(Ok(None) | Err(_))
    )
}

/// A fetch of `entries` partitions of the topic "demo", from `offset` each.
fn fetch_of(entries: &[i32], offset: i64, max_wait_ms: i32) -> FetchRequest {
    let mut request = requests::fetch("demo", 0, offset, 1, max_wait_ms);
    request.max_bytes = i32::MAX;
    request.topics[0].partitions = entries
        .iter()
        .map(|&index| {
            let mut wanted = FetchPartition::default();
            wanted.partition = index;
            wanted.fetch_offset = offset;
            wanted.partition_max_bytes = i32::MAX;
            wanted
        })
        .collect();
    request
}

/// A Metadata request naming `topic` `times` times.
fn metadata_naming(topic: &'static str, times: usize) -> MetadataRequest {
    let mut wanted = MetadataRequestTopic::default();
    wanted.name = Some(TopicName(StrBytes::from_static_str(topic)));
    let mut request = MetadataRequest::default();
    request.topics = Some(vec![wanted; times]);
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_whose_clients_left_are_cancelled_and_their_sockets_closed() {
    const CLIENTS: usize = 50;
    let broker = start(config(2)).await;
    let mut clients = Vec::with_capacity(CLIENTS);
    for i in 0..CLIENTS {
        let mut client = connect(broker.local_addr()).await;
        if i % 2 == 0 {
            // Half of them leave with a reset rather than a clean close.
            client.reset_on_drop().unwrap();
        }
        // The longest wait a client may ask for: 2^31-1 ms, 24.8 days.
        let poll = requests::fetch("demo", 0, 0, 1, i32::MAX);
        client.send(4, &poll).await.unwrap();
        clients.push(client);
    }
    eventually("every poll parked", || {
        broker.stats().leader.fetch.pending == CLIENTS
    })
    .await;
    assert_eq!(broker.stats().connections, CLIENTS);

    drop(clients);
    let took = eventually("sockets closed and polls cancelled", || {
        let stats = broker.stats();
        stats.connections == 0 && stats.leader.fetch.pending == 0
    })
    .await;
    assert!(took < CLOSED_WITHIN, "clients left {took:?} ago");
    let fetch = broker.stats().leader.fetch;
    assert_eq!(fetch.cancelled, CLIENTS as u64);
    assert_eq!((fetch.completed, fetch.expired), (0, 0));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_produces_whose_clients_left_are_cancelled_but_stay_appended() {
    const CLIENTS: usize = 20;
    let broker = start(BrokerConfig {
        followers: FollowerConfig {
            count: 2,
            lag: Duration::ZERO,
            stalled: true,
        },
        ..config(2)
    })
    .await;
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut client = connect(broker.local_addr()).await;
        let produce = requests::produce("demo", 0, -1, i32::MAX, batch(b"left"));
        client.send(7, &produce).await.unwrap();
        clients.push(client);
    }
    eventually("every produce parked", || {
        broker.stats().leader.produce.pending == CLIENTS
    })
    .await;

    drop(clients);
    let took = eventually("sockets closed and produces cancelled", || {
        let stats = broker.stats();
        stats.connections == 0 && stats.leader.produce.pending == 0
    })
    .await;
    assert!(took < CLOSED_WITHIN, "clients left {took:?} ago");
    assert_eq!(broker.stats().leader.produce.cancelled, CLIENTS as u64);

    // Only the answers were dropped: the next append comes after the 20 records.
    let mut client = connect(broker.local_addr()).await;
    let produce = requests::produce("demo", 0, 1, 1000, batch(b"after"));
    let answer = timeout(LIMIT, client.call(7, &produce))
        .await
        .unwrap()
        .unwrap();
    let partition = &answer.responses[0].partition_responses[0];
    assert_eq!(partition.error_code, 0);
    assert_eq!(partition.base_offset, CLIENTS as i64);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_but_waiting_requests_are_not_idle() {
    let broker = start(BrokerConfig {
        connections_max_idle: Duration::from_millis(300),
        ..config(2)
    })
    .await;
    let mut idle = connect(broker.local_addr()).await;
    let mut waiting = connect(broker.local_addr()).await;
    let poll = requests::fetch("demo", 0, 0, 1, 1200);
    let sent = Instant::now();
    waiting.send(4, &poll).await.unwrap();

    assert!(
        closed_by_broker(&mut idle, Duration::from_secs(3)).await,
        "an idle connection was left open"
    );
    // The poll waits 1.2 s, four times the idle timeout, and is answered.
    let answer = timeout(LIMIT, waiting.receive::<FetchRequest>())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.responses[0].partitions[0].error_code, 0);
    assert!(sent.elapsed() >= Duration::from_millis(1100));
    // Then it is idle too.
    assert!(closed_by_broker(&mut waiting, Duration::from_secs(3)).await);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_stalled_inside_a_request_are_closed() {
    const CLIENTS: usize = 50;
    let broker = start(BrokerConfig {
        frame_read_timeout: Duration::from_millis(300),
        ..config(2)
    })
    .await;
    let mut clients = Vec::with_capacity(CLIENTS);
    for i in 0..CLIENTS {
        let mut client = connect(broker.local_addr()).await;
        // Half a frame: a size announcing 100 bytes and 10 of them (or 2 size bytes).
        let mut half = 100i32.to_be_bytes().to_vec();
        half.extend_from_slice(&[0u8; 10]);
        let sent = if i % 10 == 0 { &half[..2] } else { &half[..] };
        client.send_raw(sent).await.unwrap();
        clients.push(client);
    }
    let started = Instant::now();
    for client in &mut clients {
        let left = LIMIT.saturating_sub(started.elapsed());
        assert!(
            closed_by_broker(client, left).await,
            "a half-sent request kept its connection"
        );
    }
    eventually("no connection left", || broker.stats().connections == 0).await;
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_at_once() {
    const CAP: usize = 5;
    // A follower that never copies: an acks=all produce waits (for --max-produce-wait-ms).
    let broker = start(BrokerConfig {
        max_connections: CAP,
        followers: FollowerConfig {
            count: 1,
            lag: Duration::ZERO,
            stalled: true,
        },
        ..config(2)
    })
    .await;
    // Each client from its own loopback address: by default one address may hold only half
    // of the places (`--max-connections-per-ip`, tests/broker_limits.rs).
    let from = |last: usize| {
        let source = std::net::IpAddr::from([127, 0, 0, last as u8]);
        WireClient::connect_from(source, broker.local_addr())
    };
    let mut admitted = Vec::with_capacity(CAP);
    for i in 0..CAP {
        let mut client = timeout(LIMIT, from(2 + i)).await.unwrap().unwrap();
        let answer = timeout(LIMIT, client.call(1, &MetadataRequest::default())).await;
        assert!(answer.unwrap().is_ok());
        // A waiting acks=all produce: the connection is busy, so no newcomer may evict it
        // (an idle one, or a long poll waiting a second, would make room:
        // tests/broker_limits.rs).
        let produce = requests::produce("demo", 0, -1, 60_000, batch(b"waits"));
        client.send(7, &produce).await.unwrap();
        admitted.push(client);
    }
    eventually("the produces parked", || {
        broker.stats().leader.produce.pending == CAP
    })
    .await;
    let mut refused = timeout(LIMIT, from(2 + CAP)).await.unwrap().unwrap();
    assert!(
        closed_by_broker(&mut refused, Duration::from_secs(2)).await,
        "a connection beyond the cap was kept"
    );
    assert_eq!(broker.stats().connections, CAP);

    // A place freed is a place for a new client.
    drop(admitted.pop());
    eventually("the freed place", || broker.stats().connections == CAP - 1).await;
    let mut client = timeout(LIMIT, from(3 + CAP)).await.unwrap().unwrap();
    let answer = timeout(LIMIT, client.call(1, &MetadataRequest::default())).await;
    assert_eq!(answer.unwrap().unwrap().brokers.len(), 1);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_named_thousands_of_times_is_answered_once() {
    let broker = start(config(2)).await;
    let mut client = connect(broker.local_addr()).await;
    for value in [&b"one"[..], b"two", b"three"] {
        let produce = requests::produce("demo", 0, 1, 1000, batch(value));
        client.call(7, &produce).await.unwrap();
    }
    let whole_log = client
        .call(4, &requests::fetch("demo", 0, 0, 1, 0))
        .await
        .unwrap()
        .responses[0]
        .partitions[0]
        .records
        .clone()
        .unwrap();

    // 4,000 mentions of partition 0 (a 64 KB request): one answer of the log, once.
    let answer = timeout(LIMIT, client.call(4, &fetch_of(&[0; 4000], 0, 0)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.responses.len(), 1);
    assert_eq!(answer.responses[0].partitions.len(), 1);
    assert_eq!(answer.responses[0].partitions[0].records, Some(whole_log));

    // Split over two topic entries: one topic entry answered; partition 0 at its first
    // place, from its last mention's offset (as Kafka's request map does).
    let mut split = fetch_of(&[0, 1], 0, 0);
    let mut again = split.topics[0].clone();
    again.partitions.truncate(1);
    again.partitions[0].fetch_offset = 2;
    split.topics.push(again);
    let answer = client.call(12, &split).await.unwrap();
    assert_eq!(answer.responses.len(), 1);
    let partitions = &answer.responses[0].partitions;
    let indexes: Vec<i32> = partitions.iter().map(|p| p.partition_index).collect();
    assert_eq!(indexes, vec![0, 1]);
    let from_two = client
        .call(4, &requests::fetch("demo", 0, 2, 1, 0))
        .await
        .unwrap();
    assert_eq!(
        partitions[0].records,
        from_two.responses[0].partitions[0].records
    );

    // Parked with 5,000 mentions: one wait, answered once by an append.
    let mut poller = connect(broker.local_addr()).await;
    poller
        .send(4, &fetch_of(&[0; 5000], 3, 10_000))
        .await
        .unwrap();
    eventually("the poll parked", || {
        broker.stats().leader.fetch.pending == 1
    })
    .await;
    let produce = requests::produce("demo", 0, 1, 1000, batch(b"four"));
    client.call(7, &produce).await.unwrap();
    let answer = timeout(LIMIT, poller.receive::<FetchRequest>())
        .await
        .unwrap()
        .unwrap();
    let fourth = client
        .call(4, &requests::fetch("demo", 0, 3, 1, 0))
        .await
        .unwrap();
    assert_eq!(answer.responses[0].partitions.len(), 1);
    assert_eq!(
        answer.responses[0].partitions[0].records,
        fourth.responses[0].partitions[0].records
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_answers_stay_within_the_broker_cap() {
    const CAP: usize = 64 * 1024;
    let broker = start(BrokerConfig {
        fetch_max_bytes: CAP,
        ..config(2)
    })
    .await;
    let mut client = connect(broker.local_addr()).await;
    let value = vec![b'x'; 20_000];
    for _ in 0..6 {
        let produce = requests::produce("demo", 0, 1, 1000, batch(&value));
        client.call(7, &produce).await.unwrap();
    }
    // The client asks for 2 GiB; the broker sends at most its cap.
    let answer = client.call(4, &fetch_of(&[0], 0, 0)).await.unwrap();
    let records = answer.responses[0].partitions[0].records.clone().unwrap();
    assert!(
        (20_000..=CAP).contains(&records.len()),
        "{} bytes",
        records.len()
    );
    // A batch larger than the cap is still sent whole, alone (KIP-74).
    let big = vec![b'y'; 2 * CAP];
    let produce = requests::produce("demo", 1, 1, 1000, batch(&big));
    client.call(7, &produce).await.unwrap();
    let answer = client.call(4, &fetch_of(&[1, 0], 0, 0)).await.unwrap();
    let partitions = &answer.responses[0].partitions;
    assert!(partitions[0].records.as_ref().unwrap().len() > 2 * CAP);
    assert!(partitions[1].records.as_ref().unwrap().is_empty());
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_naming_too_many_partitions_close_the_connection() {
    const CAP: usize = 100;
    let broker = start(BrokerConfig {
        max_partitions_per_request: CAP,
        ..config(2)
    })
    .await;
    let addr = broker.local_addr();

    let mut client = connect(addr).await;
    client
        .send(4, &fetch_of(&[0; CAP + 1], 0, 0))
        .await
        .unwrap();
    assert!(closed_by_broker(&mut client, LIMIT).await, "Fetch");

    for version in [1, 9] {
        let mut client = connect(addr).await;
        client
            .send(version, &metadata_naming("demo", CAP + 1))
            .await
            .unwrap();
        assert!(
            closed_by_broker(&mut client, LIMIT).await,
            "Metadata v{version}"
        );
    }

    let mut list = requests::list_offsets("demo", 0, -1);
    let one = list.topics[0].partitions[0].clone();
    list.topics[0].partitions = vec![one; CAP + 1];
    let mut client = connect(addr).await;
    client.send(1, &list).await.unwrap();
    assert!(closed_by_broker(&mut client, LIMIT).await, "ListOffsets");

    let mut produce = requests::produce("demo", 0, 1, 1000, batch(b"x"));
    let one = produce.topic_data[0].partition_data[0].clone();
    produce.topic_data[0].partition_data = vec![one; CAP + 1];
    let mut client = connect(addr).await;
    client.send(7, &produce).await.unwrap();
    assert!(closed_by_broker(&mut client, LIMIT).await, "Produce");

    // At the cap: answered, and a topic named 100 times is answered once.
    let mut client = connect(addr).await;
    for version in [1, 9] {
        let answer = client
            .call(version, &metadata_naming("demo", CAP))
            .await
            .unwrap();
        assert_eq!(answer.topics.len(), 1, "Metadata v{version}");
    }
    broker.shutdown().await;
}
