//! The library's own housekeeping keeps timeouts on time: while a forced burst of
//! 2,000,000 operations is purged from the watcher lists and its memory given back, a
//! canary (an operation with a 3 ms timeout, watched again as soon as it expires) fires
//! at most [`BOUND`] later than it did before the burst was forced, in the same run.
//!
//! Before the give-back went in bounded steps (`purgatory/src/housekeeping.rs`), the
//! reaper spent up to 47 ms at a time in it between two rounds (the free lists scanned
//! under their locks, every slot of a 1,048,576-slot segment read twice, the segment
//! dropped and unmapped, the timer's slab shrunk whole), and the canary moved by 10-35
//! ms: at 176ef16 this test failed 9 runs of 9, each of its 18 measurements over the
//! bound. Now it moves by -8.1 to 2.7 ms (9 runs, none measured twice).
//!
//! # What is measured
//! The canary is due 3 ms after its watch returns (the timer counts from a moment inside
//! the watch, so this is the latest it can be due: a watch that waited for a lock is not
//! taken for the timeout's lateness). Its worst lateness is taken over two seconds before
//! the force and from the end of the force until the purge is over and a second more
//! (the give-back goes first between rounds, so it is over by then but for its waits).
//! The force itself, a user's call on another thread that contends with the reaper for
//! the CPUs and the free lists, is not bounded; its figure is reported. The burst's
//! handles are dropped only at the end: freeing their 48 MB unmaps it, and a change to
//! the process's mappings on the reaper (the timer's slab shrinking) would wait for that
//! (see `discard.rs`).
//!
//! # Telling the machine's stalls apart
//! On a shared machine the reaper is at times runnable and not running, or the whole
//! virtual machine is not: another tenant holds the CPUs. That is not the purgatory's
//! lateness, it comes and goes at random, and a raw comparison of two windows' worst
//! cases fails or passes by luck. So each canary's lateness is taken less the larger of:
//! - the reaper's waits for a CPU (`run_delay`, the second field of its
//!   `/proc/.../schedstat`): read on the reaper as the canary fires, less the last
//!   reading before it was due of a thread that reads it every millisecond. A wait that
//!   began before the canary was due is taken whole, so the figure can leave out up to
//!   one such wait of the reaper's own work after the due time;
//! - the oversleeps of that watching thread (sleeps of 1 ms that took half a millisecond
//!   or more longer: nothing of this process ran), each taken as a stall just before it
//!   ended, only its part after the due time.
//!
//! Time the reaper spent running the purgatory's code, or blocked (on a lock, or on the
//! kernel's map lock behind an unmapping), all counts. A canary fired by another thread (a
//! stand-in, if the reaper is stuck in a hook) counts its whole lateness. If the bound is
//! exceeded, the whole measurement (a new purgatory, a new burst) is repeated once, and
//! the test fails only if the second one exceeds it too.
//!
//! Release builds only (`cargo test --release -p kafka-purgatory --test
//! housekeeping_lateness`, about 5 s, 10 s when it measures twice): in a debug build
//! the test says it is skipped. Linux only (`schedstat`).

#![cfg(target_os = "linux")]

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Purgatory, WatchOutcome};

/// Operations watched, then forced.
const BURST: u64 = 2_000_000;

/// The canary's timeout.
const CANARY_TIMEOUT: Duration = Duration::from_millis(3);

/// How much later the canary may fire while the burst goes than before it.
const BOUND: Duration = Duration::from_millis(6);

/// The purgatory's name: its reaper thread is `hk-reaper`.
const NAME: &str = "hk";

/// The canary's key (the burst's keys are `0..BURST`).
const CANARY_KEY: u64 = u64::MAX;

/// What the canary's `on_complete` reports.
struct Fired {
    at: Instant,
    /// The firing thread's `run_delay` (ns) then, if that thread is the reaper.
    reaper_run_delay: Option<u64>,
}

/// One expiry of the canary.
struct Sample {
    /// When it was due: its timeout counted from the return of its watch (the timer
    /// counts it from a moment inside the watch, so this is the latest it could be due).
    due: Instant,
    fired: Instant,
    /// The firing thread's `run_delay` (ns) as it fired, if that thread is the reaper.
    reaper_run_delay: Option<u64>,
}

enum Op {
    Burst,
    Canary { report: Sender<Fired> },
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        match self {
            Op::Burst => Duration::from_secs(600),
            Op::Canary { .. } => CANARY_TIMEOUT,
        }
    }

    fn try_complete(&mut self) -> bool {
        false
    }

    fn on_complete(&mut self, how: Completion) {
        let at = Instant::now();
        if let (Op::Canary { report }, Completion::Expired) = (self, how) {
            let on_reaper = std::thread::current().name() == Some(&format!("{NAME}-reaper"));
            let reaper_run_delay = on_reaper.then(|| {
                let own = std::fs::File::open("/proc/thread-self/schedstat").expect("schedstat");
                run_delay(&own)
            });
            let _ = report.send(Fired {
                at,
                reaper_run_delay,
            });
        }
    }
}

/// What the watching thread read each time it woke.
struct Reading {
    at: Instant,
    /// The reaper's `run_delay` then (ns).
    run_delay: u64,
    /// How much longer than asked the watching thread slept before this reading.
    overslept: Duration,
}

/// The watching thread's readings, one a millisecond.
type Readings = Arc<Mutex<Vec<Reading>>>;

/// How long the watching thread sleeps between readings.
const PERIOD: Duration = Duration::from_millis(1);

/// The `schedstat` file of this process's thread named `name` (a thread names itself
/// once it runs: looked for up to a few seconds).
fn schedstat_of(name: &str) -> std::fs::File {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        for task in std::fs::read_dir("/proc/self/task").expect("Linux /proc") {
            let path = task.expect("a task").path();
            let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            if comm.trim_end() == name {
                return std::fs::File::open(path.join("schedstat")).expect("schedstat");
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no thread named {name}");
}

/// A thread's time spent runnable, waiting for a CPU (ns): the second field of its
/// `schedstat` file.
fn run_delay(file: &std::fs::File) -> u64 {
    let mut buffer = [0u8; 128];
    let n = file.read_at(&mut buffer, 0).expect("schedstat read");
    let text = std::str::from_utf8(&buffer[..n]).expect("text");
    text.split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("run_delay")
}

/// How late `sample` fired, less the machine's share of it (see the module doc), in ms.
fn lateness_ms(sample: &Sample, readings: &[Reading]) -> f64 {
    let late = sample.fired.saturating_duration_since(sample.due);
    // The reaper's waits for a CPU that ended between the last reading before the canary
    // was due and its firing (read on the reaper as it fired).
    let mut queued = Duration::ZERO;
    if let (Some(at_fired), Some(before)) = (
        sample.reaper_run_delay,
        readings.iter().rev().find(|r| r.at <= sample.due),
    ) {
        queued = Duration::from_nanos(at_fired.saturating_sub(before.run_delay));
    }
    // Nothing of this process ran: the watching thread overslept. Each oversleep is taken
    // as a stall just before the reading, and only its part inside the span counts.
    let stalled: Duration = readings
        .iter()
        .filter(|r| !r.overslept.is_zero() && r.at > sample.due)
        .map(|r| {
            let from = (r.at - r.overslept).max(sample.due);
            r.at.min(sample.fired).saturating_duration_since(from)
        })
        .sum();
    late.saturating_sub(queued.max(stalled)).as_secs_f64() * 1e3
}

/// What one measurement found.
struct Measured {
    /// The canary's worst lateness (ms) before the force, and while the burst goes.
    before: f64,
    during: f64,
    /// The same without the machine's share taken off.
    raw_before: f64,
    raw_during: f64,
    /// The worst while the burst was forced (not bounded: see the module doc).
    while_forcing: f64,
    samples: (usize, usize),
    /// How long the burst took to force, and to be purged after.
    forced: Duration,
    purged: Duration,
}

impl Measured {
    fn within_bound(&self) -> bool {
        self.during <= self.before + BOUND.as_secs_f64() * 1e3
    }
}

impl std::fmt::Display for Measured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "canary's worst lateness {:.2} ms before ({} expiries), {:.2} ms while the forced \
             burst was purged and given back ({} expiries): moved by {:.2} ms (bound {} ms); \
             with the machine's stalls counted: {:.2} ms and {:.2} ms; {:.2} ms while the \
             burst was forced (in {:.0} ms), purged {:.0} ms after",
            self.before,
            self.samples.0,
            self.during,
            self.samples.1,
            self.during - self.before,
            BOUND.as_millis(),
            self.raw_before,
            self.raw_during,
            self.while_forcing,
            self.forced.as_secs_f64() * 1e3,
            self.purged.as_secs_f64() * 1e3,
        )
    }
}

/// One measurement: a purgatory, its canary, the burst watched, a window before, the
/// force, and the window until its purge and give-back are over.
fn measure() -> Measured {
    let purgatory: Purgatory<u64, Op> = Purgatory::new(NAME);
    let stop = Arc::new(AtomicBool::new(false));
    let readings: Readings = Arc::default();
    let watching = {
        let (stop, readings) = (Arc::clone(&stop), Arc::clone(&readings));
        let reaper = schedstat_of(&format!("{NAME}-reaper"));
        std::thread::spawn(move || {
            let mut overslept = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let at = Instant::now();
                let reading = Reading {
                    at,
                    run_delay: run_delay(&reaper),
                    overslept,
                };
                readings.lock().unwrap().push(reading);
                std::thread::sleep(PERIOD);
                // Half a millisecond late is a wake-up's usual slack, not a stall.
                let over = at.elapsed().saturating_sub(PERIOD);
                overslept = if over > PERIOD / 2 {
                    over
                } else {
                    Duration::ZERO
                };
            }
        })
    };
    let (report, reports) = channel();
    let canary = {
        let (purgatory, stop) = (purgatory.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let op = Op::Canary {
                    report: report.clone(),
                };
                assert!(matches!(
                    purgatory.watch(op, [CANARY_KEY]),
                    Ok(WatchOutcome::Pending(_))
                ));
                let watched = Instant::now();
                let fired: Fired = reports
                    .recv_timeout(Duration::from_secs(30))
                    .expect("fired");
                samples.push(Sample {
                    due: watched + CANARY_TIMEOUT,
                    fired: fired.at,
                    reaper_run_delay: fired.reaper_run_delay,
                });
            }
            samples
        })
    };
    let handles: Vec<_> = (0..BURST)
        .map(|key| match purgatory.watch(Op::Burst, [key]) {
            Ok(WatchOutcome::Pending(handle)) => handle,
            _ => panic!("the burst waits"),
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let force = Instant::now();
    assert_eq!(purgatory.force_complete_batch(&handles), BURST as usize);
    let forced_at = Instant::now();
    let forced = forced_at - force;
    // The purge is over once fewer entries are listed than the purge interval (1,000 by
    // default: it stops below half of that); the give-back goes first between rounds,
    // so it is over by then but for its waits (a grace, the timer's slots a round
    // later): a second more.
    let deadline = Instant::now() + Duration::from_secs(60);
    while purgatory.watched() >= 1_000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let purged = force.elapsed() - forced;
    std::thread::sleep(Duration::from_secs(1));
    let end = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let samples = canary.join().expect("the canary thread");
    // Dropped only now: freeing their 48 MB unmaps it, and the reaper's own changes to the
    // process's mappings (the timer's slabs shrinking) wait for that (see the module doc).
    drop(handles);
    watching.join().expect("the watching thread");
    assert!(purgatory.watched() < 1_000, "the purge did not end in 60 s");
    let readings = readings.lock().unwrap();
    let worst = |from: Instant, to: Instant, adjusted: bool| {
        let window: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.due >= from && s.due < to)
            .collect();
        let worst = window
            .iter()
            .map(|s| {
                if adjusted {
                    lateness_ms(s, &readings)
                } else {
                    s.fired.saturating_duration_since(s.due).as_secs_f64() * 1e3
                }
            })
            .fold(0.0, f64::max);
        (worst, window.len())
    };
    let (before_ms, before_n) = worst(before, force, true);
    let (during_ms, during_n) = worst(forced_at, end, true);
    assert!(
        before_n > 100 && during_n > 100,
        "the canary fired {before_n} and {during_n} times"
    );
    Measured {
        before: before_ms,
        during: during_ms,
        raw_before: worst(before, force, false).0,
        raw_during: worst(forced_at, end, false).0,
        while_forcing: worst(force, forced_at, true).0,
        samples: (before_n, during_n),
        forced,
        purged,
    }
}

#[test]
fn a_forced_burst_purged_and_given_back_moves_a_3_ms_canary_by_at_most_6_ms() {
    if cfg!(debug_assertions) {
        eprintln!(
            "skipped in a debug build: run `cargo test --release -p kafka-purgatory --test \
             housekeeping_lateness`"
        );
        return;
    }
    let first = measure();
    eprintln!("{first}");
    if first.within_bound() {
        return;
    }
    let second = measure();
    eprintln!("measured again: {second}");
    assert!(
        second.within_bound(),
        "the purgatory's own housekeeping held timeouts up, twice in a row: {first}; then \
         {second}"
    );
}
