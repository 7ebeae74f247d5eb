//! InitProducerId: hands idempotent producers their id (current clients enable idempotence
//! by default). Transactions are not supported: a transactional id is refused.
//!
//! Every request gets a new, unguessable id at epoch 0 (`producer_ids.rs`), also one naming
//! its current id and epoch to bump it (v3+): Kafka's coordinator does the same for a
//! producer without a transactional id, and keeping a named id would let a client that
//! names another's id share it.

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
    response.producer_id = ProducerId(state.producer_ids.hand_out());
    response.producer_epoch = 0;
    response
}
