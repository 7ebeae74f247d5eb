//! The implementations ours is measured against, one file each. Each is written as well
//! as its design allows: no artificial locks, copies or clock reads that a careful user
//! of that design would avoid.
//!
//! | peer | workloads | design |
//! |---|---|---|
//! | [`LazyHeapTimer`] | W1 | `BinaryHeap` of (deadline, sequence); cancel clears a bit, the entry stays until popped |
//! | [`BTreeTimer`] | W1 | `BTreeMap<(deadline, id), task>`; cancel really removes |
//! | [`DelayQueueTimer`] | W1, W2 | `tokio_util::time::DelayQueue` (tokio's slab-backed wheel) |
//! | [`CondvarTimer`] | W2 | a dedicated thread over `Mutex<BinaryHeap>` + `Condvar` |
//! | [`NaivePurgatory`] | W3 | `Mutex<HashMap<key, Vec<op>>>` + a `BinaryHeap` timer with a reaper thread |

mod binary_heap;
mod btree_map;
mod condvar_thread;
mod delay_queue;
mod heap_entry;
mod naive_purgatory;

pub use binary_heap::{HeapHandle, LazyHeapTimer};
pub use btree_map::{BTreeHandle, BTreeTimer};
pub use condvar_thread::CondvarTimer;
pub use delay_queue::{delay_queue_expiry_run, paused_runtime, DelayQueueTimer};
pub use naive_purgatory::{NaiveHandle, NaivePurgatory};
