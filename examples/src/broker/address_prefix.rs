//! The unit per-address limits count in: a client's network prefix rather than its exact
//! address, since one host may hold many addresses (a whole IPv6 /64 is routinely one
//! machine's, and a /24 of IPv4 addresses is cheap to rent).
//!
//! Invariants:
//! - IPv4 addresses group by /24, IPv6 addresses by /64; an IPv4-mapped IPv6 address
//!   (`::ffff:a.b.c.d`) groups as its IPv4 address.
//! - Loopback addresses (127.0.0.0/8, `::1`) are each their own prefix: they are only
//!   reachable from the broker's own host, whose users could open connections without any
//!   limit anyway, and tests use 127.0.0.x addresses as distinct clients.
//! - Two addresses are in the same prefix exactly when [`Prefix::of`] gives equal values.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A client's network prefix: what per-address limits count (`admission.rs`,
/// `producer_id_quota.rs`, `producer_ids.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix(IpAddr);

impl Prefix {
    /// The prefix `ip` belongs to.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::of_v4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::of_v4(v4),
                None if v6.is_loopback() => Prefix(ip),
                None => {
                    let mask = !0u128 << 64;
                    Prefix(IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask)))
                }
            },
        }
    }

    fn of_v4(v4: Ipv4Addr) -> Self {
        if v4.is_loopback() {
            return Prefix(IpAddr::V4(v4));
        }
        let [a, b, c, _] = v4.octets();
        Prefix(IpAddr::V4(Ipv4Addr::new(a, b, c, 0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(text: &str) -> Prefix {
        Prefix::of(text.parse().unwrap())
    }

    #[test]
    fn ipv4_groups_by_24_and_ipv6_by_64_but_loopback_stays_exact() {
        assert_eq!(of("10.1.2.3"), of("10.1.2.200"));
        assert_ne!(of("10.1.2.3"), of("10.1.3.3"));
        assert_eq!(of("2001:db8:1:2::1"), of("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_ne!(of("2001:db8:1:2::1"), of("2001:db8:1:3::1"));
        assert_eq!(of("::ffff:10.1.2.3"), of("10.1.2.9"));
        assert_ne!(of("127.0.0.2"), of("127.0.0.3"));
        assert_ne!(of("::1"), of("::2"));
    }
}
