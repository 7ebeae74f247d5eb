//! The one door through which the timer calls code it does not own, and what becomes of a
//! panic or a stall there. Every such call goes through [`caught`] (or, for a clock, the
//! timer's clock reader in `clock.rs`, which goes through it too), so the table below is
//! the whole story: nothing else the timer runs is user code.
//!
//! # The user code the timer calls
//! | user code | where it runs | a panic there | a stall there delays |
//! |---|---|---|---|
//! | [`Clock::now`](crate::Clock::now) of a clock other than [`SystemClock`](crate::SystemClock) and [`ManualClock`](crate::ManualClock) (which cannot panic, and are read directly) | building the core; every add (`add`, `add_at`, `add_batch`); every round (what is due, how long to wait); `TimerCore::now` | caught, reported, counted in `TimerStats::clock_panics`; the last good reading stands in, so time stands still for that read (never goes back) | that add, or that round and every expiry after it |
//! | [`TimerTask::run`](crate::TimerTask::run) of a [`Timer`](crate::Timer)'s task | the driving thread, or a pool thread | caught, reported, counted in `TimerStats::panicked`; the rest of the batch runs | inline: the rest of its batch and later rounds, until they have waited half the stand-in bound and stand-ins take them over (`stand_in.rs`; with `stand_in(None)`, every later expiry); on a pool: that pool thread's batches |
//! | a task's `Drop` when a [`Timer`](crate::Timer) is dropped with tasks pending | the dropping thread | caught per task, reported; the other tasks are dropped | that drop |
//! | an owner's [`Expire`](crate::Expire) target: `expire` | the driving thread or a pool thread | backstop: caught, reported; the rest of that batch is the owner's loss (owners catch per task; the purgatory lets nothing escape) | as `run` |
//! | `before_round`, `after_round` | every round, on the driving thread | caught, reported; the round goes on (after `after_round`, under the bound the round itself had) | that round, and later rounds until they have waited half the stand-in bound and a stand-in runs them (as `run`) |
//! | `at_drop` | the thread dropping the driver | caught, reported | that drop |
//! | the wake hook ([`TimerCore::set_wake_hook`](crate::TimerCore::set_wake_hook)) | an adding thread, `wake`, shutdown | caught, reported | that caller |
//! | the executor's pool ([`Executor::Pool`](crate::Executor)) | rayon runs each batch as a job | a job never panics: everything it runs is caught inside it (rayon would abort the process otherwise) | a pool busy with other work delays the batches queued behind it |
//! | the `tracing` subscriber | every report of a caught panic (on the thread that caught it) and of a timer dropped with tasks pending; the relief machinery's reports (stand-ins started, the limit reached, a thread that could not start) on a reporter thread of their own (`stand_in.rs`, `Reports`) | caught, that event lost | its caller (a driving thread: as `run`); the reporter's: nothing but later reports, which pile up as counts |
//! | a caught panic's payload (its `Drop`) | wherever the panic was caught | caught again, the second payload leaked ([`drop_panic_payload`]) | |
//!
//! Reports go through `tracing` (target `timer_core`, level error). A panic is never
//! allowed to unwind through the timer's own code: no lock is held, and no task is half
//! moved, where user code runs (tasks are handed out of the wheel before they run, see
//! `core.rs`), and a driving thread never unwinds.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`, user code described as `what` in a report; a panic is caught, reported, its
/// payload dropped, and `None` returned.
#[inline]
pub(crate) fn caught<R>(what: &'static str, f: impl FnOnce() -> R) -> Option<R> {
    catch_unwind(AssertUnwindSafe(f))
        .map_err(|payload| report(what, payload))
        .ok()
}

/// Reports a caught panic as `what`, then drops its payload (out of line: rare).
#[cold]
#[inline(never)]
pub(crate) fn report(what: &str, payload: Box<dyn Any + Send>) {
    let message = panic_message(&*payload);
    event(|| tracing::error!(target: "timer_core", panic = message, "{what}"));
    drop_panic_payload(payload);
}

/// Emits a `tracing` event through the door: the subscriber is user code, and one that
/// panics loses that event only.
pub(crate) fn event(emit: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(emit)) {
        drop_panic_payload(payload);
    }
}

/// The message of a caught panic's payload: the `&str` or `String` that `panic!` was
/// given, or a placeholder for any other payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

/// Drops a caught panic's payload. A payload is user data, and its `Drop` may panic too:
/// that second panic is caught, and its own payload leaked rather than dropped (it could
/// panic again, without end), so whoever caught the first panic goes on.
pub fn drop_panic_payload(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

/// Drops every value of `values` on its own, each through [`caught`]: one `Drop` that
/// panics neither skips the others nor unwinds (a second panic while a slice is being
/// dropped would abort the process).
pub(crate) fn drop_each<T>(what: &'static str, values: impl IntoIterator<Item = T>) {
    if std::mem::needs_drop::<T>() {
        for value in values {
            caught(what, move || drop(value));
        }
    }
}
