//! The load tool's measurements, at toy sizes, against an in-process broker: they
//! must complete and count what they claim to count.

use std::time::Duration;

use purgatory_examples::broker::{Broker, BrokerConfig};
use purgatory_examples::followers::FollowerConfig;
use purgatory_examples::huge_allocations::HugeAllocationsMappedLazily;
use purgatory_examples::load::{
    fetch_wakeup, flood, hostile, idle_polls, left_polls, produce_latency,
};

#[global_allocator]
static ALLOCATOR: HugeAllocationsMappedLazily = HugeAllocationsMappedLazily;

async fn start(followers: usize, lag_ms: u64) -> Broker {
    Broker::start(BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        followers: FollowerConfig {
            count: followers,
            lag: Duration::from_millis(lag_ms),
            stalled: false,
        },
        ..BrokerConfig::default()
    })
    .await
    .unwrap()
}

/// Ten acks=1 produces of 10-byte records on one connection, nothing parked.
fn ten_produces(broker: &Broker) -> produce_latency::ProduceLatencyConfig {
    produce_latency::ProduceLatencyConfig {
        broker: broker.local_addr(),
        topic: "demo".into(),
        partition: 0,
        requests: 10,
        connections: 1,
        record_bytes: 10,
        acks: 1,
        timeout_ms: 30_000,
        parked_fetches: 0,
        fetch_entries: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_latency_counts_every_acknowledged_request() {
    let lag = Duration::from_millis(20);
    let broker = start(2, lag.as_millis() as u64).await;
    let config = produce_latency::ProduceLatencyConfig {
        connections: 2,
        acks: -1,
        ..ten_produces(&broker)
    };
    let report = produce_latency::run(&config).await.unwrap();
    assert_eq!(report.errors, 0);
    let latency = report.latency.unwrap();
    assert_eq!(latency.count, 10);
    assert!(
        latency.p50 >= lag,
        "acks=all answered before the replication delay"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_wakeup_sees_every_round_answered_with_data() {
    let broker = start(0, 0).await;
    let config = fetch_wakeup::FetchWakeupConfig {
        broker: broker.local_addr(),
        topic: "demo".into(),
        partition: 0,
        rounds: 10,
        max_wait_ms: 30_000,
        park_time: Duration::from_millis(2),
    };
    let report = fetch_wakeup::run(&config).await.unwrap();
    assert_eq!(report.empty_answers, 0);
    assert_eq!(report.wakeup.unwrap().count, 10);
    assert!(
        report.wakeup.unwrap().max < Duration::from_secs(15),
        "woken at max_wait"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_polls_parks_them_all_and_one_append_answers_them() {
    let broker = start(0, 0).await;
    let config = idle_polls::IdlePollsConfig {
        broker: broker.local_addr(),
        // The broker lives in this process.
        broker_pid: Some(std::process::id()),
        topic: "demo".into(),
        partition: 0,
        connections: 50,
        max_wait_ms: 30_000,
        idle: Duration::from_millis(300),
    };
    let report = idle_polls::run(&config).await.unwrap();
    assert_eq!(report.parked, 50);
    assert_eq!(report.unanswered, 0);
    assert_eq!(report.wakeup.unwrap().count, 50);
    let usage = report.usage.unwrap();
    assert!(usage.parked.rss_kib > 0);
    assert!(usage.rss_range_kib.0 <= usage.rss_range_kib.1);
    assert!(broker.stats().leader.fetch.completed >= 1);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_latency_runs_while_fetches_naming_the_partition_often_wait() {
    let broker = start(0, 0).await;
    let config = produce_latency::ProduceLatencyConfig {
        parked_fetches: 2,
        fetch_entries: 500,
        ..ten_produces(&broker)
    };
    let report = produce_latency::run(&config).await.unwrap();
    assert_eq!((report.errors, report.latency.unwrap().count), (0, 10));
    // The run checked both fetches were still waiting at its end (a parked fetch that
    // was answered or closed is an error), then closed their connections: the broker
    // cancels them, none ever completes. (Right after the run, each may or may not be
    // cancelled yet.)
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let fetch = loop {
        let fetch = broker.stats().leader.fetch;
        if fetch.cancelled == 2 || std::time::Instant::now() > deadline {
            break fetch;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!((fetch.pending, fetch.completed, fetch.cancelled), (0, 0, 2));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn left_polls_sees_the_descriptors_come_back() {
    let broker = start(0, 0).await;
    let config = left_polls::LeftPollsConfig {
        broker: broker.local_addr(),
        // The broker lives in this process (its clients' sockets too).
        broker_pid: std::process::id(),
        topic: "demo".into(),
        partition: 0,
        connections: 20,
    };
    let report = left_polls::run(&config).await.unwrap();
    assert!(report.parked.open_files >= report.before.open_files + 20);
    assert!(report.returned_after.unwrap() < Duration::from_secs(10));
    assert_eq!(broker.stats().leader.fetch.cancelled, 20);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_stay_connected_and_are_counted() {
    let broker = start(0, 0).await;
    // The broker lives in this process (its clients' sockets too).
    let pid = std::process::id();
    let scenario = hostile::Scenario::named("partial-frames", 0, 0).unwrap();
    let report = hostile::run(broker.local_addr(), pid, scenario, 3)
        .await
        .unwrap();
    // (The descriptor counts are this whole process's, which other tests share.)
    assert_eq!(report.closed_by_broker, 0);
    assert!(report.held.rss_kib > 0 && report.held_files > 0);
    assert!(hostile::Scenario::named("no-such", 0, 0).is_none());
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_runs_and_sees_the_high_watermark_catch_up() {
    let broker = start(2, 5).await;
    let config = flood::FloodConfig {
        broker: broker.local_addr(),
        topic: "demo".into(),
        partition: 0,
        connections: 20,
        fetch_entries: 6,
        producers: 2,
        flood: Duration::from_millis(500),
        record_bytes: 10,
        good_interval: Duration::from_millis(50),
        good_timeout_ms: 10_000,
        catch_up_limit: Duration::from_secs(30),
    };
    let report = flood::run(&config).await.unwrap();
    assert!(report.flooded > 0);
    assert!(report.good.is_some_and(|good| good.count >= 1));
    assert_eq!(report.good_failed, 0);
    assert!(report.caught_up_after.is_some());
    broker.shutdown().await;
}
