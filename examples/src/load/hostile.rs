//! The memory a hostile connection holds in the broker (issue #23): `connections` clients
//! each do one of the scenarios below and stay connected; the broker's resident memory and
//! descriptors are read from `/proc` before (after any setup) and once they have all done
//! it, then the clients leave and the broker is read again.
//!
//! - [`Scenario::PipelinedPolls`] (N1): a long poll (min_bytes and max_wait 2^31-1), then
//!   1 MiB + 4 KiB of anything pipelined behind it.
//! - [`Scenario::SlowReaders`] (N2): one 8 MiB batch is produced first; each client fetches
//!   it with `max_bytes` 1 (the first batch comes whole) and reads nothing.
//! - [`Scenario::MetadataEcho`] (N2): a Metadata request naming `names` unknown topics of
//!   32,000 bytes each (the answer echoes them), never read.
//! - [`Scenario::PartialFrames`]: a request announced as 100 MiB of which 1 MiB is sent.
//! - [`Scenario::PaddedPoll`] (issue #29, finding 1): a Fetch v12 long poll padded to
//!   `mib` MiB in an unknown tagged field.
//! - [`Scenario::Echo`] (finding 3): a ListOffsets v6, Produce v9 (acks=1) or Fetch v12
//!   naming one unknown topic of `mib` MiB, whose answer echoes it, never read.
//! - [`Scenario::PollsThenPartial`] (finding 4): 4 long polls, then `mib` MiB of a
//!   request announced as 100 MiB.
//! - [`Scenario::RetentionReaders`] (issue #38, finding 5): before each client a producer
//!   appends one segment (4 batches of 300,000 bytes, 1.2 MB), after enough of
//!   them first to fill the broker's retention; each client pipelines 16 fetches of that
//!   segment and reads nothing, so with retention dropping segments each unread answer
//!   holds a segment the log no longer has. Run the broker with a small
//!   `--retention-bytes`.
//!
//! Connections the broker closes (a defence acting) are counted: their memory is not held.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::bounded;
use super::process_usage::{self, ProcessUsage};
use crate::record_batch::encode_batch;
use crate::wire_client::{requests, WireClient};

/// How long the clients are given to do their part before the broker is read.
const SETTLE: Duration = Duration::from_secs(2);

/// What each hostile client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// A long poll, then 1 MiB + 4 KiB pipelined behind it.
    PipelinedPolls,
    /// A fetch of an 8 MiB batch never read.
    SlowReaders,
    /// A Metadata request echoing `names` names of 32,000 bytes, never read.
    MetadataEcho {
        /// Unknown topic names per request.
        names: usize,
    },
    /// 1 MiB of a request announced as 100 MiB.
    PartialFrames,
    /// A long poll padded to `mib` MiB.
    PaddedPoll {
        /// Padding, MiB.
        mib: usize,
    },
    /// A request whose answer echoes a topic name of `mib` MiB, never read.
    Echo {
        /// Which request.
        api: EchoingApi,
        /// The name's size, MiB.
        mib: usize,
    },
    /// 4 long polls, then `mib` MiB of a request announced as 100 MiB.
    PollsThenPartial {
        /// Bytes sent of the last request, MiB.
        mib: usize,
    },
    /// 16 pipelined fetches of the segment appended just before, never read; `mib` MiB
    /// appended before the first client (at least the broker's retention).
    RetentionReaders {
        /// Appended first, MiB.
        mib: usize,
    },
}

/// Batches of 300,000 bytes appended before each client of
/// [`Scenario::RetentionReaders`]: 1.2 MB, one sealed segment of the log.
const SEGMENT_ROUND: usize = 4;

/// The requests whose answers echo a topic name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EchoingApi {
    /// ListOffsets v6.
    ListOffsets,
    /// Produce v9, acks=1.
    Produce,
    /// Fetch v12.
    Fetch,
}

impl Scenario {
    /// The scenario named `name` (`pipelined-polls`, `slow-readers`, `metadata-echo`,
    /// `partial-frames`, `padded-poll`, `list-offsets-echo`, `produce-echo`, `fetch-echo`,
    /// `polls-then-partial`, `retention-readers`); `names` is Metadata's name count, `mib`
    /// the others' size.
    pub fn named(name: &str, names: usize, mib: usize) -> Option<Scenario> {
        let echo = |api| Scenario::Echo { api, mib };
        Some(match name {
            "pipelined-polls" => Scenario::PipelinedPolls,
            "slow-readers" => Scenario::SlowReaders,
            "metadata-echo" => Scenario::MetadataEcho { names },
            "partial-frames" => Scenario::PartialFrames,
            "padded-poll" => Scenario::PaddedPoll { mib },
            "list-offsets-echo" => echo(EchoingApi::ListOffsets),
            "produce-echo" => echo(EchoingApi::Produce),
            "fetch-echo" => echo(EchoingApi::Fetch),
            "polls-then-partial" => Scenario::PollsThenPartial { mib },
            "retention-readers" => Scenario::RetentionReaders { mib },
            _ => return None,
        })
    }
}

/// What was measured.
#[derive(Debug, Clone)]
pub struct HostileReport {
    /// The broker after any setup, before the hostile clients.
    pub before: ProcessUsage,
    /// Its descriptors then.
    pub before_files: usize,
    /// With every hostile client connected and done.
    pub held: ProcessUsage,
    /// Its descriptors then.
    pub held_files: usize,
    /// One second after the clients left.
    pub after: ProcessUsage,
    /// Clients whose connection the broker had closed when `held` was read.
    pub closed_by_broker: usize,
}

/// Runs `connections` clients of `scenario` against `broker` (process `pid`).
pub async fn run(
    broker: SocketAddr,
    pid: u32,
    scenario: Scenario,
    connections: usize,
) -> io::Result<HostileReport> {
    if scenario == Scenario::SlowReaders {
        let mut producer = bounded("connect", WireClient::connect(broker)).await?;
        let batch = encode_batch(&[Bytes::from(vec![b'x'; 8 << 20])], 1_000);
        let produce = requests::produce("demo", 0, 1, 30_000, batch);
        bounded("produce", producer.call(7, &produce)).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut producer = None;
    if let Scenario::RetentionReaders { mib } = scenario {
        let mut client = bounded("connect", WireClient::connect(broker)).await?;
        for _ in 0..(mib << 20).div_ceil(SEGMENT_ROUND * 300_000) {
            append_segment(&mut client).await?;
        }
        producer = Some(client);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let before = process_usage::read(pid)?;
    let before_files = process_usage::open_files(pid)?;
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let mut client = bounded("connect", WireClient::connect(broker)).await?;
        match &mut producer {
            Some(producer) => {
                let first = append_segment(producer).await?;
                read_never(&mut client, first).await?;
            }
            None => act(&mut client, scenario).await?,
        }
        clients.push(client);
    }
    tokio::time::sleep(SETTLE).await;
    let held = process_usage::read(pid)?;
    let held_files = process_usage::open_files(pid)?;
    let mut closed_by_broker = 0;
    for client in &mut clients {
        if closed(client).await {
            closed_by_broker += 1;
        }
    }
    drop(clients);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = process_usage::read(pid)?;
    Ok(HostileReport {
        before,
        before_files,
        held,
        held_files,
        after,
        closed_by_broker,
    })
}

/// Appends one segment's batches ([`SEGMENT_ROUND`]); the offset of the first.
async fn append_segment(producer: &mut WireClient) -> io::Result<i64> {
    let mut first = None;
    for i in 0..SEGMENT_ROUND {
        let batch = encode_batch(&[Bytes::from(vec![i as u8; 300_000])], 1_000);
        let produce = requests::produce("demo", 0, 1, 30_000, batch);
        let answer = bounded("produce", producer.call(7, &produce)).await?;
        let partition = &answer.responses[0].partition_responses[0];
        if partition.error_code != 0 {
            return Err(io::Error::other(format!(
                "produce refused: error {}",
                partition.error_code
            )));
        }
        first.get_or_insert(partition.base_offset);
    }
    Ok(first.unwrap_or(0))
}

/// [`Scenario::RetentionReaders`]: 16 fetches from `offset`, 8 MiB a partition, pipelined
/// and never read (the writes a closing broker refuses are fine).
async fn read_never(client: &mut WireClient, offset: i64) -> io::Result<()> {
    let mut fetch = requests::fetch("demo", 0, offset, 1, 0);
    fetch.topics[0].partitions[0].partition_max_bytes = 8 << 20;
    for _ in 0..16 {
        match client.send(12, &fetch).await {
            Ok(_) => {}
            Err(e)
                if e.kind() == io::ErrorKind::BrokenPipe
                    || e.kind() == io::ErrorKind::ConnectionReset =>
            {
                return Ok(())
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Does the scenario's part on `client` (the writes a closing broker refuses are fine).
async fn act(client: &mut WireClient, scenario: Scenario) -> io::Result<()> {
    let sent = match scenario {
        Scenario::PipelinedPolls => {
            client
                .send(4, &requests::fetch("demo", 0, 0, i32::MAX, i32::MAX))
                .await?;
            client.send_raw(&vec![0x55u8; (1 << 20) + 4096]).await
        }
        Scenario::SlowReaders => {
            let mut fetch = requests::fetch("demo", 0, 0, 1, 0);
            fetch.max_bytes = 1;
            fetch.topics[0].partitions[0].partition_max_bytes = 1;
            client.send(4, &fetch).await.map(drop)
        }
        Scenario::MetadataEcho { names } => {
            let topics = (0..names)
                .map(|i| {
                    let mut name = format!("{i:06}");
                    name.extend(std::iter::repeat_n('n', 32_000 - name.len()));
                    let mut topic = MetadataRequestTopic::default();
                    topic.name = Some(TopicName(StrBytes::from_string(name)));
                    topic
                })
                .collect();
            let mut request = MetadataRequest::default();
            request.topics = Some(topics);
            client.send(1, &request).await.map(drop)
        }
        Scenario::PartialFrames => {
            let mut partial = (100i32 << 20).to_be_bytes().to_vec();
            partial.resize(4 + (1 << 20), 0x55);
            client.send_raw(&partial).await
        }
        Scenario::PaddedPoll { mib } => {
            let mut poll = requests::fetch("demo", 0, 0, i32::MAX, i32::MAX);
            poll.unknown_tagged_fields
                .insert(1_000, Bytes::from(vec![0x55u8; mib << 20]));
            client.send(12, &poll).await.map(drop)
        }
        Scenario::Echo { api, mib } => {
            let name = "u".repeat(mib << 20);
            match api {
                EchoingApi::ListOffsets => client
                    .send(6, &requests::list_offsets(&name, 0, -1))
                    .await
                    .map(drop),
                EchoingApi::Produce => {
                    let batch = encode_batch(&[Bytes::from_static(b"x")], 1_000);
                    let produce = requests::produce(&name, 0, 1, 1000, batch);
                    client.send(9, &produce).await.map(drop)
                }
                EchoingApi::Fetch => client
                    .send(12, &requests::fetch(&name, 0, 0, 1, 0))
                    .await
                    .map(drop),
            }
        }
        Scenario::PollsThenPartial { mib } => {
            let poll = requests::fetch("demo", 0, 0, i32::MAX, i32::MAX);
            for _ in 0..4 {
                client.send(4, &poll).await?;
            }
            let mut partial = (100i32 << 20).to_be_bytes().to_vec();
            partial.resize(4 + (mib << 20), 0x55);
            client.send_raw(&partial).await
        }
        // Sent by `run`, which appends a segment before each client.
        Scenario::RetentionReaders { .. } => Ok(()),
    };
    match sent {
        Err(e)
            if e.kind() != io::ErrorKind::BrokenPipe
                && e.kind() != io::ErrorKind::ConnectionReset =>
        {
            Err(e)
        }
        _ => Ok(()),
    }
}

/// Whether the broker has closed `client`'s connection (reading what it sent meanwhile,
/// for at most 20 ms of silence).
async fn closed(client: &mut WireClient) -> bool {
    let mut sink = vec![0u8; 64 * 1024];
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        match tokio::time::timeout(Duration::from_millis(20), client.read_some(&mut sink)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
    false
}
