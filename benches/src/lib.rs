//! Load tool, peer implementations and shared measurement code for the benchmark
//! workloads of `/work/shared/spec/workloads.md` (W1 timer churn, W2 timer expiry, W3
//! purgatory load).
//!
//! # Layout
//! - [`peers`]: the implementations ours is compared with, each written as well as its
//!   design allows (one file each).
//! - [`ours`]: thin adapters that put `timer_core::Timer` and `purgatory::Purgatory`
//!   behind the same workload traits as the peers.
//! - [`workloads`]: one workload each ([`workloads::w1`], [`workloads::w2`],
//!   [`workloads::w3`]): parameters, the run, and its result.
//! - [`harness`]: pre-sampled random tables, an atomic latency histogram, the process's
//!   own CPU and memory counters, a probe for machine stalls, the one-process-per-
//!   measurement protocol, the progress line and the global allocator.
//! - [`report`]: medians and percentiles, and the tables the tool prints.
//! - [`cli`]: the `purgatory-perf` binary's argument parsing.
//!
//! # Invariants
//! - Every measurement of the load tool runs in a fresh child process, so CPU time and
//!   peak resident memory belong to one implementation and one run.
//! - Every random input comes from a fixed seed: two runs of one workload see the same
//!   delays, arrivals, latencies and keys.

pub mod cli;
pub mod harness;
pub mod ours;
pub mod peers;
pub mod report;
pub mod workloads;
