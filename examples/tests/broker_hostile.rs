//! The hostile clients of issue #23, each against a fresh in-process broker on 127.0.0.1,
//! scaled to run in seconds: long polls that pipeline past the old 1 MiB read limit and
//! leave, slow readers of big answers, a ListOffsets naming one partition 10,000 times over
//! a long log, partial frames and pipelined bytes beyond the request budget, and a log
//! written past its retention. In each, a client arriving meanwhile on a new connection is
//! served within [`FRESH_WITHIN`]. Raw frames through the wire client; every wait bounded.
//!
//! The metrics listener's cap (N4) and the memory an answer holds (N2) are measured on the
//! broker binary, in `broker_metrics.rs` and `broker_process.rs`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use purgatory_examples::broker::BrokerConfig;
use purgatory_examples::huge_allocations::HugeAllocationsMappedLazily;
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::requests;
use tokio::time::timeout;

mod support;
use support::{closed_within, config, connect, endless_poll, eventually, start, LIMIT};

#[global_allocator]
static ALLOCATOR: HugeAllocationsMappedLazily = HugeAllocationsMappedLazily;

/// A client arriving during an attack is answered within this (the target).
const FRESH_WITHIN: Duration = Duration::from_millis(200);

/// The longest a defence may take to act once its limit is passed.
const ACTS_WITHIN: Duration = Duration::from_secs(1);

/// The write timeout of the N2 tests, and the margin allowed past it: the timeout counts
/// from the first byte of the answer, after the broker read, decoded and encoded a
/// multi-megabyte request (slow in a debug build on a loaded machine).
const WRITE_TIMEOUT: Duration = Duration::from_millis(1000);
const WRITE_MARGIN: Duration = Duration::from_secs(3);

/// Kafka error codes the tests expect.
const OFFSET_OUT_OF_RANGE: i16 = 1;
const INVALID_REQUEST: i16 = 42;

/// A client that connects now and asks for Metadata: asserts it is answered within
/// [`FRESH_WITHIN`] and returns how long it took.
async fn fresh_client_is_served(addr: SocketAddr, during: &str) -> Duration {
    let started = Instant::now();
    let mut client = connect(addr).await;
    let answer = timeout(LIMIT, client.call(1, &MetadataRequest::default()))
        .await
        .unwrap_or_else(|_| panic!("{during}: a fresh client was not answered in {LIMIT:?}"))
        .unwrap_or_else(|e| panic!("{during}: a fresh client was refused: {e}"));
    assert_eq!(answer.brokers.len(), 1);
    let took = started.elapsed();
    // Shown with --nocapture: the figures examples/README.md reports.
    eprintln!("{during}: a fresh client was served in {took:?}");
    assert!(
        took < FRESH_WITHIN,
        "{during}: a fresh client waited {took:?}"
    );
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_long_polls_that_pipelined_past_a_mebibyte_then_left_free_their_slots() {
    const CAP: usize = 16;
    let broker = start(BrokerConfig {
        max_connections: CAP,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    // Every slot taken by a client that parks a long poll, pipelines 1 MiB + 4 KiB of
    // anything behind it, and closes.
    let garbage = vec![0x55u8; (1 << 20) + 4096];
    for _ in 0..CAP {
        let mut client = connect(addr).await;
        client.send(4, &endless_poll()).await.unwrap();
        client.send_raw(&garbage).await.unwrap();
        drop(client);
    }
    let took = eventually(
        "the dead connections closed and their polls cancelled",
        || {
            let stats = broker.stats();
            stats.connections == 0 && stats.leader.fetch.pending == 0
        },
    )
    .await;
    assert!(took < ACTS_WITHIN, "slots freed after {took:?}");
    assert_eq!(broker.stats().queued_request_bytes, 0);
    fresh_client_is_served(addr, "after N1").await;
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_a_client_pipelining_beyond_the_request_budget_behind_a_long_poll_is_closed() {
    const BUDGET: usize = 2 << 20;
    let broker = start(BrokerConfig {
        queued_max_request_bytes: BUDGET,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    let mut client = connect(addr).await;
    client.send(4, &endless_poll()).await.unwrap();
    eventually("the poll parked", || {
        broker.stats().leader.fetch.pending == 1
    })
    .await;
    // 8 MiB behind the waiting poll, and the client stays.
    let writer = tokio::spawn(async move {
        let _ = client.send_raw(&vec![0x55u8; 8 << 20]).await;
        client
    });
    let took = eventually("the pipelining connection closed", || {
        let stats = broker.stats();
        stats.connections == 0 && stats.leader.fetch.pending == 0
    })
    .await;
    assert!(took < ACTS_WITHIN, "closed after {took:?}");
    assert_eq!(broker.stats().queued_request_bytes, 0);
    fresh_client_is_served(addr, "after a pipelining client").await;
    drop(timeout(LIMIT, writer).await.unwrap().unwrap());
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_is_answered_at_the_broker_cap_on_its_wait() {
    let cap = Duration::from_millis(300);
    let broker = start(BrokerConfig {
        fetch_max_wait: cap,
        ..config(1)
    })
    .await;
    let mut client = connect(broker.local_addr()).await;
    let started = Instant::now();
    let answer = timeout(Duration::from_secs(3), client.call(4, &endless_poll()))
        .await
        .expect("a poll asking for 24.8 days was not answered at the cap")
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= cap - Duration::from_millis(10),
        "answered after {took:?}"
    );
    let partition = &answer.responses[0].partitions[0];
    assert_eq!(partition.error_code, 0);
    assert!(partition.records.as_ref().is_none_or(Bytes::is_empty));
    assert_eq!(broker.stats().leader.fetch.expired, 1);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n2_slow_readers_of_a_big_batch_are_closed_at_the_write_timeout() {
    const READERS: usize = 10;
    let broker = start(BrokerConfig {
        write_timeout: WRITE_TIMEOUT,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    let mut producer = connect(addr).await;
    let batch = encode_batch(&[Bytes::from(vec![b'x'; 8 << 20])], 1_000);
    let produced = producer
        .call(7, &requests::produce("demo", 0, 1, 1000, batch))
        .await
        .unwrap();
    assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);
    drop(producer);
    // Each asks for 1 byte (the first batch is sent whole, 8 MiB) and reads a byte every
    // 100 ms: progress, but far too slow. (What the kernel already holds for them stays
    // readable after the broker closed, so the close is seen in the broker's counters.)
    let started = Instant::now();
    let mut readers = Vec::with_capacity(READERS);
    for _ in 0..READERS {
        let mut client = connect(addr).await;
        let mut fetch = requests::fetch("demo", 0, 0, 1, 0);
        fetch.max_bytes = 1;
        fetch.topics[0].partitions[0].partition_max_bytes = 1;
        client.send(4, &fetch).await.unwrap();
        readers.push(tokio::spawn(async move {
            let mut byte = [0u8; 1];
            while let Ok(1) = client.read_some(&mut byte).await {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    eventually("the readers connected", || {
        broker.stats().connections == READERS
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    fresh_client_is_served(addr, "while slow readers hold 8 MiB answers").await;
    eventually("every slow reader closed", || {
        broker.stats().connections == 0
    })
    .await;
    let closed_after = started.elapsed();
    assert!(
        closed_after < WRITE_TIMEOUT + WRITE_MARGIN,
        "closed after {closed_after:?}"
    );
    for reader in readers {
        reader.abort();
    }
    broker.shutdown().await;
}

/// A Metadata request naming `names` unknown topics of 32,000 bytes each.
fn echo_request(names: usize) -> MetadataRequest {
    let topics = (0..names)
        .map(|i| {
            let mut name = format!("{i:05}").into_bytes();
            name.resize(32_000, b'n');
            let mut topic = MetadataRequestTopic::default();
            topic.name = Some(TopicName(StrBytes::from_string(
                String::from_utf8(name).unwrap(),
            )));
            topic
        })
        .collect();
    let mut request = MetadataRequest::default();
    request.topics = Some(topics);
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n2_metadata_echoes_never_read_hold_no_more_than_the_request_budget() {
    const CLIENTS: usize = 4;
    let broker = start(BrokerConfig {
        queued_max_request_bytes: 20 << 20,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    // Four 9.6 MB echoes never read: at most two fit in 20 MiB, the others are closed.
    let request = echo_request(300);
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut client = connect(addr).await;
        let request = request.clone();
        clients.push(tokio::spawn(async move {
            let _ = client.send(1, &request).await;
            client
        }));
    }
    // Each send ends when the broker has read the request, or closed the connection.
    let mut clients_left = Vec::with_capacity(CLIENTS);
    for sending in clients {
        clients_left.push(timeout(LIMIT, sending).await.unwrap().unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Two whole echoes fit; partial ones racing for the budget may leave room for one.
    let stats = broker.stats();
    assert!((1..=2).contains(&stats.connections), "{stats:?}");
    assert!(stats.queued_request_bytes <= 20 << 20, "{stats:?}");
    fresh_client_is_served(addr, "while unread echoes fill the budget").await;
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n2_a_big_metadata_echo_never_read_is_closed_at_the_write_timeout() {
    const NAMES: usize = 300;
    let broker = start(BrokerConfig {
        write_timeout: WRITE_TIMEOUT,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    // 300 unknown names of 32,000 bytes: a 9.6 MB answer that echoes them.
    let request = echo_request(NAMES);
    let mut client = connect(addr).await;
    client.send(1, &request).await.unwrap();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    fresh_client_is_served(addr, "while a 9.6 MB answer waits unread").await;
    let took = eventually("the unread answer's connection closed", || {
        broker.stats().connections == 0
    })
    .await;
    let closed_after = started.elapsed();
    assert!(
        closed_after < WRITE_TIMEOUT + WRITE_MARGIN,
        "closed after {closed_after:?} ({took:?} of polling)"
    );
    assert!(closed_within(&mut client, ACTS_WITHIN).await);
    broker.shutdown().await;
}

/// The broker runs on a runtime of its own (two workers, as the machine has two cores),
/// the clients on another: a stall of the broker's workers cannot stall the clients' clock
/// or their tasks, so a client kept waiting measures it.
#[test]
fn n3_list_offsets_naming_a_partition_10000_times_over_a_long_log_stalls_nobody() {
    let runtime = |workers| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap()
    };
    let (brokers, clients) = (runtime(2), runtime(1));
    let broker = brokers.block_on(start(config(1)));
    clients.block_on(list_offsets_naming_a_partition_10000_times(
        broker.local_addr(),
    ));
    brokers.block_on(broker.shutdown());
}

async fn list_offsets_naming_a_partition_10000_times(addr: SocketAddr) {
    const BATCHES: usize = 10_000;
    // The most --max-partitions-per-request (10,000 entries) lets through: its topic and
    // 9,999 mentions of the partition.
    const MENTIONS: usize = 9_999;
    // Two produces of 5,000 one-record batches, timestamps 1,000 apart (a partition's
    // batches after its first count against --max-partitions-per-request).
    let mut producer = connect(addr).await;
    for half in [0..BATCHES / 2, BATCHES / 2..BATCHES] {
        let mut records = Vec::new();
        for i in half {
            let value = Bytes::from(vec![b'v'; 8]);
            records.extend_from_slice(&encode_batch(&[value], 1_000 * i as i64));
        }
        let produced = producer
            .call(
                7,
                &requests::produce("demo", 0, 1, 1000, Bytes::from(records)),
            )
            .await
            .unwrap();
        assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);
    }
    // Each mention of the partition asks for a timestamp after every batch (a whole scan
    // of the log, once per mention, before the fix); four such requests at once.
    let mut many = requests::list_offsets("demo", 0, i64::MAX / 2);
    let mention = many.topics[0].partitions[0].clone();
    many.topics[0].partitions = vec![mention; MENTIONS];
    let mut asking = Vec::new();
    let asked = Instant::now();
    for _ in 0..4 {
        let mut client = connect(addr).await;
        client.send(4, &many).await.unwrap();
        asking.push(client);
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    // A client arriving meanwhile reads the partition (its lock) and is served at once.
    let started = Instant::now();
    let mut reader = connect(addr).await;
    let fetched = timeout(
        LIMIT,
        reader.call(4, &requests::fetch("demo", 0, BATCHES as i64 - 1, 1, 0)),
    )
    .await
    .unwrap()
    .unwrap();
    let waited = started.elapsed();
    eprintln!("four 10,000-mention ListOffsets: a fresh fetch was served in {waited:?}");
    assert_eq!(fetched.responses[0].partitions[0].error_code, 0);
    assert!(waited < FRESH_WITHIN, "a fresh fetch waited {waited:?}");
    fresh_client_is_served(addr, "during four 10,000-mention ListOffsets").await;
    for mut client in asking {
        let left = (asked + ACTS_WITHIN).saturating_duration_since(Instant::now());
        let answer = timeout(
            left,
            client.receive::<kafka_protocol::messages::ListOffsetsRequest>(),
        )
        .await
        .unwrap_or_else(|_| panic!("a ListOffsets was not answered within {ACTS_WITHIN:?}"))
        .unwrap();
        let partitions = &answer.topics[0].partitions;
        eprintln!(
            "a 10,000-mention ListOffsets answered {:?} after it was sent",
            asked.elapsed()
        );
        assert_eq!(partitions.len(), MENTIONS);
        // As Kafka answers a partition named twice: INVALID_REQUEST, with no lookup.
        assert!(partitions.iter().all(|p| p.error_code == INVALID_REQUEST));
    }
    // A single mention is still looked up: the first batch at or after a timestamp.
    let one = reader
        .call(4, &requests::list_offsets("demo", 0, 1_000 * 2_345 + 1))
        .await
        .unwrap();
    let found = &one.topics[0].partitions[0];
    assert_eq!((found.error_code, found.offset), (0, 2_346));
    assert_eq!(found.timestamp, 1_000 * 2_346);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_frames_beyond_the_request_budget_are_closed() {
    const BUDGET: usize = 4 << 20;
    const CLIENTS: usize = 12;
    let broker = start(BrokerConfig {
        queued_max_request_bytes: BUDGET,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    // Each announces a 50 MiB request, sends 1 MiB of it and stalls (the frame read
    // timeout is 30 s).
    let mut partial = (50i32 << 20).to_be_bytes().to_vec();
    partial.resize(4 + (1 << 20), 0x55);
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut client = connect(addr).await;
        client.send_raw(&partial).await.unwrap();
        clients.push(client);
    }
    // Those the budget holds stay; the others are closed.
    let mut closed = 0;
    for client in &mut clients {
        if closed_within(client, Duration::from_millis(300)).await {
            closed += 1;
        }
    }
    let stats = broker.stats();
    assert!(stats.queued_request_bytes <= BUDGET, "{stats:?}");
    assert!(
        (CLIENTS - 5..CLIENTS).contains(&closed),
        "{closed} of {CLIENTS} closed; {stats:?}"
    );
    fresh_client_is_served(addr, "while partial frames fill the budget").await;
    drop(clients);
    eventually("the budget released", || {
        broker.stats().queued_request_bytes == 0
    })
    .await;
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_keeps_its_retention_bytes_and_moves_its_start() {
    const RETENTION: u64 = 2 << 20;
    let broker = start(BrokerConfig {
        retention_bytes: RETENTION,
        ..config(1)
    })
    .await;
    let mut client = connect(broker.local_addr()).await;
    // 40 batches of 256 KiB: 10 MiB written.
    let batch = encode_batch(&[Bytes::from(vec![b'r'; 256 << 10])], 1_000);
    for _ in 0..40 {
        let produced = client
            .call(7, &requests::produce("demo", 0, 1, 1000, batch.clone()))
            .await
            .unwrap();
        assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);
    }
    let held = broker.stats().log_bytes;
    assert!(
        held <= RETENTION + (1 << 20) + batch.len() as u64,
        "the log holds {held} bytes"
    );
    let earliest = client
        .call(4, &requests::list_offsets("demo", 0, -2))
        .await
        .unwrap();
    let start = earliest.topics[0].partitions[0].offset;
    assert!(start > 0, "the log still starts at {start}");
    let gone = client
        .call(11, &requests::fetch("demo", 0, 0, 1, 0))
        .await
        .unwrap();
    assert_eq!(
        gone.responses[0].partitions[0].error_code,
        OFFSET_OUT_OF_RANGE
    );
    let kept = client
        .call(11, &requests::fetch("demo", 0, start, 1, 0))
        .await
        .unwrap();
    let partition = &kept.responses[0].partitions[0];
    assert_eq!(partition.error_code, 0);
    assert_eq!(partition.log_start_offset, start);
    assert!(!partition.records.as_ref().unwrap().is_empty());
    broker.shutdown().await;
}

// A hostile review of the defences above: a client that trickles a request, one that
// pipelines many requests behind a long poll and reads every answer, one that leaves in
// the middle of a big answer.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_a_request_is_closed_at_the_frame_read_timeout() {
    let frame_read_timeout = Duration::from_millis(500);
    let broker = start(BrokerConfig {
        frame_read_timeout,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    let mut client = connect(addr).await;
    let started = Instant::now();
    // A 100-byte request, one byte every 50 ms: 5 s to send it whole.
    let mut trickled = 100i32.to_be_bytes().to_vec();
    trickled.resize(104, 0);
    let mut closed = false;
    for byte in trickled {
        if client.send_raw(&[byte]).await.is_err() {
            closed = true;
            break;
        }
        if broker.stats().connections == 0 {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    assert!(closed, "a trickling client was never closed");
    assert!(
        took < frame_read_timeout + ACTS_WITHIN,
        "closed after {took:?}"
    );
    fresh_client_is_served(addr, "after a trickling client").await;
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pipelined_behind_a_long_poll_are_all_answered_in_order() {
    const BEHIND: usize = 1_000;
    let broker = start(BrokerConfig {
        fetch_max_wait: Duration::from_millis(300),
        ..config(1)
    })
    .await;
    let mut client = connect(broker.local_addr()).await;
    client.send(4, &endless_poll()).await.unwrap();
    for _ in 0..BEHIND {
        client.send(1, &MetadataRequest::default()).await.unwrap();
    }
    let poll = timeout(
        LIMIT,
        client.receive::<kafka_protocol::messages::FetchRequest>(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(poll.responses[0].partitions[0].error_code, 0);
    for _ in 0..BEHIND {
        let answer = timeout(LIMIT, client.receive::<MetadataRequest>())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer.brokers.len(), 1);
    }
    assert_eq!(broker.stats().queued_request_bytes, 0);
    assert_eq!(broker.stats().connections, 1);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_in_the_middle_of_a_big_answer_frees_its_connection_at_once() {
    let broker = start(config(1)).await;
    let addr = broker.local_addr();
    let mut producer = connect(addr).await;
    let batch = encode_batch(&[Bytes::from(vec![b'x'; 8 << 20])], 1_000);
    producer
        .call(7, &requests::produce("demo", 0, 1, 1000, batch))
        .await
        .unwrap();
    drop(producer);
    let mut client = connect(addr).await;
    client.reset_on_drop().unwrap();
    client
        .send(4, &requests::fetch("demo", 0, 0, 1, 0))
        .await
        .unwrap();
    let mut some = vec![0u8; 64 * 1024];
    let got = timeout(LIMIT, client.read_some(&mut some))
        .await
        .unwrap()
        .unwrap();
    assert!(got > 0);
    drop(client);
    // Well before the 30 s write timeout: the write fails on the reset.
    let took = eventually("the connection closed", || broker.stats().connections == 0).await;
    assert!(took < ACTS_WITHIN, "closed after {took:?}");
    fresh_client_is_served(addr, "after a client left mid-answer").await;
    broker.shutdown().await;
}
