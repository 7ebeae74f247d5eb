//! The `null-late` W3 target: a test fixture for the on-time `--find-max` search. Like
//! [`null`](super::null) it does no purgatory work (`force_complete` completes at once),
//! but a request left to expire is answered [`LATE_BY`] after its deadline, by a thread
//! of its own: it keeps up with any offered rate and is never on time.
//!
//! # Invariants
//! - Every watched operation completes exactly once: forced through its handle; or, once
//!   its handle is dropped with the operation inside, expired by the thread no earlier
//!   than its deadline plus [`LATE_BY`]; or, if still queued at shutdown, as shutdown.
//! - Dropped handles queue their operations in drop order; the generator drops them in
//!   issue order and every request has the same timeout, so the queue is in deadline
//!   order and the thread only ever waits for its front.
//! - W3-events is not supported (`check_and_complete` completes nothing), as for `null`.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use purgatory::{Completion, DelayedOperation};

use crate::workloads::w3::op::LoadOp;
use crate::workloads::w3::LoadPurgatory;

/// How late after its deadline every expiry is answered.
pub const LATE_BY: Duration = Duration::from_millis(50);

/// Operations left to expire, and whether the target is shut down.
#[derive(Default)]
struct Queue {
    state: Mutex<(VecDeque<LoadOp>, bool)>,
    wake: Condvar,
}

/// The late tool-floor target.
pub struct LateNullPurgatory {
    queue: Arc<Queue>,
    expirer: Mutex<Option<JoinHandle<()>>>,
}

/// Holds a watched operation until it is forced, or queues it for a late expiry when
/// dropped.
pub struct LateNullHandle {
    op: Cell<Option<LoadOp>>,
    queue: Arc<Queue>,
}

impl Drop for LateNullHandle {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            self.queue.state.lock().0.push_back(op);
            self.queue.wake.notify_one();
        }
    }
}

impl LateNullPurgatory {
    /// Starts the expiring thread.
    pub fn start() -> std::io::Result<Self> {
        let queue = Arc::new(Queue::default());
        let for_thread = Arc::clone(&queue);
        let expirer = std::thread::Builder::new()
            .name("null-late".into())
            .spawn(move || expire_late(&for_thread))?;
        Ok(LateNullPurgatory {
            queue,
            expirer: Mutex::new(Some(expirer)),
        })
    }
}

/// The thread: expires the queue's front at its deadline plus [`LATE_BY`]; at shutdown,
/// answers what is left as shutdown.
fn expire_late(queue: &Queue) {
    let late_by = u64::try_from(LATE_BY.as_nanos()).unwrap_or(u64::MAX);
    let mut state = queue.state.lock();
    loop {
        if state.1 {
            let left: Vec<LoadOp> = state.0.drain(..).collect();
            drop(state);
            for mut op in left {
                op.on_complete(Completion::Shutdown);
            }
            return;
        }
        let Some(front) = state.0.front() else {
            queue.wake.wait(&mut state);
            continue;
        };
        let at = front.due_nanos().saturating_add(late_by);
        let now = front.context().now_nanos();
        if now < at {
            queue
                .wake
                .wait_for(&mut state, Duration::from_nanos(at - now));
            continue;
        }
        if let Some(mut op) = state.0.pop_front() {
            drop(state);
            op.on_complete(Completion::Expired);
            state = queue.state.lock();
        }
    }
}

impl LoadPurgatory<LoadOp> for LateNullPurgatory {
    type Handle = LateNullHandle;

    fn watch(&self, op: LoadOp, _keys: &[u64]) -> Option<LateNullHandle> {
        Some(LateNullHandle {
            op: Cell::new(Some(op)),
            queue: Arc::clone(&self.queue),
        })
    }

    fn force_complete(&self, handle: &LateNullHandle) -> bool {
        match handle.op.take() {
            Some(mut op) => {
                op.on_complete(Completion::Forced);
                true
            }
            None => false,
        }
    }

    fn check_and_complete(&self, _key: u64) -> usize {
        0
    }

    fn shutdown(&self) {
        self.queue.state.lock().1 = true;
        self.queue.wake.notify_one();
        if let Some(expirer) = self.expirer.lock().take() {
            let _ = expirer.join();
        }
    }
}

impl Drop for LateNullPurgatory {
    fn drop(&mut self) {
        LoadPurgatory::shutdown(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::w3::op::LoadContext;

    #[test]
    fn expires_late_and_each_operation_once() {
        let ctx: &'static LoadContext = Box::leak(Box::new(LoadContext::new(
            3,
            Duration::from_millis(1),
            false,
        )));
        let p = LateNullPurgatory::start().expect("a thread");
        let forced = p.watch(LoadOp::new(ctx, 0, ctx.now_nanos()), &[]).unwrap();
        assert!(p.force_complete(&forced));
        assert!(!p.force_complete(&forced));
        drop(forced);
        drop(p.watch(LoadOp::new(ctx, 1, ctx.now_nanos()), &[]));
        while ctx.expired() < 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let late_by = i64::try_from(LATE_BY.as_nanos()).unwrap();
        assert!(ctx.lateness().min().unwrap() >= late_by);
        // Queued far ahead of its expiry: answered as shutdown.
        let ctx2: &'static LoadContext = Box::leak(Box::new(LoadContext::new(
            1,
            Duration::from_secs(600),
            false,
        )));
        drop(p.watch(LoadOp::new(ctx2, 0, ctx2.now_nanos()), &[]));
        LoadPurgatory::shutdown(&p);
        assert_eq!((ctx.completed(), ctx.expired()), (1, 1));
        assert_eq!(ctx2.expired(), 1);
    }
}
