//! A small Kafka-protocol broker with the purgatory in its request path.
//!
//! One topic of in-memory partitions, led by this broker (node 0); simulated followers
//! inside the process copy every append after a configurable delay; the high watermark is
//! the smallest log end offset over the in-sync replicas. acks=all produces and long-poll
//! fetches wait in the purgatories of [`Leader`]. The wire protocol
//! is the `kafka-protocol` crate's codec, over tokio.
//!
//! Invariants:
//! - Each connection is one tokio task; requests on it are answered in order
//!   (`connection.rs`); waiting requests hold no thread.
//! - At most `max_connections` connections are open: one accepted beyond the cap is closed
//!   at once (logged at most once a second, with a count), so clients cannot use up the
//!   broker's file descriptors.
//! - After a burst of closed connections the freed memory goes back to the operating
//!   system about a quarter of a second later (`memory.rs`); nothing ticks meanwhile.
//! - [`Broker::shutdown`] stops accepting, stops the followers and shuts the purgatories
//!   down (which expires whatever still waits, counted as expired), then ends every
//!   connection task; it returns the counters as they are after all that.

pub mod api_versions;
mod client_socket;
pub mod config;
mod connection;
mod fetch;
pub(crate) mod frame;
mod init_producer_id;
mod list_offsets;
mod memory;
mod metadata;
pub mod metrics_endpoint;
mod produce;
mod producer_ids;
mod reply;
mod request_budget;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

pub use config::BrokerConfig;

use crate::leader::{Leader, LeaderStats};
use crate::partition::{Partition, PartitionKey};
use producer_ids::ProducerIds;
use request_budget::RequestBudget;

/// What every connection shares.
pub(crate) struct BrokerState {
    /// The configuration.
    pub config: BrokerConfig,
    /// Partitions, followers, purgatories.
    pub leader: Leader,
    /// The address clients are told to connect to (the bound address).
    pub advertised: SocketAddr,
    /// The producer ids InitProducerId handed out: the only ones a produce may use.
    pub producer_ids: ProducerIds,
    /// Open connections.
    pub connections: AtomicUsize,
    /// Bytes held for clients beyond each connection's own allowance, over all connections.
    pub request_budget: Arc<RequestBudget>,
    /// Connections closed since memory was last handed back (`memory.rs`).
    pub closed_since_trim: AtomicUsize,
    /// Wakes the task that hands memory back.
    pub trim_wanted: Notify,
    /// Whether to print connection problems to stderr.
    pub verbose: bool,
}

impl BrokerState {
    /// The partition `index` of topic `topic`, if this broker has it.
    pub fn partition(&self, topic: &str, index: i32) -> Option<(PartitionKey, &Arc<Partition>)> {
        if topic != self.config.topic {
            return None;
        }
        let key = PartitionKey(u32::try_from(index).ok()?);
        Some((key, self.leader.partition(key)?))
    }

    /// Current counters.
    fn stats(&self) -> BrokerStats {
        BrokerStats {
            connections: self.connections.load(Ordering::Relaxed),
            queued_request_bytes: self.request_budget.drawn(),
            log_bytes: (0..self.config.partitions)
                .filter_map(|i| self.leader.partition(PartitionKey(i as u32)))
                .map(|p| p.log_bytes())
                .sum(),
            producer_ids: self.producer_ids.live(),
            leader: self.leader.stats(),
        }
    }

    /// Reports a connection-level event.
    pub fn log(&self, message: &str) {
        if self.verbose {
            eprintln!("broker: {message}");
        }
    }
}

/// Counters of a running broker.
#[derive(Debug, Clone, Copy)]
pub struct BrokerStats {
    /// Open connections.
    pub connections: usize,
    /// Bytes held for clients (request bytes until freed, what unwritten answers copy)
    /// that draw on `queued_max_request_bytes`, beyond each connection's own 64 KiB.
    pub queued_request_bytes: usize,
    /// Bytes held by the partitions' logs (what retention keeps).
    pub log_bytes: u64,
    /// Producer ids handed out and still live (at most `MAX_LIVE_PRODUCER_IDS`).
    pub producer_ids: usize,
    /// The purgatories' counters.
    pub leader: LeaderStats,
}

/// A running broker.
pub struct Broker {
    state: Arc<BrokerState>,
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    acceptor: JoinHandle<()>,
}

impl Broker {
    /// Binds `config.listen` and starts serving on the current tokio runtime.
    pub async fn start(config: BrokerConfig) -> io::Result<Broker> {
        Self::start_with(config, false).await
    }

    /// Like [`Broker::start`]; `verbose` prints closed-connection reasons to stderr.
    pub async fn start_with(config: BrokerConfig, verbose: bool) -> io::Result<Broker> {
        let listener = TcpListener::bind(config.listen).await?;
        let local_addr = listener.local_addr()?;
        let queued_max_request_bytes = config.queued_max_request_bytes;
        let leader = Leader::start_with_retention(
            config.partitions,
            config.followers,
            config.retention_bytes,
        );
        let state = Arc::new(BrokerState {
            config,
            leader,
            advertised: local_addr,
            producer_ids: ProducerIds::default(),
            connections: AtomicUsize::new(0),
            request_budget: Arc::new(RequestBudget::new(queued_max_request_bytes)),
            closed_since_trim: AtomicUsize::new(0),
            trim_wanted: Notify::new(),
            verbose,
        });
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(memory::release_after_bursts(
            Arc::clone(&state),
            stopped.clone(),
        ));
        // Ended by `shutdown`, which aborts it.
        let acceptor = tokio::spawn(accept(listener, Arc::clone(&state), stopped));
        Ok(Broker {
            state,
            local_addr,
            stop,
            acceptor,
        })
    }

    /// The address the broker listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Current counters.
    pub fn stats(&self) -> BrokerStats {
        self.state.stats()
    }

    /// Stops the broker: no new connections, followers stopped, purgatories shut down
    /// (what waits there expires), every connection closed. Returns the final counters.
    pub async fn shutdown(self) -> BrokerStats {
        self.acceptor.abort();
        let _ = self.acceptor.await;
        let state = Arc::clone(&self.state);
        // Joining the follower threads blocks: keep it off the async workers. The
        // connections are still open here, so waiting requests expire rather than being
        // cancelled by their connection's end.
        let _ = tokio::task::spawn_blocking(move || state.leader.stop_followers()).await;
        self.state.leader.shutdown_purgatories().await;
        let _ = self.stop.send(true);
        self.state.stats()
    }
}

/// Counts a connection as open for as long as it lives (even if its task panics).
struct OpenConnection(Arc<BrokerState>);

impl OpenConnection {
    /// Counts one more connection, unless `max_connections` are open already.
    fn admit(state: &Arc<BrokerState>) -> Option<Self> {
        let cap = state.config.max_connections;
        state
            .connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < cap).then_some(open + 1)
            })
            .ok()?;
        Some(OpenConnection(Arc::clone(state)))
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
        memory::connection_closed(&self.0);
    }
}

/// Connections refused by the cap, reported at most once a second.
struct Refusals {
    since_report: u64,
    last_report: Option<Instant>,
}

impl Refusals {
    fn refused(&mut self, state: &BrokerState) {
        self.since_report += 1;
        if self
            .last_report
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        state.log(&format!(
            "refused {} connection(s): {} open, the --max-connections cap",
            self.since_report, state.config.max_connections
        ));
        self.since_report = 0;
        self.last_report = Some(Instant::now());
    }
}

async fn accept(listener: TcpListener, state: Arc<BrokerState>, stop: watch::Receiver<bool>) {
    let mut refusals = Refusals {
        since_report: 0,
        last_report: None,
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let Some(open) = OpenConnection::admit(&state) else {
                    drop(stream);
                    refusals.refused(&state);
                    continue;
                };
                let state = Arc::clone(&state);
                let stop = stop.clone();
                tokio::spawn(async move {
                    let _open = open;
                    connection::serve(state, stream, stop).await;
                });
            }
            Err(e) => {
                // Out of file descriptors, typically: wait a little instead of spinning.
                state.log(&format!("accept failed: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
