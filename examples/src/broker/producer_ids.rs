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
//! - Each id belongs to the address it was handed to, an address being a network prefix
//!   (`address_prefix.rs`), and only that address may produce under it (issue #38,
//!   finding 3: every fetched batch shows its producer id, epoch and sequence, so any
//!   consumer could otherwise claim a producer's next sequences first, and the producer's
//!   own batches were then acknowledged as retries at offsets holding the claimer's
//!   records). A claim from another address is refused with UNKNOWN_PRODUCER_ID and
//!   changes nothing of the id. Kafka without ACLs takes such claims; with ACLs it
//!   checks the `IdempotentWrite` right, not who was handed the id. An address holds at most `per_address` live ids
//!   ([`MAX_IDS_PER_ADDRESS`]); at that cap a new id for it retires one of **its own**: the
//!   least recently handed out of its ids never produced under, or else its least recently
//!   used one. A retired id's producer is refused with UNKNOWN_PRODUCER_ID and asks for a
//!   new id (what Kafka answers once a producer's state has expired, KIP-854).
//! - An id neither handed out nor named by a produce for `expiration`
//!   (`--producer-id-expiration-ms`, Kafka's `producer.id.expiration.ms`) is expired: it is
//!   no longer live (dropped lazily, at the next call that looks at the oldest ids).
//! - At most `cap` ids are live ([`MAX_LIVE_PRODUCER_IDS`]). When `cap` are live and the
//!   address is under its own cap, a new id retires the least recently handed out id that
//!   nobody produced under (of any address); if every live id has produced within
//!   `expiration`, nothing is retired and the request is throttled instead
//!   ([`ProducerIds::hand_out`] returns the wait, [`FULL_THROTTLE`]). So one address can
//!   never retire an id of another address that produced (issue #29, second review,
//!   finding 2). What many addresses together can still do: `cap / per_address` (64)
//!   addresses that each hold their share of produced ids fill the table, after which new
//!   producers of every other address are throttled until ids expire, and ids handed out
//!   but not yet produced under can be retired by any address's new id. Kafka bounds this
//!   with per-user quotas on authenticated clients, which this broker does not have.
//! - A produce refreshes an id at most once per request (`produce.rs` checks each distinct
//!   id once), and only live ids may produce ([`ProducerIds::produces`]); -1 (not
//!   idempotent) is not an id and is never refused here.
//!
//! | id state | entered by | retired |
//! |---|---|---|
//! | unproduced | [`ProducerIds::hand_out`] | at its address's cap, its own first; at the global cap, oldest first; after `expiration` |
//! | produced | [`ProducerIds::produces`] (each call refreshes it) | at its address's cap once it has no unproduced id, least recently used first; after `expiration` idle |

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::address_prefix::Prefix;

/// How many producer ids are live at most (each costs about fifteen words here).
pub const MAX_LIVE_PRODUCER_IDS: usize = 1 << 16;

/// How many producer ids one address (network prefix) holds at most.
pub const MAX_IDS_PER_ADDRESS: usize = 1 << 10;

/// The throttle time of an InitProducerId refused because the table is full of ids that
/// produced recently.
pub const FULL_THROTTLE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Live {
    /// Orders the ids of one state: a smaller stamp was handed out (or used) earlier.
    stamp: u64,
    produced: bool,
    used_at: Instant,
    owner: Prefix,
}

/// The stamps of one address's live ids.
#[derive(Debug, Default)]
struct Own {
    unproduced: BTreeSet<u64>,
    produced: BTreeSet<u64>,
}

impl Own {
    fn len(&self) -> usize {
        self.unproduced.len() + self.produced.len()
    }
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
    by_owner: HashMap<Prefix, Own>,
}

impl Issued {
    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    fn insert(&mut self, id: i64, live: Live) {
        self.live.insert(id, live);
        let own = self.by_owner.entry(live.owner).or_default();
        if live.produced {
            own.produced.insert(live.stamp);
            self.produced.insert(live.stamp, id);
        } else {
            own.unproduced.insert(live.stamp);
            self.unproduced.insert(live.stamp, id);
        }
    }

    fn remove(&mut self, id: i64) -> Option<Live> {
        let live = self.live.remove(&id)?;
        let own = self.by_owner.get_mut(&live.owner)?;
        if live.produced {
            own.produced.remove(&live.stamp);
            self.produced.remove(&live.stamp);
        } else {
            own.unproduced.remove(&live.stamp);
            self.unproduced.remove(&live.stamp);
        }
        if own.len() == 0 {
            self.by_owner.remove(&live.owner);
        }
        Some(live)
    }

    /// Drops the ids unused for `expiration` at `now`: stamps follow time, so they are the
    /// first of each order.
    fn expire(&mut self, now: Instant, expiration: Duration) {
        let expired = |issued: &Self, first: Option<(&u64, &i64)>| {
            first
                .map(|(_, id)| *id)
                .filter(|id| now.saturating_duration_since(issued.live[id].used_at) >= expiration)
        };
        while let Some(id) = expired(self, self.unproduced.first_key_value())
            .or_else(|| expired(self, self.produced.first_key_value()))
        {
            self.remove(id);
        }
    }

    /// Retires `owner`'s first unproduced id, or else its least recently used one.
    fn retire_own(&mut self, owner: Prefix) {
        let Some(own) = self.by_owner.get(&owner) else {
            return;
        };
        let id = match own.unproduced.first() {
            Some(stamp) => self.unproduced[stamp],
            None => match own.produced.first() {
                Some(stamp) => self.produced[stamp],
                None => return,
            },
        };
        self.remove(id);
    }
}

/// The live producer ids and where new ones come from.
#[derive(Debug)]
pub struct ProducerIds {
    keys: RandomState,
    cap: usize,
    per_address: usize,
    expiration: Duration,
    issued: Mutex<Issued>,
}

impl ProducerIds {
    /// The broker's table: [`MAX_LIVE_PRODUCER_IDS`], [`MAX_IDS_PER_ADDRESS`], ids expiring
    /// after `expiration` unused.
    pub fn new(expiration: Duration) -> Self {
        Self::with_limits(MAX_LIVE_PRODUCER_IDS, MAX_IDS_PER_ADDRESS, expiration)
    }

    /// An empty set that keeps at most `cap` ids live, `per_address` per address (both at
    /// least 1).
    pub fn with_limits(cap: usize, per_address: usize, expiration: Duration) -> Self {
        Self {
            keys: RandomState::new(),
            cap: cap.max(1),
            per_address: per_address.max(1),
            expiration,
            issued: Mutex::new(Issued::default()),
        }
    }

    /// A new live id for a client at `ip`, retiring one (see the module's invariants) if
    /// needed; `Err(wait)` when the table is full of ids that produced recently.
    pub fn hand_out(&self, ip: IpAddr, now: Instant) -> Result<i64, Duration> {
        let owner = Prefix::of(ip);
        let mut issued = self.issued.lock();
        issued.expire(now, self.expiration);
        let own = issued.by_owner.get(&owner).map_or(0, Own::len);
        if own >= self.per_address {
            issued.retire_own(owner);
        } else if issued.live.len() >= self.cap {
            let (_, &oldest) = issued.unproduced.first_key_value().ok_or(FULL_THROTTLE)?;
            issued.remove(oldest);
        }
        let id = loop {
            issued.counter += 1;
            let id = (self.keys.hash_one(issued.counter) >> 1) as i64;
            if id != 0 && !issued.live.contains_key(&id) {
                break id;
            }
        };
        let stamp = issued.stamp();
        issued.insert(
            id,
            Live {
                stamp,
                produced: false,
                used_at: now,
                owner,
            },
        );
        Ok(id)
    }

    /// Whether a produce from a client at `ip` may name `id` at `now`: it was handed out
    /// to `ip`'s address and is still live (not expired). If so it counts as used now (the
    /// last of its address to be retired). A claim from another address changes nothing.
    pub fn produces(&self, id: i64, ip: IpAddr, now: Instant) -> bool {
        let mut issued = self.issued.lock();
        if issued
            .live
            .get(&id)
            .is_none_or(|live| live.owner != Prefix::of(ip))
        {
            return false;
        }
        let Some(live) = issued.remove(id) else {
            return false;
        };
        if now.saturating_duration_since(live.used_at) >= self.expiration {
            return false;
        }
        let stamp = issued.stamp();
        issued.insert(
            id,
            Live {
                stamp,
                produced: true,
                used_at: now.max(live.used_at),
                owner: live.owner,
            },
        );
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

    const DAY: Duration = Duration::from_secs(86_400);

    fn ip(c: u8, d: u8) -> IpAddr {
        IpAddr::from([10, 0, c, d])
    }

    #[test]
    fn ids_are_positive_distinct_and_not_consecutive() {
        let ids = ProducerIds::new(DAY);
        let now = Instant::now();
        let handed: Vec<i64> = (0..1000)
            .map(|i| ids.hand_out(ip(i as u8, 1), now).unwrap())
            .collect();
        assert!(handed.iter().all(|&id| id > 0 && ids.is_live(id)));
        let distinct: HashSet<i64> = handed.iter().copied().collect();
        assert_eq!(distinct.len(), handed.len());
        assert!(handed.windows(2).all(|w| w[1] != w[0] + 1));
        assert!(!ids.is_live(-1) && !ids.is_live(0));
    }

    #[test]
    fn at_its_cap_an_address_retires_its_own_unproduced_ids_first() {
        let ids = ProducerIds::with_limits(100, 4, DAY);
        let now = Instant::now();
        let other = ids.hand_out(ip(9, 1), now).unwrap();
        let good = ids.hand_out(ip(1, 1), now).unwrap();
        assert!(ids.produces(good, ip(1, 1), now));
        // A flood from the same /24 retires only its own, and never the one that produced.
        let flood: Vec<i64> = (0..1000)
            .map(|i| ids.hand_out(ip(1, i as u8), now).unwrap())
            .collect();
        assert!(ids.is_live(good) && ids.is_live(other));
        assert_eq!(ids.live(), 5);
        assert!(flood[..997].iter().all(|&id| !ids.is_live(id)));
        assert!(flood[997..].iter().all(|&id| ids.is_live(id)));
    }

    #[test]
    fn among_ids_of_an_address_that_produced_its_least_recently_used_is_retired() {
        let ids = ProducerIds::with_limits(100, 3, DAY);
        let now = Instant::now();
        let me = ip(1, 1);
        let [a, b, c] = [(); 3].map(|_| ids.hand_out(me, now).unwrap());
        assert!(ids.produces(a, me, now) && ids.produces(b, me, now) && ids.produces(c, me, now));
        // a produces again: b is now the least recently used.
        assert!(ids.produces(a, me, now));
        let d = ids.hand_out(me, now).unwrap();
        assert!(ids.is_live(a) && !ids.is_live(b) && ids.is_live(c) && ids.is_live(d));
        // d never produced: it goes before any that did.
        let e = ids.hand_out(me, now).unwrap();
        assert!(!ids.is_live(d) && ids.is_live(e) && ids.is_live(a) && ids.is_live(c));
        assert!(!ids.produces(b, me, now) && !ids.produces(d, me, now));
        assert_eq!(ids.live(), 3);
    }

    #[test]
    fn a_full_table_of_ids_that_produced_throttles_instead_of_retiring_another_address() {
        let ids = ProducerIds::with_limits(4, 2, Duration::from_secs(60));
        let start = Instant::now();
        let good = ids.hand_out(ip(1, 1), start).unwrap();
        assert!(ids.produces(good, ip(1, 1), start));
        // Other addresses fill the table and produce under every id, later than good.
        let later = start + Duration::from_secs(1);
        let from = [ip(2, 1), ip(2, 2), ip(3, 1)];
        let theirs: Vec<i64> = from
            .map(|from| ids.hand_out(from, later).unwrap())
            .to_vec();
        assert!(theirs
            .iter()
            .zip(from)
            .all(|(&id, from)| ids.produces(id, from, later)));
        // A new address is throttled: the least recently used id (good's) stays.
        assert_eq!(ids.hand_out(ip(4, 1), later), Err(FULL_THROTTLE));
        assert!(ids.is_live(good) && ids.produces(good, ip(1, 1), later));
        // An address at its own cap may still replace one of its own.
        let again = ids.hand_out(ip(2, 9), later).unwrap();
        assert!(ids.is_live(again) && !ids.is_live(theirs[0]) && ids.is_live(good));
        // An unproduced id of any address goes before the table throttles.
        let fresh = ids.hand_out(ip(4, 1), later);
        assert_eq!(fresh.map(|id| ids.is_live(id)), Ok(true));
        assert!(!ids.is_live(again) && ids.is_live(good));
    }

    #[test]
    fn only_the_address_an_id_was_handed_to_may_produce_under_it() {
        let ids = ProducerIds::new(DAY);
        let now = Instant::now();
        let mine = ids.hand_out(ip(1, 1), now).unwrap();
        // Another /24 (a consumer that saw the id in a fetched batch) is refused, and its
        // claim does not count as a use.
        assert!(!ids.produces(mine, ip(2, 1), now));
        assert!(!ids.produces(mine, IpAddr::from([10, 1, 1, 1]), now));
        // The same /24 is the same address.
        assert!(ids.produces(mine, ip(1, 7), now));
        assert!(ids.produces(mine, ip(1, 1), now + DAY / 2));
    }

    #[test]
    fn ids_unused_for_the_expiration_expire() {
        let expiration = Duration::from_secs(60);
        let ids = ProducerIds::with_limits(2, 2, expiration);
        let start = Instant::now();
        let [a, b] = [ip(1, 1), ip(2, 1)].map(|from| ids.hand_out(from, start).unwrap());
        assert!(ids.produces(a, ip(1, 1), start) && ids.produces(b, ip(2, 1), start));
        let soon = start + expiration / 2;
        assert!(ids.produces(b, ip(2, 1), soon));
        assert_eq!(ids.hand_out(ip(3, 1), soon), Err(FULL_THROTTLE));
        // a is idle for the whole expiration: it may no longer produce, and makes room.
        let expired = start + expiration;
        let c = ids.hand_out(ip(3, 1), expired).unwrap();
        assert!(!ids.is_live(a) && !ids.produces(a, ip(1, 1), expired));
        assert!(ids.produces(b, ip(2, 1), expired) && ids.produces(c, ip(3, 1), expired));
        // An id past its expiration is refused even before anything cleans it away.
        let idle = expired + expiration;
        assert!(!ids.produces(c, ip(3, 1), idle));
    }
}
