//! The current process's own counters: CPU time (`getrusage`) and resident memory
//! (`/proc/self/status`), and resetting the peak-memory mark (`/proc/self/clear_refs`).
//!
//! # Invariants
//! - Every function reports about the calling process only, so a measurement must run
//!   in a process of its own to be attributed to one implementation (the load tool's
//!   child processes do that).
//! - Missing `/proc` files (non-Linux) read as 0 bytes, never as an error or a panic.

use std::time::Duration;

/// User plus system CPU time the whole process (all threads) has used so far.
pub fn cpu_time() -> Duration {
    // SAFETY: `getrusage` only writes into the zeroed struct we pass; RUSAGE_SELF is valid.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

fn status_field_bytes(field: &str) -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Resident memory now (`VmRSS`), in bytes.
pub fn resident_bytes() -> u64 {
    status_field_bytes("VmRSS")
}

/// Peak resident memory since the process started or since the last
/// [`reset_peak_resident`] (`VmHWM`), in bytes.
pub fn peak_resident_bytes() -> u64 {
    status_field_bytes("VmHWM")
}

/// Resets the peak-resident mark to the current resident size. Returns false when the
/// kernel does not allow it (then the peak includes everything before).
pub fn reset_peak_resident() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_memory_and_cpu_of_this_process() {
        let block = std::hint::black_box(vec![1u8; 8 << 20]);
        assert!(
            resident_bytes() >= 8 << 20,
            "an 8 MiB touched block is resident"
        );
        assert!(peak_resident_bytes() >= resident_bytes() - (1 << 20));
        drop(block);
        let start = cpu_time();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_time() > start, "busy loop used CPU time");
    }
}
