//! A bucket: one slot of one wheel level, holding a doubly linked list of entries.
//!
//! The list is threaded through the slab (`Entry::next` / `Entry::prev`, slot indices,
//! `NIL`-terminated), so linking and unlinking allocate nothing and touch at most three
//! entries (the entry and its two neighbours).
//!
//! # Invariants
//! - `head` is `NIL` or an occupied slot whose `prev` is `NIL` and whose `bucket` is this
//!   bucket's id; following `next` from it visits every entry linked here exactly once.
//! - `expiration` is [`NOT_QUEUED`] exactly when the bucket has no entry in the bucket
//!   queue. Otherwise it is the tick at which the bucket's range starts, and the bucket
//!   queue holds exactly one `(expiration, id)` item for it: a bucket is never queued twice
//!   for one round.
//! - A bucket may be queued and empty (all its entries were cancelled or moved). Once it
//!   is the earliest queued, the next `advance`, `reset` or batch cancel takes it out of
//!   the queue (`Wheel::drop_emptied_front`); flushing one costs a queue pop and nothing
//!   else.

use super::bucket_queue::BucketQueue;
use super::slab::{Slab, SlotKey, NIL};

/// `Bucket::expiration` of a bucket that is not in the bucket queue.
pub(crate) const NOT_QUEUED: u64 = u64::MAX;

#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    pub(crate) head: u32,
    pub(crate) expiration: u64,
}

impl Bucket {
    pub(crate) const EMPTY: Bucket = Bucket {
        head: NIL,
        expiration: NOT_QUEUED,
    };

    /// Links the vacant-of-links entry `index` at the front of this bucket (id `id`).
    pub(crate) fn push<T>(&mut self, id: u32, index: u32, slab: &mut Slab<T>) {
        let old_head = self.head;
        if old_head != NIL {
            slab.get_mut(old_head).prev = index;
        }
        let entry = slab.get_mut(index);
        debug_assert_eq!(entry.bucket, NIL, "entry is already linked");
        entry.next = old_head;
        entry.prev = NIL;
        entry.bucket = id;
        self.head = index;
    }

    /// Stores `task` (expiring at `expiration`) in a vacant slot of `slab`, linked at the
    /// front of this bucket (id `id`), and returns its key: [`push`](Self::push) of a
    /// new entry, whose links are written once (by the slab's insert) instead of twice.
    #[inline(always)]
    pub(crate) fn push_new<T>(
        &mut self,
        id: u32,
        expiration: u64,
        task: T,
        slab: &mut Slab<T>,
    ) -> SlotKey {
        let old_head = self.head;
        let key = slab.insert_linked(expiration, task, old_head, id);
        if old_head != NIL {
            debug_assert!((old_head as usize) < slab.entries.len());
            // SAFETY: a head that is not `NIL` is an occupied slot (see the module doc),
            // and every occupied slot is below `entries.len()`: slots are only ever
            // dropped free (`Slab::give_back_step` drops free slots only). The insert
            // above only adds slots.
            unsafe { slab.entries.get_unchecked_mut(old_head as usize) }.prev = key.index;
        }
        self.head = key.index;
        key
    }

    /// Puts this bucket (id `id`) in the bucket `queue` under `start`, the start of its
    /// range this round, unless it is queued already. Returns `start` if it queued it,
    /// else [`NOT_QUEUED`].
    #[inline]
    pub(crate) fn enqueue(&mut self, id: u32, start: u64, queue: &mut BucketQueue) -> u64 {
        if self.expiration == start {
            return NOT_QUEUED;
        }
        debug_assert_eq!(self.expiration, NOT_QUEUED, "bucket holds two rounds");
        self.expiration = start;
        queue.push(start, id);
        start
    }

    /// Closes the gap an entry leaves in this bucket's list, given the entry's links as
    /// the caller read them just before clearing the entry's own fields.
    #[inline]
    pub(crate) fn unlink_between<T>(&mut self, prev: u32, next: u32, slab: &mut Slab<T>) {
        if prev == NIL {
            self.head = next;
        } else {
            slab.entries[prev as usize].next = next;
        }
        if next != NIL {
            slab.entries[next as usize].prev = prev;
        }
    }

    /// Detaches the whole list and marks the bucket as not queued; returns the old head.
    /// The entries keep their `next` links (so the caller can walk them) but must each be
    /// re-linked or removed by the caller; their `bucket` field still names this bucket
    /// until then.
    pub(crate) fn take(&mut self) -> u32 {
        self.expiration = NOT_QUEUED;
        std::mem::replace(&mut self.head, NIL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unlink(bucket: &mut Bucket, index: u32, slab: &mut Slab<u32>) {
        let entry = slab.get_mut(index);
        let (prev, next) = (entry.prev, entry.next);
        entry.prev = NIL;
        entry.next = NIL;
        entry.bucket = NIL;
        bucket.unlink_between(prev, next, slab);
    }

    fn walk(bucket: &Bucket, slab: &Slab<u32>) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = bucket.head;
        while at != NIL {
            out.push(slab.entries[at as usize].task.unwrap());
            at = slab.entries[at as usize].next;
        }
        out
    }

    #[test]
    fn push_and_unlink_head_middle_tail() {
        let mut slab = Slab::new();
        let mut bucket = Bucket::EMPTY;
        let keys: Vec<_> = (0..4).map(|i| slab.insert(0, i)).collect();
        for k in &keys {
            bucket.push(7, k.index, &mut slab);
        }
        assert_eq!(walk(&bucket, &slab), vec![3, 2, 1, 0]);
        unlink(&mut bucket, keys[2].index, &mut slab); // middle
        assert_eq!(walk(&bucket, &slab), vec![3, 1, 0]);
        unlink(&mut bucket, keys[3].index, &mut slab); // head
        assert_eq!(walk(&bucket, &slab), vec![1, 0]);
        unlink(&mut bucket, keys[0].index, &mut slab); // tail
        assert_eq!(walk(&bucket, &slab), vec![1]);
        unlink(&mut bucket, keys[1].index, &mut slab);
        assert_eq!(bucket.head, NIL);
    }
}
