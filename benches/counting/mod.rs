//! The benchmarks' global allocator: counts heap allocations, to report
//! allocations per lock + release, and forwards each to the system
//! allocator, or, built with `RUSTFLAGS="--cfg quorumlock_dhat"`, to
//! dhat's, which records allocation sites while a `dhat::Profiler` runs
//! (`benches/profile.rs` with `QUORUMLOCK_DHAT=1` writes `dhat-heap.json`
//! for dhat's viewer). dhat's allocator costs CPU even when not recording.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

#[cfg(quorumlock_dhat)]
static INNER: dhat::Alloc = dhat::Alloc;
#[cfg(not(quorumlock_dhat))]
static INNER: std::alloc::System = std::alloc::System;

// SAFETY: forwards every call unchanged; only counts them.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { INNER.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { INNER.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Counted as the default `realloc` (a new allocation) would be.
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { INNER.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap allocations (and reallocations) so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}
