//! Examples of the `purgatory` crate in a broker's request path.
//!
//! - [`demo_produce`] and [`demo_fetch`]: the two small examples (binaries
//!   `delayed_produce` and `delayed_fetch`), an acks=all produce and a long-poll fetch.
//! - [`broker`]: a small Kafka-protocol broker (binary `broker`) with in-memory partitions,
//!   simulated followers and both purgatories in its request path.
//! - [`axum_service`]: an axum service (binary `axum_service`) with a long poll, a produce
//!   waiting for acks and Prometheus metrics, whose graceful shutdown answers every
//!   parked request at once: the purgatory as a tokio HTTP service uses it.
//! - [`coordinator`]: a group coordinator's sessions (binary `coordinator`): each member's
//!   session a keyless operation whose deadline each heartbeat moves, joins parked at
//!   their group's barrier, loaded against the same coordinator on a tokio-util
//!   `DelayQueue`.
//! - [`load`]: the broker's load and measurement tool (binary `broker_load`), over
//!   [`wire_client`], a raw Kafka-protocol client also used by the tests.
//!
//! The building blocks they share: [`record_batch`] (produced batches, checked and stamped),
//! [`partition_log`] (over [`batch_index`]), [`replication`], [`producer_sequences`] and [`partition`] (one
//! partition's state), [`followers`] (simulated follower threads), [`delayed_produce`] and
//! [`delayed_fetch`] (the delayed operations) and [`leader`] (all of it wired to the
//! purgatories, whose parked operations are awaited through the purgatory's own
//! `Parked` future, cargo feature `tokio`).

pub mod check_rounds;

/// The modules a loom build leaves out: they all stand on tokio, which does not build under
/// `--cfg loom` outside its own tests. Under loom the crate is [`check_rounds`] and its
/// models alone (`check_rounds/loom_models.rs`).
macro_rules! not_under_loom {
    ($($module:item)*) => { $(#[cfg(not(loom))] $module)* };
}

not_under_loom! {
    pub mod axum_service;
    pub mod batch_index;
    pub mod broker;
    pub mod cli;
    pub mod coordinator;
    pub mod delayed_fetch;
    pub mod delayed_produce;
    pub mod demo_fetch;
    pub mod demo_produce;
    pub mod followers;
    pub mod huge_allocations;
    pub mod leader;
    pub mod load;
    pub mod partition;
    pub mod partition_log;
    pub mod producer_sequences;
    pub mod record_batch;
    pub mod replication;
    pub mod signal;
    pub mod wire_client;
}
