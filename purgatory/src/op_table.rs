//! The table of watched operations: one slot per operation in flight, named by an
//! [`OpRef`] (slot index and generation). This is where "exactly once" is decided.
//!
//! # Why a table of slots
//! Watcher lists, timer entries and handles name an operation by `OpRef`, a plain 8-byte
//! value, instead of sharing it through a reference count. Dropping a list entry is then
//! a plain memory operation (no atomic decrement on a line another core owns), a purge
//! only reads each entry's slot generation (loads the CPU overlaps), and an operation's
//! memory is reusable the moment it completes, however many stale entries still name it.
//!
//! # Invariants
//! - A slot's `generation` is the generation of its occupant while occupied, and of its
//!   next occupant while free. It changes only when the occupant is taken (under the
//!   slot lock, before the lock is released), so an `OpRef` names its operation from
//!   insertion until it is taken, and nothing ever after: a stale `OpRef` (in a list, a
//!   timer entry or a handle) finds another generation and touches nothing. Generations
//!   never wrap: a slot whose generation reaches [`RETIRED`] (after 2^32 - 1 operations)
//!   is retired instead of freed and never handed out again, so a stale `OpRef` can never
//!   match a later operation, at any uptime. (The cost: one slot per 2^32 - 1 operations
//!   of one slot. A retired slot's tag is `RETIRED as u8`; a stale entry whose tag equals
//!   it is dropped only by a `check_and_complete` on its key (once the key's dead entries
//!   are a quarter of its list), which checks such entries against the slot
//!   ([`OpTable::is_waiting_by_tag`]), never by purges.)
//! - The operation lives in `state.op` until exactly one thread takes it out, under the
//!   slot lock, with the matching generation. Whoever takes it completes it (or hands it
//!   back, for a cancel); every later attempt finds another generation. So `on_complete`
//!   runs at most once, and `try_complete` (called under the same lock, on the value in
//!   place) never runs concurrently with itself or after the operation was taken.
//! - An expiry never waits for a slot lock (its holder may be running `try_complete`,
//!   user code that may block). If the lock is held it records the request in the slot
//!   (`expiry_requested`: the occupant's generation + 1), then tries once more; whoever
//!   holds the lock without taking the operation unlocks it ([`Locked::unlock`]) and then
//!   looks for a request ([`OpTable::claim_expiries`], or [`OpTable::claim_found_expiries`]
//!   for slots already found) and, finding one for its
//!   operation, takes the operation for the caller to complete as expired. The request is
//!   written before the second try and read after the unlock, with a `SeqCst` fence
//!   between each pair (one fence serves a batch of unlocks), so at least one of the two
//!   sees the other: the expiry is never lost, and the taking is decided under the lock
//!   as always.
//! - `state.timer` is the operation's armed timeout; it is taken with the operation, so
//!   the taker (and only it) disarms the timer. The watcher arms the timer while holding
//!   the lock, so a completion can never miss a timer armed after it.
//! - A slot goes back to the free lists only after its occupant was taken, and is handed
//!   out again only from there: one occupant per slot at a time.
//! - Slots live in segments that are allocated once and never move or shrink (segment
//!   `k` holds `FIRST_SEGMENT << k` slots), so the table's memory is its peak number of
//!   operations in flight (give or take the few slots freed on another thread at the
//!   moment an allocation skipped that thread's list as empty).
//! - No lock of this module is held while another of its slot locks is taken, except by
//!   a batch watch on slots it has just allocated (see `batch.rs`); the free-list locks
//!   are taken with at most one slot lock held and never the other way round.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32 as StdAtomicU32, AtomicU8, Ordering};
use std::sync::OnceLock;

use crate::sync::{fence, AtomicU32, Mutex, MutexGuard};
use timer_core::{panic_message, TimerHandle};

use crate::counters::{stripe_index, STRIPES};
use crate::operation::DelayedOperation;

/// Slots in the first segment (each next segment doubles).
#[cfg(not(loom))]
const FIRST_SEGMENT: usize = 1024;
#[cfg(loom)]
const FIRST_SEGMENT: usize = 8;

/// The generation of a retired slot: no operation ever holds it, so no `OpRef` names it.
const RETIRED: u32 = u32::MAX;

/// Enough segments for every `u32` index.
const SEGMENTS: usize = 33 - FIRST_SEGMENT.trailing_zeros() as usize;

/// Names one operation: its slot and the generation it occupies the slot with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct OpRef {
    index: u32,
    generation: u32,
}

#[cfg(all(test, not(loom)))]
impl OpRef {
    /// The slot's index.
    pub(crate) fn index(self) -> u32 {
        self.index
    }

    /// A name for tests of the lists, which never look into the table.
    pub(crate) fn for_test(index: u32, generation: u32) -> Self {
        OpRef { index, generation }
    }
}

struct OpState<O> {
    op: Option<O>,
    timer: Option<TimerHandle>,
    /// How many watcher entries name the operation: 0 until it is listed, then its key
    /// count (so a taker knows how many stale entries it leaves).
    keys: u32,
}

/// An operation taken out of its slot, with the timer it still has armed and its key
/// count.
pub(crate) struct Taken<O> {
    pub(crate) op: O,
    pub(crate) timer: Option<TimerHandle>,
    pub(crate) keys: u32,
}

struct Slot<O> {
    generation: AtomicU32,
    /// The generation + 1 of an occupant whose expiry found the slot locked (0: none);
    /// see the module doc.
    expiry_requested: AtomicU32,
    /// Written (never read) by [`OpTable::prepare`] to pull the slot's line into this
    /// core's cache ahead of locking it.
    touch: StdAtomicU32,
    state: Mutex<OpState<O>>,
}

impl<O> Slot<O> {
    fn new() -> Self {
        Slot {
            generation: AtomicU32::new(0),
            expiry_requested: AtomicU32::new(0),
            touch: StdAtomicU32::new(0),
            state: Mutex::new(OpState {
                op: None,
                timer: None,
                keys: 0,
            }),
        }
    }
}

/// Free slot indices of one stripe of threads.
#[repr(align(128))]
#[derive(Default)]
struct FreeList {
    indices: parking_lot::Mutex<Vec<u32>>,
    /// `indices.len()` as of its last change (written under the lock), so an allocation
    /// skips empty lists without locking them.
    available: std::sync::atomic::AtomicUsize,
}

/// A slot whose operation was taken by [`Locked::take_deferred`], waiting for
/// [`OpTable::vacate`].
pub(crate) struct Vacated {
    index: u32,
    tag: u8,
    retired: bool,
}

/// Where the slot and the tag of the operation an [`OpRef`] names are: found once
/// ([`OpTable::find`]) for the several looks a check takes at one list entry (its tag,
/// its lock, its expiry request), instead of working the segment out for each.
pub(crate) struct Found<'a, O> {
    slot: &'a Slot<O>,
    tag: &'a AtomicU8,
    op: OpRef,
}

impl<O> Clone for Found<'_, O> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<O> Copy for Found<'_, O> {}

impl<O> Found<'_, O> {
    /// [`OpTable::may_be_waiting`] of this operation.
    #[inline]
    pub(crate) fn may_be_waiting(&self) -> bool {
        self.tag.load(Ordering::Acquire) == self.op.generation as u8
    }
}

/// A locked slot holding the operation an [`OpRef`] names.
pub(crate) struct Locked<'a, O> {
    table: &'a OpTable<O>,
    op: OpRef,
    state: MutexGuard<'a, OpState<O>>,
}

pub(crate) struct OpTable<O> {
    segments: [OnceLock<Segment<O>>; SEGMENTS],
    /// Slots ever handed out; the next new slot's index.
    high_water: StdAtomicU32,
    free: [FreeList; STRIPES],
}

/// One segment of slots and their tags, created together, so that one look-up finds both.
struct Segment<O> {
    slots: Box<[Slot<O>]>,
    /// The low 8 bits of each slot's generation, packed 64 to a cache line, for telling
    /// stale list entries apart without touching their slots (see
    /// [`OpTable::may_be_waiting`]).
    tags: Box<[AtomicU8]>,
}

/// The segment and offset of slot `index`.
#[inline]
fn locate(index: u32) -> (usize, usize) {
    let block = u64::from(index) / FIRST_SEGMENT as u64 + 1;
    let segment = 63 - block.leading_zeros() as usize;
    let start = FIRST_SEGMENT as u64 * ((1u64 << segment) - 1);
    (segment, (u64::from(index) - start) as usize)
}

impl<O: DelayedOperation> OpTable<O> {
    pub(crate) fn new() -> Self {
        let table = OpTable {
            segments: std::array::from_fn(|_| OnceLock::new()),
            high_water: StdAtomicU32::new(0),
            free: std::array::from_fn(|_| FreeList::default()),
        };
        // The first segment up front, so small purgatories never race to create it.
        table.segment(0);
        table
    }

    fn segment(&self, k: usize) -> &Segment<O> {
        self.segments[k].get_or_init(|| Segment {
            slots: (0..FIRST_SEGMENT << k).map(|_| Slot::new()).collect(),
            tags: (0..FIRST_SEGMENT << k).map(|_| AtomicU8::new(0)).collect(),
        })
    }

    /// The segment holding slot `index`, and the slot's offset in it.
    #[inline]
    fn segment_of(&self, index: u32) -> (&Segment<O>, usize) {
        let (k, offset) = locate(index);
        match self.segments[k].get() {
            Some(segment) => (segment, offset),
            // Only reachable for an index never handed out (a corrupt `OpRef`).
            None => (self.segment(k), offset),
        }
    }

    /// Where the slot and the tag of `op` are.
    #[inline]
    pub(crate) fn find(&self, op: OpRef) -> Found<'_, O> {
        let (segment, offset) = self.segment_of(op.index);
        Found {
            slot: &segment.slots[offset],
            tag: &segment.tags[offset],
            op,
        }
    }

    #[inline]
    fn tag(&self, index: u32) -> &AtomicU8 {
        let (segment, offset) = self.segment_of(index);
        &segment.tags[offset]
    }

    #[inline]
    fn slot(&self, index: u32) -> &Slot<O> {
        let (segment, offset) = self.segment_of(index);
        &segment.slots[offset]
    }

    /// Hands out `n` free slot indices (appended to `out`): the calling thread's free
    /// list first, then other threads', then new slots.
    fn allocate(&self, n: usize, out: &mut impl Extend<u32>) {
        if n == 0 {
            return;
        }
        let mine = stripe_index();
        let mut missing = n;
        for i in 0..STRIPES {
            let list = &self.free[(mine + i) % STRIPES];
            // A stale "empty" only costs a new slot; a stale "not empty" one lock.
            if list.available.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut free = list.indices.lock();
            let take = missing.min(free.len());
            let from = free.len() - take;
            out.extend(free.drain(from..));
            list.available.store(free.len(), Ordering::Relaxed);
            missing -= take;
            if missing == 0 {
                return;
            }
        }
        let count = u32::try_from(missing).expect("batch fits in u32");
        let first = self.high_water.fetch_add(count, Ordering::Relaxed);
        let last = first
            .checked_add(count - 1)
            .expect("more than 2^32 operations in flight");
        // Make sure the segments exist before anyone looks the slots up.
        let (first_segment, _) = locate(first);
        let (last_segment, _) = locate(last);
        for k in first_segment..=last_segment {
            self.segment(k);
        }
        out.extend(first..=last);
    }

    /// Pulls the slots of `refs` into this core's cache, ready to be written, before a
    /// batch locks them one after the other.
    ///
    /// Locking a slot is a locked instruction, and the CPU does not start the next one
    /// (nor its cache miss) until the previous one is done; slots last written by
    /// another core then cost one full miss each, in sequence. Plain stores do not wait
    /// for each other: one to each slot first puts all the misses in flight at once.
    pub(crate) fn prepare(&self, refs: impl IntoIterator<Item = OpRef>) {
        for op in refs {
            self.slot(op.index).touch.store(0, Ordering::Relaxed);
        }
    }

    /// Finishes taking the operations of `vacated` (see [`Locked::take_deferred`]):
    /// updates their slots' tags, then frees the slots.
    pub(crate) fn vacate(&self, vacated: &[Vacated]) {
        for v in vacated {
            self.tag(v.index).store(v.tag, Ordering::Release);
        }
        let list = &self.free[stripe_index()];
        let mut free = list.indices.lock();
        free.extend(vacated.iter().filter(|v| !v.retired).map(|v| v.index));
        list.available.store(free.len(), Ordering::Relaxed);
    }

    /// Puts `op` in a free slot (not listed yet) and returns it locked.
    #[cfg(test)]
    pub(crate) fn insert(&self, op: O) -> Locked<'_, O> {
        let mut index = smallvec::SmallVec::<[u32; 1]>::new();
        self.allocate(1, &mut index);
        self.occupy(index[0], op)
    }

    /// Puts `op` in slot `index` (just allocated) and returns it locked.
    fn occupy(&self, index: u32, op: O) -> Locked<'_, O> {
        let slot = self.slot(index);
        let mut state = slot.state.lock();
        debug_assert!(state.op.is_none(), "slot {index} handed out while occupied");
        state.op = Some(op);
        state.timer = None;
        state.keys = 0;
        let op = OpRef {
            index,
            generation: slot.generation.load(Ordering::Relaxed),
        };
        Locked {
            table: self,
            op,
            state,
        }
    }

    /// Puts every operation of `ops` in a free slot, locked, into the `Option`s of `into`
    /// (one each, in order; a caller takes them out one by one).
    pub(crate) fn insert_many<'a, 's>(
        &'a self,
        ops: impl ExactSizeIterator<Item = O>,
        into: impl Iterator<Item = &'s mut Option<Locked<'a, O>>>,
    ) where
        'a: 's,
    {
        let mut indices: smallvec::SmallVec<[u32; 64]> = smallvec::SmallVec::new();
        self.allocate(ops.len(), &mut indices);
        if indices.len() > 1 {
            for &index in &indices {
                self.slot(index).touch.store(0, Ordering::Relaxed);
            }
        }
        for ((index, op), slot) in indices.into_iter().zip(ops).zip(into) {
            *slot = Some(self.occupy(index, op));
        }
    }

    /// Locks the slot `op` names, if its operation is still there.
    pub(crate) fn lock(&self, op: OpRef) -> Option<Locked<'_, O>> {
        self.lock_found(self.find(op))
    }

    /// [`lock`](Self::lock) on a slot already found.
    #[inline]
    pub(crate) fn lock_found<'a>(&'a self, found: Found<'a, O>) -> Option<Locked<'a, O>> {
        let state = found.slot.state.lock();
        (found.slot.generation.load(Ordering::Relaxed) == found.op.generation).then_some(Locked {
            table: self,
            op: found.op,
            state,
        })
    }

    /// Whether the operation `op` names is still waiting (not taken). Without the lock:
    /// may report "waiting" for a moment after it was taken, never the other way round.
    #[inline]
    pub(crate) fn is_waiting(&self, op: OpRef) -> bool {
        self.slot(op.index).generation.load(Ordering::Acquire) == op.generation
    }

    /// Like [`is_waiting`](Self::is_waiting), from the generation's low 8 bits kept in a
    /// dense array (one byte per slot, 64 to a cache line) instead of the slot itself.
    /// "Not waiting" is certain (the generation moved on); "waiting" may also be a slot
    /// taken a multiple of 256 times since, which only keeps a stale entry listed until
    /// the next look. For purges and list scans, which read many entries: their slots
    /// are mostly in other cores' caches, the tags mostly in this one's.
    #[inline]
    pub(crate) fn may_be_waiting(&self, op: OpRef) -> bool {
        self.find(op).may_be_waiting()
    }

    /// [`may_be_waiting`](Self::may_be_waiting), made certain for the one case a later
    /// look would never settle: a retired slot keeps its tag forever, so an entry whose
    /// generation has the retired tag is checked against the slot itself (one entry in
    /// 256 reads its slot; the others only their tag).
    #[inline]
    pub(crate) fn is_waiting_by_tag(&self, op: OpRef) -> bool {
        self.may_be_waiting(op) && (op.generation as u8 != RETIRED as u8 || self.is_waiting(op))
    }

    /// Takes the operation `op` names, whatever its readiness (force, cancel).
    pub(crate) fn take(&self, op: OpRef) -> Option<Taken<O>> {
        self.lock(op).map(Locked::take)
    }

    /// Takes the operation `op` names for its expiry, without waiting for its lock: if
    /// another thread holds it, the expiry is left to that thread's claim after its
    /// [`Locked::unlock`] (see the module doc) and this returns `None`, as it does when
    /// the operation is already gone.
    pub(crate) fn take_for_expiry(&self, op: OpRef) -> Option<Taken<O>> {
        let slot = self.slot(op.index);
        if slot.generation.load(Ordering::Acquire) != op.generation {
            return None;
        }
        let locked = match self.try_lock(op) {
            Ok(locked) => locked,
            Err(()) => {
                slot.expiry_requested
                    .store(op.generation + 1, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                self.try_lock(op).ok()?
            }
        };
        locked.map(Locked::take)
    }

    /// After their holder unlocked the slots `ops` names: takes each operation whose
    /// expiry came while its slot was locked (without waiting: if someone holds a lock
    /// again, they see the request when they let go) and appends it to `expired`, for the
    /// caller to complete as expired. One fence serves the whole batch: each unlock is
    /// before it, each read of a request after it.
    pub(crate) fn claim_expiries<const N: usize>(
        &self,
        ops: &[OpRef],
        expired: &mut smallvec::SmallVec<[Taken<O>; N]>,
    ) {
        self.claim(ops.iter().map(|&op| (self.slot(op.index), op)), expired);
    }

    /// [`claim_expiries`](Self::claim_expiries) of slots already found.
    pub(crate) fn claim_found_expiries<const N: usize>(
        &self,
        found: &[Found<'_, O>],
        expired: &mut smallvec::SmallVec<[Taken<O>; N]>,
    ) {
        self.claim(found.iter().map(|f| (f.slot, f.op)), expired);
    }

    /// The claim of both: one fence, then each slot's request read.
    #[inline]
    fn claim<'s, const N: usize>(
        &self,
        slots: impl ExactSizeIterator<Item = (&'s Slot<O>, OpRef)>,
        expired: &mut smallvec::SmallVec<[Taken<O>; N]>,
    ) where
        O: 's,
    {
        if slots.len() == 0 {
            return;
        }
        fence(Ordering::SeqCst);
        for (slot, op) in slots {
            if slot.expiry_requested.load(Ordering::Relaxed) != op.generation + 1 {
                continue;
            }
            if let Ok(Some(locked)) = self.try_lock(op) {
                let mut taken = locked.take();
                taken.timer = None; // it fired
                expired.push(taken);
            }
        }
    }

    /// Locks the slot `op` names if nobody holds it: `Ok(None)` if its operation is gone,
    /// `Err` if the lock is held.
    fn try_lock(&self, op: OpRef) -> Result<Option<Locked<'_, O>>, ()> {
        let slot = self.slot(op.index);
        let state = slot.state.try_lock().ok_or(())?;
        Ok(
            (slot.generation.load(Ordering::Relaxed) == op.generation).then_some(Locked {
                table: self,
                op,
                state,
            }),
        )
    }
}

impl<'a, O: DelayedOperation> Locked<'a, O> {
    /// The operation's name.
    pub(crate) fn op(&self) -> OpRef {
        self.op
    }

    /// Records that the operation is listed on `keys` keys; call before listing it.
    pub(crate) fn set_keys(&mut self, keys: u32) {
        self.state.keys = keys;
    }

    /// Records the armed timeout; taken with the operation.
    pub(crate) fn arm(&mut self, timer: TimerHandle) {
        self.state.timer = Some(timer);
    }

    /// Takes the operation out and frees its slot.
    pub(crate) fn take(self) -> Taken<O> {
        let table = self.table;
        let (taken, vacated) = self.take_deferred();
        table.vacate(&[vacated]);
        taken
    }

    /// Takes the operation out and unlocks its slot, but leaves updating the slot's tag
    /// and freeing it to [`OpTable::vacate`], so that a batch does both for all its
    /// slots at once (the tag stores then overlap, and one free-list lock serves the
    /// batch). Until then the tag still says "maybe waiting" and nobody can reuse the
    /// slot: both are allowed states, the slot's generation has already moved on.
    pub(crate) fn take_deferred(mut self) -> (Taken<O>, Vacated) {
        let op = self
            .state
            .op
            .take()
            .expect("a locked slot holds its operation");
        let taken = Taken {
            op,
            timer: self.state.timer.take(),
            keys: self.state.keys,
        };
        // No occupant has generation `RETIRED` (a slot that reaches it is never handed out
        // again), so this never wraps.
        let generation = self.op.generation + 1;
        self.table
            .slot(self.op.index)
            .generation
            .store(generation, Ordering::Release);
        let vacated = Vacated {
            index: self.op.index,
            tag: generation as u8,
            retired: generation == RETIRED,
        };
        drop(self);
        (taken, vacated)
    }

    /// Unlocks the slot, leaving the operation in it; returns its name, which every holder
    /// that did not take the operation must pass to [`OpTable::claim_expiries`] (or its
    /// slot to [`OpTable::claim_found_expiries`]): its expiry may have come while the lock
    /// was held.
    pub(crate) fn unlock(self) -> OpRef {
        self.op
    }

    /// Runs `try_complete`, keeping the lock.
    #[inline]
    pub(crate) fn try_complete(&mut self) -> Result<bool, ()> {
        let op = self
            .state
            .op
            .as_mut()
            .expect("a locked slot holds its operation");
        try_complete_caught(op)
    }
}

/// Calls `try_complete`, turning a panic into `Err` (reported through `tracing`).
#[inline]
fn try_complete_caught<O: DelayedOperation>(op: &mut O) -> Result<bool, ()> {
    catch_unwind(AssertUnwindSafe(|| op.try_complete())).map_err(|payload| {
        tracing::error!(
            target: "purgatory",
            panic = panic_message(&*payload),
            "try_complete panicked; treated as not ready"
        );
    })
}

/// Test support: makes the next operation put in slot `index` (vacant, never handed
/// out again before this) occupy it with `generation`, as if it had been reused that
/// many times.
#[cfg(all(test, not(loom)))]
impl<O: DelayedOperation> OpTable<O> {
    pub(crate) fn age_slot(&self, index: u32, generation: u32) {
        let slot = self.slot(index);
        let _state = slot.state.lock();
        slot.generation.store(generation, Ordering::Release);
        self.tag(index).store(generation as u8, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Named(&'static str);

    impl DelayedOperation for Named {
        fn timeout(&self) -> std::time::Duration {
            std::time::Duration::from_secs(1)
        }
        fn try_complete(&mut self) -> bool {
            false
        }
        fn on_complete(&mut self, _how: crate::Completion) {}
    }

    #[test]
    fn a_stale_ref_never_touches_the_next_occupant_of_its_slot() {
        let table = OpTable::new();
        let a = {
            let mut locked = table.insert(Named("a"));
            locked.set_keys(2);
            locked.op()
        };
        assert!(table.is_waiting(a));
        let taken = table.take(a).expect("a is there");
        assert_eq!((taken.op.0, taken.keys), ("a", 2));
        assert!(!table.is_waiting(a));
        // The freed slot is handed out again (this thread's free list comes first).
        let b = table.insert(Named("b")).op();
        assert_eq!(b.index, a.index);
        assert_ne!(b.generation, a.generation);
        assert!(!table.is_waiting(a) && table.is_waiting(b));
        assert!(!table.may_be_waiting(a) && table.may_be_waiting(b));
        assert!(table.lock(a).is_none());
        assert!(table.take(a).is_none());
        assert_eq!(table.take(b).map(|t| t.op.0), Some("b"));
        assert!(table.take(b).is_none(), "taken once");
    }

    #[test]
    fn a_slot_whose_generation_is_used_up_is_retired_and_never_matches_again() {
        let table = OpTable::new();
        let first = table.insert(Named("first")).op();
        table.take(first).expect("first is there");
        table.age_slot(first.index, RETIRED - 1);
        let last = table.insert(Named("last")).op();
        assert_eq!(
            last,
            OpRef {
                index: first.index,
                generation: RETIRED - 1
            }
        );
        assert_eq!(table.take(last).map(|t| t.op.0), Some("last"));
        // Retired: every later operation gets another slot, and no name the old slot was
        // ever given (the last occupant's, the first one's) matches anything.
        for name in ["a", "b", "c"] {
            let next = table.insert(Named(name)).op();
            assert_ne!(next.index, first.index, "{name} got the retired slot");
        }
        for stale in [first, last] {
            assert!(!table.is_waiting(stale));
            assert!(table.lock(stale).is_none());
            assert!(table.take(stale).is_none());
        }
    }

    #[test]
    fn slots_beyond_the_first_segment_are_created_and_reused() {
        let table = OpTable::new();
        let n = FIRST_SEGMENT * 3 + 5;
        let mut locked: Vec<Option<Locked<'_, Named>>> = (0..n).map(|_| None).collect();
        table.insert_many((0..n).map(|_| Named("x")), locked.iter_mut());
        let refs: Vec<OpRef> = locked.iter().flatten().map(Locked::op).collect();
        drop(locked);
        let mut indices: Vec<u32> = refs.iter().map(|r| r.index).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), n, "one slot per operation");
        for op in &refs {
            assert!(table.take(*op).is_some());
        }
        let again = table.insert(Named("y")).op();
        assert!(
            (again.index as usize) < n,
            "a freed slot is reused before a new one"
        );
    }

    #[test]
    fn locate_covers_every_index_once_in_order() {
        let mut expected = (0usize, 0usize);
        for index in 0..(FIRST_SEGMENT as u32 * 15) {
            assert_eq!(locate(index), expected, "index {index}");
            expected.1 += 1;
            if expected.1 == FIRST_SEGMENT << expected.0 {
                expected = (expected.0 + 1, 0);
            }
        }
        let (segment, offset) = locate(u32::MAX);
        assert!(segment < SEGMENTS);
        assert!(offset < FIRST_SEGMENT << segment);
    }
}
