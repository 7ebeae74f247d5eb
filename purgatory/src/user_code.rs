//! User panics the purgatory catches: each is reported through `tracing` (target
//! `purgatory`, level error) and its payload dropped without a second unwind (a payload
//! is user data, and its `Drop` may panic too; see
//! [`timer_core::drop_panic_payload`]). Counting them is the caller's.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`, catching a panic: reported as `what` and dropped, `None` then.
#[inline]
pub(crate) fn caught<R>(what: &str, f: impl FnOnce() -> R) -> Option<R> {
    catch_unwind(AssertUnwindSafe(f))
        .map_err(|payload| report(what, payload))
        .ok()
}

/// Reports a caught panic as `what`, then drops its payload (out of line: rare).
#[cold]
#[inline(never)]
pub(crate) fn report(what: &str, payload: Box<dyn Any + Send>) {
    tracing::error!(
        target: "purgatory",
        panic = timer_core::panic_message(&*payload),
        "{what}"
    );
    timer_core::drop_panic_payload(payload);
}
