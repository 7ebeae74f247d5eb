//! One account for the memory the broker holds on its clients' behalf (Kafka's
//! `queued.max.request.bytes`, here a bound on more than the queue): every request byte
//! from the moment it is read until the last slice of it is freed (partial frames, bytes
//! pipelined behind a waiting request, a request being handled or parked in a purgatory,
//! answers that share its bytes, such as echoed topic names), what a parked fetch keeps
//! per partition (`fetch.rs`, `PARKED_BYTES_PER_PARTITION`), and what an answer keeps
//! alive until it is written: the bytes it copies, and the log's bytes it shares (a
//! fetch's records) at what their read keeps alive (their segment, which retention may
//! drop while the answer waits: then only the answer holds it; issue #38, finding 5). See
//! `reply.rs`.
//!
//! How a frame is followed until it is freed: the connection turns the frame into a
//! [`Bytes`] that owns a [`Charge`] ([`ConnectionBudget::charged`]); every slice cut from
//! it (decoded strings, echoed names, tagged fields) shares that owner, and the charge is
//! given back when the last slice is dropped, wherever it was kept.
//!
//! Invariants:
//! - Each connection holds its first [`OWN_REQUEST_BYTES`] without drawing on the shared
//!   budget, so the small requests of every client are always read, however much hostile
//!   connections hold; beyond that every byte it holds is drawn from [`RequestBudget`], and
//!   the shared total never exceeds `queued_max_request_bytes`.
//! - No connection holds more than its share: [`OWN_REQUEST_BYTES`] plus `share`
//!   (`--max-frame-bytes`, one whole request as Kafka's `socket.request.max.bytes`), so one
//!   client cannot spend the whole budget whatever it pipelines.
//! - A connection whose read (or answer) would go beyond the budget or its share is
//!   refused the bytes ([`OverBudget`]) and closed by its caller: the budget never makes a
//!   connection stop reading, so a client that leaves is always seen (a socket left unread
//!   hides its end of stream).
//! - What a connection drew is given back as it releases bytes (a [`Charge`] dropped) and,
//!   whatever is left, when the connection and every charge it handed out are gone.
//!
//! The bound: `queued_max_request_bytes + max_connections x OWN_REQUEST_BYTES` bytes held
//! for clients, over all connections, unwritten answers and the dropped segments they
//! keep alive included.
//!
//! Kafka instead stops reading from every connection while its memory pool is exhausted;
//! closing the connection that asks for more keeps the others served. Kafka's pool counts
//! requests only: its fetch answers are sent from the segment files (`sendfile`), and a
//! segment retention drops is deleted `file.delete.delay.ms` (a minute) later, failing a
//! send still under way then.
//!
//! [`OWN_REQUEST_BYTES`]: super::config::OWN_REQUEST_BYTES

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

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

/// Which limit refused bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverBudget {
    /// The shared budget (`--queued-max-request-bytes`) is spent.
    Shared {
        /// The shared limit.
        limit: usize,
    },
    /// The connection would hold more than its share.
    Share {
        /// The share beyond [`OWN_REQUEST_BYTES`].
        share: usize,
    },
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OverBudget::Shared { limit } => write!(
                f,
                "request bytes over --queued-max-request-bytes {limit} (all connections together)"
            ),
            OverBudget::Share { share } => write!(
                f,
                "request bytes held by one connection over its share, --max-frame-bytes {share} \
                 + {OWN_REQUEST_BYTES}"
            ),
        }
    }
}

impl std::error::Error for OverBudget {}

/// What one connection holds and what of it is drawn from the shared budget.
#[derive(Debug, Default)]
struct Held {
    held: usize,
    drawn: usize,
}

/// One connection's account, shared by the connection and the charges it handed out.
#[derive(Debug)]
struct Account {
    shared: Arc<RequestBudget>,
    share: usize,
    held: Mutex<Held>,
}

impl Account {
    fn hold(&self, bytes: usize) -> Result<(), OverBudget> {
        let mut now = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let held = now.held.saturating_add(bytes);
        let beyond_own = held.saturating_sub(OWN_REQUEST_BYTES);
        if beyond_own > self.share {
            return Err(OverBudget::Share { share: self.share });
        }
        let need = beyond_own.saturating_sub(now.drawn);
        if need > 0 && !self.shared.try_draw(need) {
            return Err(OverBudget::Shared {
                limit: self.shared.limit,
            });
        }
        now.drawn += need;
        now.held = held;
        Ok(())
    }

    fn release(&self, bytes: usize) {
        let mut now = self.held.lock().unwrap_or_else(|e| e.into_inner());
        debug_assert!(bytes <= now.held, "released more than was held");
        now.held -= bytes.min(now.held);
        let keep = now.held.saturating_sub(OWN_REQUEST_BYTES);
        if now.drawn > keep {
            self.shared.give_back(now.drawn - keep);
            now.drawn = keep;
        }
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let drawn = self.held.get_mut().map_or(0, |held| held.drawn);
        if drawn > 0 {
            self.shared.give_back(drawn);
        }
    }
}

/// A connection's account: what it holds, charged to the shared budget beyond its own
/// allowance and never beyond its share. Clones are handles to the same account.
#[derive(Debug, Clone)]
pub struct ConnectionBudget {
    account: Arc<Account>,
}

/// Bytes held until this is dropped.
#[derive(Debug)]
pub struct Charge {
    account: Arc<Account>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.account.release(self.bytes);
    }
}

/// A frame's buffer with its charge: the owner of every slice cut from the frame.
struct ChargedFrame {
    bytes: Bytes,
    _charge: Charge,
}

impl AsRef<[u8]> for ChargedFrame {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl ConnectionBudget {
    /// A connection holding nothing, allowed `share` bytes beyond its own allowance.
    pub fn new(shared: Arc<RequestBudget>, share: usize) -> Self {
        ConnectionBudget {
            account: Arc::new(Account {
                shared,
                share,
                held: Mutex::new(Held::default()),
            }),
        }
    }

    /// Counts `bytes` more as held; refused (nothing counted) when the shared budget cannot
    /// cover what goes beyond the connection's own allowance, or the connection's share
    /// would be passed.
    pub fn hold(&self, bytes: usize) -> Result<(), OverBudget> {
        self.account.hold(bytes)
    }

    /// Counts `bytes` as no longer held, giving back what the shared budget no longer
    /// needs to cover.
    #[cfg(test)]
    pub fn release(&self, bytes: usize) {
        self.account.release(bytes);
    }

    /// Counts `bytes` more as held until the returned charge is dropped.
    pub fn charge(&self, bytes: usize) -> Result<Charge, OverBudget> {
        self.hold(bytes)?;
        Ok(Charge {
            account: Arc::clone(&self.account),
            bytes,
        })
    }

    /// `frame`, whose `held` bytes (its size field included) are already held, as a buffer
    /// that keeps them held until the last slice of it is dropped.
    pub fn charged(&self, frame: Bytes, held: usize) -> Bytes {
        let charge = Charge {
            account: Arc::clone(&self.account),
            bytes: held,
        };
        Bytes::from_owner(ChargedFrame {
            bytes: frame,
            _charge: charge,
        })
    }

    /// Bytes held now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.account
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_draws_only_beyond_its_own_allowance_and_gives_it_all_back() {
        let shared = Arc::new(RequestBudget::new(100_000));
        let one = ConnectionBudget::new(Arc::clone(&shared), usize::MAX);
        one.hold(OWN_REQUEST_BYTES).unwrap();
        assert_eq!(shared.drawn(), 0);
        one.hold(60_000).unwrap();
        assert_eq!(shared.drawn(), 60_000);
        let two = ConnectionBudget::new(Arc::clone(&shared), usize::MAX);
        two.hold(OWN_REQUEST_BYTES + 40_000).unwrap();
        assert_eq!(shared.drawn(), 100_000);
        // Spent: more is refused and nothing is counted, but the own allowance still works.
        let refused = one.hold(1);
        assert_eq!(refused, Err(OverBudget::Shared { limit: 100_000 }));
        assert_eq!(one.held(), OWN_REQUEST_BYTES + 60_000);
        let three = ConnectionBudget::new(Arc::clone(&shared), usize::MAX);
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

    #[test]
    fn one_connection_never_holds_more_than_its_share() {
        let shared = Arc::new(RequestBudget::new(1 << 20));
        let one = ConnectionBudget::new(Arc::clone(&shared), 10_000);
        one.hold(OWN_REQUEST_BYTES + 10_000).unwrap();
        assert_eq!(one.hold(1), Err(OverBudget::Share { share: 10_000 }));
        assert_eq!(shared.drawn(), 10_000);
        // The budget has room for others.
        let two = ConnectionBudget::new(Arc::clone(&shared), 10_000);
        two.hold(OWN_REQUEST_BYTES + 10_000).unwrap();
        assert_eq!(shared.drawn(), 20_000);
        drop((one, two));
        assert_eq!(shared.drawn(), 0);
    }

    #[test]
    fn a_charged_frame_stays_held_until_its_last_slice_is_dropped() {
        let shared = Arc::new(RequestBudget::new(1 << 20));
        let one = ConnectionBudget::new(Arc::clone(&shared), usize::MAX);
        let bytes = OWN_REQUEST_BYTES + 50_000;
        one.hold(bytes).unwrap();
        let frame = one.charged(Bytes::from(vec![7u8; bytes - 4]), bytes);
        let name = frame.slice(10..20);
        drop(frame);
        assert_eq!(one.held(), bytes);
        assert_eq!(shared.drawn(), 50_000);
        // The connection may go; the slice still holds the bytes.
        drop(one);
        assert_eq!(shared.drawn(), 50_000);
        assert_eq!(&name[..], &[7u8; 10]);
        drop(name);
        assert_eq!(shared.drawn(), 0);
        // An answer's charge.
        let two = ConnectionBudget::new(Arc::clone(&shared), usize::MAX);
        let answer = two.charge(OWN_REQUEST_BYTES + 1_000).unwrap();
        assert_eq!(shared.drawn(), 1_000);
        drop(answer);
        assert_eq!((two.held(), shared.drawn()), (0, 0));
    }
}
