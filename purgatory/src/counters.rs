//! The purgatory's counters, striped so that threads counting at once do not bounce one
//! cache line between them.
//!
//! # Invariants
//! - Each thread increments the stripe picked by its thread index; readers sum every
//!   stripe. A sum read while others count is a recent value, not a snapshot.
//! - The counts of watcher entries (listed, stale) are the watcher lists' own
//!   (`watchers.rs`), the count of caught panics the door's (`user_code.rs`); these are
//!   the totals of what happened to operations.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

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

#[derive(Default)]
#[repr(align(128))]
struct Stripe {
    completed: AtomicU64,
    forced: AtomicU64,
    expired: AtomicU64,
    shutdown_expired: AtomicU64,
    cancelled: AtomicU64,
    purged: AtomicU64,
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
}

impl Counters {
    #[inline]
    fn stripe(&self) -> &Stripe {
        &self.stripes[stripe_index()]
    }

    #[inline]
    pub(crate) fn add(&self, which: Count, n: u64) {
        let stripe = self.stripe();
        let counter = match which {
            Count::Completed => &stripe.completed,
            Count::Forced => &stripe.forced,
            Count::Expired => &stripe.expired,
            Count::ShutdownExpired => &stripe.shutdown_expired,
            Count::Cancelled => &stripe.cancelled,
            Count::Purged => &stripe.purged,
        };
        counter.fetch_add(n, Relaxed);
    }

    pub(crate) fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for s in &self.stripes {
            t.completed += s.completed.load(Relaxed);
            t.forced += s.forced.load(Relaxed);
            t.expired += s.expired.load(Relaxed);
            t.shutdown_expired += s.shutdown_expired.load(Relaxed);
            t.cancelled += s.cancelled.load(Relaxed);
            t.purged += s.purged.load(Relaxed);
        }
        t
    }
}
