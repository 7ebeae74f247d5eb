//! The delayed operation of a long-polling fetch: done when at least `min_bytes` of
//! committed data lie past the fetch offsets, or at `max_wait` with whatever is there.
//!
//! Watched on every partition fetched; woken by `check_and_complete` when a partition's high
//! watermark moves (an append without followers, a follower advance with them).
//!
//! Invariants:
//! - `try_complete` reads only atomics (the partitions' committed byte positions); no lock.
//! - A check costs one partition, not all of the fetch's (issue #38, finding 4: 2,000
//!   polls over 1,000 partitions made each append re-read 2M positions, and appends fell
//!   from 394k/s to 3.5k/s). The fetch keeps what each partition has contributed so far
//!   (`credited`, never more than it has now: a partition's committed position only
//!   grows) and their sum; a check of partition `p` (run by the leader inside
//!   `checking_partition`, which names `p` to this thread) re-reads `p` alone, found in
//!   O(1) for a fetch of consecutive partitions and in O(log n) at worst. Any other
//!   `try_complete` (the park's own, a check not named) re-reads them all, so a fetch
//!   costs O(partitions) once when it parks and once when it is answered, and O(1) per
//!   event after that (O(log partitions) at worst).
//! - No wake-up is lost: every move of a partition's high watermark is followed by a check
//!   of that partition that starts after it (`check_rounds.rs`), and the purgatory runs a
//!   check's `try_complete` on the checking thread (its documented rule: callers' threads
//!   run `try_complete`), so that check credits the partition up to its position then. At
//!   any moment the sum lacks only moves whose checks are still to come.
//! - Bytes are counted from the start of the batch holding the fetch offset (what the
//!   answer will carry), each partition capped at its `max_bytes`.
//! - The operation only signals; the requester reads the data after the signal, so the
//!   answer carries everything committed by then (never less than what woke it).

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Reply};

use crate::partition::{Partition, PartitionKey};

/// One partition a fetch waits on.
#[derive(Debug, Clone)]
pub struct BytesWait {
    /// The partition's purgatory key.
    pub key: PartitionKey,
    /// The partition.
    pub partition: Arc<Partition>,
    /// Byte position of the batch holding the fetch offset.
    pub start_position: u64,
    /// The most this partition may contribute.
    pub max_bytes: u64,
}

impl BytesWait {
    /// Committed bytes available to this fetch in this partition.
    pub fn available(&self) -> u64 {
        self.partition
            .committed_position()
            .saturating_sub(self.start_position)
            .min(self.max_bytes)
    }
}

/// How a long poll ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchCompletion {
    /// `Ready`: `min_bytes` were there; `Expired`: `max_wait` passed first.
    pub how: Completion,
    /// Committed bytes available when it completed.
    pub available: u64,
    /// When it completed.
    pub completed_at: Instant,
}

thread_local! {
    /// The partition whose check runs on this thread, if one is named.
    static CHECKING: Cell<Option<PartitionKey>> = const { Cell::new(None) };
}

/// Runs `check` (a `check_and_complete` of the fetch purgatory on `key`) with `key` named
/// to this thread, so each fetch it tries re-reads only that partition. Restores what was
/// named before, also when `check` panics. Nothing else may run under the name: a fetch
/// parked under it would credit only `key` at its park (see [`with_no_partition_named`]).
pub(crate) fn checking_partition<R>(key: PartitionKey, check: impl FnOnce() -> R) -> R {
    named(Some(key), check)
}

/// Runs `f` with no partition named to this thread, so every `try_complete` it causes
/// re-reads all of its fetch's partitions: a fetch parked from inside a check (an
/// `on_complete` that parks again) counts everything that is there.
pub(crate) fn with_no_partition_named<R>(f: impl FnOnce() -> R) -> R {
    named(None, f)
}

fn named<R>(key: Option<PartitionKey>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<PartitionKey>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CHECKING.with(|named| named.set(self.0));
        }
    }
    let _restore = Restore(CHECKING.with(|named| named.replace(key)));
    f()
}

/// One partition of a fetch, and what it has contributed so far.
struct Credited {
    wait: BytesWait,
    /// What it contributed when last read (at most what it has now).
    credited: u64,
}

/// A fetch waiting for data.
pub struct DelayedFetch {
    max_wait: Duration,
    min_bytes: u64,
    /// Sorted by key.
    waits: Vec<Credited>,
    /// The sum of their `credited`.
    total: u64,
    reply: Reply<FetchCompletion>,
}

impl DelayedFetch {
    /// A fetch waiting up to `max_wait` for `min_bytes` over `waits`.
    /// It answers through `reply` (made by `Purgatory::park_with`).
    pub fn new(
        max_wait: Duration,
        min_bytes: u64,
        waits: Vec<BytesWait>,
        reply: Reply<FetchCompletion>,
    ) -> DelayedFetch {
        let mut waits: Vec<Credited> = waits
            .into_iter()
            .map(|wait| Credited { wait, credited: 0 })
            .collect();
        waits.sort_by_key(|w| w.wait.key);
        DelayedFetch {
            max_wait,
            min_bytes,
            waits,
            total: 0,
            reply,
        }
    }

    /// Re-reads every partition.
    fn recount(&mut self) {
        for w in self.waits.iter_mut() {
            w.credited = w.wait.available();
        }
        self.total = self.waits.iter().map(|w| w.credited).sum();
    }

    /// The index of the first wait on `key`, or where it would be. Guessed from the keys'
    /// spread, so found at once for a fetch of consecutive partitions (the usual consumer,
    /// and the finding's); otherwise a binary search of the side the guess points to.
    fn first_on(&self, key: PartitionKey) -> usize {
        let (Some(low), Some(high)) = (self.waits.first(), self.waits.last()) else {
            return 0;
        };
        let (low, high, k) = (low.wait.key.0 as u64, high.wait.key.0 as u64, key.0 as u64);
        if k < low {
            return 0;
        }
        if k > high {
            return self.waits.len();
        }
        // In bounds: `(k - low) <= (high - low)`, and the product fits in a `u64`.
        let guess = match high - low {
            0 => 0,
            spread => ((k - low) * (self.waits.len() as u64 - 1) / spread) as usize,
        };
        let at = self.waits[guess].wait.key;
        if at < key {
            guess + 1 + self.waits[guess + 1..].partition_point(|w| w.wait.key < key)
        } else if at == key && (guess == 0 || self.waits[guess - 1].wait.key != key) {
            guess
        } else {
            self.waits[..guess].partition_point(|w| w.wait.key < key)
        }
    }

    /// Re-reads partition `key` alone; `false` if the fetch does not wait on it.
    fn credit(&mut self, key: PartitionKey) -> bool {
        let first = self.first_on(key);
        let mut found = false;
        for w in self.waits[first..].iter_mut() {
            if w.wait.key != key {
                break;
            }
            let now = w.wait.available();
            // A partition's committed position never goes back: `now >= w.credited`.
            self.total += now.saturating_sub(w.credited);
            w.credited = now.max(w.credited);
            found = true;
        }
        found
    }

    /// The keys to watch it on (each partition once).
    pub fn keys(&self) -> Vec<PartitionKey> {
        PartitionKey::distinct(self.waits.iter().map(|w| w.wait.key))
    }

    /// Committed bytes available to this fetch now.
    pub fn available(&self) -> u64 {
        self.waits.iter().map(|w| w.wait.available()).sum()
    }
}

impl DelayedOperation for DelayedFetch {
    fn timeout(&self) -> Duration {
        self.max_wait
    }

    fn try_complete(&mut self) -> bool {
        match CHECKING.with(Cell::get) {
            Some(key) if self.credit(key) => {}
            _ => self.recount(),
        }
        self.total >= self.min_bytes
    }

    fn on_complete(&mut self, how: Completion) {
        let available = self.available();
        self.reply.send(
            how,
            FetchCompletion {
                how,
                available,
                completed_at: Instant::now(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named_now() -> Option<PartitionKey> {
        CHECKING.with(Cell::get)
    }

    /// A fetch over `keys` (in this order), waiting on nothing real.
    fn fetch_over(keys: &[u32]) -> DelayedFetch {
        let partition = Arc::new(Partition::new(0));
        let waits = keys
            .iter()
            .map(|&k| BytesWait {
                key: PartitionKey(k),
                partition: partition.clone(),
                start_position: 0,
                max_bytes: 1,
            })
            .collect();
        DelayedFetch::new(Duration::from_secs(1), 1, waits, purgatory::Reply::channel().0)
    }

    #[test]
    fn the_first_wait_on_a_key_is_found_as_a_scan_finds_it() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..2_000 {
            let len = (next() % 40) as usize;
            let spread = 1 + next() % if round % 2 == 0 { 50 } else { 5_000 };
            let keys: Vec<u32> = (0..len).map(|_| (next() % spread) as u32).collect();
            let fetch = fetch_over(&keys);
            for k in 0..=spread as u32 + 1 {
                let scanned = fetch.waits.iter().take_while(|w| w.wait.key.0 < k).count();
                assert_eq!(fetch.first_on(PartitionKey(k)), scanned, "{keys:?}, key {k}");
            }
        }
        // Consecutive partitions: the guess is the place.
        let dense = fetch_over(&(10..1_010).collect::<Vec<_>>());
        assert_eq!(dense.first_on(PartitionKey(500)), 490);
    }

    #[test]
    fn a_named_partition_is_unnamed_after_its_check_even_one_that_panics() {
        assert_eq!(named_now(), None);
        checking_partition(PartitionKey(3), || {
            assert_eq!(named_now(), Some(PartitionKey(3)));
            checking_partition(PartitionKey(5), || assert_eq!(named_now(), Some(PartitionKey(5))));
            assert_eq!(named_now(), Some(PartitionKey(3)));
        });
        assert_eq!(named_now(), None);
        checking_partition(PartitionKey(3), || {
            with_no_partition_named(|| assert_eq!(named_now(), None));
            assert_eq!(named_now(), Some(PartitionKey(3)));
        });
        let panicked = std::panic::catch_unwind(|| {
            checking_partition(PartitionKey(7), || panic!("a check that panics"))
        });
        assert!(panicked.is_err());
        assert_eq!(named_now(), None);
    }
}
