//! A global allocator that counts what the *current thread* holds, so a test or the fuzz
//! engine can check that a parser fed hostile input stays within a memory bound.
//!
//! Per thread, so other threads (other tests in the same harness) do not count. Install it in
//! the binary or test that measures:
//! `#[global_allocator] static A: margay_testkit::alloc::Counting = margay_testkit::alloc::Counting;`
//! then bracket the work with [`reset_peak`] and [`peak_since`].
// A GlobalAlloc impl is necessarily unsafe; this module is testkit's only unsafe code.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn charge(delta: isize) {
    // try_with: the slots are gone while a thread is torn down.
    let _ = LIVE.try_with(|l| {
        let now = l.get() + delta;
        l.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

/// The counting allocator: forwards to [`System`] and charges the calling thread.
pub struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size() as isize);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size() as isize);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        charge(new_size as isize - layout.size() as isize);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        charge(-(layout.size() as isize));
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Starts measuring this thread's peak; returns what the thread holds now (the base).
pub fn reset_peak() -> isize {
    let live = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(live));
    live
}

/// Most bytes this thread held at once since [`reset_peak`] returned `base` (0 when
/// [`Counting`] is not the global allocator).
pub fn peak_since(base: isize) -> usize {
    (PEAK.with(Cell::get) - base).max(0) as usize
}
