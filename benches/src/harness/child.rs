//! One measurement per process: the parent re-executes its own binary with a hidden
//! `--child <job>` argument; the child runs exactly one job and prints its result as
//! one JSON line on stdout.
//!
//! # Invariants
//! - A child runs one implementation once, so its CPU time (`getrusage`) and peak
//!   resident memory (`VmHWM`) belong to that run alone.
//! - The child's stderr is the parent's (progress lines and errors show through); its
//!   stdout carries only the result line.
//! - A failed child (error, crash, unparsable output) is reported by the parent with its
//!   exit status, never silently dropped.

use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::workloads::w1::{run_multi, run_single, W1Params};
use crate::workloads::w2::W2Params;
use crate::workloads::w3::W3Params;

/// A single measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ChildJob {
    /// W1 (or W1-mt when `params.threads > 1`) with one implementation.
    W1 {
        /// Implementation name.
        implementation: String,
        /// Parameters.
        params: W1Params,
    },
    /// W2 with one implementation.
    W2 {
        /// Implementation name.
        implementation: String,
        /// Parameters.
        params: W2Params,
    },
    /// W3 with one implementation.
    W3 {
        /// Implementation name.
        implementation: String,
        /// Parameters.
        params: W3Params,
    },
}

/// The W1 implementations run by default.
pub const W1_IMPLEMENTATIONS: [&str; 4] = ["ours", "binaryheap", "btreemap", "delayqueue"];

/// Every W1 implementation: the defaults plus three diagnostics, single-threaded only:
/// `wheel`, our bare wheel without the timer around it; `locked-wheel`, the same behind
/// one `parking_lot` mutex locked per call; `ours-batch`, our timer through
/// `add_batch`/`cancel_batch` 64 at a time.
pub const W1_ALL_IMPLEMENTATIONS: [&str; 7] = [
    "ours",
    "binaryheap",
    "btreemap",
    "delayqueue",
    "wheel",
    "locked-wheel",
    "ours-batch",
];

fn to_json<T: Serialize>(value: &T) -> Result<serde_json::Value, String> {
    serde_json::to_value(value).map_err(|e| e.to_string())
}

fn run_w1(name: &str, p: &W1Params) -> Result<serde_json::Value, String> {
    use crate::ours::OurChurnTimer;
    use crate::peers::{paused_runtime, BTreeTimer, DelayQueueTimer, LazyHeapTimer};
    use parking_lot::Mutex;
    let multi = p.threads > 1;
    let result = match name {
        "ours" => {
            let timer = OurChurnTimer::new().map_err(|e| e.to_string())?;
            if multi {
                run_multi(name, &timer, p, None)
            } else {
                run_single(name, timer, p)
            }
        }
        "wheel" if multi => {
            return Err("`wheel` is single-threaded; use it without --threads".into())
        }
        "wheel" => run_single(name, crate::ours::OurBareWheel::default(), p),
        "locked-wheel" if multi => {
            return Err("`locked-wheel` is single-threaded; use it without --threads".into())
        }
        "locked-wheel" => run_single(name, crate::ours::OurLockedWheel::default(), p),
        "ours-batch" if multi => {
            return Err("`ours-batch` is single-threaded; use it without --threads".into())
        }
        "ours-batch" => {
            let timer = OurChurnTimer::new().map_err(|e| e.to_string())?;
            crate::workloads::w1::run_single_batched(name, timer, p)
        }
        "binaryheap" if multi => run_multi(name, &Mutex::new(LazyHeapTimer::new()), p, None),
        "binaryheap" => run_single(name, LazyHeapTimer::new(), p),
        "btreemap" if multi => run_multi(name, &Mutex::new(BTreeTimer::new()), p, None),
        "btreemap" => run_single(name, BTreeTimer::new(), p),
        "delayqueue" => {
            let runtime = paused_runtime().map_err(|e| e.to_string())?;
            let _context = runtime.enter();
            if multi {
                let timer = Mutex::new(DelayQueueTimer::with_capacity(0));
                run_multi(name, &timer, p, Some(runtime.handle()))
            } else {
                run_single(name, DelayQueueTimer::with_capacity(0), p)
            }
        }
        other => return Err(format!("unknown W1 implementation `{other}`")),
    };
    to_json(&result)
}

/// Runs `job` in this process and returns its result.
pub fn run_here(job: &ChildJob) -> Result<serde_json::Value, String> {
    match job {
        ChildJob::W1 {
            implementation,
            params,
        } => run_w1(implementation, params),
        ChildJob::W2 {
            implementation,
            params,
        } => {
            to_json(&crate::workloads::w2::run(implementation, params).map_err(|e| e.to_string())?)
        }
        ChildJob::W3 {
            implementation,
            params,
        } => {
            to_json(&crate::workloads::w3::run(implementation, params).map_err(|e| e.to_string())?)
        }
    }
}

/// Runs `job` in a fresh child process of this binary, with global allocator
/// `allocator` (`system` or `mimalloc`), and returns its result.
pub fn run_in_child(job: &ChildJob, allocator: &str) -> Result<serde_json::Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let job_json = serde_json::to_string(job).map_err(|e| e.to_string())?;
    let output = Command::new(exe)
        .arg("--child")
        .arg(job_json)
        .env(crate::harness::allocator::ALLOCATOR_ENV, allocator)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start a measurement process: {e}"))?;
    if !output.status.success() {
        return Err(format!("measurement process failed ({})", output.status));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or("measurement process printed no result")?;
    serde_json::from_str(line)
        .map_err(|e| format!("unreadable result from measurement process: {e}"))
}
