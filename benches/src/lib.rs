//! `purgatory-perf`, the load tool for this repository's timer (`timer-core`) and
//! purgatory (`purgatory`); the implementations they are measured against; and the
//! measurement code the tool and the criterion benches share.
//!
//! # Workloads
//! A workload fixes the work to do, its inputs and the figures reported, so that
//! implementations measured in the same invocation can be compared as ratios.
//! - **W1, timer churn**: a million tasks go into a timer whose clock stands still, with
//!   delays drawn evenly between 1 ms and 30 s; nine in ten are then cancelled through
//!   their handles, in shuffled order, and a second million is added on top of the
//!   survivors. Only adding and cancelling is timed; resident memory is read between the
//!   phases, so the second wave shows whether freed room is used again. W1-mt
//!   (`--threads`) shares one timer between threads that split the same work.
//! - **W2, timer expiry**: 200,000 tasks due at instants drawn evenly over the first two
//!   seconds are added as fast as possible, then fired on the real clock by the
//!   implementation's own thread. It reports how late they fire (and whether any fires
//!   early, which is a bug) and the CPU time it takes.
//! - **W3, purgatory load**: the load test that Kafka uses for its own purgatory
//!   (`TestPurgatoryPerformance`). Requests arrive at random instants (a Poisson process)
//!   at a target rate; each waits on a few random keys with a timeout. A completer
//!   completes a request after a latency drawn from a log-normal distribution, unless
//!   the timeout comes first and the request expires. It reports the rate actually held,
//!   CPU time per request, peak memory and how late the expiries are. In W3-events
//!   (`--events`) requests complete through `check_and_complete` on a key rather than
//!   being forced; W3-max (`--find-max`) searches for the highest rate held on time
//!   (actual rate >= 95 % of the target and expiry lateness p99 within a bound, 10 ms by
//!   default) and the highest held plainly (the actual rate alone), each rate decided by
//!   a majority of up to `--attempts` attempts (default 3).
//!
//! # Layout
//! - [`workloads`]: the [`workloads::Workload`] trait, and one module per workload with
//!   its parameters, its implementations (a `clap::ValueEnum`), its run and its result.
//! - [`ours`]: thin adapters that put `timer_core::Timer` and `purgatory::Purgatory`
//!   behind the same workload traits as the peers.
//! - [`peers`]: the implementations ours is compared with, each written as well as its
//!   design allows (one file each).
//! - [`harness`]: what every measurement stands on: one process per measurement, the
//!   process's CPU and memory counters, fixed-seed input tables, a latency histogram, a
//!   machine-stall probe, the progress line and the global allocator.
//! - [`report`]: medians and spreads of repeated runs, the table and the JSON summary.
//! - [`cli`]: the binary's command line, and the one path every workload takes through
//!   it: pick the implementations, measure, summarise, print.
//!
//! # Invariants
//! - Every measurement of the load tool runs in a fresh child process, so CPU time and
//!   peak resident memory belong to one implementation and one run.
//! - Every random input comes from a fixed seed: two runs of one workload see the same
//!   delays, arrivals, latencies and keys.
//! - The timed loops are generic over the implementation and monomorphised: choosing an
//!   implementation is one `match` before the run, never a dynamic call inside it.

pub mod cli;
pub mod harness;
pub mod ours;
pub mod peers;
pub mod report;
pub mod workloads;
