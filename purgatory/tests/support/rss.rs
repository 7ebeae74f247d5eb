//! The process's resident memory, for the memory tests (Linux: `/proc/self/status`).

/// `VmRSS` of this process, in kB.
pub fn resident_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}
