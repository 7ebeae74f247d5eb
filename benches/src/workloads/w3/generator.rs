//! The request generator: issues W3 requests on a Poisson schedule.
//!
//! # Design (the tool must not be the bottleneck)
//! - Arrival gaps, latencies and keys come from pre-sampled tables ([`crate::harness::sampling`]).
//! - Requests are issued in batches of up to [`BATCH`]: the requests that came due since
//!   the last clock read (its reading is every request's issue instant) go to the
//!   purgatory in one `watch_batch` call, and their completions to the completer in one
//!   hand-over.
//! - The generator sleeps only when it is ahead of the schedule, and then for at least
//!   `pace` (default 2 ms), so at low rates it wakes about once per `pace` and issues what
//!   came due meanwhile instead of waking for every request. The average rate is the
//!   schedule's either way; if the system cannot keep up, the generator never sleeps and
//!   the actual rate falls below the target.
//!
//! # Invariants
//! - Request `i` is issued no earlier than its scheduled arrival (the sum of the first
//!   `i` gaps after the start).
//! - A request whose latency is below the timeout gets exactly one completion job, due at
//!   its issue instant plus its latency; the others are left to expire.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::harness::sampling::{CyclicTable, KeyTable};
use crate::workloads::w3::completer::{Inbox, Job};
use crate::workloads::w3::op::{LoadContext, LoadOp};
use crate::workloads::w3::LoadPurgatory;

/// Most requests issued between two clock reads.
pub const BATCH: usize = 64;

/// The pre-sampled inputs of one run.
pub struct Schedule {
    /// Inter-arrival gaps, ns.
    pub gaps: CyclicTable,
    /// Completion latencies, ns.
    pub latencies: CyclicTable,
    /// Keys of each request.
    pub keys: KeyTable,
}

/// What the generator reports when done.
pub struct Generated {
    /// ns since the origin when the first request was due.
    pub start_nanos: u64,
    /// ns since the origin when the last request had been issued.
    pub end_nanos: u64,
}

/// Issues `num` requests into `purgatory`; `issued` counts them as they go.
#[allow(clippy::too_many_arguments)]
pub fn run<P: LoadPurgatory<LoadOp>>(
    purgatory: &P,
    ctx: &'static LoadContext,
    schedule: &Schedule,
    inbox: &Inbox<P::Handle>,
    num: usize,
    timeout: Duration,
    events: bool,
    pace: Duration,
    issued: &AtomicU64,
) -> Generated {
    let timeout_nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
    let pace_nanos = u64::try_from(pace.as_nanos()).unwrap_or(0);
    let start = ctx.now_nanos();
    let mut arrival = start;
    let mut outbox: Vec<(u64, Job<P::Handle>)> = Vec::with_capacity(BATCH);
    let mut batch = Vec::with_capacity(BATCH);
    let mut handles = Vec::with_capacity(BATCH);
    let mut i = 0usize;
    while i < num {
        let now = ctx.now_nanos();
        if arrival > now {
            std::thread::sleep(Duration::from_nanos((arrival - now).max(pace_nanos)));
            continue;
        }
        let first = i;
        let end = (i + BATCH).min(num);
        while i < end && arrival <= now {
            batch.push((LoadOp::new(ctx, i as u32, now), schedule.keys.keys(i)));
            arrival += schedule.gaps.get(i);
            i += 1;
        }
        purgatory.watch_batch(&mut batch, &mut handles);
        for (id, handle) in (first..i).zip(handles.drain(..)) {
            let latency = schedule.latencies.get(id);
            if latency >= timeout_nanos {
                continue;
            }
            if events {
                outbox.push((now + latency, Job::Event(id as u32)));
            } else if let Some(handle) = handle {
                outbox.push((now + latency, Job::Force(handle)));
            }
        }
        inbox.deliver(&mut outbox);
        issued.store(i as u64, Ordering::Relaxed);
    }
    Generated {
        start_nanos: start,
        end_nanos: ctx.now_nanos(),
    }
}
