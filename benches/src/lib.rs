//! Load tool, peer implementations and shared measurement code for the benchmark
//! workloads of `/work/shared/spec/workloads.md` (W1 timer churn, W2 timer expiry, W3
//! purgatory load).
//!
//! # Layout
//! - [`peers`]: the implementations ours is compared with, each written as well as its
//!   design allows (one file each).
//! - [`ours`]: thin adapters that put `timer_core::Timer` and `purgatory::Purgatory`
//!   behind the same workload traits as the peers.
//! - [`w1`], [`w2`], [`w3`]: one workload each: parameters, the run, and its result.
//! - [`sampling`], [`histogram`], [`summary`], [`process`], [`stall_probe`]: pre-sampled
//!   random tables, an atomic latency histogram, medians and percentiles, the process's
//!   own CPU and memory counters, and a probe for machine stalls.
//! - [`cli`], [`child`], [`report`], [`progress`], [`allocator`]: the `purgatory-perf`
//!   binary's argument parsing, the one-process-per-measurement protocol, the tables it
//!   prints, its progress line and its global allocator.
//!
//! # Invariants
//! - Every measurement of the load tool runs in a fresh child process, so CPU time and
//!   peak resident memory belong to one implementation and one run.
//! - Every random input comes from a fixed seed: two runs of one workload see the same
//!   delays, arrivals, latencies and keys.

pub mod allocator;
pub mod child;
pub mod cli;
pub mod histogram;
pub mod ours;
pub mod peers;
pub mod process;
pub mod progress;
pub mod report;
pub mod sampling;
pub mod stall_probe;
pub mod summary;
pub mod w1;
pub mod w2;
pub mod w3;
