//! The W3 operation and the run-wide context it reports to.
//!
//! # Invariants
//! - A [`LoadOp`] is 24 bytes: a request id, the instant it was issued, and a reference
//!   to the run's [`LoadContext`], so the purgatories store no more than a real request
//!   handle would need.
//! - `try_complete` is true only in W3-events, once the completer has marked the request
//!   ready; in plain W3 completions are forced.
//! - `on_complete` counts each operation exactly once, as completed or as expired, and
//!   records an expiry's lateness: the instant it completed minus (issue instant +
//!   timeout). The issue instant is read before the watch, so lateness is never
//!   under-reported.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation};

use crate::harness::histogram::Histogram;

#[repr(align(128))]
#[derive(Debug, Default)]
struct PaddedCounter(AtomicU64);

/// Shared by every operation of one run.
#[derive(Debug)]
pub struct LoadContext {
    origin: Instant,
    timeout: Duration,
    timeout_nanos: u64,
    events: bool,
    ready: Box<[AtomicBool]>,
    completed: PaddedCounter,
    expired: PaddedCounter,
    lateness: Histogram,
}

impl LoadContext {
    /// A context for `num` requests; `events` selects W3-events (ready flags).
    pub fn new(num: usize, timeout: Duration, events: bool) -> Self {
        let flags = if events { num } else { 0 };
        LoadContext {
            origin: Instant::now(),
            timeout,
            timeout_nanos: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            events,
            ready: (0..flags).map(|_| AtomicBool::new(false)).collect(),
            completed: PaddedCounter::default(),
            expired: PaddedCounter::default(),
            lateness: Histogram::new(),
        }
    }

    /// Nanoseconds since the run's origin.
    #[inline]
    pub fn now_nanos(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The run's origin.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// Marks request `id` ready (W3-events).
    #[inline]
    pub fn mark_ready(&self, id: u32) {
        if let Some(flag) = self.ready.get(id as usize) {
            flag.store(true, Ordering::Release);
        }
    }

    /// Operations completed by an event or forced.
    pub fn completed(&self) -> u64 {
        self.completed.0.load(Ordering::Relaxed)
    }

    /// Operations completed by their timeout.
    pub fn expired(&self) -> u64 {
        self.expired.0.load(Ordering::Relaxed)
    }

    /// Lateness of expirations, in nanoseconds.
    pub fn lateness(&self) -> &Histogram {
        &self.lateness
    }
}

/// One W3 request.
#[derive(Debug)]
pub struct LoadOp {
    ctx: &'static LoadContext,
    issued_nanos: u64,
    id: u32,
}

impl LoadOp {
    /// Request `id`, issued at `issued_nanos` on the context's clock.
    #[inline]
    pub fn new(ctx: &'static LoadContext, id: u32, issued_nanos: u64) -> Self {
        LoadOp {
            ctx,
            issued_nanos,
            id,
        }
    }

    /// The instant its timeout falls due, in ns on the context's clock.
    #[inline]
    pub fn due_nanos(&self) -> u64 {
        self.issued_nanos.saturating_add(self.ctx.timeout_nanos)
    }

    /// The run's context.
    #[inline]
    pub fn context(&self) -> &'static LoadContext {
        self.ctx
    }
}

impl DelayedOperation for LoadOp {
    fn timeout(&self) -> Duration {
        self.ctx.timeout
    }

    #[inline]
    fn try_complete(&mut self) -> bool {
        self.ctx.events
            && self
                .ctx
                .ready
                .get(self.id as usize)
                .is_some_and(|f| f.load(Ordering::Acquire))
    }

    fn on_complete(&mut self, how: Completion) {
        match how {
            Completion::Expired => {
                let deadline = self.issued_nanos.saturating_add(self.ctx.timeout_nanos);
                let late = self.ctx.now_nanos() as i64 - deadline as i64;
                self.ctx.lateness.record(late);
                self.ctx.expired.0.fetch_add(1, Ordering::Relaxed);
            }
            // The tool shuts a target down after its run: what it still held counts as
            // expired, with no lateness (its deadline had not passed).
            Completion::Shutdown => {
                self.ctx.expired.0.fetch_add(1, Ordering::Relaxed);
            }
            Completion::Ready | Completion::Forced => {
                self.ctx.completed.0.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_is_small_and_counts_once_per_completion() {
        assert_eq!(std::mem::size_of::<LoadOp>(), 24);
        let ctx: &'static LoadContext =
            Box::leak(Box::new(LoadContext::new(4, Duration::ZERO, true)));
        let mut a = LoadOp::new(ctx, 1, 0);
        assert!(!a.try_complete());
        ctx.mark_ready(1);
        assert!(a.try_complete());
        a.on_complete(Completion::Ready);
        LoadOp::new(ctx, 2, 0).on_complete(Completion::Expired);
        assert_eq!((ctx.completed(), ctx.expired()), (1, 1));
        assert!(ctx.lateness().min().unwrap() >= 0);
    }
}
