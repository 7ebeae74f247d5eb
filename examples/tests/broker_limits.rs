//! Bounded per-client state (issue #29, findings 5, 6 and 9): what one client can make the
//! broker hold or do is capped, and a fresh client still gets in. Loopback only; distinct
//! clients come from distinct loopback addresses (127.0.0.2 and up: on Linux the whole
//! 127/8 is loopback); every wait bounded.
//!
//! - Finding 5: connections per address (`--max-connections-per-ip`), and at the
//!   broker-wide cap idle connections make room for new ones.
//! - Review finding 4: a client keeping its connections busy (a byte of a frame each) does
//!   not evict the idle connections of a smaller client, and by default holds at most half
//!   of the places, so a fresh client gets in.
//! - Finding 6: a partition forgets an idempotent producer after
//!   `--producer-id-expiration-ms`; it may then start again only at sequence 0.
//! - Finding 9: the metrics endpoint serves scrapers while idle clients keep reconnecting;
//!   a client sending garbage on thousands of connections does not make the broker log a
//!   line for each.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{InitProducerIdRequest, MetadataRequest};
use purgatory_examples::broker::BrokerConfig;
use purgatory_examples::wire_client::{requests, WireClient};
use tokio::time::timeout;

mod support;
use support::process::{printed_address, resident_bytes, start_binary};
use support::producer::{init_producer_id, produce};
use support::records::idempotent_batch;
use support::{config, connect, endless_poll, eventually, start, LIMIT};

/// Kafka's answer to a batch of a producer whose state is unknown, at a sequence other
/// than 0 (since Kafka 2.5, KIP-360).
const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
/// Kafka's answer to a produce under a producer id it holds no state for.
const UNKNOWN_PRODUCER_ID: i16 = 59;

fn loopback(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

async fn connect_from(source: IpAddr, addr: SocketAddr) -> WireClient {
    timeout(LIMIT, WireClient::connect_from(source, addr))
        .await
        .unwrap()
        .unwrap()
}

/// Whether the broker closes `client`'s connection within `within` (rather than answer
/// or keep it).
async fn closed_by_broker(client: &mut WireClient, within: Duration) -> bool {
    matches!(
        timeout(within, client.read_raw()).await,
        Ok(Ok(None) | Err(_))
    )
}

/// Whether a Metadata request on `client` is answered (not closed) within [`LIMIT`].
async fn served(client: &mut WireClient) -> bool {
    matches!(
        timeout(LIMIT, client.call(1, &MetadataRequest::default())).await,
        Ok(Ok(answer)) if answer.brokers.len() == 1
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding_5_one_clients_idle_connections_make_room_for_fresh_clients() {
    const CAP: usize = 32;
    let broker = start(BrokerConfig {
        max_connections: CAP,
        // One address may hold every place: the broker-wide cap is what is tested here.
        max_connections_per_ip: Some(CAP),
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    // One client takes every slot with idle connections from 127.0.0.1.
    let mut flood = Vec::new();
    for _ in 0..CAP {
        let mut client = connect_from(loopback(1), addr).await;
        assert!(served(&mut client).await);
        flood.push(client);
    }
    // Fifteen good clients, each from its own address, between more of the flood: each
    // gets in, and none is closed by the flood that follows it (127.0.0.1 holds the most
    // connections, so it loses its own idle ones first).
    let mut good = Vec::new();
    for i in 0..15u8 {
        let mut client = connect_from(loopback(2 + i), addr).await;
        assert!(
            served(&mut client).await,
            "good client {i} was not served while one client held every slot"
        );
        good.push(client);
        for _ in 0..4 {
            flood.push(connect_from(loopback(1), addr).await);
        }
    }
    for (i, client) in good.iter_mut().enumerate() {
        assert!(
            served(client).await,
            "good client {i} was closed by the flood"
        );
    }
    // The flood's oldest connections were the ones closed.
    assert!(closed_by_broker(&mut flood[0], LIMIT).await);
    eventually("the open connections back within the cap", || {
        broker.stats().connections <= CAP
    })
    .await;
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding_5_one_address_is_capped_and_another_still_gets_in() {
    const PER_IP: usize = 4;
    let broker = start(BrokerConfig {
        max_connections_per_ip: Some(PER_IP),
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    // Busy connections (a long poll each): nothing to evict.
    let mut polls = Vec::new();
    for _ in 0..PER_IP {
        let mut client = connect_from(loopback(1), addr).await;
        client
            .send(4, &requests::fetch("demo", 0, 0, i32::MAX, i32::MAX))
            .await
            .unwrap();
        polls.push(client);
    }
    eventually("the polls parked", || {
        broker.stats().leader.fetch.pending == PER_IP
    })
    .await;
    let mut one_more = connect_from(loopback(1), addr).await;
    assert!(
        closed_by_broker(&mut one_more, Duration::from_secs(3)).await,
        "a connection beyond --max-connections-per-ip was kept"
    );
    let mut other = connect_from(loopback(2), addr).await;
    assert!(served(&mut other).await, "another address was refused");
    // A place freed on the capped address is a place for it again.
    drop(polls.pop());
    eventually("the freed place", || broker.stats().connections == PER_IP).await;
    let mut again = connect_from(loopback(1), addr).await;
    assert!(served(&mut again).await);
    // At its cap again, with one connection idle: a newcomer of the address takes its place.
    let mut newcomer = connect_from(loopback(1), addr).await;
    assert!(
        served(&mut newcomer).await,
        "the address's idle connection made no room"
    );
    assert!(
        closed_by_broker(&mut again, LIMIT).await,
        "the idle connection was kept"
    );
    broker.shutdown().await;
}

/// Three good clients of 127.0.0.2, served and then idle, and a client of 127.0.0.1 opening
/// `cap` connections that each send one byte of a frame (busy, not idle): returns the good
/// clients and the other's connections.
async fn busy_flood_after_idle_clients(
    addr: SocketAddr,
    cap: usize,
) -> (Vec<WireClient>, Vec<WireClient>) {
    let mut good = Vec::new();
    for _ in 0..3 {
        let mut client = connect_from(loopback(2), addr).await;
        assert!(served(&mut client).await);
        good.push(client);
    }
    let mut flood = Vec::new();
    for _ in 0..cap {
        let mut client = connect_from(loopback(1), addr).await;
        // A refused connection may be closed already: its send may fail.
        let _ = client.send_raw(&[0]).await;
        flood.push(client);
        // Time for the broker to see the byte (the connection is busy from then on).
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (good, flood)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_4_busy_connections_do_not_evict_a_smaller_addresss_idle_ones() {
    const CAP: usize = 20;
    let broker = start(BrokerConfig {
        max_connections: CAP,
        // Only the eviction rule protects the good clients here.
        max_connections_per_ip: Some(CAP),
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    let (mut good, flood) = busy_flood_after_idle_clients(addr, CAP).await;
    for (i, client) in good.iter_mut().enumerate() {
        assert!(
            served(client).await,
            "good client {i} was evicted by a larger address's newcomer"
        );
    }
    // The flood's last three found no room (or took one of its own idle places).
    eventually("the open connections back within the cap", || {
        broker.stats().connections <= CAP
    })
    .await;
    drop(flood);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_4_by_default_one_address_leaves_room_for_fresh_clients() {
    const CAP: usize = 20;
    let broker = start(BrokerConfig {
        max_connections: CAP,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    let (mut good, flood) = busy_flood_after_idle_clients(addr, CAP).await;
    // Half the places at most for 127.0.0.1: the rest of its connections closed at once.
    eventually("127.0.0.1 down to half the places", || {
        broker.stats().connections <= CAP / 2 + good.len()
    })
    .await;
    for (i, client) in good.iter_mut().enumerate() {
        assert!(served(client).await, "good client {i} was closed");
    }
    // Fresh clients from another address get in, one after another.
    for i in 0..5 {
        let mut fresh = connect_from(loopback(3), addr).await;
        assert!(served(&mut fresh).await, "fresh client {i} was refused");
    }
    assert!(broker.stats().connections <= CAP);
    drop(flood);
    broker.shutdown().await;
}

/// Fresh clients from 127.0.0.3 try every 250 ms until one is served; fails after
/// [`LIMIT`].
async fn fresh_client_gets_in(addr: SocketAddr) {
    let started = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        let mut fresh = connect_from(loopback(3), addr).await;
        if served(&mut fresh).await {
            return;
        }
        assert!(
            started.elapsed() < LIMIT,
            "no fresh client served in {tries} tries over {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_4_connections_stalled_a_byte_into_a_frame_make_room_for_fresh_clients() {
    const CAP: usize = 20;
    let broker = start(BrokerConfig {
        max_connections: CAP,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    // Two addresses, half the places each (the default per address), every connection one
    // byte into a frame and silent from then on.
    let mut stalled = Vec::new();
    for source in [loopback(1), loopback(4)] {
        for _ in 0..CAP / 2 {
            let mut client = connect_from(source, addr).await;
            client.send_raw(&[0]).await.unwrap();
            stalled.push(client);
        }
    }
    eventually("every place taken", || broker.stats().connections == CAP).await;
    // Time for the broker to see each byte: until then a connection is idle, and a fresh
    // client would take its place without any stall being noticed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A fresh client gets in once they have sent nothing for a second or two, well before
    // the 30 s --frame-read-timeout-ms would close them.
    fresh_client_gets_in(addr).await;
    assert!(broker.stats().evicted_connections >= 1);
    drop(stalled);
    broker.shutdown().await;
}

/// Second review, finding 3: long polls re-sent from many addresses (each within its own
/// share) held every place, so fresh clients were refused for as long as they re-polled.
/// A fetch waiting a second or more is evictable like an idle connection now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_review_3_long_polls_from_many_addresses_make_room_for_fresh_clients() {
    const CAP: usize = 20;
    let broker = start(BrokerConfig {
        max_connections: CAP,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    // Every place a long poll that cannot complete, each from an address of its own.
    let mut polls = Vec::new();
    for i in 0..CAP {
        let source = IpAddr::from([127, 0, 4, 1 + i as u8]);
        let mut client = connect_from(source, addr).await;
        client.send(4, &endless_poll()).await.unwrap();
        polls.push(client);
    }
    eventually("every place taken", || broker.stats().connections == CAP).await;
    eventually("every poll parked", || {
        broker.stats().leader.fetch.pending >= CAP
    })
    .await;
    // A fresh client gets in once the polls have waited a second or two.
    fresh_client_gets_in(addr).await;
    assert!(broker.stats().evicted_connections >= 1);
    // The evicted poll's client sees its connection closed, and its fetch was cancelled.
    let mut closed = 0;
    for client in &mut polls {
        if closed_by_broker(client, Duration::from_millis(50)).await {
            closed += 1;
        }
    }
    assert!(closed >= 1, "no poll's connection was closed");
    assert!(broker.stats().connections <= CAP);
    broker.shutdown().await;
}

/// Produces `batch` to partition 1 (acks=1): its error code.
async fn produce_to_partition_1(client: &mut WireClient, batch: Bytes) -> i16 {
    let answer = timeout(
        LIMIT,
        client.call(7, &requests::produce("demo", 1, 1, 1000, batch)),
    )
    .await
    .unwrap()
    .unwrap();
    answer.responses[0].partition_responses[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding_6_an_expired_producer_may_only_start_again_at_sequence_zero() {
    const EXPIRATION: Duration = Duration::from_millis(1_000);
    let broker = start(BrokerConfig {
        producer_id_expiration: EXPIRATION,
        ..config(2)
    })
    .await;
    let mut client = connect(broker.local_addr()).await;
    let id = init_producer_id(&mut client).await;
    assert_eq!(
        produce(&mut client, 7, idempotent_batch(id, 0, b"a")).await,
        (0, 0)
    );
    assert_eq!(
        produce(&mut client, 7, idempotent_batch(id, 1, b"b")).await,
        (0, 1)
    );
    // Within the expiration the producer is known: its retry is recognised.
    assert_eq!(
        produce(&mut client, 7, idempotent_batch(id, 1, b"b")).await,
        (0, 1)
    );
    // The producer keeps producing to partition 1 (so its id stays live, second review of
    // issue #29, finding 2) while partition 0 forgets it.
    let mut sequence = 0;
    let quiet = Instant::now();
    while quiet.elapsed() < EXPIRATION * 3 {
        let batch = idempotent_batch(id, sequence, b"elsewhere");
        assert_eq!(produce_to_partition_1(&mut client, batch).await, 0);
        sequence += 1;
        tokio::time::sleep(EXPIRATION / 10).await;
    }
    // Partition 0's state is gone: its next batch is out of sequence, and not appended.
    let (error, _) = produce(&mut client, 7, idempotent_batch(id, 2, b"c")).await;
    assert_eq!(error, OUT_OF_ORDER_SEQUENCE_NUMBER);
    // Starting again at 0 is accepted, at the log end.
    assert_eq!(
        produce(&mut client, 7, idempotent_batch(id, 0, b"d")).await,
        (0, 2)
    );
    // Unused everywhere for the expiration, the id itself expires: the producer must ask
    // for a new one (UNKNOWN_PRODUCER_ID, which Kafka's clients answer so).
    tokio::time::sleep(EXPIRATION * 2).await;
    let (error, _) = produce(&mut client, 7, idempotent_batch(id, 1, b"e")).await;
    assert_eq!(error, UNKNOWN_PRODUCER_ID);
    broker.shutdown().await;
}

/// One HTTP/1.0 GET of the metrics text; whether a 200 answer came.
fn scrape(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, LIMIT) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(LIMIT));
    if stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.0 200")
}

#[test]
fn finding_9_idle_clients_that_reconnect_do_not_blind_the_metrics_endpoint() {
    const IDLE: usize = 16;
    const SCRAPES: usize = 20;
    let (_running, printed, _stderr) = start_binary(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = printed_address(&printed, "metrics on http://");
    // 16 clients (the default --metrics-max-connections) that connect, say nothing, and
    // reconnect as soon as they are closed.
    let stop = Arc::new(AtomicBool::new(false));
    let idlers: Vec<_> = (0..IDLE)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut stream) = TcpStream::connect_timeout(&metrics, LIMIT) else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                    let mut byte = [0u8; 1];
                    // Until the endpoint closes it (or the test ends).
                    while !stop.load(Ordering::Relaxed) {
                        match stream.read(&mut byte) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) => {}
                            Err(_) => break,
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let answered = (0..SCRAPES).filter(|_| scrape(metrics)).count();
    stop.store(true, Ordering::Relaxed);
    for idler in idlers {
        idler.join().unwrap();
    }
    eprintln!("{answered} of {SCRAPES} scrapes answered beside {IDLE} reconnecting idle clients");
    // A scraper can still lose a race with the idle clients now and then (it is evicted
    // if 15 of them reconnect before its request head is read): most must get through.
    assert!(
        answered >= SCRAPES * 3 / 4,
        "{answered} of {SCRAPES} scrapes answered"
    );
}

#[test]
fn finding_9_a_client_sending_garbage_does_not_make_the_broker_log_a_line_each_time() {
    const CONNECTIONS: usize = 1_000;
    let (running, printed, stderr) = start_binary(&[]);
    let kafka = printed_address(&printed, "broker listening on ");
    let (lines, logged) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    // Each connection sends a request of an unknown API (key 77): each is closed, which
    // the broker logs.
    let garbage = [0, 0, 0, 8, 0, 77, 0, 0, 0, 0, 0, 1];
    let started = Instant::now();
    for _ in 0..CONNECTIONS {
        let mut stream = TcpStream::connect_timeout(&kafka, LIMIT).unwrap();
        stream.write_all(&garbage).unwrap();
        stream.set_read_timeout(Some(LIMIT)).unwrap();
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
    }
    let took = started.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    drop(running);
    let lines: Vec<String> = logged.try_iter().collect();
    let closing = lines
        .iter()
        .filter(|l| l.starts_with("broker: closing"))
        .count();
    let seconds = took.as_secs_f64() + 0.3;
    eprintln!(
        "{CONNECTIONS} bad requests in {took:?}: {closing} closing lines, {} lines in all",
        lines.len()
    );
    // At most 10 at once and 5 a second of one kind (log_limit.rs), with some slack.
    let allowed = 10.0 + 5.0 * seconds + 5.0;
    assert!(
        (closing as f64) <= allowed,
        "{closing} closing lines over {seconds:.1} s for {CONNECTIONS} bad requests"
    );
    assert!(closing >= 1, "nothing logged at all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding_9_tiny_batches_keep_the_memory_near_the_retention_bytes() {
    const RETENTION: u64 = 8 << 20;
    let retention = RETENTION.to_string();
    let (running, printed, _stderr) = start_binary(&["--retention-bytes", &retention]);
    let kafka = printed_address(&printed, "broker listening on ");
    let pid = running.0.id();
    let mut client = connect(kafka).await;
    // Warm up the allocator and the runtime with one request before the baseline.
    let one = purgatory_examples::record_batch::encode_batch(&[Bytes::from_static(b"x")], 1);
    assert_eq!(produce(&mut client, 7, one.clone()).await.0, 0);
    let before = resident_bytes(pid);
    // 1,000 batches of one record (about 70 bytes each) per request: 48 MiB of them, six
    // times the retention.
    let mut request = BytesMut::new();
    for _ in 0..1_000 {
        request.extend_from_slice(&one);
    }
    let request = request.freeze();
    let requests = (48 << 20) / request.len();
    let mut slowest = Duration::ZERO;
    for _ in 0..requests {
        let started = Instant::now();
        assert_eq!(produce(&mut client, 7, request.clone()).await.0, 0);
        slowest = slowest.max(started.elapsed());
    }
    let grown = resident_bytes(pid).saturating_sub(before);
    // The slowest produce is printed, not asserted (timing belongs to benchmarks).
    eprintln!(
        "{}-byte batches, {} MiB written: RSS grew {:.1} MiB, {:.2}x the {} MiB retention; \
         slowest produce {slowest:?}",
        one.len(),
        (requests * request.len()) >> 20,
        grown as f64 / f64::from(1 << 20),
        grown as f64 / RETENTION as f64,
        RETENTION >> 20
    );
    // The retention plus one open segment (1 MiB and its index), and the allocator's slack
    // (1.34x in most runs, up to 2.7x when the allocations spread over more arenas;
    // 3.68-3.99x before the index counted in retention): 3.2x parts the two.
    assert!(
        grown < RETENTION * 16 / 5,
        "RSS grew {grown} bytes for a retention of {RETENTION}"
    );
}

/// A measurement, not a check (run with `--ignored --nocapture`): `PRODUCERS` (default
/// 300,000) fresh producer ids each produce one batch, with `--retention-bytes 8388608`;
/// prints the broker's RSS growth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_memory_of_many_producer_ids() {
    let producers: usize = std::env::var("PRODUCERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300_000);
    // As in the issue: a small retention, so the log's own bytes stay out of the figure.
    let (running, printed, _stderr) = start_binary(&["--retention-bytes", "8388608"]);
    let kafka = printed_address(&printed, "broker listening on ");
    let pid = running.0.id();
    let before = resident_bytes(pid);
    let started = Instant::now();
    let per_task = producers / 4;
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let mut client = connect(kafka).await;
                let mut request = InitProducerIdRequest::default();
                request.transactional_id = None;
                for _ in 0..per_task / 100 {
                    for _ in 0..100 {
                        client.send(4, &request).await.unwrap();
                    }
                    let mut ids = Vec::with_capacity(100);
                    for _ in 0..100 {
                        let answer = client.receive::<InitProducerIdRequest>().await.unwrap();
                        ids.push(answer.producer_id.0);
                    }
                    for id in ids {
                        let batch = idempotent_batch(id, 0, b"p");
                        let produce = requests::produce("demo", 0, 1, 1000, batch);
                        client.send(7, &produce).await.unwrap();
                    }
                    for _ in 0..100 {
                        let answer = client
                            .receive::<kafka_protocol::messages::ProduceRequest>()
                            .await
                            .unwrap();
                        assert_eq!(answer.responses[0].partition_responses[0].error_code, 0);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let grown = resident_bytes(pid).saturating_sub(before);
    eprintln!(
        "{} producer ids, one batch each, in {:?}: RSS grew {:.1} MiB",
        per_task / 100 * 100 * 4,
        started.elapsed(),
        grown as f64 / f64::from(1 << 20)
    );
}

/// Issue #38, finding 6, trickles: connections sending their requests a byte every 300 ms
/// were busy as long as bytes came, so they kept every place (9,996 of 9,998 still open in
/// the finding, 1 of 41 good produces answered). A request not whole a second after it
/// began no longer holds a place: a fresh client gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_38_finding_6_trickling_connections_make_room_for_a_fresh_client() {
    const CAP: usize = 6;
    let broker = start(BrokerConfig {
        max_connections: CAP,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    let trickling = Arc::new(AtomicBool::new(true));
    let mut tricklers = Vec::new();
    for i in 0..CAP as u8 {
        let mut client = connect_from(IpAddr::from([127, 0, 7, 1 + i]), addr).await;
        let trickling = Arc::clone(&trickling);
        tricklers.push(tokio::spawn(async move {
            // A 1,000-byte request, a byte every 300 ms: five minutes to arrive whole.
            let mut bytes = 1_000i32.to_be_bytes().to_vec();
            bytes.resize(1_004, 0);
            for byte in bytes {
                if !trickling.load(Ordering::Relaxed) || client.send_raw(&[byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }));
    }
    eventually("every place taken", || broker.stats().connections == CAP).await;
    // Every trickler's frame has begun (until then it would be idle, and the fresh client
    // would take its place without any trickle being looked at), but none a second ago.
    tokio::time::sleep(Duration::from_millis(700)).await;
    fresh_client_gets_in(addr).await;
    assert!(broker.stats().evicted_connections >= 1);
    assert!(broker.stats().connections <= CAP);
    trickling.store(false, Ordering::Relaxed);
    for trickler in tricklers {
        trickler.await.unwrap();
    }
    broker.shutdown().await;
}

/// Issue #38, finding 6, strangers: at the cap a newcomer from a fresh address took the
/// place of the idle connection of the *largest* address among those holding as many
/// (one each), which was an established producer's between two of its requests: an
/// attacker sending nothing evicted it before 39 of its 39 produces. Idle strangers'
/// connections (never answered) now go first, then the least recently active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_38_finding_6_newcomers_sending_nothing_take_strangers_places_not_a_producers() {
    const CAP: usize = 4;
    let broker = start(BrokerConfig {
        max_connections: CAP,
        ..config(1)
    })
    .await;
    let addr = broker.local_addr();
    // The producer, from the largest address, answered once: established.
    let mut producer = connect_from(IpAddr::from([127, 0, 8, 250]), addr).await;
    assert_eq!(
        produce(
            &mut producer,
            7,
            purgatory_examples::record_batch::encode_batch(&[Bytes::from_static(b"p")], 1)
        )
        .await
        .0,
        0
    );
    // Newcomers from fresh addresses that send nothing, one every 25 ms, while the
    // producer produces every 50 ms (idle in between).
    let mut strangers = Vec::new();
    for i in 0..40u8 {
        strangers.push(connect_from(IpAddr::from([127, 0, 8, 1 + i]), addr).await);
        tokio::time::sleep(Duration::from_millis(25)).await;
        if i % 2 == 1 {
            let batch =
                purgatory_examples::record_batch::encode_batch(&[Bytes::from_static(b"p")], 1);
            let (error, _) = timeout(
                LIMIT,
                producer.call(7, &requests::produce("demo", 0, 1, 1_000, batch)),
            )
            .await
            .unwrap_or_else(|_| panic!("produce {i}: no answer"))
            .map(|answer| {
                let partition = &answer.responses[0].partition_responses[0];
                (partition.error_code, partition.base_offset)
            })
            .unwrap_or_else(|e| panic!("produce {i}: the producer's connection was closed ({e})"));
            assert_eq!(error, 0);
        }
    }
    assert!(broker.stats().evicted_connections >= 30);
    broker.shutdown().await;
}
