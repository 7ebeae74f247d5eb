//! A growable array whose memory comes from the system, whatever the program's global
//! allocator: the slab's entries (`slab.rs`). A large array is pages mapped for it alone,
//! and grows by remapping them.
//!
//! # Why not a `Vec`
//! The slab is one flat array, grown by doubling under its shard's lock. Many Rust
//! servers install mimalloc or jemalloc as the global allocator, and both grow a large
//! block by allocating a new one and copying into it: a slab of a million entries copied
//! 40 MiB into freshly faulted pages while it held the shard's lock, and the reaper waited
//! for it (measured under mimalloc in the load tool at 4.5M requests a second: 6 % of the
//! request thread's samples in that copy). glibc's `realloc` remaps a block it mapped,
//! but whether it maps one depends on its history: after a mapped block of up to 32 MiB
//! is freed (as the slab's give-back does), blocks below that size come from its heap and
//! are copied as they grow. So a block of [`MAP_FROM`] bytes or more is mapped here
//! (`mmap`) and grows or shrinks with `mremap`, which moves page tables and copies no
//! byte; a smaller one comes from the system allocator ([`std::alloc::System`]). Off Linux,
//! and under Miri, every block is the system allocator's.
//!
//! # Invariants
//! - `ptr` points to a block of `cap` elements (dangling when `cap` is 0 or `T` is
//!   zero-sized), made by [`allocate`] or [`reallocate`] with `T`'s array layout of `cap`,
//!   of which the first `len` elements are initialized; `len <= cap`.
//! - Whether a block is mapped depends on its layout alone ([`is_mapped`]), so it is
//!   resized and freed the way it was made.
//! - The block is freed, and the `len` elements dropped, exactly once: by [`Drop`] (the
//!   block also when an element's drop panics).

use std::alloc::{handle_alloc_error, GlobalAlloc, Layout, System};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A `Vec<T>` in memory of its own (mapped pages when large, the system allocator's
/// when small), with the few operations the slab uses (the rest through the slice it
/// derefs to).
pub(crate) struct SystemVec<T> {
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
    _owns: PhantomData<T>,
}

// SAFETY: a `SystemVec<T>` owns its elements as a `Vec<T>` does: sending or sharing it is
// sending or sharing them.
unsafe impl<T: Send> Send for SystemVec<T> {}
// SAFETY: as above; `&SystemVec<T>` gives only `&T`.
unsafe impl<T: Sync> Sync for SystemVec<T> {}

impl<T> SystemVec<T> {
    /// An empty array, with no memory.
    pub(crate) const fn new() -> Self {
        SystemVec {
            ptr: NonNull::dangling(),
            len: 0,
            cap: 0,
            _owns: PhantomData,
        }
    }

    /// An empty array with room for `cap` elements.
    pub(crate) fn with_capacity(cap: usize) -> Self {
        let mut v = Self::new();
        v.resize_block(cap);
        v
    }

    /// The number of elements it has room for without growing.
    pub(crate) fn capacity(&self) -> usize {
        if std::mem::size_of::<T>() == 0 {
            usize::MAX
        } else {
            self.cap
        }
    }

    /// Appends `value`, doubling the room first if it is full.
    #[inline]
    pub(crate) fn push(&mut self, value: T) {
        if self.len == self.capacity() {
            self.grow();
        }
        // SAFETY: `len < capacity()`, so the slot at `len` lies in the block (or `T` is
        // zero-sized and any aligned pointer is valid); it holds no element yet.
        unsafe { self.ptr.as_ptr().add(self.len).write(value) };
        self.len += 1;
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let cap = self.cap.checked_mul(2).expect("capacity overflow").max(4);
        self.resize_block(cap);
    }

    /// Drops the elements from `len` on; keeps the room.
    pub(crate) fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let tail = std::ptr::slice_from_raw_parts_mut(
            // SAFETY: `len < self.len <= cap`: inside the block.
            unsafe { self.ptr.as_ptr().add(len) },
            self.len - len,
        );
        // Shortened first, so that a panicking drop drops nothing twice (the slice's drop
        // goes on to the elements after it as it unwinds).
        self.len = len;
        // SAFETY: the elements in `tail` were initialized and are no longer counted.
        unsafe { std::ptr::drop_in_place(tail) };
    }

    /// Shrinks the room to at least `len` elements and at least `min` (a mapped block
    /// that stays mapped shrinks in place).
    pub(crate) fn shrink_to(&mut self, min: usize) {
        let cap = min.max(self.len);
        if cap < self.cap {
            self.resize_block(cap);
        }
    }

    /// Moves the elements into a block of their exact length and returns the array with
    /// the old block, empty: for the caller to free where it likes.
    pub(crate) fn move_to_fit(&mut self) -> SystemVec<T> {
        let mut kept = SystemVec::with_capacity(self.len);
        // SAFETY: `kept` has room for `self.len` elements and the two blocks are
        // distinct. The elements move: `self` stops counting them before anything can
        // panic, so each is owned once.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), kept.ptr.as_ptr(), self.len);
        }
        kept.len = self.len;
        self.len = 0;
        std::mem::replace(self, kept)
    }

    /// Gives the block room for exactly `cap` elements (`cap >= len`), moving it if it
    /// must (see [`reallocate`]).
    fn resize_block(&mut self, cap: usize) {
        debug_assert!(cap >= self.len);
        if std::mem::size_of::<T>() == 0 || cap == self.cap {
            return;
        }
        let new_layout = Layout::array::<T>(cap).expect("capacity overflow");
        let ptr = if cap == 0 {
            // SAFETY: `cap != self.cap`, so the old block exists, made with
            // `self.layout()` (the invariant); it holds no element (`len <= cap`).
            unsafe { free(self.ptr.cast(), self.layout()) };
            NonNull::dangling()
        } else if self.cap == 0 {
            allocate(new_layout).cast()
        } else {
            // SAFETY: the block was made with `self.layout()` and holds `len` elements,
            // which fit in the new one (`len <= cap`); both layouts are `T`'s arrays.
            unsafe {
                reallocate(
                    self.ptr.cast(),
                    self.layout(),
                    new_layout,
                    self.len * std::mem::size_of::<T>(),
                )
            }
            .cast()
        };
        self.ptr = ptr;
        self.cap = cap;
    }

    /// The layout of the current block (`cap > 0`, `T` not zero-sized).
    fn layout(&self) -> Layout {
        // Was valid when the block was made with this `cap`.
        Layout::array::<T>(self.cap).expect("the block's own layout")
    }
}

/// Blocks of at least this many bytes are pages mapped for them alone (Linux, outside
/// Miri, which cannot map pages), smaller ones come from the system allocator. Tests map
/// from one page on, so that every test crosses between the two.
#[cfg(all(target_os = "linux", not(miri)))]
const MAP_FROM: usize = if cfg!(test) { 4096 } else { 256 * 1024 };
#[cfg(not(all(target_os = "linux", not(miri))))]
const MAP_FROM: usize = usize::MAX;

/// Whether a block of `layout` is mapped pages (else the system allocator's). It depends
/// on the layout alone, so every block is freed or resized the way it was made.
fn is_mapped(layout: Layout) -> bool {
    layout.size() >= MAP_FROM && layout.align() <= 4096
}

/// A new block of `layout` (non-zero size, alignment at most a page's); on failure, the
/// allocation error handler runs.
fn allocate(layout: Layout) -> NonNull<u8> {
    let raw = if is_mapped(layout) {
        map(layout.size())
    } else {
        // SAFETY: `layout` has a non-zero size (the caller's promise).
        unsafe { System.alloc(layout) }
    };
    NonNull::new(raw).unwrap_or_else(|| handle_alloc_error(layout))
}

/// Frees a block.
///
/// # Safety
/// `ptr` was returned for `layout` by [`allocate`] or [`reallocate`], is not freed yet,
/// and holds nothing that still needs dropping.
unsafe fn free(ptr: NonNull<u8>, layout: Layout) {
    if is_mapped(layout) {
        // SAFETY: (the caller's promise) `ptr` is a mapping of `layout.size()` bytes,
        // made for this block alone.
        unsafe { unmap(ptr, layout.size()) };
    } else {
        // SAFETY: (the caller's promise) made by `System` with `layout`.
        unsafe { System.dealloc(ptr.as_ptr(), layout) };
    }
}

/// Moves a block of `old` to one of `new` (non-zero size, the same alignment), keeping
/// its first `keep` bytes, and returns it. A mapped block that stays mapped is remapped
/// by the kernel, which moves page tables and copies no byte, whatever its size; one
/// that crosses `MAP_FROM` is copied (less than `MAP_FROM` bytes). On failure the old
/// block is left as it was and the allocation error handler runs.
///
/// # Safety
/// `ptr` was returned for `old` by [`allocate`] or [`reallocate`] and is not freed;
/// `keep` is at most both sizes.
unsafe fn reallocate(ptr: NonNull<u8>, old: Layout, new: Layout, keep: usize) -> NonNull<u8> {
    debug_assert!(keep <= old.size() && keep <= new.size());
    let moved = match (is_mapped(old), is_mapped(new)) {
        // SAFETY: `ptr` is a mapping of `old.size()` bytes made for this block alone.
        (true, true) => unsafe { remap(ptr, old.size(), new.size()) },
        // SAFETY: made by `System` with `old`; `new.size()` is non-zero and, the size of
        // a valid `Layout` of `old`'s alignment, does not overflow once rounded up.
        (false, false) => unsafe { System.realloc(ptr.as_ptr(), old, new.size()) },
        _ => {
            let to = allocate(new);
            // SAFETY: two distinct live blocks, each of at least `keep` bytes; the old
            // one is freed once, its bytes now in the new one.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr.as_ptr(), to.as_ptr(), keep);
                free(ptr, old);
            }
            return to;
        }
    };
    NonNull::new(moved).unwrap_or_else(|| handle_alloc_error(new))
}

/// `size` bytes of fresh zeroed pages, or null.
#[cfg(all(target_os = "linux", not(miri)))]
fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping at an address the kernel picks: no existing
    // memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        raw.cast()
    }
}

/// The mapping at `ptr` of `old` bytes, resized to `new` and moved if it must be, or
/// null (the mapping then stays as it was).
///
/// # Safety
/// `ptr` is a mapping of `old` bytes that [`map`] or this made, and nothing else uses
/// its address range.
#[cfg(all(target_os = "linux", not(miri)))]
unsafe fn remap(ptr: NonNull<u8>, old: usize, new: usize) -> *mut u8 {
    // SAFETY: (the caller's promise) the whole range is this block's mapping.
    let raw = unsafe { libc::mremap(ptr.as_ptr().cast(), old, new, libc::MREMAP_MAYMOVE) };
    if raw == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        raw.cast()
    }
}

/// Unmaps a block's pages. Only fails if the kernel cannot split a mapping, which a
/// whole mapping never needs: then the pages stay mapped (a leak, not an error).
///
/// # Safety
/// `ptr` is a mapping of `size` bytes that [`map`] or [`remap`] made, not used again.
#[cfg(all(target_os = "linux", not(miri)))]
unsafe fn unmap(ptr: NonNull<u8>, size: usize) {
    // SAFETY: (the caller's promise) the range is this block's mapping alone.
    let done = unsafe { libc::munmap(ptr.as_ptr().cast(), size) };
    debug_assert_eq!(done, 0, "munmap of a whole block");
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn map(_size: usize) -> *mut u8 {
    unreachable!("no block is mapped here")
}

#[cfg(not(all(target_os = "linux", not(miri))))]
unsafe fn remap(_ptr: NonNull<u8>, _old: usize, _new: usize) -> *mut u8 {
    unreachable!("no block is mapped here")
}

#[cfg(not(all(target_os = "linux", not(miri))))]
unsafe fn unmap(_ptr: NonNull<u8>, _size: usize) {
    unreachable!("no block is mapped here")
}

impl<T> Default for SystemVec<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Deref for SystemVec<T> {
    type Target = [T];

    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: the first `len` elements are initialized, in one block (or dangling
        // and well aligned for `len == 0` or a zero-sized `T`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for SystemVec<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for SystemVec<T> {
    fn drop(&mut self) {
        /// Frees the block when dropped: after the elements, and also when one of their
        /// drops panics (as a `Vec` frees its buffer then), rather than leaking it.
        struct FreeBlock<'a, T>(&'a mut SystemVec<T>);
        impl<T> Drop for FreeBlock<'_, T> {
            fn drop(&mut self) {
                let v = &mut *self.0;
                if std::mem::size_of::<T>() != 0 && v.cap != 0 {
                    // SAFETY: the block was made with this layout and is
                    // freed once: `cap` becomes 0, and the elements are no longer
                    // counted (`truncate` shortens before it drops).
                    unsafe { free(v.ptr.cast(), v.layout()) };
                    v.cap = 0;
                }
            }
        }
        let block = FreeBlock(self);
        block.0.truncate(0);
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for SystemVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn pushes_grows_truncates_and_drops_each_element_once() {
        let counted = Rc::new(());
        let mut v = SystemVec::new();
        for _ in 0..1_000 {
            v.push(Rc::clone(&counted));
        }
        assert_eq!(v.len(), 1_000);
        assert!(v.capacity() >= 1_000);
        assert_eq!(Rc::strong_count(&counted), 1_001);
        v.truncate(10);
        assert_eq!(Rc::strong_count(&counted), 11);
        v.shrink_to(0);
        assert_eq!(v.capacity(), 10);
        let old = v.move_to_fit();
        assert_eq!((old.len(), v.len()), (0, 10));
        drop(old);
        assert_eq!(Rc::strong_count(&counted), 11);
        v[3] = Rc::new(());
        assert_eq!(Rc::strong_count(&counted), 10);
        drop(v);
        assert_eq!(Rc::strong_count(&counted), 1);
    }

    #[test]
    fn reads_back_what_it_holds_across_growth_and_shrinking() {
        let mut v = SystemVec::with_capacity(3);
        for i in 0..100_000u64 {
            v.push(i * 7);
        }
        assert!(v.iter().enumerate().all(|(i, x)| *x == i as u64 * 7));
        v.truncate(5_000);
        v.shrink_to(5_000);
        assert_eq!(v.capacity(), 5_000);
        assert!(v.iter().enumerate().all(|(i, x)| *x == i as u64 * 7));
        v.push(1);
        assert_eq!(v[5_000], 1);
        v.truncate(0);
        v.shrink_to(0);
        assert_eq!(v.capacity(), 0);
        v.push(2);
        assert_eq!(&v[..], &[2]);
    }

    /// Blocks cross between the system allocator and mapped pages (from a page on in
    /// tests) both ways, by growth, shrinking and a move, and keep their elements.
    #[test]
    fn elements_survive_every_crossing_between_allocator_and_mapped_pages() {
        let mapped = |v: &SystemVec<u64>| is_mapped(Layout::array::<u64>(v.capacity()).unwrap());
        let check = |v: &SystemVec<u64>| assert!(v.iter().enumerate().all(|(i, x)| *x == i as u64));
        let mut v = SystemVec::new();
        for i in 0..2_000u64 {
            v.push(i);
        }
        check(&v);
        assert_eq!(mapped(&v), cfg!(all(target_os = "linux", not(miri))));
        // Down to the allocator by shrinking, up again by growth, then remapped growth.
        v.truncate(100);
        v.shrink_to(0);
        assert!(!mapped(&v));
        check(&v);
        for i in 100..3_000u64 {
            v.push(i);
        }
        check(&v);
        // A move to a fitting block: mapped to mapped, then allocator to allocator.
        drop(v.move_to_fit());
        check(&v);
        v.truncate(10);
        drop(v.move_to_fit());
        assert!(!mapped(&v));
        check(&v);
        // Straight from nothing to a mapped block, and freed from there.
        let mut w = SystemVec::with_capacity(1_000);
        assert_eq!(mapped(&w), cfg!(all(target_os = "linux", not(miri))));
        for i in 0..1_000u64 {
            w.push(i);
        }
        check(&w);
        w.truncate(0);
        w.shrink_to(0);
        assert_eq!(w.capacity(), 0);
    }

    #[test]
    fn zero_sized_elements_need_no_memory() {
        let mut v = SystemVec::new();
        for _ in 0..10 {
            v.push(());
        }
        assert_eq!(v.len(), 10);
        v.truncate(3);
        assert_eq!(v.len(), 3);
        let old = v.move_to_fit();
        assert_eq!((old.len(), v.len()), (0, 3));
    }

    /// A deterministic random run of every operation against a `Vec` model, with boxed
    /// elements, so that Miri sees each block's layout, each move and each drop.
    #[test]
    fn random_operations_match_a_vec() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let mut v: SystemVec<Box<u64>> = SystemVec::new();
        let mut model: Vec<u64> = Vec::new();
        let steps = if cfg!(miri) { 600 } else { 20_000 };
        for step in 0..steps {
            match next(10) {
                0..=4 => {
                    v.push(Box::new(step));
                    model.push(step);
                }
                5 => {
                    let to = next(model.len() + 2);
                    v.truncate(to);
                    model.truncate(to);
                }
                6 => {
                    let before = v.capacity();
                    let min = next(before + 2);
                    v.shrink_to(min);
                    assert_eq!(v.capacity(), min.max(model.len()).min(before));
                }
                7 => {
                    let old = v.move_to_fit();
                    assert_eq!(old.len(), 0);
                    assert_eq!(v.capacity(), model.len());
                }
                8 if !model.is_empty() => {
                    let i = next(model.len());
                    drop(std::mem::replace(&mut v[i], Box::new(step + 1_000_000)));
                    model[i] = step + 1_000_000;
                }
                _ => {
                    v = SystemVec::with_capacity(next(8));
                    model.clear();
                }
            }
            assert!(v.len() <= v.capacity());
            assert!(v.iter().map(|b| **b).eq(model.iter().copied()));
        }
    }

    /// Zero-sized elements with a drop: each dropped once, through truncate, a move and
    /// the array's own drop.
    #[test]
    fn zero_sized_elements_are_each_dropped_once() {
        use std::cell::Cell;
        thread_local!(static DROPS: Cell<usize> = const { Cell::new(0) });
        struct Z;
        impl Drop for Z {
            fn drop(&mut self) {
                DROPS.with(|d| d.set(d.get() + 1));
            }
        }
        let mut v = SystemVec::with_capacity(5);
        for _ in 0..100 {
            v.push(Z);
        }
        v.truncate(60);
        assert_eq!(DROPS.with(Cell::get), 40);
        v.shrink_to(0);
        drop(v.move_to_fit());
        assert_eq!(DROPS.with(Cell::get), 40);
        assert_eq!(v.len(), 60);
        drop(v);
        assert_eq!(DROPS.with(Cell::get), 100);
    }

    /// An element whose drop panics: no element is dropped twice, and the block is freed
    /// (Miri reports a leaked block).
    #[test]
    fn a_panicking_drop_drops_nothing_twice_and_frees_the_block() {
        struct Bomb(#[allow(dead_code)] Rc<()>, bool);
        impl Drop for Bomb {
            fn drop(&mut self) {
                if self.1 {
                    panic!("boom");
                }
            }
        }
        let counted = Rc::new(());
        let mut v = SystemVec::new();
        for i in 0..10 {
            v.push(Bomb(Rc::clone(&counted), i == 7));
        }
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| v.truncate(5)));
        assert!(caught.is_err());
        assert_eq!(v.len(), 5);
        // The elements after the one that panicked were dropped too.
        assert_eq!(Rc::strong_count(&counted), 6);
        v[4].1 = true;
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(v)));
        assert!(caught.is_err());
        assert_eq!(Rc::strong_count(&counted), 1);
    }
}
