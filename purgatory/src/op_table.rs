//! The table of watched operations: one slot per operation in flight, named by an
//! [`OpRef`] (slot index and generation). This is where "exactly once" is decided; each
//! slot's own protocol (its state word: generation, lock, expiry request) is
//! `slot.rs`'s, with its state table.
//!
//! # Why a table of slots
//! Watcher lists, timer entries and handles name an operation by `OpRef`, a plain 8-byte
//! value, instead of sharing it through a reference count. Dropping a list entry is then
//! a plain memory operation (no atomic decrement on a line another core owns), a purge
//! only reads each entry's slot generation (loads the CPU overlaps), and an operation's
//! memory is reusable the moment it completes, however many stale entries still name it.
//!
//! # Who may do what with a slot
//! | caller | call | with the slot's generation | with another generation |
//! |---|---|---|---|
//! | a watch, for a new operation | [`insert_many`](OpTable::insert_many) | holds it from the start | - |
//! | a check, a force, a cancel | [`lock`](OpTable::lock) (waits for a holder) | holds it | `None`, without ever holding it |
//! | an expiry | [`take_for_expiry`](OpTable::take_for_expiry) (never waits) | takes it, or leaves it to the holder | `None`, writes nothing |
//! | a holder | [`Locked::take`] | takes it; every name of it is stale from then on | - |
//! | a holder | [`Locked::unlock`] | releases it, or, if its expiry came meanwhile, takes it for the caller to expire | - |
//!
//! # Invariants
//! - A slot's generation is its occupant's while occupied, and its next occupant's while
//!   free. It changes only when the occupant is taken, in the store that releases the
//!   slot, so an `OpRef` names its operation from insertion until it is taken, and
//!   nothing ever after: a stale `OpRef` (in a list, a timer entry or a handle) finds
//!   another generation and touches nothing. It does not even hold the slot for a moment
//!   (the lock compares the generation in the same instruction that takes it), so a stale
//!   name never stands between an operation and its expiry.
//! - Generations never wrap: a slot whose generation reaches [`RETIRED`] (after
//!   2^32 - 1 operations) is retired instead of freed and never handed out again, so a
//!   stale `OpRef` can never match a later operation, at any uptime. (The cost: one slot
//!   per 2^32 - 1 operations of one slot. A retired slot's tag is the tag of `RETIRED`; a
//!   stale entry with that tag, or with an unfilled slot's tag (0), is checked against
//!   the slot itself ([`OpTable::is_waiting_by_tag`]) by purges and by a
//!   `check_and_complete` on its key, which drop it.)
//! - The operation stays in its slot until exactly one thread takes it out, holding the
//!   slot under the matching generation. Whoever takes it completes it (or hands it
//!   back, for a cancel); every later attempt finds another generation. So `on_complete`
//!   runs at most once, and `try_complete` (called by the holder, on the value in place)
//!   never runs concurrently with itself or after the operation was taken.
//! - An expiry never waits for a holder (its `try_complete` is user code, which may
//!   block): it leaves the expiry in the slot's word, and the holder's unlock, which must
//!   compare-and-swap that same word, finds it and hands the expiry over to its caller
//!   ([`Locked::unlock`] returns a [`HandedOver`], the slot still held until the caller
//!   takes the operation out to expire it). Every holder holds the slot
//!   under its occupant's name, so every request is honoured: never none.
//! - A [`Locked`] dropped without `take` or `unlock` still releases the slot, and an
//!   expiry that came meanwhile is kept among the table's orphans
//!   ([`OpTable::take_orphans`]), which the next reaper round or `advance_clock`
//!   completes, or shutdown, or the purgatory's drop (if no round runs any more). Every
//!   path consumes its `Locked`, and every user panic that could unwind while a slot is
//!   held is caught (`try_complete` and its payload's drop, a key's `Hash`, `Eq` and
//!   `Drop` while listing, the `tracing` subscriber), so this is reached only by a panic
//!   of the purgatory's own code.
//! - `state.span` is the `tracing` span current at the watch (`span.rs`), put in with the
//!   operation and taken with it: the taker enters it around the callbacks, or closes it.
//! - `state.timer` is the operation's armed timeout; it is taken with the operation, so
//!   the taker (and only it) disarms the timer. The watcher arms the timer while holding
//!   the slot, so a completion can never miss a timer armed after it.
//! - A slot goes back to the free lists only after its occupant was taken, and is handed
//!   out again only from there: one occupant per slot at a time.
//! - Slots live in segments that never move (segment `k` holds `FIRST_SEGMENT << k`
//!   slots, from index `FIRST_SEGMENT * (2^k - 1)`); they are made as new slots reach
//!   them and given back, a bounded step at a time, once a burst has drained
//!   (`op_table/give_back.rs`, with its state tables).
//! - A segment is made of zeroed memory: every slot of it unfilled (`slot.rs`: no name
//!   matches it, nothing reads its state). A slot is filled, free for the segment's
//!   floor generation, by the thread it is first handed out to, before that thread names
//!   it to anyone ([`new_slots`](OpTable::new_slots)); slots are handed out in order
//!   from a segment's first, so those ever filled are a prefix, at most
//!   [`Segment::reach`] long once the segment was unlinked. Generations start at 1, so an
//!   unfilled slot's generation (0) is below every name's.
//! - The free lists' indices are all below `high_water`, and every slot below it
//!   exists.
//! - No slot is waited for ([`OpTable::lock`]) while another is held (a batch watch
//!   tries its operations one slot at a time, after releasing them all, see `watch.rs`);
//!   the free-list locks (and the lock of the slots set aside, taken under one by a
//!   vacate) are leaves, taken with slots held and never the other way round.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32 as StdAtomicU32, AtomicU8, Ordering};

use timer_core::TimerHandle;

use crate::counters::{stripe_index, ThisStripe, STRIPES};
use crate::operation::{Completion, DelayedOperation};
use crate::pins::{Pinned, Pins};
pub(crate) use crate::slot::RETIRED;
use crate::slot::{ExpiryAttempt, Slot, Unlocked};
use crate::span::CarriedSpan;
use crate::sync::{AtomicPtr, Mutex, Parker};
use crate::user_code::{Site, UserCode};

mod give_back;
use give_back::{Aside, Growth, Pending};

/// Slots in the first segment (each next segment doubles).
#[cfg(not(loom))]
const FIRST_SEGMENT: usize = 1024;
#[cfg(loom)]
const FIRST_SEGMENT: usize = 8;

/// Enough segments for every `u32` index.
const SEGMENTS: usize = 33 - FIRST_SEGMENT.trailing_zeros() as usize;

/// The bits of a generation its tag keeps. Under loom none: every tag matches every
/// generation, as if every stale entry's tag collided with its slot's, so the models
/// reach the slot behind every entry a check or a purge looks at.
#[cfg(not(loom))]
const TAG_MASK: u8 = u8::MAX;
#[cfg(loom)]
const TAG_MASK: u8 = 0;

/// The tag of an unfilled slot (zeroed memory, see [`Segment::new`]).
const UNFILLED_TAG: u8 = 0;

/// The tag a retired slot keeps.
const RETIRED_TAG: u8 = tag_of(RETIRED);

/// The tag of `generation`: its low 8 bits.
#[inline]
const fn tag_of(generation: u32) -> u8 {
    generation as u8 & TAG_MASK
}

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
    /// The span current at the watch (`span.rs`), taken with the operation.
    span: CarriedSpan,
    timer: Option<TimerHandle>,
    /// With the feature `metrics`: when its timeout was armed (ns on the timer's clock),
    /// or [`NOT_ARMED`], for its wait-time histogram.
    #[cfg(feature = "metrics")]
    since: u64,
}

impl<O> Drop for OpState<O> {
    /// Reached for an occupied slot only when its table is dropped with the operation
    /// still in it (after a panic of the purgatory's own code): its span is dropped
    /// with it, plainly, as the operation is (a span's own drop glue is off, `span.rs`).
    fn drop(&mut self) {
        self.span.drop_plainly();
    }
}

/// [`Taken::since`] of an operation never armed (completed while being watched).
#[cfg(feature = "metrics")]
pub(crate) const NOT_ARMED: u64 = u64::MAX;

/// An operation taken out of its slot, with the timer it still has armed and its key
/// count. Whoever has it owes the operation its completion (or its return to the caller,
/// for a cancel).
#[must_use = "a taken operation must be completed or handed back"]
pub(crate) struct Taken<O> {
    pub(crate) op: O,
    /// The span to enter around its callbacks, or to close if it is handed back.
    pub(crate) span: CarriedSpan,
    pub(crate) timer: Option<TimerHandle>,
    pub(crate) keys: u32,
    /// When its timeout was armed (ns on the timer's clock), or [`NOT_ARMED`].
    #[cfg(feature = "metrics")]
    pub(crate) since: u64,
}

/// One slot of the table, the operation's key count, and a word written only to pull
/// its line into a cache.
///
/// The key count sits beside the slot, not in its state, so that both `u32`s fill what
/// would otherwise be padding: with a 24-byte operation (the load tool's) a slot is 64
/// bytes, where it was 72 (test `a_slot_for_a_24_byte_operation_is_one_cache_line`).
/// In a segment that starts on a cache line (mimalloc's do) each slot is then one line;
/// glibc's start 16 or 32 bytes into one, which still keeps a slot's word and operation,
/// all a check reads of it, on one line. At 72 bytes, most slots had them on two.
struct TableSlot<O> {
    slot: Slot<OpState<O>>,
    /// How many watcher entries name the operation: 0 until it is listed, then its key
    /// count (so a taker knows how many stale entries it leaves). Part of the slot's
    /// state: read and written only by the slot's holder, so relaxed (the slot's lock
    /// orders the accesses of successive holders).
    keys: StdAtomicU32,
    /// Written (never read) by [`OpTable::prepare`] to pull the slot's line into this
    /// core's cache ahead of locking it.
    touch: StdAtomicU32,
}

impl<O> OpState<O> {
    fn vacant() -> Self {
        OpState {
            op: None,
            span: CarriedSpan::default(),
            timer: None,
            #[cfg(feature = "metrics")]
            since: NOT_ARMED,
        }
    }
}

impl<O> TableSlot<O> {
    /// An unfilled slot, as zeroed memory is one (see [`Segment::new`]).
    #[cfg(loom)]
    fn unfilled() -> Self {
        TableSlot {
            slot: Slot::unfilled(),
            keys: StdAtomicU32::new(0),
            touch: StdAtomicU32::new(0),
        }
    }

    /// The slot every name of a segment given back finds: no name matches it.
    fn gone() -> Self {
        TableSlot {
            slot: Slot::retired(OpState::vacant()),
            keys: StdAtomicU32::new(0),
            touch: StdAtomicU32::new(0),
        }
    }
}

/// Free lists: one per stripe of threads; under loom two, so that the models' steps over
/// every list (the give-back's) stay within loom's bound on branches (the models run
/// three or four threads, which then share lists as more than `STRIPES` threads do).
const FREE_LISTS: usize = if cfg!(loom) { 2 } else { STRIPES };

/// Free slot indices of one stripe of threads.
#[repr(align(128))]
struct FreeList {
    indices: Mutex<Vec<u32>>,
    /// `indices.len()` as of its last change (written under the lock, by
    /// [`publish`](Self::publish)), for the give-back's count of free slots.
    available: std::sync::atomic::AtomicUsize,
    /// This list's bits in [`FreeMask`].
    bits: u32,
}

impl FreeList {
    /// The free list at position `at` of the table's.
    fn new(at: usize) -> Self {
        FreeList {
            indices: Mutex::new(Vec::new()),
            available: Default::default(),
            bits: (1 << at) | (1 << (at + FREE_LISTS)),
        }
    }

    /// Records the list's new length `len`, under its lock, in `available` and in
    /// `mask` (its bit set while the list holds any slot). Every change of a list's
    /// length is published here before its lock is released, and only the holder of the
    /// lock writes the list's bit: so once every holder is done, the bit and
    /// `available` both say what the list holds. The bit is written only when the list
    /// turns empty or stops being so (a read-modify-write of a word every allocation
    /// reads).
    #[inline]
    fn publish(&self, len: usize, mask: &FreeMask) {
        let was = self.available.load(Ordering::Relaxed);
        self.available.store(len, Ordering::Relaxed);
        if (was == 0) != (len == 0) {
            mask.flip(self.bits, len != 0);
        }
    }

    /// [`publish`](Self::publish) after taking one slot: the list held some, so its bit
    /// changes only if it is empty now (one test, where `publish` compares before and
    /// after: 5 instructions a watch).
    #[inline(always)]
    fn publish_taken_one(&self, len: usize, mask: &FreeMask) {
        debug_assert_ne!(self.available.load(Ordering::Relaxed), 0, "{len} left");
        self.available.store(len, Ordering::Relaxed);
        if len == 0 {
            mask.flip(self.bits, false);
        }
    }
}

/// Which free lists hold slots: bits `i` and `i + FREE_LISTS` for list `i` (twice, so a
/// shift alone turns the lists round to start at any one), kept by
/// [`FreeList::publish`], so
/// that an allocation goes straight to a list with slots, the calling thread's first,
/// then the next ones round, without looking at the empty ones in between. A hint, read
/// without a lock, as `available` was: a stale "empty" only costs a new slot, a stale
/// "not empty" one lock. On its own cache line: it changes when lists empty or fill
/// (the reaper's, a few times a round), not at every allocation or free.
///
/// Probing the lists in turn cost 9 instructions for each empty one passed over; a
/// watcher thread that never completes anything (its own list empty) passed over its
/// own, at least, on every watch (callgrind, `expiring_watches`: two probes a watch).
#[repr(align(128))]
#[derive(Default)]
struct FreeMask(StdAtomicU32);

const _: () = assert!(
    FREE_LISTS <= 16,
    "FreeMask keeps each list's bit twice in a u32"
);

impl FreeMask {
    #[inline]
    fn flip(&self, bits: u32, on: bool) {
        if on {
            self.0.fetch_or(bits, Ordering::Relaxed);
        } else {
            self.0.fetch_and(!bits, Ordering::Relaxed);
        }
    }

    /// The lists with slots, as offsets from list `mine` (below `FREE_LISTS`): bit `i`
    /// for list `(mine + i) % FREE_LISTS`.
    #[inline(always)]
    fn from(&self, mine: usize) -> u32 {
        debug_assert!(mine < FREE_LISTS);
        (self.0.load(Ordering::Relaxed) >> mine) & ((1 << FREE_LISTS) - 1)
    }
}

/// A slot whose operation was taken by [`Locked::take_deferred`], waiting for
/// [`OpTable::vacate`] (or, its tag already updated, [`OpTable::free_tagged`]).
pub(crate) struct Vacated {
    index: u32,
    tag: u8,
    retired: bool,
}

/// Slots taken with [`OpTable::take_for_expiry_deferred`], freed together: when
/// [`VACATE_LATER`] have gathered, and when this is dropped (at the end of a batch, or
/// while a panic unwinds through it), so none is lost. Until then each slot is taken but
/// not reusable, an allowed state (see [`Locked::take_deferred`]); a thread stuck in a
/// callback keeps at most `VACATE_LATER - 1` slots out of use meanwhile.
///
/// Each slot's tag is updated at once, by [`OpTable::take_for_expiry_deferred`], before
/// the operation's callbacks run: only the free is deferred. The callbacks of the batch
/// may purge or check a key (user code on the reaper), and to those an operation already
/// taken must read as gone, as after every other completion; a tag updated at the flush
/// kept up to 32 expired operations' entries listed through them.
///
/// Freeing one slot at a time took the free list's lock once per expiry: 87 of the
/// reaper's 880 instructions per expiry (callgrind, `benches/examples/expiring_watches`).
///
/// It keeps only the indices of the slots to free, in an array: a retired slot is never
/// freed (see [`free_tagged`](OpTable::free_tagged)), so it is not kept at all. Kept as
/// whole [`Vacated`]s in a `SmallVec`, each push cost about 15 instructions more.
pub(crate) struct VacateLater<'a, O: DelayedOperation> {
    table: &'a OpTable<O>,
    /// The slots to free: the first `len`.
    indices: [u32; VACATE_LATER],
    /// With debug assertions and under loom, the tag each was taken with, checked when
    /// it is freed (as `free_tagged` checks).
    #[cfg(any(loom, debug_assertions))]
    tags: [u8; VACATE_LATER],
    /// Below `VACATE_LATER` between calls: a push that fills the array frees them all.
    len: usize,
}

/// Most slots a [`VacateLater`] gathers before it frees them.
pub(crate) const VACATE_LATER: usize = 32;

impl<'a, O: DelayedOperation> VacateLater<'a, O> {
    pub(crate) fn new(table: &'a OpTable<O>) -> Self {
        VacateLater {
            table,
            indices: [0; VACATE_LATER],
            #[cfg(any(loom, debug_assertions))]
            tags: [0; VACATE_LATER],
            len: 0,
        }
    }

    /// Adds a slot to free; frees them all once [`VACATE_LATER`] have gathered.
    #[inline]
    pub(crate) fn push(&mut self, vacated: Vacated) {
        if vacated.retired {
            // Never freed (see `free_tagged`).
            return;
        }
        let len = self.len;
        self.indices[len] = vacated.index;
        #[cfg(any(loom, debug_assertions))]
        {
            self.tags[len] = vacated.tag;
        }
        self.len = len + 1;
        if self.len == VACATE_LATER {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let len = std::mem::take(&mut self.len);
        if len > 0 {
            // Their tags were stored as each was taken (see above).
            #[cfg(any(loom, debug_assertions))]
            for (&index, &tag) in self.indices[..len].iter().zip(&self.tags[..len]) {
                self.table.check_tagged(index, tag);
            }
            self.table.free_slots(self.indices[..len].iter().copied());
        }
    }
}

impl<O: DelayedOperation> Drop for VacateLater<'_, O> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Where the slot and the tag of the operation an [`OpRef`] names are: found once
/// ([`OpTable::find`]) for the several looks a check takes at one list entry (its tag,
/// its lock), instead of working the segment out for each.
pub(crate) struct Found<'a, O> {
    slot: &'a TableSlot<O>,
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
    /// The name it was found by.
    #[inline]
    pub(crate) fn op(&self) -> OpRef {
        self.op
    }

    /// [`OpTable::may_be_waiting`] of this operation.
    #[inline]
    pub(crate) fn may_be_waiting(&self) -> bool {
        self.tag.load(Ordering::Acquire) == tag_of(self.op.generation)
    }

    /// Starts bringing the slot's word and state into this core's cache and returns
    /// without waiting for them ([`Slot::prefetch`]). A loop over many names (a check's
    /// list entries) finds and prefetches each a few entries before it locks it, so that
    /// the cache misses of consecutive slots overlap instead of each lock waiting for its
    /// own. A hint only: it reads and writes nothing of the slot (a stale name's slot is
    /// no longer its operation's, harmlessly). Does nothing under loom (it orders
    /// nothing) or Miri, or off x86-64.
    #[inline]
    pub(crate) fn prefetch(&self) {
        self.slot.slot.prefetch();
    }
}

/// A slot held under the name of the operation in it. Consume it with
/// [`take`](Self::take), [`take_deferred`](Self::take_deferred) or
/// [`unlock`](Self::unlock); dropping it unlocks it too (see the module doc).
pub(crate) struct Locked<'a, O: DelayedOperation> {
    table: &'a OpTable<O>,
    slot: &'a TableSlot<O>,
    op: OpRef,
}

pub(crate) struct OpTable<O> {
    /// Segment `k`, or null while it does not exist (never made, or given back). Made
    /// and given back under `growth`; read under a pin (`pins.rs`).
    segments: [AtomicPtr<Segment<O>>; SEGMENTS],
    /// Slots below this index exist (their segments are made); the next new slot's
    /// index. Raised by new slots, lowered by a segment given back, both under `growth`.
    high_water: StdAtomicU32,
    /// Who may be reading a segment (see `pins.rs`).
    pins: Pins,
    /// What a stale name of a segment given back finds: a slot no name matches, and its
    /// tag.
    gone: TableSlot<O>,
    gone_tag: AtomicU8,
    /// Making and giving back segments (see "Giving memory back" in the module doc).
    growth: Mutex<Growth<O>>,
    /// Held by the one thread that makes a segment, outside `growth` (see
    /// [`new_slots`](Self::new_slots)).
    making: Mutex<()>,
    /// The free slots of the top segment while it is being emptied, handed out only
    /// when every free list is empty (`give_back.rs`, "Setting aside").
    aside: Aside,
    /// What the give-back's steps left pending, readable without `growth`.
    giving_back: Pending,
    free: [FreeList; FREE_LISTS],
    /// Which of `free` hold slots.
    free_mask: FreeMask,
    /// Where threads wait for a slot held by another.
    parker: Parker,
    /// Operations whose expiry came while a [`Locked`] that was dropped unconsumed held
    /// their slot (see the module doc), for [`take_orphans`](Self::take_orphans).
    orphans: parking_lot::Mutex<Vec<TakenExpiry<O>>>,
    has_orphans: AtomicBool,
}

/// One segment of slots and their tags, created together, so that one look-up finds both.
struct Segment<O> {
    slots: Box<[TableSlot<O>]>,
    /// The low 8 bits of each slot's generation, packed 64 to a cache line, for telling
    /// stale list entries apart without touching their slots (see
    /// [`OpTable::may_be_waiting`]).
    tags: Box<[AtomicU8]>,
    /// The index of its first slot: `FIRST_SEGMENT * (2^k - 1)` for segment `k`.
    first: usize,
    /// The generation its slots start with, as each is filled ([`OpTable::new_slots`]).
    floor: u32,
    /// How many of its first slots may have been filled: every slot from here on is
    /// unfilled. Written under `growth` when the segment is unlinked (from
    /// `high_water`, which every slot handed out is below), and by the table's drop; a
    /// linked segment's slots are handed out from its first on, so the ones handed out
    /// are a prefix. Read by the give-back's scan and the drop, which never touch the
    /// pages of slots never used.
    reach: StdAtomicU32,
    /// Under loom: written when the segment would be freed, read by every look-up, so
    /// that the models catch a look-up the grace period does not cover (a data race).
    #[cfg(loom)]
    alive: loom::cell::UnsafeCell<bool>,
}

impl<O> Segment<O> {
    /// Slot `index` of this segment, without a bounds check: the offset of an index in
    /// the segment is below its length by construction. Its offset is `index` less the
    /// segment's [`first`](Self::first), loaded beside the slots' address, where working
    /// it out from `index` took 2 instructions more. With the segment found by
    /// [`segment_of`], a purge's look at an entry's tag went from 26 instructions to 24
    /// (about 4 entries an operation, callgrind `expiring_watches`).
    ///
    /// # Safety
    /// `index` is in this segment: this is segment `locate(index).0` of its table (which
    /// holds `FIRST_SEGMENT << k` slots and tags from index `first`, see
    /// [`OpTable::live_segment`]), so `index - first < FIRST_SEGMENT << k`.
    #[inline]
    unsafe fn slot_at(&self, index: u32) -> &TableSlot<O> {
        let offset = (index as usize).wrapping_sub(self.first);
        debug_assert!(offset < self.slots.len(), "slot {index} not in its segment");
        // SAFETY: `offset < self.slots.len()` (the caller's promise), checked in debug
        // builds.
        unsafe { self.slots.get_unchecked(offset) }
    }

    /// The tag of slot `index`, as [`slot_at`](Self::slot_at) finds the slot.
    ///
    /// # Safety
    /// As for [`slot_at`](Self::slot_at).
    #[inline]
    unsafe fn tag_at(&self, index: u32) -> &AtomicU8 {
        let offset = (index as usize).wrapping_sub(self.first);
        debug_assert!(offset < self.tags.len(), "slot {index} not in its segment");
        // SAFETY: `offset < self.tags.len()` (the caller's promise), checked in debug
        // builds.
        unsafe { self.tags.get_unchecked(offset) }
    }

    /// Segment `k`, every slot unfilled (`slot.rs`), to be filled with `floor` as its
    /// next generation when it is first handed out.
    ///
    /// Its slots and tags are zeroed memory, which is what an unfilled slot and a tag of
    /// 0 are: nothing is written here, and a large segment new to the process comes as
    /// pages the system maps (and zeroes) only when a slot on them is first filled.
    /// Writing every slot here, as this did before, held the watch that reached a new
    /// segment for 20-37 ms at a million operations (`benches/examples/watch_tail.rs`),
    /// and twice that at each doubling. (An allocator that reuses memory for a segment
    /// clears it in `alloc_zeroed`: glibc, once it has raised its mapping threshold, for
    /// a segment of up to 32 MiB made again after a give-back: 2.4-8.6 ms.)
    fn new(k: usize, floor: u32) -> Box<Self> {
        let len = FIRST_SEGMENT << k;
        Box::new(Segment {
            slots: zeroed_slots(len),
            tags: zeroed_tags(len),
            first: FIRST_SEGMENT * ((1 << k) - 1),
            floor,
            reach: StdAtomicU32::new(0),
            #[cfg(loom)]
            alive: loom::cell::UnsafeCell::new(true),
        })
    }

    /// Fills the slots from `from` to `to` (excluded) that are unfilled, handed out just
    /// now by [`OpTable::new_slots`], and sets their tags.
    ///
    /// # Safety
    /// The caller was just handed these slots as new (the range is in this segment) and
    /// has named none of them to anybody yet.
    unsafe fn fill(&self, from: u32, to: u32) {
        // Slots from here on were never filled: handed out in order from the segment's
        // first while it is linked, they reached no further than `reach` before it was
        // last unlinked (if it ever was).
        let never_filled = self.first + self.reach();
        for index in from..to {
            // SAFETY: `index` is in this segment (the caller's promise).
            let (slot, tag) = unsafe { (self.slot_at(index), self.tag_at(index)) };
            let surely_unfilled = index as usize >= never_filled;
            // SAFETY: just handed out as new, named to nobody (the caller's promise);
            // never filled if `surely_unfilled`, by `reach`.
            if unsafe {
                slot.slot
                    .fill(OpState::vacant(), self.floor, surely_unfilled)
            } {
                tag.store(tag_of(self.floor), Ordering::Relaxed);
            }
        }
    }

    /// Records that its slots below `high_water` (an index) may have been filled.
    fn reached(&self, high_water: u32) {
        let upto = (high_water as usize)
            .saturating_sub(self.first)
            .min(self.slots.len());
        self.reach.fetch_max(upto as u32, Ordering::Relaxed);
    }

    /// How many of its first slots may have been filled (see [`reach`](Self::reach)).
    fn reach(&self) -> usize {
        self.reach.load(Ordering::Relaxed) as usize
    }
}

impl<O> Drop for Segment<O> {
    /// Drops the state of each slot that was filled (vacant, unless the table is dropped
    /// with operations in it); reads no slot past [`reach`](Self::reach). An operation
    /// whose drop panics does not stop the others' (as a slice's drop goes on): the first
    /// panic is raised again once all were dropped.
    fn drop(&mut self) {
        let reach = self.reach();
        let mut panicked = None;
        for slot in &mut self.slots[..reach] {
            // SAFETY: the slots are dropped with the segment, right after.
            let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                slot.slot.drop_state()
            }));
            if let Err(payload) = dropped {
                panicked.get_or_insert(payload);
            }
        }
        if let Some(payload) = panicked {
            std::panic::resume_unwind(payload);
        }
    }
}

/// `len` unfilled slots: zeroed memory from the global allocator, no byte of it written
/// here (see [`Segment::new`]).
#[cfg(not(loom))]
fn zeroed_slots<O>(len: usize) -> Box<[TableSlot<O>]> {
    // SAFETY: all zeros are a valid `TableSlot`: its atomics read 0, and its state is a
    // `MaybeUninit` (any bytes) in an `UnsafeCell` (no invariant); that is an unfilled
    // slot (`slot.rs`).
    unsafe { zeroed_box(len) }
}

/// Under loom, whose atomics are not plain memory: each slot made unfilled.
#[cfg(loom)]
fn zeroed_slots<O>(len: usize) -> Box<[TableSlot<O>]> {
    (0..len).map(|_| TableSlot::unfilled()).collect()
}

/// `len` tags of 0 (`AtomicU8` is std's, also under loom).
fn zeroed_tags(len: usize) -> Box<[AtomicU8]> {
    // SAFETY: a zero byte is a valid `AtomicU8`.
    unsafe { zeroed_box(len) }
}

/// `len` values of `T` (not zero-sized), all zero bytes, from the global allocator's
/// `alloc_zeroed`: fresh memory from the system is not written at all (its pages are
/// mapped, zeroed, as they are first written); memory the allocator reuses, it clears.
///
/// # Safety
/// All-zero bytes are a valid `T`.
unsafe fn zeroed_box<T>(len: usize) -> Box<[T]> {
    let layout = std::alloc::Layout::array::<T>(len).expect("segment size");
    assert!(layout.size() != 0, "a segment has slots, of a sized type");
    // SAFETY: the layout's size is not zero (checked above).
    let memory = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if memory.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: room for `len` values allocated by the global allocator with the layout of
    // `[T; len]`, which `Box<[T]>` frees with; every byte zero, a valid `T` (the
    // caller's promise).
    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(memory, len)) }
}

/// The segment and offset of slot `index`.
///
/// Segment `k` holds `FIRST_SEGMENT << k` slots from index `FIRST_SEGMENT * (2^k - 1)`,
/// so `index + FIRST_SEGMENT` lies in `[FIRST_SEGMENT << k, FIRST_SEGMENT << (k + 1))`:
/// its top bit gives the segment and the bits below it the offset (a few instructions
/// fewer than dividing into blocks; eight lookups a watch and its expiry). The look-ups
/// take only the segment ([`segment_of`]) and the offset from it ([`Segment::slot_at`]).
#[inline]
fn locate(index: u32) -> (usize, usize) {
    let segment = segment_of(index);
    let first = FIRST_SEGMENT * ((1 << segment) - 1);
    (segment, index as usize - first)
}

/// The segment of slot `index`: [`locate`]'s first half, for the look-ups, which take
/// the offset from the segment (see [`Segment::slot_at`]). It is the top bit of
/// `(index + FIRST_SEGMENT) / FIRST_SEGMENT` (at least 1, below 2^23, so a `u32`): taken
/// as `63 - leading_zeros` of the sum less `FIRST_SEGMENT`'s bits, the compiler kept
/// the leading zeros and worked the segment back from them, 3 instructions more a
/// look-up.
#[inline]
fn segment_of(index: u32) -> usize {
    let shifted = u64::from(index) + FIRST_SEGMENT as u64;
    ((shifted >> FIRST_SEGMENT.trailing_zeros()) as u32).ilog2() as usize
}

impl<O: DelayedOperation> OpTable<O> {
    pub(crate) fn new() -> Self {
        let table = OpTable {
            segments: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            high_water: StdAtomicU32::new(0),
            pins: Pins::default(),
            gone: TableSlot::gone(),
            gone_tag: AtomicU8::new(tag_of(RETIRED)),
            growth: Mutex::new(Growth::new()),
            making: Mutex::new(()),
            aside: Aside::default(),
            giving_back: Pending::default(),
            free: std::array::from_fn(FreeList::new),
            free_mask: FreeMask::default(),
            parker: Parker::default(),
            orphans: parking_lot::Mutex::new(Vec::new()),
            has_orphans: AtomicBool::new(false),
        };
        // The first segment up front, so small purgatories never race to create it; it
        // is never given back.
        table.segments[0].store(Box::into_raw(Segment::new(0, 1)), Ordering::Release);
        table
    }

    /// Pins the table for the calling thread: required to look a slot up by a name
    /// that may be stale (see `pins.rs`).
    #[inline]
    pub(crate) fn pin(&self) -> Pinned<'_> {
        self.pins.pin()
    }

    /// The slot `index` and its tag: in its segment, or, if the segment does not exist
    /// (given back, or never made: a stale or corrupt name), the slot no name matches.
    ///
    /// Without a pin, only for a slot the caller holds or has just been handed
    /// (allocated and not yet free again), or has taken and not yet vacated
    /// ([`vacate`](Self::vacate) stores its tag after `release_taken`, holding neither
    /// a pin nor the slot): its segment cannot be given back meanwhile, since only a
    /// segment whose every slot handed out is free (set aside) is, and such a slot is
    /// not.
    #[inline]
    fn slot_and_tag(&self, index: u32) -> (&TableSlot<O>, &AtomicU8) {
        match self.live_segment(segment_of(index)) {
            // SAFETY: the segment of `index`.
            Some(segment) => unsafe { (segment.slot_at(index), segment.tag_at(index)) },
            None => (&self.gone, &self.gone_tag),
        }
    }

    /// Segment `k`, unless it does not exist; for [`slot_and_tag`](Self::slot_and_tag)
    /// and [`tag`](Self::tag) only, whose callers keep it linked (see there).
    ///
    /// It holds `FIRST_SEGMENT << k` slots and as many tags, from index `first`, what
    /// [`locate`] says of segment `k` (what [`Segment::slot_at`] relies on): only a
    /// segment made for `k` (`Segment::new(k, _)`) is ever linked as segment `k`, or one
    /// [`relink`](Self::relink) finds for `k` (unlinked from `k`, or kept with that many
    /// slots), and a segment's slots and tags are never resized.
    #[inline]
    fn live_segment(&self, k: usize) -> Option<&Segment<O>> {
        let segment = self.segments[k].load(Ordering::Acquire);
        if segment.is_null() {
            return None;
        }
        // SAFETY: a non-null segment pointer is a live segment (`Box::into_raw`), freed
        // only after it was unlinked and every pin that could have read it was dropped
        // (`pins.rs`); the caller holds a pin, or a slot of it that is in no free list
        // (held, just handed out, or taken and not yet vacated), which keeps it linked
        // (see `slot_and_tag`).
        let segment = unsafe { &*segment };
        debug_assert!(
            segment.first == FIRST_SEGMENT * ((1 << k) - 1)
                && segment.slots.len() == FIRST_SEGMENT << k
                && segment.tags.len() == FIRST_SEGMENT << k
        );
        #[cfg(loom)]
        segment.alive.with(|alive| {
            // SAFETY: loom checks this read against the write that marks it freed.
            assert!(unsafe { *alive }, "a look-up of a freed segment")
        });
        Some(segment)
    }

    /// Where the slot and the tag of `op` are.
    #[inline]
    pub(crate) fn find<'a>(&'a self, pin: &'a Pinned<'_>, op: OpRef) -> Found<'a, O> {
        debug_assert!(self.pins.owns(pin));
        let (slot, tag) = self.slot_and_tag(op.index);
        Found { slot, tag, op }
    }

    /// The tag of slot `index`, as [`slot_and_tag`](Self::slot_and_tag) finds it (the
    /// same rules), without working out the slot.
    #[inline]
    fn tag(&self, index: u32) -> &AtomicU8 {
        self.live_segment(segment_of(index))
            // SAFETY: the segment of `index`.
            .map_or(&self.gone_tag, |segment| unsafe { segment.tag_at(index) })
    }

    /// The slot `index`, as [`slot_and_tag`](Self::slot_and_tag) finds it (the same
    /// rules), without looking up its tag (a watch's `occupy` needs none; through
    /// `slot_and_tag`, the tag's bounds check stayed, 4 instructions, when look-ups were
    /// bounds-checked).
    #[inline]
    fn slot(&self, index: u32) -> &TableSlot<O> {
        self.live_segment(segment_of(index))
            // SAFETY: the segment of `index`.
            .map_or(&self.gone, |segment| unsafe { segment.slot_at(index) })
    }

    /// Hands out `n` free slot indices (appended to `out`): the calling thread's free
    /// list first, then other threads', then new slots.
    fn allocate(&self, n: usize, out: &mut impl Extend<u32>) {
        if n == 0 {
            return;
        }
        let mine = stripe_index() % FREE_LISTS;
        let mut missing = n;
        let mut lists = self.free_mask.from(mine);
        while lists != 0 {
            // A stale "empty" only costs a new slot; a stale "not empty" one lock.
            let list = &self.free[(mine + lists.trailing_zeros() as usize) % FREE_LISTS];
            lists &= lists - 1;
            let mut free = list.indices.lock();
            let take = missing.min(free.len());
            let from = free.len() - take;
            out.extend(free.drain(from..));
            list.publish(free.len(), &self.free_mask);
            missing -= take;
            if missing == 0 {
                return;
            }
        }
        missing -= self.aside.take(missing, out);
        if missing == 0 {
            return;
        }
        let count = u32::try_from(missing).expect("batch fits in u32");
        out.extend(self.new_slots(count));
    }

    /// `count` (at least 1) slots not in use, above every slot that exists, their
    /// segments created and the slots filled.
    ///
    /// A segment is made (allocated, as zeroed memory: see [`Segment::new`]) outside
    /// `growth`, so that the reaper's `give_back` and the threads that find slots
    /// already made never wait for it; under `making`, so that the threads of a burst
    /// that all reach a missing segment make it once (the others wait for it there, then
    /// find it linked). Lock order: `making`, then `growth`. The slots handed out are
    /// filled after `growth` is released, by the caller alone (nobody else can name
    /// them yet, and their segments stay linked while they are in use).
    fn new_slots(&self, count: u32) -> std::ops::RangeInclusive<u32> {
        let slots = self.link_new_slots(count);
        let (from, to) = (*slots.start(), *slots.end() + 1);
        let mut index = from;
        while index < to {
            let (k, offset) = locate(index);
            let upto = to.min(index - offset as u32 + (FIRST_SEGMENT << k) as u32);
            let segment = self
                .live_segment(k)
                .expect("the segment of a slot just handed out is linked");
            // SAFETY: `index..upto` is in segment `k`, just handed out to this caller as
            // new slots and named to nobody yet.
            unsafe { segment.fill(index, upto) };
            index = upto;
        }
        slots
    }

    /// [`new_slots`](Self::new_slots) but the fill: hands the slots out and links their
    /// segments.
    fn link_new_slots(&self, count: u32) -> std::ops::RangeInclusive<u32> {
        // A segment made for this call, with its index and the floor it was made with.
        let mut made: Option<(usize, u32, Box<Segment<O>>)> = None;
        let mut making = None;
        loop {
            let mut growth = self.growth.lock();
            let first = self.high_water.load(Ordering::Relaxed);
            // Never wraps: a wrapped index would hand out slots in use.
            let end = first
                .checked_add(count)
                .expect("more than 2^32 operations in flight");
            let last = end - 1;
            // Make sure the segments exist before anyone looks the slots up.
            let (first_segment, _) = locate(first);
            let (last_segment, _) = locate(last);
            let mut missing = None;
            for k in first_segment..=last_segment {
                if !self.segments[k].load(Ordering::Relaxed).is_null() {
                    continue;
                }
                let segment = match self.relink(&mut growth, k) {
                    Some(segment) => segment,
                    None => match made.take() {
                        // Made with the floor it still has: no segment `k` was linked
                        // (and so none given back) meanwhile.
                        Some((at, floor, segment)) if at == k && floor == growth.floors[k] => {
                            segment
                        }
                        _ => {
                            missing = Some((k, growth.floors[k]));
                            break;
                        }
                    },
                };
                self.segments[k].store(Box::into_raw(segment), Ordering::Release);
            }
            let Some((k, floor)) = missing else {
                self.high_water.store(end, Ordering::Relaxed);
                return first..=last;
            };
            drop(growth);
            if making.is_none() {
                // Another thread may be making it: look again once it is done.
                making = Some(self.making.lock());
                continue;
            }
            made = Some((k, floor, Segment::new(k, floor)));
        }
    }

    /// The free list of the calling thread's stripe.
    #[inline]
    fn own_free_list(&self) -> &FreeList {
        &self.free[stripe_index() % FREE_LISTS]
    }

    /// [`allocate`](Self::allocate) of one slot, without a buffer, for a thread of stripe
    /// `stripe`.
    #[inline]
    fn allocate_one(&self, stripe: ThisStripe) -> u32 {
        let mine = stripe.index() % FREE_LISTS;
        let mut lists = self.free_mask.from(mine);
        while lists != 0 {
            let list = &self.free[(mine + lists.trailing_zeros() as usize) % FREE_LISTS];
            lists &= lists - 1;
            let mut free = list.indices.lock();
            if let Some(index) = free.pop() {
                list.publish_taken_one(free.len(), &self.free_mask);
                return index;
            }
        }
        if let Some(index) = self.aside.take_one() {
            return index;
        }
        *self.new_slots(1).start()
    }

    /// Pulls the slots of `refs` into this core's cache, ready to be written, before a
    /// batch locks them one after the other.
    ///
    /// Locking a slot is a locked instruction, and the CPU does not start the next one
    /// (nor its cache miss) until the previous one is done; slots last written by
    /// another core then cost one full miss each, in sequence. Plain stores do not wait
    /// for each other: one to each slot first puts all the misses in flight at once.
    pub(crate) fn prepare(&self, _pin: &Pinned<'_>, refs: impl IntoIterator<Item = OpRef>) {
        for op in refs {
            self.slot(op.index).touch.store(0, Ordering::Relaxed);
        }
    }

    /// Finishes taking the operations of `vacated` (see [`Locked::take_deferred`]):
    /// updates their slots' tags, then frees the slots.
    pub(crate) fn vacate(&self, vacated: &[Vacated]) {
        for v in vacated {
            let tag = self.tag(v.index);
            if cfg!(any(loom, debug_assertions)) {
                assert!(
                    !std::ptr::eq(tag, &self.gone_tag),
                    "slot {} vacated after its segment was given back",
                    v.index
                );
            }
            tag.store(v.tag, Ordering::Release);
        }
        self.free_tagged(vacated);
    }

    /// [`vacate`](Self::vacate) for slots whose tags were already updated
    /// ([`take_for_expiry_deferred`](Self::take_for_expiry_deferred) stores each before
    /// the callbacks run): only frees them. Storing the same tags again cost about 10 of
    /// the reaper's instructions per expiry (callgrind, `expiring_watches`). Nobody else
    /// writes a taken slot's tag before it is freed here, so the stored one still holds
    /// (checked in debug builds and under loom).
    pub(crate) fn free_tagged(&self, vacated: &[Vacated]) {
        if cfg!(any(loom, debug_assertions)) {
            for v in vacated {
                self.check_tagged(v.index, v.tag);
            }
        }
        self.free_slots(vacated.iter().filter(|v| !v.retired).map(|v| v.index));
    }

    /// Checks that slot `index`, about to be freed, is in a segment still linked and has
    /// the tag `tag` it was taken with (for debug builds and loom).
    fn check_tagged(&self, index: u32, tag: u8) {
        let stored = self.tag(index);
        assert!(
            !std::ptr::eq(stored, &self.gone_tag),
            "slot {index} vacated after its segment was given back"
        );
        assert_eq!(
            stored.load(Ordering::Relaxed),
            tag,
            "slot {index} freed before its tag was updated"
        );
    }

    /// Puts the slots `indices` (taken, tagged, none retired) on the calling thread's
    /// free list (or aside, `give_back.rs`).
    #[inline]
    fn free_slots(&self, indices: impl Iterator<Item = u32> + Clone) {
        let list = self.own_free_list();
        let mut free = list.indices.lock();
        // Read under the list's lock (`give_back.rs`, "Setting aside").
        let aside_from = self.aside.from();
        if aside_from != u32::MAX {
            return self.vacate_setting_aside(list, free, indices, aside_from);
        }
        free.extend(indices);
        list.publish(free.len(), &self.free_mask);
    }

    /// Puts `op` and its span in a free slot (not listed yet) and returns it locked.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn insert_one(&self, op: O, span: CarriedSpan) -> Locked<'_, O> {
        self.insert_one_on(ThisStripe::read(), op, span)
    }

    /// Puts `op` and its span in a free slot (not listed yet) and returns it locked, for
    /// a thread of stripe `stripe` (the calling thread's, read already).
    #[inline]
    pub(crate) fn insert_one_on(
        &self,
        stripe: ThisStripe,
        op: O,
        span: CarriedSpan,
    ) -> Locked<'_, O> {
        let index = self.allocate_one(stripe);
        self.occupy(index, (op, span))
    }

    /// Puts `op` and its span in slot `index` (just allocated) and returns it locked.
    #[inline]
    fn occupy(&self, index: u32, (op, span): (O, CarriedSpan)) -> Locked<'_, O> {
        let table_slot = self.slot(index);
        let slot = &table_slot.slot;
        if cfg!(any(loom, debug_assertions)) {
            assert!(
                !std::ptr::eq(slot, &self.gone.slot),
                "slot {index} handed out from a segment given back"
            );
        }
        let generation = slot.occupy();
        // SAFETY: `occupy` locked the slot for this thread.
        unsafe {
            slot.with_state(|state| {
                debug_assert!(state.op.is_none(), "slot {index} handed out while occupied");
                state.op = Some(op);
                // No drop glue: nothing of the empty span there is dropped.
                state.span = span;
                state.timer = None;
                #[cfg(feature = "metrics")]
                {
                    state.since = NOT_ARMED;
                }
            });
        }
        table_slot.keys.store(0, Ordering::Relaxed);
        Locked {
            table: self,
            slot: table_slot,
            op: OpRef { index, generation },
        }
    }

    /// Puts every operation of `ops` (with its span) in a free slot, locked, into the
    /// `Option`s of `into` (one each, in order; a caller takes them out one by one).
    pub(crate) fn insert_many<'a, 's>(
        &'a self,
        ops: impl ExactSizeIterator<Item = (O, CarriedSpan)>,
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
        // Through a slice: the `SmallVec`'s own iterator tested whether it had spilled
        // at every index.
        for ((&index, op), slot) in indices[..].iter().zip(ops).zip(into) {
            *slot = Some(self.occupy(index, op));
        }
    }

    /// Locks the slot `op` names, if its operation is still there, waiting while another
    /// thread holds it. `None` once the operation is gone, without holding the slot.
    pub(crate) fn lock<'a>(&'a self, pin: &'a Pinned<'_>, op: OpRef) -> Option<Locked<'a, O>> {
        let found = self.find(pin, op);
        self.lock_found(found)
    }

    /// [`lock`](Self::lock) on a slot already found.
    #[inline]
    pub(crate) fn lock_found<'a>(&'a self, found: Found<'a, O>) -> Option<Locked<'a, O>> {
        // `then`, not `then_some`: a `Locked` made for nothing would unlock on drop.
        found
            .slot
            .slot
            .lock(found.op.generation, &self.parker)
            .then(|| Locked {
                table: self,
                slot: found.slot,
                op: found.op,
            })
    }

    /// Whether the operation `op` names is still waiting (not taken). Without the lock:
    /// may report "waiting" for a moment after it was taken, never the other way round.
    #[inline]
    pub(crate) fn is_waiting(&self, _pin: &Pinned<'_>, op: OpRef) -> bool {
        self.slot(op.index).slot.generation() == op.generation
    }

    /// Like [`is_waiting`](Self::is_waiting), from the generation's low 8 bits kept in a
    /// dense array (one byte per slot, 64 to a cache line) instead of the slot itself.
    /// "Not waiting" is certain (the generation moved on); "waiting" may also be a slot
    /// taken a multiple of 256 times since, which only keeps a stale entry listed until
    /// the next look. For purges and list scans, which read many entries: their slots
    /// are mostly in other cores' caches, the tags mostly in this one's.
    #[inline]
    pub(crate) fn may_be_waiting(&self, pin: &Pinned<'_>, op: OpRef) -> bool {
        debug_assert!(self.pins.owns(pin));
        // The tag alone: `find` would work out (and bounds-check) the slot too.
        self.tag(op.index).load(Ordering::Acquire) == tag_of(op.generation)
    }

    /// [`may_be_waiting`](Self::may_be_waiting), made certain for the two cases a later
    /// look might never settle, where a slot's tag may never move again: a retired slot
    /// keeps its tag forever, and an unfilled slot (of a segment given back and made
    /// anew, not handed out that far again) has tag 0 until the table grows that far.
    /// An entry whose generation has either tag is checked against the slot itself (two
    /// entries in 256 read their slot; the others only their tag). Without the second
    /// case, a stale entry whose generation is a multiple of 256 stayed listed, and kept
    /// its key's list, for as long as its slot stayed unfilled.
    #[inline]
    pub(crate) fn is_waiting_by_tag(&self, pin: &Pinned<'_>, op: OpRef) -> bool {
        // The two tags are 0 and 255, the two below 2 once 1 is added: one compare (the
        // plain `tag == UNFILLED_TAG || tag == RETIRED_TAG` cost about 6 instructions more a
        // watch and its expiry in `expiring_watches`).
        const _: () = assert!(UNFILLED_TAG == 0 && (RETIRED_TAG == u8::MAX || cfg!(loom)));
        let lasting_tag = tag_of(op.generation).wrapping_add(1) < 2;
        self.may_be_waiting(pin, op) && (!lasting_tag || self.is_waiting(pin, op))
    }

    /// Takes the operation `op` names, whatever its readiness (force, cancel).
    pub(crate) fn take(&self, pin: &Pinned<'_>, op: OpRef) -> Option<Taken<O>> {
        self.lock(pin, op).map(Locked::take)
    }

    /// Takes the operation `op` names for its expiry, without waiting: if another thread
    /// holds its slot, the expiry is left to that holder, whose unlock hands it to its
    /// caller to complete as expired (see `slot.rs`), and this returns `None`, as it does
    /// when the operation is already gone. The timer entry has fired (`how` is
    /// `Expired`) or was drained by shutdown (`Shutdown`), which a holder is told: the
    /// taken operation has no timer to cancel.
    pub(crate) fn take_for_expiry<'a>(
        &'a self,
        pin: &'a Pinned<'_>,
        op: OpRef,
        how: Completion,
    ) -> Option<Taken<O>> {
        let (taken, vacated) = self.take_for_expiry_deferred(pin, op, how)?;
        self.free_tagged(&[vacated]);
        Some(taken)
    }

    /// [`take_for_expiry`](Self::take_for_expiry), leaving the slot's free to
    /// [`free_tagged`](Self::free_tagged) (see [`Locked::take_deferred`]): for the
    /// reaper, which frees the slots of a batch's expiries together ([`VacateLater`]).
    /// The tag is updated here, not left to the free: the operation's callbacks, and the
    /// next ones of the batch, may purge or check a key, and to them an operation
    /// already taken must read as gone.
    #[inline]
    pub(crate) fn take_for_expiry_deferred(
        &self,
        pin: &Pinned<'_>,
        op: OpRef,
        how: Completion,
    ) -> Option<(Taken<O>, Vacated)> {
        let found = self.find(pin, op);
        match found
            .slot
            .slot
            .lock_or_request_expiry(op.generation, how == Completion::Shutdown)
        {
            ExpiryAttempt::Locked => {
                let (mut taken, vacated) = Locked {
                    table: self,
                    slot: found.slot,
                    op,
                }
                .take_deferred();
                found.tag.store(vacated.tag, Ordering::Release);
                // Its timer fired or was drained: there is none to cancel.
                taken.timer = None;
                Some((taken, vacated))
            }
            ExpiryAttempt::Requested | ExpiryAttempt::Gone => None,
        }
    }

    /// The operations whose expiry only a dropped, unconsumed [`Locked`] saw (see the
    /// module doc), for the caller to complete as expired. Cheap when there are none.
    pub(crate) fn take_orphans(&self) -> Vec<TakenExpiry<O>> {
        if !self.has_orphans.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut orphans = self.orphans.lock();
        self.has_orphans.store(false, Ordering::Relaxed);
        std::mem::take(&mut *orphans)
    }
}

impl<O> Drop for OpTable<O> {
    /// Frees every segment, made or given back (nobody else can reach them now).
    /// An operation's drop that panics (with the table dropped while operations are in
    /// it) stops no other segment's: the first panic is raised again at the end.
    fn drop(&mut self) {
        let high_water = *self.high_water.get_mut();
        let mut panicked = None;
        for segment in &self.segments {
            let segment = segment.swap(std::ptr::null_mut(), Ordering::Relaxed);
            if !segment.is_null() {
                // SAFETY: made by `Box::into_raw` and unlinked here, once.
                let segment = unsafe { Box::from_raw(segment) };
                segment.reached(high_water);
                let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    drop(segment);
                }));
                if let Err(payload) = dropped {
                    panicked.get_or_insert(payload);
                }
            }
        }
        // SAFETY: `gone` is dropped right after, and nobody reads it any more.
        unsafe { self.gone.slot.drop_state() };
        if let Some(payload) = panicked {
            std::panic::resume_unwind(payload);
        }
    }
}

impl<'a, O: DelayedOperation> Locked<'a, O> {
    /// The operation's name.
    pub(crate) fn op(&self) -> OpRef {
        self.op
    }

    /// Runs `f` on the slot's state.
    #[inline]
    fn state<R>(&mut self, f: impl FnOnce(&mut OpState<O>) -> R) -> R {
        // SAFETY: a `Locked` exists only while its slot is held under `op`, and the
        // `&mut self` makes this the one access through it.
        unsafe { self.slot.slot.with_state(f) }
    }

    /// Records that the operation is listed on `keys` keys; call before listing it.
    pub(crate) fn set_keys(&mut self, keys: u32) {
        self.slot.keys.store(keys, Ordering::Relaxed);
    }

    /// Records the armed timeout; taken with the operation.
    pub(crate) fn arm(&mut self, timer: TimerHandle) {
        self.state(|state| state.timer = Some(timer));
    }

    /// The armed timeout, if any (every waiting operation another thread can lock has
    /// one: a watch arms it before it first unlocks).
    pub(crate) fn timer(&mut self) -> Option<TimerHandle> {
        self.state(|state| state.timer)
    }

    /// Records when the operation started waiting (ns on the timer's clock).
    #[cfg(feature = "metrics")]
    pub(crate) fn set_since(&mut self, since: u64) {
        self.state(|state| state.since = since);
    }

    /// Takes the operation out and frees its slot.
    pub(crate) fn take(self) -> Taken<O> {
        let table = self.table;
        let (taken, vacated) = self.take_deferred();
        table.vacate(&[vacated]);
        taken
    }

    /// Takes the operation out and releases its slot, but leaves updating the slot's tag
    /// and freeing it to [`OpTable::vacate`], so that a batch does both for all its
    /// slots at once (the tag stores then overlap, and one free-list lock serves the
    /// batch). Until then the tag still says "maybe waiting" and nobody can reuse the
    /// slot: both are allowed states, the slot's generation has already moved on.
    pub(crate) fn take_deferred(self) -> (Taken<O>, Vacated) {
        let mut this = ManuallyDrop::new(self);
        let keys = this.slot.keys.load(Ordering::Relaxed);
        let taken = this.state(|state| Taken {
            op: state.op.take().expect("a held slot holds its operation"),
            span: std::mem::take(&mut state.span),
            timer: state.timer.take(),
            keys,
            #[cfg(feature = "metrics")]
            since: state.since,
        });
        // No occupant has generation `RETIRED` (a slot that reaches it is never handed out
        // again), so this never wraps.
        let next = this.op.generation + 1;
        this.slot.slot.release_taken(next, &this.table.parker);
        let vacated = Vacated {
            index: this.op.index,
            tag: tag_of(next),
            retired: next == RETIRED,
        };
        (taken, vacated)
    }

    /// Releases the slot, leaving the operation in it, unless its timeout fired while it
    /// was held: then the slot stays held and comes back as [`HandedOver`], whose caller
    /// owes the operation its expiry (see [`HandedOver::take`]). No caller can miss an
    /// expiry that came while it held the slot: the one way to let go of it is through
    /// here (or `take`).
    #[must_use = "an expiry handed over here is the caller's to answer"]
    #[inline]
    pub(crate) fn unlock(self) -> Result<(), HandedOver<'a, O>> {
        let this = ManuallyDrop::new(self);
        match this
            .slot
            .slot
            .unlock(this.op.generation, &this.table.parker)
        {
            Unlocked::Released => Ok(()),
            Unlocked::MustExpire { by_shutdown } => Err(HandedOver {
                locked: ManuallyDrop::into_inner(this),
                how: if by_shutdown {
                    Completion::Shutdown
                } else {
                    Completion::Expired
                },
            }),
        }
    }

    /// Runs `try_complete` through the door, keeping the lock: a panic is caught (the
    /// slot is held: nothing of it may unwind from here) and means "not ready".
    #[inline]
    pub(crate) fn try_complete(&mut self, user: &UserCode) -> bool {
        self.state(|state| {
            let op = state.op.as_mut().expect("a held slot holds its operation");
            user.call(Site::TryComplete, || op.try_complete())
                .unwrap_or(false)
        })
    }
}

/// An operation taken out of its slot for its expiry, with whose expiry it was: what it
/// is to be answered (and counted) as, whenever that is.
pub(crate) struct TakenExpiry<O> {
    pub(crate) taken: Taken<O>,
    /// `Expired` (its timer fired) or `Shutdown` (shutdown drained it).
    pub(crate) how: Completion,
}

/// A slot still held whose operation's timeout fired while it was held: its holder's to
/// expire. Kept apart from [`Locked`] so that the holder can first tell whoever waits for
/// answers in progress (a shutdown, `Driver::work`) and then take it: a shutdown that
/// begins after the operation was taken out then waits for its answer.
#[must_use = "an expiry handed over is the holder's to answer"]
pub(crate) struct HandedOver<'a, O: DelayedOperation> {
    locked: Locked<'a, O>,
    /// Whose expiry: `Expired` (its timer fired) or `Shutdown` (shutdown drained it),
    /// what the operation is told whenever it is answered.
    how: Completion,
}

impl<O: DelayedOperation> HandedOver<'_, O> {
    /// Takes the operation out as expired (its timer fired or was drained, so it has
    /// none to cancel), freeing its slot.
    pub(crate) fn take(self) -> TakenExpiry<O> {
        let mut taken = self.locked.take();
        taken.timer = None;
        TakenExpiry {
            taken,
            how: self.how,
        }
    }
}

impl<O: DelayedOperation> Drop for Locked<'_, O> {
    /// Reached only when a panic unwinds through the purgatory while it holds a slot (every
    /// path consumes its `Locked`): releases the slot, and keeps an expiry that came
    /// meanwhile for [`OpTable::take_orphans`].
    fn drop(&mut self) {
        let this = Locked {
            table: self.table,
            slot: self.slot,
            op: self.op,
        };
        // `this` is consumed by `unlock` (no second drop); `self` is dropped by its caller.
        if let Err(handed_over) = this.unlock() {
            let orphan = handed_over.take();
            let table = self.table;
            table.orphans.lock().push(orphan);
            table.has_orphans.store(true, Ordering::Release);
            crate::user_code::report_orphan();
        }
    }
}

/// Test support: makes the next operation put in slot `index` (vacant, never handed
/// out again before this) occupy it with `generation`, as if it had been reused that
/// many times.
#[cfg(all(test, not(loom)))]
impl<O: DelayedOperation> OpTable<O> {
    pub(crate) fn age_slot(&self, index: u32, generation: u32) {
        self.slot(index).slot.set_free_generation(generation);
        self.tag(index).store(tag_of(generation), Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    pub(super) struct Named(pub(super) &'static str);

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
    fn a_slot_for_a_24_byte_operation_is_one_cache_line() {
        /// The load tool's request: a reference, a `u64` and a `u32`.
        #[allow(dead_code)]
        struct Request(&'static u8, u64, u32);
        assert_eq!(std::mem::size_of::<Request>(), 24);
        // `metrics` adds the time the operation was armed.
        let line = if cfg!(feature = "metrics") { 72 } else { 64 };
        assert_eq!(std::mem::size_of::<TableSlot<Request>>(), line);
    }

    #[test]
    fn a_stale_ref_never_touches_the_next_occupant_of_its_slot() {
        let table = OpTable::new();
        let pin = table.pin();
        let a = {
            let mut locked = table.insert_one(Named("a"), CarriedSpan::default());
            locked.set_keys(2);
            locked.op()
        };
        assert!(table.is_waiting(&pin, a));
        let taken = table.take(&pin, a).expect("a is there");
        assert_eq!((taken.op.0, taken.keys), ("a", 2));
        assert!(!table.is_waiting(&pin, a));
        // The freed slot is handed out again (this thread's free list comes first).
        let b = table.insert_one(Named("b"), CarriedSpan::default()).op();
        assert_eq!(b.index, a.index);
        assert_ne!(b.generation, a.generation);
        assert!(!table.is_waiting(&pin, a) && table.is_waiting(&pin, b));
        assert!(!table.may_be_waiting(&pin, a) && table.may_be_waiting(&pin, b));
        assert!(table.lock(&pin, a).is_none());
        assert!(table.take(&pin, a).is_none());
        assert_eq!(table.take(&pin, b).map(|t| t.op.0), Some("b"));
        assert!(table.take(&pin, b).is_none(), "taken once");
    }

    /// A and then B in one slot, B held: every call naming A returns at once, without
    /// holding the slot (it would otherwise wait for B's holder) and without touching B.
    #[test]
    fn a_stale_name_never_holds_the_slot_or_waits_for_its_holder() {
        let table = OpTable::new();
        let pin = table.pin();
        let a = table.insert_one(Named("a"), CarriedSpan::default()).op();
        drop(table.take(&pin, a).expect("a is there"));
        let held = table.insert_one(Named("b"), CarriedSpan::default());
        let b = held.op();
        assert_eq!(b.index, a.index);
        assert!(
            table.lock(&pin, a).is_none(),
            "a stale lock returns at once"
        );
        assert!(table.take(&pin, a).is_none());
        assert!(table
            .take_for_expiry(&pin, a, Completion::Expired)
            .is_none());
        // Nothing of those reached B: its holder unlocks it with no expiry to honour.
        assert!(held.unlock().is_ok());
        assert_eq!(table.take(&pin, b).map(|t| t.op.0), Some("b"));
    }

    #[test]
    fn an_expiry_that_finds_the_slot_held_is_handed_to_the_unlocker() {
        let table = OpTable::new();
        let pin = table.pin();
        let held = table.insert_one(Named("x"), CarriedSpan::default());
        let x = held.op();
        assert!(
            table
                .take_for_expiry(&pin, x, Completion::Expired)
                .is_none(),
            "the expiry does not wait"
        );
        assert!(table.is_waiting(&pin, x), "left to the holder");
        let expired = held
            .unlock()
            .expect_err("the unlock hands the expiry over")
            .take();
        assert_eq!(expired.taken.op.0, "x");
        assert!(expired.taken.timer.is_none(), "its timer fired");
        assert_eq!(expired.how, Completion::Expired, "the timeout's");
        assert!(!table.is_waiting(&pin, x));
        assert!(
            table
                .take_for_expiry(&pin, x, Completion::Expired)
                .is_none(),
            "taken once"
        );
    }

    #[test]
    fn a_holder_that_takes_the_operation_makes_a_requested_expiry_moot() {
        let table = OpTable::new();
        let pin = table.pin();
        let held = table.insert_one(Named("x"), CarriedSpan::default());
        let x = held.op();
        assert!(table
            .take_for_expiry(&pin, x, Completion::Expired)
            .is_none());
        assert_eq!(held.take().op.0, "x");
        // The slot is free and clean: the next occupant has no expiry waiting for it.
        let next = table.insert_one(Named("y"), CarriedSpan::default());
        assert_eq!(next.op().index, x.index);
        assert!(next.unlock().is_ok());
    }

    #[test]
    fn a_held_slot_dropped_unconsumed_keeps_its_expiry_as_an_orphan() {
        let table = OpTable::new();
        let pin = table.pin();
        assert!(table.take_orphans().is_empty());
        let held = table.insert_one(Named("x"), CarriedSpan::default());
        let x = held.op();
        assert!(table
            .take_for_expiry(&pin, x, Completion::Expired)
            .is_none());
        drop(held);
        let orphans = table.take_orphans();
        assert_eq!(
            orphans.iter().map(|o| o.taken.op.0).collect::<Vec<_>>(),
            ["x"]
        );
        assert!(!table.is_waiting(&pin, x));
        assert!(table.take_orphans().is_empty(), "taken once");
    }

    /// A thread waiting for a held slot is woken when the holder lets go: it gets the slot
    /// if the operation is still there, `None` if the holder took it.
    #[test]
    fn a_waiter_gets_the_slot_after_an_unlock_and_nothing_after_a_take() {
        let table = OpTable::new();
        let pin = table.pin();
        for holder_takes in [false, true] {
            let held = table.insert_one(Named("x"), CarriedSpan::default());
            let x = held.op();
            std::thread::scope(|s| {
                let waiter = s.spawn(|| table.lock(&pin, x).map(Locked::take).map(|t| t.op.0));
                std::thread::sleep(std::time::Duration::from_millis(20));
                if holder_takes {
                    assert_eq!(held.take().op.0, "x");
                    assert_eq!(waiter.join().unwrap(), None);
                } else {
                    assert!(held.unlock().is_ok());
                    assert_eq!(waiter.join().unwrap(), Some("x"));
                }
            });
            assert!(!table.is_waiting(&pin, x));
        }
    }

    #[test]
    fn a_slot_whose_generation_is_used_up_is_retired_and_never_matches_again() {
        let table = OpTable::new();
        let pin = table.pin();
        let first = table
            .insert_one(Named("first"), CarriedSpan::default())
            .op();
        drop(table.take(&pin, first).expect("first is there"));
        table.age_slot(first.index, RETIRED - 1);
        let last = table.insert_one(Named("last"), CarriedSpan::default()).op();
        assert_eq!(
            last,
            OpRef {
                index: first.index,
                generation: RETIRED - 1
            }
        );
        assert_eq!(table.take(&pin, last).map(|t| t.op.0), Some("last"));
        // Retired: every later operation gets another slot, and no name the old slot was
        // ever given (the last occupant's, the first one's) matches anything.
        for name in ["a", "b", "c"] {
            let next = table.insert_one(Named(name), CarriedSpan::default()).op();
            assert_ne!(next.index, first.index, "{name} got the retired slot");
        }
        for stale in [first, last] {
            assert!(!table.is_waiting(&pin, stale));
            assert!(table.lock(&pin, stale).is_none());
            assert!(table.take(&pin, stale).is_none());
        }
    }

    #[test]
    fn slots_beyond_the_first_segment_are_created_and_reused() {
        let table = OpTable::new();
        let pin = table.pin();
        let n = FIRST_SEGMENT * 3 + 5;
        let mut locked: Vec<Option<Locked<'_, Named>>> = (0..n).map(|_| None).collect();
        table.insert_many(
            (0..n).map(|_| (Named("x"), CarriedSpan::default())),
            locked.iter_mut(),
        );
        let refs: Vec<OpRef> = locked.iter().flatten().map(Locked::op).collect();
        drop(locked);
        let mut indices: Vec<u32> = refs.iter().map(|r| r.index).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), n, "one slot per operation");
        for op in &refs {
            assert!(table.take(&pin, *op).is_some());
        }
        let again = table.insert_one(Named("y"), CarriedSpan::default()).op();
        assert!(
            (again.index as usize) < n,
            "a freed slot is reused before a new one"
        );
    }

    /// A new segment is zeroed memory: only the slots handed out are written (filled,
    /// free for generation 1, their tags set), so making the segment writes nothing, and
    /// a stale name of a slot past them matches nothing there.
    #[test]
    fn a_segment_is_written_only_as_its_slots_are_handed_out() {
        let table = OpTable::new();
        let ops = fill(&table, FIRST_SEGMENT + 5);
        assert!(ops.iter().all(|op| op.generation == 1), "slots start at 1");
        let pin = table.pin();
        for index in FIRST_SEGMENT..FIRST_SEGMENT * 3 {
            let slot = &table.slot(index as u32).slot;
            if index < FIRST_SEGMENT + 5 {
                assert!(slot.is_filled(), "slot {index} handed out");
                assert_eq!(slot.generation(), 1);
                assert_eq!(table.tag(index as u32).load(Ordering::Relaxed), 1);
            } else {
                assert!(!slot.is_filled(), "slot {index} never handed out");
                assert_eq!(table.tag(index as u32).load(Ordering::Relaxed), 0);
                for generation in [0, 1] {
                    let stale = OpRef {
                        index: index as u32,
                        generation,
                    };
                    assert!(table.take(&pin, stale).is_none());
                    assert!(!table.find(&pin, stale).slot.slot.is_filled());
                }
            }
        }
        for op in &ops {
            assert!(table.take(&pin, *op).is_some());
        }
        drop(pin);
        let again = fill(&table, FIRST_SEGMENT + 6);
        assert_eq!(
            table.high_water.load(Ordering::Relaxed) as usize,
            FIRST_SEGMENT + 6
        );
        assert!(table.slot(FIRST_SEGMENT as u32 + 5).slot.is_filled());
        assert!(!table.slot(FIRST_SEGMENT as u32 + 6).slot.is_filled());
        assert_eq!(again.len(), FIRST_SEGMENT + 6);
    }

    /// A table dropped with operations still in it (only after a panic of the
    /// purgatory's own code) drops each of them once, across segments, even when one's
    /// drop panics; the panic comes out after.
    #[test]
    fn a_table_dropped_with_operations_in_it_drops_each_once_despite_a_panicking_drop() {
        use std::sync::atomic::AtomicUsize;
        static DROPPED: AtomicUsize = AtomicUsize::new(0);
        struct Counted(usize);
        impl Drop for Counted {
            fn drop(&mut self) {
                DROPPED.fetch_add(1, Ordering::Relaxed);
                if self.0 == 7 || self.0 == FIRST_SEGMENT + 7 {
                    panic!("drop {}", self.0);
                }
            }
        }
        impl DelayedOperation for Counted {
            fn timeout(&self) -> std::time::Duration {
                std::time::Duration::from_secs(1)
            }
            fn try_complete(&mut self) -> bool {
                false
            }
            fn on_complete(&mut self, _how: crate::Completion) {}
        }
        let n = FIRST_SEGMENT * 2;
        let table = OpTable::new();
        let mut locked: Vec<Option<Locked<'_, Counted>>> = (0..n).map(|_| None).collect();
        table.insert_many(
            (0..n).map(|i| (Counted(i), CarriedSpan::default())),
            locked.iter_mut(),
        );
        drop(locked);
        assert_eq!(DROPPED.load(Ordering::Relaxed), 0);
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(table)));
        assert!(dropped.is_err(), "the first panic comes out");
        assert_eq!(
            DROPPED.load(Ordering::Relaxed),
            n,
            "every operation dropped once"
        );
    }

    /// An operation that owns heap memory, so that Miri reports a state dropped twice
    /// (a double free), never (a leak) or read unfilled.
    struct Owned(#[allow(dead_code)] String);

    impl DelayedOperation for Owned {
        fn timeout(&self) -> std::time::Duration {
            std::time::Duration::from_secs(1)
        }
        fn try_complete(&mut self) -> bool {
            false
        }
        fn on_complete(&mut self, _how: crate::Completion) {}
    }

    fn insert_owned(table: &OpTable<Owned>, n: usize) -> Vec<OpRef> {
        (0..n)
            .map(|i| {
                table
                    .insert_one(Owned(format!("op {i}")), CarriedSpan::default())
                    .op()
            })
            .collect()
    }

    /// A stale name whose tag is an unfilled slot's (its generation a multiple of 256),
    /// on a slot of a segment given back and made anew but not handed out that far
    /// again: the tag alone cannot tell it is gone (and the slot's tag would not move
    /// until the table grows that far), so [`OpTable::is_waiting_by_tag`] reads the
    /// slot and says gone.
    #[test]
    fn a_stale_name_with_the_unfilled_tag_on_a_slot_made_anew_reads_as_gone() {
        let table = OpTable::new();
        let ops = fill(&table, FIRST_SEGMENT + 10);
        let pin = table.pin();
        // The occupant of a slot of segment 1 gets generation 256 (tag 0).
        let before = ops[FIRST_SEGMENT + 5];
        drop(table.take(&pin, before).expect("waiting"));
        table.age_slot(before.index, 256);
        let stale = table.insert_one(Named("x"), CarriedSpan::default()).op();
        assert_eq!((stale.index, stale.generation), (before.index, 256));
        assert_eq!(tag_of(stale.generation), UNFILLED_TAG);
        for op in ops.iter().chain([&stale]) {
            if *op != before {
                drop(table.take(&pin, *op).expect("waiting"));
            }
        }
        drop(pin);
        assert_eq!(table.give_back(), FIRST_SEGMENT * 2, "segment 1 unlinked");
        assert_eq!(table.give_back(), 0, "and freed");
        // Segment 1 made anew, its first slot handed out, the stale name's not.
        let again = *fill(&table, FIRST_SEGMENT + 1)
            .iter()
            .max_by_key(|op| op.index)
            .expect("filled");
        assert_eq!(again.index as usize, FIRST_SEGMENT);
        let pin = table.pin();
        assert!(
            table.may_be_waiting(&pin, stale),
            "the tags collide (else this test shows nothing)"
        );
        assert!(!table.is_waiting(&pin, stale));
        assert!(!table.is_waiting_by_tag(&pin, stale), "kept listed");
        assert!(table.lock(&pin, stale).is_none());
        assert!(table.is_waiting_by_tag(&pin, again));
    }

    /// A table dropped with operations still in it, across two segments (the second
    /// partly handed out): each operation is dropped once, no unfilled slot is read.
    #[test]
    fn a_table_dropped_with_operations_in_two_segments_drops_each_once() {
        let table = OpTable::new();
        let ops = insert_owned(&table, FIRST_SEGMENT + 7);
        let pin = table.pin();
        // Some taken (vacant again, filled), the rest left inside.
        for op in ops.iter().step_by(3) {
            assert!(table.take(&pin, *op).is_some());
        }
        drop(pin);
        drop(table);
    }

    /// A segment given back while a pin holds its grace, then linked again by new slots
    /// that go past how far it was handed out: the slots past its reach are filled at
    /// its floor, the ones before keep their generations (above every stale name), and
    /// the table dropped with operations in both parts drops each once.
    #[test]
    fn a_relinked_segment_filled_past_its_reach_then_dropped_with_operations() {
        let table = OpTable::new();
        let first = insert_owned(&table, FIRST_SEGMENT + 10);
        {
            let pin = table.pin();
            for op in &first {
                assert!(table.take(&pin, *op).is_some());
            }
        }
        let holding = table.pin();
        assert_eq!(table.give_back(), FIRST_SEGMENT * 2, "segment 1 unlinked");
        assert_eq!(
            table.high_water.load(Ordering::Relaxed) as usize,
            FIRST_SEGMENT
        );
        let again = insert_owned(&table, FIRST_SEGMENT + 20);
        for op in &again {
            assert!(table.is_waiting(&holding, *op));
        }
        // Linked again as it was: its first 10 slots keep their generations (2), the
        // next 10, never handed out before, are filled at its floor (1).
        let mut past: Vec<(u32, u32)> = again
            .iter()
            .filter(|op| op.index as usize >= FIRST_SEGMENT)
            .map(|op| (op.index - FIRST_SEGMENT as u32, op.generation))
            .collect();
        past.sort_unstable();
        let expected: Vec<(u32, u32)> = (0..20).map(|i| (i, if i < 10 { 2 } else { 1 })).collect();
        assert_eq!(past, expected);
        // No stale name of the first round matches anything of the second.
        for op in &first {
            assert!(!table.is_waiting(&holding, *op), "{op:?}");
            assert!(table.lock(&holding, *op).is_none(), "{op:?}");
        }
        drop(holding);
        drop(table);
    }

    /// Fills the table with `n` operations, returning their names (all released).
    pub(super) fn fill(table: &OpTable<Named>, n: usize) -> Vec<OpRef> {
        let mut locked: Vec<Option<Locked<'_, Named>>> = (0..n).map(|_| None).collect();
        table.insert_many(
            (0..n).map(|_| (Named("x"), CarriedSpan::default())),
            locked.iter_mut(),
        );
        let ops = locked.iter().flatten().map(Locked::op).collect();
        drop(locked);
        check_free_mask(table);
        ops
    }

    /// Every free list's bits in the mask, and its `available`, say what it holds (with
    /// no allocation or free under way).
    pub(super) fn check_free_mask<O>(table: &OpTable<O>) {
        let mask = table.free_mask.0.load(Ordering::Relaxed);
        for (i, list) in table.free.iter().enumerate() {
            let len = list.indices.lock().len();
            assert_eq!(list.available.load(Ordering::Relaxed), len, "list {i}");
            let bits = (1 << i) | (1 << (i + FREE_LISTS));
            assert_eq!(list.bits, bits);
            assert_eq!(
                mask & bits,
                if len > 0 { bits } else { 0 },
                "list {i}: {len}"
            );
        }
    }

    /// A thread whose own free list is empty takes the slots another thread freed
    /// (found through the mask), before any new slot; each list's bits follow it.
    #[test]
    fn an_allocation_takes_the_slots_another_thread_freed() {
        let table = OpTable::new();
        let ops = fill(&table, 300);
        let high = table.high_water.load(Ordering::Relaxed);
        for chunk in ops.chunks(100) {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let pin = table.pin();
                    for op in chunk {
                        assert!(table.take(&pin, *op).is_some());
                    }
                });
            });
            check_free_mask(&table);
        }
        for n in [1, 150, 149] {
            let again = fill(&table, n);
            assert!(again.iter().all(|op| op.index < high));
        }
        assert_eq!(
            table.high_water.load(Ordering::Relaxed),
            high,
            "no new slot"
        );
        assert_eq!(
            table.free_mask.0.load(Ordering::Relaxed),
            0,
            "every list empty"
        );
        let more = table.insert_one(Named("z"), CarriedSpan::default()).op();
        assert_eq!(more.index, high, "a new slot once every list is empty");
        check_free_mask(&table);
    }

    /// An operation taken for expiry with its free deferred reads as gone by its tag at
    /// once, before the slot is freed: the callbacks run in between, and a purge or a
    /// check they make must drop its entries.
    #[test]
    fn a_slot_taken_for_expiry_reads_as_gone_by_its_tag_before_it_is_freed() {
        let table = OpTable::new();
        let ops = fill(&table, 2);
        let high = table.high_water.load(Ordering::Relaxed);
        let pin = table.pin();
        let (_taken, vacated) = table
            .take_for_expiry_deferred(&pin, ops[0], Completion::Expired)
            .expect("waiting");
        assert!(!table.may_be_waiting(&pin, ops[0]), "tag left for the free");
        assert!(table.may_be_waiting(&pin, ops[1]));
        drop(pin);
        // Not freed yet: a new operation gets a new slot.
        fill(&table, 1);
        assert_eq!(table.high_water.load(Ordering::Relaxed), high + 1);
        table.vacate(&[vacated]);
    }

    /// Slots taken for expiry and freed later, together, are all freed: those a full
    /// `VacateLater` frees on the way and those it holds when a panic unwinds through
    /// it. None is lost (a second fill reuses every one) and every old name reads as
    /// gone by its tag.
    #[test]
    fn slots_vacated_later_are_all_freed_even_when_a_panic_unwinds() {
        let table = OpTable::new();
        let n = VACATE_LATER + 8;
        let first = fill(&table, n);
        let high = table.high_water.load(Ordering::Relaxed);
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let pin = table.pin();
            let mut vacating = VacateLater::new(&table);
            for op in &first {
                let (taken, vacated) = table
                    .take_for_expiry_deferred(&pin, *op, Completion::Expired)
                    .expect("waiting");
                assert!(taken.timer.is_none());
                vacating.push(vacated);
            }
            panic!("a bug between the takes and the end of the batch");
        }));
        assert!(unwound.is_err());
        let pin = table.pin();
        for op in &first {
            assert!(
                !table.is_waiting_by_tag(&pin, *op),
                "{op:?}: tag not updated"
            );
        }
        drop(pin);
        fill(&table, n);
        assert_eq!(
            table.high_water.load(Ordering::Relaxed),
            high,
            "every slot taken was freed and reused"
        );
    }

    /// A retired slot in a run of expiries (`VacateLater` keeps no place for it): it is
    /// never freed, never handed out again, and takes no place among the 32 a flush
    /// frees, so the other slots of the run, 65 of them, through two full arrays (the
    /// 33rd push starts the second) and one left for the drop, are all freed and reused.
    #[test]
    fn a_retired_slot_expired_later_is_never_freed_and_the_rest_of_the_run_is() {
        let table = OpTable::new();
        let n = 2 * VACATE_LATER + 2;
        let mut ops = fill(&table, n);
        let high = table.high_water.load(Ordering::Relaxed);
        // The slot of op 10 gets its last generation.
        let pin = table.pin();
        let old = ops[10];
        drop(table.take(&pin, old).expect("waiting"));
        table.age_slot(old.index, RETIRED - 1);
        let last = table.insert_one(Named("last"), CarriedSpan::default()).op();
        assert_eq!((last.index, last.generation), (old.index, RETIRED - 1));
        ops[10] = last;
        drop(pin);
        {
            let pin = table.pin();
            let mut vacating = VacateLater::new(&table);
            for op in &ops {
                let (_taken, vacated) = table
                    .take_for_expiry_deferred(&pin, *op, Completion::Expired)
                    .expect("waiting");
                assert_eq!(vacated.retired, *op == last);
                vacating.push(vacated);
                assert!(vacating.len < VACATE_LATER);
            }
            assert_eq!(vacating.len, 1);
        }
        let pin = table.pin();
        assert!(!table.is_waiting(&pin, last));
        assert!(!table.is_waiting_by_tag(&pin, last));
        drop(pin);
        let again = fill(&table, n - 1);
        assert_eq!(
            table.high_water.load(Ordering::Relaxed),
            high,
            "every slot of the run but the retired one was freed and reused"
        );
        assert!(again.iter().all(|op| op.index != last.index));
        let one_more = fill(&table, 1);
        assert_ne!(one_more[0].index, last.index, "the retired slot was freed");
        assert_eq!(table.high_water.load(Ordering::Relaxed), high + 1);
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
