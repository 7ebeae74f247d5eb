//! The load tool's global allocator: mimalloc or the system allocator, chosen once per
//! process by the environment variable [`ALLOCATOR_ENV`] (`system` or `mimalloc`, default
//! mimalloc).
//!
//! Why both: W3's generator allocates per request, and with the system allocator the
//! tool itself becomes the bottleneck before the purgatory does; W1 measures resident
//! memory, and mimalloc reserves and commits memory in large segments, which adds tens
//! of MiB to every implementation's resident figure. The parent picks per workload and
//! passes the choice to its children through the environment.
//!
//! # Invariants
//! - The choice is made at the process's first allocation (before `main`, while the
//!   process has one thread) and never changes, so every block is freed by the allocator
//!   that allocated it.
//! - Reading the variable allocates nothing (`libc::getenv`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

/// Environment variable naming the allocator: `system` or `mimalloc`.
pub const ALLOCATOR_ENV: &str = "PURGATORY_PERF_ALLOCATOR";

const UNDECIDED: u8 = 0;
const SYSTEM: u8 = 1;
const MIMALLOC: u8 = 2;

static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// Dispatches to mimalloc or the system allocator (see the module doc).
#[derive(Debug, Default)]
pub struct SelectableAllocator;

#[inline]
fn choice() -> u8 {
    match CHOICE.load(Ordering::Relaxed) {
        UNDECIDED => {
            // SAFETY: the name is a NUL-terminated literal; getenv returns NULL or a
            // NUL-terminated string that stays valid while nobody modifies the
            // environment, and we only read it here, before `main` runs.
            let system = unsafe {
                let value = libc::getenv(c"PURGATORY_PERF_ALLOCATOR".as_ptr());
                !value.is_null() && std::ffi::CStr::from_ptr(value).to_bytes() == b"system"
            };
            let decided = if system { SYSTEM } else { MIMALLOC };
            CHOICE.store(decided, Ordering::Relaxed);
            decided
        }
        decided => decided,
    }
}

/// Which allocator this process uses.
pub fn current() -> &'static str {
    if choice() == SYSTEM {
        "system"
    } else {
        "mimalloc"
    }
}

// SAFETY: every method forwards to one of two valid allocators, and the same one for the
// whole life of the process (see `choice`), so blocks are freed where they were allocated.
unsafe impl GlobalAlloc for SelectableAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if choice() == SYSTEM {
            System.alloc(layout)
        } else {
            mimalloc::MiMalloc.alloc(layout)
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if choice() == SYSTEM {
            System.alloc_zeroed(layout)
        } else {
            mimalloc::MiMalloc.alloc_zeroed(layout)
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if choice() == SYSTEM {
            System.dealloc(ptr, layout)
        } else {
            mimalloc::MiMalloc.dealloc(ptr, layout)
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if choice() == SYSTEM {
            System.realloc(ptr, layout, new_size)
        } else {
            mimalloc::MiMalloc.realloc(ptr, layout, new_size)
        }
    }
}
