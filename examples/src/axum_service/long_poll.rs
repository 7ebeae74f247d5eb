//! `GET /poll/{topic}?after=N&wait_ms=M`: a long poll, answered as soon as the topic's
//! end offset passes `N`, with no operation type of its own:
//! `Purgatory::<String, LongPoll>::wait_until` parks a condition and a timeout.
//!
//! | answer | when |
//! |---|---|
//! | 200, the end offset | it passed `N` (at once if it already had) |
//! | 204 | `wait_ms` passed first |
//! | 503 | the service shut down first |
//! | 400 | a new topic past the cap |
//!
//! # Invariants
//! - Every produce to the topic calls `check_and_complete` on its key after the append,
//!   so the condition is tried again whenever the offset it reads has moved.
//! - A poll is counted exactly once by the poll purgatory: `completed` (200), `expired`
//!   (204), `expired_at_shutdown` (503, parked before the shutdown) or `cancelled` (its
//!   client left: hyper drops this handler, which drops the `Wait`). A poll that comes
//!   after the shutdown is answered 503 at once and counted in `refused`.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use purgatory::Completion;
use serde::Deserialize;

use super::Service;

/// The poll's query.
#[derive(Debug, Deserialize)]
pub struct PollQuery {
    /// Answer once the end offset is above this.
    #[serde(default)]
    pub after: u64,
    /// The longest wait, in milliseconds (capped by the service's `max_wait`).
    #[serde(default = "default_wait_ms")]
    pub wait_ms: u64,
}

/// A long poll's usual wait.
fn default_wait_ms() -> u64 {
    30_000
}

/// The handler.
pub async fn long_poll(
    State(service): State<Service>,
    Path(topic): Path<String>,
    Query(query): Query<PollQuery>,
) -> Response {
    let Some(log) = service.topics().get_or_make(&topic) else {
        return (StatusCode::BAD_REQUEST, "too many topics").into_response();
    };
    let seen = Arc::clone(&log);
    let after = query.after;
    // Parked before `wait_until` returns; dropped with this future if the client leaves.
    let wait = service
        .polls()
        .wait_until([topic], service.wait_for(query.wait_ms), move || {
            seen.end() > after
        });
    match wait.await {
        Ok(Completion::Ready | Completion::Forced) => {
            (StatusCode::OK, format!("{}\n", log.end())).into_response()
        }
        Ok(Completion::Expired) => StatusCode::NO_CONTENT.into_response(),
        Ok(Completion::Shutdown) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        // Never for a topic key: no keys, a panicking key, or a poll taken back.
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}
