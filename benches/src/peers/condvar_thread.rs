//! A timer thread over `Mutex<BinaryHeap>` + `Condvar`: the classic hand-written timer.
//!
//! Adders push under the lock and notify only when their task became the earliest (the
//! only case in which the sleeping thread must wake sooner). The thread pops every due
//! task in one critical section, runs them outside the lock, and otherwise waits until
//! the earliest deadline. It reads the clock once per wake-up.
//!
//! # Invariants
//! - Every added task runs exactly once on the timer thread, not before its deadline,
//!   unless handed back by `shutdown`.
//! - After `shutdown` the thread has exited and no task runs any more.

use std::collections::BinaryHeap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::heap_entry::HeapEntry;

struct State<T> {
    heap: BinaryHeap<HeapEntry<Instant, T>>,
    next_seq: u64,
    closed: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    wake: Condvar,
}

/// A heap timer with its own thread that runs `on_fire` for each expired task.
pub struct CondvarTimer<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> CondvarTimer<T> {
    /// Starts the timer thread; `on_fire` runs on it for every expired task.
    pub fn start(on_fire: impl FnMut(T) + Send + 'static) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                heap: BinaryHeap::new(),
                next_seq: 0,
                closed: false,
            }),
            wake: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("condvar-timer".into())
            .spawn(move || run(&worker, on_fire))?;
        Ok(CondvarTimer {
            shared,
            thread: Some(thread),
        })
    }

    /// Schedules `task` to run at `deadline`.
    pub fn add_at(&self, deadline: Instant, task: T) {
        let mut state = self.shared.state.lock();
        let seq = state.next_seq;
        state.next_seq += 1;
        state.heap.push(HeapEntry {
            deadline,
            seq,
            task,
        });
        let earliest = state.heap.peek().is_some_and(|e| e.seq == seq);
        drop(state);
        if earliest {
            self.shared.wake.notify_one();
        }
    }

    /// Number of tasks waiting.
    pub fn len(&self) -> usize {
        self.shared.state.lock().heap.len()
    }

    /// Whether no task is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops the thread and hands back the tasks that had not run.
    pub fn shutdown(mut self) -> Vec<T> {
        self.stop()
    }

    fn stop(&mut self) -> Vec<T> {
        let mut state = self.shared.state.lock();
        state.closed = true;
        let rest = std::mem::take(&mut state.heap);
        drop(state);
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        rest.into_iter().map(|e| e.task).collect()
    }
}

impl<T: Send + 'static> Drop for CondvarTimer<T> {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run<T>(shared: &Shared<T>, mut on_fire: impl FnMut(T)) {
    let mut batch = Vec::new();
    let mut state = shared.state.lock();
    while !state.closed {
        let now = Instant::now();
        while state.heap.peek().is_some_and(|e| e.deadline <= now) {
            if let Some(entry) = state.heap.pop() {
                batch.push(entry.task);
            }
        }
        if !batch.is_empty() {
            MutexGuard::unlocked(&mut state, || batch.drain(..).for_each(&mut on_fire));
            continue;
        }
        match state.heap.peek().map(|e| e.deadline) {
            Some(deadline) => {
                shared.wake.wait_until(&mut state, deadline);
            }
            None => shared.wake.wait(&mut state),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn fires_in_order_not_early_and_shuts_down() {
        let (tx, rx) = std::sync::mpsc::channel();
        let timer = CondvarTimer::start(move |t: (u32, Instant)| {
            tx.send((t.0, Instant::now() >= t.1)).unwrap();
        })
        .unwrap();
        let now = Instant::now();
        for (i, ms) in [(0u32, 20u64), (1, 5), (2, 10)] {
            let at = now + Duration::from_millis(ms);
            timer.add_at(at, (i, at));
        }
        let far = now + Duration::from_secs(60);
        timer.add_at(far, (9, far));
        let got: Vec<_> = (0..3)
            .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        assert_eq!(got, vec![(1, true), (2, true), (0, true)]);
        assert_eq!(timer.shutdown().len(), 1);
    }
}
