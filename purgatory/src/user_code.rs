//! The one door through which the purgatory calls code it does not own, and what becomes
//! of a panic or a stall there. Every call into user code goes through a [`UserCode`]
//! (`call`, `drop`, `to_caller`) or the `report!` macro, so a reader finds every such
//! call by those names, and the table below is the whole story.
//!
//! # The user code a purgatory calls
//! | user code | where it runs | held meanwhile | a panic there | a stall there delays |
//! |---|---|---|---|---|
//! | `DelayedOperation::timeout` | a watch, before anything of the operation exists here | nothing | refused: `WatchError::TimeoutPanicked(op)` | that watch (in a batch, the operations after it are not armed yet) |
//! | `try_complete` | a single watch (before and after listing), a batch watch (once, after listing and arming), a check | the operation's own slot only | "not ready"; its payload is dropped through the door too | that operation, and the calling thread's later work: a check, force or cancel of it waits (and the rest of that check's key, force batch or chunk's try step with it); its timeout is left to the holder, which answers it the moment `try_complete` returns, before any other user code of that thread |
//! | `on_complete`, `on_expiration` | the thread that completes the operation (`docs/purgatory.md`, "Which thread runs what") | nothing | the operation still counts as completed; the other callback still runs | that thread, and an outside `shutdown` (it waits for answers in progress); on the reaper, the expiries of that round's batch and later rounds until a stand-in takes them over (`docs/purgatory.md`, "Isolation") |
//! | the operation's `Drop` | right after its callbacks; a `Parked` or `CancelOnDrop` dropped while it waits | nothing | nothing more: it is gone | as the callbacks |
//! | a key's `Hash` | a watch listing it; a check or `cancel_for_key` of a key the caller lends | a watch: the slots of its operations (not armed yet); else nothing | a watch: that operation refused (`WatchError::KeyPanicked`), its entries on other keys stale; a check or `cancel_for_key`: reaches the caller, nothing changed | that call |
//! | a key's `Eq` | against keys of equal hash, under a watcher shard lock | that shard's lock (and a watch's slots) | as `Hash` | every call on keys of that shard |
//! | a key's `Drop` | a key the lists did not keep (already listed), a refused operation's keys, a list removed (a check that empties it, `cancel_for_key`, a purge, shutdown) | nothing (after the shard lock is released), or a watch's slots | that key only: the rest of the call goes on (a purge, `cancel_for_key` and shutdown finish their work) | that call (a purge: the reaper's round, until a stand-in takes the rounds over) |
//! | a key's `Clone` | never: the purgatory never clones a key | | | |
//! | the clock (`TimerBuilder::clock`) | every arming, every round | as its caller | the timer's door: the last good reading stands in (`timer_core`'s `user_code.rs`) | as its caller |
//! | the `metrics` recorder (feature `metrics`) | registering at build, publishing (a round, `publish_metrics`, shutdown), recording wait samples (each completion call) | the publisher's lock, or the calling thread's stripe of histogram handles | that publish or those samples are lost | that round, or that completion |
//! | the `tracing` subscriber | every `report!` (debug events, panic reports); with a subscriber set, each watch asks it for the span current (`current_span`, `clone_span`), and each operation carrying a span has it entered, exited and closed around its callbacks (`span.rs`) | as its caller; a span is asked for before the operation has a slot, and closed once no slot of the watch is held | that event is lost; that span step is lost (the operation carries no span, or its callbacks run outside it, or it is not exited or closed in the subscriber's books) | as its caller |
//! | the caller's iterators (keys, batches) | before anything is taken into the purgatory | nothing | reaches the caller: the operation was never accepted | that call |
//!
//! Every panic caught here is reported through `tracing` (target `purgatory`, level error)
//! and counted in `stats().panicked` (the clock's are counted by the timer and added
//! there). A panic reaches a caller only where the table says so (a key the caller lends
//! to a check or `cancel_for_key`, the caller's own iterators), and then before anything
//! was changed or after a change already whole.
//!
//! # Invariants
//! - No user code runs where a panic could leave a slot, a list, a round or the reaper
//!   half done: every such call is caught here, and the library code around it goes on
//!   as if the call had returned (with the fallback in the table).
//! - One value per catch: a `Drop` is run through [`UserCode::drop`] one value at a time,
//!   never by dropping a collection (a second panic while a collection drops its
//!   elements would abort the process).
//! - A caught payload is dropped through `timer_core::drop_panic_payload`, which catches
//!   a payload whose own `Drop` panics.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use std::panic::{catch_unwind, AssertUnwindSafe};

/// A kind of user code the purgatory calls (see the module doc): what a report says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Site {
    Timeout,
    TryComplete,
    OnComplete,
    OnExpiration,
    OperationDrop,
    KeyHash,
    KeyEq,
    KeyDrop,
    #[cfg(feature = "metrics")]
    Recorder,
    Subscriber,
}

impl Site {
    /// What a report of a panic here says.
    fn report(self) -> &'static str {
        match self {
            Site::Timeout => "timeout() panicked; the operation is handed back",
            Site::TryComplete => "try_complete panicked; treated as not ready",
            Site::OnComplete => "on_complete panicked",
            Site::OnExpiration => "on_expiration panicked",
            Site::OperationDrop => "dropping an operation panicked",
            Site::KeyHash => "a key's Hash panicked; its operation is handed back",
            Site::KeyEq => "a key's Eq panicked; its operation is handed back",
            Site::KeyDrop => "a key's Drop panicked; caught",
            #[cfg(feature = "metrics")]
            Site::Recorder => "the metrics recorder panicked; those figures are lost",
            Site::Subscriber => "the tracing subscriber panicked; that event is lost",
        }
    }
}

/// The door, with the count of the panics it caught (one per purgatory).
#[derive(Debug, Default)]
pub(crate) struct UserCode {
    panicked: AtomicU64,
}

impl UserCode {
    /// Runs `f`, user code of kind `site`; a panic is caught, reported and counted, and
    /// `None` returned.
    #[inline]
    pub(crate) fn call<R>(&self, site: Site, f: impl FnOnce() -> R) -> Option<R> {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(value) => Some(value),
            Err(payload) => {
                self.caught(site, payload);
                None
            }
        }
    }

    /// Drops `value` (its `Drop` is user code of kind `site`), catching a panic. A type
    /// with no drop glue (an integer key, say) costs nothing: no catch is set up.
    #[inline]
    pub(crate) fn drop<T>(&self, site: Site, value: T) {
        if std::mem::needs_drop::<T>() {
            self.call(site, move || drop(value));
        }
    }

    /// Drops the value in `slot` where it lies, leaving `None` (its `Drop` is user code of
    /// kind `site`), catching a panic: [`drop`](Self::drop) without first moving the
    /// value into the catch.
    #[inline]
    pub(crate) fn drop_placed<T>(&self, site: Site, slot: &mut Option<T>) {
        if std::mem::needs_drop::<T>() {
            // The assignment drops the old value where it lies; should that drop panic,
            // the `None` is written all the same, so the value is never dropped twice.
            self.call(site, || *slot = None);
        } else {
            *slot = None;
        }
    }

    /// [`drop`](Self::drop) of the value in `value`, where it lies.
    ///
    /// # Safety
    /// The value in `value` is not used after (not read, not dropped again), even if
    /// its `Drop` panics (caught here), which leaves it dropped in part.
    #[inline]
    pub(crate) unsafe fn drop_manually<T>(&self, site: Site, value: &mut ManuallyDrop<T>) {
        if std::mem::needs_drop::<T>() {
            // SAFETY: the caller's promise.
            self.call(site, || unsafe { ManuallyDrop::drop(value) });
        }
    }

    /// [`drop`](Self::drop)s each value of `values`, one per catch.
    pub(crate) fn drop_each<T>(&self, site: Site, values: impl IntoIterator<Item = T>) {
        if std::mem::needs_drop::<T>() {
            for value in values {
                self.drop(site, value);
            }
        }
    }

    /// Panics caught so far.
    pub(crate) fn panicked(&self) -> u64 {
        self.panicked.load(SeqCst)
    }

    /// Counts and reports a caught panic (out of line: rare).
    #[cold]
    #[inline(never)]
    fn caught(&self, site: Site, payload: Box<dyn std::any::Any + Send>) {
        // SeqCst: see `counters.rs` (a count a final publish must not miss).
        self.panicked.fetch_add(1, SeqCst);
        report_panic(site.report(), &*payload);
        timer_core::drop_panic_payload(payload);
    }
}

/// User code whose panic reaches the purgatory's caller (a key the caller lends to a
/// check or `cancel_for_key`): run as is, named here so that every call into user code
/// is found in this module's terms. The caller runs it before it changes anything.
#[inline(always)]
pub(crate) fn to_caller<R>(_site: Site, f: impl FnOnce() -> R) -> R {
    f()
}

/// Reports a caught panic through `tracing`; a subscriber that panics while reporting it
/// is caught too (its payload dropped, the report lost).
fn report_panic(what: &str, payload: &(dyn std::any::Any + Send)) {
    let message = timer_core::panic_message(payload);
    emit(|| tracing::error!(target: "purgatory", panic = message, "{what}"));
}

/// Reports a slot released by unwinding (see `op_table.rs`), through the door: a
/// subscriber that panics loses the report (not counted: this is no user code's panic
/// but the purgatory's own).
#[cold]
pub(crate) fn report_orphan() {
    emit(|| {
        tracing::error!(target: "purgatory", "a slot was released by unwinding; its operation's expiry is completed by the next reaper round");
    });
}

/// Emits a report whose subscriber's panic is lost, not counted (a report of a panic
/// already counted, or of the purgatory's own).
fn emit(event: impl FnOnce()) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(event)) {
        timer_core::drop_panic_payload(again);
    }
}

/// A `tracing` event of the purgatory (target `purgatory`), through the door: nothing
/// but a static check when the level is off everywhere, and a subscriber that panics
/// (asked whether it wants the event, or given it) loses that event only (caught,
/// counted by `$user`, a [`UserCode`]).
macro_rules! report {
    ($user:expr, $level:ident, $($event:tt)+) => {
        // Calls no subscriber: the global maximum level only.
        if tracing::level_enabled!(tracing::Level::$level) {
            $user.call($crate::user_code::Site::Subscriber, || {
                tracing::event!(target: "purgatory", tracing::Level::$level, $($event)+)
            });
        }
    };
}

pub(crate) use report;
