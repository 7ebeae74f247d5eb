//! The CPU each of a purgatory's threads spends under a steady load of expiries: `R`
//! operations a second (default 10,000), each on 3 of 100 keys with a `T` ms timeout
//! (default 20), none ever ready, for `S` seconds (default 10); then every thread's CPU
//! time, read from `/proc/self/task/*/schedstat` (Linux: the time it ran, in
//! nanoseconds), in ms and in us per second of the run, and how often it slept
//! (`voluntary_ctxt_switches` in its `status`).
//!
//! ```text
//! cargo build --release -p purgatory-benches --example steady_expiry
//! target/release/examples/steady_expiry [R] [T] [S]
//! ```
//!
//! A thread's own CPU time is exact where a process's total moves 10 % between runs on a
//! shared machine: this is how the reaper's and the watchdog's costs are told apart
//! (`docs/benchmarks.md`, round 17). Watches go in bursts every 2 ms, as the load
//! tool's generator paces them.
//!
//! With `WHICH=naive` the same load goes to the naive peer (`NaivePurgatory`: one mutex
//! over a key map and a heap, its own reaper), so that ours and naive's CPU at a
//! broker's rate are compared without the load tool's own threads, whose CPU moves more
//! between runs than the difference (`docs/benchmarks.md`, rounds 25 and 28).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Purgatory};
use purgatory_benches::peers::NaivePurgatory;

static EXPIRED: AtomicU64 = AtomicU64::new(0);

struct Request(Duration);

impl DelayedOperation for Request {
    fn timeout(&self) -> Duration {
        self.0
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {}
    fn on_expiration(&mut self) {
        EXPIRED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Each thread's name and CPU time, from `/proc/self/task`: the time it ran, in
/// nanoseconds (`schedstat`), or else its user and system time in clock ticks (`stat`,
/// 10 ms each, too coarse for a thread that wakes briefly).
fn thread_cpu() -> Vec<(String, Duration, u64)> {
    // SAFETY: `sysconf` reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut threads = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return threads;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // The name is in parentheses and may hold spaces: the fields follow the last `)`.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let ran = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        let cpu = match ran {
            Some(nanos) => Duration::from_nanos(nanos),
            None => {
                let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
                // utime and stime: fields 14 and 15 of the line, 12 and 13 after the name.
                let field = |i: usize| {
                    fields
                        .get(i)
                        .and_then(|f| f.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                Duration::from_millis((field(11) + field(12)) * 1000 / ticks)
            }
        };
        // Its sleeps: a thread that blocks (a timed wait, a sleep) switches out once.
        let sleeps = std::fs::read_to_string(task.path().join("status"))
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0);
        threads.push((name, cpu, sleeps));
    }
    threads
}

fn main() {
    let arg = |i: usize, default: u64| -> u64 {
        std::env::args()
            .nth(i)
            .map_or(default, |a| a.parse().expect("a number"))
    };
    let (rate, timeout_ms, secs) = (arg(1, 10_000), arg(2, 20), arg(3, 10));
    let timeout = Duration::from_millis(timeout_ms);
    let naive = std::env::var("WHICH").is_ok_and(|which| which == "naive");
    let ours: Option<Purgatory<u64, Request>> = (!naive).then(|| Purgatory::new("steady"));
    let peer: Option<NaivePurgatory<u64, Request>> =
        naive.then(|| NaivePurgatory::start(1_000).expect("the naive reaper starts"));
    let keys = |i: u64| [i % 100, (i * 7 + 3) % 100, (i * 13 + 5) % 100];
    let start = Instant::now();
    let run = Duration::from_secs(secs);
    let mut sent = 0u64;
    while start.elapsed() < run {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            if let Some(p) = &ours {
                p.try_complete_else_watch(Request(timeout), keys(sent))
                    .expect("watched");
            } else if let Some(p) = &peer {
                assert!(p.watch(Request(timeout), keys(sent)).is_some(), "watched");
            }
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let until = Instant::now() + Duration::from_secs(5);
    while EXPIRED.load(Ordering::Relaxed) < sent && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let threads = thread_cpu();
    println!(
        "{}: {sent} operations at {rate}/s, {timeout_ms} ms timeouts, {:.1} s, {} expired",
        if naive { "naive" } else { "ours" },
        elapsed,
        EXPIRED.load(Ordering::Relaxed)
    );
    for (name, cpu, sleeps) in &threads {
        println!(
            "{name:<16} {:>6} ms CPU, {:>6.0} us a second, {:>6.0} sleeps a second",
            cpu.as_millis(),
            cpu.as_secs_f64() * 1e6 / elapsed,
            *sleeps as f64 / elapsed
        );
    }
    let total: Duration = threads.iter().map(|(_, cpu, _)| *cpu).sum();
    println!(
        "{:<16} {:>6} ms CPU, {:>6.0} us a second",
        "all threads",
        total.as_millis(),
        total.as_secs_f64() * 1e6 / elapsed
    );
    if let Some(p) = ours {
        p.shutdown();
    }
    if let Some(p) = peer {
        p.shutdown();
    }
}
