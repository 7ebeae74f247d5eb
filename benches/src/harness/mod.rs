//! What every measurement stands on: one process per measurement ([`child`]), the
//! process's own counters ([`process`]), fixed-seed inputs ([`sampling`]), a latency
//! histogram ([`histogram`]), a machine-stall probe ([`stall_probe`]), the progress line
//! ([`progress`]) and the global allocator ([`allocator`]).
//!
//! # Invariants
//! - Nothing here knows a workload or an implementation: each part serves any of them.
//! - What runs during a timed phase (the histogram, the stall probe, the progress line)
//!   costs the measured process as little as it can, and says so in its own doc.

pub mod allocator;
pub mod child;
pub mod histogram;
pub mod process;
pub mod progress;
pub mod sampling;
pub mod stall_probe;
