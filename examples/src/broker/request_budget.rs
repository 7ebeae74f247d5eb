//! The total budget for request bytes read and not yet handed to a handler (Kafka's
//! `queued.max.request.bytes`): partial frames, and bytes clients pipeline behind a waiting
//! request, over all connections. A request handed to its handler is no longer counted (as
//! Kafka releases a request's buffer when its handler returns): what it holds afterwards
//! (a produce's batches, now the log's) is bounded by other limits. The exception is a
//! Metadata request, whose answer echoes its topic names and shares them with it: it stays
//! counted until the answer is written (or its connection closed), so unread echoes cannot
//! hold more than the budget between them.
//!
//! Invariants:
//! - Each connection holds its first [`OWN_REQUEST_BYTES`] without drawing on the shared
//!   budget, so the small requests of every client are always read, however much hostile
//!   connections hold; beyond that every byte it holds is drawn from [`RequestBudget`], and
//!   the shared total never exceeds `queued_max_request_bytes`.
//! - A connection whose read would go beyond the budget is refused the bytes ([`OverBudget`])
//!   and closed by its caller: the budget never makes a connection stop reading, so a
//!   client that leaves is always seen (a socket left unread hides its end of stream).
//! - What a connection drew is given back as it releases bytes and, whatever is left, when
//!   its [`ConnectionBudget`] is dropped.
//!
//! Kafka instead stops reading from every connection while its memory pool is exhausted;
//! closing the connection that asks for more keeps the others served.
//!
//! [`OWN_REQUEST_BYTES`]: super::config::OWN_REQUEST_BYTES

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::config::OWN_REQUEST_BYTES;

/// The shared budget.
#[derive(Debug)]
pub struct RequestBudget {
    drawn: AtomicUsize,
    limit: usize,
}

impl RequestBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        RequestBudget {
            drawn: AtomicUsize::new(0),
            limit,
        }
    }

    /// Bytes drawn now, over all connections.
    pub fn drawn(&self) -> usize {
        self.drawn.load(Ordering::Acquire)
    }

    fn try_draw(&self, bytes: usize) -> bool {
        self.drawn
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |drawn| {
                drawn
                    .checked_add(bytes)
                    .filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        let before = self.drawn.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "gave back more than was drawn");
    }
}

/// A read refused because the budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    /// The shared limit.
    pub limit: usize,
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request bytes over --queued-max-request-bytes {} (all connections together)",
            self.limit
        )
    }
}

impl std::error::Error for OverBudget {}

/// What one connection holds, and what of it is drawn from the shared budget.
#[derive(Debug)]
pub struct ConnectionBudget {
    shared: Arc<RequestBudget>,
    held: usize,
    drawn: usize,
}

impl ConnectionBudget {
    /// A connection holding nothing.
    pub fn new(shared: Arc<RequestBudget>) -> Self {
        ConnectionBudget {
            shared,
            held: 0,
            drawn: 0,
        }
    }

    /// Counts `bytes` more as held; refused (nothing counted) when the shared budget cannot
    /// cover what goes beyond the connection's own allowance.
    pub fn hold(&mut self, bytes: usize) -> Result<(), OverBudget> {
        let held = self.held + bytes;
        let need = held
            .saturating_sub(OWN_REQUEST_BYTES)
            .saturating_sub(self.drawn);
        if need > 0 && !self.shared.try_draw(need) {
            return Err(OverBudget {
                limit: self.shared.limit,
            });
        }
        self.drawn += need;
        self.held = held;
        Ok(())
    }

    /// Counts `bytes` as no longer held, giving back what the shared budget no longer
    /// needs to cover.
    pub fn release(&mut self, bytes: usize) {
        debug_assert!(bytes <= self.held, "released more than was held");
        self.held -= bytes.min(self.held);
        let keep = self.held.saturating_sub(OWN_REQUEST_BYTES);
        if self.drawn > keep {
            self.shared.give_back(self.drawn - keep);
            self.drawn = keep;
        }
    }

    /// Bytes held now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held
    }
}

impl Drop for ConnectionBudget {
    fn drop(&mut self) {
        if self.drawn > 0 {
            self.shared.give_back(self.drawn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_draws_only_beyond_its_own_allowance_and_gives_it_all_back() {
        let shared = Arc::new(RequestBudget::new(100_000));
        let mut one = ConnectionBudget::new(Arc::clone(&shared));
        one.hold(OWN_REQUEST_BYTES).unwrap();
        assert_eq!(shared.drawn(), 0);
        one.hold(60_000).unwrap();
        assert_eq!(shared.drawn(), 60_000);
        let mut two = ConnectionBudget::new(Arc::clone(&shared));
        two.hold(OWN_REQUEST_BYTES + 40_000).unwrap();
        assert_eq!(shared.drawn(), 100_000);
        // Spent: more is refused and nothing is counted, but the own allowance still works.
        let refused = one.hold(1);
        assert_eq!(refused, Err(OverBudget { limit: 100_000 }));
        assert_eq!(one.held(), OWN_REQUEST_BYTES + 60_000);
        let mut three = ConnectionBudget::new(Arc::clone(&shared));
        three.hold(OWN_REQUEST_BYTES).unwrap();
        // Releasing gives back first what was drawn.
        one.release(30_000);
        assert_eq!(shared.drawn(), 70_000);
        one.release(OWN_REQUEST_BYTES);
        assert_eq!(shared.drawn(), 40_000);
        drop(two);
        assert_eq!(shared.drawn(), 0);
        drop((one, three));
        assert_eq!(shared.drawn(), 0);
    }
}
