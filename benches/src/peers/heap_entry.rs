//! The entry the heap-based peers keep in a `BinaryHeap`: a deadline, a sequence number
//! that breaks ties (and names the entry), and the payload.
//!
//! # Invariants
//! - Ordered by `(deadline, seq)` *reversed*, so `std`'s max-heap pops the earliest
//!   deadline first, and among equal deadlines the earliest added. The payload takes no
//!   part in the order.

use std::cmp::Ordering;

pub(crate) struct HeapEntry<D, T> {
    pub(crate) deadline: D,
    pub(crate) seq: u64,
    pub(crate) task: T,
}

impl<D: Ord, T> PartialEq for HeapEntry<D, T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<D: Ord, T> Eq for HeapEntry<D, T> {}

impl<D: Ord, T> PartialOrd for HeapEntry<D, T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<D: Ord, T> Ord for HeapEntry<D, T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (&other.deadline, other.seq).cmp(&(&self.deadline, self.seq))
    }
}

#[cfg(test)]
mod tests {
    use super::HeapEntry;
    use std::collections::BinaryHeap;

    #[test]
    fn pops_earliest_deadline_then_earliest_sequence() {
        let mut heap = BinaryHeap::new();
        for (deadline, seq) in [(5u64, 0), (1, 1), (5, 2), (1, 3), (3, 4)] {
            heap.push(HeapEntry {
                deadline,
                seq,
                task: (),
            });
        }
        let order: Vec<_> =
            std::iter::from_fn(|| heap.pop().map(|e| (e.deadline, e.seq))).collect();
        assert_eq!(order, [(1, 1), (1, 3), (3, 4), (5, 0), (5, 2)]);
    }
}
