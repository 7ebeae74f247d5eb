//! The implementations ours is measured against, one file each.
//!
//! | peer | workloads | design |
//! |---|---|---|
//! | [`LazyHeapTimer`] | W1 | `BinaryHeap` of (deadline, sequence); cancel clears a bit, the entry stays until popped |
//! | [`BTreeTimer`] | W1 | `BTreeMap<(deadline, id), task>`; cancel really removes |
//! | [`DelayQueueTimer`] | W1, W2 | `tokio_util::time::DelayQueue` (tokio's slab-backed wheel) |
//! | [`CondvarTimer`] | W2 | a dedicated thread over `Mutex<BinaryHeap>` + `Condvar` |
//! | [`NaivePurgatory`] | W3 | `Mutex<HashMap<key, Vec<op>>>` + a `BinaryHeap` timer with a reaper thread |
//! | [`TokioTaskPurgatory`] | W3 | a tokio task per waiting request (`Notify` or `sleep_until`), watcher lists in a `DashMap` cleaned per key and swept by a timer task |
//! | [`TokioDelayQueuePurgatory`] | W3 | one tokio task driving a `DelayQueue` fed by an unbounded channel (drained in batches), lazy deletion, watcher lists in a `DashMap` cleaned per key and swept by the driver |
//!
//! The two tokio peers share their front, [`DashMapPurgatory`] (watcher lists in a
//! `DashMap`, [`Watchers`]), and differ only in the [`Timeouts`] they plug into it.
//!
//! # Invariants
//! - Each is written as well as its design allows: no artificial locks, copies or clock
//!   reads that a careful user of that design would avoid.
//! - A W1 or W3 peer implements the workload's trait that ours implements too (W1's
//!   `ChurnTimer`, W3's `LoadPurgatory`), so both run the same timed loop; a W2 peer
//!   drives itself and gets the same deadlines and the same firing callback as ours.

mod binary_heap;
mod btree_map;
mod condvar_thread;
mod dashmap_purgatory;
mod dashmap_watchers;
mod delay_queue;
mod heap_entry;
mod naive_purgatory;
#[cfg(test)]
mod test_ops;
mod tokio_delay_queue;
mod tokio_task;

pub use binary_heap::{HeapHandle, LazyHeapTimer};
pub use btree_map::{BTreeHandle, BTreeTimer};
pub use condvar_thread::CondvarTimer;
pub use dashmap_purgatory::{DashMapPurgatory, Pending, PendingHandle, Timeouts};
pub use dashmap_watchers::{Slot, Wake, WatcherStats, Watchers};
pub use delay_queue::{delay_queue_expiry_run, paused_runtime, DelayQueueTimer};
pub use naive_purgatory::{NaiveHandle, NaivePurgatory};
pub use tokio_delay_queue::{DelayQueueDriver, TokioDelayQueuePurgatory};
pub use tokio_task::{TaskPerRequest, TokioTaskPurgatory};
