//! The broker against hostile or careless clients (issue #14): clients that leave while
//! their request waits in a purgatory, idle connections, requests stalled half-way,
//! connections beyond the cap. Raw frames through the wire client over 127.0.0.1; every wait is bounded and every
//! loop counted.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{FetchRequest, MetadataRequest};
use purgatory_examples::broker::{Broker, BrokerConfig};
use purgatory_examples::followers::FollowerConfig;
use purgatory_examples::huge_allocations::HugeAllocationsMappedLazily;
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::{requests, WireClient};
use tokio::time::timeout;

#[global_allocator]
static ALLOCATOR: HugeAllocationsMappedLazily = HugeAllocationsMappedLazily;

/// The longest any single wait of these tests may take.
const LIMIT: Duration = Duration::from_secs(10);

/// The longest a waiting request may outlive its client (the "within a second").
const CLOSED_WITHIN: Duration = Duration::from_secs(1);

/// A broker on a free loopback port, without followers unless `config` says otherwise.
fn config() -> BrokerConfig {
    BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        partitions: 2,
        followers: FollowerConfig {
            count: 0,
            lag: Duration::ZERO,
            stalled: false,
        },
        ..BrokerConfig::default()
    }
}

async fn start(config: BrokerConfig) -> Broker {
    Broker::start(config).await.unwrap()
}

async fn connect(addr: SocketAddr) -> WireClient {
    timeout(LIMIT, WireClient::connect(addr))
        .await
        .unwrap()
        .unwrap()
}

fn batch(value: &[u8]) -> Bytes {
    encode_batch(&[Bytes::copy_from_slice(value)], 1_000)
}

/// Polls `check` every 5 ms until it holds; panics after [`LIMIT`]. Returns how long it took.
async fn eventually(what: &str, check: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < LIMIT, "{what}: not within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

/// Whether the broker closes `client`'s connection within `within` (an answer or silence
/// is not a close).
async fn closed_by_broker(client: &mut WireClient, within: Duration) -> bool {
    matches!(
        timeout(within, client.read_raw()).await,
        Ok(Ok(None) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_whose_clients_left_are_cancelled_and_their_sockets_closed() {
    const CLIENTS: usize = 50;
    let broker = start(config()).await;
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
        ..config()
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
        ..config()
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
        ..config()
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
    let broker = start(BrokerConfig {
        max_connections: CAP,
        ..config()
    })
    .await;
    let mut admitted = Vec::with_capacity(CAP);
    for _ in 0..CAP {
        let mut client = connect(broker.local_addr()).await;
        let answer = timeout(LIMIT, client.call(1, &MetadataRequest::default())).await;
        assert!(answer.unwrap().is_ok());
        admitted.push(client);
    }
    let mut refused = connect(broker.local_addr()).await;
    assert!(
        closed_by_broker(&mut refused, Duration::from_secs(2)).await,
        "a connection beyond the cap was kept"
    );
    assert_eq!(broker.stats().connections, CAP);

    // A place freed is a place for a new client.
    drop(admitted.pop());
    eventually("the freed place", || broker.stats().connections == CAP - 1).await;
    let mut client = connect(broker.local_addr()).await;
    let answer = timeout(LIMIT, client.call(1, &MetadataRequest::default())).await;
    assert_eq!(answer.unwrap().unwrap().brokers.len(), 1);
    broker.shutdown().await;
}
