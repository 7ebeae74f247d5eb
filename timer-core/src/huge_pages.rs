//! Asking the kernel to back a large slab with transparent huge pages.
//!
//! # Why
//! A random-order cancel in a slab of a million entries (32 MB) misses the TLB as well as
//! the cache: with 4 KiB pages the slab spans 8,192 pages, far more than the TLB holds,
//! and on a virtual machine every TLB miss walks two sets of page tables. With 2 MiB
//! pages it spans 16. Growing the slab also faults in one page per 128 entries instead
//! of one per 65,536. Measured on W1 (`docs/benchmarks.md`): about a quarter off both the
//! add and the cancel.
//!
//! # What it does, and the trade-off
//! [`advise`] marks the 2 MiB-aligned interior of a buffer `MADV_HUGEPAGE` (Linux only;
//! elsewhere, and when the kernel refuses, it does nothing). It changes how the kernel
//! backs the pages, never their contents, so it is safe to call on any buffer we own.
//! Buffers below [`MIN_BYTES`] are left alone, so small timers keep small pages.
//! The cost: with the common `defrag=madvise` setting a page fault in such a region may
//! compact memory synchronously to find a huge page, which can stall an add that grows
//! the slab when memory is fragmented. `TimerBuilder::huge_pages(false)` turns it off.
//!
//! # Invariants
//! - Only whole 2 MiB pages inside the buffer are advised: the call never touches memory
//!   outside it.

/// Buffers smaller than this are not advised (a huge page would mostly hold nothing).
pub(crate) const MIN_BYTES: usize = 4 << 20;

#[cfg(all(target_os = "linux", not(miri)))]
const HUGE_PAGE: usize = 2 << 20;

/// Advises the kernel to back the whole 2 MiB pages of the `bytes` bytes at `start` (an
/// allocation the caller owns, such as a `Vec`'s buffer up to its capacity) with huge
/// pages; see the module documentation. A no-op under [`MIN_BYTES`] and off Linux.
pub(crate) fn advise(start: *const u8, bytes: usize) {
    if bytes < MIN_BYTES {
        return;
    }
    // Miri cannot call into the kernel; the advice changes no behaviour it could check.
    #[cfg(not(all(target_os = "linux", not(miri))))]
    let _ = start;
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        let start = start as usize;
        let first = start.next_multiple_of(HUGE_PAGE);
        let end = (start + bytes) / HUGE_PAGE * HUGE_PAGE;
        if end > first {
            // SAFETY: `[first, end)` lies inside the caller's allocation, and
            // MADV_HUGEPAGE only changes which physical pages
            // back the range (contents are preserved); it never unmaps or frees memory.
            // Failure (for example a kernel without THP) leaves the range as it was.
            let _ = unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE)
            };
        }
    }
}

#[cfg(all(test, target_os = "linux", not(miri)))]
mod tests {
    use super::*;

    /// The kernel's THP mode (`always`, `madvise` or `never`), if it has THP.
    fn thp_mode() -> Option<String> {
        let enabled = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        let enabled = enabled.ok()?;
        let start = enabled.find('[')? + 1;
        let end = start + enabled[start..].find(']')?;
        Some(enabled[start..end].to_owned())
    }

    /// The `THPeligible` flag of the mapping that contains `address`, from
    /// `/proc/self/smaps`.
    fn thp_eligible(address: usize) -> Option<bool> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, hi)) = range.split_once('-') {
                    if let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                    {
                        inside = (lo..hi).contains(&address);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(flag) = line.strip_prefix("THPeligible:") {
                    return Some(flag.trim() == "1");
                }
            }
        }
        None
    }

    #[test]
    fn a_large_buffer_becomes_eligible_for_huge_pages() {
        let Some(mode) = thp_mode().filter(|mode| mode != "never") else {
            eprintln!("skipped: transparent huge pages are disabled on this machine");
            return;
        };
        let mut buffer: Vec<u64> = Vec::with_capacity(2 * MIN_BYTES / 8);
        let middle = buffer.as_ptr() as usize + MIN_BYTES;
        let Some(before) = thp_eligible(middle) else {
            eprintln!("skipped: this kernel's smaps has no THPeligible field");
            return;
        };
        if mode == "madvise" {
            assert!(!before, "eligible before being advised");
        }
        advise(buffer.as_ptr().cast(), buffer.capacity() * 8);
        assert_eq!(thp_eligible(middle), Some(true));
        buffer.push(1);
        assert_eq!(buffer[0], 1, "advice leaves the buffer usable");
    }
}
