//! The counting allocator, installed as the global allocator: it charges the thread that
//! allocates, and only that thread.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use margay_testkit::alloc::{Counting, peak_since, reset_peak};

#[global_allocator]
static GLOBAL: Counting = Counting;

const MIB: usize = 1 << 20;

#[test]
fn the_peak_is_what_this_thread_held_at_once() {
    let base = reset_peak();
    let a = vec![1u8; 4 * MIB];
    drop(a);
    let b = vec![2u8; MIB];
    let peak = peak_since(base);
    assert!(
        (4 * MIB..5 * MIB).contains(&peak),
        "peak {peak} after holding 4 MiB, then 1 MiB"
    );
    drop(b);
    // A fresh measurement starts from what is held now.
    let base = reset_peak();
    assert!(peak_since(base) < 64 * 1024, "{}", peak_since(base));
}

#[test]
fn other_threads_are_not_charged() {
    let base = reset_peak();
    std::thread::spawn(|| {
        let v = vec![3u8; 8 * MIB];
        assert_eq!(v.len(), 8 * MIB);
    })
    .join()
    .unwrap();
    let peak = peak_since(base);
    assert!(
        peak < MIB,
        "another thread's 8 MiB was charged here: {peak}"
    );
}
