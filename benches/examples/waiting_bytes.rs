//! Bytes per waiting operation: watches `N` W3 operations (default 1,000,000) that all
//! wait (a 600 s timeout, nothing completes them) into one implementation, and prints
//! the heap bytes still allocated per operation once they wait, and the resident memory
//! grown per operation.
//!
//! ```text
//! cargo build --release -p purgatory-benches --examples
//! target/release/examples/waiting_bytes IMPL [N] [KEYS]
//! ```
//!
//! `IMPL` is `ours`, `naive` or `tokio-delayqueue` (the load tool's names); `KEYS` is
//! `distinct` (default: operation `i` waits on key `i` alone, a million keys) or `3of100`
//! (3 of 100 keys, as `expiring_watches`).
//!
//! # How it counts
//! - Live bytes are what the process's global allocator has handed out and not taken
//!   back, by requested size (a wrapper over the system allocator counts every
//!   allocation, free and reallocation), so the figure does not depend on an allocator's
//!   rounding or its headers; resident memory (`VmRSS`, system allocator) does, and is
//!   printed beside it. Ours takes its timer's entry slabs from the system itself
//!   (mapped pages, or the system allocator for small ones), past the wrapper: their bytes (`TimerStats::entry_bytes`, the slabs'
//!   capacity) are added to ours' live bytes.
//! - Both are read after the implementation is built (its threads running, nothing
//!   watched) and again once the count of live bytes has not moved for 300 ms after the
//!   last watch (the `DelayQueue` peer's driver takes its channel's messages in after
//!   the watches return); the difference over `N` is the figure. It includes the
//!   operation itself (24 bytes, the load tool's `LoadOp`) and every structure the
//!   implementation keeps for it: keys' lists, timer entries, slots. The handles the
//!   watches return are dropped at once, as a broker that never forces would.
//! - Operations are watched in batches of 64 through `LoadPurgatory::watch_batch`, as the
//!   load tool's generator does.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use purgatory_benches::harness::process::resident_bytes;
use purgatory_benches::peers::{NaivePurgatory, TokioDelayQueuePurgatory};
use purgatory_benches::workloads::w3::{LoadContext, LoadOp, LoadPurgatory};

/// Bytes handed out and not yet freed, by requested size.
static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting [`LIVE`] bytes.
struct Counting;

// SAFETY: every method forwards to the system allocator with the caller's arguments, and
// only adds bookkeeping on an atomic counter.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Live bytes (those the global allocator counts, and `unseen`, what the implementation
/// took from the system itself) and resident bytes now.
fn reading(unseen: &dyn Fn() -> usize) -> (isize, u64) {
    (
        LIVE.load(Ordering::Relaxed) + unseen() as isize,
        resident_bytes(),
    )
}

/// Waits until the live bytes have not moved for 300 ms (at most 20 s).
fn settle() {
    let give_up = Instant::now() + Duration::from_secs(20);
    let mut last = LIVE.load(Ordering::Relaxed);
    let mut still = 0;
    while still < 3 && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(100));
        let now = LIVE.load(Ordering::Relaxed);
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
}

/// `unseen`: the bytes `p` holds that the global allocator does not count (ours: the
/// timer's entry slabs, taken from the system itself, `TimerStats::entry_bytes`).
fn measure<P: LoadPurgatory<LoadOp>>(
    name: &str,
    p: &P,
    unseen: &dyn Fn() -> usize,
    n: usize,
    keys: &str,
) {
    let lists: Vec<Vec<u64>> = match keys {
        "distinct" => (0..n as u64).map(|i| vec![i]).collect(),
        "3of100" => (0..n as u64)
            .map(|i| vec![i % 100, (i * 7 + 3) % 100, (i * 13 + 5) % 100])
            .collect(),
        other => panic!("KEYS is distinct or 3of100, not {other}"),
    };
    let ctx: &'static LoadContext = Box::leak(Box::new(LoadContext::new(
        n,
        Duration::from_secs(600),
        false,
    )));
    let mut batch = Vec::with_capacity(64);
    let mut handles = Vec::with_capacity(64);
    settle();
    let (live0, rss0) = reading(unseen);
    for (start, chunk) in (0..n).step_by(64).zip(lists.chunks(64)) {
        let now = ctx.now_nanos();
        for (j, k) in chunk.iter().enumerate() {
            batch.push((LoadOp::new(ctx, (start + j) as u32, now), &k[..]));
        }
        p.watch_batch(&mut batch, &mut handles);
        handles.clear();
    }
    settle();
    let (live1, rss1) = reading(unseen);
    let waiting = n as u64 - ctx.completed() - ctx.expired();
    assert_eq!(waiting, n as u64, "every operation should still be waiting");
    println!(
        "{name} keys={keys}: {waiting} waiting; live heap {:.1} B per operation ({:.1} MiB), \
resident {:.1} B per operation ({:.1} MiB)",
        (live1 - live0) as f64 / n as f64,
        (live1 - live0) as f64 / 1048576.0,
        (rss1 as f64 - rss0 as f64) / n as f64,
        (rss1 as f64 - rss0 as f64) / 1048576.0,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map_or("ours", String::as_str);
    let n: usize = args.get(2).map_or(1_000_000, |a| a.parse().expect("N"));
    let keys = args.get(3).map_or("distinct", String::as_str);
    match name {
        "ours" => {
            let p = purgatory::Purgatory::<u64, LoadOp>::builder()
                .name("waiting")
                .build()
                .expect("a purgatory");
            measure(name, &p, &|| p.timer_stats().entry_bytes, n, keys);
        }
        "naive" => measure(
            name,
            &NaivePurgatory::start(1000).expect("a reaper"),
            &|| 0,
            n,
            keys,
        ),
        "tokio-delayqueue" => measure(
            name,
            &TokioDelayQueuePurgatory::start(1000).expect("a driver"),
            &|| 0,
            n,
            keys,
        ),
        other => panic!("IMPL is ours, naive or tokio-delayqueue, not {other}"),
    }
    // Answering a million shutdowns is not what is measured.
    std::process::exit(0);
}
