//! Long polls whose clients leave: `connections` connections each park a fetch that would
//! wait 2^31-1 ms (min_bytes 1 at the end of the partition), then all of them close at
//! once. The broker's open descriptors and resident memory are read from `/proc` before,
//! with everything parked, and every 10 ms after the clients left, until its descriptors
//! are back to the figure from before (or a time limit).
//!
//! A broker that notices a client leaving closes the socket and cancels the operation at
//! once; one that does not keeps both until the poll's own timeout, 24.8 days later.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::process_usage::{self, ProcessUsage};
use super::{bounded, latest_offset};
use crate::wire_client::{requests, WireClient};

/// Connections opened at once while setting up.
const CONNECTING_AT_ONCE: usize = 200;

/// How long to wait for the descriptors to come back after the clients left.
const RETURN_LIMIT: Duration = Duration::from_secs(10);

/// What to run.
#[derive(Debug, Clone)]
pub struct LeftPollsConfig {
    /// The broker.
    pub broker: SocketAddr,
    /// The broker's process id (required: this measurement is about its descriptors).
    pub broker_pid: u32,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Polls whose clients leave.
    pub connections: usize,
}

/// The broker at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    /// Open file descriptors.
    pub open_files: usize,
    /// Memory and CPU.
    pub usage: ProcessUsage,
}

fn snapshot(pid: u32) -> io::Result<Snapshot> {
    Ok(Snapshot {
        open_files: process_usage::open_files(pid)?,
        usage: process_usage::read(pid)?,
    })
}

/// What was measured.
#[derive(Debug, Clone)]
pub struct LeftPollsReport {
    /// Before any poll connected.
    pub before: Snapshot,
    /// With every poll parked.
    pub parked: Snapshot,
    /// When the descriptors were back to `before` (or at the time limit).
    pub returned: Snapshot,
    /// How long after the clients left the descriptors were back (`None`: not within
    /// the limit).
    pub returned_after: Option<Duration>,
    /// One second after the clients left.
    pub one_second_after: Snapshot,
}

/// Runs the measurement.
pub async fn run(config: &LeftPollsConfig) -> io::Result<LeftPollsReport> {
    let pid = config.broker_pid;
    let before = snapshot(pid)?;
    let offset = latest_offset(config.broker, &config.topic, config.partition).await?;
    let poll = requests::fetch(&config.topic, config.partition, offset, 1, i32::MAX);
    let connecting = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
    let mut parking = Vec::with_capacity(config.connections);
    for _ in 0..config.connections {
        let (broker, poll, connecting) = (config.broker, poll.clone(), connecting.clone());
        parking.push(tokio::spawn(async move {
            let _permit = connecting.acquire().await.map_err(io::Error::other)?;
            let mut client = bounded("connect", WireClient::connect(broker)).await?;
            client.send(4, &poll).await?;
            Ok::<_, io::Error>(client)
        }));
    }
    let mut clients = Vec::with_capacity(config.connections);
    for parked in parking {
        clients.push(parked.await.map_err(io::Error::other)??);
    }
    // Every connection is a descriptor of the broker's; then a moment to read the polls.
    let deadline = Instant::now() + super::ANSWER_LIMIT;
    while process_usage::open_files(pid)? < before.open_files + config.connections {
        if Instant::now() > deadline {
            return Err(io::Error::other("the broker never held every connection"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let parked = snapshot(pid)?;

    drop(clients);
    let left = Instant::now();
    let mut returned_after = None;
    let mut returned = parked;
    let mut one_second_after = None;
    while left.elapsed() < RETURN_LIMIT && (returned_after.is_none() || one_second_after.is_none())
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = snapshot(pid)?;
        if returned_after.is_none() {
            returned = now;
            if now.open_files <= before.open_files {
                returned_after = Some(left.elapsed());
            }
        }
        if one_second_after.is_none() && left.elapsed() >= Duration::from_secs(1) {
            one_second_after = Some(now);
        }
    }
    Ok(LeftPollsReport {
        before,
        parked,
        returned,
        returned_after,
        one_second_after: one_second_after.unwrap_or(returned),
    })
}
