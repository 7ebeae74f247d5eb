//! Which client connections may be open: the broker-wide cap, the cap per address, and
//! the eviction of an idle connection when the broker-wide cap is reached.
//!
//! An *address* here is a network prefix (`address_prefix.rs`): an IPv4 /24 or an IPv6 /64
//! (loopback addresses each their own), so a client does not multiply its share by using
//! many addresses of its own network (issue #29, second review, finding 3).
//!
//! A connection is *idle* while it waits for the first byte of its next request (no request
//! is being read, handled, waiting in a purgatory or answered), and also while a request it
//! started is not whole a second after it began (`stalled_read.rs`: a client holding
//! connections with a byte of a frame each, or trickling its requests, is not busy). Kafka
//! closes the least recently used idle connections when it runs out of room; here, at the
//! broker-wide cap, a new connection takes the place of an idle connection **of the
//! address that holds the most connections** (its own address included), so a client that
//! opens thousands of idle connections loses its own first, and a fresh client always gets
//! in as long as any connection is idle. Among the idle connections of such addresses
//! (issue #38, finding 6), a *stranger's* (a connection none of whose requests was
//! handled yet) goes before an established client's, and then the least recently active
//! first, whatever the addresses' order: a newcomer that sends nothing, or trickles, takes
//! a stranger's place, not a producer's between two of its requests (before, ties between
//! addresses went to the largest address). The price: while clients of many addresses
//! flood the broker with connections, an honest newcomer is a stranger too until its
//! first request is handled, and may lose its place before it is read (it connects
//! again); established clients keep theirs. But a newcomer never evicts a connection of an
//! address holding fewer connections than its own (issue #29, review finding 4): it is
//! refused instead, so a client whose own connections are kept busy (a byte of a frame
//! each) cannot push out the idle connections of smaller clients. Likewise at the cap of
//! its address (`max_connections_per_ip`, Kafka's `max.connections.per.ip`, where Kafka
//! refuses) a new connection takes the place of that address's least recently active idle
//! connection.
//!
//! | connection state | entered by | may be evicted |
//! |---|---|---|
//! | busy | [`Admission::admit`], [`Slot::busy`] | no |
//! | idle | [`Slot::idle`], [`Slot::stalled`], [`Slot::long_poll`] | yes: by a newcomer at the broker-wide cap whose address holds no more connections than its own (strangers' first, [`Slot::served`] making a connection established; then the least recently active), or by one of its own address at the address's cap (the least recently active) |
//! | evicted | a newcomer's [`Admission::admit`] | no longer counted; [`Slot::evicted`] fires and its task closes the socket |
//!
//! Invariants:
//! - The table counts at most `max_connections` connections, and at most
//!   `max_connections_per_ip` from one IP address. A connection over the address's cap
//!   when none of that address's connections is idle is refused ([`Refused::PerIp`]), one
//!   over the broker-wide cap when no address holding at least as many connections as the
//!   newcomer's has an idle one ([`Refused::Full`]); a refusal evicts nothing.
//! - An eviction at the broker-wide cap takes from an address holding at least as many
//!   connections as the newcomer's (before it is counted), never from a smaller one.
//! - An evicted connection leaves the count at once; its descriptor closes as soon as its
//!   task runs (it is idle: nothing of it is waiting), so descriptors exceed the cap only by
//!   the evictions whose task has not run yet.
//! - A connection becoming busy and its eviction are decided under the same lock: once
//!   [`Slot::busy`] returned true its request is never cut by an eviction; if it returns
//!   false the connection was evicted and must close.
//! - A connection whose request is a long poll (a Fetch) that has waited a second or more
//!   is evictable like an idle one ([`Slot::long_poll`]): a long poll is not a claim on a
//!   place, so clients of many prefixes re-sending fetches that cannot complete do not
//!   keep newcomers out (issue #29, second review, finding 3). Evicted, its fetch is
//!   cancelled (as when a client leaves) and the connection closed; a consumer reconnects
//!   and polls again.
//! - Every operation costs O(log n) in the open connections: idle connections are kept per
//!   address in eviction order (strangers first, then last activity), and the addresses
//!   with an idle connection in order of their connection count, then of their first idle
//!   connection. A connection is told [`Slot::served`] once, at its first answer.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::address_prefix::Prefix;

/// The connection table of one broker.
#[derive(Debug)]
pub struct Admission {
    max_connections: usize,
    max_per_ip: usize,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    /// Orders idle periods: a smaller stamp went idle earlier.
    next_stamp: u64,
    open: usize,
    evicted: u64,
    connections: HashMap<u64, Entry>,
    addresses: HashMap<Prefix, Address>,
    /// Every address with an idle connection, by its open connections, then by its
    /// first idle connection's [`IdleKey`] (reversed: the last element is the address
    /// with the most connections and, among those, the stranger or else the least
    /// recently active connection).
    with_idle: BTreeSet<(usize, Reverse<IdleKey>, Prefix)>,
}

/// Orders idle connections for eviction: connections never answered (strangers) before
/// established ones, then the least recently active first (the stamp of its idle
/// period).
type IdleKey = (bool, u64);

#[derive(Debug)]
struct Entry {
    ip: Prefix,
    /// Its key among its address's idle connections, while idle.
    idle: Option<IdleKey>,
    /// One of its requests was answered ([`Slot::served`]).
    served: bool,
    evicted: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Address {
    open: usize,
    /// Idle connections in broker-wide eviction order ([`IdleKey`]).
    idle: BTreeMap<IdleKey, u64>,
    /// The same, least recently active first whether strangers or not: the order in
    /// which an address at its own cap loses its connections.
    by_stamp: BTreeMap<u64, u64>,
}

impl Address {
    fn add_idle(&mut self, key: IdleKey, id: u64) {
        self.idle.insert(key, id);
        self.by_stamp.insert(key.1, id);
    }

    fn remove_idle(&mut self, key: IdleKey) {
        self.idle.remove(&key);
        self.by_stamp.remove(&key.1);
    }

    /// Its entry in [`Table::with_idle`], if it has an idle connection.
    fn key(&self, ip: Prefix) -> Option<(usize, Reverse<IdleKey>, Prefix)> {
        let (&first, _) = self.idle.first_key_value()?;
        Some((self.open, Reverse(first), ip))
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its address holds `max_connections_per_ip` connections already, none idle.
    PerIp,
    /// `max_connections` are open and no address holding at least as many connections as
    /// the newcomer's has an idle one.
    Full,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::PerIp => write!(f, "the --max-connections-per-ip cap, none idle"),
            Refused::Full => write!(
                f,
                "the --max-connections cap, no idle connection of an address holding as many as its own"
            ),
        }
    }
}

/// An admitted connection's place in the table; dropping it frees the place.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    id: u64,
    evicted: Arc<Notify>,
}

impl Admission {
    /// A table of at most `max_connections` connections, `max_per_ip` per address (both at
    /// least 1).
    pub fn new(max_connections: usize, max_per_ip: usize) -> Self {
        Self {
            max_connections: max_connections.max(1),
            max_per_ip: max_per_ip.max(1),
            table: Mutex::new(Table::default()),
        }
    }

    /// Admits a connection from `ip` (busy: its first request is awaited by its task),
    /// evicting an idle connection of the same address at its cap, or one of the largest
    /// address at the broker-wide cap if that holds at least as many as `ip`.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refused> {
        let ip = Prefix::of(ip);
        let mut table = self.table.lock();
        let from_ip = table.addresses.get(&ip).map_or(0, |a| a.open);
        if from_ip >= self.max_per_ip {
            table.evict_least_recent_of(ip).ok_or(Refused::PerIp)?;
        } else if table.open >= self.max_connections {
            table.evict_one(from_ip).ok_or(Refused::Full)?;
        }
        let id = table.next_id;
        table.next_id += 1;
        let evicted = Arc::new(Notify::new());
        table.connections.insert(
            id,
            Entry {
                ip,
                idle: None,
                served: false,
                evicted: Arc::clone(&evicted),
            },
        );
        table.open += 1;
        table.change_address(ip, |address| address.open += 1);
        Ok(Slot {
            admission: Arc::clone(self),
            id,
            evicted,
        })
    }

    /// Connections evicted so far to make room for new ones.
    pub fn evicted(&self) -> u64 {
        self.table.lock().evicted
    }
}

impl Table {
    /// Evicts the least recently active idle connection of the address with the most
    /// connections; `None` if no connection is idle, or if that address holds fewer than
    /// `at_least` connections.
    fn evict_one(&mut self, at_least: usize) -> Option<()> {
        let &(open, _, ip) = self.with_idle.last()?;
        if open < at_least {
            return None;
        }
        let (_, &id) = self.addresses.get(&ip)?.idle.first_key_value()?;
        self.evict(ip, id)
    }

    /// Evicts the least recently active idle connection of `ip`, stranger's or not (an
    /// address at its own cap makes room among its own: strangers first would have a
    /// pool opening connections at once evict each new one before its first request);
    /// `None` if it has none.
    fn evict_least_recent_of(&mut self, ip: Prefix) -> Option<()> {
        let (_, &id) = self.addresses.get(&ip)?.by_stamp.first_key_value()?;
        self.evict(ip, id)
    }

    /// Evicts the idle connection `id` of `ip`.
    fn evict(&mut self, ip: Prefix, id: u64) -> Option<()> {
        let entry = self.connections.remove(&id)?;
        let key = entry.idle;
        self.open -= 1;
        self.evicted += 1;
        self.change_address(ip, |address| {
            address.open -= 1;
            if let Some(key) = key {
                address.remove_idle(key);
            }
        });
        entry.evicted.notify_one();
        Some(())
    }

    /// Applies `change` to the address `ip`, keeping `with_idle` in step and dropping an
    /// address that holds no connection any more.
    fn change_address(&mut self, ip: Prefix, change: impl FnOnce(&mut Address)) {
        let address = self.addresses.entry(ip).or_default();
        if let Some(key) = address.key(ip) {
            self.with_idle.remove(&key);
        }
        change(address);
        if let Some(key) = address.key(ip) {
            self.with_idle.insert(key);
        }
        if address.open == 0 {
            self.addresses.remove(&ip);
        }
    }
}

impl Slot {
    /// The connection waits for its next request: it may be evicted from now on.
    pub fn idle(&self) {
        self.evictable();
    }

    /// The request being read sent nothing for a while: the connection may be evicted
    /// from now on, as an idle one, until [`Slot::busy`].
    pub fn stalled(&self) {
        self.evictable();
    }

    /// The request being handled is a long poll that has waited a while: the connection
    /// may be evicted from now on, as an idle one (its waiting fetch is then cancelled),
    /// until [`Slot::busy`] at its next request.
    pub fn long_poll(&self) {
        self.evictable();
    }

    fn evictable(&self) {
        let mut table = self.admission.table.lock();
        let stamp = table.next_stamp;
        let Some(entry) = table.connections.get_mut(&self.id) else {
            return;
        };
        if entry.idle.is_some() {
            return;
        }
        let key = (entry.served, stamp);
        entry.idle = Some(key);
        let ip = entry.ip;
        table.next_stamp += 1;
        let id = self.id;
        table.change_address(ip, |address| {
            address.add_idle(key, id);
        });
    }

    /// One of its requests was handled (answered, or an acks=0 produce taken): from now
    /// on it is an established client's connection, evicted at the broker-wide cap after
    /// every idle stranger's of its address and of any address holding as many
    /// connections (issue #38, finding 6).
    pub fn served(&self) {
        let mut table = self.admission.table.lock();
        let Some(entry) = table.connections.get_mut(&self.id) else {
            return;
        };
        if entry.served {
            return;
        }
        entry.served = true;
        // A long poll answered while evictable: its place in the order moves.
        if let Some(old) = entry.idle {
            let new = (true, old.1);
            entry.idle = Some(new);
            let (ip, id) = (entry.ip, self.id);
            table.change_address(ip, |address| {
                address.remove_idle(old);
                address.add_idle(new, id);
            });
        }
    }

    /// A request starts: the connection may no longer be evicted. False if it was evicted
    /// already (then it must close).
    pub fn busy(&self) -> bool {
        let mut table = self.admission.table.lock();
        let Some(entry) = table.connections.get_mut(&self.id) else {
            return false;
        };
        if let Some(key) = entry.idle.take() {
            let ip = entry.ip;
            table.change_address(ip, |address| {
                address.remove_idle(key);
            });
        }
        true
    }

    /// Resolves once the connection is evicted (never otherwise). Cancel-safe: an
    /// eviction is not lost if this is dropped and called again.
    pub async fn evicted(&self) {
        self.evicted.notified().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.admission.table.lock();
        let Some(entry) = table.connections.remove(&self.id) else {
            return; // Evicted: no longer counted.
        };
        table.open -= 1;
        let key = entry.idle;
        table.change_address(entry.ip, |address| {
            address.open -= 1;
            if let Some(key) = key {
                address.remove_idle(key);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn evicted_now(slot: &Slot) -> bool {
        // An eviction leaves a permit: the future is ready at its first poll.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let future = std::pin::pin!(slot.evicted());
        future.poll(&mut cx).is_ready()
    }

    use std::future::Future;

    #[test]
    fn at_the_per_address_cap_the_address_loses_its_own_idle_connection_or_is_refused() {
        let admission = Arc::new(Admission::new(10, 2));
        let a: Vec<Slot> = (0..2).map(|_| admission.admit(ip(1)).unwrap()).collect();
        let other = admission.admit(ip(2)).unwrap();
        other.idle();
        // Both busy: refused, and nothing of another address is touched.
        assert_eq!(admission.admit(ip(1)).unwrap_err(), Refused::PerIp);
        assert_eq!(admission.evicted(), 0);
        // One idle: it makes room for the newcomer of its own address.
        a[1].idle();
        let fresh = admission.admit(ip(1)).unwrap();
        assert!(evicted_now(&a[1]) && !evicted_now(&a[0]) && !evicted_now(&other));
        assert_eq!(admission.evicted(), 1);
        drop(a);
        drop(fresh);
        assert!(admission.admit(ip(1)).is_ok());
    }

    #[test]
    fn at_the_cap_the_oldest_idle_connection_of_the_largest_address_makes_room() {
        let admission = Arc::new(Admission::new(4, 10));
        let other = admission.admit(ip(2)).unwrap();
        other.idle();
        let flood: Vec<Slot> = (0..3).map(|_| admission.admit(ip(1)).unwrap()).collect();
        flood.iter().for_each(Slot::idle);
        // The first of the flood becomes active again: the second is the oldest idle.
        assert!(flood[0].busy());
        flood[0].idle();
        let fresh = admission.admit(ip(3)).unwrap();
        assert!(evicted_now(&flood[1]) && !flood[1].busy());
        assert!(!evicted_now(&flood[0]) && !evicted_now(&flood[2]) && !evicted_now(&other));
        assert_eq!(admission.evicted(), 1);
        // Busy connections are never evicted: with none idle, a newcomer is refused.
        for slot in [&other, &flood[0], &flood[2], &fresh] {
            assert!(slot.busy());
        }
        assert_eq!(admission.admit(ip(4)).unwrap_err(), Refused::Full);
        drop(flood);
        assert!(admission.admit(ip(4)).is_ok());
    }

    #[test]
    fn at_the_cap_a_newcomer_never_evicts_an_address_smaller_than_its_own() {
        let admission = Arc::new(Admission::new(6, 10));
        // A small client (2 connections) served, then idle.
        let small: Vec<Slot> = (0..2).map(|_| admission.admit(ip(2)).unwrap()).collect();
        small.iter().for_each(Slot::idle);
        // A larger one keeps its 4 connections busy (a byte of a frame each).
        let big: Vec<Slot> = (0..4).map(|_| admission.admit(ip(1)).unwrap()).collect();
        // Its fifth is refused: the only idle connections are of a smaller address.
        assert_eq!(admission.admit(ip(1)).unwrap_err(), Refused::Full);
        assert_eq!(admission.evicted(), 0);
        assert!(small.iter().all(|slot| !evicted_now(slot)));
        // A fresh address (none open) may take an idle place, and so may an equal one.
        let fresh = admission.admit(ip(3)).unwrap();
        assert!(evicted_now(&small[0]) && !evicted_now(&small[1]));
        fresh.idle();
        let second = admission.admit(ip(3)).unwrap();
        assert_eq!(admission.evicted(), 2);
        // Once the big address has an idle connection, it goes first, even for itself.
        big[3].idle();
        let again = admission.admit(ip(1)).unwrap();
        assert!(evicted_now(&big[3]));
        drop((big, small, second, again));
    }

    fn lan(c: u8, d: u8) -> IpAddr {
        IpAddr::from([10, 0, c, d])
    }

    #[test]
    fn addresses_of_one_prefix_share_its_caps_and_never_evict_a_smaller_prefix() {
        // The per-address cap counts a /24 (and a /64) as one address.
        let per_ip = Arc::new(Admission::new(10, 2));
        let two: Vec<Slot> = (1..=2).map(|d| per_ip.admit(lan(0, d)).unwrap()).collect();
        assert_eq!(per_ip.admit(lan(0, 3)).unwrap_err(), Refused::PerIp);
        let v6 = |last: u16| IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, last]);
        let six: Vec<Slot> = (1..=2).map(|n| per_ip.admit(v6(n)).unwrap()).collect();
        assert_eq!(per_ip.admit(v6(0xffff)).unwrap_err(), Refused::PerIp);
        assert!(per_ip.admit(lan(1, 1)).is_ok());
        drop((two, six));

        let admission = Arc::new(Admission::new(5, 4));
        // A client of 10.0.0.0/24 from three addresses, busy; one of a /64 from two, idle.
        let spread: Vec<Slot> = (1..=3).map(|d| admission.admit(lan(0, d)).unwrap()).collect();
        let wide: Vec<Slot> = (1..=2).map(|n| admission.admit(v6(n)).unwrap()).collect();
        wide.iter().for_each(Slot::idle);
        // At the broker-wide cap a newcomer of the /24 (3 open) evicts nothing of the /64
        // (2 open), even from an address of the /24 it never used.
        assert_eq!(admission.admit(lan(0, 9)).unwrap_err(), Refused::Full);
        assert_eq!(admission.evicted(), 0);
        spread[0].idle();
        let replaced = admission.admit(lan(0, 200)).unwrap();
        assert!(evicted_now(&spread[0]) && wide.iter().all(|slot| !evicted_now(slot)));
        drop((spread, wide, replaced));
    }

    #[test]
    fn among_equal_addresses_strangers_go_first_then_the_least_recently_active() {
        let admission = Arc::new(Admission::new(4, 4));
        // Established clients (answered once) of two addresses, the larger one idle later.
        let early = admission.admit(ip(2)).unwrap();
        early.served();
        early.idle();
        let late = admission.admit(ip(9)).unwrap();
        late.served();
        late.idle();
        // Strangers (never answered) of two more addresses, idle after both.
        let strangers: Vec<Slot> = [3, 4].map(|last| admission.admit(ip(last)).unwrap()).into();
        strangers.iter().for_each(Slot::idle);
        // Newcomers take the strangers' places first, least recently active first...
        let a = admission.admit(ip(5)).unwrap();
        assert!(evicted_now(&strangers[0]));
        let b = admission.admit(ip(6)).unwrap();
        assert!(evicted_now(&strangers[1]));
        assert!(!evicted_now(&early) && !evicted_now(&late));
        // ...then the established connection idle longest, not the largest address's.
        a.busy();
        b.busy();
        let c = admission.admit(ip(7)).unwrap();
        assert!(evicted_now(&early) && !evicted_now(&late));
        drop((a, b, c, late));
    }

    #[test]
    fn at_its_own_cap_an_address_loses_its_least_recently_active_connection_stranger_or_not() {
        let admission = Arc::new(Admission::new(10, 2));
        // A pool: an established connection idle for a while, and one just opened.
        let old = admission.admit(ip(1)).unwrap();
        old.served();
        old.idle();
        let new = admission.admit(ip(1)).unwrap();
        new.idle();
        // Its third takes the older place, not the one about to send its first request.
        let third = admission.admit(ip(1)).unwrap();
        assert!(evicted_now(&old) && !evicted_now(&new));
        drop((new, third));
    }

    #[test]
    fn a_connection_answered_while_idle_moves_behind_the_strangers() {
        let admission = Arc::new(Admission::new(2, 2));
        let poll = admission.admit(ip(1)).unwrap();
        poll.long_poll();
        let stranger = admission.admit(ip(2)).unwrap();
        stranger.idle();
        // The long poll was idle first, but is answered now: the stranger goes first.
        poll.served();
        let newcomer = admission.admit(ip(3)).unwrap();
        assert!(evicted_now(&stranger) && !evicted_now(&poll));
        drop((poll, newcomer));
    }

    #[test]
    fn dropping_every_slot_empties_the_table() {
        let admission = Arc::new(Admission::new(3, 3));
        let slots: Vec<Slot> = (0..3).map(|i| admission.admit(ip(i)).unwrap()).collect();
        slots[1].idle();
        let _fresh = admission.admit(ip(9)).unwrap();
        drop(slots);
        drop(_fresh);
        let table = admission.table.lock();
        assert_eq!(table.open, 0);
        assert!(table.connections.is_empty() && table.addresses.is_empty());
        assert!(table.with_idle.is_empty());
    }
}
