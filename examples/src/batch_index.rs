//! An append-at-the-back, drop-at-the-front sequence that never moves its elements: the
//! partition log's batch index.
//!
//! A `VecDeque` doubles its buffer when full and copies every element over, under whatever
//! lock guards it: with millions of small batches that is a copy of hundreds of MB under
//! the partition lock (a produce stalled 1.9 s in issue #29), and up to twice the memory
//! the elements need. Here the elements live in fixed chunks of [`CHUNK`] slots.
//!
//! Invariants:
//! - A push allocates at most one new chunk of [`CHUNK`] slots (when the last one is full)
//!   and never copies an element; a drop from the front frees a chunk once all its
//!   elements are gone. So the memory held is at most two chunks beyond the elements'.
//! - Every chunk but the first and the last holds exactly [`CHUNK`] elements; the first
//!   has lost `front_dropped` of its [`CHUNK`] (or fewer, if it is also the last); the
//!   last was pushed `last_pushed` times. Element `i` is therefore found by arithmetic.

use std::collections::VecDeque;

/// Slots per chunk.
pub const CHUNK: usize = 1024;

/// The elements, in fixed chunks.
#[derive(Debug)]
pub struct ChunkedIndex<T> {
    /// Each chunk a `VecDeque` of capacity [`CHUNK`] that never holds more: it never grows.
    chunks: VecDeque<VecDeque<T>>,
    /// Elements pushed into the last chunk.
    last_pushed: usize,
    len: usize,
}

impl<T> Default for ChunkedIndex<T> {
    fn default() -> Self {
        Self {
            chunks: VecDeque::new(),
            last_pushed: 0,
            len: 0,
        }
    }
}

impl<T> ChunkedIndex<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots allocated (elements held plus free slots of the first and last chunks).
    pub fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    /// Appends `item`.
    pub fn push_back(&mut self, item: T) {
        if self.chunks.is_empty() || self.last_pushed == CHUNK {
            self.chunks.push_back(VecDeque::with_capacity(CHUNK));
            self.last_pushed = 0;
        }
        if let Some(last) = self.chunks.back_mut() {
            last.push_back(item);
        }
        self.last_pushed += 1;
        self.len += 1;
    }

    /// Where element `index` is: (chunk, place in it).
    fn locate(&self, index: usize) -> Option<(usize, usize)> {
        if index >= self.len {
            return None;
        }
        let first = self.chunks.front()?.len();
        if index < first {
            return Some((0, index));
        }
        let rest = index - first;
        Some((1 + rest / CHUNK, rest % CHUNK))
    }

    /// Element `index`.
    pub fn get(&self, index: usize) -> Option<&T> {
        let (chunk, place) = self.locate(index)?;
        self.chunks[chunk].get(place)
    }

    /// Element `index`, to change.
    pub fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        let (chunk, place) = self.locate(index)?;
        self.chunks[chunk].get_mut(place)
    }

    /// The last element.
    pub fn back(&self) -> Option<&T> {
        self.chunks.back()?.back()
    }

    /// Drops the first `count` elements (all of them if fewer).
    pub fn drop_front(&mut self, mut count: usize) {
        count = count.min(self.len);
        self.len -= count;
        while count > 0 {
            let Some(first) = self.chunks.front_mut() else {
                break;
            };
            let here = count.min(first.len());
            first.drain(..here);
            count -= here;
            let whole_chunk_gone = first.is_empty() && (self.chunks.len() > 1 || self.len == 0);
            if whole_chunk_gone {
                self.chunks.pop_front();
                if self.chunks.is_empty() {
                    self.last_pushed = 0;
                }
            }
        }
    }

    /// The elements from `start` (inclusive) to `end` (exclusive), in order.
    pub fn range(&self, start: usize, end: usize) -> impl Iterator<Item = &T> {
        let end = end.min(self.len);
        (start..end).filter_map(move |i| self.get(i))
    }

    /// The first index whose element does not satisfy `before` (which must hold for a
    /// prefix of the elements only): a binary search.
    pub fn partition_point(&self, before: impl Fn(&T) -> bool) -> usize {
        let (mut low, mut high) = (0, self.len);
        while low < high {
            let mid = low + (high - low) / 2;
            match self.get(mid) {
                Some(item) if before(item) => low = mid + 1,
                _ => high = mid,
            }
        }
        low
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_keep_their_places_across_chunks_and_front_drops() {
        let mut index = ChunkedIndex::default();
        let mut model = VecDeque::new();
        let mut next = 0u64;
        for round in 0..40 {
            for _ in 0..(round * 97 % 700 + 1) {
                index.push_back(next);
                model.push_back(next);
                next += 1;
            }
            let drop = round * 61 % 500;
            index.drop_front(drop);
            for _ in 0..drop.min(model.len()) {
                model.pop_front();
            }
            assert_eq!(index.len(), model.len());
            for (i, value) in model.iter().enumerate() {
                assert_eq!(index.get(i), Some(value));
            }
            assert_eq!(index.get(model.len()), None);
            assert_eq!(index.back(), model.back());
            assert!(index.capacity() <= model.len() + 2 * CHUNK);
            let cut = model.len() / 3;
            assert_eq!(
                index.partition_point(|&v| v < model.get(cut).copied().unwrap_or(u64::MAX)),
                cut
            );
            let tail: Vec<u64> = index.range(cut, model.len()).copied().collect();
            assert_eq!(tail, model.iter().skip(cut).copied().collect::<Vec<_>>());
        }
        index.drop_front(usize::MAX);
        assert!(index.is_empty());
        assert_eq!(index.capacity(), 0);
        index.push_back(7);
        assert_eq!(index.get(0), Some(&7));
    }

    #[test]
    fn a_chunk_never_reallocates() {
        let mut index = ChunkedIndex::default();
        index.push_back(0u8);
        let first = index.get(0).unwrap() as *const u8;
        for i in 1..CHUNK {
            index.push_back(i as u8);
        }
        assert_eq!(index.get(0).unwrap() as *const u8, first);
        assert_eq!(index.capacity(), CHUNK);
    }
}
