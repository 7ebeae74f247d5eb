//! One key's watcher list: the operations waiting on it, in arrival order, kept in
//! segments of bounded length so that a purge can filter any list, however long, a
//! segment at a time.
//!
//! # Layout
//! A list is its `head`, then (only once the head holds [`BLOCK`] entries) a `tail` of
//! blocks. The head keeps up to two entries inline, in the space a `Vec` header takes
//! anyway: most keys have few waiters, and a list that never allocates is one allocation
//! fewer per new key and one free fewer per purged key (a purge of millions of
//! single-entry lists otherwise leaves the allocator with millions of small frees to sort
//! out). The tail is one pointer while it is absent, which is almost always.
//!
//! # Invariants
//! - Arrival order is segment order (the head, then the tail's blocks in order), then
//!   position within a segment. Filtering keeps it; a push appends to the last segment.
//! - Every segment holds at most [`BLOCK`] entries, so filtering one segment is bounded
//!   work. A tail block is never empty, and an empty tail is `None`: the list is empty
//!   exactly when its head is empty and it has no tail. The head may be empty while a
//!   tail remains (its entries were filtered out); pushes then go to the tail.
//! - A block left small by filtering is merged into the segment before it when both fit
//!   in one, so filtering does not leave a long list of mostly empty blocks.
//! - The head's room (entries in place, or its buffer) is never more than [`BLOCK`]: a
//!   push finds a head with room to spare and no tail in one comparison.
//! - A block merged away or emptied is kept, empty, as a spare for the list's next new
//!   block while the list has fewer spares than blocks in use; spares go with the tail.
//!   So a long list holds at most twice the blocks it has in use, and a list that is
//!   short again holds none.
//!
//! # Why spares
//! A long list that is both pushed to and purged frees a block at each merge and
//! allocates one every [`BLOCK`] pushes. Freed by the reaper and allocated by a watching
//! thread, those blocks went back through the allocator, which gave whole pages of them
//! back to the system and then faulted fresh zeroed pages in for the next blocks: at
//! W3-low-timeout's top rate (3 of 100 keys, lists of thousands), page faults taken in
//! the push that starts a block were most of the watching thread's page faults
//! (`perf`, `docs/benchmarks.md` round 24).

use smallvec::SmallVec;

use crate::op_table::OpRef;

/// Longest segment. A purge step filters whole segments, so this bounds how far a step
/// can overrun its budget: the longest step over a 2,000,000-entry list measured here
/// took 0.09-0.36 ms (`purge-lateness --layout hot`, docs/benchmarks.md). Lists up to
/// this long (nearly all) have no tail and cost what a single vector costs; 256 cost
/// 2 % more instructions in a watch-and-check driver whose lists hold 300.
pub(crate) const BLOCK: usize = 1024;

/// Entries a list's head keeps in place, before it needs a buffer.
const INLINE: usize = 2;

/// A list's first segment: up to [`INLINE`] entries in place (in the 16 bytes a buffer's
/// address would take with a spare word), more in a buffer of its own, of at most
/// [`BLOCK`]. Every entry of the room is initialized (unused ones to a default name),
/// so the room is a plain slice and only the choice of place or buffer is unsafe.
///
/// Hand-made rather than a `SmallVec`: its push asked for the length and the capacity,
/// each through a branch on where the entries are, then again in the push itself (24
/// instructions a push, 15 now; three keys a watch: callgrind, `expiring_watches`).
pub(crate) struct Head {
    /// The entries in place while `cap` is [`INLINE`]; the buffer otherwise.
    data: HeadData,
    /// Entries in use: the first `len` of the room.
    len: u32,
    /// The room: [`INLINE`], or the buffer's length (above `INLINE`, at most [`BLOCK`]).
    cap: u32,
}

#[derive(Clone, Copy)]
union HeadData {
    inline: [OpRef; INLINE],
    /// A `Box<[OpRef]>` of the head's `cap` entries, every one initialized, owned by the
    /// head (made by [`Head::grow_to`], freed by its drop or the next `grow_to`).
    heap: *mut OpRef,
}

// SAFETY: a `Head` owns its buffer as a `Box<[OpRef]>` would (nothing else points into
// it, and it is freed once, by the head), and `OpRef` is `Send` and `Sync`; so it may go
// to, and be shared with, another thread as that box may.
unsafe impl Send for Head {}
// SAFETY: see `Send`; `&Head` only reads.
unsafe impl Sync for Head {}

impl Default for Head {
    fn default() -> Self {
        Head {
            data: HeadData {
                inline: [OpRef::default(); INLINE],
            },
            len: 0,
            cap: INLINE as u32,
        }
    }
}

impl Head {
    /// Whether the entries are in a buffer (`cap` above [`INLINE`]).
    #[inline(always)]
    fn spilled(&self) -> bool {
        self.cap as usize > INLINE
    }

    /// The first entry of the room, in place or in the buffer.
    #[inline(always)]
    fn base(&self) -> *const OpRef {
        if self.spilled() {
            // SAFETY: a head with a buffer keeps its address in `heap` (see there).
            unsafe { self.data.heap }
        } else {
            // SAFETY: a head without a buffer keeps its entries in place (see there).
            unsafe { self.data.inline.as_ptr() }
        }
    }

    /// [`base`](Self::base), for writing.
    #[inline(always)]
    fn base_mut(&mut self) -> *mut OpRef {
        if self.spilled() {
            // SAFETY: as in `base`.
            unsafe { self.data.heap }
        } else {
            // SAFETY: as in `base`.
            unsafe { self.data.inline.as_mut_ptr() }
        }
    }

    /// The whole room, `cap` entries (those past `len` are unused).
    #[inline(always)]
    fn room(&self) -> &[OpRef] {
        // SAFETY: `base` is the start of `cap` initialized entries (in place, or the
        // buffer's, whose length is `cap`), owned by `self` and borrowed with it.
        unsafe { std::slice::from_raw_parts(self.base(), self.cap as usize) }
    }

    /// [`room`](Self::room), for writing.
    #[inline(always)]
    fn room_mut(&mut self) -> &mut [OpRef] {
        let cap = self.cap as usize;
        // SAFETY: as in `room`; borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.base_mut(), cap) }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entries in use.
    #[inline]
    pub(crate) fn as_slice(&self) -> &[OpRef] {
        &self.room()[..self.len()]
    }

    /// Whether a [`push_in_room`](Self::push_in_room) fits.
    #[inline(always)]
    fn has_room(&self) -> bool {
        self.len < self.cap
    }

    /// Appends `op` to a head that [`has_room`](Self::has_room).
    #[inline(always)]
    fn push_in_room(&mut self, op: OpRef) {
        let len = self.len();
        debug_assert!(self.has_room());
        // SAFETY: `len < cap` (the caller's condition, checked in debug builds): the
        // entry at `len` lies in the room (see `room`), which `self` owns and lends here
        // mutably. (Through `room_mut()[len]` the bounds check stayed.)
        unsafe { self.base_mut().add(len).write(op) };
        self.len += 1;
    }

    /// Moves the entries to a new buffer of `cap` (above the entries in use and
    /// [`INLINE`], at most [`BLOCK`]), freeing the old buffer if any.
    #[inline(never)]
    fn grow_to(&mut self, cap: usize) {
        assert!(
            cap > self.len() && cap > INLINE && cap <= BLOCK,
            "a head of {cap} for {} entries",
            self.len()
        );
        let mut buffer = vec![OpRef::default(); cap].into_boxed_slice();
        let len = self.len;
        buffer[..self.len()].copy_from_slice(self.as_slice());
        let old = self.take_buffer();
        self.data.heap = Box::into_raw(buffer).cast::<OpRef>();
        (self.len, self.cap) = (len, cap as u32);
        drop(old);
    }

    /// Takes the buffer out, if there is one, leaving the head empty, its room in place.
    fn take_buffer(&mut self) -> Option<Box<[OpRef]>> {
        if !self.spilled() {
            return None;
        }
        // SAFETY: a head with a buffer keeps in `heap` the address of the `Box<[OpRef]>`
        // of `cap` entries it made (`grow_to`) and owns; the box is remade once, here,
        // and the head forgets it at once (below, before anything can unwind).
        let buffer = unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.data.heap,
                self.cap as usize,
            ))
        };
        self.data.inline = [OpRef::default(); INLINE];
        (self.len, self.cap) = (0, INLINE as u32);
        Some(buffer)
    }

    /// Appends `ops`; the head must stay within [`BLOCK`].
    pub(crate) fn extend_from_slice(&mut self, ops: &[OpRef]) {
        let (len, end) = (self.len(), self.len() + ops.len());
        assert!(end <= BLOCK, "a head of {end} entries");
        if end > self.cap as usize {
            self.grow_to(end.max((2 * self.cap as usize).min(BLOCK)));
        }
        self.room_mut()[len..end].copy_from_slice(ops);
        self.len = end as u32;
    }

    /// Keeps the first `len` entries (if there are more).
    #[inline]
    fn truncate(&mut self, len: usize) {
        if len < self.len() {
            self.len = len as u32;
        }
    }
}

impl Drop for Head {
    fn drop(&mut self) {
        drop(self.take_buffer());
    }
}

/// The entries of a head, moved out in order.
pub(crate) struct HeadIntoIter {
    head: Head,
    next: usize,
}

impl Iterator for HeadIntoIter {
    type Item = OpRef;

    #[inline]
    fn next(&mut self) -> Option<OpRef> {
        let op = self.head.as_slice().get(self.next).copied();
        self.next += usize::from(op.is_some());
        op
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.head.len() - self.next;
        (left, Some(left))
    }
}

/// One key's operations, in arrival order (see the module doc).
#[derive(Default)]
pub(crate) struct OpList {
    head: Head,
    // Boxed: one word per list instead of two `Vec` headers' six, since almost no list
    // has a tail.
    tail: Option<Box<Tail>>,
}

/// A long list's blocks after its head, and the emptied blocks kept for its next ones.
struct Tail {
    /// Never empty, each block non-empty and at most [`BLOCK`] long.
    blocks: Vec<Vec<OpRef>>,
    /// Empty blocks with room for [`BLOCK`] entries; never more of them than `blocks`.
    spares: Vec<Vec<OpRef>>,
}

impl OpList {
    /// A list of one operation.
    pub(crate) fn one(op: OpRef) -> Self {
        let mut head = Head::default();
        head.push_in_room(op);
        OpList { head, tail: None }
    }

    /// Appends `op`. Inlined up to the common case, a list that is one segment with
    /// room to spare (an out-of-line call cost about 11 of the 34 instructions of a
    /// push). The head's room is at most [`BLOCK`], so room to spare is room below it.
    #[inline(always)]
    pub(crate) fn push(&mut self, op: OpRef) {
        if self.tail.is_none() && self.head.has_room() {
            self.head.push_in_room(op);
            return;
        }
        // A long list's last block with room, inlined too: under load every push to a
        // hot key's list is one (W3 at the top rate: 497,395 of 600,000 pushes went out
        // of line, 41 instructions each).
        if let Some(last) = self.tail.as_mut().and_then(|tail| tail.blocks.last_mut()) {
            if last.len() < BLOCK {
                last.push(op);
                return;
            }
        }
        self.push_slow(op);
    }

    /// [`push`](Self::push) when the head's room is full or a tail exists: a head below
    /// [`BLOCK`] grows (to twice its room, at most `BLOCK`), a full one starts the tail.
    #[inline(never)]
    fn push_slow(&mut self, op: OpRef) {
        match &mut self.tail {
            None if self.head.len() < BLOCK => {
                let cap = (2 * self.head.len()).clamp(INLINE + 1, BLOCK);
                self.head.grow_to(cap);
                self.head.push_in_room(op);
            }
            None => {
                self.tail = Some(Box::new(Tail {
                    blocks: vec![block_of(op)],
                    spares: Vec::new(),
                }))
            }
            Some(tail) => match tail.blocks.last_mut() {
                Some(last) if last.len() < BLOCK => last.push(op),
                _ => {
                    let block = match tail.spares.pop() {
                        Some(mut spare) => {
                            debug_assert!(spare.is_empty() && spare.capacity() >= BLOCK);
                            spare.push(op);
                            spare
                        }
                        None => block_of(op),
                    };
                    tail.blocks.push(block);
                }
            },
        }
    }

    /// Number of entries (walks the tail's blocks: O(len / BLOCK)).
    pub(crate) fn len(&self) -> usize {
        self.head.len() + self.blocks().iter().map(Vec::len).sum::<usize>()
    }

    /// Whether the list is one segment (at most [`BLOCK`] entries).
    #[inline]
    pub(crate) fn is_short(&self) -> bool {
        self.tail.is_none()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.head.is_empty() && self.tail.is_none()
    }

    /// The entries, in arrival order.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn iter(&self) -> impl Iterator<Item = OpRef> + '_ {
        self.head
            .as_slice()
            .iter()
            .chain(self.blocks().iter().flatten())
            .copied()
    }

    /// Appends the entries to `out`, in arrival order, a segment at a time, each as one
    /// copy of a slice (`SmallVec::extend` went entry by entry: 2.9 % of the completer's
    /// time in W3-events at 100,000/s).
    #[inline]
    pub(crate) fn copy_into<const N: usize>(&self, out: &mut SmallVec<[OpRef; N]>) {
        out.extend_from_slice(self.head.as_slice());
        for block in self.blocks() {
            out.extend_from_slice(block);
        }
    }

    /// Drops every entry whose operation is no longer `waiting`; returns how many.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn drop_completed(&mut self, waiting: &impl Fn(OpRef) -> bool) -> usize {
        let mut dropped = 0;
        let mut segment = Some(0);
        while let Some(at) = segment {
            let (n, next) = self.drop_completed_in(at, waiting);
            dropped += n;
            segment = next;
        }
        dropped
    }

    /// Drops the entries of segment `segment` (0 is the head) whose operation is no
    /// longer `waiting`. Returns how many it dropped and the segment to visit next
    /// (`None` past the end). A `segment` past the end (the list shrank since the caller
    /// chose it) drops nothing.
    ///
    /// The head (the whole of nearly every list) is filtered inline, in the purge step's
    /// loop; a tail's block out of line. Called out of line for the head too, it cost
    /// about 30 instructions more a list (callgrind, `expiring_watches`).
    #[inline]
    pub(crate) fn drop_completed_in(
        &mut self,
        segment: usize,
        waiting: &impl Fn(OpRef) -> bool,
    ) -> (usize, Option<usize>) {
        if segment == 0 {
            let dropped = drop_completed_entries(&mut self.head, waiting);
            let next = self.tail.is_some().then_some(1);
            return (dropped, next);
        }
        self.drop_completed_in_block(segment, waiting)
    }

    /// [`drop_completed_in`](Self::drop_completed_in) of a tail block (`segment` > 0).
    #[inline(never)]
    fn drop_completed_in_block(
        &mut self,
        segment: usize,
        waiting: &impl Fn(OpRef) -> bool,
    ) -> (usize, Option<usize>) {
        let Some(tail) = self.tail.as_deref_mut() else {
            return (0, None);
        };
        let blocks = &mut tail.blocks;
        let index = segment - 1;
        let Some(block) = blocks.get_mut(index) else {
            return (0, None);
        };
        let dropped = drop_completed_entries(block, waiting);
        let len = block.len();
        let before = match index {
            0 => self.head.len(),
            _ => blocks[index - 1].len(),
        };
        // Empty, or small enough to join the segment before it: the block goes, and the
        // next block takes its index.
        let next = if len == 0 || before + len <= BLOCK {
            let mut block = blocks.remove(index);
            match index {
                0 => self.head.extend_from_slice(&block),
                _ => blocks[index - 1].extend_from_slice(&block),
            }
            // Kept for the list's next block while the spares are fewer than the blocks
            // in use (the module doc); the one that would go over is freed.
            if tail.spares.len() < blocks.len() {
                block.clear();
                tail.spares.push(block);
            } else {
                tail.spares.truncate(blocks.len());
            }
            segment
        } else {
            segment + 1
        };
        let more = next - 1 < blocks.len();
        if blocks.is_empty() {
            self.tail = None;
        }
        (dropped, more.then_some(next))
    }

    /// The segment lengths from `segment` on are what a purge step budgets by.
    #[inline]
    pub(crate) fn segment_len(&self, segment: usize) -> usize {
        match segment {
            0 => self.head.len(),
            _ => self.blocks().get(segment - 1).map_or(0, Vec::len),
        }
    }

    #[inline]
    fn blocks(&self) -> &[Vec<OpRef>] {
        self.tail
            .as_deref()
            .map_or(&[], |tail| tail.blocks.as_slice())
    }
}

impl IntoIterator for OpList {
    type Item = OpRef;
    type IntoIter =
        std::iter::Chain<HeadIntoIter, std::iter::Flatten<std::vec::IntoIter<Vec<OpRef>>>>;

    fn into_iter(self) -> Self::IntoIter {
        let blocks = self.tail.map(|tail| tail.blocks).unwrap_or_default();
        let head = HeadIntoIter {
            head: self.head,
            next: 0,
        };
        head.chain(blocks.into_iter().flatten())
    }
}

/// A new tail block holding `op`, with room for a whole block.
fn block_of(op: OpRef) -> Vec<OpRef> {
    let mut block = Vec::with_capacity(BLOCK);
    block.push(op);
    block
}

/// Drops the entries of one segment for which `waiting` is false, keeping the others in
/// order; returns how many it dropped.
///
/// One pass with no branch on the answers: every entry is copied down to `kept` (onto
/// itself while nothing was dropped) and `kept` grows by the answer. A `waiting` read (a
/// generation tag, written by whichever core completed the operation) may miss the
/// cache; since no branch waits for it and the next entry's read does not depend on it
/// (only the address of a later copy does, and `kept <= read` keeps that copy off every
/// entry still to be read), the CPU runs ahead and has many misses in flight at once. A
/// keep-or-drop branch would have waited for each miss on a mispredict before the next
/// could start.
///
/// Before, two passes: the answers into a stack array, 128 at a time, then the
/// compaction: about 27 instructions an entry and 30 more a segment to clear the array
/// (callgrind, `expiring_watches`); with the answers in a `SmallVec` filled by `extend`,
/// 84 an entry (`expiring_watches 20000 64`).
///
/// `waiting` must not panic: a panic part way would leave the segment with entries
/// copied down but its length not yet cut, so some entries twice (the two-pass version
/// left it untouched). Its callers pass tag and generation reads, which cannot.
fn drop_completed_entries(segment: &mut impl Segment, waiting: &impl Fn(OpRef) -> bool) -> usize {
    let entries = segment.entries();
    let before = entries.len();
    let mut kept = 0;
    for read in 0..before {
        let op = entries[read];
        let keep = waiting(op);
        debug_assert!(kept <= read);
        // SAFETY: `kept <= read < before == entries.len()`: `kept` starts at 0 with
        // `read`, and grows by at most one per entry read. In bounds, so the bounds
        // check can go.
        unsafe { *entries.get_unchecked_mut(kept) = op };
        kept += usize::from(keep);
    }
    segment.truncate(kept);
    before - kept
}

/// The head and a block, as [`drop_completed_entries`] sees them.
trait Segment {
    fn entries(&mut self) -> &mut [OpRef];
    fn truncate(&mut self, len: usize);
}

impl Segment for Head {
    #[inline]
    fn entries(&mut self) -> &mut [OpRef] {
        let len = self.len();
        &mut self.room_mut()[..len]
    }
    #[inline]
    fn truncate(&mut self, len: usize) {
        Head::truncate(self, len);
    }
}

impl Segment for Vec<OpRef> {
    #[inline]
    fn entries(&mut self) -> &mut [OpRef] {
        self.as_mut_slice()
    }
    #[inline]
    fn truncate(&mut self, len: usize) {
        Vec::truncate(self, len);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn op(i: u32) -> OpRef {
        OpRef::for_test(i, 0)
    }

    fn indices(list: &OpList) -> Vec<u32> {
        list.iter().map(|op| op.index()).collect()
    }

    fn list_of(n: u32) -> OpList {
        let mut list = OpList::one(op(0));
        for i in 1..n {
            list.push(op(i));
        }
        list
    }

    #[test]
    fn a_list_of_up_to_two_stays_in_the_space_of_a_vec_and_a_pointer() {
        assert_eq!(
            std::mem::size_of::<OpList>(),
            std::mem::size_of::<Vec<OpRef>>() + std::mem::size_of::<usize>()
        );
        let mut list = OpList::one(op(1));
        list.push(op(2));
        assert!(!list.head.spilled());
        list.push(op(3));
        assert!(list.head.spilled());
    }

    #[test]
    fn a_long_list_keeps_arrival_order_in_segments_of_at_most_a_block() {
        let n = 5 * BLOCK as u32 + 17;
        let list = list_of(n);
        assert_eq!(list.len(), n as usize);
        assert_eq!(indices(&list), (0..n).collect::<Vec<_>>());
        assert_eq!(list.head.len(), BLOCK);
        assert!(list
            .blocks()
            .iter()
            .all(|b| !b.is_empty() && b.len() <= BLOCK));
        assert_eq!(
            list.into_iter().map(|op| op.index()).collect::<Vec<_>>(),
            (0..n).collect::<Vec<_>>()
        );
    }

    #[test]
    fn filtering_segment_by_segment_keeps_order_and_merges_small_blocks() {
        let n = 8 * BLOCK as u32;
        let mut list = list_of(n);
        let waiting = |op: OpRef| op.index() % 3 == 0;
        let mut segment = Some(0);
        let mut dropped = 0;
        let mut steps = 0;
        while let Some(at) = segment {
            assert!(list.segment_len(at) <= BLOCK);
            let (n, next) = list.drop_completed_in(at, &waiting);
            dropped += n;
            segment = next;
            steps += 1;
        }
        let kept: Vec<u32> = (0..n).filter(|i| i % 3 == 0).collect();
        assert_eq!(dropped, n as usize - kept.len());
        assert_eq!(steps, 8, "one step per segment");
        assert_eq!(indices(&list), kept);
        // A third of each block is left; merged, they need three segments, not eight.
        assert!(list.blocks().len() <= 2, "{} blocks", list.blocks().len());
        assert!(list
            .blocks()
            .iter()
            .all(|b| !b.is_empty() && b.len() <= BLOCK));
        // Pushes still append at the end.
        list.push(op(n));
        assert_eq!(indices(&list).last(), Some(&n));
    }

    #[test]
    fn a_list_filtered_empty_is_empty_and_a_stale_segment_index_drops_nothing() {
        let mut list = list_of(3 * BLOCK as u32);
        assert_eq!(list.drop_completed(&|_| false), 3 * BLOCK);
        assert!(list.is_empty());
        assert!(list.tail.is_none());
        assert_eq!(list.drop_completed_in(5, &|_| false), (0, None));
        // An emptied head with a tail left: pushes go to the tail, order holds.
        let mut list = list_of(2 * BLOCK as u32);
        let (n, next) = list.drop_completed_in(0, &|_| false);
        assert_eq!((n, next), (BLOCK, Some(1)));
        assert!(!list.is_empty());
        list.push(op(9_999));
        assert_eq!(indices(&list).len(), BLOCK + 1);
        assert_eq!(indices(&list).last(), Some(&9_999));
    }

    /// The head's room grows by doubling from its two entries in place up to a block and
    /// never past it, whether by pushes or by a merge; its entries survive each move,
    /// and it gives them back in order (and frees its buffer: Miri checks for leaks).
    #[test]
    fn the_head_grows_in_place_then_doubles_up_to_a_block() {
        let mut list = OpList::default();
        let mut rooms = Vec::new();
        for i in 0..BLOCK as u32 + 1 {
            list.push(op(i));
            if rooms.last() != Some(&list.head.cap) {
                rooms.push(list.head.cap);
            }
        }
        assert_eq!(rooms, [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]);
        assert_eq!(list.head.len(), BLOCK);
        assert_eq!(
            list.blocks().len(),
            1,
            "the entry past a block starts the tail"
        );
        assert_eq!(indices(&list), (0..BLOCK as u32 + 1).collect::<Vec<_>>());
        // A merge into a small head: room for the entries, at most a block.
        let mut head = Head::default();
        head.extend_from_slice(&[op(1)]);
        assert!(!head.spilled());
        head.extend_from_slice(&(2..6).map(op).collect::<Vec<_>>());
        assert_eq!((head.len(), head.cap), (5, 5));
        head.extend_from_slice(&[op(6)]);
        assert_eq!((head.len(), head.cap), (6, 10));
        head.extend_from_slice(&(7..BLOCK as u32 + 1).map(op).collect::<Vec<_>>());
        assert_eq!((head.len(), head.cap as usize), (BLOCK, BLOCK));
        let all: Vec<u32> = HeadIntoIter { head, next: 0 }
            .map(|op| op.index())
            .collect();
        assert_eq!(all, (1..BLOCK as u32 + 1).collect::<Vec<_>>());
        // Moved out part way, in place and spilled.
        for n in [1, 2, 3, 9] {
            let mut list = list_of(n);
            let mut entries = list.head.as_slice().to_vec();
            Segment::truncate(&mut list.head, n as usize - 1);
            entries.pop();
            assert_eq!(list.head.as_slice(), entries);
            let mut iter = list.into_iter();
            assert_eq!(iter.size_hint(), (n as usize - 1, Some(n as usize - 1)));
            assert_eq!(iter.next().map(|op| op.index()), (n > 1).then_some(0));
        }
    }

    /// A block merged away is kept and is the list's next new block (the same
    /// allocation); the spares never outnumber the blocks in use, and a list filtered
    /// short again holds none.
    #[test]
    fn a_merged_block_is_kept_as_a_spare_and_reused_for_the_next_block() {
        let n = 8 * BLOCK as u32;
        let mut list = list_of(n);
        assert_eq!(list.blocks().len(), 7);
        // Keep a third: merges free blocks, kept as spares up to the blocks in use.
        list.drop_completed(&|op: OpRef| op.index() % 3 == 0);
        let tail = list.tail.as_deref().expect("still long");
        let (blocks, spares) = (tail.blocks.len(), tail.spares.len());
        assert!(
            spares >= 1 && spares <= blocks,
            "{spares} spares, {blocks} blocks"
        );
        checked(&list);
        // Fill the last block, then one more entry: the new block is the last spare.
        let spare = tail.spares.last().expect("a spare").as_ptr();
        let room = BLOCK - list.blocks().last().unwrap().len();
        for i in 0..=room as u32 {
            list.push(op(n + i));
        }
        let tail = list.tail.as_deref().unwrap();
        assert_eq!(tail.blocks.len(), blocks + 1);
        assert_eq!(
            tail.blocks.last().unwrap().as_ptr(),
            spare,
            "the spare reused"
        );
        assert_eq!(tail.spares.len(), spares - 1);
        checked(&list);
        // Filtered down to its head: the tail goes, spares with it.
        list.drop_completed(&|op: OpRef| op.index() < 10);
        assert!(list.tail.is_none());
        assert_eq!(
            indices(&list),
            (0..10).filter(|i| i % 3 == 0).collect::<Vec<_>>()
        );
    }

    /// Checks the layout invariants and returns the entries.
    fn checked(list: &OpList) -> Vec<u32> {
        assert!(list.head.len() <= list.head.cap as usize);
        assert!(list.head.cap as usize <= BLOCK);
        assert_eq!(list.head.spilled(), list.head.cap as usize > INLINE);
        if let Some(tail) = &list.tail {
            let blocks = &tail.blocks;
            assert!(!blocks.is_empty(), "an empty tail is None");
            assert!(
                tail.spares.len() <= blocks.len(),
                "no more spares than blocks"
            );
            assert!(tail
                .spares
                .iter()
                .all(|s| s.is_empty() && s.capacity() >= BLOCK));
            assert!(blocks.iter().all(|b| !b.is_empty() && b.len() <= BLOCK));
        }
        let entries = indices(list);
        assert_eq!(entries.len(), list.len());
        assert_eq!(entries.is_empty(), list.is_empty());
        let mut copied = SmallVec::<[OpRef; 4]>::new();
        list.copy_into(&mut copied);
        assert_eq!(
            copied.iter().map(|op| op.index()).collect::<Vec<_>>(),
            entries
        );
        entries
    }

    /// The cases the head's unsafe code must survive, in one list small enough for Miri
    /// (the random test is too slow there): a spilled head emptied by filtering while a
    /// tail with spares remains, pushes then going to the tail, the first block merged
    /// back into the emptied head (`extend_from_slice`, within its room of a block), the
    /// head filled again up to a block, and the list moved out part way and dropped
    /// (its head's buffer, the tail's blocks and spares freed: Miri checks for leaks).
    #[test]
    fn an_emptied_spilled_head_with_a_tail_takes_pushes_merges_and_drops_part_way() {
        let n = 4 * BLOCK as u32;
        let mut list = list_of(n);
        // Every block a third full: merges leave spares.
        let third = |op: OpRef| op.index() % 3 == 0;
        let mut segment = Some(1);
        while let Some(at) = segment {
            segment = list.drop_completed_in(at, &third).1;
        }
        assert!(list.tail.as_deref().is_some_and(|t| !t.spares.is_empty()));
        // The head emptied, spilled, with the tail still there.
        assert_eq!(list.drop_completed_in(0, &|_| false), (BLOCK, Some(1)));
        assert!(list.head.is_empty() && list.head.spilled() && !list.is_empty());
        // A push goes to the tail, after every entry there.
        list.push(op(n));
        assert!(list.head.is_empty());
        let mut want: Vec<u32> = (BLOCK as u32..n).filter(|&i| i % 3 == 0).collect();
        want.push(n);
        assert_eq!(checked(&list), want);
        // The first block merges into the empty head, within its room.
        let first = list.blocks()[0].len();
        let (_, next) = list.drop_completed_in(1, &|_| true);
        assert_eq!(
            next,
            Some(1),
            "the merged block's index goes to the next one"
        );
        assert_eq!((list.head.len(), list.head.cap as usize), (first, BLOCK));
        assert_eq!(checked(&list), want);
        // Filtered down to the head alone: the tail goes, with its spares; pushes fill
        // the head up to a block, then start a tail again.
        list.drop_completed(&|op: OpRef| op.index() < 2 * BLOCK as u32);
        assert!(list.tail.is_none());
        let mut next = n + 1;
        while list.is_short() {
            list.push(op(next));
            next += 1;
        }
        assert_eq!(list.head.len(), BLOCK);
        let entries = checked(&list);
        assert_eq!(entries.len(), BLOCK + 1);
        // Moved out part way, then dropped.
        let mut iter = list.into_iter();
        let taken: Vec<u32> = iter.by_ref().take(3).map(|op| op.index()).collect();
        assert_eq!(taken, entries[..3]);
        drop(iter);
    }

    #[test]
    fn random_pushes_and_filters_keep_every_waiting_entry_in_arrival_order() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(0x0b5e55ed);
        for _ in 0..16 {
            let mut list = OpList::default();
            // Ids are pushed in increasing order; an id is waiting unless completed.
            let mut completed: Vec<bool> = Vec::new();
            for _ in 0..40 {
                let next = completed.len() as u32;
                match rng.gen_range(0..5) {
                    0 | 1 => {
                        for id in next..next + rng.gen_range(1..3 * BLOCK as u32) {
                            list.push(op(id));
                            completed.push(false);
                        }
                    }
                    2 => {
                        for _ in 0..rng.gen_range(0..2 * BLOCK) {
                            let id = rng.gen_range(0..next.max(1)) as usize;
                            if let Some(done) = completed.get_mut(id) {
                                *done = true;
                            }
                        }
                    }
                    3 => {
                        // A segment that may be past the end, as a stale purge cursor.
                        let segment = rng.gen_range(0..8);
                        let before = checked(&list).len();
                        let waiting = |op: OpRef| !completed[op.index() as usize];
                        let (dropped, next_segment) = list.drop_completed_in(segment, &waiting);
                        assert_eq!(before - checked(&list).len(), dropped);
                        if let Some(s) = next_segment {
                            assert!(s <= segment + 1 && s >= segment.max(1));
                        }
                    }
                    _ => {
                        let waiting = |op: OpRef| !completed[op.index() as usize];
                        list.drop_completed(&waiting);
                        assert!(checked(&list).iter().all(|&id| !completed[id as usize]));
                    }
                }
                let entries = checked(&list);
                assert!(entries.windows(2).all(|w| w[0] < w[1]), "arrival order");
                let mut present = vec![false; completed.len()];
                for &id in &entries {
                    present[id as usize] = true;
                }
                assert!(
                    (0..completed.len()).all(|id| completed[id] || present[id]),
                    "a waiting entry was lost"
                );
            }
        }
    }

    /// Segments of many lengths, up to a whole block (and across the 128-entry runs an
    /// earlier two-pass filter worked in): a purge keeps exactly the waiting entries, in
    /// order, however far compaction has fallen behind the reading (all dropped first,
    /// none, every other, only the first 128, a random third).
    #[test]
    fn a_segment_filtered_keeps_exactly_the_waiting_entries_in_order() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(128);
        let random: Vec<bool> = (0..BLOCK).map(|_| rng.gen_range(0..3) == 0).collect();
        let patterns: [(&str, &dyn Fn(u32) -> bool); 7] = [
            ("all", &|_| true),
            ("none", &|_| false),
            ("odd", &|i| i % 2 == 1),
            ("first run only", &|i| i < 128),
            ("after the first run", &|i| i >= 128),
            ("last of each run", &|i| i % 128 == 127),
            ("random", &|i| random[i as usize]),
        ];
        for len in [
            1, 2, 3, 127, 128, 129, 255, 256, 257, 300, 1000, 1023, BLOCK,
        ] {
            for (name, keep) in &patterns {
                let waiting = |op: OpRef| keep(op.index());
                let want: Vec<u32> = (0..len as u32).filter(|&i| keep(i)).collect();
                // A block, and the head (what `drop_completed_in` filters at segment 0).
                let mut block: Vec<OpRef> = (0..len as u32).map(op).collect();
                let dropped = drop_completed_entries(&mut block, &waiting);
                let got: Vec<u32> = block.iter().map(|op| op.index()).collect();
                assert_eq!(got, want, "block of {len}, {name}");
                assert_eq!(dropped, len - want.len(), "block of {len}, {name}");
                let mut head = Head::default();
                head.extend_from_slice(&(0..len as u32).map(op).collect::<Vec<_>>());
                let dropped = drop_completed_entries(&mut head, &waiting);
                let got: Vec<u32> = head.as_slice().iter().map(|op| op.index()).collect();
                assert_eq!(got, want, "head of {len}, {name}");
                assert_eq!(dropped, len - want.len(), "head of {len}, {name}");
            }
        }
    }
}
