//! `POST /produce/{topic}?acks=K&timeout_ms=M`: appends a record, then waits until `K`
//! followers have copied it. The wait is a [`DelayedProduce`] of this module, parked in
//! the produce purgatory with `Purgatory::park_with`, which answers through its
//! `Reply`.
//!
//! | answer | when |
//! |---|---|
//! | 200, the record's offset | `K` followers copied it (at once for `acks=0`, which parks nothing) |
//! | 408 | `timeout_ms` passed first |
//! | 503 | the service shut down first (the record stays appended: not known to be copied) |
//! | 400 | `acks` above the number of followers, or a new topic past the cap |
//!
//! # Invariants
//! - The append wakes the topic's long polls (`check_and_complete` on the poll
//!   purgatory) before the produce is parked: a poll never waits for the acks.
//! - A produce with `acks >= 1` is counted exactly once by the produce purgatory:
//!   `completed` (200), `expired` (408), `expired_at_shutdown` (503, parked before the
//!   shutdown) or `cancelled` (its client left); a produce refused because the purgatory
//!   had shut down is answered 503 and counted in `refused`.
//! - The body is read before the produce is parked, then dropped: hyper (HTTP/1)
//!   notices a client that leaves only once it has read the whole request, so a
//!   produce parked with its body unread would wait out its timeout after the client
//!   left.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use purgatory::{Completion, DelayedOperation, Reply, WatchErrorKind};
use serde::Deserialize;

use super::topics::Topic;
use super::Service;

/// A produce waiting until `acks` followers copied the record at `offset`.
#[derive(Debug)]
pub struct DelayedProduce {
    topic: Arc<Topic>,
    offset: u64,
    acks: usize,
    timeout: Duration,
    reply: Reply<()>,
}

impl DelayedOperation for DelayedProduce {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn try_complete(&mut self) -> bool {
        self.topic.copies_of(self.offset) >= self.acks
    }

    fn on_complete(&mut self, how: Completion) {
        // Nobody waits any more if the client left: the send then just fails.
        self.reply.send(how, ());
    }
}

/// The produce's query.
#[derive(Debug, Deserialize)]
pub struct ProduceQuery {
    /// How many followers must copy the record (0: answered once appended).
    #[serde(default)]
    pub acks: usize,
    /// The longest wait for them, in milliseconds (capped by the service's `max_wait`).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

/// Kafka's default `request.timeout.ms`.
fn default_timeout_ms() -> u64 {
    30_000
}

/// The handler.
pub async fn produce(
    State(service): State<Service>,
    Path(topic): Path<String>,
    Query(query): Query<ProduceQuery>,
    _record: Bytes,
) -> Response {
    if query.acks > service.followers().count() {
        let why = format!(
            "acks={} but {} followers",
            query.acks,
            service.followers().count()
        );
        return (StatusCode::BAD_REQUEST, why).into_response();
    }
    let Some(log) = service.topics().get_or_make(&topic) else {
        return (StatusCode::BAD_REQUEST, "too many topics").into_response();
    };
    let offset = log.append();
    service.polls().check_and_complete(topic.as_str());
    service.followers().replicate(&log, offset + 1);
    if query.acks == 0 {
        return (StatusCode::OK, format!("{offset}\n")).into_response();
    }
    let parked = service
        .produces()
        .park_with([topic], |reply| DelayedProduce {
            topic: log,
            offset,
            acks: query.acks,
            timeout: service.wait_for(query.timeout_ms),
            reply,
        });
    let parked = match parked {
        Ok(parked) => parked,
        Err(refused) if refused.kind() == WatchErrorKind::Shutdown => {
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        Err(refused) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, refused.to_string()).into_response();
        }
    };
    // Dropped here if the client leaves (hyper drops this handler): the produce is then
    // cancelled, not left to wait out its timeout.
    match parked.await {
        Ok(answered) => match answered.how {
            Completion::Ready | Completion::Forced => {
                (StatusCode::OK, format!("{offset}\n")).into_response()
            }
            Completion::Expired => StatusCode::REQUEST_TIMEOUT.into_response(),
            Completion::Shutdown => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        },
        // on_complete always sends; only a panic in it would leave the reply unsent.
        Err(unanswered) => {
            (StatusCode::INTERNAL_SERVER_ERROR, unanswered.to_string()).into_response()
        }
    }
}
