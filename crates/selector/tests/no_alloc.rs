//! `Selector::matches` must not allocate. Counts allocations made by this
//! thread with a wrapping global allocator.
// A GlobalAlloc impl is necessarily unsafe; this file is the only place the
// crate allows it (the library is `#![forbid(unsafe_code)]`).
#![allow(unsafe_code)]
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use margay_selector::Selector;

thread_local! {
    // Per thread, so allocations by the test harness's other threads don't count.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    // try_with: the TLS slot may be gone while a thread is being torn down.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

const SELECTORS: &[&str] = &[
    "",
    "all()",
    "global()",
    "!all()",
    r#"app == "web""#,
    r#"app != "web""#,
    r#"tier in {"fe", "be", "db"}"#,
    r#"tier not in {"fe", "be"}"#,
    r#"name contains "ngi""#,
    r#"name starts with "ng""#,
    r#"name ends with "nx""#,
    "has(env)",
    "!has(missing)",
    r#"app == "web" && tier in {"fe","be"} && has(env) && version != "v1""#,
    r#"(app == "db" || tier == "fe") && !(env == "dev" || has(missing))"#,
    r#"!!(a == "1" || b == "2") && (c not in {} || !d contains "x")"#,
];

#[test]
fn matches_does_not_allocate() {
    let btree: BTreeMap<String, String> = [
        ("app", "web"),
        ("tier", "fe"),
        ("env", "prod"),
        ("version", "v2"),
        ("name", "nginx"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let hash: HashMap<String, String> = btree.clone().into_iter().collect();
    let slice = [("app", "web"), ("tier", "db"), ("a", "1")];
    let empty: BTreeMap<String, String> = BTreeMap::new();

    let selectors: Vec<Selector> = SELECTORS
        .iter()
        .map(|s| Selector::parse(s).unwrap())
        .collect();
    // Sanity check that the counter works at all.
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 16]))) > 0);

    let mut matched = 0;
    let allocs = allocations_during(|| {
        for sel in &selectors {
            for _ in 0..3 {
                matched += usize::from(sel.matches(&btree));
                matched += usize::from(sel.matches(&hash));
                matched += usize::from(sel.matches(&slice));
                matched += usize::from(sel.matches(&empty));
            }
        }
    });
    assert_eq!(allocs, 0, "matches() allocated");
    assert!(matched > 0);

    // Parsing does allocate; this shows the counter sees this code's allocations.
    assert!(allocations_during(|| drop(Selector::parse("has(a)"))) > 0);
}
