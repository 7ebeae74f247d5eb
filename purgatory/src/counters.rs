//! The purgatory's counters, striped so that threads counting at once do not bounce one
//! cache line between them.
//!
//! # Invariants
//! - Each thread increments the stripe picked by its thread index; readers sum every
//!   stripe. A sum read while others count is a recent value, not a snapshot.
//! - Counts are `SeqCst` read-modify-writes and reads (on x86 the same instructions as
//!   relaxed ones), so that a count made before a completion reads "closed" is seen by a
//!   final publish made after shutdown closed (`metrics.rs`, `publish_if_closed`).
//! - The counts of watcher entries (listed, stale) are the watcher lists' own
//!   (`watchers.rs`), the count of caught panics the door's (`user_code.rs`); these are
//!   the totals of what happened to operations.

use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
};

pub(crate) const STRIPES: usize = 16;

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: usize = NEXT_THREAD.fetch_add(1, Relaxed) % STRIPES;
}

/// The stripe of the calling thread (below [`STRIPES`]), shared by every striped structure.
#[inline]
pub(crate) fn stripe_index() -> usize {
    STRIPE.with(|s| *s)
}

/// The calling thread's stripe, read once for several striped structures or counts on
/// that thread: the reaper's run of expiries (each count then skips the thread-local
/// read and the bounds check, about 7 instructions a count), and a single watch (its
/// slot's free list and its entry count: 727 -> 723 instructions a watch; callgrind,
/// `expiring_watches`). Only for the thread that read it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ThisStripe(usize);

impl ThisStripe {
    /// The calling thread's stripe.
    #[inline]
    pub(crate) fn read() -> Self {
        ThisStripe(stripe_index())
    }

    /// Its index, below [`STRIPES`].
    #[inline(always)]
    pub(crate) fn index(self) -> usize {
        // The index already is; the compiler is told.
        self.0 % STRIPES
    }
}

#[derive(Default)]
#[repr(align(128))]
struct Stripe {
    completed: AtomicU64,
    forced: AtomicU64,
    expired: AtomicU64,
    shutdown_expired: AtomicU64,
    cancelled: AtomicU64,
    purged: AtomicU64,
    refused: AtomicU64,
    accepted: AtomicU64,
}

/// Which total to bump.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Count {
    Completed,
    Forced,
    /// Expired by its timeout.
    Expired,
    /// Expired by shutdown (or the last handle's drop), its timeout not reached.
    ShutdownExpired,
    Cancelled,
    Purged,
    /// Refused by a watch (given back in a `WatchError`): never accepted.
    Refused,
    /// Accepted by a watch (completed at once, or left waiting): counted only by the
    /// members of a `TimerGroup`, whose `pending` is what they accepted and did not
    /// answer yet (the shared timer's count is every member's).
    Accepted,
}

#[derive(Default)]
pub(crate) struct Counters {
    stripes: [Stripe; STRIPES],
}

/// Totals read from [`Counters`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Totals {
    pub(crate) completed: u64,
    pub(crate) forced: u64,
    pub(crate) expired: u64,
    pub(crate) shutdown_expired: u64,
    pub(crate) cancelled: u64,
    pub(crate) purged: u64,
    pub(crate) refused: u64,
    pub(crate) accepted: u64,
}

impl Counters {
    #[inline]
    pub(crate) fn add(&self, which: Count, n: u64) {
        self.add_in(ThisStripe::read(), which, n);
    }

    /// [`add`](Self::add), in the stripe the calling thread read already.
    #[inline]
    pub(crate) fn add_in(&self, stripe: ThisStripe, which: Count, n: u64) {
        let stripe = &self.stripes[stripe.index()];
        let counter = match which {
            Count::Completed => &stripe.completed,
            Count::Forced => &stripe.forced,
            Count::Expired => &stripe.expired,
            Count::ShutdownExpired => &stripe.shutdown_expired,
            Count::Cancelled => &stripe.cancelled,
            Count::Purged => &stripe.purged,
            Count::Refused => &stripe.refused,
            Count::Accepted => &stripe.accepted,
        };
        counter.fetch_add(n, SeqCst);
    }

    pub(crate) fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for s in &self.stripes {
            t.completed += s.completed.load(SeqCst);
            t.forced += s.forced.load(SeqCst);
            t.expired += s.expired.load(SeqCst);
            t.shutdown_expired += s.shutdown_expired.load(SeqCst);
            t.cancelled += s.cancelled.load(SeqCst);
            t.purged += s.purged.load(SeqCst);
            t.refused += s.refused.load(SeqCst);
            t.accepted += s.accepted.load(SeqCst);
        }
        t
    }
}
