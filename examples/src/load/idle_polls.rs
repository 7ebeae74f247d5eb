//! Many idle long polls: `connections` connections each park a fetch at the end of the
//! partition (min_bytes 1, a long max_wait). While they all wait, the broker's resident
//! memory and CPU time are sampled from `/proc`; then one record is produced and every poll
//! must be answered, each timed from the produce.
//!
//! A poll that expires before the produce is sent again, so the broker holds all of them for
//! the whole idle window as long as max_wait is longer than the window.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::FetchRequest;
use tokio::sync::{mpsc, Semaphore};

use super::latency_summary::LatencySummary;
use super::process_usage::{self, ProcessUsage};
use super::{bounded, latest_offset};
use crate::record_batch::encode_batch;
use crate::wire_client::{requests, WireClient};

/// Connections opened at once while setting up.
const CONNECTING_AT_ONCE: usize = 200;

/// What to run.
#[derive(Debug, Clone)]
pub struct IdlePollsConfig {
    /// The broker.
    pub broker: SocketAddr,
    /// The broker's process id, to read its memory and CPU (none: not measured).
    pub broker_pid: Option<u32>,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Waiting connections.
    pub connections: usize,
    /// The polls' max_wait.
    pub max_wait_ms: i32,
    /// How long to watch the broker while everything waits.
    pub idle: Duration,
}

/// Memory and CPU of the broker while the polls wait.
#[derive(Debug, Clone, Copy)]
pub struct IdleUsage {
    /// Before any poll connected.
    pub before: ProcessUsage,
    /// Once every poll was parked.
    pub parked: ProcessUsage,
    /// Smallest and largest RSS seen during the idle window, KiB.
    pub rss_range_kib: (u64, u64),
    /// CPU time the broker used during the idle window.
    pub idle_cpu: Duration,
}

/// What was measured.
#[derive(Debug, Clone)]
pub struct IdlePollsReport {
    /// Polls parked.
    pub parked: usize,
    /// Broker usage, when its pid was given.
    pub usage: Option<IdleUsage>,
    /// The idle window's length.
    pub idle: Duration,
    /// Per poll: from sending the produce to receiving its answer.
    pub wakeup: Option<LatencySummary>,
    /// Polls that were never answered with the record.
    pub unanswered: usize,
}

/// Runs the measurement.
pub async fn run(config: &IdlePollsConfig) -> io::Result<IdlePollsReport> {
    let read_usage = |pid: Option<u32>| pid.map(process_usage::read).transpose();
    let before = read_usage(config.broker_pid)?;
    let offset = latest_offset(config.broker, &config.topic, config.partition).await?;

    let parked = Arc::new(AtomicUsize::new(0));
    let connecting = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
    let (answered, mut answers) = mpsc::unbounded_channel::<io::Result<Instant>>();
    let mut polls = Vec::with_capacity(config.connections);
    for _ in 0..config.connections {
        let fetch = requests::fetch(
            &config.topic,
            config.partition,
            offset,
            1,
            config.max_wait_ms,
        );
        let (broker, parked, connecting, answered) = (
            config.broker,
            parked.clone(),
            connecting.clone(),
            answered.clone(),
        );
        polls.push(tokio::spawn(async move {
            let result = poll_until_data(broker, fetch, &parked, &connecting).await;
            let _ = answered.send(result);
        }));
    }
    drop(answered);

    let setup_deadline = Instant::now() + super::ANSWER_LIMIT;
    while parked.load(Ordering::Acquire) < config.connections {
        if Instant::now() > setup_deadline {
            return Err(io::Error::other(
                "the polls could not all be parked in time",
            ));
        }
        if let Ok(Some(Err(e))) =
            tokio::time::timeout(Duration::from_millis(50), answers.recv()).await
        {
            return Err(io::Error::other(format!(
                "a poll failed while parking: {e}"
            )));
        }
    }
    // Give the broker a moment to take in the last requests.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let usage = match (config.broker_pid, before) {
        (Some(pid), Some(before)) => {
            let parked_usage = process_usage::read(pid)?;
            let mut rss_range = (parked_usage.rss_kib, parked_usage.rss_kib);
            let window_end = Instant::now() + config.idle;
            while Instant::now() < window_end {
                tokio::time::sleep(Duration::from_millis(250).min(config.idle)).await;
                let sample = process_usage::read(pid)?;
                rss_range = (
                    rss_range.0.min(sample.rss_kib),
                    rss_range.1.max(sample.rss_kib),
                );
            }
            let after = process_usage::read(pid)?;
            Some(IdleUsage {
                before,
                parked: parked_usage,
                rss_range_kib: rss_range,
                idle_cpu: after.cpu.saturating_sub(parked_usage.cpu),
            })
        }
        _ => {
            tokio::time::sleep(config.idle).await;
            None
        }
    };

    let mut producer = WireClient::connect(config.broker).await?;
    let batch = encode_batch(&[Bytes::from_static(b"wake everyone")], 0);
    let produce = requests::produce(&config.topic, config.partition, 1, 30_000, batch);
    let sent = Instant::now();
    bounded("produce", producer.call(7, &produce)).await?;

    let mut wakeups = Vec::with_capacity(config.connections);
    let mut unanswered = 0;
    let answer_deadline = Instant::now() + super::ANSWER_LIMIT;
    for _ in 0..config.connections {
        let left = answer_deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, answers.recv()).await {
            Ok(Some(Ok(at))) => wakeups.push(at.saturating_duration_since(sent)),
            _ => unanswered += 1,
        }
    }
    for poll in polls {
        poll.abort();
    }
    Ok(IdlePollsReport {
        parked: parked.load(Ordering::Acquire),
        usage,
        idle: config.idle,
        wakeup: LatencySummary::of(&mut wakeups),
        unanswered,
    })
}

/// Connects, parks the fetch, and re-sends it whenever it comes back empty; returns when an
/// answer carries data.
async fn poll_until_data(
    broker: SocketAddr,
    fetch: FetchRequest,
    parked: &AtomicUsize,
    connecting: &Semaphore,
) -> io::Result<Instant> {
    let permit = connecting.acquire().await.map_err(io::Error::other)?;
    let mut client = bounded("connect", WireClient::connect(broker)).await?;
    client.send(4, &fetch).await?;
    drop(permit);
    parked.fetch_add(1, Ordering::AcqRel);
    loop {
        let answer = client.receive::<FetchRequest>().await?;
        let has_records = answer
            .responses
            .first()
            .and_then(|t| t.partitions.first())
            .and_then(|p| p.records.as_ref())
            .is_some_and(|r| !r.is_empty());
        if has_records {
            return Ok(Instant::now());
        }
        client.send(4, &fetch).await?;
    }
}
