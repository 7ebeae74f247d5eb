//! The completer thread: completes each request at its arrival plus its sampled
//! latency, as the event that satisfies a real request would.
//!
//! # Design
//! The generator hands over completions in batches (one lock per batch, never one
//! channel send per request) through the [`Inbox`]. The completer files them into a ring
//! of slots one `tick` wide (the run's `--pace-us`) and, once per tick while work is
//! pending, completes every slot that has come due, forcing completions in batches of
//! up to `FORCE_BATCH` through `force_complete_batch`. It reads the clock once per cycle.
//!
//! # Invariants
//! - A job is completed no earlier than its due instant rounded down to the tick, and
//!   normally within the tick after it.
//! - A job whose due slot is more than a ring's length ahead waits in `later` and is
//!   filed once it fits, so the ring never mixes two rounds.
//! - The thread exits only when the inbox is closed and every job has been completed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::harness::sampling::KeyTable;
use crate::workloads::w3::op::{LoadContext, LoadOp};
use crate::workloads::w3::LoadPurgatory;

/// Most forced completions handed to the purgatory in one call.
const FORCE_BATCH: usize = 64;

/// What the completer does to one request.
pub enum Job<H> {
    /// Plain W3: force-complete it by handle (Kafka's tool).
    Force(H),
    /// W3-events: mark request `id` ready and check its first key.
    Event(u32),
}

/// Completions handed from the generator to the completer, in batches.
pub struct Inbox<H> {
    jobs: Mutex<Vec<(u64, Job<H>)>>,
    closed: AtomicBool,
}

impl<H> Default for Inbox<H> {
    fn default() -> Self {
        Inbox {
            jobs: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        }
    }
}

impl<H> Inbox<H> {
    /// Moves every job of `batch` (due instant in ns since the origin, job) into the inbox.
    pub fn deliver(&self, batch: &mut Vec<(u64, Job<H>)>) {
        if !batch.is_empty() {
            self.jobs.lock().append(batch);
        }
    }

    /// No more jobs will come.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

/// Runs the completer until the inbox is closed and drained.
pub fn run<P: LoadPurgatory<LoadOp>>(
    purgatory: &P,
    inbox: &Inbox<P::Handle>,
    ctx: &LoadContext,
    keys: &KeyTable,
    horizon: Duration,
    tick: Duration,
) {
    let tick_nanos = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
    let horizon_ticks = u64::try_from(horizon.as_nanos()).unwrap_or(u64::MAX) / tick_nanos;
    let ring_len = (horizon_ticks as usize + 64).next_power_of_two();
    let mask = ring_len as u64 - 1;
    let mut ring: Vec<Vec<Job<P::Handle>>> = (0..ring_len).map(|_| Vec::new()).collect();
    let mut filed = 0usize;
    let mut later: Vec<(u64, Job<P::Handle>)> = Vec::new();
    let mut incoming = Vec::new();
    let mut forced = Vec::with_capacity(FORCE_BATCH);
    let mut next_tick = ctx.now_nanos() / tick_nanos;
    loop {
        let closed = inbox.closed.load(Ordering::Acquire);
        std::mem::swap(&mut *inbox.jobs.lock(), &mut incoming);
        let now_tick = ctx.now_nanos() / tick_nanos;
        incoming.append(&mut later);
        for (due, job) in incoming.drain(..) {
            let slot = (due / tick_nanos).max(next_tick);
            if slot - next_tick >= ring_len as u64 {
                later.push((due, job));
            } else {
                ring[(slot & mask) as usize].push(job);
                filed += 1;
            }
        }
        while next_tick <= now_tick {
            let slot = &mut ring[(next_tick & mask) as usize];
            filed -= slot.len();
            for job in slot.drain(..) {
                match job {
                    Job::Force(handle) => {
                        forced.push(handle);
                        if forced.len() == FORCE_BATCH {
                            purgatory.force_complete_batch(&forced);
                            forced.clear();
                        }
                    }
                    Job::Event(id) => {
                        ctx.mark_ready(id);
                        if let Some(&key) = keys.keys(id as usize).first() {
                            purgatory.check_and_complete(key);
                        }
                    }
                }
            }
            purgatory.force_complete_batch(&forced);
            forced.clear();
            next_tick += 1;
        }
        if closed && filed == 0 && later.is_empty() {
            return;
        }
        let wake_at = next_tick * tick_nanos;
        let now = ctx.now_nanos();
        if wake_at > now {
            std::thread::sleep(Duration::from_nanos(wake_at - now));
        }
    }
}
