//! The slots of the last few cancels, whose entries are still linked into their buckets.
//!
//! # Why defer the unlink
//! Cancelling a task in random order touches three cold cache lines: its entry, then the
//! two list neighbours the entry names. The neighbours can only be asked for once the
//! entry has arrived, and under the shard lock the unlock waits until the writes to them
//! have landed. So a cancel that unlinks at once waits for two misses, one after the
//! other. A cancel that only takes the task out, asks for the neighbours' lines and
//! leaves the unlink to a later cancel waits for one: by the time the unlink runs, the
//! neighbours are in the cache.
//!
//! # Invariants
//! - Holds at most [`CAPACITY`] slot indices, each of a *cancelled* entry: its task is
//!   gone and its generation bumped (no key names it any more), but it is still linked
//!   into its bucket and its slot is not free yet.
//! - No index is held twice.
//! - The wheel empties it before anything walks a bucket list (`advance`), and on a
//!   push that finds it full it hands back the oldest index to unlink then. So at most
//!   `CAPACITY` slots per wheel wait. Each waits until `CAPACITY` more single cancels
//!   (`Wheel::cancel`) on the same wheel or its next `advance`, whichever comes first;
//!   batch cancels unlink their own entries at once and push nothing out, and a timer
//!   shard is only advanced when one of its buckets is due, so a waiting slot can stay
//!   until then. The bound on memory holds throughout: `CAPACITY` slots per wheel.

/// Most cancelled slots that wait to be unlinked, per wheel.
pub(crate) const CAPACITY: usize = 8;

#[derive(Debug, Clone)]
pub(crate) struct DeferredUnlinks {
    slots: [u32; CAPACITY],
    len: usize,
    /// Where the next push goes; once full, also the oldest index.
    next: usize,
}

impl DeferredUnlinks {
    pub(crate) const fn new() -> Self {
        DeferredUnlinks {
            slots: [0; CAPACITY],
            len: 0,
            next: 0,
        }
    }

    /// Number of slots waiting.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Records the cancelled slot `index`. When `CAPACITY` slots were already waiting,
    /// returns the oldest of them, which the caller must unlink now.
    #[inline]
    pub(crate) fn push(&mut self, index: u32) -> Option<u32> {
        let at = self.next;
        self.next = (at + 1) % CAPACITY;
        let oldest = if self.len == CAPACITY {
            Some(self.slots[at])
        } else {
            self.len += 1;
            None
        };
        self.slots[at] = index;
        oldest
    }

    /// Takes every waiting slot out, oldest first. The iterator owns its copy of them, so
    /// `self` is free to change while it runs.
    pub(crate) fn take_all(&mut self) -> impl Iterator<Item = u32> + use<> {
        let (slots, len, next) = (self.slots, self.len, self.next);
        *self = Self::new();
        let oldest = (next + CAPACITY - len) % CAPACITY;
        (0..len).map(move |i| slots[(oldest + i) % CAPACITY])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_back_the_oldest_once_full_and_takes_all_in_order() {
        let mut waiting = DeferredUnlinks::new();
        for i in 0..CAPACITY as u32 {
            assert_eq!(waiting.push(i), None);
        }
        assert_eq!(waiting.len(), CAPACITY);
        assert_eq!(waiting.push(100), Some(0));
        assert_eq!(waiting.push(101), Some(1));
        assert_eq!(waiting.len(), CAPACITY);
        let expected: Vec<u32> = (2..CAPACITY as u32).chain([100, 101]).collect();
        assert_eq!(waiting.take_all().collect::<Vec<_>>(), expected);
        assert_eq!(waiting.len(), 0);
        assert_eq!(waiting.take_all().count(), 0);
        assert_eq!(waiting.push(7), None);
        assert_eq!(waiting.take_all().collect::<Vec<_>>(), vec![7]);
    }
}
