//! InitProducerId: hands idempotent producers their id (current clients enable idempotence
//! by default). Transactions are not supported: a transactional id is refused.
//!
//! Every request gets a new, unguessable id at epoch 0 (`producer_ids.rs`), also one naming
//! its current id and epoch to bump it (v3+): Kafka's coordinator does the same for a
//! producer without a transactional id, and keeping a named id would let a client that
//! names another's id share it. An address past its rate of ids (`producer_id_quota.rs`),
//! or any address while the table of ids is full of ids that produced recently
//! (`producer_ids.rs`; the rate's token is spent then too), is answered
//! THROTTLING_QUOTA_EXCEEDED, a retriable error, with the time until it may
//! have one as the throttle time (as Kafka's quotas answer); nothing is handed out then.

use std::net::IpAddr;
use std::time::Instant;

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use super::BrokerState;

/// Answers an InitProducerId request from `peer`.
pub fn handle(
    state: &BrokerState,
    request: &InitProducerIdRequest,
    peer: IpAddr,
) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    let refuse = |mut response: InitProducerIdResponse, error: ResponseError| {
        response.error_code = error.code();
        response.producer_id = ProducerId(-1);
        response.producer_epoch = -1;
        response
    };
    if request.transactional_id.is_some() {
        return refuse(response, ResponseError::TransactionalIdAuthorizationFailed);
    }
    let now = Instant::now();
    let handed = state
        .producer_id_quota
        .take(peer, now)
        .and_then(|()| state.producer_ids.hand_out(peer, now));
    match handed {
        Ok(id) => {
            response.producer_id = ProducerId(id);
            response.producer_epoch = 0;
            response
        }
        Err(wait) => {
            // At least a millisecond: 0 would tell the client it was not throttled.
            response.throttle_time_ms =
                i32::try_from(wait.as_millis().max(1)).unwrap_or(i32::MAX);
            refuse(response, ResponseError::ThrottlingQuotaExceeded)
        }
    }
}
