//! How fast one address may take producer ids: a token bucket per address, as Kafka's
//! `producer_ids_rate` quota (KIP-936) bounds the new producer ids of one client (per user
//! there; per address here, where clients are not authenticated). An address is a network
//! prefix (`address_prefix.rs`: IPv4 /24, IPv6 /64, loopback addresses each their own).
//!
//! Without it one client could ask for ids as fast as it can send InitProducerId (65,536
//! in 0.87 s in the review of issue #29, finding 2). What protects the ids of other
//! producers is not this rate but `producer_ids.rs`: an address retires only its own ids,
//! and a full table throttles new ids rather than retire one that produced within
//! `--producer-id-expiration-ms`. This rate bounds how fast an address churns its own ids
//! and how fast many addresses together fill the table.
//!
//! Invariants:
//! - An address holds at most [`BURST`] tokens and gains [`RATE`] a second; each id handed
//!   to it takes one. Without a token the request is refused (`init_producer_id.rs`
//!   answers THROTTLING_QUOTA_EXCEEDED with the time until the next token as its throttle
//!   time, as Kafka's quotas do), and nothing is taken.
//! - An address absent from the table has a full bucket; the table drops full buckets once
//!   it holds more than twice as many addresses as after its last cleaning (at least
//!   [`CLEAN_ABOVE`]), so it holds about the addresses that took ids in the last
//!   `BURST / RATE` seconds, and cleaning costs O(1) amortized per request.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::address_prefix::Prefix;

/// Ids one address may take at once.
pub const BURST: f64 = 256.0;

/// Ids one address may take per second, on average.
pub const RATE: f64 = 32.0;

/// Addresses the table holds before its first cleaning.
const CLEAN_ABOVE: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// The tokens at `now`, refilled since `at`.
    fn tokens_at(&self, now: Instant) -> f64 {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() * RATE;
        (self.tokens + gained).min(BURST)
    }
}

#[derive(Debug)]
struct Buckets {
    by_address: HashMap<Prefix, Bucket>,
    clean_above: usize,
}

/// The buckets of every address that took ids lately.
#[derive(Debug)]
pub struct ProducerIdQuota {
    buckets: Mutex<Buckets>,
}

impl Default for ProducerIdQuota {
    fn default() -> Self {
        Self {
            buckets: Mutex::new(Buckets {
                by_address: HashMap::new(),
                clean_above: CLEAN_ABOVE,
            }),
        }
    }
}

impl ProducerIdQuota {
    /// Takes a token of `ip` at `now`; `Err(wait)` when it has none, `wait` being the time
    /// until it has one again.
    pub fn take(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let ip = Prefix::of(ip);
        let mut buckets = self.buckets.lock();
        if buckets.by_address.len() > buckets.clean_above {
            buckets
                .by_address
                .retain(|_, bucket| bucket.tokens_at(now) < BURST);
            buckets.clean_above = (2 * buckets.by_address.len()).max(CLEAN_ABOVE);
        }
        let bucket = buckets.by_address.entry(ip).or_insert(Bucket {
            tokens: BURST,
            at: now,
        });
        let tokens = bucket.tokens_at(now);
        if tokens < 1.0 {
            return Err(Duration::from_secs_f64((1.0 - tokens) / RATE));
        }
        *bucket = Bucket {
            tokens: tokens - 1.0,
            at: now,
        };
        Ok(())
    }

    /// Addresses in the table.
    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.buckets.lock().by_address.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(a: u8, b: u8) -> IpAddr {
        IpAddr::from([127, 0, a, b])
    }

    #[test]
    fn an_address_takes_its_burst_then_one_token_per_refill() {
        let quota = ProducerIdQuota::default();
        let start = Instant::now();
        for _ in 0..BURST as usize {
            assert!(quota.take(ip(0, 1), start).is_ok());
        }
        let wait = quota.take(ip(0, 1), start).unwrap_err();
        assert_eq!(wait, Duration::from_secs_f64(1.0 / RATE));
        // Another address is not touched.
        assert!(quota.take(ip(0, 2), start).is_ok());
        // After the wait, exactly one more.
        let later = start + wait;
        assert!(quota.take(ip(0, 1), later).is_ok());
        assert!(quota.take(ip(0, 1), later).is_err());
    }

    #[test]
    fn addresses_of_one_prefix_share_a_bucket() {
        let quota = ProducerIdQuota::default();
        let start = Instant::now();
        let lan = |d: u8| IpAddr::from([10, 0, 0, d]);
        for i in 0..BURST as usize {
            assert!(quota.take(lan(i as u8), start).is_ok());
        }
        // Another address of 10.0.0.0/24 has no token left; another /24 has its own.
        assert!(quota.take(lan(255), start).is_err());
        assert!(quota.take(IpAddr::from([10, 0, 1, 1]), start).is_ok());
    }

    #[test]
    fn full_buckets_are_dropped_so_the_table_stays_bounded() {
        let quota = ProducerIdQuota::default();
        let start = Instant::now();
        for a in 0..20u8 {
            for b in 0..=255u8 {
                assert!(quota.take(ip(a, b), start).is_ok());
            }
        }
        let refilled = start + Duration::from_secs_f64(2.0 / RATE);
        for a in 20..40u8 {
            for b in 0..=255u8 {
                assert!(quota.take(ip(a, b), refilled).is_ok());
            }
        }
        // The first 5,120 addresses were full again and dropped at a cleaning (all 10,240
        // would be held without it).
        assert!(quota.addresses() < 8_000, "{}", quota.addresses());
    }
}
