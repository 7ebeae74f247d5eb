//! One client connection: frames in, requests decoded and handled one at a time, answers
//! out in the same order.
//!
//! Invariants:
//! - Requests of one connection are handled strictly in order; a long poll holds back the
//!   requests behind it on its connection (as in Kafka), never other connections.
//! - A waiting request costs a parked task, not a thread. While it waits the socket is
//!   still read (`client_socket.rs`): a client that leaves (end of stream or reset) ends the
//!   connection at once, and dropping the request's future cancels its operation in the
//!   purgatory (an appended produce stays appended; only its answer is dropped).
//! - Time limits: the next request must start within `connections_max_idle` of the last
//!   answer, a started request must arrive whole within `frame_read_timeout` of its first
//!   byte (counted from when that byte arrived, even while it waited behind an earlier
//!   request: `client_socket.rs`), and an answer
//!   must be written whole within `write_timeout` (a client reading a byte a second makes
//!   progress, but holds its answer for ever); a waiting request is never idle, and waits
//!   `fetch_max_wait` at most (`fetch.rs`). Each closes the connection with a log line.
//! - Memory: every request byte a connection holds counts against the broker's request
//!   budget and the connection's share of it (`request_budget.rs`) from when it is read
//!   until the last slice of its frame is freed: partial frames, bytes pipelined behind a
//!   waiting request, the request while it is handled or parked, and answers that share
//!   its bytes (echoed topic names) until written. What an answer keeps alive is counted
//!   too until it is written: the bytes it copies, and the log's bytes it shares at what
//!   their read keeps alive (their segment, or themselves), since retention may drop their
//!   segment while the answer waits (`reply.rs`; issue #38, finding 5). A read beyond the
//!   budget closes the connection; so does an answer, except a fetch's, which the budget
//!   cannot hold now: it is sent without its records, with a throttle time
//!   (`fetch::without_records`). Answers share the log's bytes and the request's echoed
//!   names rather than copying them (`reply.rs`); nothing kept across a wait is a slice of
//!   the frame.
//! - A connection waiting for its next request is idle (`admission.rs`): at a connection
//!   cap (the broker's, or its address's) a newcomer may evict it, which closes it; once
//!   its next request has started it is evicted only once that request is not whole a
//!   second after it began, trickling or not (`stalled_read.rs`), or while it is a Fetch that has waited a second or more
//!   (a long poll is not a claim on a place: evicted, it is cancelled as when the client
//!   leaves, and the consumer polls again on a new connection); never any other request
//!   once it is whole. An evicted connection no longer counts against the cap, so it
//!   closes at once, its descriptor with it, even in the middle of writing a long poll's
//!   answer (issue #38, finding 2: a client that stops reading held it up to
//!   `write_timeout`); any other answer is written while its connection is busy, never
//!   evictable.
//! - Bad input ends only its own connection: a frame size outside the limit, a header that
//!   does not decode, an unknown API, an unsupported version (except ApiVersions, answered
//!   with UNSUPPORTED_VERSION as KIP-511 asks), a body that does not decode, or a request
//!   naming more entries than `max_partitions_per_request` closes it: topics and
//!   partitions (Metadata: topics), a Produce partition's record batches after its first,
//!   and tagged fields, counted in the raw header and body before decoding, header and
//!   body against one cap, so that what a request decodes into is bounded
//!   (`request_entries.rs`).
//!   Nothing a client sends can make the broker panic.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, FetchRequest, InitProducerIdRequest, ListOffsetsRequest,
    MetadataRequest, ProduceRequest, RequestHeader,
};
use kafka_protocol::protocol::Decodable;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::timeout;

use super::admission::Slot;
use super::api_versions;
use super::client_socket::ClientReader;
use super::frame::FrameError;
use super::reply::{respond, respond_sharing, Answer, Holder, Reply};
use super::request_budget::{ConnectionBudget, OverBudget};
use super::stalled_read::read_frame_watching_stalls;
use super::request_entries::{self, Kind};
use super::{fetch, init_producer_id, list_offsets, metadata, produce, BrokerState};
use crate::record_batch::framed_batches;

/// Serves one connection until the client leaves, it misbehaves, it stays idle or half-way
/// through a request too long, or the broker stops.
pub async fn serve(
    state: Arc<BrokerState>,
    stream: TcpStream,
    mut stop: watch::Receiver<bool>,
    slot: Slot,
) {
    let peer_addr = stream.peer_addr().ok();
    let peer = peer_addr.map_or_else(|| "?".to_string(), |a| a.to_string());
    let peer_ip = peer_addr.map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    let _ = stream.set_nodelay(true);
    let (reader, mut writer) = stream.into_split();
    let config = &state.config;
    let budget = ConnectionBudget::new(Arc::clone(&state.request_budget), config.max_frame_bytes);
    let mut reader = ClientReader::new(reader, budget);
    // Whether a request of this connection was answered yet (told to the table once:
    // an established client's connections are evicted after strangers').
    let mut served = false;
    loop {
        // Between requests: the next one must start within the idle timeout, and then
        // arrive whole within the frame read timeout.
        let next = async {
            slot.idle();
            let started = reader.wait_for_data();
            let started = async {
                let started = started.await.map_err(FrameError::Io)?;
                Ok::<_, FrameError>(started.then_some(()))
            };
            let idle = config.connections_max_idle;
            within(idle, "no request for", "--connections-max-idle-ms", started).await?;
            if !slot.busy() {
                return Err(Some(EVICTED.to_string()));
            }
            // A frame whose first bytes waited behind an earlier request has had that
            // much of its time already.
            let waited = reader
                .oldest_arrival()
                .map_or(Duration::ZERO, |arrived| arrived.elapsed());
            let whole = config.frame_read_timeout.saturating_sub(waited);
            let frame = read_frame_watching_stalls(&mut reader, config.max_frame_bytes, &slot);
            within(
                whole,
                "request not whole after",
                "--frame-read-timeout-ms",
                frame,
            )
            .await
        };
        let frame = tokio::select! {
            frame = next => frame,
            _ = slot.evicted() => Err(Some(EVICTED.to_string())),
            _ = stop.changed() => return,
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(reason) => {
                if let Some(reason) = reason {
                    state.log(&format!("closing {peer}: {reason}"));
                    discard_unsent(&writer);
                }
                return;
            }
        };
        // While the request is handled (it may wait in a purgatory), watch the socket: a
        // client that leaves drops the request, whose pending answer cancels its operation.
        // The frame stays counted until its last slice is dropped: after the handler, or
        // after the answer that echoes parts of it is written.
        let frame_bytes = frame.len() + 4;
        let long_poll = is_fetch(&frame);
        let frame = reader.budget().charged(frame, frame_bytes);
        let handling = handle(&state, frame, peer_ip, reader.budget().clone());
        tokio::pin!(handling);
        // A Fetch still waiting after `LONG_POLL_EVICTABLE` holds no claim on its place:
        // at the cap it may be evicted like an idle connection (it is then closed and its
        // fetch cancelled, as when a client leaves; the consumer reconnects and polls
        // again), so long polls re-sent from many addresses cannot keep newcomers out.
        let evictable_poll = async {
            if long_poll {
                tokio::time::sleep(LONG_POLL_EVICTABLE).await;
                slot.long_poll();
            }
            std::future::pending::<()>().await
        };
        let reply = tokio::select! {
            biased;
            reply = &mut handling => reply,
            left = reader.until_closed(config.frame_read_timeout) => {
                state.log(&format!("closing {peer}: {left} while its request waited"));
                discard_unsent(&writer);
                return;
            }
            _ = slot.evicted() => {
                state.log(&format!("closing {peer}: {EVICTED_POLL}"));
                discard_unsent(&writer);
                return;
            }
            _ = evictable_poll => unreachable!("never resolves"),
            _ = stop.changed() => return,
        };
        match reply {
            Reply::Send(mut answer) => {
                // What the answer keeps alive (its copies, the log's segments it shares)
                // is held until it is written (a fetch's handler charged it already).
                let charged = answer.take_charge().map_or_else(
                    || reader.budget().charge(answer.held()),
                    Ok,
                );
                let _held = match charged {
                    Ok(charge) => charge,
                    Err(over) => {
                        state.log(&format!(
                            "closing {peer}: answer of {} bytes keeping {} bytes alive: {over}",
                            answer.len(),
                            answer.held()
                        ));
                        discard_unsent(&writer);
                        return;
                    }
                };
                let limit = config.write_timeout;
                // A long poll's connection stays evictable while its answer is written
                // (issue #38, finding 2): evicted, it no longer counts against the cap,
                // so its descriptor must go now, not when a client that does not read
                // lets the write end (up to `write_timeout` later).
                let written = tokio::select! {
                    biased;
                    written = timeout(limit, write_answer(&mut writer, &answer)) => written,
                    _ = slot.evicted() => {
                        state.log(&format!("closing {peer}: {EVICTED_WRITING}"));
                        discard_unsent(&writer);
                        return;
                    }
                };
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return,
                    Err(_) => {
                        state.log(&format!(
                            "closing {peer}: answer of {} bytes not written whole after {} ms \
                             (--write-timeout-ms)",
                            answer.len(),
                            limit.as_millis()
                        ));
                        discard_unsent(&writer);
                        return;
                    }
                }
            }
            Reply::Nothing => {}
            Reply::Close(reason) => {
                state.log(&format!("closing {peer}: {reason}"));
                discard_unsent(&writer);
                return;
            }
        }
        if !served {
            served = true;
            slot.served();
        }
    }
}

/// Before the broker closes a connection on its own initiative: what its client left
/// unread is dropped, with a reset, rather than kept by the kernel, in an orphan socket
/// outside `--max-connections`, until the client goes (the review of issue #38, finding 2:
/// 20 such orphans kept their send buffers for the 240 s it watched). Not when the client
/// left, nor at shutdown.
fn discard_unsent(writer: &tokio::net::tcp::OwnedWriteHalf) {
    let _ = writer.as_ref().set_zero_linger();
}

/// Why an idle connection was closed to make room (`admission.rs`).
const EVICTED: &str =
    "idle, closed to make room for a new connection (--max-connections, --max-connections-per-ip)";

/// Why a connection whose long poll was waiting was closed to make room.
const EVICTED_POLL: &str = "its fetch waiting, closed to make room for a new connection \
     (--max-connections, --max-connections-per-ip)";

/// Why a connection whose fetch answer was being written was closed to make room.
const EVICTED_WRITING: &str = "its fetch answer being written, closed to make room for a new \
     connection (--max-connections, --max-connections-per-ip)";

/// How long a Fetch waits before its connection may be evicted at a connection cap: a
/// fetch answered at once (data there) never touches the connection table for it.
const LONG_POLL_EVICTABLE: Duration = Duration::from_secs(1);

/// Whether `frame` (its header first) is a Fetch request.
fn is_fetch(frame: &Bytes) -> bool {
    frame
        .get(..2)
        .is_some_and(|key| i16::from_be_bytes([key[0], key[1]]) == ApiKey::Fetch as i16)
}

/// Writes the parts of `answer` back to back.
async fn write_answer(
    writer: &mut tokio::net::tcp::OwnedWriteHalf,
    answer: &Answer,
) -> std::io::Result<()> {
    for part in answer.parts() {
        writer.write_all(part).await?;
    }
    Ok(())
}

/// Runs one step of reading a request within `limit`. `Err(None)`: the client closed the
/// connection; `Err(Some(reason))`: the step failed or took too long (the reason names the
/// flag that set the limit).
async fn within<T, E: std::fmt::Display>(
    limit: Duration,
    timed_out: &str,
    flag: &str,
    step: impl Future<Output = Result<Option<T>, E>>,
) -> Result<T, Option<String>> {
    match timeout(limit, step).await {
        Ok(Ok(Some(value))) => Ok(value),
        Ok(Ok(None)) => Err(None),
        Ok(Err(e)) => Err(Some(e.to_string())),
        Err(_) => Err(Some(format!(
            "{timed_out} {} ms ({flag})",
            limit.as_millis()
        ))),
    }
}

/// Decodes and answers one request frame of a client at `peer`, whose account (`budget`)
/// holds what a parked request keeps while it waits.
pub async fn handle(
    state: &BrokerState,
    mut frame: Bytes,
    peer: IpAddr,
    budget: ConnectionBudget,
) -> Reply {
    if frame.len() < 4 {
        return Reply::Close(format!("request of {} bytes has no header", frame.len()));
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let Ok(api) = ApiKey::try_from(raw_key) else {
        return Reply::Close(format!("unknown API key {raw_key}"));
    };
    if api == ApiKey::ApiVersions && !api_versions::is_supported(api, version) {
        // KIP-511: a too-new ApiVersions is answered in v0 with the supported list, whatever
        // its header looks like; its correlation id always follows the key and version.
        let Some(id) = frame.get(4..8) else {
            return Reply::Close("ApiVersions request without a correlation id".into());
        };
        let id = i32::from_be_bytes([id[0], id[1], id[2], id[3]]);
        return respond(api, 0, id, &api_versions::response(true));
    }
    let cap = state.config.max_partitions_per_request;
    let header_version = api.request_header_version(version);
    // Each tagged field of the header decodes into an entry of a map: counted first, and
    // against the same cap as the body's entries.
    let header_entries = match request_entries::count_header(&frame, header_version, cap) {
        Ok(fields) if fields > cap => {
            return Reply::Close(format!(
                "request header has more than --max-partitions-per-request {cap} tagged fields"
            ))
        }
        Ok(fields) => fields,
        Err(e) => return Reply::Close(format!("bad {api:?} request header: {e:?}")),
    };
    let header = match RequestHeader::decode(&mut frame, header_version) {
        Ok(header) => header,
        Err(e) => return Reply::Close(format!("bad {api:?} request header: {e}")),
    };
    let id = header.correlation_id;
    // Its client id is a slice of the frame: kept across a wait, it would keep the frame.
    drop(header);
    if !api_versions::is_supported(api, version) {
        return Reply::Close(format!("unsupported {api:?} version {version}"));
    }
    let cap = EntryCap {
        cap,
        header: header_entries,
    };
    let client = Client {
        peer,
        account: &budget,
    };
    dispatch(state, api, version, id, frame, client, cap).await
}

/// Who sent a request: its address, and its connection's account.
struct Client<'a> {
    peer: IpAddr,
    account: &'a ConnectionBudget,
}

async fn dispatch(
    state: &BrokerState,
    api: ApiKey,
    version: i16,
    id: i32,
    body: Bytes,
    client: Client<'_>,
    cap: EntryCap,
) -> Reply {
    let Client { peer, account } = client;
    match api {
        ApiKey::ApiVersions => match decode::<ApiVersionsRequest>(body, version, cap) {
            Ok(_) => respond(api, version, id, &api_versions::response(false)),
            Err(reason) => Reply::Close(reason),
        },
        ApiKey::Metadata => match decode::<MetadataRequest>(body.clone(), version, cap) {
            // The answer echoes the names, slices of the body: it shares them.
            Ok(request) => respond_sharing(
                api,
                version,
                id,
                &metadata::handle(state, &request, version),
                &[(body, Holder::Request)],
            ),
            Err(reason) => Reply::Close(reason),
        },
        ApiKey::InitProducerId => match decode::<InitProducerIdRequest>(body, version, cap) {
            Ok(request) => {
                let response = init_producer_id::handle(state, &request, peer);
                respond(api, version, id, &response)
            }
            Err(reason) => Reply::Close(reason),
        },
        // Answers that echo topic names share them with the body (issue #29, finding 3).
        ApiKey::ListOffsets => match decode::<ListOffsetsRequest>(body.clone(), version, cap) {
            Ok(request) => {
                let response = list_offsets::handle(state, &request, version);
                respond_sharing(api, version, id, &response, &[(body, Holder::Request)])
            }
            Err(reason) => Reply::Close(reason),
        },
        ApiKey::Produce => match decode::<ProduceRequest>(body.clone(), version, cap) {
            Ok(request) => match produce::handle(state, request, version, peer).await {
                Some(response) => {
                    respond_sharing(api, version, id, &response, &[(body, Holder::Request)])
                }
                None => Reply::Nothing,
            },
            Err(reason) => Reply::Close(reason),
        },
        ApiKey::Fetch => match decode::<FetchRequest>(body.clone(), version, cap) {
            Ok(request) => {
                // The body is dropped before a wait (finding 1: a parked fetch would pin it);
                // only an answer made at once may echo names of it.
                let body = fetch::echoes_unknown_names(state, &request).then_some(body);
                let fetched = fetch::handle(state, request, version, account).await;
                // The answer shares the names echoed from the body and the records, each
                // held at what its read said it keeps alive: its segment (which retention
                // may drop while the answer waits, issue #38, finding 5) or itself.
                let shared: Vec<(Bytes, Holder)> = body
                    .map(|body| (body, Holder::Request))
                    .into_iter()
                    .chain(
                        fetched
                            .records
                            .iter()
                            .map(|(records, keeps)| (records.clone(), Holder::Log { keeps: *keeps })),
                    )
                    .collect();
                let reply = respond_sharing(api, version, id, &fetched.response, &shared);
                let Reply::Send(answer) = reply else {
                    return reply;
                };
                match account.charge(answer.held()) {
                    Ok(charge) => Reply::Send(answer.holding(charge)),
                    // The budget is spent for now (other connections' requests and
                    // answers): the records are left out and the client asked to come back
                    // after a throttle time, rather than closed for a good fetch (the
                    // review of finding 5: four consumers fetching 55 MiB at once had one
                    // closed). An answer over the connection's own share never fits: its
                    // connection is closed as before.
                    Err(OverBudget::Shared { .. }) if !fetched.records.is_empty() => {
                        drop((answer, shared));
                        respond(api, version, id, &fetch::without_records(fetched.response))
                    }
                    Err(_) => Reply::Send(answer),
                }
            }
            Err(reason) => Reply::Close(reason),
        },
        other => Reply::Close(format!("{other:?} is not implemented")),
    }
}

/// The per-request entry cap (`--max-partitions-per-request`) and what the request's
/// header already took of it: header and body share one cap.
#[derive(Debug, Clone, Copy)]
struct EntryCap {
    cap: usize,
    /// Tagged fields of the header (at most `cap`).
    header: usize,
}

impl EntryCap {
    /// What the body may hold.
    fn left(self) -> usize {
        self.cap.saturating_sub(self.header)
    }
}

/// Decodes a request body that must be whole and, with its header, name at most
/// `cap.cap` entries.
fn decode<R: Decodable + Entries>(
    mut body: Bytes,
    version: i16,
    cap: EntryCap,
) -> Result<R, String> {
    let (header, left, cap) = (cap.header, cap.left(), cap.cap);
    let too_many = |named: usize| {
        format!(
            "request names {named} entries (topics, partitions and batches after a \
             partition's first; Metadata: topics) and its header {header} tagged fields, \
             more than --max-partitions-per-request {cap}"
        )
    };
    if R::announced(&body, version, left)?.is_some_and(|n| n > left) {
        return Err(format!(
            "request names more than --max-partitions-per-request {cap} entries (topics, \
             partitions, batches after a partition's first and tagged fields, its header's \
             {header} included; Metadata: topics), counted before decoding"
        ));
    }
    let request = R::decode(&mut body, version)
        .map_err(|e| format!("malformed request body (v{version}): {e}"))?;
    if body.has_remaining() {
        return Err(format!(
            "{} unread bytes after the request",
            body.remaining()
        ));
    }
    let named = request.entries();
    if named > left {
        return Err(too_many(named));
    }
    Ok(request)
}

/// What the per-request cap counts: topics and partitions named (Metadata: topics),
/// duplicates included, and a Produce partition's batches after its first; before
/// decoding, also tagged fields and a Fetch's forgotten topics (`request_entries.rs`).
trait Entries {
    /// Entries of the decoded request.
    fn entries(&self) -> usize;

    /// Entries the raw body holds, where they can be counted before decoding (so a request
    /// over the cap costs no decoding), or a number above `cap` once past it; `Err` for a
    /// body that does not hold its version's fields.
    fn announced(_body: &[u8], _version: i16, _cap: usize) -> Result<Option<usize>, String> {
        Ok(None)
    }
}

/// Counts a body's entries with `request_entries::count`.
fn walked(kind: Kind, body: &[u8], version: i16, cap: usize) -> Result<Option<usize>, String> {
    request_entries::count(kind, body, version, cap)
        .map(Some)
        .map_err(|e| format!("malformed {kind:?} request body (v{version}): {e:?}"))
}

impl Entries for ApiVersionsRequest {
    fn entries(&self) -> usize {
        0
    }

    fn announced(body: &[u8], version: i16, cap: usize) -> Result<Option<usize>, String> {
        walked(Kind::ApiVersions, body, version, cap)
    }
}

impl Entries for InitProducerIdRequest {
    fn entries(&self) -> usize {
        0
    }

    fn announced(body: &[u8], version: i16, cap: usize) -> Result<Option<usize>, String> {
        walked(Kind::InitProducerId, body, version, cap)
    }
}

impl Entries for MetadataRequest {
    fn entries(&self) -> usize {
        self.topics.as_ref().map_or(0, Vec::len)
    }

    fn announced(body: &[u8], version: i16, cap: usize) -> Result<Option<usize>, String> {
        walked(Kind::Metadata, body, version, cap)
    }
}

impl Entries for ProduceRequest {
    fn entries(&self) -> usize {
        let further_batches = |records: Option<&Bytes>| {
            records.map_or(0, |r| framed_batches(r).count().saturating_sub(1))
        };
        self.topic_data
            .iter()
            .map(|t| {
                let batches: usize = t
                    .partition_data
                    .iter()
                    .map(|p| further_batches(p.records.as_ref()))
                    .sum();
                1 + t.partition_data.len() + batches
            })
            .sum()
    }

    fn announced(body: &[u8], version: i16, cap: usize) -> Result<Option<usize>, String> {
        walked(Kind::Produce, body, version, cap)
    }
}

impl Entries for FetchRequest {
    fn entries(&self) -> usize {
        self.topics.iter().map(|t| 1 + t.partitions.len()).sum()
    }

    fn announced(body: &[u8], version: i16, cap: usize) -> Result<Option<usize>, String> {
        walked(Kind::Fetch, body, version, cap)
    }
}

impl Entries for ListOffsetsRequest {
    fn entries(&self) -> usize {
        self.topics.iter().map(|t| 1 + t.partitions.len()).sum()
    }

    fn announced(body: &[u8], version: i16, cap: usize) -> Result<Option<usize>, String> {
        walked(Kind::ListOffsets, body, version, cap)
    }
}
