//! A fixed-length array made of zeroed memory from the system, for a type whose all-zero
//! bytes are a valid value: the purgatory's op table segments (`kafka-purgatory`,
//! `op_table.rs`), whose slots are written one at a time as they are first used. Not part
//! of this crate's API; it lives here beside [`SystemVec`](super::system_vec), whose
//! blocks it shares.
//!
//! # Why not a zeroed `Box<[T]>`
//! A zeroed block from the global allocator is free of writes only while the allocator
//! hands out fresh memory. Once it reuses memory it writes the zeros itself, all at once:
//! glibc, after a mapped block of up to 32 MiB was freed (as the op table's give-back
//! does), serves blocks below that size from its heap and clears them; mimalloc and
//! jemalloc clear a reused block as well. A segment of a million slots made again after
//! a give-back then held the watch that made it 2.7 ms while 32 MiB were cleared
//! (`benches/examples/watch_tail.rs`). A block of at least 256 KiB here is pages mapped
//! for it alone (Linux), which the kernel zeroes page by page as each is first written;
//! a smaller one, and every block off Linux and under Miri, comes from the system
//! allocator's `alloc_zeroed`.
//!
//! # Invariants
//! - `ptr` points to a block of `len` elements made by
//!   [`allocate_zeroed`](super::system_vec::allocate_zeroed) with `T`'s array layout of
//!   `len` (dangling when that layout is empty); every element is a valid `T`: all zero
//!   when made, and changed since only through `&mut` or `T`'s own interior mutability.
//! - The elements are dropped, and the block freed, exactly once: by [`Drop`] (the block
//!   also when an element's drop panics).

use std::alloc::Layout;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::system_vec::{allocate_zeroed, free};

/// `len` values of `T`, each all zero bytes when made, in memory of their own (mapped
/// pages when large). Derefs to a slice.
#[doc(hidden)]
pub struct ZeroedSlice<T> {
    ptr: NonNull<T>,
    len: usize,
    _owns: PhantomData<T>,
}

// SAFETY: it owns its elements as a `Box<[T]>` does: sending or sharing it is sending or
// sharing them.
unsafe impl<T: Send> Send for ZeroedSlice<T> {}
// SAFETY: as above; `&ZeroedSlice<T>` gives only `&T`.
unsafe impl<T: Sync> Sync for ZeroedSlice<T> {}

impl<T> ZeroedSlice<T> {
    /// `len` elements, every byte of them zero; no byte is written here.
    ///
    /// # Safety
    /// All-zero bytes are a valid `T`.
    pub unsafe fn new(len: usize) -> Self {
        let layout = Layout::array::<T>(len).expect("length overflow");
        let ptr = if layout.size() == 0 {
            NonNull::dangling()
        } else {
            allocate_zeroed(layout).cast()
        };
        ZeroedSlice {
            ptr,
            len,
            _owns: PhantomData,
        }
    }
}

impl<T> Deref for ZeroedSlice<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `len` valid elements at `ptr` (the invariant), borrowed with `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for ZeroedSlice<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for ZeroedSlice<T> {
    fn drop(&mut self) {
        /// Frees the block when dropped, so that it is freed even when an element's drop
        /// panics (the slice's drop goes on to the others as it unwinds).
        struct FreeOnDrop(NonNull<u8>, Layout);
        impl Drop for FreeOnDrop {
            fn drop(&mut self) {
                if self.1.size() != 0 {
                    // SAFETY: the block `ZeroedSlice::new` made with this layout, freed
                    // here once; its elements were dropped (or are being, as this
                    // unwinds past them: none is read again).
                    unsafe { free(self.0, self.1) };
                }
            }
        }
        let layout = Layout::array::<T>(self.len).expect("the block's own layout");
        let _free = FreeOnDrop(self.ptr.cast(), layout);
        // SAFETY: `len` valid elements, dropped once, here (a type without drop glue
        // reads none of them: the pages of a large block never written stay unmapped).
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ))
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Every element reads zero, writes stick, and both paths (mapped pages from one page
    /// on in tests, the allocator below) make and free their blocks.
    #[test]
    fn elements_start_zero_on_both_paths() {
        for len in [0, 1, 7, 100, 511, 512, 4096, 100_000] {
            // SAFETY: a zero `AtomicU64` is valid.
            let mut slice = unsafe { ZeroedSlice::<AtomicU64>::new(len) };
            assert_eq!(slice.len(), len);
            assert!(
                slice.iter().all(|a| a.load(Ordering::Relaxed) == 0),
                "{len}"
            );
            for (i, a) in slice.iter().enumerate() {
                a.store(i as u64 + 1, Ordering::Relaxed);
            }
            for (i, a) in slice.iter_mut().enumerate() {
                assert_eq!(*a.get_mut(), i as u64 + 1);
            }
        }
    }

    /// Elements with drop glue are each dropped once, and the block is freed even when
    /// one of their drops panics (Miri reports a leak otherwise).
    #[test]
    fn drops_each_element_once_and_frees_after_a_panicking_drop() {
        use std::sync::atomic::AtomicUsize;
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        #[derive(Default)]
        struct Counted(u8);
        impl Drop for Counted {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::Relaxed);
                if self.0 == 1 {
                    panic!("element drop");
                }
            }
        }
        // SAFETY: a zero `Counted` (a `u8`) is valid.
        let mut slice = unsafe { ZeroedSlice::<Counted>::new(600) };
        slice[3].0 = 1;
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(slice)));
        assert!(dropped.is_err());
        assert_eq!(DROPS.load(Ordering::Relaxed), 600);
        // Zero-sized elements: no block.
        // SAFETY: `()` has no bytes.
        let units = unsafe { ZeroedSlice::<()>::new(1 << 40) };
        assert_eq!(units.len(), 1 << 40);
    }
}
