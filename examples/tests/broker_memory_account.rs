//! Issue #29, findings 1, 3 and 4: everything a client makes the broker hold is counted in
//! one account (`--queued-max-request-bytes`, with a per-connection share of
//! `--max-frame-bytes`) until it is freed. Scaled to a few MiB by small flags; every wait
//! bounded. The parked fetch (finding 1) is measured on the broker binary, whose resident
//! memory is read from `/proc`; the rest on an in-process broker's own account.
//!
//! The review of issue #29, finding 3: what a request decodes into. Topics count against
//! `--max-partitions-per-request` as well as partitions, counted in the raw body before it
//! is decoded, so a frame of empty topics (3 bytes on the wire, about 100 decoded) is
//! refused undecoded, and a parked acks=all produce keeps only the names its answer echoes.
//!
//! The second review of issue #29, findings 1 and 5: a Produce partition's record batches
//! after its first count against the same cap (each decodes into a batch and a copy of
//! its bytes), and the request header's tagged fields share the cap with the body's
//! entries.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use purgatory_examples::broker::BrokerConfig;
use purgatory_examples::huge_allocations::HugeAllocationsMappedLazily;
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::requests;
use tokio::time::timeout;

mod support;
use support::process::BrokerProcess;
use support::{closed_within, config, connect, endless_poll, start, LIMIT};

#[global_allocator]
static ALLOCATOR: HugeAllocationsMappedLazily = HugeAllocationsMappedLazily;

const MIB: usize = 1 << 20;

/// Polls `check` every 10 ms for at most `within`; whether it held.
async fn holds_within(within: Duration, check: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A fresh client's produce of `bytes` bytes: whether it was appended.
async fn big_produce_passes(addr: SocketAddr, bytes: usize) -> bool {
    let mut producer = connect(addr).await;
    let batch = encode_batch(&[Bytes::from(vec![b'p'; bytes])], 1_000);
    match timeout(
        LIMIT,
        producer.call(7, &requests::produce("demo", 0, 1, 1000, batch)),
    )
    .await
    {
        Ok(Ok(answer)) => answer.responses[0].partition_responses[0].error_code == 0,
        _ => false,
    }
}

/// Finding 1: a parked Fetch v12 padded to 8 MiB in an unknown tagged field. Its decoded
/// topic name was a slice of the frame, so the wait pinned all 8 MiB, outside the budget
/// (24 polls: +192 MiB). The wait now keeps nothing of the frame; what the allocator keeps
/// of the freed frames (16-33 MiB over runs) stays well below half of that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding1_a_parked_fetch_keeps_none_of_its_padded_frame() {
    const POLLS: usize = 24;
    let broker = BrokerProcess::start(&["--fetch-max-wait-ms", "60000"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = broker.rss_mib();
    let mut padded = endless_poll();
    padded
        .unknown_tagged_fields
        .insert(1_000, Bytes::from(vec![0x55u8; 8 * MIB]));
    let mut clients = Vec::with_capacity(POLLS);
    for _ in 0..POLLS {
        let mut client = connect(broker.addr).await;
        client.send(12, &padded).await.unwrap();
        clients.push(client);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let grown = broker.rss_mib().saturating_sub(before);
    eprintln!("{POLLS} parked fetches padded to 8 MiB: RSS grew by {grown} MiB");
    // Every poll is still parked: no answer, no close.
    for client in &mut clients {
        assert!(
            !closed_within(client, Duration::from_millis(20)).await,
            "a padded poll was answered or closed instead of parked"
        );
    }
    // Pinned frames would be 24 x 8 MiB = 192 MiB.
    assert!(
        grown < (POLLS as u64 * 8) / 2,
        "{POLLS} parked padded fetches hold {grown} MiB"
    );
    drop(clients);
}

/// Finding 3: answers echoing a 12 MB topic name, never read. They copied the name outside
/// the budget (5 connections: 60 MB held, the account at 0); now the answer shares the
/// request's bytes and the request stays counted until the answer is written, so two fit
/// in a 24 MiB budget and the others are closed. `api` is what each client sends.
async fn unread_echoes_stay_in_the_budget(api: &str) {
    const CLIENTS: usize = 5;
    const BUDGET: usize = 24 * MIB;
    let name = "u".repeat(12_000_000);
    let broker = start(BrokerConfig {
        queued_max_request_bytes: BUDGET,
        max_frame_bytes: 16 * MIB,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut client = connect(addr).await;
        // The writes a closing broker refuses are fine.
        let _ = match api {
            "ListOffsets v6" => client.send(6, &requests::list_offsets(&name, 0, -1)).await,
            "Produce v9" => {
                let batch = encode_batch(&[Bytes::from_static(b"x")], 1_000);
                client
                    .send(9, &requests::produce(&name, 0, 1, 1000, batch))
                    .await
            }
            "Fetch v12" => client.send(12, &requests::fetch(&name, 0, 0, 1, 0)).await,
            other => panic!("no such case {other}"),
        };
        clients.push(client);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = broker.stats();
    eprintln!(
        "{api}: {CLIENTS} unread 12 MB echoes: {} connections open, {} bytes counted",
        stats.connections, stats.queued_request_bytes
    );
    assert!(
        stats.queued_request_bytes >= 12_000_000 - 64 * 1024,
        "{api}: an unread echo is not counted: {stats:?}"
    );
    assert!(stats.queued_request_bytes <= BUDGET, "{api}: {stats:?}");
    assert!(
        (1..=2).contains(&stats.connections),
        "{api}: {} of {CLIENTS} unread echoes held (at most 2 fit): {stats:?}",
        stats.connections
    );
    drop(clients);
    assert!(
        holds_within(LIMIT, || broker.stats().queued_request_bytes == 0).await,
        "{api}: the account was not given back"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding3_list_offsets_echoes_never_read_stay_in_the_budget() {
    unread_echoes_stay_in_the_budget("ListOffsets v6").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding3_produce_echoes_never_read_stay_in_the_budget() {
    unread_echoes_stay_in_the_budget("Produce v9").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding3_fetch_echoes_never_read_stay_in_the_budget() {
    unread_echoes_stay_in_the_budget("Fetch v12").await;
}

/// Finding 4: three connections each pipeline 20 long polls, then 3.5 MiB of a 4 MiB
/// frame, once. The partial frame waited behind the polls (20 x the 1 s wait) with the
/// budget spent, refusing a fresh producer's 2 MiB produce for 20 s; it is now timed like
/// a partial frame from its arrival, so the budget is back after the 1 s frame timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding4_bytes_behind_pipelined_long_polls_are_timed_like_a_partial_frame() {
    const CONNECTIONS: usize = 3;
    const POLLS: usize = 20;
    let frame_timeout = Duration::from_secs(1);
    let broker = start(BrokerConfig {
        queued_max_request_bytes: 12 * MIB,
        max_frame_bytes: 4 * MIB,
        frame_read_timeout: frame_timeout,
        fetch_max_wait: Duration::from_secs(1),
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    let mut partial = (4 * MIB as i32).to_be_bytes().to_vec();
    partial.resize(4 + 7 * MIB / 2, 0x55);
    let sent = Instant::now();
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut client = connect(addr).await;
        for _ in 0..POLLS {
            client.send(4, &endless_poll()).await.unwrap();
        }
        client.send_raw(&partial).await.unwrap();
        clients.push(client);
    }
    assert!(
        holds_within(LIMIT, || broker.stats().queued_request_bytes > 10 * MIB).await,
        "the pipelined bytes were never held: {:?}",
        broker.stats()
    );
    // Within a few frame timeouts the budget is back (before: 20 s, one poll after the
    // other), and the connections are closed.
    let back = holds_within(4 * frame_timeout, || {
        let stats = broker.stats();
        stats.queued_request_bytes == 0 && stats.connections == 0
    })
    .await;
    let took = sent.elapsed();
    assert!(back, "still held after {took:?}: {:?}", broker.stats());
    eprintln!("bytes behind 20 pipelined polls: the budget was back after {took:?}");
    assert!(big_produce_passes(addr, 2 * MIB).await);
    drop(clients);
    broker.shutdown().await;
}

/// The per-connection share: one client pipelining 8 MiB behind a long poll is closed at
/// its share (`--max-frame-bytes` 4 MiB + 64 KiB) although the 32 MiB budget has room, so
/// one client cannot spend it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_holds_no_more_than_its_share_of_the_budget() {
    let broker = start(BrokerConfig {
        queued_max_request_bytes: 32 * MIB,
        max_frame_bytes: 4 * MIB,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    let mut client = connect(addr).await;
    client.send(4, &endless_poll()).await.unwrap();
    assert!(
        holds_within(LIMIT, || broker.stats().leader.fetch.pending == 1).await,
        "the poll never parked"
    );
    let writer = tokio::spawn(async move {
        let _ = client.send_raw(&vec![0x55u8; 8 * MIB]).await;
        client
    });
    let closed = holds_within(Duration::from_secs(3), || {
        let stats = broker.stats();
        stats.connections == 0 && stats.queued_request_bytes == 0
    })
    .await;
    assert!(closed, "a client held {:?}", broker.stats());
    assert!(big_produce_passes(addr, 2 * MIB).await);
    drop(timeout(LIMIT, writer).await.unwrap().unwrap());
    broker.shutdown().await;
}

/// A fetch answer joining several batches of a partition's newest segment is a copy made
/// for that client (up to 1 MiB a partition): never read, it was held outside the budget
/// (6 readers of 8 partitions: 43 MB, the account at 0). It is now counted until written:
/// two such answers fit in a 16 MiB budget, and the other readers are sent theirs without
/// records, with a throttle time (since the review of issue #38, finding 5; they were
/// closed before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_answers_copied_for_a_client_stay_in_the_budget() {
    const PARTITIONS: usize = 8;
    const READERS: usize = 6;
    const BUDGET: usize = 16 * MIB;
    let broker = start(BrokerConfig {
        queued_max_request_bytes: BUDGET,
        ..config(PARTITIONS)
    })
    .await;
    let addr = broker.local_addr();
    // 100 batches of 9,000 bytes in each partition: 900 KB, below the 1 MiB segment.
    let mut batches = Vec::new();
    for i in 0..100 {
        batches.extend_from_slice(&encode_batch(&[Bytes::from(vec![b'c'; 9_000])], i));
    }
    let batches = Bytes::from(batches);
    let mut producer = connect(addr).await;
    for partition in 0..PARTITIONS as i32 {
        let produce = requests::produce("demo", partition, 1, 1000, batches.clone());
        let answer = producer.call(7, &produce).await.unwrap();
        assert_eq!(answer.responses[0].partition_responses[0].error_code, 0);
    }
    drop(producer);
    let mut fetch = requests::fetch("demo", 0, 0, 1, 0);
    let wanted = fetch.topics[0].partitions[0].clone();
    fetch.topics[0].partitions = (0..PARTITIONS as i32)
        .map(|partition| {
            let mut one = wanted.clone();
            one.partition = partition;
            one
        })
        .collect();
    let mut readers = Vec::with_capacity(READERS);
    for _ in 0..READERS {
        let mut client = connect(addr).await;
        client.send(12, &fetch).await.unwrap();
        readers.push(client);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = broker.stats();
    eprintln!(
        "{READERS} unread 7.2 MB fetch answers: {} connections open, {} bytes counted",
        stats.connections, stats.queued_request_bytes
    );
    assert!(stats.queued_request_bytes <= BUDGET, "{stats:?}");
    assert!(
        stats.queued_request_bytes >= 7_000_000,
        "an unread answer's copy is not counted: {stats:?}"
    );
    assert!(
        stats.queued_request_bytes < 3 * 7_000_000,
        "more unread copied answers held than fit: {stats:?}"
    );
    // Every reader has its answer: two with their records, the others without.
    let mut with_records = 0;
    for reader in readers.iter_mut() {
        let answer = timeout(
            LIMIT,
            reader.receive::<kafka_protocol::messages::FetchRequest>(),
        )
        .await
        .expect("answered")
        .expect("an answer, not a closed connection");
        let full = answer.responses[0]
            .partitions
            .iter()
            .all(|p| p.records.as_ref().is_some_and(|r| !r.is_empty()));
        if full {
            with_records += 1;
        } else {
            assert_eq!(answer.throttle_time_ms, 100);
        }
    }
    assert!(
        (1..=2).contains(&with_records),
        "{with_records} of {READERS} unread copied answers held (at most 2 fit)"
    );
    assert_eq!(broker.stats().connections, READERS, "none closed");
    drop(readers);
    broker.shutdown().await;
}

/// A Produce v9 frame (acks=all, timeout 2^31 - 1) of one real partition of "demo" and then
/// empty topics (3 bytes each: an empty name, no partitions, no tagged fields) up to about
/// `size` bytes, as the review's `amplify_park.py` sent it.
fn produce_of_empty_topics(size: usize) -> Vec<u8> {
    fn uvarint(mut n: usize, out: &mut Vec<u8>) {
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    }
    let batch = encode_batch(&[Bytes::from_static(b"x")], 1_000);
    let mut body = Vec::with_capacity(size + 64);
    // Request header v2: api key 0, version 9, correlation id 7, null client id, no tags.
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&9i16.to_be_bytes());
    body.extend_from_slice(&7i32.to_be_bytes());
    body.extend_from_slice(&(-1i16).to_be_bytes());
    body.push(0);
    // Null transactional id, acks=all, timeout_ms.
    body.push(0);
    body.extend_from_slice(&(-1i16).to_be_bytes());
    body.extend_from_slice(&i32::MAX.to_be_bytes());
    let empty = (size - body.len() - batch.len() - 32) / 3;
    uvarint(empty + 2, &mut body);
    uvarint(5, &mut body);
    body.extend_from_slice(b"demo");
    uvarint(2, &mut body);
    body.extend_from_slice(&0i32.to_be_bytes());
    uvarint(batch.len() + 1, &mut body);
    body.extend_from_slice(&batch);
    body.extend_from_slice(&[0, 0]);
    for _ in 0..empty {
        body.extend_from_slice(&[1, 1, 0]);
    }
    body.push(0);
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// Review finding 3: three acks=all produces of 4 MiB of empty topics, parked behind a
/// stalled follower. Empty topics were not counted and the decoded request was kept for
/// the wait: about 32 times the frame each (the review: 1,086 MB for four 8 MiB frames).
/// Counted before decoding, each is refused undecoded and its connection closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_finding3_a_frame_of_empty_topics_is_refused_before_it_is_decoded() {
    const CLIENTS: usize = 3;
    let broker = BrokerProcess::start(&[
        "--followers",
        "1",
        "--stall-followers",
        "--max-frame-bytes",
        "8388608",
    ]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = broker.rss_mib();
    let frame = produce_of_empty_topics(4 * MIB);
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut client = connect(broker.addr).await;
        // A broker closing the connection may refuse the end of the frame.
        let _ = client.send_raw(&frame).await;
        clients.push(client);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let grown = broker.rss_mib().saturating_sub(before);
    eprintln!("{CLIENTS} acks=all produces of 4 MiB of empty topics: RSS grew by {grown} MiB");
    // Decoded and parked: 3 x ~130 MiB. Refused undecoded: the frames' bytes at most.
    assert!(
        grown < 48,
        "{CLIENTS} produces of empty topics hold {grown} MiB"
    );
    for client in &mut clients {
        assert!(
            closed_within(client, LIMIT).await,
            "a produce of {} empty topics was not refused",
            4 * MIB / 3
        );
    }
}

/// A Produce v9 frame (acks=all, timeout 2^31 - 1) of one real partition of "demo" and then
/// `extra` mentions of partition 0 with no records, each with one unknown tagged field:
/// 8 bytes on the wire, over 400 decoded (a map node of its own), all within the cap.
fn produce_of_tagged_partitions(extra: usize) -> Vec<u8> {
    let batch = encode_batch(&[Bytes::from_static(b"x")], 1_000);
    let mut body = Vec::new();
    // Request header v2: api key 0, version 9, correlation id 7, null client id, no tags.
    body.extend_from_slice(&[0, 0, 0, 9, 0, 0, 0, 7, 0xff, 0xff, 0]);
    // Null transactional id, acks=all, timeout_ms; one topic "demo".
    body.push(0);
    body.extend_from_slice(&(-1i16).to_be_bytes());
    body.extend_from_slice(&i32::MAX.to_be_bytes());
    body.push(2);
    body.push(5);
    body.extend_from_slice(b"demo");
    let mut count = extra + 2;
    while count >= 0x80 {
        body.push((count as u8) | 0x80);
        count >>= 7;
    }
    body.push(count as u8);
    body.extend_from_slice(&0i32.to_be_bytes());
    assert!(batch.len() + 1 < 0x80);
    body.push((batch.len() + 1) as u8);
    body.extend_from_slice(&batch);
    body.push(0);
    for _ in 0..extra {
        // Partition 0, null records, one tagged field (tag 0, empty).
        body.extend_from_slice(&[0, 0, 0, 0, 0, 1, 0, 0]);
    }
    body.extend_from_slice(&[0, 0]);
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// Review finding 3: an acks=all produce kept its decoded request for the whole wait. 100
/// produces within the cap (1 topic, 4,901 partitions with 4,900 tagged fields: 9,802
/// entries of 10,000), each about 2.3 MB decoded from a 39 KB frame, parked behind a
/// stalled follower: the wait now keeps only the names and one result per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_finding3_a_parked_produce_keeps_only_what_its_answer_echoes() {
    const CLIENTS: usize = 100;
    let broker = BrokerProcess::start(&["--followers", "1", "--stall-followers"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = broker.rss_mib();
    let frame = produce_of_tagged_partitions(4_900);
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut client = connect(broker.addr).await;
        client.send_raw(&frame).await.unwrap();
        clients.push(client);
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let grown = broker.rss_mib().saturating_sub(before);
    eprintln!("{CLIENTS} parked acks=all produces of 9,802 entries: RSS grew by {grown} MiB");
    // Every produce is still waiting: no answer, no close.
    for client in &mut clients {
        assert!(
            !closed_within(client, Duration::from_millis(20)).await,
            "a produce within the cap was answered or closed instead of parked"
        );
    }
    // Decoded requests kept: 100 x ~2.3 MB. Names and results: 100 x ~0.2 MB.
    assert!(
        grown < 96,
        "{CLIENTS} parked produces within the cap hold {grown} MiB"
    );
    drop(clients);
}

/// Review finding 3: the cap counts topics as well as partitions, in Produce, Fetch and
/// ListOffsets alike; a request at the cap is answered, one entry more closes the
/// connection (before: topics were free, so any number of empty ones passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_finding3_topics_count_against_the_per_request_cap() {
    const CAP: usize = 10;
    let broker = start(BrokerConfig {
        max_partitions_per_request: CAP,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    // (topics, partitions each): entries = topics x (1 + partitions).
    for (topics, partitions) in [(10, 0), (5, 1), (11, 0), (6, 1), (1, 10)] {
        let within = topics * (1 + partitions) <= CAP;
        for api in ["Produce v9", "Produce v3", "Fetch v12", "ListOffsets v6"] {
            let mut client = connect(addr).await;
            let sent = match api {
                "Produce v9" | "Produce v3" => {
                    let mut request = requests::produce(
                        "demo",
                        0,
                        1,
                        1000,
                        encode_batch(&[Bytes::from_static(b"x")], 1_000),
                    );
                    let mut topic = request.topic_data.remove(0);
                    let partition = topic.partition_data.remove(0);
                    topic.partition_data = vec![partition; partitions];
                    request.topic_data = vec![topic; topics];
                    let version = if api == "Produce v9" { 9 } else { 3 };
                    client.send(version, &request).await
                }
                "Fetch v12" => {
                    let mut request = requests::fetch("demo", 0, 0, 1, 0);
                    let mut topic = request.topics.remove(0);
                    let partition = topic.partitions.remove(0);
                    topic.partitions = vec![partition; partitions];
                    request.topics = vec![topic; topics];
                    client.send(12, &request).await
                }
                _ => {
                    let mut request = requests::list_offsets("other", 0, -1);
                    let mut topic = request.topics.remove(0);
                    let partition = topic.partitions.remove(0);
                    topic.partitions = vec![partition; partitions];
                    request.topics = vec![topic; topics];
                    client.send(6, &request).await
                }
            };
            sent.unwrap();
            let mut answer = vec![0u8; 64 * 1024];
            let read = timeout(LIMIT, client.read_some(&mut answer)).await.unwrap();
            let answered = matches!(read, Ok(n) if n > 0);
            assert_eq!(
                answered, within,
                "{api} of {topics} topics x {partitions} partitions, cap {CAP}"
            );
        }
    }
    broker.shutdown().await;
}

/// Review finding 3: tagged fields decode into a map entry each, in any request and in the
/// request header: counted against the cap before decoding (before: any number passed, so a
/// frame of 2-byte tagged fields decoded into tens of times its size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_finding3_tagged_fields_count_against_the_per_request_cap() {
    const CAP: usize = 10;
    let broker = start(BrokerConfig {
        max_partitions_per_request: CAP,
        ..config(1)
    })
    .await;
    // (tagged fields in the header, in the body) of an ApiVersions v3 (header v2).
    for (in_header, in_body) in [(10, 0), (0, 10), (11, 0), (0, 11), (6000, 0), (0, 6000)] {
        let tags = |n: usize, out: &mut Vec<u8>| {
            // Counts and tags below 2^14 as 2-byte unsigned varints.
            out.extend_from_slice(&[(n as u8) | 0x80, (n >> 7) as u8]);
            for tag in 0..n {
                out.extend_from_slice(&[(tag as u8) | 0x80, (tag >> 7) as u8, 0]);
            }
        };
        let mut body = vec![0, 18, 0, 3, 0, 0, 0, 1, 0xff, 0xff];
        tags(in_header, &mut body);
        body.extend_from_slice(&[1, 1]); // empty client software name and version
        tags(in_body, &mut body);
        let mut frame = (body.len() as i32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        let mut client = connect(broker.local_addr()).await;
        client.send_raw(&frame).await.unwrap();
        let mut answer = vec![0u8; 64 * 1024];
        let read = timeout(LIMIT, client.read_some(&mut answer)).await.unwrap();
        let answered = matches!(read, Ok(n) if n > 0);
        assert_eq!(
            answered,
            in_header.max(in_body) <= CAP,
            "ApiVersions v3 with {in_header} tagged fields in its header, {in_body} in its body"
        );
    }
    broker.shutdown().await;
}

/// The second review of issue #29, finding 1: each record batch of a partition after its
/// first decodes into a checked batch and a copy of its bytes, so it counts against the
/// per-request cap like a partition (before: a records field of 1.46 million 68-byte
/// batches was one entry, and grew the broker by 4 times its frame). One batch per
/// partition, as real clients send, costs nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review29b_finding1_batches_after_a_partitions_first_count_against_the_cap() {
    const CAP: usize = 10;
    let broker = start(BrokerConfig {
        max_partitions_per_request: CAP,
        ..config(2)
    })
    .await;
    let addr = broker.local_addr();
    let one = encode_batch(&[Bytes::from_static(b"x")], 1_000);
    // (partitions, batches each): entries = 1 topic + partitions x batches.
    for (partitions, batches) in [(1, 9), (2, 4), (9, 1), (1, 10), (2, 5), (1, 5_000)] {
        let entries = 1 + partitions * batches;
        let within = entries <= CAP;
        for version in [3, 9] {
            let records = Bytes::from(one.repeat(batches));
            let mut request = requests::produce("demo", 0, 1, 1000, records);
            let partition = request.topic_data[0].partition_data.remove(0);
            request.topic_data[0].partition_data = (0..partitions)
                .map(|index| {
                    let mut data = partition.clone();
                    data.index = (index % 2) as i32;
                    data
                })
                .collect();
            let mut client = connect(addr).await;
            let what = format!("Produce v{version} of {partitions} partitions x {batches} batches");
            if within {
                let answer = timeout(LIMIT, client.call(version, &request))
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{what}, cap {CAP}: {e}"));
                let errors: Vec<i16> = answer.responses[0]
                    .partition_responses
                    .iter()
                    .map(|p| p.error_code)
                    .collect();
                assert_eq!(errors, vec![0; partitions], "{what}, cap {CAP}");
            } else {
                client.send(version, &request).await.unwrap();
                assert!(
                    closed_within(&mut client, LIMIT).await,
                    "{what} was not refused at cap {CAP}"
                );
            }
        }
    }
    broker.shutdown().await;
}

/// The second review of issue #29, finding 5: the request header's tagged fields and the
/// body's entries share one cap (before: each had the whole cap, twice it in all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review29b_finding5_header_and_body_share_one_entry_cap() {
    const CAP: usize = 10;
    let broker = start(BrokerConfig {
        max_partitions_per_request: CAP,
        ..config(1)
    })
    .await;
    // (tagged fields in the header, in the body) of an ApiVersions v3 (header v2).
    for (in_header, in_body) in [(5, 5), (1, 9), (9, 1), (6, 5), (5, 6), (10, 10), (1, 10)] {
        let tags = |n: usize, out: &mut Vec<u8>| {
            out.push(n as u8);
            for tag in 0..n {
                out.extend_from_slice(&[tag as u8, 0]);
            }
        };
        let mut body = vec![0, 18, 0, 3, 0, 0, 0, 1, 0xff, 0xff];
        tags(in_header, &mut body);
        body.extend_from_slice(&[1, 1]); // empty client software name and version
        tags(in_body, &mut body);
        let mut frame = (body.len() as i32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        let mut client = connect(broker.local_addr()).await;
        client.send_raw(&frame).await.unwrap();
        let mut answer = vec![0u8; 64 * 1024];
        let read = timeout(LIMIT, client.read_some(&mut answer)).await.unwrap();
        let answered = matches!(read, Ok(n) if n > 0);
        assert_eq!(
            answered,
            in_header + in_body <= CAP,
            "ApiVersions v3 with {in_header} tagged fields in its header, {in_body} in its body"
        );
    }
    broker.shutdown().await;
}
