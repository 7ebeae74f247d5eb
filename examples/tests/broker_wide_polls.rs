//! Parked fetches over many partitions (issue #38, finding 4). Before, a parked fetch kept
//! about 130 bytes per distinct partition outside every bound (300 polls over 9,999
//! partitions held 382 MiB), and each check of a partition re-read every partition of
//! every fetch parked on it (2,000 polls over 1,000 partitions took appends from 394k/s to
//! 3.5k/s). Now what a parked fetch keeps is held in its connection's account until it is
//! answered (`src/broker/fetch.rs`), and a check re-reads only the partition checked
//! (`src/delayed_fetch.rs`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::FetchRequest;
use purgatory_examples::broker::{Broker, BrokerConfig};
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::{requests, WireClient};
use tokio::time::timeout;

mod support;
use support::{config, connect, eventually, over_partitions, start, LIMIT};

/// A long poll nothing satisfies (`min_bytes` and `max_wait_ms` 2^31-1, capped by the
/// broker at `--fetch-max-wait-ms`) of every one of `partitions` partitions.
fn wide_poll(partitions: i32) -> FetchRequest {
    over_partitions(
        requests::fetch("demo", 0, 0, i32::MAX, i32::MAX),
        partitions,
    )
}

/// A broker of `partitions` partitions that takes `connections` connections from one
/// address.
fn wide_config(partitions: usize, connections: usize) -> BrokerConfig {
    BrokerConfig {
        max_connections: connections + 16,
        max_connections_per_ip: Some(connections + 16),
        ..config(partitions)
    }
}

/// Sends one `wide_poll(partitions)` on each of `clients` new connections.
async fn park_polls(broker: &Broker, clients: usize, partitions: i32) -> Vec<WireClient> {
    let poll = wide_poll(partitions);
    let mut parked = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut client = connect(broker.local_addr()).await;
        client.send(4, &poll).await.unwrap();
        parked.push(client);
    }
    parked
}

/// Round trips of `rounds` acks=1 produces of one small record, each to the next of
/// `partitions` partitions; their median.
async fn produce_median(client: &mut WireClient, rounds: usize, partitions: usize) -> Duration {
    let batch = encode_batch(&[Bytes::from_static(b"record")], 1_000);
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let request =
            requests::produce("demo", (round % partitions) as i32, 1, 1_000, batch.clone());
        let began = Instant::now();
        let answer = timeout(LIMIT, client.call(7, &request))
            .await
            .expect("answered")
            .unwrap();
        times.push(began.elapsed());
        assert_eq!(answer.responses[0].partition_responses[0].error_code, 0);
    }
    times.sort();
    times[rounds / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_38_finding_4_an_append_costs_the_same_whatever_the_polls_parked_on_it_span() {
    // The finding's scale, for a measurement by hand (release):
    // `WIDE_POLLS=2000 WIDE_PARTITIONS=1000 cargo test --release -p purgatory-examples
    // --test broker_wide_polls -- --nocapture an_append`.
    let from_env = |name: &str, default: usize| {
        std::env::var(name).map_or(default, |v| v.parse().expect("a number"))
    };
    let (partitions, polls) = (
        from_env("WIDE_PARTITIONS", 2_000),
        from_env("WIDE_POLLS", 200),
    );
    const NARROW: usize = 10;
    let broker = start(wide_config(partitions, polls + 1)).await;
    let mut producer = connect(broker.local_addr()).await;
    // Appends go to the first `NARROW` partitions only: each is then followed by a check
    // that tries every poll, the narrow ones (over those partitions alone) as the wide ones
    // (over all of them). Before, a wide poll's try re-read all its partitions.
    let alone = produce_median(&mut producer, 200, NARROW).await;
    let mut medians = Vec::new();
    for span in [NARROW, partitions] {
        let parked = park_polls(&broker, polls, span as i32).await;
        eventually("every poll parked", || {
            broker.stats().leader.fetch.pending == polls
        })
        .await;
        medians.push(produce_median(&mut producer, 200, NARROW).await);
        assert_eq!(
            broker.stats().leader.fetch.pending,
            polls,
            "no poll answered"
        );
        drop(parked);
        eventually("the polls gone", || {
            broker.stats().leader.fetch.pending == 0
        })
        .await;
    }
    let (narrow, wide) = (medians[0], medians[1]);
    eprintln!(
        "acks=1 produce, median round trip: {alone:?} alone, {narrow:?} beside {polls} polls \
         of {NARROW} partitions, {wide:?} beside {polls} polls of {partitions}"
    );
    // Wide polls cost more cache misses a try (their state is larger), not more work.
    assert!(
        wide < narrow * 2 + Duration::from_micros(500),
        "an append beside {polls} polls of {partitions} partitions took {wide:?}, beside \
         polls of {NARROW} {narrow:?}"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_38_finding_4_a_parked_poll_holds_what_it_keeps_in_the_budget() {
    const PARTITIONS: i32 = 9_999;
    const POLLS: usize = 12;
    const BUDGET: usize = 8 << 20;
    let per_poll = PARTITIONS as usize * purgatory_examples::broker::PARKED_BYTES_PER_PARTITION;
    assert!(per_poll > 1 << 20, "each poll keeps {per_poll} bytes");
    let broker = start(BrokerConfig {
        queued_max_request_bytes: BUDGET,
        ..wide_config(PARTITIONS as usize, POLLS)
    })
    .await;
    // One poll at a time, each parked or answered before the next is sent: a frame read
    // while the budget is full would close its connection instead (the budget's rule for
    // reads), which is not what this test looks at.
    let poll = wide_poll(PARTITIONS);
    let mut clients = Vec::with_capacity(POLLS);
    let mut answered_at_once = 0;
    for sent in 0..POLLS {
        let mut client = connect(broker.local_addr()).await;
        client.send(4, &poll).await.unwrap();
        let parked_before = sent - answered_at_once;
        let parked = async {
            while broker.stats().leader.fetch.pending == parked_before {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        // The polls the budget cannot hold are answered at once, with what there is
        // (nothing); the others stay parked.
        tokio::select! {
            answer = client.receive::<FetchRequest>() => {
                let answer = answer.expect("an answer, not a closed connection");
                assert_eq!(answer.error_code, 0);
                assert_eq!(answer.responses[0].partitions.len(), PARTITIONS as usize);
                // The wait it asked for (capped at `--fetch-max-wait-ms`), as a throttle
                // time: a consumer backs off instead of polling again at once.
                assert_eq!(answer.throttle_time_ms, 30_000);
                answered_at_once += 1;
            }
            () = parked => {}
            () = tokio::time::sleep(LIMIT) => panic!("poll {sent} neither parked nor answered"),
        }
        clients.push(client);
    }
    let stats = broker.stats();
    let parked = stats.leader.fetch.pending;
    eprintln!(
        "{POLLS} polls of {PARTITIONS} partitions ({per_poll} bytes each) in a {BUDGET}-byte \
         budget: {parked} parked, {answered_at_once} answered at once, {} bytes counted",
        stats.queued_request_bytes
    );
    assert_eq!(parked + answered_at_once, POLLS);
    assert!(parked >= 1, "the budget holds some");
    assert!(answered_at_once >= 1, "the budget cannot hold them all");
    // Each parked poll is counted, beyond its connection's own 64 KiB.
    assert!(
        stats.queued_request_bytes >= parked * (per_poll - (64 << 10)),
        "{} bytes counted for {parked} parked polls of {per_poll} bytes",
        stats.queued_request_bytes
    );
    // Answered, a poll gives its bytes back.
    drop(clients);
    eventually("the parked polls' bytes given back", || {
        broker.stats().queued_request_bytes == 0
    })
    .await;
    broker.shutdown().await;
}
