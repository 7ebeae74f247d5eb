//! The probe: a `DelayedOperation` for behaviour tests that records every callback the
//! purgatory makes on it in a shared [`Ledger`], and flags any breach of the operation
//! contract as it happens.
//!
//! # What the ledger checks on the fly (each breach counts as a violation)
//! - `try_complete` never runs concurrently with itself for one operation, and never after
//!   the operation completed.
//! - `on_complete` runs at most once, never while `try_complete` runs.
//! - `on_expiration` runs only after an `on_complete(Expired)`, at most once.
//! - The operation value is dropped at most once.
//!
//! Whether every operation got its one `on_complete` is for each test to assert at its end
//! (it knows which operations were accepted, handed back or refused).

#![allow(dead_code)] // Each test binary uses its own part of this module.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use purgatory::{
    Completion, DelayedOperation, ManualClock, Purgatory, PurgatoryBuilder, TimerBuilder,
};

/// `Slot::how` before any `on_complete`.
const NOT_COMPLETED: u8 = 0;

fn code(how: Completion) -> u8 {
    match how {
        Completion::Ready => 1,
        Completion::Forced => 2,
        Completion::Expired => 3,
        Completion::Shutdown => 4,
    }
}

fn decode(code: u8) -> Option<Completion> {
    match code {
        1 => Some(Completion::Ready),
        2 => Some(Completion::Forced),
        3 => Some(Completion::Expired),
        4 => Some(Completion::Shutdown),
        _ => None,
    }
}

/// What happened to one operation.
#[derive(Default)]
struct Slot {
    tries: AtomicU32,
    in_try: AtomicBool,
    completions: AtomicU32,
    how: AtomicU8,
    expirations: AtomicU32,
    drops: AtomicU32,
    violations: AtomicU32,
}

/// Callback records of operations `0..len`, shared by the probes and the test.
pub struct Ledger {
    slots: Vec<Slot>,
}

impl Ledger {
    pub fn new(len: usize) -> Arc<Self> {
        Arc::new(Ledger {
            slots: (0..len).map(|_| Slot::default()).collect(),
        })
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    fn violation(&self, id: usize, what: &str) {
        self.slots[id].violations.fetch_add(1, SeqCst);
        eprintln!("contract violation on operation {id}: {what}");
    }

    /// Marks the start of a `try_complete`; returns its attempt number (1 for the first).
    fn enter_try(&self, id: usize) -> u32 {
        let slot = &self.slots[id];
        if slot.in_try.swap(true, SeqCst) {
            self.violation(id, "try_complete ran concurrently with itself");
        }
        if slot.completions.load(SeqCst) > 0 {
            self.violation(id, "try_complete ran after on_complete");
        }
        slot.tries.fetch_add(1, SeqCst) + 1
    }

    fn exit_try(&self, id: usize) {
        self.slots[id].in_try.store(false, SeqCst);
    }

    fn complete(&self, id: usize, how: Completion) {
        let slot = &self.slots[id];
        if slot.in_try.load(SeqCst) {
            self.violation(id, "on_complete ran during try_complete");
        }
        if slot.completions.fetch_add(1, SeqCst) > 0 {
            self.violation(id, "on_complete ran twice");
        }
        slot.how.store(code(how), SeqCst);
    }

    fn expire(&self, id: usize) {
        let slot = &self.slots[id];
        let how = decode(slot.how.load(SeqCst));
        if slot.completions.load(SeqCst) != 1 || !how.is_some_and(Completion::is_expiry) {
            self.violation(
                id,
                "on_expiration without a preceding on_complete(Expired|Shutdown)",
            );
        }
        if slot.expirations.fetch_add(1, SeqCst) > 0 {
            self.violation(id, "on_expiration ran twice");
        }
    }

    fn dropped(&self, id: usize) {
        if self.slots[id].drops.fetch_add(1, SeqCst) > 0 {
            self.violation(id, "dropped twice");
        }
    }

    pub fn tries(&self, id: usize) -> u32 {
        self.slots[id].tries.load(SeqCst)
    }

    pub fn completions(&self, id: usize) -> u32 {
        self.slots[id].completions.load(SeqCst)
    }

    /// How the operation completed, if it did.
    pub fn how(&self, id: usize) -> Option<Completion> {
        decode(self.slots[id].how.load(SeqCst))
    }

    pub fn is_completed(&self, id: usize) -> bool {
        self.slots[id].how.load(SeqCst) != NOT_COMPLETED
    }

    pub fn expirations(&self, id: usize) -> u32 {
        self.slots[id].expirations.load(SeqCst)
    }

    pub fn drops(&self, id: usize) -> u32 {
        self.slots[id].drops.load(SeqCst)
    }

    pub fn violations(&self) -> u32 {
        self.slots.iter().map(|s| s.violations.load(SeqCst)).sum()
    }

    /// Operations whose `on_complete` ran.
    pub fn total_completions(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| u64::from(s.completions.load(SeqCst)))
            .sum()
    }

    /// Operations completed with `how`.
    pub fn count(&self, how: Completion) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.how.load(SeqCst) == code(how))
            .count() as u64
    }
}

/// Decides readiness from the operation id and the attempt number (1 for the first try).
pub type Readiness = Arc<dyn Fn(usize, u32) -> bool + Send + Sync>;

/// A test operation reporting to a [`Ledger`].
pub struct Probe {
    pub id: usize,
    timeout: Duration,
    ledger: Arc<Ledger>,
    ready: Readiness,
    panic_in_on_complete: bool,
    stall_in_on_expiration: Duration,
}

impl Probe {
    pub fn new(id: usize, timeout: Duration, ledger: &Arc<Ledger>, ready: &Readiness) -> Self {
        Probe {
            id,
            timeout,
            ledger: Arc::clone(ledger),
            ready: Arc::clone(ready),
            panic_in_on_complete: false,
            stall_in_on_expiration: Duration::ZERO,
        }
    }

    /// Makes `on_complete` panic after recording the call.
    pub fn panicking_on_complete(mut self) -> Self {
        self.panic_in_on_complete = true;
        self
    }

    /// Makes `on_expiration` sleep `stall` after recording the call (a callback that
    /// blocks, for a stand-in to take over from).
    pub fn stalling_on_expiration(mut self, stall: Duration) -> Self {
        self.stall_in_on_expiration = stall;
        self
    }
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Probe({})", self.id)
    }
}

/// Ends the ledger's `try_complete` even when the readiness function panics.
struct TryGuard<'a> {
    ledger: &'a Ledger,
    id: usize,
}

impl Drop for TryGuard<'_> {
    fn drop(&mut self) {
        self.ledger.exit_try(self.id);
    }
}

impl DelayedOperation for Probe {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn try_complete(&mut self) -> bool {
        let attempt = self.ledger.enter_try(self.id);
        let _guard = TryGuard {
            ledger: &self.ledger,
            id: self.id,
        };
        (self.ready)(self.id, attempt)
    }

    fn on_complete(&mut self, how: Completion) {
        self.ledger.complete(self.id, how);
        if self.panic_in_on_complete {
            panic!("probe {} panics in on_complete (on purpose)", self.id);
        }
    }

    fn on_expiration(&mut self) {
        self.ledger.expire(self.id);
        if !self.stall_in_on_expiration.is_zero() {
            std::thread::sleep(self.stall_in_on_expiration);
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.ledger.dropped(self.id);
    }
}

/// A purgatory on `clock` with no reaper: the test drives it with `advance_clock`.
pub fn manual_purgatory<K, O>(clock: &ManualClock) -> Purgatory<K, O>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    PurgatoryBuilder::new()
        .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
        .build()
        .expect("valid configuration")
}

/// Readiness that is always false.
pub fn never() -> Readiness {
    Arc::new(|_, _| false)
}

/// Readiness read from one flag per operation.
pub fn flags(len: usize) -> (Arc<Vec<AtomicBool>>, Readiness) {
    let flags: Arc<Vec<AtomicBool>> = Arc::new((0..len).map(|_| AtomicBool::new(false)).collect());
    let read = Arc::clone(&flags);
    (flags, Arc::new(move |id, _| read[id].load(SeqCst)))
}

/// Runs `f` on its own thread; fails the test if it does not return within `limit`.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(value) => value,
        Err(_) => panic!("{what} did not return within {limit:?}"),
    }
}

/// Polls `done` every millisecond until it holds or `limit` passes; returns whether it held.
pub fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A key whose one armed copy panics when dropped (once): the copy a watcher list keeps,
/// so the panic comes wherever the purgatory drops a list (a purge, `cancel_for_key`, a
/// check that empties it, shutdown). Clones are plain.
#[derive(Debug)]
pub struct DropBomb {
    pub id: u32,
    armed: Option<Arc<AtomicBool>>,
}

impl DropBomb {
    /// A key that never panics.
    pub fn plain(id: u32) -> Self {
        DropBomb { id, armed: None }
    }

    /// A key whose drop panics while its flag (given back, and set) is set.
    pub fn armed(id: u32) -> (Self, Arc<AtomicBool>) {
        let armed = Arc::new(AtomicBool::new(true));
        let key = DropBomb {
            id,
            armed: Some(Arc::clone(&armed)),
        };
        (key, armed)
    }
}

impl Clone for DropBomb {
    fn clone(&self) -> Self {
        DropBomb::plain(self.id)
    }
}

impl std::hash::Hash for DropBomb {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl PartialEq for DropBomb {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for DropBomb {}

impl Drop for DropBomb {
    fn drop(&mut self) {
        if let Some(armed) = &self.armed {
            if armed.swap(false, SeqCst) && !std::thread::panicking() {
                panic!("Drop of key {} (on purpose)", self.id);
            }
        }
    }
}

/// A small, fast, seedable pseudo-random generator (xorshift64*), for reproducible chaos.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(splitmix(seed) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0), close enough for tests.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `percent` / 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A bijective mix of 64 bits (splitmix64's finaliser), to derive values from ids.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
