//! A produce flood while many polls wait never stalls the high watermark nor the shutdown
//! (issue #29, finding 2): follower notices are coalesced (one report covers every notice
//! due) and a check of a partition runs once per round of events, not once per event.
//!
//! At a scale a loaded 2-core machine runs in seconds: polls that cannot complete, parked
//! on the flooded partition (each naming it many times, so every check of the partition
//! walks 400,000 entries), while a few connections send tiny acks=0 produces;
//! with two followers 1 ms behind, so that a check takes longer than the followers' lag
//! (what 10,000 polls and 50 ms do to a release build under load, issue #29).

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use purgatory_examples::followers::FollowerConfig;
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::{requests, WireClient};
use support::{config, connect, start};
use tokio::time::timeout;

/// Connections each parking one poll (few enough for a 1,024 open-file limit: the test
/// holds both ends).
const POLLS: usize = 400;
/// How many times each poll names the partition: every check walks POLLS x ENTRIES.
const ENTRIES: usize = 1_000;
/// Connections sending acks=0 produces, and for how long.
const FLOODERS: usize = 4;
const FLOOD: Duration = Duration::from_secs(4);
/// A good acks=all produce's own timeout: generous, the followers are 1 ms behind.
const GOOD_TIMEOUT_MS: i32 = 10_000;

/// One acks=all produce of one record: its error code (0: acknowledged).
async fn good_produce(client: &mut WireClient) -> i16 {
    let batch = encode_batch(&[Bytes::from_static(b"good")], 0);
    let request = requests::produce("demo", 0, -1, GOOD_TIMEOUT_MS, batch);
    let answer = timeout(Duration::from_secs(30), client.call(7, &request))
        .await
        .expect("an acks=all produce is answered within its timeout")
        .unwrap();
    answer.responses[0].partition_responses[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_high_watermark_follows_a_flood_and_shutdown_is_prompt() {
    let mut config = config(1);
    config.followers = FollowerConfig {
        count: 2,
        lag: Duration::from_millis(1),
        stalled: false,
    };
    let broker = start(config).await;
    let addr = broker.local_addr();

    // Polls that cannot complete (more bytes than will ever come), on the flooded partition.
    let mut fetch = requests::fetch("demo", 0, 0, i32::MAX, 60_000);
    let wanted = fetch.topics[0].partitions[0].clone();
    fetch.topics[0].partitions = vec![wanted; ENTRIES];
    let mut parked = Vec::with_capacity(POLLS);
    for _ in 0..POLLS {
        let mut client = connect(addr).await;
        client.send(4, &fetch).await.unwrap();
        parked.push(client);
    }
    support::eventually("every poll parked", || {
        broker.stats().leader.fetch.pending >= POLLS
    })
    .await;

    let flooding = Arc::new(AtomicBool::new(true));
    let flooded = Arc::new(AtomicU64::new(0));
    let mut flooders = Vec::new();
    for _ in 0..FLOODERS {
        let mut client = connect(addr).await;
        let (flooding, flooded) = (flooding.clone(), flooded.clone());
        flooders.push(tokio::spawn(async move {
            while flooding.load(Ordering::Relaxed) {
                let batch = encode_batch(&[Bytes::from_static(b"f")], 0);
                let request = requests::produce("demo", 0, 0, 0, batch);
                client.send(7, &request).await.unwrap();
                flooded.fetch_add(1, Ordering::Relaxed);
            }
            client
        }));
    }

    // During the flood: a good client's acks=all produces are acknowledged.
    let mut good = connect(addr).await;
    let flood_ends = Instant::now() + FLOOD;
    let (mut acknowledged, mut refused) = (0, 0);
    while Instant::now() < flood_ends {
        match good_produce(&mut good).await {
            0 => acknowledged += 1,
            _ => refused += 1,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What failed, told at the end: the shutdown is measured whatever came before.
    let mut failed = Vec::new();
    if refused > 0 {
        failed.push(format!(
            "{refused} acks=all produces during the flood were not acknowledged within \
             {GOOD_TIMEOUT_MS} ms ({acknowledged} were)"
        ));
    }
    flooding.store(false, Ordering::Relaxed);
    let mut flooders_clients = Vec::with_capacity(FLOODERS);
    for flooder in flooders {
        flooders_clients.push(flooder.await.unwrap());
    }
    let flooded = flooded.load(Ordering::Relaxed);
    assert!(flooded > 1_000, "only {flooded} produces flooded");

    // Right after it: one more is acknowledged, so the high watermark passed everything
    // the flood appended.
    let after = Instant::now();
    if good_produce(&mut good).await != 0 {
        failed.push(format!(
            "the high watermark had not caught up {GOOD_TIMEOUT_MS} ms after a flood of \
             {flooded} produces"
        ));
    }
    let caught_up = after.elapsed();

    // And the shutdown does not wait for whatever the followers still had to copy.
    let stopping = Instant::now();
    let stats = timeout(Duration::from_secs(20), broker.shutdown()).await;
    let shutdown = stopping.elapsed();
    if shutdown >= Duration::from_secs(5) {
        failed.push(format!(
            "the shutdown took {shutdown:?} (20 s at most: given up)"
        ));
    }
    eprintln!(
        "{flooded} produces flooded; {acknowledged} acks=all acknowledged during the flood, \
         {refused} not; caught up {caught_up:?} after it; shutdown {shutdown:?}"
    );
    assert!(failed.is_empty(), "{}", failed.join("; "));
    let stats = stats.expect("shut down");
    assert!(stats.leader.fetch.expired_at_shutdown as usize >= POLLS);
    drop((parked, flooders_clients));
}

/// What one check of a partition costs with 10,000 polls parked on it, and what appends
/// from several threads at once cost when checks are coalesced (no followers: every append
/// moves the high watermark and asks for a check of both purgatories). Prints; asserts
/// nothing about time.
#[test]
#[ignore = "a measurement: cargo test --release -p purgatory-examples --test broker_flood -- --ignored --nocapture"]
fn cost_of_a_check_over_parked_polls() {
    use purgatory_examples::delayed_fetch::BytesWait;
    use purgatory_examples::leader::Leader;
    use purgatory_examples::partition::PartitionKey;
    use purgatory_examples::record_batch::ProducedBatch;

    let raw = encode_batch(&[Bytes::from_static(b"f")], 0);
    let batch = || ProducedBatch::parse_all(&raw).unwrap();
    let none = FollowerConfig {
        count: 0,
        lag: Duration::ZERO,
        stalled: false,
    };
    for (polls, entries) in [(0, 1), (10_000, 1), (10_000, 6)] {
        let leader = Arc::new(Leader::start(1, none));
        let key = PartitionKey(0);
        let wait = BytesWait {
            key,
            partition: leader.partition(key).unwrap().clone(),
            start_position: 0,
            max_bytes: u64::MAX,
        };
        let parked: Vec<_> = (0..polls)
            .map(|_| {
                leader.wait_for_bytes(
                    Duration::from_secs(600),
                    u64::MAX,
                    vec![wait.clone(); entries],
                )
            })
            .collect();
        // One thread: every append finds no check running and checks inline.
        let appends = 2_000;
        let started = Instant::now();
        for _ in 0..appends {
            leader.append(key, batch()).unwrap();
        }
        let alone = started.elapsed() / appends;
        // Four threads for one second: an append that finds a check running only marks it.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let leader = Arc::clone(&leader);
                let raw = raw.clone();
                std::thread::spawn(move || {
                    let until = Instant::now() + Duration::from_secs(1);
                    let mut done = 0u64;
                    while Instant::now() < until {
                        leader
                            .append(key, ProducedBatch::parse_all(&raw).unwrap())
                            .unwrap();
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let together: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        eprintln!(
            "{polls} polls x {entries} entries parked: one append (with its check) {alone:?} \
             from one thread; {together} appends/s from 4 threads"
        );
        drop(parked);
        leader.shutdown();
    }
}
