//! Reporting a caught panic: the one helper every layer that contains user panics (the
//! driver, the timer's task runner, a purgatory's callbacks) reports through.

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
