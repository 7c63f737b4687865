//! Each fuzz target for a bounded time (MARGAY_FUZZ_SECS, default 12 s each; the targets run
//! in parallel), as part of `cargo test`. A finding fails the test with the seed and the saved
//! input; `MARGAY_FUZZ_SEED` repeats a run.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::time::Duration;

use margay_fuzz::targets::ALL;
use margay_fuzz::{Options, fuzz, fuzz_dir, seed_from_env};

#[global_allocator]
static ALLOC: margay_fuzz::Counting = margay_fuzz::Counting;

fn run(name: &str) {
    let secs = std::env::var("MARGAY_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let target = ALL.iter().find(|t| t.name == name).unwrap();
    let opts = Options::new(&fuzz_dir(), Duration::from_secs(secs), seed_from_env());
    match fuzz(target, &opts) {
        Ok(r) => {
            eprintln!("{name}: {r}");
            // The kept corpus must be there: a run on nothing but mutations of "" is not this test.
            assert!(
                r.seeds >= 3,
                "{name}: only {} seeds in fuzz/corpus/{name}",
                r.seeds
            );
            assert!(r.iterations > r.seeds as u64, "{name}: {r}");
        }
        Err(f) => panic!("{name}: {f}"),
    }
}

#[test]
fn typha_frame() {
    run("typha_frame");
}

#[test]
fn selector() {
    run("selector");
}

#[test]
fn resource() {
    run("resource");
}

#[test]
fn cni_config() {
    run("cni_config");
}

#[test]
fn bird_reply() {
    run("bird_reply");
}
