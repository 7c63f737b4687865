//! `margay-fuzz [TARGET...] [--secs N] [--seed S] [--replay FILE]`: fuzz the named targets (all
//! without names) for N seconds each, or run one saved input through a target.
//!
//!   cargo run --release -p margay-fuzz -- selector --secs 600
//!   cargo run -p margay-fuzz -- resource --replay fuzz/artifacts/resource/crash-...
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use margay_fuzz::targets::ALL;
use margay_fuzz::{Options, fuzz, fuzz_dir, run_one, seed_from_env};

#[global_allocator]
static ALLOC: margay_fuzz::Counting = margay_fuzz::Counting;

fn usage() -> ExitCode {
    let names: Vec<&str> = ALL.iter().map(|t| t.name).collect();
    eprintln!(
        "usage: margay-fuzz [TARGET...] [--secs N] [--seed S] [--replay FILE]\ntargets: {}",
        names.join(", ")
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut names = Vec::new();
    let (mut secs, mut seed, mut replay) = (60u64, seed_from_env(), None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--secs" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) => secs = v,
                None => return usage(),
            },
            "--seed" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) => seed = v,
                None => return usage(),
            },
            "--replay" => match args.next() {
                Some(v) => replay = Some(v),
                None => return usage(),
            },
            "--write-typha-seeds" => {
                let dir = fuzz_dir().join("corpus/typha_frame");
                for (i, seed) in margay_fuzz::targets::typha_seeds().iter().enumerate() {
                    if let Err(e) = std::fs::write(dir.join(format!("{i:02}.bin")), seed) {
                        eprintln!(
                            "margay-fuzz: cannot write seeds into {}: {e}",
                            dir.display()
                        );
                        return ExitCode::from(2);
                    }
                }
                return ExitCode::SUCCESS;
            }
            "-h" | "--help" => return usage(),
            name => match ALL.iter().find(|t| t.name == name) {
                Some(t) => names.push(t),
                None => return usage(),
            },
        }
    }
    let targets: Vec<_> = if names.is_empty() {
        ALL.iter().collect()
    } else {
        names
    };
    let opts = Options::new(&fuzz_dir(), Duration::from_secs(secs), seed);
    if let Some(file) = replay {
        let input = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("margay-fuzz: cannot read {file}: {e}");
                return ExitCode::from(2);
            }
        };
        let mut failed = false;
        for t in targets {
            match run_one(t, &input, opts.memory_limit) {
                Ok(class) => println!("{}: ok (class {class:016x})", t.name),
                Err(what) => {
                    println!("{}: {what}", t.name);
                    failed = true;
                }
            }
        }
        return ExitCode::from(u8::from(failed));
    }
    let mut failed = false;
    for t in targets {
        match fuzz(t, &opts) {
            Ok(r) => println!("{}: {r}", t.name),
            Err(f) => {
                println!("{}: FOUND {f}", t.name);
                failed = true;
            }
        }
    }
    ExitCode::from(u8::from(failed))
}
