//! A timer over `std::collections::BinaryHeap` with lazy deletion.
//!
//! A binary heap cannot remove an element from its middle, so `cancel` only marks the
//! task's sequence number as no longer pending; the entry stays in the heap (holding its
//! memory) until its deadline comes up, when `pop_due` discards it. This is the usual way
//! to cancel in a heap timer and what makes its cancel cheap.
//!
//! # Invariants
//! - Bit `seq` of `pending` is set exactly while the task added with sequence `seq` is
//!   neither cancelled nor popped; a handle is its sequence, so a stale handle finds its
//!   bit clear and changes nothing.
//! - `pending` grows by one bit per add and never shrinks (sequence numbers are not
//!   reused): 125 KB per million adds.
//! - Heap order is (deadline, sequence): ties pop in insertion order.

use std::collections::BinaryHeap;

use crate::workloads::w1::ChurnTimer;

use super::heap_entry::HeapEntry;

/// Names one added task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapHandle(u64);

/// A min-heap timer with lazy cancellation; deadlines are plain `u64` (any unit).
pub struct LazyHeapTimer<T> {
    heap: BinaryHeap<HeapEntry<u64, T>>,
    pending: Vec<u64>,
    next_seq: u64,
    live: usize,
}

impl<T> Default for LazyHeapTimer<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> LazyHeapTimer<T> {
    /// An empty timer.
    pub fn new() -> Self {
        LazyHeapTimer {
            heap: BinaryHeap::new(),
            pending: Vec::new(),
            next_seq: 0,
            live: 0,
        }
    }

    /// Adds `task` due at `deadline`.
    #[inline]
    pub fn add(&mut self, deadline: u64, task: T) -> HeapHandle {
        let seq = self.next_seq;
        self.next_seq += 1;
        let word = (seq / 64) as usize;
        if word == self.pending.len() {
            self.pending.push(0);
        }
        self.pending[word] |= 1 << (seq % 64);
        self.heap.push(HeapEntry {
            deadline,
            seq,
            task,
        });
        self.live += 1;
        HeapHandle(seq)
    }

    /// Cancels the task; true if it was pending. Its heap entry stays until popped.
    #[inline]
    pub fn cancel(&mut self, handle: HeapHandle) -> bool {
        let Some(word) = self.pending.get_mut((handle.0 / 64) as usize) else {
            return false;
        };
        let bit = 1 << (handle.0 % 64);
        let was = *word & bit != 0;
        *word &= !bit;
        self.live -= usize::from(was);
        was
    }

    /// Pops every entry due at or before `now`, pushing the still-pending tasks onto
    /// `out`. Returns how many were pushed.
    pub fn pop_due(&mut self, now: u64, out: &mut Vec<T>) -> usize {
        let before = out.len();
        while self.heap.peek().is_some_and(|e| e.deadline <= now) {
            let Some(entry) = self.heap.pop() else { break };
            let word = &mut self.pending[(entry.seq / 64) as usize];
            let bit = 1 << (entry.seq % 64);
            if *word & bit != 0 {
                *word &= !bit;
                self.live -= 1;
                out.push(entry.task);
            }
        }
        out.len() - before
    }

    /// The earliest deadline in the heap (possibly of a cancelled task).
    pub fn next_deadline(&self) -> Option<u64> {
        self.heap.peek().map(|e| e.deadline)
    }

    /// Tasks neither cancelled nor popped.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no task is pending.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }
}

impl ChurnTimer for LazyHeapTimer<u32> {
    type Handle = HeapHandle;

    #[inline]
    fn add(&mut self, delay_ms: u64, task: u32) -> HeapHandle {
        LazyHeapTimer::add(self, delay_ms, task)
    }

    #[inline]
    fn cancel(&mut self, handle: HeapHandle) -> bool {
        LazyHeapTimer::cancel(self, handle)
    }

    fn pending(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_deadline_order_and_skips_cancelled() {
        let mut t = LazyHeapTimer::new();
        let a = t.add(5, 'a');
        t.add(1, 'b');
        t.add(3, 'c');
        assert!(t.cancel(a));
        assert!(!t.cancel(a));
        let mut out = Vec::new();
        assert_eq!(t.pop_due(2, &mut out), 1);
        assert_eq!(t.pop_due(10, &mut out), 1);
        assert_eq!(out, vec!['b', 'c']);
        assert!(t.is_empty());
        assert!(!t.cancel(HeapHandle(99)));
    }
}
