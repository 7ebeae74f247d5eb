//! Adapters that put our crates behind the workload traits the peers implement:
//! `timer_core::Timer` for W1/W2 ([`timer`]) and `purgatory::Purgatory` for W3
//! ([`purgatory`]). They add no work of their own beyond a call.

pub mod purgatory;
pub mod timer;

pub use self::purgatory::OurPurgatory;
pub use self::timer::{ChurnTask, OriginClock, OurBareWheel, OurChurnTimer, OurLockedWheel};
