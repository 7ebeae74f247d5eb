//! Fetch: a long poll through the purgatory. Answered at once when `min_bytes` of committed
//! data are already there (or on an error, or when `max_wait_ms` is 0); otherwise a
//! [`DelayedFetch`](crate::delayed_fetch::DelayedFetch) waits until enough is committed or
//! `max_wait_ms` passes, and the answer carries what is committed by then.
//!
//! Consumers see only batches below the high watermark. Fetch sessions (v7+) are never
//! created: every answer has session id 0, so clients send full fetches, and an incremental
//! fetch naming a session gets FETCH_SESSION_ID_NOT_FOUND.
//!
//! Invariants (what keeps an answer proportional to the data, not to the request):
//! - Each partition is answered once, however often the request names it, as Kafka does
//!   (its request map keeps a partition at its first place, with its last mention's offset
//!   and byte limit). The operation parked in the purgatory waits on the distinct
//!   partitions only, so its `try_complete` costs one check per distinct partition.
//! - The records of one answer stay within the client's `max_bytes` capped by the broker's
//!   `fetch_max_bytes`, except that the first batch found is always sent (KIP-74), and each
//!   partition within its `partition_max_bytes`.
//! - The decoded request is dropped before the wait: a parked fetch holds one entry per
//!   distinct partition, and none of the request's bytes. Its strings are slices of the
//!   request frame (`kafka-protocol` decodes them so), and one kept slice would keep the
//!   whole frame (issue #29, finding 1: 99 MiB of padding behind a name); only a request
//!   naming nothing but this broker's topic can wait, so each entry names the topic with
//!   the broker's own copy of its name.
//! - What a parked fetch keeps is held in its connection's account (`request_budget.rs`)
//!   until it is answered: [`PARKED_BYTES_PER_PARTITION`] per distinct partition (its
//!   entry here, its wait, what the wait has credited and its watcher entry; 136 bytes on
//!   64-bit targets). A fetch whose state the account refuses (the connection's share, or
//!   the shared budget spent) is answered at once with what is there, as if its
//!   `max_wait_ms` were 0, with that wait as its throttle time, so a consumer backs off
//!   rather than polling again at once (KIP-219; clients before Fetch v8 ignore it). Its
//!   answer's copy is charged as any answer's: with the shared budget spent it may be
//!   refused too, which closes the connection (`request_budget.rs`). The parked state
//!   draws on the connection's own 64 KiB first, as every byte it holds does. (Issue #38,
//!   finding 4: 300 polls over 9,999 partitions held 382 MiB outside every bound.) Kafka
//!   keeps a parked fetch's per-partition status outside
//!   `queued.max.request.bytes` too; its bound is the request size and the connections.
//! - A fetch waits at most `fetch_max_wait` (`--fetch-max-wait-ms`), whatever its
//!   `max_wait_ms` says: a waiting request is never idle, so without the cap a client that
//!   can no longer be watched would hold its connection for as long as it asked.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::request_budget::ConnectionBudget;
use super::topic_ids::topic_ids;
use super::BrokerState;
use crate::delayed_fetch::BytesWait;
use crate::partition::{Partition, PartitionKey};

/// A partition of the request, named once, checked.
struct Wanted {
    topic: TopicName,
    /// The topic's id in this request (`topic_ids.rs`): compared instead of the name.
    topic_id: u32,
    partition_index: i32,
    fetch_offset: i64,
    max_bytes: usize,
    found: Result<(PartitionKey, Arc<Partition>, u64), ResponseError>,
}

/// What a parked fetch keeps per distinct partition, held in its connection's account
/// while it waits: its entry here (`Wanted`), its [`BytesWait`] and what that wait has
/// credited (`delayed_fetch.rs`), and a watcher entry in the purgatory (counted at 16
/// bytes: an 8-byte reference in the key's list, and the list's share of growth).
pub const PARKED_BYTES_PER_PARTITION: usize = std::mem::size_of::<Wanted>()
    + std::mem::size_of::<BytesWait>()
    + std::mem::size_of::<u64>()
    + 16;

/// Answers a fetch request, waiting in the purgatory when it must, its state held in
/// `account` (its connection's) while it waits.
pub async fn handle(
    state: &BrokerState,
    request: FetchRequest,
    version: i16,
    account: &ConnectionBudget,
) -> Fetched {
    if version >= 7 && request.session_id != 0 {
        let mut response = FetchResponse::default();
        response.error_code = ResponseError::FetchSessionIdNotFound.code();
        return Fetched {
            response,
            records: Vec::new(),
        };
    }
    let budget = (request.max_bytes.max(0) as usize).min(state.config.fetch_max_bytes);
    let (min_bytes, max_wait_ms) = (request.min_bytes.max(0) as u64, request.max_wait_ms);
    let own_name = TopicName(StrBytes::from_string(state.config.topic.clone()));
    let wanted: Vec<Wanted> = distinct_partitions(request)
        .into_iter()
        .map(|(topic, topic_id, partition_index, fetch_offset, max_bytes)| {
            let found = locate(state, &topic.0, partition_index, fetch_offset);
            // A known name is the broker's topic: keep the broker's copy, not the frame's.
            let topic = if *topic.0 == *own_name.0 {
                own_name.clone()
            } else {
                topic
            };
            Wanted {
                found,
                topic,
                topic_id,
                partition_index,
                fetch_offset,
                max_bytes: max_bytes.min(budget),
            }
        })
        .collect();

    let waits: Vec<BytesWait> = wanted
        .iter()
        .filter_map(|w| {
            let (key, partition, start_position) = w.found.as_ref().ok()?;
            Some(BytesWait {
                key: *key,
                partition: partition.clone(),
                start_position: *start_position,
                max_bytes: w.max_bytes as u64,
            })
        })
        .collect();
    let any_error = wanted.iter().any(|w| w.found.is_err());
    let available: u64 = waits.iter().map(BytesWait::available).sum();
    // Set when the account cannot hold the wait: the answer asks the client to wait
    // instead.
    let mut throttle_ms = 0;
    if !any_error && !waits.is_empty() && max_wait_ms > 0 && available < min_bytes {
        // The client's wait, capped by the broker's: a poll asking for 2^31-1 ms (24.8
        // days) is answered after `fetch_max_wait` at most.
        let max_wait = Duration::from_millis(max_wait_ms as u64).min(state.config.fetch_max_wait);
        // Held until the answer is made; refused, the fetch is answered now.
        let parked_state = wanted.len().saturating_mul(PARKED_BYTES_PER_PARTITION);
        match account.charge(parked_state) {
            Ok(_held) => {
                // Whatever ends the wait (bytes, max_wait, shutdown), the answer is what
                // is there now.
                let _ = state
                    .leader
                    .wait_for_bytes(max_wait, min_bytes, waits)
                    .await;
            }
            // A consumer polls again as soon as it has its answer: the wait it asked for,
            // as a throttle time (KIP-219: clients from Fetch v8 wait it out before their
            // next request), keeps the poll from becoming a busy loop.
            Err(_) => throttle_ms = max_wait.as_millis() as i32,
        }
    }
    let mut fetched = response(wanted, budget, version);
    fetched.response.throttle_time_ms = throttle_ms;
    fetched
}

/// How long a client whose fetch answer the budget could not hold is asked to wait before
/// it fetches again (`without_records`).
pub const BUDGET_THROTTLE: Duration = Duration::from_millis(100);

/// `response` with every partition's records left out and [`BUDGET_THROTTLE`] as its
/// throttle time at least: the answer to a fetch whose records the request budget cannot
/// hold now. The consumer fetches the same offsets again after the throttle time (KIP-219;
/// a client before Fetch v8 at once).
pub fn without_records(mut response: FetchResponse) -> FetchResponse {
    for partition in response
        .responses
        .iter_mut()
        .flat_map(|topic| topic.partitions.iter_mut())
    {
        if partition.records.as_ref().is_some_and(|r| !r.is_empty()) {
            partition.records = Some(bytes::Bytes::new());
        }
    }
    response.throttle_time_ms = response
        .throttle_time_ms
        .max(BUDGET_THROTTLE.as_millis() as i32);
    response
}

/// A fetch's answer, and what each of its non-empty records keeps alive (the read's
/// `keeps`, `partition.rs`), for the connection to count while the answer is unwritten.
pub struct Fetched {
    /// The answer.
    pub response: FetchResponse,
    /// Each non-empty `records` of the answer, with what it keeps alive.
    pub records: Vec<(bytes::Bytes, usize)>,
}

/// Whether the answer may echo a name of the request other than the broker's topic (then it
/// is answered at once, an unknown topic being an error, and may share the request's
/// bytes).
pub fn echoes_unknown_names(state: &BrokerState, request: &FetchRequest) -> bool {
    request
        .topics
        .iter()
        .any(|topic| *topic.topic.0 != *state.config.topic)
}

/// The request's partitions, each once: `(topic, its id, partition, fetch offset, max bytes)`
/// at the place of its first mention, with the values of its last.
fn distinct_partitions(request: FetchRequest) -> Vec<(TopicName, u32, i32, i64, usize)> {
    // Keyed by the name's id, not the name: each name hashed once (`topic_ids.rs`).
    let ids = topic_ids(request.topics.iter().map(|topic| &*topic.topic.0));
    let mut places: HashMap<(u32, i32), usize> = HashMap::new();
    let mut distinct = Vec::new();
    for (topic, id) in request.topics.into_iter().zip(ids) {
        for p in topic.partitions {
            let entry = (
                topic.topic.clone(),
                id,
                p.partition,
                p.fetch_offset,
                p.partition_max_bytes.max(0) as usize,
            );
            match places.entry((id, p.partition)) {
                Entry::Occupied(place) => distinct[*place.get()] = entry,
                Entry::Vacant(place) => {
                    place.insert(distinct.len());
                    distinct.push(entry);
                }
            }
        }
    }
    distinct
}

/// Finds a fetched partition and the byte position of its fetch offset.
fn locate(
    state: &BrokerState,
    topic: &str,
    partition_index: i32,
    fetch_offset: i64,
) -> Result<(PartitionKey, Arc<Partition>, u64), ResponseError> {
    let (key, partition) = state
        .partition(topic, partition_index)
        .ok_or(ResponseError::UnknownTopicOrPartition)?;
    let position = partition
        .position_of(fetch_offset)
        .ok_or(ResponseError::OffsetOutOfRange)?;
    Ok((key, partition.clone(), position))
}

/// The answer: partitions of one topic named one after the other share a topic entry.
fn response(wanted: Vec<Wanted>, mut budget: usize, version: i16) -> Fetched {
    let mut records = Vec::new();
    let mut topics: Vec<FetchableTopicResponse> = Vec::new();
    // The id of the last topic entry's name.
    let mut last_id = None;
    let mut first = true;
    for w in wanted {
        let mut data = PartitionData::default();
        data.partition_index = w.partition_index;
        match &w.found {
            Err(error) => {
                data.error_code = error.code();
                data.high_watermark = -1;
                data.last_stable_offset = -1;
                data.records = Some(bytes::Bytes::new());
            }
            Ok((_, partition, _)) => {
                let read = partition.read_committed(w.fetch_offset, w.max_bytes.min(budget), first);
                if !read.records.is_empty() {
                    first = false;
                    budget = budget.saturating_sub(read.records.len());
                }
                data.high_watermark = read.high_watermark;
                data.last_stable_offset = read.high_watermark;
                if !read.records.is_empty() {
                    records.push((read.records.clone(), read.keeps));
                }
                data.records = Some(read.records);
                if version >= 5 {
                    data.log_start_offset = read.log_start_offset;
                }
            }
        }
        match topics.last_mut() {
            Some(last) if last_id == Some(w.topic_id) => last.partitions.push(data),
            _ => {
                last_id = Some(w.topic_id);
                let mut answer = FetchableTopicResponse::default();
                answer.topic = w.topic;
                answer.partitions.push(data);
                topics.push(answer);
            }
        }
    }
    let mut response = FetchResponse::default();
    response.responses = topics;
    Fetched { response, records }
}
