//! One measurement per process: the parent re-executes its own binary with a hidden
//! `--child <job>` argument ([`run_in_child`]); the child runs exactly one job and
//! prints its result as one JSON line on stdout ([`serve`]). The job is any serialisable
//! value; the load tool's is a [`crate::workloads::Measurement`].
//!
//! # Invariants
//! - A child runs one implementation once, so its CPU time (`getrusage`) and peak
//!   resident memory (`VmHWM`) belong to that run alone.
//! - The child's stderr is the parent's (progress lines and errors show through); its
//!   stdout carries only the result line.
//! - A failed child (error, crash, unparsable output) is reported by the parent with its
//!   exit status, never silently dropped.

use std::process::{Command, Stdio};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// The child's side: reads `job` (the `--child` argument's JSON), runs it with `run` and
/// prints the result as one line on stdout.
pub fn serve<J: DeserializeOwned>(
    job: &str,
    run: impl FnOnce(&J) -> Result<Value, String>,
) -> Result<(), String> {
    let job: J = serde_json::from_str(job).map_err(|e| format!("bad child job: {e}"))?;
    let result = run(&job)?;
    println!("{result}");
    Ok(())
}

/// Runs `job` in a fresh child process of this binary, with global allocator
/// `allocator` (`system` or `mimalloc`), and returns its result.
pub fn run_in_child<J: Serialize>(job: &J, allocator: &str) -> Result<Value, String> {
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
