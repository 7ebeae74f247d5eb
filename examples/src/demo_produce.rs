//! The `delayed_produce` example: acks=all produce requests held in the purgatory until
//! every in-sync follower has copied them, or answered "request timed out".
//!
//! One partition, simulated followers lagging `lag` behind the leader. Each request appends
//! a batch, then parks a [`DelayedProduce`](crate::delayed_produce::DelayedProduce) watched
//! on the partition; every follower advance fires `check_and_complete` on it. A request is
//! acknowledged when the high watermark reaches the end of its batch, or times out after
//! `timeout`.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use purgatory::Completion;

use crate::delayed_produce::ReplicaWait;
use crate::followers::FollowerConfig;
use crate::leader::Leader;
use crate::partition::PartitionKey;
use crate::record_batch::{encode_batch, ProducedBatch};

/// One run of the example.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceDemoConfig {
    /// Simulated in-sync followers.
    pub followers: usize,
    /// How far behind the leader they copy.
    pub lag: Duration,
    /// The requests' timeout (Kafka's produce `timeout_ms`).
    pub timeout: Duration,
    /// Number of produce requests.
    pub requests: usize,
    /// Records per request.
    pub records_per_request: usize,
    /// Pause between two requests.
    pub interval: Duration,
}

impl Default for ProduceDemoConfig {
    fn default() -> Self {
        Self {
            followers: 2,
            lag: Duration::from_millis(50),
            timeout: Duration::from_millis(500),
            requests: 5,
            records_per_request: 10,
            interval: Duration::from_millis(20),
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProduceOutcome {
    /// Every in-sync follower had the request's last offset.
    Acknowledged,
    /// The timeout came first: "request timed out".
    TimedOut,
}

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceRequestReport {
    /// First offset of the request's records.
    pub base_offset: i64,
    /// Last offset of the request's records.
    pub last_offset: i64,
    /// How it ended.
    pub outcome: ProduceOutcome,
    /// From the append to the answer.
    pub elapsed: Duration,
}

/// Runs one configuration, printing each answer to `out`.
pub fn run(
    config: &ProduceDemoConfig,
    out: &mut dyn Write,
) -> io::Result<Vec<ProduceRequestReport>> {
    writeln!(
        out,
        "== {} followers copying {} ms behind the leader; acks=all, request timeout {} ms",
        config.followers,
        config.lag.as_millis(),
        config.timeout.as_millis()
    )?;
    let followers = FollowerConfig {
        count: config.followers,
        lag: config.lag,
        stalled: false,
    };
    let leader = Leader::start(1, followers);
    let key = PartitionKey(0);
    let partition = leader.partition(key).expect("partition 0 exists").clone();
    let values: Vec<Bytes> = (0..config.records_per_request)
        .map(|i| Bytes::from(format!("record {i}")))
        .collect();

    let mut waiting = Vec::with_capacity(config.requests);
    for request in 0..config.requests {
        if request > 0 {
            std::thread::sleep(config.interval);
        }
        let batches = ProducedBatch::parse_all(&encode_batch(&values, 0))
            .expect("the example's own batch is valid");
        let sent_at = Instant::now();
        let appended = leader.append(key, batches).expect("partition 0 exists");
        let wait = ReplicaWait {
            key,
            partition: partition.clone(),
            required_offset: appended.end_offset,
        };
        let answer = leader.wait_for_replicas(config.timeout, vec![wait]);
        waiting.push((sent_at, appended, answer));
    }

    let mut reports = Vec::with_capacity(waiting.len());
    for (request, (sent_at, appended, answer)) in waiting.into_iter().enumerate() {
        let completion = answer
            .blocking_answer()
            .map_err(|_| io::Error::other("a produce request was never answered"))?
            .answer;
        let outcome = match (completion.how, completion.acknowledged.as_slice()) {
            (Completion::Ready, _) | (_, [true]) => ProduceOutcome::Acknowledged,
            _ => ProduceOutcome::TimedOut,
        };
        let report = ProduceRequestReport {
            base_offset: appended.base_offset,
            last_offset: appended.end_offset - 1,
            outcome,
            elapsed: completion.completed_at.duration_since(sent_at),
        };
        let said = match outcome {
            ProduceOutcome::Acknowledged => "acknowledged by every in-sync follower",
            ProduceOutcome::TimedOut => "answered \"request timed out\"",
        };
        writeln!(
            out,
            "produce #{request}: offsets {}..={} {said} after {:.1} ms",
            report.base_offset,
            report.last_offset,
            report.elapsed.as_secs_f64() * 1e3
        )?;
        reports.push(report);
    }
    let stats = leader.stats().produce;
    writeln!(
        out,
        "purgatory: {} completed by follower progress, {} expired",
        stats.completed, stats.expired
    )?;
    leader.shutdown();
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_acknowledged_after_the_followers_lag() {
        let config = ProduceDemoConfig {
            lag: Duration::from_millis(30),
            timeout: Duration::from_secs(20),
            requests: 3,
            ..ProduceDemoConfig::default()
        };
        let mut out = Vec::new();
        let reports = run(&config, &mut out).unwrap();
        assert_eq!(reports.len(), 3);
        for (i, report) in reports.iter().enumerate() {
            assert_eq!(report.outcome, ProduceOutcome::Acknowledged);
            assert!(
                report.elapsed >= config.lag,
                "answered before the followers copied"
            );
            assert_eq!(report.base_offset, i as i64 * 10);
        }
        let printed = String::from_utf8(out).unwrap();
        assert!(printed.contains("acknowledged by every in-sync follower"));
    }

    #[test]
    fn requests_time_out_when_followers_lag_past_the_timeout() {
        let config = ProduceDemoConfig {
            lag: Duration::from_secs(30),
            timeout: Duration::from_millis(40),
            requests: 2,
            ..ProduceDemoConfig::default()
        };
        let mut out = Vec::new();
        let reports = run(&config, &mut out).unwrap();
        for report in &reports {
            assert_eq!(report.outcome, ProduceOutcome::TimedOut);
            assert!(
                report.elapsed >= config.timeout,
                "expired before its timeout"
            );
        }
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("request timed out"));
    }
}
