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
//! - At most `max_connections` connections are open, at most `max_connections_per_ip`
//!   from one address (`admission.rs`): at the broker-wide cap a new connection takes the
//!   place of an idle one (the least recently active of the address holding the most; at
//!   its address's cap, of its own address), and is closed at once only when none is idle
//!   (refusals logged at most once a second, with a count), so clients cannot use up the
//!   broker's file descriptors, and one client's idle connections cannot keep others out.
//!   A newcomer never evicts a connection of an address holding fewer connections than
//!   its own, and by default one address holds at most half of `max_connections`.
//! - Connection-level log lines are rate-limited per kind, with a count of those
//!   suppressed (`log_limit.rs`).
//! - After a burst of closed connections the freed memory goes back to the operating
//!   system about a quarter of a second later (`memory.rs`); nothing ticks meanwhile.
//! - [`Broker::shutdown`] stops accepting, stops the followers and shuts the purgatories
//!   down (which expires whatever still waits, counted as expired), then ends every
//!   connection task; it returns the counters as they are after all that.

mod address_prefix;
mod admission;
pub mod api_versions;
mod client_socket;
pub mod config;
mod connection;
mod fetch;
pub(crate) mod frame;
mod init_producer_id;
mod list_offsets;
mod log_limit;
mod memory;
mod metadata;
pub mod metrics_endpoint;
mod produce;
mod producer_id_quota;
mod producer_ids;
mod reply;
mod request_budget;
mod request_entries;
mod stalled_read;
mod topic_ids;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

pub use config::BrokerConfig;
pub use fetch::PARKED_BYTES_PER_PARTITION;

use crate::leader::{Leader, LeaderStats};
use crate::partition::{Partition, PartitionKey};
use admission::{Admission, Refused};
use producer_id_quota::ProducerIdQuota;
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
    /// How fast each address may take producer ids.
    pub producer_id_quota: ProducerIdQuota,
    /// Open connections (counted until their task ends, evicted ones included).
    pub connections: AtomicUsize,
    /// Which connections may be open: the caps and the eviction of idle connections.
    pub admission: Arc<Admission>,
    /// Bytes held for clients beyond each connection's own allowance, over all connections.
    pub request_budget: Arc<RequestBudget>,
    /// Connections closed since memory was last handed back (`memory.rs`).
    pub closed_since_trim: AtomicUsize,
    /// Wakes the task that hands memory back.
    pub trim_wanted: Notify,
    /// Whether to print connection problems to stderr.
    pub verbose: bool,
    /// How many of those lines are printed (`log_limit.rs`).
    log_limit: log_limit::LogLimit,
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
            producer_states: (0..self.config.partitions)
                .filter_map(|i| self.leader.partition(PartitionKey(i as u32)))
                .map(|p| p.producer_states())
                .sum(),
            evicted_connections: self.admission.evicted(),
            leader: self.leader.stats(),
        }
    }

    /// Reports a connection-level event, at most a few lines a second of each kind
    /// (`log_limit.rs`), saying how many were suppressed.
    pub fn log(&self, message: &str) {
        if !self.verbose {
            return;
        }
        match self.log_limit.check(message, Instant::now()) {
            log_limit::Verdict::Drop => {}
            log_limit::Verdict::Write { suppressed, kind } => {
                if suppressed > 0 {
                    eprintln!("broker: suppressed {suppressed} more line(s) like \"{kind}\"");
                }
                eprintln!("broker: {message}");
            }
        }
    }
}

/// Counters of a running broker.
#[derive(Debug, Clone, Copy)]
pub struct BrokerStats {
    /// Open connections.
    pub connections: usize,
    /// Bytes held for clients (request bytes until freed, what unwritten answers copy or
    /// keep alive of the log) that draw on `queued_max_request_bytes`, beyond each
    /// connection's own 64 KiB.
    pub queued_request_bytes: usize,
    /// Bytes held by the partitions' logs (what retention keeps).
    pub log_bytes: u64,
    /// Producer ids handed out and still live (at most `MAX_LIVE_PRODUCER_IDS`).
    pub producer_ids: usize,
    /// Idempotent producers remembered, over all partitions (at most
    /// `max(262,144, 8 x partitions)`, `producer_sequences.rs`; each expired after
    /// `producer_id_expiration`).
    pub producer_states: usize,
    /// Idle connections closed to make room for new ones at the `max_connections` cap.
    pub evicted_connections: u64,
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
        let listener = listen(&config)?;
        let local_addr = listener.local_addr()?;
        let queued_max_request_bytes = config.queued_max_request_bytes;
        let leader = Leader::start_with_limits(
            config.partitions,
            config.followers,
            config.retention_bytes,
            config.producer_id_expiration,
        );
        let admission = Admission::new(config.max_connections, config.connections_per_ip());
        let producer_ids = ProducerIds::new(config.producer_id_expiration);
        let state = Arc::new(BrokerState {
            config,
            leader,
            advertised: local_addr,
            producer_ids,
            producer_id_quota: ProducerIdQuota::default(),
            connections: AtomicUsize::new(0),
            admission: Arc::new(admission),
            request_budget: Arc::new(RequestBudget::new(queued_max_request_bytes)),
            closed_since_trim: AtomicUsize::new(0),
            trim_wanted: Notify::new(),
            verbose,
            log_limit: log_limit::LogLimit::default(),
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
    /// Counts one more connection (admitted by [`Admission::admit`]).
    fn count(state: &Arc<BrokerState>) -> Self {
        state.connections.fetch_add(1, Ordering::AcqRel);
        OpenConnection(Arc::clone(state))
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
        memory::connection_closed(&self.0);
    }
}

/// Connections refused by the caps, reported at most once a second.
struct Refusals {
    since_report: u64,
    last_report: Option<Instant>,
}

impl Refusals {
    fn refused(&mut self, state: &BrokerState, why: Refused) {
        self.since_report += 1;
        if self
            .last_report
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        state.log(&format!(
            "refused {} connection(s), the last by {why} ({} open at most, {} per address)",
            self.since_report,
            state.config.max_connections,
            state.config.connections_per_ip()
        ));
        self.since_report = 0;
        self.last_report = Some(Instant::now());
    }
}

/// The listening socket, its buffer sizes set before it listens: accepted connections
/// inherit them (Linux), and a receive buffer must be set before the handshake for the
/// window scale to follow it. They bound the kernel memory each connection holds: with
/// the system's sizes an unread answer filled a send buffer up to `net.ipv4.tcp_wmem`'s
/// maximum (4 MiB here; issue #38, finding 2: 939 MiB of TCP memory at 100 connections).
fn listen(config: &BrokerConfig) -> io::Result<TcpListener> {
    let socket = match config.listen {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // As `TcpListener::bind` does: a restarted broker may bind while old connections linger.
    socket.set_reuseaddr(true)?;
    if let Some(bytes) = config.socket_send_buffer {
        socket.set_send_buffer_size(u32::try_from(bytes).unwrap_or(u32::MAX))?;
    }
    if let Some(bytes) = config.socket_receive_buffer {
        socket.set_recv_buffer_size(u32::try_from(bytes).unwrap_or(u32::MAX))?;
    }
    socket.bind(config.listen)?;
    socket.listen(1024)
}

async fn accept(listener: TcpListener, state: Arc<BrokerState>, stop: watch::Receiver<bool>) {
    let mut refusals = Refusals {
        since_report: 0,
        last_report: None,
    };
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let slot = match state.admission.admit(peer.ip()) {
                    Ok(slot) => slot,
                    Err(why) => {
                        drop(stream);
                        refusals.refused(&state, why);
                        continue;
                    }
                };
                let open = OpenConnection::count(&state);
                let state = Arc::clone(&state);
                let stop = stop.clone();
                tokio::spawn(async move {
                    let _open = open;
                    connection::serve(state, stream, stop, slot).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// The kernel's size of `option` (`SO_SNDBUF` or `SO_RCVBUF`) on `socket`.
    fn buffer_size(socket: &impl AsRawFd, option: libc::c_int) -> usize {
        let mut size: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `size`, which we own.
        let read = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&mut size as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(read, 0);
        size as usize
    }

    /// A connection accepted by a listener built with these buffer sizes.
    async fn accepted_with(send: Option<usize>, receive: Option<usize>) -> tokio::net::TcpStream {
        let config = BrokerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            socket_send_buffer: send,
            socket_receive_buffer: receive,
            ..BrokerConfig::default()
        };
        let listener = listen(&config).unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
        let (accepted, client) = tokio::join!(listener.accept(), client);
        drop(client);
        accepted.unwrap().0
    }

    /// Issue #38, finding 2: the buffer sizes set on the listener are the accepted
    /// connections' (Linux doubles what is asked, for its bookkeeping).
    #[tokio::test]
    async fn accepted_connections_have_the_configured_kernel_buffers() {
        for (send, receive) in [(100 * 1024, 100 * 1024), (8192, 16384)] {
            let stream = accepted_with(Some(send), Some(receive)).await;
            assert_eq!(buffer_size(&stream, libc::SO_SNDBUF), 2 * send);
            assert_eq!(buffer_size(&stream, libc::SO_RCVBUF), 2 * receive);
        }
        // The system's: what an unread answer may fill is then tcp_wmem's maximum.
        let stream = accepted_with(None, None).await;
        assert_ne!(buffer_size(&stream, libc::SO_SNDBUF), 2 * 100 * 1024);
    }
}
