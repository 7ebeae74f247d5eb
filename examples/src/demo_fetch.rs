//! The `delayed_fetch` example: long-poll fetches held in the purgatory until `min_bytes`
//! are available past the fetch offset, or answered at `max_wait` with whatever is there.
//!
//! One partition without followers (so an append is committed at once). Each scenario
//! parks a [`DelayedFetch`](crate::delayed_fetch::DelayedFetch) on the partition, then a
//! writer thread appends batches at a steady pace; every append fires `check_and_complete`.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use purgatory::Completion;

use crate::delayed_fetch::BytesWait;
use crate::followers::FollowerConfig;
use crate::leader::Leader;
use crate::partition::PartitionKey;
use crate::record_batch::{encode_batch, ProducedBatch};

/// One long poll and the appends that follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchScenario {
    /// A name to print.
    pub name: String,
    /// Bytes the fetch waits for.
    pub min_bytes: u64,
    /// How long it may wait.
    pub max_wait: Duration,
    /// Appends made after the fetch is parked.
    pub appends: usize,
    /// Pause before each append.
    pub append_interval: Duration,
    /// Value bytes per appended record (one record per batch).
    pub record_bytes: usize,
}

/// The example's three scenarios: woken by the first append, woken once enough bytes
/// arrived, and answered at `max_wait` because `min_bytes` never arrives.
pub fn default_scenarios(max_wait: Duration, append_interval: Duration) -> Vec<FetchScenario> {
    vec![
        FetchScenario {
            name: "min_bytes 1 on an empty partition".into(),
            min_bytes: 1,
            max_wait,
            appends: 1,
            append_interval,
            record_bytes: 100,
        },
        FetchScenario {
            name: "min_bytes 500, batches of about 170 bytes".into(),
            min_bytes: 500,
            max_wait,
            appends: 5,
            append_interval,
            record_bytes: 100,
        },
        FetchScenario {
            name: "min_bytes 1 MiB, more than will arrive".into(),
            min_bytes: 1 << 20,
            max_wait,
            appends: 3,
            append_interval,
            record_bytes: 100,
        },
    ]
}

/// What happened to one long poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchReport {
    /// `Ready` when `min_bytes` arrived, `Expired` at `max_wait`.
    pub how: Completion,
    /// From parking the fetch to its answer.
    pub elapsed: Duration,
    /// Committed bytes available to it when answered.
    pub available: u64,
    /// Appends made before it was answered.
    pub appends_before_answer: usize,
    /// For a fetch woken by an append: from the start of that append to the answer.
    pub wake_latency: Option<Duration>,
}

/// Runs the scenarios one after the other, printing each answer to `out`.
pub fn run(scenarios: &[FetchScenario], out: &mut dyn Write) -> io::Result<Vec<FetchReport>> {
    let mut reports = Vec::with_capacity(scenarios.len());
    for scenario in scenarios {
        let report = run_one(scenario)?;
        let why = match (report.how, report.wake_latency) {
            (Completion::Expired, _) => "max_wait passed".to_string(),
            (_, Some(wake)) => format!(
                "min_bytes reached ({:.3} ms after the satisfying append began)",
                wake.as_secs_f64() * 1e3
            ),
            (_, None) => "min_bytes reached".to_string(),
        };
        writeln!(
            out,
            "fetch ({}, max_wait {} ms): answered after {:.1} ms because {why}, \
             with {} bytes after {} append(s)",
            scenario.name,
            scenario.max_wait.as_millis(),
            report.elapsed.as_secs_f64() * 1e3,
            report.available,
            report.appends_before_answer
        )?;
        reports.push(report);
    }
    Ok(reports)
}

fn run_one(scenario: &FetchScenario) -> io::Result<FetchReport> {
    let no_followers = FollowerConfig {
        count: 0,
        lag: Duration::ZERO,
        stalled: false,
    };
    let leader = Arc::new(Leader::start(1, no_followers));
    let key = PartitionKey(0);
    let partition = leader.partition(key).expect("partition 0 exists").clone();
    let wait = BytesWait {
        key,
        partition,
        start_position: 0,
        max_bytes: u64::MAX,
    };
    let parked_at = Instant::now();
    let mut answer = leader.wait_for_bytes(scenario.max_wait, scenario.min_bytes, vec![wait]);

    let writer = {
        let leader = Arc::clone(&leader);
        let scenario = scenario.clone();
        std::thread::spawn(move || {
            let value = Bytes::from(vec![b'x'; scenario.record_bytes]);
            let mut appended_at = Vec::with_capacity(scenario.appends);
            for _ in 0..scenario.appends {
                std::thread::sleep(scenario.append_interval);
                let batch =
                    ProducedBatch::parse_all(&encode_batch(std::slice::from_ref(&value), 0))
                        .expect("the example's own batch is valid");
                // Stamped before the append: the answer can go out from inside it.
                appended_at.push(Instant::now());
                leader
                    .append(key, batch)
                    .expect("the example's partition has offsets to spare");
            }
            appended_at
        })
    };
    let completion = loop {
        match answer.try_answer() {
            Some(Ok(answered)) => break answered.answer,
            None => std::thread::sleep(Duration::from_millis(1)),
            Some(Err(_)) => return Err(io::Error::other("the fetch was never answered")),
        }
    };
    let appended_at = writer
        .join()
        .map_err(|_| io::Error::other("the writer thread panicked"))?;
    leader.shutdown();
    let before: Vec<Instant> = appended_at
        .into_iter()
        .filter(|&at| at <= completion.completed_at)
        .collect();
    let wake_latency = match completion.how {
        Completion::Expired => None,
        _ => before
            .last()
            .map(|&at| completion.completed_at.duration_since(at)),
    };
    Ok(FetchReport {
        how: completion.how,
        elapsed: completion.completed_at.duration_since(parked_at),
        available: completion.available,
        appends_before_answer: before.len(),
        wake_latency,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_poll_is_answered_by_the_append_that_satisfies_it() {
        let scenarios = default_scenarios(Duration::from_secs(20), Duration::from_millis(20));
        let mut out = Vec::new();
        let reports = run(&scenarios[..2], &mut out).unwrap();
        assert_eq!(reports[0].how, Completion::Ready);
        assert_eq!(reports[0].appends_before_answer, 1);
        assert!(reports[0].wake_latency.is_some());
        assert!(reports[0].elapsed < Duration::from_secs(10));
        assert_eq!(reports[1].how, Completion::Ready);
        assert!(reports[1].available >= 500);
        assert!(
            (2..=5).contains(&reports[1].appends_before_answer),
            "answered after {} appends",
            reports[1].appends_before_answer
        );
    }

    #[test]
    fn a_long_poll_is_answered_at_max_wait_with_what_is_there() {
        let mut scenarios =
            default_scenarios(Duration::from_millis(150), Duration::from_millis(20));
        let expiring = scenarios.remove(2);
        let mut out = Vec::new();
        let report = run(std::slice::from_ref(&expiring), &mut out).unwrap()[0];
        assert_eq!(report.how, Completion::Expired);
        assert!(report.elapsed >= expiring.max_wait);
        assert!(report.available > 0, "the answer carries what arrived");
        assert!(String::from_utf8(out).unwrap().contains("max_wait passed"));
    }
}
