//! A timer over `BTreeMap<(deadline, id), task>`: ordered, with real removal on cancel.
//!
//! # Invariants
//! - A handle is the task's map key; ids come from a counter, so keys are unique and a
//!   stale handle finds nothing to remove.
//! - The map holds exactly the pending tasks: cancel frees the entry at once.

use std::collections::BTreeMap;

use crate::workloads::w1::ChurnTimer;

/// Names one added task: its map key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BTreeHandle {
    deadline: u64,
    id: u64,
}

/// An ordered-map timer; deadlines are plain `u64` (any unit).
pub struct BTreeTimer<T> {
    map: BTreeMap<(u64, u64), T>,
    next_id: u64,
}

impl<T> Default for BTreeTimer<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> BTreeTimer<T> {
    /// An empty timer.
    pub fn new() -> Self {
        BTreeTimer {
            map: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// Adds `task` due at `deadline`.
    #[inline]
    pub fn add(&mut self, deadline: u64, task: T) -> BTreeHandle {
        let id = self.next_id;
        self.next_id += 1;
        self.map.insert((deadline, id), task);
        BTreeHandle { deadline, id }
    }

    /// Removes the task and returns it, if still pending.
    #[inline]
    pub fn cancel(&mut self, handle: BTreeHandle) -> Option<T> {
        self.map.remove(&(handle.deadline, handle.id))
    }

    /// Removes every task due at or before `now`, earliest first, onto `out`.
    pub fn pop_due(&mut self, now: u64, out: &mut Vec<T>) -> usize {
        let before = out.len();
        while let Some(entry) = self.map.first_entry() {
            if entry.key().0 > now {
                break;
            }
            out.push(entry.remove());
        }
        out.len() - before
    }

    /// Number of pending tasks.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no task is pending.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl ChurnTimer for BTreeTimer<u32> {
    type Handle = BTreeHandle;

    #[inline]
    fn add(&mut self, delay_ms: u64, task: u32) -> BTreeHandle {
        BTreeTimer::add(self, delay_ms, task)
    }

    #[inline]
    fn cancel(&mut self, handle: BTreeHandle) -> bool {
        BTreeTimer::cancel(self, handle).is_some()
    }

    fn pending(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_on_cancel_and_pops_in_order() {
        let mut t = BTreeTimer::new();
        let a = t.add(5, 'a');
        t.add(1, 'b');
        t.add(5, 'c');
        assert_eq!(t.cancel(a), Some('a'));
        assert_eq!(t.cancel(a), None);
        assert_eq!(t.len(), 2);
        let mut out = Vec::new();
        assert_eq!(t.pop_due(5, &mut out), 2);
        assert_eq!(out, vec!['b', 'c']);
    }
}
