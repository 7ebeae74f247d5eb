//! Adapters that put our crates behind the workload traits the peers implement:
//! `timer_core::Timer` for W1/W2 ([`timer`]) and `purgatory::Purgatory` for W3
//! ([`purgatory`]).
//!
//! # Invariants
//! - An adapter adds no work of its own beyond a call: no lock, copy or clock read that
//!   our crates' own users would not pay.

pub mod purgatory;
pub mod timer;

pub use self::purgatory::OurPurgatory;
pub use self::timer::{ChurnTask, OriginClock, OurBareWheel, OurChurnTimer, OurLockedWheel};
