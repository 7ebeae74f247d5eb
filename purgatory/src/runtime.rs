//! The runtime a purgatory's callbacks run in (cargo feature `tokio`; without it this is
//! an empty type whose `enter` does nothing).
//!
//! # Contract
//! A purgatory built inside a tokio runtime (or given a handle with
//! [`PurgatoryBuilder::runtime`](crate::PurgatoryBuilder::runtime)) runs the code that
//! answers an operation (`on_complete`, `on_expiration`, the operation's drop) with that
//! runtime's context entered, on every path: the caller's thread for a watch that
//! completes at once, an event or a force; the reaper thread or the expiry pool for a
//! timeout; the calling thread for a shutdown; the dropping thread (or a blocking-pool
//! thread, see `purgatory.rs`) for the last handle's drop; the dropping thread for a
//! cancel by a `Parked` or a guard. So `tokio::spawn` and `Handle::current()` work there.
//! (The `tracing` span current at the watch is entered on the same paths: `span.rs`.)
//!
//! `try_complete` is not in that list: it runs on the thread that watches or checks, in
//! that thread's own context (from a task, the runtime's). It decides, it does not
//! answer; entering for it would cost every watch about 135 instructions (a handle's
//! reference count up and down, and a thread-local set and restored; callgrind,
//! `benches/examples/expiring_watches.rs` with `IN_RUNTIME=1`), about an eighth of a
//! watch, where entering only to answer costs the watches that complete nothing.
//!
//! # Without a runtime
//! A purgatory built outside any runtime and given none (a `static` initialised on first
//! use, a synchronous `main` that builds it before the runtime) enters none: its
//! callbacks run as without the feature, and a `tokio::spawn` in `on_complete` panics
//! (caught and counted in `stats().panicked`, the request answered by nothing else). So
//! `build` says so: one `tracing` warning per purgatory built that way (target
//! `purgatory`, level WARN), naming the fix (build inside the runtime, or pass
//! [`PurgatoryBuilder::runtime`](crate::PurgatoryBuilder::runtime)), and
//! [`Purgatory::runtime`](crate::Purgatory::runtime) tells which runtime a purgatory has,
//! for a service to assert at start.
//!
//! It is not an error: cargo features are additive, so a synchronous program gets
//! `tokio` turned on whenever any crate in its tree asks for it, and a build error would
//! break that program although it never uses tokio. Nor does a purgatory need a runtime
//! to be correct: callbacks that answer through a channel or a [`Reply`](crate::Reply)
//! work without one; only those that spawn or look up `Handle::current()` need it.
//!
//! # Invariants
//! - The context is entered where operations are answered (`completion.rs`): once per
//!   batch of completions (up to 16 on an expiry batch, up to 64 for a force batch), once
//!   for a single completion (the reaper's inline expiries are one at a time), and around
//!   the drop of a cancelled operation. Entering nests: a
//!   thread already in this or another runtime's context is in this one's for the
//!   callbacks, and back in its own afterwards.
//! - Entering only sets a thread-local (and clones the handle's reference count); it
//!   never blocks, so it is allowed on a runtime worker and inside another runtime.

#[cfg(feature = "tokio")]
mod with_tokio {
    use crate::user_code::{report, UserCode};

    /// The handle whose context callbacks run in, if any.
    #[derive(Debug, Default)]
    pub(crate) struct RuntimeContext {
        handle: Option<tokio::runtime::Handle>,
    }

    impl RuntimeContext {
        pub(crate) fn new(handle: Option<tokio::runtime::Handle>) -> Self {
            RuntimeContext { handle }
        }

        /// Enters the runtime's context until the guard is dropped (nothing if none).
        #[inline]
        pub(crate) fn enter(&self) -> Option<tokio::runtime::EnterGuard<'_>> {
            self.handle.as_ref().map(tokio::runtime::Handle::enter)
        }

        /// The runtime's handle, if any.
        pub(crate) fn handle(&self) -> Option<&tokio::runtime::Handle> {
            self.handle.as_ref()
        }

        /// At build, once: warns through `user` (the door) that the purgatory `name` has
        /// no runtime, if so (see the module doc).
        pub(crate) fn warn_if_none(&self, name: &str, user: &UserCode) {
            if self.handle.is_none() {
                report!(
                    user,
                    WARN,
                    purgatory = %name,
                    "built outside a tokio runtime and given none: callbacks (on_complete, on_expiration) run in no runtime's context, where tokio::spawn panics; build it inside the runtime or pass PurgatoryBuilder::runtime(handle)"
                );
            }
        }
    }
}

#[cfg(not(feature = "tokio"))]
mod with_tokio {
    /// Without the feature `tokio`: no runtime, nothing to enter.
    #[derive(Debug, Default)]
    pub(crate) struct RuntimeContext;

    /// What entering no runtime gives: nothing to leave.
    pub(crate) struct NotEntered;

    impl RuntimeContext {
        #[inline(always)]
        pub(crate) fn enter(&self) -> NotEntered {
            NotEntered
        }
    }
}

pub(crate) use with_tokio::RuntimeContext;
