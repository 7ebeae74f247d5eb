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
//! - At most [`MAX_LIVE_PRODUCER_IDS`] ids are live; handing out one more retires one, whose
//!   producer is then refused with UNKNOWN_PRODUCER_ID and asks for a new id (what Kafka
//!   answers once a producer's state has expired, KIP-854's `producer.id.expiration.ms`).
//!   The one retired is the least recently handed out of the ids **never produced under**,
//!   and only when every live id has produced, the least recently **used** one (each
//!   produce naming an id refreshes it: [`ProducerIds::produces`]). So InitProducerId in a
//!   loop holds a bounded set and retires only ids nobody produced under (its own, first):
//!   a producer that has produced keeps its id however many ids are asked for, unless
//!   [`MAX_LIVE_PRODUCER_IDS`] other ids produced since its last produce (issue #29, review
//!   finding 2). How fast one address may take ids is bounded apart
//!   (`producer_id_quota.rs`).
//! - Only live ids may produce (see [`ProducerIds::produces`]); -1 (not idempotent) is not
//!   an id and is never refused here.
//!
//! | id state | entered by | retired |
//! |---|---|---|
//! | unproduced | [`ProducerIds::hand_out`] | first, oldest handed out first |
//! | produced | [`ProducerIds::produces`] (each call refreshes it) | only when no live id is unproduced, least recently used first |

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use parking_lot::Mutex;

/// How many producer ids are live at most (each costs about ten words here).
pub const MAX_LIVE_PRODUCER_IDS: usize = 1 << 16;

#[derive(Debug, Clone, Copy)]
struct Live {
    /// Orders the ids of one state: a smaller stamp was handed out (or used) earlier.
    stamp: u64,
    produced: bool,
}

#[derive(Debug, Default)]
struct Issued {
    /// Hashed to make the next id.
    counter: u64,
    next_stamp: u64,
    live: HashMap<i64, Live>,
    /// Live ids never produced under, by the stamp of their handing out.
    unproduced: BTreeMap<u64, i64>,
    /// Live ids produced under, by the stamp of their last produce.
    produced: BTreeMap<u64, i64>,
}

impl Issued {
    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Retires the first unproduced id, or else the least recently used produced one.
    fn retire_one(&mut self) {
        let retired = match self.unproduced.pop_first() {
            Some((_, id)) => Some(id),
            None => self.produced.pop_first().map(|(_, id)| id),
        };
        if let Some(id) = retired {
            self.live.remove(&id);
        }
    }
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
            issued: Mutex::new(Issued::default()),
        }
    }

    /// A new live id, retiring one (see the module's invariants) if `cap` are live.
    pub fn hand_out(&self) -> i64 {
        let mut issued = self.issued.lock();
        let id = loop {
            issued.counter += 1;
            let id = (self.keys.hash_one(issued.counter) >> 1) as i64;
            if id != 0 && !issued.live.contains_key(&id) {
                break id;
            }
        };
        if issued.live.len() >= self.cap {
            issued.retire_one();
        }
        let stamp = issued.stamp();
        issued.live.insert(
            id,
            Live {
                stamp,
                produced: false,
            },
        );
        issued.unproduced.insert(stamp, id);
        id
    }

    /// Whether a produce may name `id`: it was handed out and is still live. If so it
    /// counts as used now (the last to be retired).
    pub fn produces(&self, id: i64) -> bool {
        let mut issued = self.issued.lock();
        let stamp = issued.stamp();
        let Some(live) = issued.live.get_mut(&id) else {
            return false;
        };
        let before = *live;
        *live = Live {
            stamp,
            produced: true,
        };
        if before.produced {
            issued.produced.remove(&before.stamp);
        } else {
            issued.unproduced.remove(&before.stamp);
        }
        issued.produced.insert(stamp, id);
        true
    }

    /// Whether `id` was handed out and is still live (without counting it as used).
    #[cfg(test)]
    pub fn is_live(&self, id: i64) -> bool {
        self.issued.lock().live.contains_key(&id)
    }

    /// How many ids are live.
    pub fn live(&self) -> usize {
        self.issued.lock().live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

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

    #[test]
    fn ids_never_produced_under_are_retired_before_any_that_produced() {
        let ids = ProducerIds::with_cap(4);
        let good = ids.hand_out();
        assert!(ids.produces(good));
        // A flood of ids nobody produces under retires only its own.
        let flood: Vec<i64> = (0..1000).map(|_| ids.hand_out()).collect();
        assert!(ids.is_live(good));
        assert_eq!(ids.live(), 4);
        assert!(flood[..997].iter().all(|&id| !ids.is_live(id)));
        assert!(flood[997..].iter().all(|&id| ids.is_live(id)));
    }

    #[test]
    fn among_ids_that_produced_the_least_recently_used_is_retired() {
        let ids = ProducerIds::with_cap(3);
        let [a, b, c] = [ids.hand_out(), ids.hand_out(), ids.hand_out()];
        assert!(ids.produces(a) && ids.produces(b) && ids.produces(c));
        // a produces again: b is now the least recently used.
        assert!(ids.produces(a));
        let d = ids.hand_out();
        assert!(ids.is_live(a) && !ids.is_live(b) && ids.is_live(c) && ids.is_live(d));
        // d never produced: it goes before any that did.
        let e = ids.hand_out();
        assert!(!ids.is_live(d) && ids.is_live(e) && ids.is_live(a) && ids.is_live(c));
        assert!(!ids.produces(b) && !ids.produces(d));
        assert_eq!(ids.live(), 3);
    }
}
