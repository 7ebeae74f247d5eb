//! One slot of the op table (`op_table.rs`): room for one operation, and the one atomic
//! word that says whose it is, who holds it and whether its timeout came while it was
//! held. Every rule of "exactly once, never none" that concerns a single operation is a
//! transition of this word.
//!
//! # The word
//! | bits   | name       | meaning |
//! |--------|------------|---------|
//! | 63..32 | generation | the occupant's while the slot is occupied; the next occupant's while it is free |
//! | 4      | `FILLED`   | set in every word but an unfilled slot's (0): no name's compare ever matches an unfilled slot |
//! | 3      | `BY_SHUTDOWN` | with `EXPIRED` only: the expiry was shutdown's (it drained the operation's timer), not its timeout's |
//! | 2      | `EXPIRED`  | the occupant's timeout fired while the slot was locked: whoever unlocks it expires it |
//! | 1      | `PARKED`   | a thread sleeps in [`Slot::lock`], waiting for the slot |
//! | 0      | `LOCKED`   | a thread holds the slot: it alone may read or change the operation |
//!
//! # States
//! A name (an `OpRef`, `op_table.rs`) is a slot index and a generation `g`.
//!
//! (Below, `g` stands for the word of generation `g`, `FILLED` included.)
//!
//! | state                     | word               | the operation |
//! |---------------------------|--------------------|---------------|
//! | unfilled                  | 0                  | none, and the state is not even written: the memory as the system gave it |
//! | free, or waiting unlocked | `g`                | none (free: no name `g` was handed out yet), or waiting |
//! | locked                    | `g \| LOCKED`      | read or changed by the holder only (`try_complete` runs here) |
//! | locked, expiry requested  | `g \| LOCKED \| EXPIRED` | as locked; the holder must expire it if it does not take it |
//! | retired                   | `RETIRED`          | none, ever again |
//!
//! (`PARKED` may be added to either locked state.)
//!
//! # Transitions, and who makes each
//! | from                           | to                          | by |
//! |--------------------------------|-----------------------------|----|
//! | unfilled                       | free `g`                    | the thread handed it out first ([`Slot::fill`]): nobody else can name it yet |
//! | free `g`                       | locked `g`                  | the allocator ([`Slot::occupy`]): nobody else can name `g` yet |
//! | waiting `g`                    | locked `g`                  | [`Slot::lock`] or [`Slot::lock_or_request_expiry`] naming `g` |
//! | locked `g`                     | locked `g` + `PARKED`       | [`Slot::lock`] naming `g`, before it sleeps |
//! | locked `g`                     | locked `g` + `EXPIRED` (+ `BY_SHUTDOWN` for shutdown's) | [`Slot::lock_or_request_expiry`] naming `g` (an expiry never waits) |
//! | locked `g`, no `EXPIRED`       | waiting `g`                 | the holder ([`Slot::unlock`]) |
//! | locked `g`, `EXPIRED`          | free `g + 1`                | the holder ([`Slot::unlock`] refuses; it takes the operation and expires it) |
//! | locked `g`                     | free `g + 1`, or retired    | the holder, taking the operation ([`Slot::release_taken`]) |
//!
//! Every release wakes the threads parked on the slot if `PARKED` was set.
//!
//! # Why this is exactly once, never none
//! - Every transition but the holder's and the allocator's (whose slot nobody else can
//!   name yet) is a compare-and-swap that also compares the generation. A call naming a generation the slot no longer has (a late cancel, force,
//!   guard drop, check or expiry, however often the slot was reused since) fails its
//!   compare and writes nothing: it never holds the slot, never requests an expiry, and
//!   so never holds up or takes away what belongs to the occupant.
//! - Only the holder takes the operation out, and taking moves the generation on in the
//!   same store that releases the slot: a name is honoured until its operation is taken,
//!   never after.
//! - An expiry that finds the slot locked sets `EXPIRED` with a compare-and-swap on the
//!   word the holder's unlock must also compare-and-swap: either the expiry's swap comes
//!   first (the unlock fails, sees `EXPIRED`, and expires the operation itself) or the
//!   unlock does (the expiry then finds the slot unlocked, or taken, and acts on that).
//!   One word, one order of writes: no fence, nothing for a caller to remember.
//! - The holder is told whose expiry it owes (`Unlocked::MustExpire`): a timeout's (its
//!   deadline passed, whenever the answer goes out) or shutdown's. Only the first
//!   request is kept (a request finding `EXPIRED` set writes nothing), and both requests
//!   can never meet on one occupant: shutdown drains only timers that have not fired.
//! - Generations never wrap: a slot whose generation reaches `RETIRED` stays retired
//!   (see `op_table.rs`).
//! - An unfilled slot (the op table makes its segments from zeroed memory and fills a
//!   slot only when it is first handed out) has the word 0, which no compare expects
//!   (each expects `FILLED`) and [`Slot::occupy`] refuses: nothing holds it, reads its
//!   state or writes it but [`Slot::fill`], and a stale name of a slot made again finds
//!   no match there as it finds none in a filled one. Its generation reads as 0, below
//!   every generation the op table hands out (it starts them at 1).

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::sync::{AtomicU64, Parker, SpinWait, UnsafeCell};

/// The generation of a retired slot: no operation ever holds it, so no name matches it.
pub(crate) const RETIRED: u32 = u32::MAX;

const LOCKED: u64 = 1;
const PARKED: u64 = 1 << 1;
const EXPIRED: u64 = 1 << 2;
const BY_SHUTDOWN: u64 = 1 << 3;
const FLAGS: u64 = LOCKED | PARKED | EXPIRED | BY_SHUTDOWN;
/// Set in the word of every slot but an unfilled one (whose word is 0).
const FILLED: u64 = 1 << 4;

/// The word of an unlocked slot of generation `generation`.
#[inline]
fn unlocked(generation: u32) -> u64 {
    u64::from(generation) << 32 | FILLED
}

#[inline]
fn generation_of(word: u64) -> u32 {
    (word >> 32) as u32
}

/// A slot was handed out that was not free: the free lists are broken, and no holder's
/// exclusive access could be trusted any more.
#[cold]
#[inline(never)]
fn not_free(word: u64) -> ! {
    panic!("a slot handed out that was not free: {word:#x}");
}

/// Wakes the threads parked on `word` (out of line: rare).
#[cold]
#[inline(never)]
fn wake(parker: &Parker, word: &AtomicU64) {
    parker.unpark_all(word);
}

/// What [`Slot::lock_or_request_expiry`] did.
pub(crate) enum ExpiryAttempt {
    /// The slot was unlocked: the caller holds it now and takes the operation.
    Locked,
    /// The slot was locked: its holder expires the operation when it unlocks (unless it
    /// takes it first).
    Requested,
    /// The named operation is gone (or its expiry was already requested).
    Gone,
}

/// What [`Slot::unlock`] did.
#[must_use = "an expiry requested while the slot was held is the unlocker's to honour"]
pub(crate) enum Unlocked {
    /// Unlocked; the operation stays.
    Released,
    /// Not unlocked: the operation's timeout fired (or shutdown expired it) while it was
    /// held, so the holder must take it and complete it as expired (the slot is still
    /// held). `by_shutdown`: the request was shutdown's, not the timeout's.
    MustExpire { by_shutdown: bool },
}

/// One slot; its operation state `S` is only touched by the slot's holder, and written
/// only once the slot is filled.
///
/// A slot has no drop glue of its own: its state is dropped by its owner, with
/// [`drop_state`](Self::drop_state), so that dropping a segment reads no slot that was
/// never filled (the op table's segments track how far they were handed out).
pub(crate) struct Slot<S> {
    word: AtomicU64,
    /// Written (initialised) while the word is 0 by [`fill`](Self::fill) only; from then
    /// on a valid `S`, for good.
    state: UnsafeCell<MaybeUninit<S>>,
}

// SAFETY: the state is only reached through `fill`, whose caller is the only one who may
// fill the slot and does so before it names the slot to anyone, and `with_state`, whose
// contract is that the caller holds the slot (the `LOCKED` bit), so one thread at a time
// touches it; the fill's release and the lock's acquire and release order those touches.
// The state moves between threads (`S: Send`).
unsafe impl<S: Send> Sync for Slot<S> {}

impl<S> Slot<S> {
    /// A slot that no name ever matches: it stands in for the slots of a segment given
    /// back (`op_table.rs`), so a stale name finds "gone" there and writes nothing.
    pub(crate) fn retired(state: S) -> Self {
        Slot {
            word: AtomicU64::new(unlocked(RETIRED)),
            state: UnsafeCell::new(MaybeUninit::new(state)),
        }
    }

    /// An unfilled slot: what a slot of zeroed memory is (the word 0, the state not
    /// written), for the segments made without zeroed memory (under loom) and tests.
    #[cfg(any(loom, test))]
    pub(crate) fn unfilled() -> Self {
        Slot {
            word: AtomicU64::new(0),
            state: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// Fills the slot, if it is unfilled, with `state`, free for an occupant of
    /// `generation` (at least 1, below [`RETIRED`]); `false` (`state` dropped) if it was
    /// filled before. With `surely_unfilled`, it does not look first: a read of a page
    /// never written maps the system's zero page, and the write after it faults a second
    /// time (90,000 faults against 68,000 in `benches/examples/watch_tail.rs`).
    ///
    /// Every name of an earlier slot at this place must be below `generation` (a segment
    /// made again starts above its earlier slots' generations, `op_table/give_back.rs`).
    ///
    /// # Safety
    /// The caller was handed the slot as a new one (above every slot handed out before
    /// it in its segment) and has named it to nobody yet, so no other thread fills it,
    /// holds it or reads its state meanwhile (a stale name's compare may still read the
    /// word: it expects `FILLED` and fails). With `surely_unfilled`, the slot was never
    /// filled.
    #[inline]
    pub(crate) unsafe fn fill(&self, state: S, generation: u32, surely_unfilled: bool) -> bool {
        debug_assert!(generation != 0 && generation != RETIRED);
        debug_assert!(!surely_unfilled || self.word.load(Relaxed) == 0);
        if !surely_unfilled && self.word.load(Relaxed) != 0 {
            return false;
        }
        // SAFETY: the word is 0, so nobody holds the slot (a holder's word has `FILLED`),
        // and by the caller's contract nobody else fills it: this is the one access.
        unsafe { self.state.with_mut(|cell| *cell = MaybeUninit::new(state)) };
        // Release: the thread that occupies it next acquires the state written here.
        self.word.store(unlocked(generation), Release);
        true
    }

    /// Drops the state, if the slot was ever filled; reads nothing else of it.
    ///
    /// # Safety
    /// The slot is dropped right after, and nothing reads its state again.
    pub(crate) unsafe fn drop_state(&mut self) {
        #[cfg(not(loom))]
        let word = *self.word.get_mut();
        #[cfg(loom)]
        let word = self.word.with_mut(|word| *word);
        if word & FILLED != 0 {
            // SAFETY: a filled slot's state was written by `fill` (or made with it) and
            // stays a valid `S`; `&mut self` makes this the one access, and the caller
            // reads it no more.
            unsafe { self.state.with_mut(|cell| cell.assume_init_drop()) };
        }
    }

    /// Starts bringing the slot's word and the start of its state into this core's
    /// cache, and returns without waiting: a hint for a caller about to lock it (see
    /// `OpTable`'s `Found::prefetch`). Reads and writes nothing. Prefetched by address,
    /// since the compiler orders the fields: the word may lie on another cache line than
    /// the slot's first byte. Does nothing under loom or Miri, or off x86-64.
    #[inline]
    pub(crate) fn prefetch(&self) {
        #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
        {
            prefetch_line(&self.word);
            prefetch_line(&self.state);
        }
    }

    /// The slot's generation now (its occupant's, or the next occupant's if free).
    #[inline]
    pub(crate) fn generation(&self) -> u32 {
        generation_of(self.word.load(Acquire))
    }

    /// Runs `f` on the operation state.
    ///
    /// # Safety
    /// The caller holds the slot: it locked it ([`lock`](Self::lock),
    /// [`lock_or_request_expiry`](Self::lock_or_request_expiry) returning `Locked`,
    /// [`occupy`](Self::occupy)) and has not released it since.
    #[inline]
    pub(crate) unsafe fn with_state<R>(&self, f: impl FnOnce(&mut S) -> R) -> R {
        // SAFETY: the holder has exclusive access (see the module doc), and a slot held
        // was filled (a word without `FILLED` is never locked), so its state is an `S`.
        unsafe { self.state.with_mut(|cell| f(cell.assume_init_mut())) }
    }

    /// Locks a free slot for its new occupant; returns the occupant's generation.
    #[inline]
    pub(crate) fn occupy(&self) -> u32 {
        // Nobody names this generation yet, so nobody else writes the word. A
        // read-modify-write all the same: it reads the latest word, the one the last
        // holder released the slot with (and acquires that holder's writes to the state),
        // whatever path the slot's index took to get here.
        //
        // An add, not an `or`: on a free word (`LOCKED` clear, checked below) the two
        // store the same word, and an add whose old value is used is one `lock xadd`,
        // where the `or` was a compare-and-swap loop (5 instructions more a watch;
        // callgrind, `expiring_watches`). On a word that was not free the add may carry
        // into the other flags, but that word is already a broken invariant, and
        // `not_free` panics on it before anything else is written.
        let word = self.word.fetch_add(LOCKED, Acquire);
        // Checked in every build: the state's exclusive access rests on it (and, for an
        // unfilled slot, whether it has a state at all).
        if word & (FLAGS | FILLED) != FILLED || generation_of(word) == RETIRED {
            not_free(word);
        }
        generation_of(word)
    }

    /// Locks the slot if its generation is `generation`, waiting while another thread
    /// holds it (spinning briefly, then parked); `false` as soon as the generation is
    /// another, without ever holding the slot.
    #[inline]
    pub(crate) fn lock(&self, generation: u32, parker: &Parker) -> bool {
        let free = unlocked(generation);
        match self
            .word
            .compare_exchange(free, free | LOCKED, Acquire, Relaxed)
        {
            Ok(_) => true,
            Err(word) => self.lock_slow(generation, word, parker),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self, generation: u32, mut word: u64, parker: &Parker) -> bool {
        let mut spin = SpinWait::new();
        loop {
            // Another generation, or an unfilled slot (no `FILLED`, whatever the name).
            if word & !FLAGS != unlocked(generation) {
                return false;
            }
            if word & LOCKED == 0 {
                match self
                    .word
                    .compare_exchange_weak(word, word | LOCKED, Acquire, Relaxed)
                {
                    Ok(_) => return true,
                    Err(now) => word = now,
                }
                continue;
            }
            if word & PARKED == 0 {
                if spin.spin() {
                    word = self.word.load(Relaxed);
                    continue;
                }
                if let Err(now) =
                    self.word
                        .compare_exchange_weak(word, word | PARKED, Relaxed, Relaxed)
                {
                    word = now;
                    continue;
                }
            }
            // Asleep while the slot is still held under this generation with PARKED set
            // (EXPIRED may come and go meanwhile).
            let asleep = unlocked(generation) | LOCKED | PARKED;
            parker.park(&self.word, !(EXPIRED | BY_SHUTDOWN), asleep);
            spin = SpinWait::new();
            word = self.word.load(Relaxed);
        }
    }

    /// For an expiry, which never waits: locks the slot if its generation is
    /// `generation` and it is unlocked; if another thread holds it, leaves the expiry to
    /// that holder (sets `EXPIRED`, and `BY_SHUTDOWN` if `by_shutdown`: the expiry is
    /// shutdown's, not the timeout's).
    pub(crate) fn lock_or_request_expiry(
        &self,
        generation: u32,
        by_shutdown: bool,
    ) -> ExpiryAttempt {
        let request = if by_shutdown {
            EXPIRED | BY_SHUTDOWN
        } else {
            EXPIRED
        };
        let mut word = self.word.load(Relaxed);
        loop {
            // Another generation, an unfilled slot, or an expiry requested already.
            if word & !FLAGS != unlocked(generation) || word & EXPIRED != 0 {
                return ExpiryAttempt::Gone;
            }
            let (new, attempt) = if word & LOCKED == 0 {
                (word | LOCKED, ExpiryAttempt::Locked)
            } else {
                (word | request, ExpiryAttempt::Requested)
            };
            match self.word.compare_exchange_weak(word, new, Acquire, Relaxed) {
                Ok(_) => return attempt,
                Err(now) => word = now,
            }
        }
    }

    /// Releases the slot, the operation staying in it, unless its expiry was requested
    /// while it was held: then the slot stays held, and the caller must take the
    /// operation and expire it.
    ///
    /// The caller holds the slot, under `generation`.
    #[inline]
    pub(crate) fn unlock(&self, generation: u32, parker: &Parker) -> Unlocked {
        let free = unlocked(generation);
        match self
            .word
            .compare_exchange(free | LOCKED, free, Release, Relaxed)
        {
            Ok(_) => Unlocked::Released,
            Err(word) => self.unlock_slow(word, parker),
        }
    }

    #[cold]
    #[inline(never)]
    fn unlock_slow(&self, mut word: u64, parker: &Parker) -> Unlocked {
        loop {
            debug_assert_ne!(word & LOCKED, 0, "unlocked by its holder");
            if word & EXPIRED != 0 {
                return Unlocked::MustExpire {
                    by_shutdown: word & BY_SHUTDOWN != 0,
                };
            }
            match self
                .word
                .compare_exchange_weak(word, word & !FLAGS, Release, Relaxed)
            {
                Ok(_) => {
                    if word & PARKED != 0 {
                        parker.unpark_all(&self.word);
                    }
                    return Unlocked::Released;
                }
                Err(now) => word = now,
            }
        }
    }

    /// Releases the slot after its operation was taken out: its generation moves on to
    /// `next` (the next occupant's, or `RETIRED`), so every name of the taken operation
    /// is stale from this store on.
    ///
    /// The caller holds the slot.
    #[inline]
    pub(crate) fn release_taken(&self, next: u32, parker: &Parker) {
        let word = self.word.swap(unlocked(next), Release);
        debug_assert_ne!(word & LOCKED, 0, "released by its holder");
        if word & PARKED != 0 {
            wake(parker, &self.word);
        }
    }

    /// Test support: whether the slot was filled (its word is not 0).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_filled(&self) -> bool {
        self.word.load(Relaxed) != 0
    }

    /// Test support: gives a free slot generation `generation`, as if it had been reused
    /// that many times.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn set_free_generation(&self, generation: u32) {
        let word = self.word.load(Relaxed);
        assert_eq!(word & FLAGS, 0, "the slot is free");
        self.word.store(unlocked(generation), Release);
    }
}

/// Asks the CPU to load the cache line holding `at` ahead of its use (`prefetcht0`).
#[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
#[inline(always)]
fn prefetch_line<T>(at: &T) {
    // SAFETY: a prefetch is a hint: it neither faults nor changes memory, whatever the
    // address (here a live reference's), and SSE, which it belongs to, is part of every
    // x86-64 target.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (at as *const T).cast::<i8>(),
        )
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// An unfilled slot (zeroed memory) is held by nobody: no generation's lock or
    /// expiry matches it, and filling it makes it free for the fill's generation alone.
    #[test]
    fn an_unfilled_slot_matches_no_name_until_filled() {
        let parker = Parker::default();
        let slot: Slot<String> = Slot::unfilled();
        for generation in [0, 1, 2, RETIRED] {
            assert!(!slot.lock(generation, &parker), "lock {generation}");
            assert!(matches!(
                slot.lock_or_request_expiry(generation, false),
                ExpiryAttempt::Gone
            ));
        }
        assert_eq!(slot.generation(), 0, "below every generation handed out");
        assert!(!slot.is_filled(), "the failed compares wrote nothing");
        // SAFETY: this test's slot, named to nobody.
        assert!(unsafe { slot.fill("state".to_string(), 3, true) });
        // SAFETY: as above; filled already, so `false` and the state is dropped.
        assert!(!unsafe { slot.fill("again".to_string(), 9, false) });
        assert!(!slot.lock(2, &parker));
        assert_eq!(slot.occupy(), 3);
        // SAFETY: held (occupied just now).
        unsafe { slot.with_state(|state| assert_eq!(state, "state")) };
        slot.release_taken(4, &parker);
        let mut slot = slot;
        // SAFETY: the slot is dropped right after.
        unsafe { slot.drop_state() };
    }

    /// The allocator's check refuses an unfilled slot: it has no state to hold.
    #[test]
    #[should_panic(expected = "not free")]
    fn occupying_an_unfilled_slot_panics() {
        let slot: Slot<String> = Slot::unfilled();
        slot.occupy();
    }
}
