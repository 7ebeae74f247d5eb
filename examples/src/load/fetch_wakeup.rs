//! Fetch wake-up: one consumer long-polls at the end of the partition; a producer then
//! appends one record (acks=1); the time from sending that produce to receiving the fetch
//! answer is the wake-up latency (it includes the append and two loopback trips, so it is an
//! upper bound of the purgatory's part). Run the broker with `--followers 0` so that the
//! append is the commit; with followers the figure also holds the replication delay.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::FetchRequest;

use super::latency_summary::LatencySummary;
use super::{bounded, latest_offset};
use crate::record_batch::encode_batch;
use crate::wire_client::{requests, WireClient};

/// What to run.
#[derive(Debug, Clone)]
pub struct FetchWakeupConfig {
    /// The broker.
    pub broker: SocketAddr,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Number of poll / append rounds.
    pub rounds: usize,
    /// The fetches' max_wait (long enough never to expire in a round).
    pub max_wait_ms: i32,
    /// Pause between parking the fetch and producing, so the fetch is surely waiting.
    pub park_time: Duration,
}

/// What was measured.
#[derive(Debug, Clone)]
pub struct FetchWakeupReport {
    /// From sending the produce to receiving the fetch answer.
    pub wakeup: Option<LatencySummary>,
    /// The produce's own latency (acks=1).
    pub produce: Option<LatencySummary>,
    /// From receiving the produce's answer to receiving the fetch answer: how long after
    /// the append was acknowledged the waiting fetch was answered (0 if it came first).
    pub after_ack: Option<LatencySummary>,
    /// Rounds whose fetch came back empty (expired before the append).
    pub empty_answers: usize,
}

/// Runs the measurement.
pub async fn run(config: &FetchWakeupConfig) -> io::Result<FetchWakeupReport> {
    let mut consumer = WireClient::connect(config.broker).await?;
    let mut producer = WireClient::connect(config.broker).await?;
    let mut offset = latest_offset(config.broker, &config.topic, config.partition).await?;
    let value = Bytes::from_static(b"wake up");
    let mut wakeups = Vec::with_capacity(config.rounds);
    let mut produces = Vec::with_capacity(config.rounds);
    let mut after_acks = Vec::with_capacity(config.rounds);
    let mut empty_answers = 0;
    for _ in 0..config.rounds {
        let fetch = requests::fetch(
            &config.topic,
            config.partition,
            offset,
            1,
            config.max_wait_ms,
        );
        consumer.send(4, &fetch).await?;
        tokio::time::sleep(config.park_time).await;
        let batch = encode_batch(std::slice::from_ref(&value), 0);
        let produce = requests::produce(&config.topic, config.partition, 1, 30_000, batch);
        let sent = Instant::now();
        bounded("produce", producer.call(7, &produce)).await?;
        let acked = sent.elapsed();
        produces.push(acked);
        let answer = bounded("fetch", consumer.receive::<FetchRequest>()).await?;
        let woke = sent.elapsed();
        let has_records = answer
            .responses
            .first()
            .and_then(|t| t.partitions.first())
            .and_then(|p| p.records.as_ref())
            .is_some_and(|r| !r.is_empty());
        if has_records {
            wakeups.push(woke);
            after_acks.push(woke.saturating_sub(acked));
        } else {
            empty_answers += 1;
        }
        offset += 1;
    }
    Ok(FetchWakeupReport {
        wakeup: LatencySummary::of(&mut wakeups),
        produce: LatencySummary::of(&mut produces),
        after_ack: LatencySummary::of(&mut after_acks),
        empty_answers,
    })
}
