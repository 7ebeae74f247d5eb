//! Kernel memory behind unread answers (issue #38, finding 2: 939 MiB of TCP memory with
//! `--max-connections 100`). Each connection's send buffer grew, with the system's sizes,
//! up to `net.ipv4.tcp_wmem`'s maximum (4 MiB here) when its client did not read; now the
//! broker sets `SO_SNDBUF` and `SO_RCVBUF` on its listener (Kafka's
//! `socket.send.buffer.bytes` and `socket.receive.buffer.bytes`, 100 KiB each), which the
//! connections inherit.
//!
//! Measured on this process's own sockets (the broker runs in it): the bytes waiting in
//! each one's send queue (`SIOCOUTQ`), once the clients, which send their requests and
//! then read nothing, have let the broker fill what it can. Other processes' sockets do
//! not count (the system-wide `/proc/net/sockstat` did, and failed the test when another
//! ran beside it).

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::requests;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

mod support;
use support::{config, connect, start};

/// The tests of this file one at a time: the first counts every socket of the process.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Bytes waiting to be sent, over every socket of this process (`SIOCOUTQ` on each socket
/// descriptor in `/proc/self/fd`).
fn queued_to_send() -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if !target.to_string_lossy().starts_with("socket:") {
            continue;
        }
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<libc::c_int>() else {
            continue;
        };
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (SIOCOUTQ for a socket) writes one int into `queued`, which we
        // own; a descriptor closed meanwhile makes it fail, and nothing is counted.
        if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) } == 0 {
            total += queued.max(0) as u64;
        }
    }
    total
}

/// A Fetch v4 of partition 0 of "demo" from `offset`, answered at once (`max_wait_ms` 0)
/// with up to 50 MiB.
fn fetch_v4(correlation_id: i32, offset: i64) -> Bytes {
    let mut body = BytesMut::new();
    body.put_i16(1); // Fetch
    body.put_i16(4);
    body.put_i32(correlation_id);
    body.put_i16(-1); // no client id
    body.put_i32(-1); // replica id
    body.put_i32(0); // max_wait_ms
    body.put_i32(0); // min_bytes
    body.put_i32(50 << 20); // max_bytes
    body.put_i8(0); // isolation level
    body.put_i32(1);
    body.put_i16(4);
    body.put_slice(b"demo");
    body.put_i32(1);
    body.put_i32(0); // partition
    body.put_i64(offset);
    body.put_i32(50 << 20); // partition max bytes
    let mut frame = BytesMut::new();
    frame.put_i32(body.len() as i32);
    frame.put_slice(&body);
    frame.freeze()
}

/// Appends `batches` batches of 1 MiB to partition 0.
async fn produce_megabytes(broker: &purgatory_examples::broker::Broker, batches: usize) {
    let mut producer = connect(broker.local_addr()).await;
    let batch = encode_batch(&[Bytes::from(vec![b'r'; 1 << 20])], 1_000);
    for _ in 0..batches {
        let answer = producer
            .call(7, &requests::produce("demo", 0, 1, 1_000, batch.clone()))
            .await
            .unwrap();
        assert_eq!(answer.responses[0].partition_responses[0].error_code, 0);
    }
}

/// `clients` connections that send `fetches` (offsets 0, 3, 6, ...) and read nothing,
/// their own receive buffers at 4 KiB.
async fn unread_clients(
    broker: &purgatory_examples::broker::Broker,
    clients: usize,
    fetches: i32,
) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(clients);
    for _ in 0..clients {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(broker.local_addr()).await.unwrap();
        for i in 0..fetches {
            stream.write_all(&fetch_v4(i, i as i64 * 3)).await.unwrap();
        }
        streams.push(stream);
    }
    streams
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_answers_hold_at_most_the_configured_send_buffer_in_the_kernel() {
    let _alone = ONE_AT_A_TIME.lock().await;
    const CLIENTS: usize = 20;
    let broker = start(config(1)).await;
    // 40 batches of 1 MiB: 40 segments to answer from; twelve answers of about 1 MiB
    // each per client, never read.
    produce_megabytes(&broker, 40).await;
    let clients = unread_clients(&broker, CLIENTS, 12).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let queued = queued_to_send();
    eprintln!(
        "{CLIENTS} clients not reading 12 answers of 1 MiB each: {:.1} MiB queued in the \
         broker's send buffers",
        queued as f64 / f64::from(1 << 20)
    );
    // Each broker socket: at most twice its 100 KiB send buffer (what Linux reserves);
    // with the system's sizes, up to 4 MiB each (80 MiB here).
    let bound = CLIENTS as u64 * 2 * 100 * 1024;
    assert!(
        queued <= bound,
        "{queued} bytes queued for {CLIENTS} unread connections, over {bound}"
    );
    assert!(queued > 0, "the answers were sent");
    drop(clients);
    broker.shutdown().await;
}

/// The broker's sockets on `port` that still hold bytes to send (`tx_queue` in
/// `/proc/net/tcp`, loopback IPv4), listening socket aside: after the broker closed them,
/// orphans the kernel keeps until their clients go.
fn sockets_holding_unsent(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields[1].rsplit(':').next().unwrap();
            let tx_queue = fields[4].split(':').next().unwrap();
            u16::from_str_radix(local_port, 16) == Ok(port)
                && fields[3] != "0A"
                && u64::from_str_radix(tx_queue, 16).unwrap() > 0
        })
        .count()
}

/// The review of finding 2: a connection the broker closes while its client reads nothing
/// (here at `--write-timeout-ms`) kept its unsent bytes in an orphan socket, outside
/// `--max-connections`, until the client went. Now the broker resets it: nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_broker_closes_leaves_no_unsent_bytes_behind() {
    let _alone = ONE_AT_A_TIME.lock().await;
    const CLIENTS: usize = 20;
    let broker = start(purgatory_examples::broker::BrokerConfig {
        write_timeout: Duration::from_millis(500),
        ..config(1)
    })
    .await;
    produce_megabytes(&broker, 12).await;
    // One fetch of a 1 MiB answer, and nothing more: a close with nothing unread on the
    // broker's side is a FIN, which leaves the unsent bytes to the kernel.
    let clients = unread_clients(&broker, CLIENTS, 1).await;
    // Past the write timeout: every one of them closed by the broker.
    let port = broker.local_addr().port();
    support::eventually("the unread connections closed", || {
        broker.stats().connections == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left = sockets_holding_unsent(port);
    eprintln!(
        "{CLIENTS} connections closed at the write timeout: {left} sockets still hold unsent bytes"
    );
    assert_eq!(left, 0, "orphans keep what their clients did not read");
    drop(clients);
    broker.shutdown().await;
}
