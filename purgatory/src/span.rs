//! The `tracing` span an operation was watched in, carried with it to its answer, so
//! that what the answer logs belongs to the request, whichever thread answers it.
//!
//! # Contract
//! The span current on the thread that watches an operation (`watch`,
//! `try_complete_else_watch`, `watch_batch`, `park`), at the watch, is entered around
//! the code that answers the operation (`on_complete`, `on_expiration`, the operation's
//! drop) on every path, as the runtime's context is (`runtime.rs`): the caller's thread
//! for a watch that completes at once, an event or a force; the reaper thread, a
//! stand-in or the expiry pool for a timeout; the calling thread for a shutdown; the
//! dropping thread (or a blocking-pool thread, see `purgatory.rs`) for the last handle's
//! drop; the dropping thread for a cancel by a `Parked` or a guard. The operation keeps
//! the span open (one reference) until it is answered or handed back.
//!
//! `try_complete` is not in that list: it runs on the thread that watches or checks. A
//! watch's thread is in the span already (it is the span carried); a check's thread is
//! in the event's span, which is the one that made the check, and the one a
//! `try_complete` that logs should report under. Entering the operation's span there
//! would also call the subscriber (`enter`, `exit`) under the operation's lock, once per
//! candidate of every check, where today only `try_complete` itself runs.
//!
//! # Cost
//! With no subscriber (or one whose maximum level is `OFF`): one relaxed load per watch
//! (`LevelFilter::current()`), an empty pointer moved with the operation, and a branch
//! where it is answered. About 18 instructions a watch and its expiry, under 1 %
//! (callgrind, `benches/examples/expiring_watches.rs`, N=100 and N=20000: 2,189-2,229,
//! median 2,209, against 2,182-2,208, median 2,191, before; the reaper's timing moves
//! each run by a few dozen). A slot holds 8 bytes more (a box's pointer, null when
//! there is no span): 56 bytes instead of 48, plus the operation. With a span current:
//! the subscriber's `current_span` and `clone_span` at the watch, a heap box of 40
//! bytes (a `Span`), and its `enter`, `exit` and `try_close` at the answer.
//!
//! # Invariants
//! - Captured before the operation has a slot (no slot is held while the subscriber
//!   runs), moved into the slot with the operation and out with it (`op_table.rs`'s
//!   `Taken`), never cloned: one reference per operation, dropped once.
//! - Every call into the subscriber here goes through the door (`user_code.rs`,
//!   `Site::Subscriber`), one step per catch. A subscriber that panics at the capture
//!   leaves the operation without a span; at `enter`, its callbacks run outside the
//!   span (and no `exit` follows); at `exit` or `try_close`, that step is lost. None of
//!   it unwinds into the purgatory.
//! - Entered once per operation, outside the door's catches of its callbacks: a callback
//!   that panics is caught inside the span (so the door's report of the panic carries
//!   it), and the span is exited after the catch, on the normal path. Nothing a callback
//!   does leaves the span entered; should the purgatory's own code unwind in between,
//!   the guard (`tracing`'s `Entered`) exits it on the way.
//! - A span a path does not enter (an operation handed back by `cancel`, or refused
//!   after it had a slot) is closed through the door too ([`CarriedSpan::close`]).

use std::mem::ManuallyDrop;

use tracing::level_filters::LevelFilter;
use tracing::Span;

use crate::user_code::{Site, UserCode};

/// The span current where an operation was watched, if a subscriber gave one. Boxed:
/// a slot pays 8 bytes for it, not a `Span`'s 40, and nothing is allocated without one.
///
/// Without drop glue (`ManuallyDrop`), by design: every path hands it to
/// [`enter_around`](Self::enter_around) or [`close`](Self::close), which call the
/// subscriber through the door, and the operation's way from its slot to its callbacks
/// (`Taken`) stays free of unwinding paths. (With a plain `Box<Span>`, every function
/// holding a `Taken` got one, LLVM stopped inlining the slot's take and occupy, and a
/// watch cost about 80 instructions more with no span at all.) One dropped any other
/// way, which only the unwinding of a panic of the purgatory's own code does, is leaked,
/// never closed; a slot still occupied when its table is dropped drops its span itself
/// (`op_table.rs`).
#[derive(Default)]
pub(crate) struct CarriedSpan(ManuallyDrop<Option<Box<Span>>>);

impl CarriedSpan {
    /// The span current on this thread, to carry with an operation; none if no span is
    /// current, or no subscriber wants any (then no subscriber is asked).
    #[inline]
    pub(crate) fn current(user: &UserCode) -> Self {
        // `OFF` when no subscriber is set (or none wants anything): `tracing`'s macros
        // then create no span, so none can be current.
        if LevelFilter::current() == LevelFilter::OFF {
            return CarriedSpan::default();
        }
        Self::capture(user)
    }

    /// [`current`](Self::current) once a subscriber is set: asks it, through the door.
    #[inline(never)]
    fn capture(user: &UserCode) -> Self {
        let span = user.call(Site::Subscriber, Span::current);
        // A disabled span (none current) holds no subscriber: dropping it calls nothing.
        CarriedSpan(ManuallyDrop::new(
            span.filter(|span| !span.is_disabled()).map(Box::new),
        ))
    }

    /// Runs `answer` (an operation's callbacks, each behind its own catch) with the span
    /// entered, then exits and closes the span; without a span, just runs it.
    #[inline]
    pub(crate) fn enter_around<R>(self, user: &UserCode, answer: impl FnOnce() -> R) -> R {
        match ManuallyDrop::into_inner(self.0) {
            None => answer(),
            Some(span) => in_span(span, user, answer),
        }
    }

    /// Drops the span plainly, not through the door: for a slot dropped with its
    /// operation still in it (see the type's doc).
    pub(crate) fn drop_plainly(&mut self) {
        drop(std::mem::take(&mut *self.0));
    }

    /// Closes the span without entering it (an operation handed back or refused).
    #[inline]
    pub(crate) fn close(self, user: &UserCode) {
        if let Some(span) = ManuallyDrop::into_inner(self.0) {
            user.drop(Site::Subscriber, span);
        }
    }
}

/// Enters `span`, runs `answer`, exits and closes `span`: each call into the subscriber
/// through the door, one per catch. Out of line: the path with no span stays small.
#[inline(never)]
fn in_span<R>(span: Box<Span>, user: &UserCode, answer: impl FnOnce() -> R) -> R {
    let answered = {
        // The guard: dropped through the door below, or by unwinding should the
        // purgatory's own code panic in `answer` (a callback never unwinds: each is
        // caught inside).
        let entered = user.call(Site::Subscriber, || span.enter());
        let answered = answer();
        if let Some(entered) = entered {
            user.drop(Site::Subscriber, entered);
        }
        answered
    };
    user.drop(Site::Subscriber, span);
    answered
}
