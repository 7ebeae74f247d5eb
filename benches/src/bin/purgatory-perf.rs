//! `purgatory-perf`: the load tool for timer-core and purgatory (workloads W1-W3).
//! Run with `--help`; without arguments it runs a ~15 s W3 demo, ours vs naive.
//!
//! # Invariants
//! - The global allocator is mimalloc or the system allocator, chosen per measurement
//!   process (see `purgatory_benches::harness::allocator`): W3 uses mimalloc by default
//!   (with the system allocator the request generator itself saturates first), W1 and W2
//!   the system allocator (mimalloc's segment reservations would add tens of MiB to
//!   every resident-memory figure). `--allocator` overrides it. Every implementation of
//!   one invocation gets the same one.

#[global_allocator]
static ALLOCATOR: purgatory_benches::harness::allocator::SelectableAllocator =
    purgatory_benches::harness::allocator::SelectableAllocator;

fn main() -> std::process::ExitCode {
    purgatory_benches::cli::main()
}
