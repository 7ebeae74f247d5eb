//! A produce flood while many polls wait (issue #29, finding 2): does the high watermark
//! keep following?
//!
//! 1. `connections` clients each park a fetch naming the partition `fetch_entries` times
//!    that cannot complete (min_bytes 2^31-1); a poll answered (its max_wait, capped by the
//!    broker, passed) is sent again, so they stay parked for the whole run.
//! 2. `producers` connections send tiny acks=0 produces back to back for `flood`, while a
//!    good client sends one acks=all produce (timeout `good_timeout_ms`) at a time, every
//!    `good_interval`, each timed from send to answer.
//! 3. Once the flood stopped, the good client sends acks=all produces until one is
//!    acknowledged: how long after the flood the high watermark had caught up with
//!    everything the flood appended.
//!
//! Every wait is bounded ([`super::bounded`] and `catch_up_limit`).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::bounded;
use super::latency_summary::LatencySummary;
use crate::record_batch::encode_batch;
use crate::wire_client::{requests, WireClient};

/// What to run.
#[derive(Debug, Clone)]
pub struct FloodConfig {
    /// The broker.
    pub broker: SocketAddr,
    /// The topic.
    pub topic: String,
    /// The partition flooded and polled.
    pub partition: i32,
    /// Connections that each keep one poll parked.
    pub connections: usize,
    /// How many times each poll names the partition.
    pub fetch_entries: usize,
    /// Connections sending acks=0 produces.
    pub producers: usize,
    /// How long they send.
    pub flood: Duration,
    /// Bytes of each flooded record.
    pub record_bytes: usize,
    /// Pause between two good acks=all produces.
    pub good_interval: Duration,
    /// The good produces' own timeout.
    pub good_timeout_ms: i32,
    /// How long after the flood the high watermark may take to catch up.
    pub catch_up_limit: Duration,
}

/// What was measured.
#[derive(Debug, Clone)]
pub struct FloodReport {
    /// acks=0 produces sent during the flood.
    pub flooded: u64,
    /// Good acks=all produces acknowledged during the flood, send to answer.
    pub good: Option<LatencySummary>,
    /// Good acks=all produces answered with an error (request timed out) during the flood.
    pub good_failed: usize,
    /// From the end of the flood until an acks=all produce sent after it was acknowledged;
    /// `None` when not within `catch_up_limit`.
    pub caught_up_after: Option<Duration>,
}

/// Runs the flood against `config.broker`.
pub async fn run(config: &FloodConfig) -> io::Result<FloodReport> {
    let stop = Arc::new(AtomicBool::new(false));
    let polls = park_polls(config, &stop).await?;

    let flooded = Arc::new(AtomicU64::new(0));
    let flood_until = Instant::now() + config.flood;
    let mut producers = Vec::with_capacity(config.producers);
    for _ in 0..config.producers {
        let mut client = WireClient::connect(config.broker).await?;
        let (topic, partition, flooded) = (config.topic.clone(), config.partition, flooded.clone());
        let value = Bytes::from(vec![b'f'; config.record_bytes]);
        producers.push(tokio::spawn(async move {
            while Instant::now() < flood_until {
                let batch = encode_batch(std::slice::from_ref(&value), 0);
                let request = requests::produce(&topic, partition, 0, 0, batch);
                bounded("acks=0 produce", client.send(7, &request)).await?;
                flooded.fetch_add(1, Ordering::Relaxed);
            }
            io::Result::Ok(())
        }));
    }

    let mut good = WireClient::connect(config.broker).await?;
    let mut latencies = Vec::new();
    let mut good_failed = 0;
    while Instant::now() < flood_until {
        match good_produce(config, &mut good).await? {
            (0, took) => latencies.push(took),
            _ => good_failed += 1,
        }
        tokio::time::sleep(config.good_interval).await;
    }
    for producer in producers {
        producer.await.map_err(io::Error::other)??;
    }

    let flood_ended = Instant::now();
    let mut caught_up_after = None;
    while flood_ended.elapsed() < config.catch_up_limit {
        if good_produce(config, &mut good).await?.0 == 0 {
            caught_up_after = Some(flood_ended.elapsed());
            break;
        }
    }
    stop.store(true, Ordering::Release);
    for poll in polls {
        poll.abort();
    }
    Ok(FloodReport {
        flooded: flooded.load(Ordering::Relaxed),
        good: LatencySummary::of(&mut latencies),
        good_failed,
        caught_up_after,
    })
}

/// One acks=all produce of one small record: its error code and how long it took.
async fn good_produce(
    config: &FloodConfig,
    client: &mut WireClient,
) -> io::Result<(i16, Duration)> {
    let batch = encode_batch(&[Bytes::from_static(b"good")], 0);
    let request = requests::produce(
        &config.topic,
        config.partition,
        -1,
        config.good_timeout_ms,
        batch,
    );
    let sent = Instant::now();
    let answer = bounded("acks=all produce", client.call(7, &request)).await?;
    let code = answer
        .responses
        .first()
        .and_then(|t| t.partition_responses.first())
        .map_or(-1, |p| p.error_code);
    Ok((code, sent.elapsed()))
}

/// Parks `config.connections` polls that cannot complete, each sent again when answered,
/// until `stop`; returns once every one was sent (and a moment for the broker to park them).
async fn park_polls(
    config: &FloodConfig,
    stop: &Arc<AtomicBool>,
) -> io::Result<Vec<tokio::task::JoinHandle<()>>> {
    let offset = super::latest_offset(config.broker, &config.topic, config.partition).await?;
    let mut fetch = requests::fetch(&config.topic, config.partition, offset, i32::MAX, i32::MAX);
    let wanted = fetch.topics[0].partitions[0].clone();
    fetch.topics[0].partitions = vec![wanted; config.fetch_entries.max(1)];
    let mut polls = Vec::with_capacity(config.connections);
    for _ in 0..config.connections {
        let mut client = WireClient::connect(config.broker).await?;
        client.send(4, &fetch).await?;
        let (fetch, stop) = (fetch.clone(), stop.clone());
        polls.push(tokio::spawn(async move {
            // Answered when the broker's cap on max_wait passed: park it again.
            while client.read_raw().await.is_ok_and(|a| a.is_some()) {
                if stop.load(Ordering::Acquire) || client.send(4, &fetch).await.is_err() {
                    return;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(polls)
}
