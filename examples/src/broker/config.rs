//! The broker's configuration and its command-line flags.
//!
//! Invariants: every limit is at least 1 (a zero would refuse everything or close every
//! connection at once), and the defaults are Kafka's where Kafka has the setting and its
//! default is a bound (`connections.max.idle.ms`, `fetch.max.bytes`,
//! `socket.request.max.bytes`, `producer.id.expiration.ms`). Where Kafka's default is
//! "unbounded" (`queued.max.request.bytes`, `retention.bytes`, `max.connections.per.ip`)
//! or Kafka has no such setting (the cap on a fetch's wait, the write timeout, the metrics
//! listener's cap), the default is a bound chosen here and said so in [`USAGE`].

use std::net::SocketAddr;
use std::time::Duration;

use crate::cli::{FlagError, Flags};
use crate::followers::FollowerConfig;

/// Flags the `broker` binary understands, for `--help`.
pub const USAGE: &str = "usage: broker [--listen ADDR] [--topic NAME] [--partitions N] \
[--followers N] [--replication-delay-ms D] [--stall-followers] [--max-frame-bytes B] \
[--max-produce-wait-ms T] [--metrics-listen ADDR] [--max-connections N] [--connections-max-idle-ms T] \
[--frame-read-timeout-ms T] [--fetch-max-bytes B] [--max-partitions-per-request N] \
[--fetch-max-wait-ms T] [--write-timeout-ms T] [--queued-max-request-bytes B] \
[--retention-bytes B] [--metrics-max-connections N] [--max-connections-per-ip N] \
[--producer-id-expiration-ms T] [--socket-send-buffer-bytes B] [--socket-receive-buffer-bytes B]
  --listen ADDR             address to listen on (default 127.0.0.1:9092; port 0 = any free port)
  --topic NAME              the one topic served (default demo)
  --partitions N            its partitions (default 1)
  --followers N             simulated in-process followers of every partition (default 2)
  --replication-delay-ms D  how far the followers lag behind the leader (default 50)
  --stall-followers         followers never catch up: acks=all produces time out
  --max-frame-bytes B       largest request accepted, and each connection's share of
                            --queued-max-request-bytes beyond its own 64 KiB (default 104857600,
                            Kafka's socket.request.max.bytes); a long poll whose state (136 bytes
                            a partition) does not fit is answered at once, its wait as throttle
  --max-produce-wait-ms T   cap on an acks=all produce's own timeout (default 30000, Kafka's
                            request.timeout.ms)
  --metrics-listen ADDR     serve the purgatories' figures as Prometheus text over HTTP there
                            (default: not served; port 0 = any free port)
  --max-connections N       open connections at most (default: the open-file limit minus 64, so
                            clients never use up the descriptors, at most 10000, so the memory
                            bound below stays one); at the cap a new connection takes the place
                            of an idle one (no request started or waiting, or a started request
                            that sent no byte for a second, or a Fetch that has waited a second
                            or more), the least recently active of the address holding the most
                            connections, if that address holds at least as many as the
                            newcomer's; otherwise the newcomer is closed at once
  --max-connections-per-ip N  open connections from one IP address at most: one more takes the
                            place of that address's least recently active idle connection, and
                            is closed at once when none is idle (default: half of
                            --max-connections, at most 1000, so other addresses always have
                            room; Kafka's max.connections.per.ip, whose default is unbounded)
  --connections-max-idle-ms T  close a connection with no request for T ms (default 600000,
                            Kafka's connections.max.idle.ms; a waiting request is not idle)
  --frame-read-timeout-ms T close a connection whose started request is not whole after T ms
                            (default 30000)
  --fetch-max-bytes B       cap on the records of one fetch answer, whatever the client asks
                            (default 57671680, Kafka's fetch.max.bytes: 55 MiB)
  --max-partitions-per-request N  a request naming more entries closes the connection: topics
                            and partitions (Metadata: topics), a Produce partition's record
                            batches after its first, and tagged fields, header and body
                            together, counted before decoding (default 10000)
  --fetch-max-wait-ms T     cap on a fetch's own max_wait_ms: a long poll is answered with what
                            is there after T ms at most (default 30000; Kafka has no cap)
  --write-timeout-ms T      close a connection whose answer is not written whole within T ms,
                            however slowly it reads (default 30000; Kafka has no write timeout,
                            it closes a connection that makes no progress for
                            connections.max.idle.ms)
  --queued-max-request-bytes B  bytes held for clients over all connections, each connection's
                            first 64 KiB aside: every request byte from its read until freed
                            (partial frames, bytes pipelined behind a waiting request, requests
                            being handled or parked, a parked fetch's state at 136 bytes a
                            partition, echoes in unwritten answers) and what
                            unwritten answers copy or keep alive of the log (the segments of the
                            records they share: one retention drops stays while an answer holds
                            it); a read or an answer beyond it closes that connection, except a
                            fetch answer, sent without its records and a 100 ms throttle
                            (default 268435456, 256 MiB; Kafka's queued.max.request.bytes, whose
                            default is unbounded). The bound: this + 64 KiB x --max-connections
                            (881 MiB at most with the defaults)
  --retention-bytes B       bytes kept per partition: the oldest 1 MiB segments are dropped beyond
                            it (default 1073741824, 1 GiB; Kafka's retention.bytes, whose default
                            is unbounded)
  --metrics-max-connections N  open connections of --metrics-listen at most; one more is closed at
                            once (default 16; Kafka has none, it serves JMX)
  --producer-id-expiration-ms T  a partition forgets an idempotent producer T ms after its last
                            append there (default 86400000, one day, Kafka's
                            producer.id.expiration.ms); each remembers 262144 / partitions
                            producers at most (8 to 65536), forgetting the least recently
                            appending one
  --socket-send-buffer-bytes B  each connection's kernel send buffer (SO_SNDBUF; Linux reserves
                            twice it), so unread answers hold at most that much kernel memory
                            per connection (default 102400, Kafka's socket.send.buffer.bytes;
                            -1: the system's, which grows to net.ipv4.tcp_wmem's maximum; Linux
                            caps what is asked at net.core.wmem_max)
  --socket-receive-buffer-bytes B  each connection's kernel receive buffer (SO_RCVBUF), the same
                            way (default 102400, Kafka's socket.receive.buffer.bytes; -1: the
                            system's; capped at net.core.rmem_max)";

/// How a broker is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// Where to listen (only loopback addresses are meant here).
    pub listen: SocketAddr,
    /// The topic served.
    pub topic: String,
    /// Its partition count.
    pub partitions: usize,
    /// Simulated followers.
    pub followers: FollowerConfig,
    /// Largest request frame accepted; a larger one closes the connection. Also what one
    /// connection may hold of `queued_max_request_bytes`.
    pub max_frame_bytes: usize,
    /// Cap on how long an acks=all produce waits, whatever its own timeout says.
    pub max_produce_wait: Duration,
    /// Where the binary serves Prometheus text (see `metrics_endpoint.rs`), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Open connections at most; at the cap a new connection takes an idle one's place, or
    /// is closed at once when none is idle (`admission.rs`).
    pub max_connections: usize,
    /// Open connections from one IP address at most; one more takes the place of an idle
    /// one of that address, or is closed at once when none is idle. `None`:
    /// [`default_max_connections_per_ip`] of `max_connections` (see
    /// [`BrokerConfig::connections_per_ip`]).
    pub max_connections_per_ip: Option<usize>,
    /// A connection that sends no request for this long is closed.
    pub connections_max_idle: Duration,
    /// A request whose first byte arrived must be whole within this, or its connection is
    /// closed.
    pub frame_read_timeout: Duration,
    /// Cap on the record bytes of one fetch answer.
    pub fetch_max_bytes: usize,
    /// Most entries one request may hold, header and body together: topics and partitions
    /// (Metadata: topics), a Produce partition's batches after its first, tagged fields
    /// (`request_entries.rs`).
    pub max_partitions_per_request: usize,
    /// Cap on a fetch's `max_wait_ms`: a long poll is answered after this at most.
    pub fetch_max_wait: Duration,
    /// An answer must be written whole within this, or its connection is closed.
    pub write_timeout: Duration,
    /// Bytes held for clients over all connections (every request byte from its read until
    /// its frame is freed, and what unwritten answers copy or keep alive of the log), beyond
    /// each connection's own [`OWN_REQUEST_BYTES`]; each connection holds at most
    /// `max_frame_bytes` of it. A read that would go beyond closes its connection, so a
    /// request larger than this plus [`OWN_REQUEST_BYTES`] can never be read: keep it above
    /// `max_frame_bytes`. A fetch answer is held at the segments its records keep alive
    /// (4/3 of them at most, and a segment more): keep `max_frame_bytes` above 4/3 of
    /// `fetch_max_bytes` (73 MiB with the defaults) so that any whole answer fits one
    /// connection's share.
    pub queued_max_request_bytes: usize,
    /// Bytes kept per partition; the oldest segments are dropped beyond it.
    pub retention_bytes: u64,
    /// Open connections of the metrics listener at most.
    pub metrics_max_connections: usize,
    /// A partition forgets an idempotent producer this long after its last append there.
    pub producer_id_expiration: Duration,
    /// Each connection's kernel send buffer (`SO_SNDBUF`), or the system's (`None`).
    pub socket_send_buffer: Option<usize>,
    /// Each connection's kernel receive buffer (`SO_RCVBUF`), or the system's (`None`).
    pub socket_receive_buffer: Option<usize>,
}

/// Kafka's `socket.send.buffer.bytes` and `socket.receive.buffer.bytes` default.
pub const DEFAULT_SOCKET_BUFFER_BYTES: usize = 100 * 1024;

/// Request bytes each connection may hold without drawing on the shared
/// `queued_max_request_bytes`: the small requests of every client (Metadata, Fetch,
/// ApiVersions) are always read, however much hostile connections hold.
pub const OWN_REQUEST_BYTES: usize = 64 * 1024;

/// Descriptors kept for the broker itself (listener, standard streams, runtime, threads,
/// and the metrics listener's connections, at most [`DEFAULT_METRICS_MAX_CONNECTIONS`] by
/// default) when the connection cap is derived from the open-file limit.
const RESERVED_DESCRIPTORS: u64 = 64;

/// The largest default cap of connections from one IP address.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 1000;

/// The default cap of connections from one IP address under a broker-wide cap of
/// `max_connections`: half of it (at least 1), at most [`DEFAULT_MAX_CONNECTIONS_PER_IP`],
/// so one address never holds every place and a client of another address gets in.
pub fn default_max_connections_per_ip(max_connections: usize) -> usize {
    (max_connections / 2).clamp(1, DEFAULT_MAX_CONNECTIONS_PER_IP)
}

/// The default cap of the metrics listener's connections (inside `RESERVED_DESCRIPTORS`).
pub const DEFAULT_METRICS_MAX_CONNECTIONS: usize = 16;

/// The largest default connection cap, whatever the open-file limit: each connection may
/// hold [`OWN_REQUEST_BYTES`] outside `queued_max_request_bytes`, so the default memory
/// bound is at most 256 MiB + 64 KiB x 10,000 (881 MiB), not 64 GiB under an open-file
/// limit of 1,048,576 (the second review of issue #29, finding 4).
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// The default connection cap: the soft open-file limit minus 64 (`RESERVED_DESCRIPTORS`),
/// at least 1 and at most [`DEFAULT_MAX_CONNECTIONS`] (also when the limit cannot be read
/// or is unlimited).
pub fn default_max_connections() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; no other memory is touched.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    let open_files = (read && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur);
    max_connections_under(open_files)
}

/// The default connection cap under a soft open-file limit of `open_files` (`None`:
/// unknown or unlimited).
fn max_connections_under(open_files: Option<u64>) -> usize {
    let Some(open_files) = open_files else {
        return DEFAULT_MAX_CONNECTIONS;
    };
    let usable = open_files.saturating_sub(RESERVED_DESCRIPTORS).max(1);
    usize::try_from(usable)
        .unwrap_or(usize::MAX)
        .min(DEFAULT_MAX_CONNECTIONS)
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9092)),
            topic: "demo".to_string(),
            partitions: 1,
            followers: FollowerConfig {
                count: 2,
                lag: Duration::from_millis(50),
                stalled: false,
            },
            max_frame_bytes: 100 * 1024 * 1024,
            // Kafka's request.timeout.ms default (a client's own wait for an answer).
            max_produce_wait: Duration::from_secs(30),
            metrics_listen: None,
            max_connections: default_max_connections(),
            max_connections_per_ip: None,
            connections_max_idle: Duration::from_secs(600),
            frame_read_timeout: Duration::from_secs(30),
            fetch_max_bytes: 55 * 1024 * 1024,
            max_partitions_per_request: 10_000,
            fetch_max_wait: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            queued_max_request_bytes: 256 * 1024 * 1024,
            retention_bytes: 1 << 30,
            metrics_max_connections: DEFAULT_METRICS_MAX_CONNECTIONS,
            producer_id_expiration: crate::producer_sequences::DEFAULT_PRODUCER_EXPIRATION,
            socket_send_buffer: Some(DEFAULT_SOCKET_BUFFER_BYTES),
            socket_receive_buffer: Some(DEFAULT_SOCKET_BUFFER_BYTES),
        }
    }
}

impl BrokerConfig {
    /// The cap of connections from one IP address in force: `max_connections_per_ip`, or
    /// by default [`default_max_connections_per_ip`] of `max_connections`.
    pub fn connections_per_ip(&self) -> usize {
        self.max_connections_per_ip
            .unwrap_or_else(|| default_max_connections_per_ip(self.max_connections))
    }
}

/// The largest partition count accepted (partition indexes are `i32` on the wire).
pub const MAX_PARTITIONS: usize = 100_000;

impl BrokerConfig {
    /// Reads the flags of [`USAGE`].
    pub fn from_args<I>(args: I) -> Result<BrokerConfig, FlagError>
    where
        I: IntoIterator<Item = String>,
    {
        let flags = Flags::parse(
            args,
            &[
                "--listen",
                "--topic",
                "--partitions",
                "--followers",
                "--replication-delay-ms",
                "--max-frame-bytes",
                "--max-produce-wait-ms",
                "--metrics-listen",
                "--max-connections",
                "--connections-max-idle-ms",
                "--frame-read-timeout-ms",
                "--fetch-max-bytes",
                "--max-partitions-per-request",
                "--fetch-max-wait-ms",
                "--write-timeout-ms",
                "--queued-max-request-bytes",
                "--retention-bytes",
                "--metrics-max-connections",
                "--max-connections-per-ip",
                "--producer-id-expiration-ms",
                "--socket-send-buffer-bytes",
                "--socket-receive-buffer-bytes",
            ],
            &["--stall-followers"],
        )?;
        let defaults = BrokerConfig::default();
        let partitions: usize = flags.get("--partitions", defaults.partitions)?;
        if partitions == 0 || partitions > MAX_PARTITIONS {
            return Err(FlagError::BadValue {
                flag: "--partitions".into(),
                value: partitions.to_string(),
                why: format!("must be 1..={MAX_PARTITIONS}"),
            });
        }
        let topic: String = flags.get("--topic", defaults.topic)?;
        if topic.is_empty() || topic.len() > 249 {
            return Err(FlagError::BadValue {
                flag: "--topic".into(),
                value: topic,
                why: "a topic name has 1 to 249 characters".into(),
            });
        }
        let positive = |flag: &str, default: u64| -> Result<u64, FlagError> {
            match flags.get(flag, default)? {
                0 => Err(FlagError::BadValue {
                    flag: flag.into(),
                    value: "0".into(),
                    why: "must be at least 1".into(),
                }),
                value => Ok(value),
            }
        };
        let as_usize = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
        // A buffer size: -1 for the system's, otherwise 1 to 2^31-1 (an `int` to the kernel).
        let buffer = |flag: &str, default: Option<usize>| -> Result<Option<usize>, FlagError> {
            match flags.get_opt::<i64>(flag)? {
                None => Ok(default),
                Some(-1) => Ok(None),
                Some(value @ 1..=0x7fff_ffff) => Ok(Some(value as usize)),
                Some(value) => Err(FlagError::BadValue {
                    flag: flag.into(),
                    value: value.to_string(),
                    why: "must be -1 (the system's) or 1 to 2147483647".into(),
                }),
            }
        };
        let millis = |value: u64| Duration::from_millis(value);
        Ok(BrokerConfig {
            max_connections: as_usize(positive(
                "--max-connections",
                defaults.max_connections as u64,
            )?),
            connections_max_idle: millis(positive(
                "--connections-max-idle-ms",
                defaults.connections_max_idle.as_millis() as u64,
            )?),
            frame_read_timeout: millis(positive(
                "--frame-read-timeout-ms",
                defaults.frame_read_timeout.as_millis() as u64,
            )?),
            fetch_max_bytes: as_usize(positive(
                "--fetch-max-bytes",
                defaults.fetch_max_bytes as u64,
            )?),
            max_partitions_per_request: as_usize(positive(
                "--max-partitions-per-request",
                defaults.max_partitions_per_request as u64,
            )?),
            fetch_max_wait: millis(positive(
                "--fetch-max-wait-ms",
                defaults.fetch_max_wait.as_millis() as u64,
            )?),
            write_timeout: millis(positive(
                "--write-timeout-ms",
                defaults.write_timeout.as_millis() as u64,
            )?),
            queued_max_request_bytes: as_usize(positive(
                "--queued-max-request-bytes",
                defaults.queued_max_request_bytes as u64,
            )?),
            retention_bytes: positive("--retention-bytes", defaults.retention_bytes)?,
            metrics_max_connections: as_usize(positive(
                "--metrics-max-connections",
                defaults.metrics_max_connections as u64,
            )?),
            max_connections_per_ip: match flags.get_opt::<u64>("--max-connections-per-ip")? {
                None => None,
                Some(_) => Some(as_usize(positive("--max-connections-per-ip", 1)?)),
            },
            producer_id_expiration: millis(positive(
                "--producer-id-expiration-ms",
                defaults.producer_id_expiration.as_millis() as u64,
            )?),
            listen: flags.get("--listen", defaults.listen)?,
            topic,
            partitions,
            followers: FollowerConfig {
                count: flags.get("--followers", defaults.followers.count)?,
                lag: Duration::from_millis(flags.get("--replication-delay-ms", 50u64)?),
                stalled: flags.switch("--stall-followers"),
            },
            max_frame_bytes: flags.get("--max-frame-bytes", defaults.max_frame_bytes)?,
            max_produce_wait: millis(positive(
                "--max-produce-wait-ms",
                defaults.max_produce_wait.as_millis() as u64,
            )?),
            metrics_listen: flags.get_opt("--metrics-listen")?,
            socket_send_buffer: buffer("--socket-send-buffer-bytes", defaults.socket_send_buffer)?,
            socket_receive_buffer: buffer(
                "--socket-receive-buffer-bytes",
                defaults.socket_receive_buffer,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<BrokerConfig, FlagError> {
        BrokerConfig::from_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let config = parse(&[]).unwrap();
        assert_eq!(config, BrokerConfig::default());
        assert_eq!(config.listen.to_string(), "127.0.0.1:9092");
        assert_eq!(config.topic, "demo");
        assert_eq!(config.followers.count, 2);
        assert_eq!(config.followers.lag, Duration::from_millis(50));
    }

    #[test]
    fn every_flag_is_read() {
        let config = parse(&[
            "--listen",
            "127.0.0.1:0",
            "--topic",
            "t",
            "--partitions",
            "3",
            "--followers",
            "1",
            "--replication-delay-ms",
            "7",
            "--stall-followers",
            "--max-frame-bytes",
            "1000",
            "--max-produce-wait-ms",
            "250",
            "--max-connections",
            "40",
            "--connections-max-idle-ms",
            "1500",
            "--frame-read-timeout-ms",
            "700",
            "--fetch-max-bytes",
            "4096",
            "--max-partitions-per-request",
            "12",
            "--fetch-max-wait-ms",
            "900",
            "--write-timeout-ms",
            "800",
            "--queued-max-request-bytes",
            "5000",
            "--retention-bytes",
            "6000",
            "--metrics-max-connections",
            "3",
            "--max-connections-per-ip",
            "9",
            "--producer-id-expiration-ms",
            "1234",
            "--socket-send-buffer-bytes",
            "-1",
            "--socket-receive-buffer-bytes",
            "65536",
        ])
        .unwrap();
        assert_eq!(config.listen.port(), 0);
        assert_eq!((config.topic.as_str(), config.partitions), ("t", 3));
        assert_eq!(config.followers.count, 1);
        assert_eq!(config.followers.lag, Duration::from_millis(7));
        assert!(config.followers.stalled);
        assert_eq!(config.max_frame_bytes, 1000);
        assert_eq!(config.max_produce_wait, Duration::from_millis(250));
        assert_eq!(config.max_connections, 40);
        assert_eq!(config.connections_max_idle, Duration::from_millis(1500));
        assert_eq!(config.frame_read_timeout, Duration::from_millis(700));
        assert_eq!(config.fetch_max_bytes, 4096);
        assert_eq!(config.max_partitions_per_request, 12);
        assert_eq!(config.fetch_max_wait, Duration::from_millis(900));
        assert_eq!(config.write_timeout, Duration::from_millis(800));
        assert_eq!(config.queued_max_request_bytes, 5000);
        assert_eq!(config.retention_bytes, 6000);
        assert_eq!(config.metrics_max_connections, 3);
        assert_eq!(config.max_connections_per_ip, Some(9));
        assert_eq!(config.connections_per_ip(), 9);
        assert_eq!(config.producer_id_expiration, Duration::from_millis(1234));
        assert_eq!(config.socket_send_buffer, None);
        assert_eq!(config.socket_receive_buffer, Some(65536));
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse(&["--partitions", "0"]).is_err());
        assert!(parse(&["--listen", "nowhere"]).is_err());
        assert!(parse(&["--topic", ""]).is_err());
        assert!(parse(&["--followers", "-1"]).is_err());
        assert!(parse(&["--max-connections", "0"]).is_err());
        assert!(parse(&["--connections-max-idle-ms", "0"]).is_err());
        assert!(parse(&["--fetch-max-bytes", "0"]).is_err());
        assert!(parse(&["--write-timeout-ms", "0"]).is_err());
        // No way back to an unbounded acks=all wait (the review of issue #29, finding 3).
        assert!(parse(&["--max-produce-wait-ms", "0"]).is_err());
        assert!(parse(&["--retention-bytes", "0"]).is_err());
        assert!(parse(&["--metrics-max-connections", "0"]).is_err());
        assert!(parse(&["--max-connections-per-ip", "0"]).is_err());
        assert!(parse(&["--producer-id-expiration-ms", "0"]).is_err());
        for bad in ["0", "-2", "2147483648"] {
            assert!(parse(&["--socket-send-buffer-bytes", bad]).is_err());
            assert!(parse(&["--socket-receive-buffer-bytes", bad]).is_err());
        }
    }

    #[test]
    fn the_connection_cap_leaves_descriptors_for_the_broker() {
        let cap = default_max_connections();
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own; no other memory is touched.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
        if read && limit.rlim_cur != libc::RLIM_INFINITY && limit.rlim_cur > RESERVED_DESCRIPTORS {
            let usable = limit.rlim_cur - RESERVED_DESCRIPTORS;
            assert_eq!(cap as u64, usable.min(DEFAULT_MAX_CONNECTIONS as u64));
        } else {
            assert!(cap >= 1);
        }
        assert_eq!(BrokerConfig::default().connections_max_idle.as_secs(), 600);
        assert_eq!(BrokerConfig::default().fetch_max_bytes, 57_671_680);
        let expiration = BrokerConfig::default().producer_id_expiration;
        assert_eq!(expiration.as_millis(), 86_400_000);
        // Kafka's request.timeout.ms default.
        assert_eq!(BrokerConfig::default().max_produce_wait.as_millis(), 30_000);
    }

    /// The second review of issue #29, finding 4: the default cap followed the open-file
    /// limit up, and with it the memory bound (64 KiB a connection outside the budget):
    /// 256 MiB + 64 GiB under a limit of 1,048,576.
    #[test]
    fn the_default_connection_cap_stays_at_most_10000_whatever_the_open_file_limit() {
        assert_eq!(max_connections_under(Some(1024)), 960);
        assert_eq!(max_connections_under(Some(10_064)), 10_000);
        assert_eq!(max_connections_under(Some(20_000)), 10_000);
        assert_eq!(max_connections_under(Some(1_048_576)), 10_000);
        assert_eq!(max_connections_under(Some(u64::MAX)), 10_000);
        assert_eq!(max_connections_under(None), 10_000);
        assert_eq!(max_connections_under(Some(3)), 1);
        assert!(default_max_connections() <= DEFAULT_MAX_CONNECTIONS);
        // The bound the README gives for the defaults.
        let defaults = BrokerConfig::default();
        let bound = defaults.queued_max_request_bytes + OWN_REQUEST_BYTES * defaults.max_connections;
        assert!(bound <= (256 << 20) + 10_000 * (64 << 10), "{bound}");
    }

    #[test]
    fn the_default_cap_per_address_is_half_the_connection_cap_at_most_1000() {
        let per_ip = |max: &str| {
            parse(&["--max-connections", max])
                .unwrap()
                .connections_per_ip()
        };
        assert_eq!(per_ip("1"), 1);
        assert_eq!(per_ip("5"), 2);
        assert_eq!(per_ip("20"), 10);
        assert_eq!(per_ip("1960"), 980);
        assert_eq!(per_ip("100000"), 1000);
        let explicit = parse(&["--max-connections", "20", "--max-connections-per-ip", "20"]);
        assert_eq!(explicit.unwrap().connections_per_ip(), 20);
    }
}
