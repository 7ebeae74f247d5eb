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
//! Invariant: at most `max_connections` scrapers are served at once; a connection accepted
//! beyond that is closed at once. The metrics port takes its descriptors from the ones the
//! Kafka listener's default `--max-connections` leaves to the broker, so idle scrapers
//! cannot starve Kafka clients of descriptors (each connection also ends after
//! `REQUEST_TIMEOUT` without a request).
//!
//! [`Broker`]: super::Broker

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Longest wait for a scraper's request head, and its largest accepted size.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
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

/// Counts a scraper's connection for as long as it lives.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn accept(listener: TcpListener, handle: PrometheusHandle, max_connections: usize) {
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let admitted = open
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n < max_connections).then_some(n + 1)
                    })
                    .is_ok();
                if !admitted {
                    // Closed at once: its descriptor is back before the next accept.
                    drop(stream);
                    continue;
                }
                let counted = Open(Arc::clone(&open));
                let handle = handle.clone();
                tokio::spawn(async move {
                    let _counted = counted;
                    answer(stream, handle).await;
                });
            }
            // Out of descriptors, typically: let some close.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Reads one request head (bounded in time and size) and answers it with the text.
async fn answer(mut stream: TcpStream, handle: PrometheusHandle) {
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
