//! The broker's load and measurement tool (binary `broker_load`, workload W4).
//!
//! - [`produce_latency`]: produce latency (acks=all: to compare with the replication
//!   delay), optionally while fetches naming the partition many times are parked.
//! - [`fetch_wakeup`]: how soon a waiting fetch is answered after the append that
//!   satisfies it.
//! - [`idle_polls`]: many connections long-polling at once; the broker's memory and CPU
//!   while they wait (read from `/proc`), then one append that answers them all.
//! - [`left_polls`]: many long polls whose clients then leave at once; how soon the
//!   broker's descriptors and memory come back.
//! - [`hostile`]: the memory each hostile client of issue #23 makes the broker hold.
//! - [`flood`]: a produce flood while many polls wait; does the high watermark follow?
//! - [`timer_jitter`]: the machine's own lateness on timed sleeps (no broker), the noise
//!   floor under the followers' delay.
//!
//! Every run is bounded: a fixed number of requests or connections, and a time limit on
//! every wait.

pub mod fetch_wakeup;
pub mod flood;
pub mod hostile;
pub mod idle_polls;
pub mod latency_summary;
pub mod left_polls;
pub mod process_usage;
pub mod produce_latency;
pub mod timer_jitter;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::wire_client::{requests, WireClient};

/// Longest any single answer may take before the tool gives up.
pub const ANSWER_LIMIT: Duration = Duration::from_secs(120);

/// Bounds an I/O future by [`ANSWER_LIMIT`].
pub async fn bounded<T>(
    what: &str,
    f: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match tokio::time::timeout(ANSWER_LIMIT, f).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what}: no answer within {ANSWER_LIMIT:?}"),
        )),
    }
}

/// The latest committed offset (high watermark) of a partition.
pub async fn latest_offset(broker: SocketAddr, topic: &str, partition: i32) -> io::Result<i64> {
    let mut client = WireClient::connect(broker).await?;
    let answer = bounded(
        "ListOffsets",
        client.call(1, &requests::list_offsets(topic, partition, -1)),
    )
    .await?;
    let found = answer
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .ok_or_else(|| io::Error::other("empty ListOffsets answer"))?;
    if found.error_code != 0 {
        return Err(io::Error::other(format!(
            "ListOffsets error {}",
            found.error_code
        )));
    }
    Ok(found.offset)
}
