//! How late timeouts fire while the reaper purges a large backlog of stale entries.
//!
//! Builds the backlog: `--stale` operations, each watched on a common key and a key of
//! its own. With `--layout distinct` (the default) one event on the common key completes
//! them all, leaving one stale entry per operation on a distinct key; with `--layout hot`
//! an event on each operation's own key completes it, leaving every stale entry on the
//! common key's one list (a hot key that went quiet). The purge interval equals the
//! backlog, so the reaper's first purge after that starts within its 200 ms wait and runs
//! until fewer than half the backlog is left (the purge policy's stopping point).
//! Meanwhile `--probes` operations with timeouts spread 1 ms apart (from 50 ms on) come
//! due, and each records how late it expired. The same is run without a backlog for the
//! baseline, and with the backlog but no purge (what the backlog costs by itself). The
//! load tool's stall probe counts the machine's stalls meanwhile: lateness that comes
//! with stalls is the machine's, not the purgatory's. Percentiles are the load tool's
//! (nearest rank). Prints the lateness (ms) of each run: median, p99, max, and the
//! entries purged while the probes came due.
//!
//! `cargo run --release -p purgatory-benches --bin purge-lateness -- --stale 2000000 [--layout hot]`
//! (mimalloc; `PURGATORY_PERF_ALLOCATOR=system` for the system allocator)
//! (uses only calls every version of the purgatory has, so builds before and after a
//! change can be compared side by side).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use purgatory::{Completion, DelayedOperation, Purgatory, PurgatoryBuilder};
use purgatory_benches::harness::stall_probe::{StallProbe, Stalls};
use purgatory_benches::report::statistics::percentile_sorted;

// mimalloc unless `PURGATORY_PERF_ALLOCATOR=system`, as in the load tool's W3: with
// glibc's allocator, the millions of small lists a purge frees leave it slow for a while
// after (the expiries that follow are delayed by its clean-up, not by the purgatory).
#[global_allocator]
static ALLOCATOR: purgatory_benches::harness::allocator::SelectableAllocator =
    purgatory_benches::harness::allocator::SelectableAllocator;

/// An operation of the backlog: ready once `ready` is set.
struct Backlog {
    ready: Arc<AtomicBool>,
}

/// A probe: never ready; records how late its timeout fired.
struct Probe {
    deadline: Instant,
    timeout: Duration,
    late: Arc<Mutex<Vec<f64>>>,
}

enum Op {
    Backlog(Backlog),
    Probe(Probe),
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        match self {
            Op::Backlog(_) => Duration::from_secs(600),
            Op::Probe(p) => p.timeout,
        }
    }
    fn try_complete(&mut self) -> bool {
        match self {
            Op::Backlog(b) => b.ready.load(Ordering::Acquire),
            Op::Probe(_) => false,
        }
    }
    fn on_complete(&mut self, _how: Completion) {
        if let Op::Probe(p) = self {
            let late = Instant::now().saturating_duration_since(p.deadline);
            p.late.lock().unwrap().push(late.as_secs_f64() * 1e3);
        }
    }
}

const COMMON: u64 = u64::MAX;

/// Where the backlog's stale entries are left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Layout {
    /// One stale entry on each of `--stale` keys.
    Distinct,
    /// All of them on one key's list.
    Hot,
}

/// How late timeouts fire while the reaper purges a backlog of stale entries.
#[derive(Parser, Debug)]
struct Args {
    /// Operations in the backlog: each leaves one stale entry.
    #[arg(long, default_value_t = 2_000_000)]
    stale: u64,
    /// Probes coming due 1 ms apart during the purge.
    #[arg(long, default_value_t = 500)]
    probes: u64,
    /// Where the stale entries are.
    #[arg(long, value_enum, default_value_t = Layout::Distinct)]
    layout: Layout,
}

/// One run; returns (lateness of every probe in ms, entries purged during the probes,
/// and what the stall probe saw while the probes came due).
fn run(stale: u64, probes: u64, purge: bool, layout: Layout) -> (Vec<f64>, u64, Stalls) {
    let purgatory: Purgatory<u64, Op> = PurgatoryBuilder::new()
        .name("purge-lateness")
        .purge_interval(if purge {
            stale.max(1) as usize
        } else {
            usize::MAX
        })
        .build()
        .expect("valid configuration");
    let ready = Arc::new(AtomicBool::new(false));
    for i in 0..stale {
        let op = Op::Backlog(Backlog {
            ready: Arc::clone(&ready),
        });
        let waiting = !purgatory
            .try_complete_else_watch(op, [COMMON, i])
            .expect("accepted");
        assert!(waiting);
    }
    // Events complete the whole backlog: `stale` entries are left (on their own keys, or
    // on the common one), and the purge is due. The reaper wakes within its 200 ms wait
    // and purges at least half of them while the probes, due from 50 ms on, 1 ms apart,
    // come due.
    ready.store(true, Ordering::Release);
    let completed = match layout {
        Layout::Distinct => purgatory.check_and_complete(&COMMON) as u64,
        Layout::Hot => (0..stale)
            .map(|i| purgatory.check_and_complete(&i) as u64)
            .sum(),
    };
    assert_eq!(completed, stale);
    let late = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    for n in 0..probes {
        let timeout = Duration::from_millis(50 + n);
        // Its own deadline: a watch that waited for a purge step does not count as expiry
        // lateness (that wait is at most one step).
        let op = Op::Probe(Probe {
            deadline: Instant::now() + timeout,
            timeout,
            late: Arc::clone(&late),
        });
        assert!(!purgatory
            .try_complete_else_watch(op, [n])
            .expect("accepted"));
    }
    let purged_before = purgatory.stats().purged;
    let machine = StallProbe::start();
    let end = start + Duration::from_millis(50 + probes + 2_000);
    while late.lock().unwrap().len() < probes as usize && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stalls = machine.finish();
    let purged = purgatory.stats().purged - purged_before;
    let late = late.lock().unwrap().clone();
    (late, purged, stalls)
}

fn main() {
    let Args {
        stale,
        probes,
        layout,
    } = Args::parse();
    println!("run        stale     p50 ms   p99 ms   max ms   purged  stalls>5ms  longest ms");
    for (name, backlog, purge) in [
        ("baseline", 0, true),
        ("no purge", stale, false),
        ("purge", stale, true),
    ] {
        let (mut late, purged, stalls) = run(backlog, probes, purge, layout);
        late.sort_by(f64::total_cmp);
        let at = |p| percentile_sorted(&late, p).unwrap_or(f64::NAN);
        println!(
            "{name:<9} {backlog:>7} {:>9.3} {:>8.3} {:>8.3} {purged:>8} {:>11} {:>11.1}",
            at(50.0),
            at(99.0),
            at(100.0),
            stalls.stall_count,
            stalls.stall_max_ms,
        );
    }
}
