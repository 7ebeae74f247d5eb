//! Kernel memory behind unread answers (issue #38, finding 2: 939 MiB of TCP memory with
//! `--max-connections 100`). Each connection's send buffer grew, with the system's sizes,
//! up to `net.ipv4.tcp_wmem`'s maximum (4 MiB here) when its client did not read; now the
//! broker sets `SO_SNDBUF` and `SO_RCVBUF` on its listener (Kafka's
//! `socket.send.buffer.bytes` and `socket.receive.buffer.bytes`, 100 KiB each), which the
//! connections inherit.
//!
//! Measured system-wide, from `/proc/net/sockstat` (pages of TCP memory), before and after
//! the clients fill what the broker lets them; the clients' own receive buffers are set
//! to 4 KiB, so what grows is the broker's side.
//!
//! Alone in its test binary: no other test may open sockets meanwhile.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use purgatory_examples::record_batch::encode_batch;
use purgatory_examples::wire_client::requests;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

mod support;
use support::{config, connect, start};

/// Pages of TCP memory in use, system-wide.
fn tcp_pages() -> u64 {
    let sockstat = std::fs::read_to_string("/proc/net/sockstat").unwrap();
    let tcp = sockstat.lines().find(|l| l.starts_with("TCP:")).unwrap();
    let mut fields = tcp.split_whitespace();
    while let Some(field) = fields.next() {
        if field == "mem" {
            return fields.next().unwrap().parse().unwrap();
        }
    }
    panic!("no mem in {tcp:?}")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_answers_hold_at_most_the_configured_send_buffer_in_the_kernel() {
    const CLIENTS: usize = 20;
    let broker = start(config(1)).await;
    // 40 batches of 1 MiB: 40 segments to answer from.
    let mut producer = connect(broker.local_addr()).await;
    let batch = encode_batch(&[Bytes::from(vec![b'r'; 1 << 20])], 1_000);
    for _ in 0..40 {
        let answer = producer
            .call(7, &requests::produce("demo", 0, 1, 1_000, batch.clone()))
            .await
            .unwrap();
        assert_eq!(answer.responses[0].partition_responses[0].error_code, 0);
    }
    let before = tcp_pages();
    let mut clients: Vec<TcpStream> = Vec::new();
    for _ in 0..CLIENTS {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(broker.local_addr()).await.unwrap();
        // Twelve answers of about 1 MiB each, never read.
        for i in 0..12 {
            stream.write_all(&fetch_v4(i, i as i64 * 3)).await.unwrap();
        }
        clients.push(stream);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = tcp_pages().saturating_sub(before) * 4096;
    eprintln!(
        "{CLIENTS} clients not reading 12 answers of 1 MiB each: TCP memory grew {:.1} MiB",
        grown as f64 / f64::from(1 << 20)
    );
    // Each broker socket: twice its 100 KiB send buffer (what Linux reserves), and the
    // client's 8 KiB; with the system's sizes, 4 MiB each (80 MiB here).
    let bound = CLIENTS as u64 * (2 * 100 * 1024 + 64 * 1024);
    assert!(
        grown <= bound,
        "TCP memory grew {grown} bytes for {CLIENTS} unread connections, over {bound}"
    );
    drop(clients);
    broker.shutdown().await;
}
