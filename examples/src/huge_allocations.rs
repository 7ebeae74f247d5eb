//! A global allocator that survives the impossible allocations a malformed request asks for.
//!
//! # Why
//! `kafka-protocol` 0.18 reads an array's element count from the wire and reserves that
//! many elements before decoding any (`Vec::with_capacity(n)`). An 18-byte Metadata request
//! announcing 2^31 topics asks for about 150 GB; the system allocator refuses, and Rust
//! aborts the whole process on a refused allocation. Upstream fixes (bounding the count by
//! the bytes left) are still open, so the broker binary and the tests that host a broker
//! install this allocator instead.
//!
//! # How
//! Requests of [`HUGE`] bytes or more (which nothing in the broker legitimately makes: a
//! frame is at most 100 MiB) are served by an anonymous `mmap` with `MAP_NORESERVE`: the
//! kernel hands out address space without committing memory, so the reservation succeeds,
//! the decoder fails a few elements later on the short buffer, and the mapping is returned
//! untouched. Memory is only used for pages actually written. Every other request goes to
//! the system allocator unchanged. (With `vm.overcommit_memory = 2` the kernel ignores
//! `MAP_NORESERVE` and such a frame still aborts.)
//!
//! # Invariants
//! - Whether an allocation is "huge" depends only on its layout, so `dealloc` and `realloc`
//!   (which receive the layout it was made with) always return it to the allocator it came
//!   from.
//! - Huge allocations are page-aligned; a layout asking for more than a page of alignment
//!   is never treated as huge.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations of this many bytes or more are mapped lazily.
pub const HUGE: usize = 1 << 30;

/// Alignment an anonymous mapping guarantees.
const PAGE: usize = 4096;

/// The allocator; install it with
/// `#[global_allocator] static ALLOCATOR: HugeAllocationsMappedLazily = HugeAllocationsMappedLazily;`.
#[derive(Debug, Default, Clone, Copy)]
pub struct HugeAllocationsMappedLazily;

fn is_huge(layout: Layout) -> bool {
    cfg!(unix) && layout.size() >= HUGE && layout.align() <= PAGE
}

#[cfg(unix)]
fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory; failure is reported as MAP_FAILED and turned into null.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if mapped == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        mapped.cast()
    }
}

#[cfg(not(unix))]
fn map(_size: usize) -> *mut u8 {
    std::ptr::null_mut()
}

/// # Safety
/// `ptr` must come from [`map`] with the same `size`, and not be used afterwards.
#[cfg(unix)]
unsafe fn unmap(ptr: *mut u8, size: usize) {
    // SAFETY: guaranteed by the caller; munmap of a whole mapping cannot fail otherwise.
    unsafe {
        libc::munmap(ptr.cast(), size);
    }
}

#[cfg(not(unix))]
unsafe fn unmap(_ptr: *mut u8, _size: usize) {}

// SAFETY: every block is served either by `System` (for non-huge layouts) or by a fresh
// mapping of at least the requested size, page-aligned (enough for any huge layout), and is
// released by the same party because the choice depends on the layout alone.
unsafe impl GlobalAlloc for HugeAllocationsMappedLazily {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_huge(layout) {
            map(layout.size())
        } else {
            // SAFETY: same contract as ours.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_huge(layout) {
            // Fresh anonymous mappings read as zeros.
            map(layout.size())
        } else {
            // SAFETY: same contract as ours.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_huge(layout) {
            // SAFETY: a huge layout was allocated by `map` with this size.
            unsafe { unmap(ptr, layout.size()) }
        } else {
            // SAFETY: a non-huge layout was allocated by `System`.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees new_size, rounded up to the alignment, fits isize.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !is_huge(layout) && !is_huge(new_layout) {
            // SAFETY: both layouts belong to `System`.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: new_layout has a non-zero size (it is huge, or the old one was).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are valid for the smaller size and do not overlap; the old
            // block is released with the layout it was allocated with.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_reservation_succeeds_without_using_memory() {
        let allocator = HugeAllocationsMappedLazily;
        // 256 GiB: far more than the machine has.
        let layout = Layout::from_size_align(256 << 30, 8).unwrap();
        // SAFETY: non-zero size; the block is written within bounds and released with its
        // own layout.
        unsafe {
            let block = allocator.alloc(layout);
            assert!(!block.is_null());
            block.write(7);
            block.add(layout.size() - 1).write(9);
            assert_eq!(block.read(), 7);
            allocator.dealloc(block, layout);
        }
    }

    #[test]
    fn growing_across_the_threshold_keeps_the_contents() {
        let allocator = HugeAllocationsMappedLazily;
        let small = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: each block is used within its size and released with its current layout.
        unsafe {
            let block = allocator.alloc(small);
            assert!(!block.is_null());
            for i in 0..64 {
                block.add(i).write(i as u8);
            }
            let grown = allocator.realloc(block, small, HUGE);
            assert!(!grown.is_null());
            assert!((0..64).all(|i| grown.add(i).read() == i as u8));
            let huge = Layout::from_size_align(HUGE, 8).unwrap();
            let shrunk = allocator.realloc(grown, huge, 32);
            assert!((0..32).all(|i| shrunk.add(i).read() == i as u8));
            allocator.dealloc(shrunk, Layout::from_size_align(32, 8).unwrap());
        }
    }

    #[test]
    fn ordinary_layouts_are_not_huge() {
        assert!(!is_huge(Layout::from_size_align(HUGE - 1, 8).unwrap()));
        assert!(!is_huge(Layout::from_size_align(HUGE, 2 * PAGE).unwrap()));
    }
}
