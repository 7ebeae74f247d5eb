//! What a client's bytes cost the broker's CPU (issue #38, finding 1): flexible versions
//! take topic names of any length, and a topic entry names many partitions, so a request
//! whose work goes per partition over the name costs name length times partitions.
//! Before, one Fetch v12 of 1.38 MB (a 1 MiB name, 9,999 partitions) took about 4 s of
//! broker CPU (2.97 ms per KiB sent), and 18 MB of them kept good clients waiting up to
//! 35 s. Now each name is read once per request (`src/broker/topic_ids.rs`).
//!
//! Each request is timed beside the same request with a short name: the long name may
//! cost its own bytes (decoding, one hash, one echo), not its bytes once per partition.

use std::time::{Duration, Instant};

use kafka_protocol::messages::{FetchRequest, ListOffsetsRequest};
use purgatory_examples::wire_client::{requests, WireClient};
use tokio::time::timeout;

mod support;
use support::process::BrokerProcess;
use support::{config, connect, over_partitions, start, LIMIT};

/// Partitions a request names, under the broker's default cap of 10,000 entries.
const PARTITIONS: i32 = 9_999;

/// A name of `len` bytes.
fn name(len: usize) -> String {
    "n".repeat(len)
}

/// A Fetch that asks once for each of `PARTITIONS` partitions of `topic`, and waits for
/// nothing.
fn fetch(topic: &str) -> FetchRequest {
    over_partitions(requests::fetch(topic, 0, 0, 0, 0), PARTITIONS)
}

/// A ListOffsets of each of `PARTITIONS` partitions of `topic`.
fn list_offsets(topic: &str) -> ListOffsetsRequest {
    let mut request = requests::list_offsets(topic, 0, -1);
    let one = request.topics[0].partitions[0].clone();
    request.topics[0].partitions = (0..PARTITIONS)
        .map(|index| {
            let mut p = one.clone();
            p.partition_index = index;
            p
        })
        .collect();
    request
}

/// How long the broker takes to answer `request` (Fetch v12), the fastest of three.
async fn fetch_time(client: &mut WireClient, request: &FetchRequest) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let began = Instant::now();
        let answer = timeout(LIMIT, client.call(12, request))
            .await
            .expect("answered")
            .unwrap();
        best = best.min(began.elapsed());
        assert_eq!(answer.responses.len(), 1, "one topic entry");
        assert_eq!(answer.responses[0].partitions.len(), PARTITIONS as usize);
    }
    best
}

/// How long the broker takes to answer `request` (ListOffsets v6), the fastest of three.
async fn list_time(client: &mut WireClient, request: &ListOffsetsRequest) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let began = Instant::now();
        let answer = timeout(LIMIT, client.call(6, request))
            .await
            .expect("answered")
            .unwrap();
        best = best.min(began.elapsed());
        assert_eq!(answer.topics[0].partitions.len(), PARTITIONS as usize);
    }
    best
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_topic_name_costs_its_bytes_once_not_once_per_partition() {
    let broker = start(config(1)).await;
    let mut client = connect(broker.local_addr()).await;
    let (short, long) = (name(8), name(1 << 20));
    let mut figures = Vec::new();
    for (what, topic) in [("short", &short), ("1 MiB", &long)] {
        let fetched = fetch_time(&mut client, &fetch(topic)).await;
        let listed = list_time(&mut client, &list_offsets(topic)).await;
        eprintln!("{what} name, {PARTITIONS} partitions: Fetch v12 {fetched:?}, ListOffsets v6 {listed:?}");
        figures.push((fetched, listed));
    }
    let [(short_fetch, short_list), (long_fetch, long_list)] = figures[..] else {
        unreachable!()
    };
    // The long name's own bytes (1 MiB decoded, hashed once, echoed once) cost a few
    // milliseconds; per partition, they cost seconds.
    let slack = Duration::from_millis(500);
    assert!(
        long_fetch < short_fetch * 3 + slack,
        "Fetch: {long_fetch:?} with a 1 MiB name, {short_fetch:?} with a short one"
    );
    assert!(
        long_list < short_list * 3 + slack,
        "ListOffsets: {long_list:?} with a 1 MiB name, {short_list:?} with a short one"
    );
    broker.shutdown().await;
}

/// The finding's last case, on the broker binary: two Fetch v12 of a 16 MiB name over
/// 9,999 partitions each. Before, they failed 10 of 10 good probes and the broker exited
/// 88 s after SIGTERM. Now a good client's polls are answered beside them, and a SIGTERM
/// sent while two more are being handled ends the broker promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_16_mib_names_leave_good_clients_served_and_sigterm_prompt() {
    let broker = BrokerProcess::start(&[]);
    let heavy = fetch(&name(16 << 20));
    let mut senders = Vec::new();
    for _ in 0..2 {
        let mut client = connect(broker.addr).await;
        let request = heavy.clone();
        senders.push(tokio::spawn(async move {
            let began = Instant::now();
            client.send(12, &request).await.unwrap();
            let answer = timeout(LIMIT, client.receive::<FetchRequest>())
                .await
                .expect("the heavy fetch answered")
                .unwrap();
            assert_eq!(answer.responses[0].partitions.len(), PARTITIONS as usize);
            began.elapsed()
        }));
    }
    let mut good = connect(broker.addr).await;
    let poll = requests::fetch("demo", 0, 0, 0, 0);
    let mut heavy_answered = Vec::new();
    // Both answered (each a 16 MiB echo of the name), timed beside the good polls.
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let began = Instant::now();
        let answer = timeout(LIMIT, good.call(12, &poll))
            .await
            .expect("a good poll answered")
            .unwrap();
        assert_eq!(answer.responses[0].partitions[0].error_code, 0);
        slowest = slowest.max(began.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for sender in senders {
        heavy_answered.push(sender.await.unwrap());
    }
    // Two more, and SIGTERM while the broker handles them.
    let mut in_flight = Vec::new();
    for _ in 0..2 {
        let mut client = connect(broker.addr).await;
        client.send(12, &heavy).await.unwrap();
        in_flight.push(client);
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let pid = libc::pid_t::try_from(broker.pid()).unwrap();
    let signalled = Instant::now();
    // SAFETY: kill only sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let exited = tokio::task::spawn_blocking(move || {
        let mut broker = broker;
        broker.wait_exit(LIMIT)
    })
    .await
    .unwrap();
    eprintln!(
        "two 16 MiB-name fetches answered in {heavy_answered:?}; slowest of 10 good polls \
         beside them {slowest:?}; exit {:?} after SIGTERM with two more in flight",
        signalled.elapsed()
    );
    assert!(
        exited,
        "the broker did not exit within {LIMIT:?} of SIGTERM"
    );
    assert!(
        slowest < Duration::from_secs(2),
        "a good poll took {slowest:?}"
    );
}
