//! What the broker test suites share: a broker on a free loopback port, a client of it,
//! a bounded wait for a condition or for the broker to close a connection, and a long poll
//! nothing satisfies; in submodules, the broker binary as a child process (`process`), what
//! a producer sends (`producer`) and idempotent record batches (`records`). (Each suite
//! compiles this module on its own and uses part of it, hence the `dead_code` allowance.)
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use purgatory_examples::broker::{Broker, BrokerConfig};
use purgatory_examples::followers::FollowerConfig;
use purgatory_examples::wire_client::{requests, WireClient};
use tokio::time::timeout;

pub mod process;
pub mod producer;
pub mod records;

/// The longest any single wait of these tests may take.
pub const LIMIT: Duration = Duration::from_secs(10);

/// A broker on a free loopback port with `partitions` partitions of the topic "demo", and
/// no followers; the rest as the defaults.
pub fn config(partitions: usize) -> BrokerConfig {
    BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        partitions,
        followers: FollowerConfig {
            count: 0,
            lag: Duration::ZERO,
            stalled: false,
        },
        ..BrokerConfig::default()
    }
}

pub async fn start(config: BrokerConfig) -> Broker {
    Broker::start(config).await.unwrap()
}

/// A client connected to `addr` (within [`LIMIT`]).
pub async fn connect(addr: SocketAddr) -> WireClient {
    timeout(LIMIT, WireClient::connect(addr))
        .await
        .unwrap()
        .unwrap()
}

/// Polls `check` every 5 ms until it holds; panics after [`LIMIT`]. Returns how long it took.
pub async fn eventually(what: &str, check: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < LIMIT, "{what}: not within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

/// Whether the broker closes `client`'s connection within `within`, reading (and dropping)
/// whatever it sends first.
pub async fn closed_within(client: &mut WireClient, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut sink = vec![0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, client.read_some(&mut sink)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// `request`'s first partition entry repeated for partitions `0..partitions`, in order.
pub fn over_partitions(
    mut request: kafka_protocol::messages::FetchRequest,
    partitions: i32,
) -> kafka_protocol::messages::FetchRequest {
    let one = request.topics[0].partitions[0].clone();
    request.topics[0].partitions = (0..partitions)
        .map(|index| {
            let mut p = one.clone();
            p.partition = index;
            p
        })
        .collect();
    request
}

/// A long poll that nothing will satisfy: min_bytes and max_wait 2^31-1.
pub fn endless_poll() -> kafka_protocol::messages::FetchRequest {
    requests::fetch("demo", 0, 0, i32::MAX, i32::MAX)
}
