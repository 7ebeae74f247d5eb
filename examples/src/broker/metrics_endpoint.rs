//! `--metrics-listen ADDR`: the purgatories' figures as Prometheus text over HTTP.
//!
//! The purgatory crate's `metrics` feature publishes each purgatory's gauges and counters
//! (labelled `purgatory="produce"` or `"fetch"`) through the `metrics` facade about once
//! a second; [`start`] installs `metrics-exporter-prometheus`'s recorder as the process's
//! recorder and answers every request on `ADDR` with its rendering (Kafka exposes the
//! same figures over JMX). The HTTP side is the least that Prometheus and `curl` need:
//! one request per connection, any path, the answer closes the connection.
//!
//! The recorder is process-wide, so the binary starts this once, not each [`Broker`]
//! (tests start many brokers in one process).
//!
//! Invariants:
//! - At most `max_connections` connections are open at once. The metrics port takes its
//!   descriptors from the ones the Kafka listener's default `--max-connections` leaves to
//!   the broker, so idle scrapers cannot starve Kafka clients of descriptors.
//! - A connection still reading its request head is *idle*; it ends after
//!   `REQUEST_TIMEOUT` (2 s). At the cap a new connection takes the place of the oldest
//!   idle one (which is closed), and is closed at once only when every connection is being
//!   answered. So clients that connect and say nothing, however quickly they reconnect,
//!   cannot keep a scraper out (issue #29: 16 of them made 56 of 56 scrapes fail).
//!
//! [`Broker`]: super::Broker

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Longest wait for a scraper's request head, and its largest accepted size.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// A running metrics endpoint; stops serving when dropped.
#[derive(Debug)]
pub struct MetricsEndpoint {
    local_addr: SocketAddr,
    acceptor: JoinHandle<()>,
}

impl MetricsEndpoint {
    /// The address it listens on (the chosen port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// Installs the Prometheus recorder for the whole process and serves its text on `addr`,
/// on the current tokio runtime, to `max_connections` connections at once. Fails if `addr`
/// cannot be bound or if a recorder is already installed.
pub async fn start(addr: SocketAddr, max_connections: usize) -> io::Result<MetricsEndpoint> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(io::Error::other)?;
    let acceptor = tokio::spawn(accept(listener, handle, max_connections));
    Ok(MetricsEndpoint {
        local_addr,
        acceptor,
    })
}

/// The open connections: how many, and the idle ones (still reading their head), oldest
/// first, each with what closes it.
#[derive(Default)]
struct Connections {
    open: usize,
    next_id: u64,
    idle: VecDeque<(u64, Arc<Notify>)>,
}

/// A connection's place; dropping it frees the place.
struct Open {
    table: Arc<Mutex<Connections>>,
    id: u64,
    evicted: Arc<Notify>,
    /// Whether its head was read (it left `idle` then, and was not evicted).
    answering: bool,
}

impl Open {
    /// Takes a place, evicting the oldest idle connection at the cap; `None` if every
    /// connection is being answered.
    fn admit(table: &Arc<Mutex<Connections>>, max_connections: usize) -> Option<Open> {
        let mut connections = table.lock();
        if connections.open >= max_connections {
            let (_, oldest) = connections.idle.pop_front()?;
            connections.open -= 1;
            oldest.notify_one();
        }
        connections.open += 1;
        let id = connections.next_id;
        connections.next_id += 1;
        let evicted = Arc::new(Notify::new());
        connections.idle.push_back((id, Arc::clone(&evicted)));
        Some(Open {
            table: Arc::clone(table),
            id,
            evicted,
            answering: false,
        })
    }

    /// The head was read: the connection is being answered and may not be evicted. False if
    /// it was evicted already.
    fn answering(&mut self) -> bool {
        let mut connections = self.table.lock();
        let before = connections.idle.len();
        connections.idle.retain(|(id, _)| *id != self.id);
        self.answering = connections.idle.len() < before;
        self.answering
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut connections = self.table.lock();
        let before = connections.idle.len();
        connections.idle.retain(|(id, _)| *id != self.id);
        // Still idle, or answered: it counts. Evicted: it left the count already.
        if connections.idle.len() < before || self.answering {
            connections.open -= 1;
        }
    }
}

async fn accept(listener: TcpListener, handle: PrometheusHandle, max_connections: usize) {
    let table = Arc::new(Mutex::new(Connections::default()));
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let Some(open) = Open::admit(&table, max_connections) else {
                    // Closed at once: its descriptor is back before the next accept.
                    drop(stream);
                    continue;
                };
                let handle = handle.clone();
                tokio::spawn(async move {
                    let mut open = open;
                    let evicted = Arc::clone(&open.evicted);
                    tokio::select! {
                        _ = answer(stream, handle, &mut open) => {}
                        _ = evicted.notified() => {}
                    }
                });
            }
            // Out of descriptors, typically: let some close.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Reads one request head (bounded in time and size) and answers it with the text.
async fn answer(mut stream: TcpStream, handle: PrometheusHandle, open: &mut Open) {
    let mut head = Vec::with_capacity(512);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    if !open.answering() {
        return;
    }
    if read.is_err() || !head.starts_with(b"GET ") {
        let _ = stream
            .write_all(b"HTTP/1.0 400 Bad Request\r\nConnection: close\r\n\r\n")
            .await;
        return;
    }
    let body = handle.render();
    let header = format!(
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(header.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}
