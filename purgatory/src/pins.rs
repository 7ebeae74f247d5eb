//! Readers of the op table's segments, counted so that a segment the table no longer
//! needs can be freed once no thread can still be reading it (`op_table.rs`, "Giving
//! memory back").
//!
//! A thread *pins* the table ([`Pins::pin`]) before it looks up a slot by a name that may
//! be stale (a list entry, a timer entry, a caller's handle) and unpins it when the
//! [`Pinned`] guard drops. A pin is one read-modify-write on a counter of the calling
//! thread's stripe (`counters.rs`), on its own cache line, and one more to unpin.
//!
//! # Invariants
//! - A stripe's counter is the number of pins of that stripe's threads not yet dropped.
//! - A retirer that unlinks a segment (stores null where the segment was) and *then*
//!   reads a stripe's counter as 0 with a read-modify-write ([`Grace::passed`]) knows
//!   that every pin of that stripe taken before the unlink has been dropped: the
//!   counter was at least 1 from that pin to its drop. A pin taken after that read
//!   reads the counter from the retirer's read-modify-write or later in its order, so
//!   it sees the unlink (release on the retirer's side, acquire on the pin's: no
//!   sequentially consistent fence on either side). A pin taken between the unlink and
//!   that read (so the read saw it) is waited for like the others.
//! - So once every stripe was read as 0 after the unlink, no thread can reach the
//!   segment any more: it may be freed. A thread that retires while it holds a pin
//!   itself only delays the free (its own stripe never reads 0 meanwhile), never makes
//!   it early.
//! - A segment waiting for its grace may be linked again instead (`op_table.rs`,
//!   `relink`): it is then not freed, and its grace is dropped with its place among the
//!   unlinked, so a long pin delays a free but never makes the table keep a second copy.
//!
//! | stripe counter | meaning for a segment unlinked before it was read |
//! |---|---|
//! | read as 0 (by a read-modify-write, after the unlink) | no thread of the stripe can reach it |
//! | read as more | some may: read again later (the free waits, nothing blocks) |

use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};

use crate::counters::{stripe_index, STRIPES};
use crate::sync::AtomicUsize;

/// One stripe's pins, on its own cache line.
#[repr(align(128))]
struct Stripe {
    readers: AtomicUsize,
}

/// The pins of one op table, striped by thread.
pub(crate) struct Pins {
    stripes: [Stripe; STRIPES],
}

impl Default for Pins {
    fn default() -> Self {
        Pins {
            stripes: std::array::from_fn(|_| Stripe {
                readers: AtomicUsize::new(0),
            }),
        }
    }
}

/// A pin: while it lives, no segment this thread can reach through the table is freed.
#[must_use = "a pin protects only while it lives"]
pub(crate) struct Pinned<'a> {
    pins: &'a Pins,
    stripe: usize,
}

impl Pins {
    /// Pins the table for the calling thread.
    #[inline]
    pub(crate) fn pin(&self) -> Pinned<'_> {
        let stripe = stripe_index();
        // Acquire: a retirer's read of this counter before this pin (release) makes its
        // unlink visible to every look-up made under this pin.
        self.stripes[stripe].readers.fetch_add(1, Acquire);
        Pinned { pins: self, stripe }
    }

    /// Whether the pin is this table's.
    #[inline]
    pub(crate) fn owns(&self, pin: &Pinned<'_>) -> bool {
        std::ptr::eq(self, pin.pins)
    }
}

impl Drop for Pinned<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release: every look-up made under this pin happens before a retirer's read
        // that sees the counter without it.
        self.pins.stripes[self.stripe].readers.fetch_sub(1, Release);
    }
}

/// The stripes read as 0 since a segment was unlinked (see the module doc).
#[derive(Default)]
pub(crate) struct Grace {
    seen_clear: u32,
}

impl Grace {
    /// Reads the stripes not yet seen clear since the unlink this grace began after;
    /// whether all of them have been, so the segment may be freed. Never waits.
    pub(crate) fn passed(&mut self, pins: &Pins) -> bool {
        for (i, stripe) in pins.stripes.iter().enumerate() {
            if self.seen_clear & (1 << i) == 0
                // A read-modify-write (adding nothing), not a load: it reads the latest
                // count, and a later pin reads from it (see the module doc).
                && stripe.readers.fetch_add(0, AcqRel) == 0
            {
                self.seen_clear |= 1 << i;
            }
        }
        self.seen_clear == (1u32 << STRIPES) - 1
    }
}
