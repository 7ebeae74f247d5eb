//! Work a driver's shutdown waits for outside its rounds: an owner answering, on its own
//! thread, something the driver would otherwise have answered or could miss (the
//! purgatory: an expiry left to the holder of an operation's slot, an operation an event
//! or a force took out of its slot). Counted per stripe of threads, so that the many
//! threads doing it at once do not meet on one lock; only a shutdown waiting for it takes
//! the driver's round lock.
//!
//! # Invariants
//! - A thread counts its work up on its stripe before the work can be missed (the owner
//!   takes its guard before it takes the thing over) and down when it is done, on the same
//!   stripe: the sum over the stripes is the work in progress.
//! - Both counts and the waiter's flag are `SeqCst`: a waiter sets `waiting` and then reads
//!   every stripe; a worker counts down and then reads `waiting`. One of the two sees the
//!   other (the store-buffer pattern cannot produce "neither"): either the waiter sees the
//!   work, or the worker sees the waiter and wakes it, under the round lock the waiter
//!   holds from its read to its wait, so the wake cannot fall in between.
//! - Under loom the two reads are read-modify-writes: loom does not model the single
//!   total order of `SeqCst` loads, and let both sides read the old value (a deadlock no
//!   real run can have); a read-modify-write reads the latest value there too (the same
//!   workaround as `core.rs`'s published expiration).

use std::sync::atomic::Ordering::SeqCst;

use crate::sync::{AtomicBool, AtomicUsize};

/// Stripes of work counts (a power of two).
const STRIPES: usize = 16;

#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicUsize);

/// The driver's count of work in progress outside its rounds (see the module doc).
#[derive(Default)]
pub(crate) struct WorkCounts {
    stripes: [Stripe; STRIPES],
    /// A shutdown waits for the work: whoever ends some wakes it.
    waiting: AtomicBool,
}

impl WorkCounts {
    /// Counts one piece of work up on the calling thread's stripe; returns the stripe, for
    /// [`end`](Self::end).
    #[inline]
    pub(crate) fn begin(&self) -> usize {
        let stripe = crate::core::thread_hint() & (STRIPES - 1);
        self.stripes[stripe].0.fetch_add(1, SeqCst);
        stripe
    }

    /// Counts one piece of work down on `stripe`; returns whether a shutdown waits (the
    /// caller then wakes it).
    #[inline]
    pub(crate) fn end(&self, stripe: usize) -> bool {
        self.stripes[stripe].0.fetch_sub(1, SeqCst);
        #[cfg(loom)]
        return self.waiting.fetch_or(false, SeqCst);
        #[cfg(not(loom))]
        return self.waiting.load(SeqCst);
    }

    /// A shutdown is about to wait: from now on every end wakes it. Returns whether any
    /// work is still in progress.
    pub(crate) fn wait_for_any(&self) -> bool {
        self.waiting.store(true, SeqCst);
        self.stripes.iter().any(|stripe| {
            #[cfg(loom)]
            return stripe.0.fetch_add(0, SeqCst) != 0;
            #[cfg(not(loom))]
            return stripe.0.load(SeqCst) != 0;
        })
    }
}
