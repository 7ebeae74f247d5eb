//! A probe that notices when the machine stops running this process: a thread sleeps
//! [`PERIOD`] at a time and records every oversleep longer than [`THRESHOLD`].
//!
//! On a shared 2-core machine another tenant (or the hypervisor) can hold the CPUs for
//! tens or hundreds of milliseconds; every timer then fires late, whatever its design.
//! The probe's figures say whether a run's lateness tail is the implementation's or the
//! machine's.
//!
//! # Invariants
//! - The probe wakes 100 times a second; its own CPU time is measured (thread CPU clock)
//!   and reported, and [`NetCpu`] subtracts it from the process's CPU time.
//! - [`StallProbe::finish`] stops the thread within one period and joins it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::harness::process::cpu_time;

/// How long the probe sleeps each time.
pub const PERIOD: Duration = Duration::from_millis(10);
/// Oversleep that counts as a stall.
pub const THRESHOLD: Duration = Duration::from_millis(5);

/// What the probe saw.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Stalls {
    /// Oversleeps longer than [`THRESHOLD`].
    pub stall_count: u64,
    /// Longest oversleep, ms.
    pub stall_max_ms: f64,
    /// Sum of the oversleeps counted, ms.
    pub stall_total_ms: f64,
    /// CPU time the probe thread itself used, ms.
    pub probe_cpu_ms: f64,
}

/// A running probe.
pub struct StallProbe {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Stalls>>,
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0;
    if ok {
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    } else {
        Duration::ZERO
    }
}

impl StallProbe {
    /// Starts the probe thread (if the thread cannot start, `finish` reports nothing).
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("stall-probe".into())
            .spawn(move || {
                let mut stalls = Stalls::default();
                while !flag.load(Ordering::Acquire) {
                    let before = Instant::now();
                    std::thread::sleep(PERIOD);
                    let over = before.elapsed().saturating_sub(PERIOD);
                    if over > THRESHOLD {
                        let ms = over.as_secs_f64() * 1e3;
                        stalls.stall_count += 1;
                        stalls.stall_total_ms += ms;
                        stalls.stall_max_ms = stalls.stall_max_ms.max(ms);
                    }
                }
                stalls.probe_cpu_ms = thread_cpu().as_secs_f64() * 1e3;
                stalls
            })
            .ok();
        StallProbe { stop, thread }
    }

    /// Stops the probe and returns what it saw.
    pub fn finish(mut self) -> Stalls {
        self.stop.store(true, Ordering::Release);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// The process's CPU time over a span, less what a stall probe running through the span
/// used itself.
pub struct NetCpu {
    start: Duration,
    probe: StallProbe,
}

impl NetCpu {
    /// Reads the process's CPU time, then starts a probe.
    pub fn start() -> Self {
        let start = cpu_time();
        NetCpu {
            start,
            probe: StallProbe::start(),
        }
    }

    /// Stops the probe; returns the process's CPU time since [`NetCpu::start`] less the
    /// probe's own, and what the probe saw.
    pub fn finish(self) -> (Duration, Stalls) {
        let stalls = self.probe.finish();
        let probe_cpu = Duration::from_secs_f64(stalls.probe_cpu_ms / 1e3);
        ((cpu_time() - self.start).saturating_sub(probe_cpu), stalls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_stops_and_reports_its_cpu() {
        let probe = StallProbe::start();
        std::thread::sleep(Duration::from_millis(30));
        let s = probe.finish();
        assert!(s.probe_cpu_ms >= 0.0);
        assert!(s.stall_total_ms >= s.stall_max_ms);
    }
}
