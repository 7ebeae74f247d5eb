//! The bucket delay queue: non-empty buckets ordered by the tick their range starts.
//!
//! This is what lets the clock jump straight to the next due bucket: the driver asks for
//! the earliest expiration and sleeps until then, and nothing ticks while nothing is due.
//!
//! # Layout
//! Two parts: `run`, a FIFO of pairs each pushed later than the one pushed before it
//! (so it is sorted), and `heap`, a binary heap of the other pairs. The earliest pair is
//! the earlier of their two fronts. Buckets are mostly queued in the order they come
//! due (tasks added with one timeout, or later ones, queue each new bucket after the
//! ones already queued), and those go through the FIFO at a constant cost: a heap's pop
//! cost about 140 instructions with 20 buckets queued (callgrind,
//! `benches/examples/expiring_watches`: one pop a round), the FIFO's a few. A pair
//! pushed out of order goes to the heap, so no push or pop costs more than with the
//! heap alone, plus one comparison.
//!
//! # Invariants
//! - It holds `(expiration, bucket id)` pairs, one per queued bucket per round (the wheel
//!   pushes a bucket only when the bucket's expiration changes), so its size is bounded by
//!   the number of buckets (levels x wheel size), never by the number of tasks.
//! - Pairs come out in expiration order; ties in bucket-id order (deterministic).
//! - `run` is sorted, strictly increasing front to back; a pair is in `run` or `heap`,
//!   never both.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

#[derive(Debug, Default)]
pub(crate) struct BucketQueue {
    /// Pairs pushed each later than the one before (see the module doc), earliest first.
    run: VecDeque<(u64, u32)>,
    /// The pairs pushed out of order.
    heap: BinaryHeap<Reverse<(u64, u32)>>,
}

impl BucketQueue {
    #[inline]
    pub(crate) fn push(&mut self, expiration: u64, bucket: u32) {
        let pair = (expiration, bucket);
        if self.run.back().is_none_or(|last| pair > *last) {
            self.run.push_back(pair);
        } else {
            self.push_out_of_order(pair);
        }
    }

    /// [`push`](Self::push) of a pair not later than the run's last: onto the heap.
    #[inline(never)]
    fn push_out_of_order(&mut self, pair: (u64, u32)) {
        self.heap.push(Reverse(pair));
    }

    /// The earliest queued expiration.
    #[inline]
    pub(crate) fn peek(&self) -> Option<u64> {
        self.first().map(|(expiration, _)| expiration)
    }

    /// The earliest queued pair, and whether it is the run's (else the heap's).
    #[inline]
    fn front(&self) -> Option<((u64, u32), bool)> {
        match (self.run.front(), self.heap.peek()) {
            (Some(run), Some(Reverse(heap))) => Some(if run < heap {
                (*run, true)
            } else {
                (*heap, false)
            }),
            (Some(run), None) => Some((*run, true)),
            (None, Some(Reverse(heap))) => Some((*heap, false)),
            (None, None) => None,
        }
    }

    /// The earliest queued pair.
    #[inline]
    pub(crate) fn first(&self) -> Option<(u64, u32)> {
        self.front().map(|(pair, _)| pair)
    }

    /// Removes the earliest pair.
    pub(crate) fn pop(&mut self) {
        if let Some((_, in_run)) = self.front() {
            self.take(in_run);
        }
    }

    /// Removes the earliest pair, the run's or the heap's.
    #[inline]
    fn take(&mut self, in_run: bool) {
        if in_run {
            self.run.pop_front();
        } else {
            self.heap.pop();
        }
    }

    /// Removes and returns the earliest pair if it is due at `now`.
    #[inline]
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(u64, u32)> {
        match self.front() {
            Some((pair, in_run)) if pair.0 <= now => {
                self.take(in_run);
                Some(pair)
            }
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.run.len() + self.heap.len()
    }

    pub(crate) fn clear(&mut self) {
        self.run.clear();
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

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

    proptest! {
        /// Against a sorted set of the same pairs: the same earliest pair, the same pops,
        /// the same length, whatever order the pairs come in (as the wheel pushes them:
        /// a pair is never pushed while it is queued).
        #[test]
        fn behaves_like_a_sorted_set(
            ops in proptest::collection::vec((0u8..4, 0u64..40, 0u32..6), 0..300)
        ) {
            let mut q = BucketQueue::default();
            let mut model = BTreeSet::new();
            for (op, expiration, bucket) in ops {
                match op {
                    0 | 1 => {
                        if model.insert((expiration, bucket)) {
                            q.push(expiration, bucket);
                        }
                    }
                    2 => {
                        let due = model.first().copied().filter(|pair| pair.0 <= expiration);
                        if due.is_some() {
                            model.pop_first();
                        }
                        prop_assert_eq!(q.pop_due(expiration), due);
                    }
                    _ => {
                        prop_assert_eq!(q.first(), model.pop_first());
                        q.pop();
                    }
                }
                prop_assert_eq!(q.first(), model.first().copied());
                prop_assert_eq!(q.peek(), model.first().map(|pair| pair.0));
                prop_assert_eq!(q.len(), model.len());
            }
            q.clear();
            prop_assert_eq!(q.first(), None);
            prop_assert_eq!(q.len(), 0);
        }
    }
}
