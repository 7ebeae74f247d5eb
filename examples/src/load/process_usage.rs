//! Resident memory (now and peak), CPU time and open file descriptors of a process, read
//! from Linux's `/proc/<pid>`.
//!
//! CPU time is `utime + stime` of `/proc/<pid>/stat`, in clock ticks of `USER_HZ`, which
//! Linux fixes at 100 per second for user space on every common architecture.

use std::io;
use std::time::Duration;

/// Clock ticks per second in `/proc/<pid>/stat`.
const USER_HZ: u64 = 100;

/// One reading of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessUsage {
    /// Resident set size, KiB (`VmRSS`).
    pub rss_kib: u64,
    /// Peak resident set size so far, KiB (`VmHWM`).
    pub peak_rss_kib: u64,
    /// CPU time used so far (user + system).
    pub cpu: Duration,
}

/// Reads the usage of process `pid`.
pub fn read(pid: u32) -> io::Result<ProcessUsage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |field: &str| -> io::Result<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no {field} line")))
    };
    let (rss_kib, peak_rss_kib) = (kib("VmRSS:")?, kib("VmHWM:")?);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at field 3 (state);
    // utime and stime are fields 14 and 15.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| io::Error::other("unreadable stat"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| -> io::Result<u64> {
        fields
            .get(index)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| io::Error::other("unreadable stat field"))
    };
    let total_ticks = ticks(11)? + ticks(12)?;
    Ok(ProcessUsage {
        rss_kib,
        peak_rss_kib,
        cpu: Duration::from_millis(total_ticks * 1000 / USER_HZ),
    })
}

/// Open file descriptors of process `pid` (entries of `/proc/<pid>/fd`).
pub fn open_files(pid: u32) -> io::Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let before = read(std::process::id()).unwrap();
        assert!(before.rss_kib > 0 && before.peak_rss_kib >= before.rss_kib);
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert!(open_files(std::process::id()).unwrap() >= 1);
        drop(file);
        // Burn some CPU so the counter moves.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(100) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = read(std::process::id()).unwrap();
        assert!(after.cpu >= before.cpu);
        assert!(read(u32::MAX).is_err());
    }
}
