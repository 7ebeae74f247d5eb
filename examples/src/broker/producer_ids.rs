//! The producer ids this broker handed out: unguessable, and the only ones a produce may use.
//!
//! Idempotent producers are deduplicated by producer id (`producer_sequences.rs`), so a
//! client that produces first as another client's id makes that client's first batches look
//! like retries: they are answered with the offsets of the first client's records and never
//! appended. Sequential ids made the next client's id known in advance. So:
//!
//! Invariants:
//! - An id is a keyed hash (std's SipHash, with the process's random `RandomState` keys) of
//!   a counter, masked to 63 bits: positive, never 0, and not predictable from the ids seen
//!   before without the keys. It is never one already live (drawn again on a collision).
//! - At most [`MAX_LIVE_PRODUCER_IDS`] ids are live; handing out one more retires the
//!   oldest, whose producer is then refused with UNKNOWN_PRODUCER_ID and asks for a new id
//!   (what Kafka answers once a producer's state has expired). So InitProducerId in a loop
//!   holds a bounded set, and costs the attacker's victims at most a new id.
//! - Only live ids may produce (see [`ProducerIds::is_live`]); -1 (not idempotent) is not an
//!   id and is never refused here.

use std::collections::hash_map::RandomState;
use std::collections::{HashSet, VecDeque};
use std::hash::BuildHasher;

use parking_lot::Mutex;

/// How many producer ids are live at most (each costs two words here).
pub const MAX_LIVE_PRODUCER_IDS: usize = 1 << 16;

#[derive(Debug)]
struct Issued {
    /// Hashed to make the next id.
    counter: u64,
    live: HashSet<i64>,
    /// Live ids, oldest first.
    order: VecDeque<i64>,
}

/// The live producer ids and where new ones come from.
#[derive(Debug)]
pub struct ProducerIds {
    keys: RandomState,
    cap: usize,
    issued: Mutex<Issued>,
}

impl Default for ProducerIds {
    fn default() -> Self {
        Self::with_cap(MAX_LIVE_PRODUCER_IDS)
    }
}

impl ProducerIds {
    /// An empty set that keeps at most `cap` (at least 1) ids live.
    pub fn with_cap(cap: usize) -> Self {
        Self {
            keys: RandomState::new(),
            cap: cap.max(1),
            issued: Mutex::new(Issued {
                counter: 0,
                live: HashSet::new(),
                order: VecDeque::new(),
            }),
        }
    }

    /// A new live id, retiring the oldest one if [`MAX_LIVE_PRODUCER_IDS`] are live.
    pub fn hand_out(&self) -> i64 {
        let mut issued = self.issued.lock();
        let id = loop {
            issued.counter += 1;
            let id = (self.keys.hash_one(issued.counter) >> 1) as i64;
            if id != 0 && !issued.live.contains(&id) {
                break id;
            }
        };
        if issued.order.len() == self.cap {
            if let Some(oldest) = issued.order.pop_front() {
                issued.live.remove(&oldest);
            }
        }
        issued.live.insert(id);
        issued.order.push_back(id);
        id
    }

    /// Whether `id` was handed out and is still live.
    pub fn is_live(&self, id: i64) -> bool {
        self.issued.lock().live.contains(&id)
    }

    /// How many ids are live.
    pub fn live(&self) -> usize {
        self.issued.lock().order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_positive_distinct_and_not_consecutive() {
        let ids = ProducerIds::default();
        let handed: Vec<i64> = (0..1000).map(|_| ids.hand_out()).collect();
        assert!(handed.iter().all(|&id| id > 0 && ids.is_live(id)));
        let distinct: HashSet<i64> = handed.iter().copied().collect();
        assert_eq!(distinct.len(), handed.len());
        assert!(handed.windows(2).all(|w| w[1] != w[0] + 1));
        assert!(!ids.is_live(-1) && !ids.is_live(0));
    }

    #[test]
    fn the_oldest_id_is_retired_at_the_cap() {
        let ids = ProducerIds::with_cap(3);
        let first = ids.hand_out();
        let rest: Vec<i64> = (0..3).map(|_| ids.hand_out()).collect();
        assert_eq!(ids.live(), 3);
        assert!(!ids.is_live(first));
        assert!(rest.iter().all(|&id| ids.is_live(id)));
    }
}
