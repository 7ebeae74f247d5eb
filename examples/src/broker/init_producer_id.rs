//! InitProducerId: hands idempotent producers their id (current clients enable idempotence
//! by default). Transactions are not supported: a transactional id is refused.

use std::sync::atomic::Ordering;

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use super::BrokerState;

/// Answers an InitProducerId request.
pub fn handle(state: &BrokerState, request: &InitProducerIdRequest) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    if request.transactional_id.is_some() {
        response.error_code = ResponseError::TransactionalIdAuthorizationFailed.code();
        response.producer_id = ProducerId(-1);
        response.producer_epoch = -1;
        return response;
    }
    if request.producer_id.0 >= 0 && request.producer_epoch >= 0 {
        // A producer bumping its epoch (v3+) keeps its id.
        response.producer_id = request.producer_id;
        response.producer_epoch = request.producer_epoch.saturating_add(1);
    } else {
        response.producer_id = ProducerId(state.next_producer_id.fetch_add(1, Ordering::Relaxed));
        response.producer_epoch = 0;
    }
    response
}
