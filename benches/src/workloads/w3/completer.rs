//! The completer thread: completes each request at its arrival plus its sampled
//! latency, as the event that satisfies a real request would.
//!
//! # Design
//! The generator hands over completions in batches (one lock per batch, never one
//! channel send per request) through the [`Inbox`]. The completer files them into a
//! [`Ring`] of slots one `tick` wide (the run's `--pace-us`) and, once per tick while work
//! is pending, completes every slot that has come due, forcing completions in batches of
//! up to `FORCE_BATCH` through `force_complete_batch`. It reads the clock once per cycle.
//!
//! The ring and the inbox's buffers are made before the run starts, each slot with room
//! for a tick's completions at the target rate and that room written once, so that the
//! run does not pay for the tool's memory. Grown during the run by doubling, they cost
//! the completer page faults (fresh pages zeroed by the kernel) on CPU the purgatory
//! under test then did not get on two cores: a run of 3,000,000 requests at 4,500,000/s
//! (about 0.67 s) with no purgatory at all (`--impl null`) took 145-149 ms of CPU in
//! three runs, and 547 ms in one where `perf record` put 59 % of its samples in the
//! completer's page faults; with the room made first, 128-148 ms.
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

impl<H> Inbox<H> {
    /// An inbox with room, written once, for `capacity` jobs.
    pub fn with_capacity(capacity: usize) -> Self {
        Inbox {
            jobs: Mutex::new(touched(capacity)),
            closed: AtomicBool::new(false),
        }
    }

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

/// A vector with room for `capacity` elements, that room written once (with zeroes), so
/// that its pages are in memory before the run needs them.
fn touched<T>(capacity: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(capacity);
    for spare in v.spare_capacity_mut() {
        *spare = std::mem::MaybeUninit::zeroed();
    }
    v
}

/// The completer's slots, one `tick` wide, covering at least a `horizon` (the longest
/// latency that gets a completion) and 64 ticks more.
pub struct Ring<H> {
    slots: Vec<Vec<Job<H>>>,
    tick_nanos: u64,
    /// Room each slot and each hand-over buffer was made with.
    per_tick: usize,
}

impl<H> Ring<H> {
    /// A ring for `horizon` in slots one `tick` wide, each with room (written once) for
    /// the completions a tick brings at `rate` requests a second, and a quarter more.
    pub fn new(horizon: Duration, tick: Duration, rate: f64) -> Self {
        let tick_nanos = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
        let horizon_ticks = u64::try_from(horizon.as_nanos()).unwrap_or(u64::MAX) / tick_nanos;
        let len = (horizon_ticks as usize + 64).next_power_of_two();
        // The room made up front is capped at 512 MiB in all (a huge `--rate` or
        // `--timeout` is not refused: its run grows the slots as they fill, as before).
        let per_tick = (rate.max(0.0) * tick_nanos as f64 * 1.25 / 1e9) as usize;
        let most = (512 << 20) / std::mem::size_of::<Job<H>>().max(1) / (len + 4);
        let per_tick = per_tick.min(most);
        Ring {
            slots: (0..len).map(|_| touched(per_tick)).collect(),
            tick_nanos,
            per_tick,
        }
    }

    /// Room for the jobs a hand-over brings: two ticks' worth.
    pub fn hand_over_capacity(&self) -> usize {
        self.per_tick.saturating_mul(2)
    }
}

/// Runs the completer until the inbox is closed and drained.
pub fn run<P: LoadPurgatory<LoadOp>>(
    purgatory: &P,
    inbox: &Inbox<P::Handle>,
    ctx: &LoadContext,
    keys: &KeyTable,
    ring: Ring<P::Handle>,
) {
    let tick_nanos = ring.tick_nanos;
    let mut incoming = touched(ring.hand_over_capacity());
    let mut ring = ring.slots;
    let ring_len = ring.len();
    let mask = ring_len as u64 - 1;
    let mut filed = 0usize;
    let mut later: Vec<(u64, Job<P::Handle>)> = Vec::new();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slot has a tick's room at the rate and a quarter more, and a rate whose room
    /// would pass the cap gets the cap, not an allocation of its own size.
    #[test]
    fn the_ring_is_made_with_room_for_a_tick_up_to_a_cap() {
        let ring: Ring<u64> = Ring::new(
            Duration::from_millis(200),
            Duration::from_millis(2),
            1_000_000.0,
        );
        assert_eq!(ring.slots.len(), 256); // 100 ticks and 64, to a power of two
        assert_eq!(ring.per_tick, 2_500);
        assert!(ring
            .slots
            .iter()
            .all(|s| s.capacity() >= 2_500 && s.is_empty()));
        assert_eq!(ring.hand_over_capacity(), 5_000);
        let huge: Ring<u64> = Ring::new(Duration::from_millis(200), Duration::from_millis(2), 1e15);
        let bytes = huge.per_tick * huge.slots.len() * std::mem::size_of::<Job<u64>>();
        assert!(bytes <= 512 << 20, "{bytes} bytes made up front");
        assert!(huge.per_tick > 0);
    }
}
