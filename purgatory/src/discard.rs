//! Dropping large memory off the reaper: what the give-back frees (`op_table/give_back.rs`)
//! is handed to one thread of the process that only drops things, so that the reaper's
//! timeouts never wait for an unmapping.
//!
//! Freeing a large block returns its pages to the system (`munmap`): milliseconds for the
//! tens of megabytes a burst's segments take, and while it runs, every other change to
//! the process's mappings (a thread's stack, a large allocation, a `realloc` that moves
//! or shrinks a large block) waits for it. So the give-back hands such blocks here, and
//! takes no step that changes the mappings while this thread is still at it
//! ([`busy`]).
//!
//! # Invariants
//! - The thread is started at the first hand-over of the process (by whichever
//!   purgatory's reaper makes it), named `purgatory-free`, and then blocks on its queue;
//!   it drops each thing it is handed, in order, and nothing else. It is never joined: the
//!   process's exit ends it.
//! - What it drops runs none of the caller's code: the give-back hands it vacant slots
//!   (no operation, no span, no timer handle) and buffers of slot indices.
//! - If it cannot start, every hand-over drops its thing in place, on the caller's
//!   thread (what the give-back did before it existed).
//! - [`busy`] is true from a hand-over until the thread has dropped it (an estimate for
//!   pacing, not a synchronisation: nothing is unsafe if it is stale).
//! - Under loom there is no such thread (`busy` is always false): the give-back marks a
//!   segment freed where it would hand it over (`give_back.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::mpsc::{channel, Sender};
#[cfg(not(loom))]
use std::sync::OnceLock;

/// Something to drop.
#[cfg(not(loom))]
type Garbage = Box<dyn Send>;

/// The queue to the thread, or `None` if it could not start.
#[cfg(not(loom))]
static QUEUE: OnceLock<Option<Sender<Garbage>>> = OnceLock::new();

/// Hand-overs not dropped yet.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Drops `garbage` on the thread of this module (started now if it is the first), or in
/// place if that thread cannot start.
#[cfg(not(loom))]
pub(crate) fn discard<T: Send + 'static>(garbage: T) {
    let queue = QUEUE.get_or_init(|| {
        let (sender, receiver) = channel::<Garbage>();
        std::thread::Builder::new()
            .name("purgatory-free".into())
            .spawn(move || {
                while let Ok(garbage) = receiver.recv() {
                    // Nothing it is handed panics when dropped; if something did, the
                    // thread would go on, and `busy` would not stay true for good.
                    let dropped = std::panic::AssertUnwindSafe(move || drop(garbage));
                    let _ = std::panic::catch_unwind(dropped);
                    PENDING.fetch_sub(1, Ordering::Relaxed);
                }
            })
            .ok()
            .map(|_| sender)
    });
    let Some(queue) = queue else {
        return drop(garbage);
    };
    PENDING.fetch_add(1, Ordering::Relaxed);
    let sent = queue.send(Box::new(garbage));
    if let Err(returned) = sent {
        // The thread is gone (it cannot be, short of a panic in a drop): in place.
        PENDING.fetch_sub(1, Ordering::Relaxed);
        drop(returned);
    }
}

/// Under loom, in place: there is no such thread (see the module doc).
#[cfg(loom)]
pub(crate) fn discard<T: Send + 'static>(garbage: T) {
    drop(garbage);
}

/// Whether the thread has something still to drop (see the module doc).
pub(crate) fn busy() -> bool {
    PENDING.load(Ordering::Relaxed) > 0
}
