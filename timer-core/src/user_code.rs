//! Caught panics: reading their message, and dropping their payload without a second
//! unwind. Every layer that contains user panics (the driver, the timer's task runner, a
//! purgatory's callbacks) goes through these.

use std::any::Any;

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
    if let Err(again) =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)))
    {
        std::mem::forget(again);
    }
}
