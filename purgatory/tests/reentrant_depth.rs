//! Re-entrant completions: an `on_complete` that watches a new operation, which completes
//! at once, whose `on_complete` watches the next, 1,000 deep. Each level is a watch inside
//! a callback inside a watch: the stack it costs is what a deep chain of them can afford.
//!
//! A release build runs 1,000 levels on a 1 MiB thread, and a level may take at most
//! [`MOST_A_LEVEL`] bytes: 768 in release, which leaves a quarter of the thread. It
//! measured 480 for this 80-byte operation (464-528 with the features `metrics` or
//! `tokio`): `Purgatory::watch` and step 6 of a single watch are inlined into this
//! `on_complete`, which keeps the operation in one place; 656-720 where the compiler
//! keeps `Purgatory::watch` out of line (it is a hint). Before: 1,344 (1,000 levels
//! overflowed 1 MiB), 816 at `be621d8`, 2,480 before the single watch returned from its
//! locked steps before running callbacks. A debug build keeps more on the stack, so
//! there the chain runs on an 8 MiB thread and a level may take 3,072 bytes (it measured
//! 2,640-2,704; 3,504 before, 12.3 KB before #20). The bound is checked on a short chain
//! first, so a level that grew fails with its figure here rather than as an overflow of
//! the long one. `docs/benchmarks.md` keeps the figures:
//!
//! ```text
//! cargo test --release -p kafka-purgatory --test reentrant_depth -- --nocapture
//! ```

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use purgatory::{Completion, DelayedOperation, Purgatory};

/// The stack a level may take, in bytes (see the module doc).
const MOST_A_LEVEL: usize = if cfg!(debug_assertions) { 3_072 } else { 768 };

/// Completes at once; its `on_complete` watches the next level, until `depth` levels.
struct Level {
    depth: usize,
    limit: usize,
    purgatory: Purgatory<u32, Level>,
    reached: Arc<AtomicUsize>,
    /// The address of a local of level 1's `on_complete`, and the deepest one's.
    top: Arc<AtomicUsize>,
    bottom: Arc<AtomicUsize>,
    /// Some payload, as real operations carry (a reply channel, a request).
    _payload: [u64; 4],
}

impl DelayedOperation for Level {
    fn timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn try_complete(&mut self) -> bool {
        true
    }
    fn on_complete(&mut self, _how: Completion) {
        let marker = 0u8;
        let here = std::hint::black_box(&marker) as *const u8 as usize;
        if self.depth == 1 {
            self.top.store(here, SeqCst);
        }
        self.reached.store(self.depth, SeqCst);
        self.bottom.store(here, SeqCst);
        if self.depth < self.limit {
            let next = Level {
                depth: self.depth + 1,
                limit: self.limit,
                purgatory: self.purgatory.clone(),
                reached: Arc::clone(&self.reached),
                top: Arc::clone(&self.top),
                bottom: Arc::clone(&self.bottom),
                _payload: [0; 4],
            };
            assert!(self
                .purgatory
                .try_complete_else_watch(next, [self.depth as u32])
                .unwrap());
        }
    }
}

/// Runs a chain `limit` deep on a thread with `stack` bytes; returns the stack bytes a
/// level took.
fn chain(limit: usize, stack: usize) -> usize {
    let purgatory: Purgatory<u32, Level> = Purgatory::new("reentrant");
    let reached = Arc::new(AtomicUsize::new(0));
    let (top, bottom) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let first = Level {
        depth: 1,
        limit,
        purgatory: purgatory.clone(),
        reached: Arc::clone(&reached),
        top: Arc::clone(&top),
        bottom: Arc::clone(&bottom),
        _payload: [0; 4],
    };
    let p = purgatory.clone();
    std::thread::Builder::new()
        .stack_size(stack)
        .spawn(move || assert!(p.try_complete_else_watch(first, [0]).unwrap()))
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(reached.load(SeqCst), limit);
    (top.load(SeqCst) - bottom.load(SeqCst)) / (limit - 1)
}

#[test]
fn a_thousand_re_entrant_completions_fit_in_a_one_mib_stack() {
    // Measured on a roomy stack first: 100 levels at the bound take 300 KB in debug,
    // 75 KB in release.
    let per_level = chain(100, 8 << 20);
    eprintln!("re-entrant completion: {per_level} bytes of stack a level");
    assert!(
        per_level <= MOST_A_LEVEL,
        "a re-entrant level takes {per_level} bytes of stack, more than the {MOST_A_LEVEL} \
         the docs state: which frame grew? (docs/benchmarks.md, 'stack a re-entrant level')"
    );
    let stack = if cfg!(debug_assertions) {
        8 << 20
    } else {
        1 << 20
    };
    assert!(chain(1_000, stack) <= MOST_A_LEVEL);
}
