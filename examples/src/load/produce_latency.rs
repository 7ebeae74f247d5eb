//! Produce latency: requests of one small batch each, sent one after the other on each of
//! `connections` connections, every one timed from send to answer.
//!
//! With acks=all the answer waits for the followers, so the figure to compare across
//! purgatories is the latency minus the broker's replication delay.
//!
//! With `parked_fetches`, that many fetches are parked first, each naming the partition
//! `fetch_entries` times and asking for more bytes than will ever come (min_bytes 2^31-1,
//! max_wait 10 minutes): every append then runs their `try_complete`, and the latency
//! shows what that costs. A parked fetch the broker closed (refused), or whose whole answer
//! is there at the end of the run, fails the run; a large answer still arriving is not
//! caught by that check.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::bounded;
use super::latency_summary::LatencySummary;
use crate::record_batch::encode_batch;
use crate::wire_client::{requests, WireClient};

/// What to send.
#[derive(Debug, Clone)]
pub struct ProduceLatencyConfig {
    /// The broker.
    pub broker: SocketAddr,
    /// Topic and partition.
    pub topic: String,
    /// Partition written.
    pub partition: i32,
    /// Requests in total.
    pub requests: usize,
    /// Connections, each sending its share one request at a time.
    pub connections: usize,
    /// Value bytes of the one record per request.
    pub record_bytes: usize,
    /// acks (-1 = all, 1 = leader).
    pub acks: i16,
    /// The requests' timeout.
    pub timeout_ms: i32,
    /// Fetches parked on the partition during the run.
    pub parked_fetches: usize,
    /// How many times each parked fetch names the partition.
    pub fetch_entries: usize,
}

/// What was measured.
#[derive(Debug, Clone)]
pub struct ProduceLatencyReport {
    /// Latencies of the acknowledged requests.
    pub latency: Option<LatencySummary>,
    /// Requests answered with an error.
    pub errors: usize,
    /// Wall time of the run.
    pub elapsed: Duration,
}

/// Runs the measurement.
pub async fn run(config: &ProduceLatencyConfig) -> io::Result<ProduceLatencyReport> {
    let connections = config.connections.max(1);
    let mut parked = park_fetches(config).await?;
    let started = Instant::now();
    let mut workers = Vec::with_capacity(connections);
    for worker in 0..connections {
        let share =
            config.requests / connections + usize::from(worker < config.requests % connections);
        let config = config.clone();
        workers.push(tokio::spawn(async move {
            send_sequentially(&config, share).await
        }));
    }
    let mut latencies = Vec::with_capacity(config.requests);
    let mut errors = 0;
    for worker in workers {
        let (mut done, failed) = worker.await.map_err(io::Error::other)??;
        latencies.append(&mut done);
        errors += failed;
    }
    for client in &mut parked {
        // Still waiting: nothing to read yet, and not closed.
        if let Ok(read) = tokio::time::timeout(Duration::from_millis(1), client.read_raw()).await {
            let what = match read {
                Ok(Some(_)) => "was answered",
                _ => "was closed by the broker",
            };
            return Err(io::Error::other(format!("a parked fetch {what}")));
        }
    }
    Ok(ProduceLatencyReport {
        latency: LatencySummary::of(&mut latencies),
        errors,
        elapsed: started.elapsed(),
    })
}

/// Parks `parked_fetches` fetches that will not complete during the run.
async fn park_fetches(config: &ProduceLatencyConfig) -> io::Result<Vec<WireClient>> {
    if config.parked_fetches == 0 {
        return Ok(Vec::new());
    }
    let offset = super::latest_offset(config.broker, &config.topic, config.partition).await?;
    let mut fetch = requests::fetch(&config.topic, config.partition, offset, i32::MAX, 600_000);
    let wanted = fetch.topics[0].partitions[0].clone();
    fetch.topics[0].partitions = vec![wanted; config.fetch_entries.max(1)];
    let mut parked = Vec::with_capacity(config.parked_fetches);
    for _ in 0..config.parked_fetches {
        let mut client = WireClient::connect(config.broker).await?;
        client.send(4, &fetch).await?;
        parked.push(client);
    }
    // A moment for the broker to read and park them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(parked)
}

async fn send_sequentially(
    config: &ProduceLatencyConfig,
    count: usize,
) -> io::Result<(Vec<Duration>, usize)> {
    let mut client = WireClient::connect(config.broker).await?;
    let value = Bytes::from(vec![b'p'; config.record_bytes]);
    let mut latencies = Vec::with_capacity(count);
    let mut errors = 0;
    for _ in 0..count {
        let batch = encode_batch(std::slice::from_ref(&value), 0);
        let request = requests::produce(
            &config.topic,
            config.partition,
            config.acks,
            config.timeout_ms,
            batch,
        );
        let sent = Instant::now();
        let answer = bounded("produce", client.call(7, &request)).await?;
        let took = sent.elapsed();
        let code = answer
            .responses
            .first()
            .and_then(|t| t.partition_responses.first())
            .map_or(-1, |p| p.error_code);
        if code == 0 {
            latencies.push(took);
        } else {
            errors += 1;
        }
    }
    Ok((latencies, errors))
}
