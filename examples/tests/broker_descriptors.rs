//! Issue #38, finding 2: descriptors past the connection cap. A long poll's connection is
//! evictable after a second, and stayed so while its answer was written; evicted then, it
//! left the count at once but kept its descriptor until the write ended, up to
//! `write_timeout` (30 s) for a client that does not read. With the open-file limit near
//! the cap, accepts then failed with "Too many open files".
//!
//! Alone in its test binary: it counts this process's open descriptors, which the broker
//! (in process) and its clients share, and no other test may open or close any meanwhile.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use purgatory_examples::broker::BrokerConfig;
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::{requests, WireClient};
use tokio::time::timeout;

mod support;
use support::{config, eventually, start, LIMIT};

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

async fn connect_from(source: IpAddr, addr: std::net::SocketAddr) -> WireClient {
    timeout(LIMIT, WireClient::connect_from(source, addr))
        .await
        .unwrap()
        .unwrap()
}

const PARTITIONS: i32 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_38_finding_2_an_evicted_connection_writing_an_answer_gives_its_descriptor_back_at_once(
) {
    let broker = start(BrokerConfig {
        max_connections: 2,
        ..config(PARTITIONS as usize)
    })
    .await;
    let addr = broker.local_addr();
    // 1 MiB in each of 40 partitions (an answer reads at most a segment of each), so that
    // a fetch of them all fills the socket of a client that does not read, and its
    // write blocks.
    {
        let mut producer = connect_from(IpAddr::from([127, 0, 2, 2]), addr).await;
        let value = Bytes::from(vec![7u8; 1 << 20]);
        for partition in 0..PARTITIONS {
            let batch = encode_batch(std::slice::from_ref(&value), 1_000);
            let answer = timeout(
                LIMIT,
                producer.call(7, &requests::produce("demo", partition, 1, 1_000, batch)),
            )
            .await
            .unwrap()
            .unwrap();
            assert_eq!(answer.responses[0].partition_responses[0].error_code, 0);
        }
    }
    eventually("the producer's connection gone", || {
        broker.stats().connections == 0
    })
    .await;
    // A long poll that never reads its answer: min_bytes out of reach, answered at max_wait (1.5 s) with
    // 40 MiB, after it became evictable (1 s).
    let mut fetch = requests::fetch("demo", 0, 0, i32::MAX, 1_500);
    let wanted = fetch.topics[0].partitions[0].clone();
    fetch.topics[0].partitions = (0..PARTITIONS)
        .map(|partition| {
            let mut p = wanted.clone();
            p.partition = partition;
            p.partition_max_bytes = 2 << 20;
            p
        })
        .collect();
    let reader = connect_from(IpAddr::from([127, 0, 9, 9]), addr).await;
    let mut reader = reader;
    reader.send(11, &fetch).await.unwrap();
    // Another client, established (answered once), so that the eviction picks the
    // long poll's connection, a stranger's (issue #38, finding 6).
    let mut other = connect_from(IpAddr::from([127, 0, 3, 3]), addr).await;
    timeout(LIMIT, other.call(4, &requests::list_offsets("demo", 0, -1)))
        .await
        .unwrap()
        .unwrap();
    eventually("both places taken", || broker.stats().connections == 2).await;
    // Its answer is being written, and blocked.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let before = open_descriptors();
    // A newcomer at the cap evicts the writing connection.
    let _newcomer = connect_from(IpAddr::from([127, 0, 5, 5]), addr).await;
    eventually("an eviction", || broker.stats().evicted_connections >= 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = open_descriptors();
    // The newcomer's two ends came, the evicted connection's broker end went.
    assert!(
        after <= before + 1,
        "{before} descriptors before the newcomer, {after} half a second after its eviction: \
         the evicted connection kept its descriptor"
    );
    assert!(broker.stats().connections <= 2);
    // What the reader got before its connection was closed: part of the answer, then the
    // end of the stream (not the 40 MiB).
    let mut received = 0;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match timeout(LIMIT, reader.read_some(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => received += n,
            Err(_) => panic!("the evicted connection stayed open"),
        }
    }
    assert!(
        received > 0,
        "nothing of the answer came: the eviction took the waiting poll, not the write"
    );
    assert!(
        received < 40 << 20,
        "the whole answer came: {received} bytes"
    );
    broker.shutdown().await;
}
