//! Issue #38, finding 5: unread fetch answers kept the log segments retention dropped.
//!
//! An answer shares its records with the log: a slice of a sealed 1 MiB segment, which
//! keeps the whole segment alive. Once retention dropped the segment, only the answer held
//! it, and nothing counted it: the request budget counted what answers copy, and the
//! segment was "the log's". Readers that never read their answers, each fetching the
//! segment the producer had just filled, kept one dropped segment each (on the issue's
//! probe: 2.5 GB of resident memory under `--retention-bytes` 16 MiB in 7-12 s). An answer
//! is now held in the request budget at what it keeps alive (up to 4/3 of the records it shares,
//! `partition_log.rs`) until it is written, so those readers are closed once the budget is
//! spent, and the memory behind unread answers stays within `--queued-max-request-bytes`.
//!
//! Scaled to a few MiB by small flags, on an in-process broker whose counters are read
//! directly; the test process's resident memory is read from `/proc`. Every wait bounded.

use std::time::{Duration, Instant};

use bytes::Bytes;
use purgatory_examples::broker::BrokerConfig;
use purgatory_examples::huge_allocations::HugeAllocationsMappedLazily;
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::{requests, WireClient};
use tokio::time::timeout;

mod support;
use support::process::resident_bytes;
use support::producer::produce;
use support::{config, connect, eventually, start, LIMIT};

#[global_allocator]
static ALLOCATOR: HugeAllocationsMappedLazily = HugeAllocationsMappedLazily;

const MIB: usize = 1 << 20;

/// Each round appends this many batches of [`BATCH_BYTES`]: 1.2 MB, one sealed segment.
const BATCHES_PER_ROUND: usize = 4;
const BATCH_BYTES: usize = 300_000;

/// Readers that never read, one a round, each fetching that round's segment.
const READERS: usize = 64;
/// Fetches each reader pipelines: enough answers to fill the sockets' buffers, so one
/// stays in the broker, unwritten.
const PIPELINED: usize = 16;

const BUDGET: usize = 8 * MIB;
const RETENTION: u64 = 4 * MIB as u64;

/// Appends one round of batches; the offset of its first record.
async fn round(producer: &mut WireClient) -> i64 {
    let mut first = None;
    for i in 0..BATCHES_PER_ROUND {
        let batch = encode_batch(&[Bytes::from(vec![i as u8; BATCH_BYTES])], 1_000);
        let (error, base) = produce(producer, 7, batch).await;
        assert_eq!(error, 0, "a produce failed");
        first.get_or_insert(base);
    }
    first.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding5_unread_answers_keep_dropped_segments_only_within_the_budget() {
    let broker = start(BrokerConfig {
        retention_bytes: RETENTION,
        queued_max_request_bytes: BUDGET,
        max_frame_bytes: 4 * MIB,
        // Nothing is closed for writing too slowly while the test looks.
        write_timeout: Duration::from_secs(120),
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    let mut producer = connect(addr).await;
    // The log at its retention first, so what grows below is what the readers keep.
    for _ in 0..8 {
        round(&mut producer).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = resident_bytes(std::process::id());
    let started = Instant::now();

    let mut readers = Vec::with_capacity(READERS);
    for _ in 0..READERS {
        let first = round(&mut producer).await;
        let mut fetch = requests::fetch("demo", 0, first, 1, 0);
        fetch.topics[0].partitions[0].partition_max_bytes = 8 * MIB as i32;
        let mut reader = connect(addr).await;
        for _ in 0..PIPELINED {
            // A reader the broker already closed refuses the rest: fine.
            if reader.send(12, &fetch).await.is_err() {
                break;
            }
        }
        readers.push(reader);
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let grown = resident_bytes(std::process::id()).saturating_sub(before);
    let stats = broker.stats();
    eprintln!(
        "{READERS} readers never reading fetches of 1.2 MB segments, retention {} MiB, \
         budget {} MiB: resident memory grew {} MiB in {:?}; {} connections open, {} bytes \
         counted, the log {} bytes",
        RETENTION >> 20,
        BUDGET >> 20,
        grown >> 20,
        started.elapsed(),
        stats.connections,
        stats.queued_request_bytes,
        stats.log_bytes,
    );
    assert!(stats.log_bytes <= RETENTION + 2 * MIB as u64, "{stats:?}");
    // What the unread answers keep is counted (each open reader's segment at least, its
    // own 64 KiB aside), within the budget.
    let readers_open = stats.connections.saturating_sub(1);
    assert!(
        stats.queued_request_bytes + readers_open * 64 * 1024
            >= readers_open * BATCHES_PER_ROUND * BATCH_BYTES,
        "{readers_open} unread answers not counted: {stats:?}"
    );
    assert!(stats.queued_request_bytes <= BUDGET, "{stats:?}");
    // Each unread answer keeps its 1.2 MB segment: 76 MB for the 64 readers if none were
    // closed (70 MiB grown on main 28a5bbf).
    assert!(
        grown < 3 * BUDGET as u64,
        "unread answers keep {} MiB (budget {} MiB, retention {} MiB)",
        grown >> 20,
        BUDGET >> 20,
        RETENTION >> 20
    );
    // The budget holds 6 of them, and the other connections were closed.
    assert!(
        stats.connections <= BUDGET / BATCH_BYTES / BATCHES_PER_ROUND + 2,
        "{readers_open} readers' unread answers held with a budget of {} MiB: {stats:?}",
        BUDGET >> 20
    );

    // Once the readers leave, the budget is given back, and a consumer reads the log from
    // its start to its end, a segment an answer.
    drop(readers);
    eventually("the budget given back", || {
        broker.stats().queued_request_bytes == 0
    })
    .await;
    let end = round(&mut producer).await + BATCHES_PER_ROUND as i64;
    let mut consumer = connect(addr).await;
    let earliest = timeout(
        LIMIT,
        consumer.call(6, &requests::list_offsets("demo", 0, -2)),
    )
    .await
    .unwrap()
    .unwrap();
    let mut offset = earliest.topics[0].partitions[0].offset;
    assert!(offset > 0, "retention dropped nothing");
    while offset < end {
        let answer = timeout(
            LIMIT,
            consumer.call(12, &requests::fetch("demo", 0, offset, 1, 0)),
        )
        .await
        .unwrap()
        .unwrap();
        let partition = &answer.responses[0].partitions[0];
        assert_eq!(partition.error_code, 0, "fetch at {offset}");
        let records = partition.records.clone().unwrap_or_default();
        let batches = purgatory_examples::record_batch::framed_batches(&records).count();
        assert!(batches > 0, "nothing read at {offset}");
        offset += batches as i64;
    }
    assert_eq!(offset, end);
    broker.shutdown().await;
}
