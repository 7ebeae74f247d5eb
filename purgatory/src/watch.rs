//! The watch protocol: a single `watch`, and a chunk of `watch_batch` (at most [`CHUNK`]
//! operations, each lock taken once for all of them). Both share the steps' pieces
//! (admitting, listing, arming, settling) and the rules below; they differ in when
//! `try_complete` runs.
//!
//! # A single watch (Kafka's order)
//! 1. Put the operation in a new slot of the op table, locked (nobody else can know the
//!    slot yet), with the `tracing` span current on the calling thread (`span.rs`),
//!    asked for before the slot is taken.
//! 2. `try_complete`; if ready, it is taken, and completed in step 6.
//! 3. List it on every one of its keys.
//! 4. `try_complete` again: an event between steps 2 and 3 did not find it listed, so
//!    nobody else will try it for that event.
//! 5. Arm its timeout and unlock it; if its timeout fired meanwhile, the unlock hands the
//!    expiry over ([`HandedOver`]).
//! 6. With no slot held: run the callbacks of what completed, or answer the expiry handed
//!    over. Either way the driver was told before the operation left its slot
//!    (`Driver::work`), so a shutdown that begins after that waits for the answer.
//!
//! Steps 1 to 5 ([`State::watch_one`]) return before step 6 ([`State::settle`]) runs the
//! callbacks, so an `on_complete` that watches again (and so on, many levels deep)
//! stacks only what step 6 needs per level. Step 6 runs in the caller's frame (it and
//! `Purgatory::watch` are inlined there), on the operation where that frame keeps it
//! (`placed`: where it came from, and where a completed or refused one comes back to),
//! and an expiry handed over is answered out of line: a level of a re-entrant chain
//! holds one copy of its operation, and no frame but the caller's (`tests/reentrant_depth.rs`,
//! release, an 80-byte operation: 400 bytes a level once the keys were lent and an
//! expiry handed over had a variant of its own (`Watched::Expiring`); 720 at #39's round
//! 18, and at the commit before it; 480 when this shape was measured in #36; 1,344
//! before it; the test's bound is 768). The slot is held from step 1 to step 5 around the operation's own
//! `try_complete` only.
//!
//! # A chunk
//! 1. Admit every operation (its `timeout()`), and put the admitted ones in new slots,
//!    locked, each with the span current (asked for before the slots are taken).
//! 2. List them all, each watcher shard locked once.
//! 3. Arm them all (one `add_batch_from`), and unlock every slot. No user code of an
//!    operation has run yet while another's slot was held: a chunk holds its slots only
//!    around its keys' `Hash` and `Eq` and the clock.
//! 4. Free the slots of the operations refused on the way, and answer at once the
//!    expiries handed over by those unlocks.
//! 5. For each operation still waiting, in order: lock its slot (waiting for a holder),
//!    `try_complete` (once: every key is listed already, see below), and take it if
//!    ready (answered at once), or unlock it (an expiry handed over is answered at once,
//!    before the next operation's `try_complete`).
//! 6. Give the results in input order (each pushed at step 1, in place since).
//!
//! So one operation's slow `try_complete` in a batch holds up no other operation's
//! timeout: every timeout of the chunk is armed, and every slot released, before the
//! first `try_complete` runs. (Before, the chunk held every slot from its first
//! `try_complete` to its arming: one `try_complete` of 2 s made 39 operations with 50 ms
//! timeouts answer after 2.05 s.) An operation ready at once is listed and armed before
//! it is found ready: its entries go stale and its timer entry is cancelled, work a
//! single watch's first try avoids; batches are for operations that wait.
//!
//! # Invariants
//! - An event is never lost. A single watch holds the slot from before listing to its
//!   second try: an event either came before that try (which sees it) or finds the
//!   operation listed and tries it once the slot is released. A chunk tries each
//!   operation after every key of it is listed, under its slot, waiting for a holder: an
//!   event whose check did not find the operation came before the listing, so before
//!   that try, which sees it; an event whose check found it tries it under the slot.
//! - An expiry handed over by an unlock is answered before any other operation's user
//!   code runs on that thread. Every operation a watch takes out of its slot (completed,
//!   or expired while held) is answered under `Driver::work`, taken before the take: a
//!   shutdown that begins after that waits for the answer.
//! - Once listed, an operation's slot can be waited for by a checker; in a single watch
//!   it waits at most until the watch is armed. A chunk's slots are held together only
//!   over steps 1 to 3, which run no operation's user code.
//! - An operation whose key's `Hash` or `Eq` panics while being listed is taken back out
//!   before it is armed: it gets [`WatchError::KeyPanicked`] with the operation, its
//!   entries on its other keys are stale, and nothing of it is armed. A panicking
//!   `timeout()` is caught the same way, before anything of its operation exists here.
//! - Each operation gets exactly one result, at its position in the input.
//! - The span of an operation refused after it had a slot is closed once no slot of the
//!   watch is held (the subscriber is user code), as its slot is freed.

use std::hash::Hash;
use std::marker::PhantomData;
use std::time::Duration;

use smallvec::SmallVec;
use timer_core::{AddError, Driver, DriverWork, TimerHandle};

use crate::completion::Receipt;
use crate::counters::{Count, ThisStripe};
use crate::error::{WatchError, WatchErrorKind};
use crate::group::Group;
use crate::handle::{OperationHandle, WatchOutcome};
use crate::op_table::{HandedOver, Locked, OpRef, Taken, TakenExpiry, Vacated};
use crate::operation::{Completion, DelayedOperation};
use crate::span::CarriedSpan;
use crate::state::{Expiry, State};
use crate::user_code::{report, Site};

/// Most operations watched under one round of locks.
pub(crate) const CHUNK: usize = 64;

/// The keys of one operation, collected before any lock is taken.
pub(crate) type Keys<K> = SmallVec<[K; 4]>;

/// An operation of a batch and its keys, collected before any lock is taken; the chunk
/// that watches it takes the operation out, and the keys as it lists them. (Moved into a
/// member of the chunk with the operation's timeout, slot and position, 96 bytes, and
/// out again, they cost 45 instructions an operation more; callgrind, `expiring_watches
/// 20000 64`.)
pub(crate) type Staged<K, O> = (Option<O>, Keys<K>);

/// Collects an operation's keys. The first four are pushed one by one (they fit inline,
/// and `SmallVec`'s general `extend` costs about 80 instructions for three); any beyond
/// go through `extend`.
#[inline]
pub(crate) fn collect_keys<K>(keys: impl IntoIterator<Item = K>) -> Keys<K> {
    let mut keys = keys.into_iter();
    let mut out = Keys::new();
    while out.len() < out.inline_size() {
        match keys.next() {
            Some(key) => out.push(key),
            None => return out,
        }
    }
    out.extend(keys);
    out
}

/// Moves the keys out of `keys`, in order, leaving it empty: what `keys.drain(..)`
/// does, without a tail to move back, and with its place and count kept in registers
/// where the drain's were stored and reloaded at each key (`Watchers::watch_keys`, three
/// keys: 310 -> 296 instructions a watch; callgrind, `expiring_watches`).
#[inline(always)]
pub(crate) fn take_keys<K>(keys: &mut Keys<K>) -> TakenKeys<'_, K> {
    let len = keys.len();
    // SAFETY: a length of 0 is within capacity; `keys` forgets its elements without
    // dropping them, and from here on they are the `TakenKeys`'s alone (see there). The
    // pointer is taken after `set_len`: that call's `&mut` would invalidate one taken
    // before it (the elements may be inline, in `keys` itself).
    unsafe { keys.set_len(0) };
    TakenKeys {
        base: keys.as_mut_ptr(),
        next: 0,
        len,
        _keys: PhantomData,
    }
}

/// The keys [`take_keys`] took out, each moved out once, in order; those not moved out
/// when it is dropped are dropped with it (plainly: only an unwinding path leaves any,
/// as a drain would). So no key is dropped twice or leaked, on any path.
pub(crate) struct TakenKeys<'a, K> {
    /// The first key, in the buffer of the `Keys` they came from, which stays where it
    /// is while this lives: the `Keys` is borrowed mutably for as long.
    base: *mut K,
    /// The keys at `next..len` are still this iterator's.
    next: usize,
    len: usize,
    _keys: PhantomData<&'a mut Keys<K>>,
}

impl<K> Iterator for TakenKeys<'_, K> {
    type Item = K;

    #[inline(always)]
    fn next(&mut self) -> Option<K> {
        if self.next == self.len {
            return None;
        }
        // SAFETY: `next < len`: the key at `next` lies in the buffer, initialized, and
        // is still this iterator's; it is moved out once, as `next` passes it at once
        // (nothing between the two can panic).
        let key = unsafe { self.base.add(self.next).read() };
        self.next += 1;
        Some(key)
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len - self.next, Some(self.len - self.next))
    }
}

impl<K> ExactSizeIterator for TakenKeys<'_, K> {}

impl<K> Drop for TakenKeys<'_, K> {
    fn drop(&mut self) {
        // SAFETY: the keys at `next..len` lie in the buffer, initialized, and are still
        // this iterator's, never moved out: dropped here, once.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.base.add(self.next),
                self.len - self.next,
            ));
        }
    }
}

/// What watching one operation gave.
pub(crate) type WatchResult<O> = Result<WatchOutcome<O>, WatchError<O>>;

/// When a watch armed its operations (ns on the timer's clock), for their wait times:
/// read once per single watch or chunk, with the feature `metrics` only (empty without).
#[derive(Clone, Copy)]
struct ArmedAt(#[cfg(feature = "metrics")] u64);

/// The driver of a purgatory's state.
type DriverOf = Driver<Group>;

/// What became of an operation tried once ([`State::try_held`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tried {
    /// Ready: taken and answered.
    Completed,
    /// Not ready, and still waiting.
    Waiting,
    /// Not ready, and its timeout fired while it was held: answered as expired.
    Expired,
}

/// What steps 1 to 5 of a single watch made of its operation, for step 6.
pub(crate) enum Watched<'a, O>
where
    O: DelayedOperation,
{
    /// Ready at the first or second try: taken (under the driver's work, so a shutdown
    /// waits for the answer), its callbacks still to run. The operation itself is in the
    /// caller's place ([`State::watch_one`]'s `placed`).
    Completed(Receipt, DriverWork<'a, Group>),
    /// Waiting on its keys and timeout.
    Pending(OpRef),
    /// Its timeout fired while the watch held it: handed over, its slot still held, to
    /// be expired. A variant of its own, not an `Option` in `Pending`: written there,
    /// every field of the hand-over was stored whether there was one or not
    /// (`watch_one` 756 instructions a watch then, 746 now; callgrind,
    /// `expiring_watches`).
    Expiring(OpRef, HandedOver<'a, O>),
    /// Refused, the operation in the caller's place, as `placed` of a completed one.
    Refused(WatchErrorKind),
}

/// An operation taken back out of its slot, refused: its error (with the operation),
/// its span and its slot, the last two for the caller to close and free once no slot is
/// held.
struct Refusal<O> {
    error: WatchError<O>,
    span: CarriedSpan,
    vacated: Vacated,
}

impl<O> Refusal<O> {
    fn new(error: impl FnOnce(O) -> WatchError<O>, taken: Taken<O>, vacated: Vacated) -> Self {
        Refusal {
            error: error(taken.op),
            span: taken.span,
            vacated,
        }
    }
}

/// The error of an operation [`State::settle`] refused as `kind`, which lies in `placed`.
pub(crate) fn refusal<O>(placed: &mut Option<O>, kind: WatchErrorKind) -> WatchError<O> {
    let op = placed.take().expect("a refused operation lies in placed");
    WatchError::from_parts(op, kind)
}

/// The slots of a chunk's operations by input position, each held from step 1 until it
/// is taken or armed and unlocked (none for one refused at step 1); their timeouts are
/// kept beside them, their keys where they were staged ([`Staged`]).
type Held<'a, O> = [Option<Locked<'a, O>>; CHUNK];

impl<K, O> State<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// Whether `op` may be watched on `keys` at all: refused after shutdown, for no keys,
    /// or for a `timeout()` that panics (caught and counted); otherwise its timeout. The
    /// keys of a refused operation are dropped here, through the door (`keys` is left
    /// empty).
    fn admit(
        &self,
        closed: bool,
        op: O,
        keys: &mut Keys<K>,
        keyless: bool,
    ) -> Result<(O, Duration), WatchError<O>> {
        let refused = if closed {
            WatchError::Shutdown(op)
        } else if keys.is_empty() && !keyless {
            WatchError::NoKeys(op)
        } else {
            match self.user.call(Site::Timeout, || op.timeout()) {
                Some(timeout) => return Ok((op, timeout)),
                None => WatchError::TimeoutPanicked(op),
            }
        };
        self.user.drop_each(Site::KeyDrop, keys.drain(..));
        Err(refused)
    }

    /// A single watch's steps 2 and 4: `try_complete`; if ready, the operation is taken,
    /// under the driver's work (taken first); if not, its slot comes back, still held.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn try_held_one<'d>(
        &self,
        mut locked: Locked<'d, O>,
        driver: &'d DriverOf,
    ) -> Result<(Taken<O>, Vacated, DriverWork<'d, Group>), Locked<'d, O>> {
        if !self.is_ready(&mut locked) {
            return Err(locked);
        }
        let work = driver.work();
        let (taken, vacated) = locked.take_deferred();
        Ok((taken, vacated, work))
    }

    /// After listing: an operation `failures` of whose keys could not be listed (their
    /// `Hash` or `Eq` panicked) is taken back, its listed entries stale; its slot is
    /// freed by the caller ([`OpTable::vacate`](crate::op_table::OpTable::vacate)) once
    /// no slot is held.
    fn unlisted(&self, locked: Locked<'_, O>, failures: u32) -> Refusal<O> {
        let (taken, vacated) = locked.take_deferred();
        self.watchers.mark_stale(taken.keys - failures);
        Refusal::new(WatchError::KeyPanicked, taken, vacated)
    }

    /// A single watch's refusal after its slot was freed: closes its span, gives its error.
    fn refuse_one<'a>(&self, refusal: Refusal<O>, placed: &mut Option<O>) -> Watched<'a, O> {
        self.table.vacate(&[refusal.vacated]);
        refusal.span.close(&self.user);
        Self::refused(refusal.error, placed)
    }

    /// [`Watched::Refused`], the operation of `error` put in `placed`.
    fn refused<'a>(error: WatchError<O>, placed: &mut Option<O>) -> Watched<'a, O> {
        let (op, kind) = error.into_parts();
        *placed = Some(op);
        Watched::Refused(kind)
    }

    /// [`ArmedAt`] now.
    #[cfg(feature = "metrics")]
    #[inline(always)]
    fn armed_at(&self) -> ArmedAt {
        ArmedAt(self.wait_clock())
    }

    /// [`ArmedAt`] now: nothing without the feature `metrics`.
    #[cfg(not(feature = "metrics"))]
    #[inline(always)]
    fn armed_at(&self) -> ArmedAt {
        ArmedAt()
    }

    /// The end of arming one operation held in `locked`, given what arming its timeout
    /// gave: armed at `at` and unlocked (`Ok`, with the expiry if its timeout fired while
    /// it was held), or taken back because the timer shut down meanwhile.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn armed<'a>(
        &self,
        mut locked: Locked<'a, O>,
        arming: Result<TimerHandle, AddError<Expiry>>,
        #[cfg_attr(not(feature = "metrics"), allow(unused_variables))] at: ArmedAt,
    ) -> Result<Option<HandedOver<'a, O>>, Refusal<O>> {
        match arming {
            Ok(handle) => {
                locked.arm(handle);
                #[cfg(feature = "metrics")]
                locked.set_since(at.0);
                Ok(locked.unlock().err())
            }
            Err(_) => {
                // Shut down while we were watching: its entries are now stale.
                let (taken, vacated) = locked.take_deferred();
                self.watchers.mark_stale(taken.keys);
                Err(Refusal::new(WatchError::Shutdown, taken, vacated))
            }
        }
    }

    /// Steps 1 to 5 of a single watch; step 6 is [`settle`]. Out of line, so that its
    /// frame is gone before step 6 runs the callbacks.
    ///
    /// The operation comes from `placed`, a place in the caller's frame, and an operation
    /// the watch completes or refuses goes back there, where [`settle`] runs its
    /// callbacks or hands it back: a chain of re-entrant watches then keeps one copy of
    /// each operation on the stack, not one in each frame it would be moved through.
    /// Its keys are lent the same way, from the caller's frame, and left empty on every
    /// path: each key is listed or dropped through the door here. (Moved in, then into a
    /// `Member`, and drained here for `watch_keys`, they were copied twice more: this
    /// and its callees cost 799 instructions a watch then, 756 now; callgrind,
    /// `expiring_watches`.)
    ///
    /// [`settle`]: Self::settle
    #[inline(never)]
    pub(crate) fn watch_one<'a>(
        &'a self,
        placed: &mut Option<O>,
        keys: &mut Keys<K>,
        keyless: bool,
        driver: &'a DriverOf,
    ) -> Watched<'a, O> {
        let op = placed
            .take()
            .expect("the operation to watch lies in placed");
        let (op, timeout) = match self.admit(self.timer.is_shutdown(), op, keys, keyless) {
            Ok(admitted) => admitted,
            Err(refused) => return Self::refused(refused, placed),
        };
        let stripe = ThisStripe::read();
        let locked = self
            .table
            .insert_one_on(stripe, op, CarriedSpan::current(&self.user));
        let op = locked.op();
        let vacate = |vacated: Vacated| self.table.vacate(&[vacated]);
        let mut locked = match self.try_held_one(locked, driver) {
            Ok((taken, vacated, work)) => {
                vacate(vacated);
                // Never listed: its keys are dropped here, through the door.
                self.user.drop_each(Site::KeyDrop, keys.drain(..));
                return Self::completed(taken, work, placed);
            }
            Err(locked) => locked,
        };
        let count = u32::try_from(keys.len()).unwrap_or(u32::MAX);
        locked.set_keys(count);
        let failures = self.watchers.watch_keys(keys, op, &self.user, stripe);
        if failures > 0 {
            let refusal = self.unlisted(locked, failures);
            return self.refuse_one(refusal, placed);
        }
        // A keyless operation has no key an event could check: nothing to try again for.
        if count > 0 {
            locked = match self.try_held_one(locked, driver) {
                Ok((taken, vacated, work)) => {
                    vacate(vacated);
                    return Self::completed(taken, work, placed);
                }
                Err(locked) => locked,
            };
        }
        let arming = self.timer.add(
            timeout,
            Expiry {
                op,
                member: self.member,
            },
        );
        match self.armed(locked, arming, self.armed_at()) {
            Ok(None) => Watched::Pending(op),
            Ok(Some(handed_over)) => Watched::Expiring(op, handed_over),
            Err(refusal) => self.refuse_one(refusal, placed),
        }
    }

    /// [`Watched::Completed`], the operation of `taken` put in `placed`.
    #[inline(always)]
    fn completed<'a>(
        taken: Taken<O>,
        work: DriverWork<'a, Group>,
        placed: &mut Option<O>,
    ) -> Watched<'a, O> {
        let (op, receipt) = Receipt::split(taken);
        *placed = Some(op);
        Watched::Completed(receipt, work)
    }

    /// Step 6 of a single watch: runs the callbacks of what completed (on the operation
    /// where it lies, in `placed`), or answers the expiry handed over, with no slot held
    /// but that one. Gives the outcome, or why the operation (left in `placed`) was
    /// refused: the caller makes its result of it last ([`refusal`]), so that the result
    /// is made where it is returned, not kept in the caller's frame besides. Inlined, into
    /// `Purgatory::watch` and so into its caller: its frame was 176 of the 752 bytes of a
    /// re-entrant level (release), and its call 33 instructions a watch.
    #[inline(always)]
    pub(crate) fn settle(
        &self,
        watched: Watched<'_, O>,
        placed: &mut Option<O>,
        driver: &Driver<Group>,
    ) -> Result<WatchOutcome<O>, WatchErrorKind> {
        match watched {
            Watched::Completed(receipt, _work) => {
                self.complete_placed(placed, receipt, Completion::Ready, Count::Completed);
                Ok(WatchOutcome::Completed)
            }
            Watched::Pending(op) => Ok(WatchOutcome::Pending(OperationHandle::new(op, self.id))),
            Watched::Expiring(op, handed_over) => {
                self.answer_handed_over(handed_over, driver);
                Ok(WatchOutcome::Pending(OperationHandle::new(op, self.id)))
            }
            Watched::Refused(kind) => Err(kind),
        }
    }

    /// Answers an expiry that an unlock handed over: tells the driver first (a shutdown
    /// that begins once the operation is out of its slot waits for this answer), then
    /// takes the operation and expires it, here and now. Out of line (rare: the timeout
    /// fired while a watch or a check held the slot), so that the frames it is called
    /// from, a single watch's [`settle`](Self::settle) above all, do not keep its locals.
    #[cold]
    #[inline(never)]
    pub(crate) fn answer_handed_over(
        &self,
        handed_over: HandedOver<'_, O>,
        driver: &Driver<Group>,
    ) {
        let _work = driver.work();
        self.complete_expiry(handed_over.take());
    }

    /// Watches the operations of a chunk (at most [`CHUNK`]), each taken out of `staged`
    /// with its keys (each left empty), and appends one result per operation, in order,
    /// to `results`: the steps of a chunk (see the module doc). Returns how many of them
    /// were refused.
    pub(crate) fn watch_chunk(
        &self,
        staged: &mut [Staged<K, O>],
        results: &mut Vec<WatchResult<O>>,
        driver: &Driver<Group>,
    ) -> usize {
        debug_assert!(staged.len() <= CHUNK);
        let len = staged.len().min(CHUNK);
        let staged = &mut staged[..len];
        // Both live in this frame and are lent to the steps: moving an inline array in or
        // out of a step copied kilobytes per chunk (callgrind: four copies of about 2 KB
        // a call, 780 instructions an operation in chunks of ten).
        let mut held: Held<'_, O> = [const { None }; CHUNK];
        let mut timeouts = [Duration::ZERO; CHUNK];
        // Each operation's result is pushed at step 1, in input order, and rewritten in
        // place by the later steps: kept aside by position and appended at step 6, the
        // results cost 31 instructions an operation more (callgrind, `expiring_watches
        // 20000 64`).
        let start = results.len();
        let (admitted, keys) = self.admit_chunk(staged, &mut held, &mut timeouts, results);
        let mut chunk = Chunk {
            out: &mut results[start..],
            refused: len - admitted,
            vacated: SmallVec::new(),
            spans: SmallVec::new(),
        };
        let held = &mut held[..len];
        self.list_chunk(held, staged, keys, &mut chunk);
        let handed_over = self.arm_chunk(held, &timeouts, &mut chunk);
        // Expiries handed over by the unlocks: every one taken out of its slot before any
        // is answered (an answer's callbacks may call this purgatory on another of their
        // keys), all under one `work` taken before the first take (a shutdown that begins
        // after it waits for the answers).
        let work = (!handed_over.is_empty()).then(|| driver.work());
        let taken_over: SmallVec<[TakenExpiry<O>; 1]> =
            handed_over.into_iter().map(HandedOver::take).collect();
        // No slot of the chunk is held any more once the emptied ones are free: answer
        // the expiries, then close the refused members' spans (user code, both).
        if !chunk.vacated.is_empty() {
            self.table.vacate(&chunk.vacated);
        }
        for expiry in taken_over {
            self.complete_expiry(expiry);
        }
        drop(work);
        for span in chunk.spans.drain(..) {
            span.close(&self.user);
        }
        self.try_chunk(&mut chunk, driver);
        report!(self.user, DEBUG, purgatory = %self.name, operations = chunk.out.len(), "watch");
        chunk.refused
    }

    /// Step 1 for a chunk: admits the operation at each position of `staged` (taken out
    /// of it), pushing one result each to `results` (its refusal, or the handle it will
    /// have: made for its slot by step 3), and puts the admitted ones in new slots, held
    /// in `held` with their timeouts in `timeouts`, at their positions. Returns how many
    /// were admitted, and their keys.
    fn admit_chunk<'a>(
        &'a self,
        staged: &mut [Staged<K, O>],
        held: &mut Held<'a, O>,
        timeouts: &mut [Duration; CHUNK],
        results: &mut Vec<WatchResult<O>>,
    ) -> (usize, usize) {
        let closed = self.timer.is_shutdown();
        let mut admitted: SmallVec<[(O, CarriedSpan); CHUNK]> = SmallVec::new();
        // Counted here, not by a pass of step 2 over the keys (5 instructions an
        // operation; callgrind, `expiring_watches 20000 64`).
        let mut total = 0;
        for ((op, keys), timeout) in staged.iter_mut().zip(timeouts.iter_mut()) {
            let op = op.take().expect("each operation is watched once");
            match self.admit(closed, op, keys, false) {
                Ok((op, admitted_timeout)) => {
                    total += keys.len();
                    admitted.push((op, CarriedSpan::current(&self.user)));
                    *timeout = admitted_timeout;
                    results.push(Ok(WatchOutcome::Pending(OperationHandle::new(
                        OpRef::default(),
                        self.id,
                    ))));
                }
                Err(refused) => results.push(Err(refused)),
            }
        }
        // Refused at step 1 (rare), the admitted are those whose result is not a refusal
        // yet; otherwise every position is (the slots filled without that filter: 12
        // instructions an operation less; callgrind, `expiring_watches 20000 64`).
        let count = admitted.len();
        if admitted.len() == staged.len() {
            self.table.insert_many(admitted.drain(..), held.iter_mut());
        } else {
            let start = results.len() - staged.len();
            let slots = held
                .iter_mut()
                .zip(&results[start..])
                .filter(|(_, result)| result.is_ok())
                .map(|(slot, _)| slot);
            self.table.insert_many(admitted.drain(..), slots);
        }
        (count, total)
    }

    /// Step 2 for a chunk: lists every operation held on its keys (taken out of
    /// `staged`, left empty), each watcher shard locked once; takes back an operation
    /// whose key could not be listed.
    fn list_chunk(
        &self,
        held: &mut [Option<Locked<'_, O>>],
        staged: &mut [Staged<K, O>],
        total: usize,
        chunk: &mut Chunk<'_, O>,
    ) {
        debug_assert_eq!(total, staged.iter().map(|(_, k)| k.len()).sum::<usize>());
        // Where each position's entries end, in the order they are pushed: who owns an
        // entry that could not be listed (rare) is worked out from these, not recorded
        // per entry (that, with two `extend`s per member, cost 59 instructions an
        // operation: callgrind, `expiring_watches 20000 64`).
        let mut ends = [0; CHUNK];
        // Every key is taken out of `staged` (listed, or dropped through the door).
        let unlisted = self.watchers.watch_many(total, &self.user, |gather| {
            for ((locked, (_, keys)), end) in held.iter_mut().zip(staged.iter_mut()).zip(&mut ends)
            {
                // Every operation admitted is held here: nothing of a chunk is tried
                // before it is listed. (A refused one's keys were dropped at step 1.)
                if let Some(locked) = locked {
                    // Taken out as a single watch's (`take_keys`): a `SmallVec` drain
                    // tested whether the keys had spilled at every key.
                    let keys = take_keys(keys);
                    let count = u32::try_from(keys.len()).unwrap_or(u32::MAX);
                    locked.set_keys(count);
                    let op = locked.op();
                    for key in keys {
                        gather.push(key, op);
                    }
                }
                *end = gather.len();
            }
        });
        if unlisted.is_empty() {
            return;
        }
        let ends = &ends[..held.len()];
        let mut failures = [0u32; CHUNK];
        for i in unlisted {
            // The first position whose entries end after entry `i`.
            failures[ends.partition_point(|&end| end <= i)] += 1;
        }
        for (position, (locked, &count)) in held.iter_mut().zip(&failures).enumerate() {
            if count > 0 {
                let locked = locked.take().expect("an operation with entries is held");
                let refusal = self.unlisted(locked, count);
                chunk.refused(position, refusal);
            }
        }
    }

    /// Step 3 for a chunk: arms every operation still held (one `add_batch_from`), then
    /// unlocks each; returns the expiries those unlocks handed over.
    fn arm_chunk<'a>(
        &self,
        held: &mut [Option<Locked<'a, O>>],
        timeouts: &[Duration; CHUNK],
        chunk: &mut Chunk<'_, O>,
    ) -> SmallVec<[HandedOver<'a, O>; 1]> {
        // Taken by the timer straight from the slots held, with no vector of tasks made
        // first (which cost 18 instructions an operation; callgrind, `expiring_watches
        // 20000 64`).
        let tasks = Tasks {
            held: held.iter(),
            timeouts: timeouts.iter(),
            // Every position not held is refused (at step 1 or 2): counted so, not by a
            // pass over the slots (14 instructions an operation; callgrind,
            // `expiring_watches 20000 64`).
            left: held.len() - chunk.refused,
            member: self.member,
        };
        debug_assert_eq!(tasks.left, held.iter().filter(|l| l.is_some()).count());
        let mut armings = Vec::with_capacity(tasks.left);
        self.timer.add_batch_from(tasks, &mut armings);
        let at = self.armed_at();
        let mut armings = armings.into_iter();
        let mut handed_over = SmallVec::new();
        for (position, locked) in held.iter_mut().enumerate() {
            let Some(locked) = locked.take() else {
                continue;
            };
            let op = locked.op();
            let arming = armings.next().expect("one result per task");
            match self.armed(locked, arming, at) {
                Ok(expired) => {
                    if let Some(expired) = expired {
                        handed_over.push(expired);
                    }
                    chunk.pending(position, op, self.id);
                }
                Err(refusal) => chunk.refused(position, refusal),
            }
        }
        handed_over
    }

    /// Step 5 for a chunk: tries each operation still waiting once, under its slot
    /// (waiting for a holder), answering at once what it completes and any expiry its
    /// unlock hands over.
    fn try_chunk(&self, chunk: &mut Chunk<'_, O>, driver: &Driver<Group>) {
        let pin = self.table.pin();
        // In input order, which is the members' order; those refused have an error here.
        for result in chunk.out.iter_mut() {
            let Ok(WatchOutcome::Pending(handle)) = result else {
                continue;
            };
            let Some(locked) = self.table.lock(&pin, handle.op) else {
                continue; // completed, expired or cancelled since it was armed
            };
            // Completed now, it never waited (as a single watch's at its tries).
            if self.try_held(locked, driver, true) == Tried::Completed {
                *result = Ok(WatchOutcome::Completed);
            }
        }
    }

    /// Tries a held operation once, as an event's check does: if ready, takes it (under
    /// the driver's work, taken first) and answers it; if not, lets go of it, answering
    /// at once an expiry the unlock hands over. `never_waited`: a completion is not
    /// sampled as a wait (feature `metrics`).
    #[inline]
    pub(crate) fn try_held(
        &self,
        mut locked: Locked<'_, O>,
        driver: &Driver<Group>,
        #[cfg_attr(not(feature = "metrics"), allow(unused_variables))] never_waited: bool,
    ) -> Tried {
        if self.is_ready(&mut locked) {
            let _work = driver.work();
            #[cfg_attr(not(feature = "metrics"), allow(unused_mut))]
            let mut taken = locked.take();
            #[cfg(feature = "metrics")]
            if never_waited {
                taken.since = crate::op_table::NOT_ARMED;
            }
            self.complete_one(taken, Completion::Ready);
            Tried::Completed
        } else if let Err(handed_over) = locked.unlock() {
            self.answer_handed_over(handed_over, driver);
            Tried::Expired
        } else {
            Tried::Waiting
        }
    }
}

/// The timeouts of a chunk's operations still held, each with its operation's
/// [`Expiry`], in input order: [`State::arm_chunk`]'s tasks for the timer.
struct Tasks<'h, 'a, O: DelayedOperation> {
    held: std::slice::Iter<'h, Option<Locked<'a, O>>>,
    timeouts: std::slice::Iter<'h, Duration>,
    /// How many of `held` are still to come (`Some`): the exact length the timer needs.
    left: usize,
    member: u32,
}

impl<O: DelayedOperation> Iterator for Tasks<'_, '_, O> {
    type Item = (Duration, Expiry);

    #[inline]
    fn next(&mut self) -> Option<(Duration, Expiry)> {
        loop {
            let locked = self.held.next()?;
            let timeout = self.timeouts.next()?;
            if let Some(locked) = locked {
                self.left -= 1;
                let expiry = Expiry {
                    op: locked.op(),
                    member: self.member,
                };
                return Some((*timeout, expiry));
            }
        }
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<O: DelayedOperation> ExactSizeIterator for Tasks<'_, '_, O> {}

/// What a chunk's steps leave for the later steps: each operation's result by input
/// position (in the caller's results), and the slots to free once no slot is held.
struct Chunk<'r, O> {
    out: &'r mut [WatchResult<O>],
    /// How many of `out` are refusals.
    refused: usize,
    /// Slots of refused members, emptied while other slots of the chunk are held.
    vacated: SmallVec<[Vacated; CHUNK]>,
    /// Their spans, closed with the slots freed (the subscriber is user code).
    spans: SmallVec<[CarriedSpan; 1]>,
}

impl<O> Chunk<'_, O> {
    fn refused(&mut self, position: usize, refusal: Refusal<O>) {
        self.refused += 1;
        self.vacated.push(refusal.vacated);
        self.spans.push(refusal.span);
        self.out[position] = Err(refusal.error);
    }

    fn pending(&mut self, position: usize, op: OpRef, id: u64) {
        self.out[position] = Ok(WatchOutcome::Pending(OperationHandle::new(op, id)));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::rc::Rc;

    use super::*;

    /// Keys with drop glue, inline (3) and spilled (6): each is moved out once, in order,
    /// and those not moved out when the iterator goes (an unwinding consumer included)
    /// are dropped with it; `keys` is left empty and usable.
    #[test]
    fn taken_keys_are_each_moved_out_or_dropped_once() {
        for n in [3, 6] {
            let alive = Rc::new(());
            let make =
                || -> Keys<(usize, Rc<()>)> { (0..n).map(|i| (i, Rc::clone(&alive))).collect() };
            let mut keys = make();
            let order: Vec<usize> = take_keys(&mut keys).map(|(i, _)| i).collect();
            assert_eq!(order, (0..n).collect::<Vec<_>>());
            assert!(keys.is_empty());
            assert_eq!(Rc::strong_count(&alive), 1, "{n} keys");
            // Dropped after two were moved out.
            let mut keys = make();
            let mut taken = take_keys(&mut keys);
            let first = taken.next();
            let second = taken.next();
            drop(taken);
            assert_eq!(Rc::strong_count(&alive), 3, "{n} keys");
            drop((first, second));
            assert_eq!(Rc::strong_count(&alive), 1, "{n} keys");
            // A consumer that panics at the second key.
            let mut keys = make();
            let unwound = catch_unwind(AssertUnwindSafe(|| {
                for (i, key) in take_keys(&mut keys) {
                    assert!(i != 1, "the consumer panics");
                    drop(key);
                }
            }));
            assert!(unwound.is_err());
            assert!(keys.is_empty());
            assert_eq!(Rc::strong_count(&alive), 1, "{n} keys");
            keys.push((9, Rc::clone(&alive)));
            assert_eq!(keys.len(), 1);
        }
    }
}
