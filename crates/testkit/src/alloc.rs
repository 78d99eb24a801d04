//! The global allocator for tests, [`CountingAllocator`]: the allocations of one thread, for
//! tests that prove a path allocates nothing (identify, match and decide allocate nothing), and
//! the heap the process holds as glibc would hold it, for memory bounds. A test binary installs
//! it and measures a closure:
//!
//! ```no_run
//! use spillway_testkit::alloc::{CountingAllocator, allocations_in};
//!
//! #[global_allocator]
//! static GLOBAL: CountingAllocator = CountingAllocator;
//!
//! assert_eq!(allocations_in(|| 1 + 1), 0);
//! ```
//!
//! The switch and the count of [`allocations_in`] are per thread, so the harness and the other
//! tests, which run on their own threads at the same time, cannot add to a measurement. The
//! process-wide figures ([`live_bytes`], [`allocations`]) suit a test that runs alone in its
//! process, as every test does under nextest.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// Counts the allocations made while the calling thread has switched counting on
/// ([`allocations_in`]), and the process's live heap bytes and allocations ([`live_bytes`],
/// [`allocations`]); forwards everything to the system allocator.
pub struct CountingAllocator;

thread_local! {
    // `const` and without destructors, so using them never allocates (no recursion into us).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn note_allocation(bytes: isize) {
    LIVE.fetch_add(bytes, Ordering::Relaxed);
    MADE.fetch_add(1, Ordering::Relaxed);
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }
}

// SAFETY (the only unsafe in spillway-testkit): every method forwards its arguments unchanged to
// the system allocator, which upholds the `GlobalAlloc` contract; counting touches only const
// thread-locals and atomics.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation(chunk(layout.size()));
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation(chunk(layout.size()));
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation(chunk(new_size) - chunk(layout.size()));
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// How many allocations `f` makes on this thread (with [`CountingAllocator`] installed as the
/// global allocator; 0 otherwise).
pub fn allocations_in<R>(f: impl FnOnce() -> R) -> usize {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    black_box(f());
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get)
}

/// Live heap bytes as the allocator would hold them: each request rounded up to a glibc chunk
/// (8 bytes of header, 16-byte alignment, 32 bytes at least), so a bound includes overhead.
static LIVE: AtomicIsize = AtomicIsize::new(0);
/// Allocations made by every thread.
static MADE: AtomicUsize = AtomicUsize::new(0);

fn chunk(size: usize) -> isize {
    ((size + 8 + 15) & !15).max(32) as isize
}

/// The process's live heap bytes, glibc chunks included, with [`CountingAllocator`] installed.
pub fn live_bytes() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Allocations made so far by every thread, with [`CountingAllocator`] installed.
pub fn allocations() -> usize {
    MADE.load(Ordering::Relaxed)
}
