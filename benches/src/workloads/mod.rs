//! The workloads the load tool runs: W1 timer churn ([`w1`]), W2 timer expiry ([`w2`])
//! and W3 purgatory load ([`w3`]).

pub mod w1;
pub mod w2;
pub mod w3;
