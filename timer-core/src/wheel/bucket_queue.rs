//! The bucket delay queue: non-empty buckets ordered by the tick their range starts.
//!
//! This is what lets the clock jump straight to the next due bucket: the driver asks for
//! the earliest expiration and sleeps until then, and nothing ticks while nothing is due.
//!
//! # Invariants
//! - It holds `(expiration, bucket id)` pairs, one per queued bucket per round (the wheel
//!   pushes a bucket only when the bucket's expiration changes), so its size is bounded by
//!   the number of buckets (levels x wheel size), never by the number of tasks.
//! - Pairs come out in expiration order; ties in bucket-id order (deterministic).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Debug, Default)]
pub(crate) struct BucketQueue {
    heap: BinaryHeap<Reverse<(u64, u32)>>,
}

impl BucketQueue {
    pub(crate) fn push(&mut self, expiration: u64, bucket: u32) {
        self.heap.push(Reverse((expiration, bucket)));
    }

    /// The earliest queued expiration.
    pub(crate) fn peek(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((expiration, _))| *expiration)
    }

    /// The earliest queued pair.
    pub(crate) fn first(&self) -> Option<(u64, u32)> {
        self.heap.peek().map(|Reverse(pair)| *pair)
    }

    /// Removes the earliest pair.
    pub(crate) fn pop(&mut self) {
        self.heap.pop();
    }

    /// Removes and returns the earliest pair if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(u64, u32)> {
        match self.heap.peek() {
            Some(Reverse((expiration, _))) if *expiration <= now => {
                self.heap.pop().map(|Reverse(pair)| pair)
            }
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    pub(crate) fn clear(&mut self) {
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_only_due_pairs_in_order() {
        let mut q = BucketQueue::default();
        q.push(30, 1);
        q.push(10, 2);
        q.push(20, 3);
        assert_eq!(q.peek(), Some(10));
        assert_eq!(q.pop_due(5), None);
        assert_eq!(q.pop_due(25), Some((10, 2)));
        assert_eq!(q.pop_due(25), Some((20, 3)));
        assert_eq!(q.pop_due(25), None);
        assert_eq!(q.len(), 1);
    }
}
