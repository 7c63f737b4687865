//! Fuzzing on the stable toolchain: an in-process mutation engine seeded from corpora kept in
//! the repository (`fuzz/corpus/<target>/`), with one target per parser that takes input from
//! strangers ([`targets`]).
//!
//! Without the compiler's coverage hooks (nightly, libFuzzer) the engine steers by what each
//! target reports about an input (its *outcome class*: which error, which shape of result):
//! an input with a class not seen before joins the live corpus. Mutations are byte-level and
//! dictionary-driven (each target lists the tokens of its grammar). A run replays the corpus,
//! then mutates until its time or iteration budget is spent.
//!
//! Findings: a panic (a target also panics when a property it checks breaks, e.g. a round
//! trip), an input that made the parser hold more than the memory limit, and an input that
//! ran longer than the hang limit (a watchdog saves it and ends the process). Each is saved
//! under `fuzz/artifacts/<target>/` and reproduced with `margay-fuzz <target> --replay FILE`.
#![deny(unsafe_code)]

pub mod targets;

use margay_testkit::alloc;
pub use margay_testkit::alloc::Counting;

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One thing to fuzz.
pub struct Target {
    pub name: &'static str,
    /// Runs the parser on one input; returns the outcome class, panics on a broken property.
    pub run: fn(&[u8]) -> u64,
    /// Tokens of the input language, inserted and spliced by the mutator.
    pub dictionary: &'static [&'static [u8]],
    /// Inputs are kept at most this long.
    pub max_len: usize,
}

/// How long and how to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub time: Duration,
    pub max_iterations: u64,
    pub seed: u64,
    /// `<corpus>/<target>/` holds the seeds (and `fuzz/regressions/<target>/`, if present,
    /// inputs that once failed).
    pub corpus: PathBuf,
    pub artifacts: PathBuf,
    /// One input may make the target hold at most this many bytes at once.
    pub memory_limit: usize,
    /// One input may run at most this long (the watchdog ends the process after it).
    pub hang_limit: Duration,
}

impl Options {
    /// Defaults relative to the `fuzz/` directory.
    pub fn new(fuzz_dir: &Path, time: Duration, seed: u64) -> Options {
        Options {
            time,
            max_iterations: u64::MAX,
            seed,
            corpus: fuzz_dir.join("corpus"),
            artifacts: fuzz_dir.join("artifacts"),
            memory_limit: 256 << 20,
            hang_limit: Duration::from_secs(20),
        }
    }
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct Report {
    pub seeds: usize,
    pub iterations: u64,
    pub classes: usize,
    pub corpus: usize,
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rate = self.iterations as f64 / self.elapsed.as_secs_f64().max(1e-9);
        write!(
            f,
            "{} seeds, {} runs in {:.1?} ({rate:.0}/s), {} outcome classes, corpus {}",
            self.seeds, self.iterations, self.elapsed, self.classes, self.corpus
        )
    }
}

/// A failure found, with the input saved to reproduce it.
#[derive(Debug, Clone)]
pub struct Finding {
    pub what: String,
    pub saved: PathBuf,
    pub seed: u64,
    pub iteration: u64,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (seed {}, iteration {}); input saved to {}",
            self.what,
            self.seed,
            self.iteration,
            self.saved.display()
        )
    }
}

/// A small, fast PRNG (SplitMix64): reproducible from the seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Bytes that often matter to parsers.
const INTERESTING: &[u8] = &[
    0, 1, 0x7f, 0x80, 0xff, b'\n', b'\r', b'\t', b' ', b'"', b'\'', b'\\', b'{', b'}', b'[', b']',
    b':', b',', b'-', b'#', b'&', b'*', b'!', b'|', b'>', b'0', b'9', b'=', b'(', b')',
];

/// One to four stacked mutations of `input`, kept within `max_len`; `other` feeds splices.
pub fn mutate(
    rng: &mut Rng,
    input: &[u8],
    other: &[u8],
    dict: &[&[u8]],
    max_len: usize,
) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(11) {
            // Flip a bit.
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            // Set a byte to something interesting.
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            // Insert a few random or interesting bytes.
            2 => {
                let at = rng.below(v.len() + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n)
                    .map(|_| {
                        if rng.chance(2) {
                            INTERESTING[rng.below(INTERESTING.len())]
                        } else {
                            rng.next_u64() as u8
                        }
                    })
                    .collect();
                v.splice(at..at, bytes);
            }
            // Delete a range.
            3 if !v.is_empty() => {
                let at = rng.below(v.len());
                let n = 1 + rng.below((v.len() - at).min(64));
                v.drain(at..at + n);
            }
            // Copy a range elsewhere.
            4 if !v.is_empty() => {
                let at = rng.below(v.len());
                let n = 1 + rng.below((v.len() - at).min(128));
                let chunk = v[at..at + n].to_vec();
                let to = rng.below(v.len() + 1);
                v.splice(to..to, chunk);
            }
            // Repeat a range many times (size and nesting limits).
            5 if !v.is_empty() => {
                let at = rng.below(v.len());
                let n = 1 + rng.below((v.len() - at).min(16));
                let chunk = v[at..at + n].to_vec();
                let most = if rng.chance(8) { 2000 } else { 32 };
                let times = 1 + rng.below(most);
                let rep: Vec<u8> = chunk.iter().copied().cycle().take(n * times).collect();
                v.splice(at..at, rep);
            }
            // Insert or overwrite with a dictionary token.
            6 | 7 if !dict.is_empty() => {
                let tok = dict[rng.below(dict.len())];
                let at = rng.below(v.len() + 1);
                if rng.chance(2) || at + tok.len() > v.len() {
                    v.splice(at..at, tok.iter().copied());
                } else {
                    v[at..at + tok.len()].copy_from_slice(tok);
                }
            }
            // Splice: our head, another input's tail.
            8 if !other.is_empty() => {
                let head = rng.below(v.len() + 1);
                let tail = rng.below(other.len());
                v.truncate(head);
                v.extend_from_slice(&other[tail..]);
            }
            // Truncate.
            9 if !v.is_empty() => v.truncate(rng.below(v.len())),
            // Replace a byte with an arbitrary one.
            _ if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next_u64() as u8;
            }
            _ => v.push(rng.next_u64() as u8),
        }
    }
    v.truncate(max_len);
    v
}

/// The seeds of `target`: every file in `<corpus>/<target>/` and
/// `<corpus>/../regressions/<target>/`, in name order.
pub fn load_corpus(opts: &Options, target: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let dirs = [
        opts.corpus.join(target),
        opts.corpus
            .parent()
            .map(|p| p.join("regressions").join(target))
            .unwrap_or_default(),
    ];
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            if let Ok(b) = std::fs::read(&p) {
                out.push(b);
            }
        }
    }
    out
}

/// What the watchdog sees: the input running and since when.
struct Current {
    input: Vec<u8>,
    since: Instant,
    done: bool,
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn save(opts: &Options, target: &str, kind: &str, input: &[u8]) -> PathBuf {
    let dir = opts.artifacts.join(target);
    let path = dir.join(format!("{kind}-{:016x}", fnv(input)));
    // Best effort: the finding is reported either way.
    let _ = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, input));
    path
}

/// Runs one input, turning a panic or too much memory into a finding's description.
pub fn run_one(target: &Target, input: &[u8], memory_limit: usize) -> Result<u64, String> {
    let base = alloc::reset_peak();
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| (target.run)(input)));
    let peak = alloc::peak_since(base);
    match r {
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            Err(format!("panic: {msg}"))
        }
        Ok(_) if peak > memory_limit => Err(format!(
            "a {}-byte input made the parser hold {} MiB (limit {} MiB)",
            input.len(),
            peak >> 20,
            memory_limit >> 20
        )),
        Ok(class) => Ok(class),
    }
}

/// Replays the corpus, then mutates for the budget. Returns the first finding.
pub fn fuzz(target: &Target, opts: &Options) -> Result<Report, Finding> {
    let start = Instant::now();
    let mut corpus = load_corpus(opts, target.name);
    let seeds = corpus.len();
    if corpus.is_empty() {
        corpus.push(Vec::new());
    }
    let current = Arc::new(Mutex::new(Current {
        input: Vec::new(),
        since: Instant::now(),
        done: false,
    }));
    let watchdog = {
        let current = current.clone();
        let (name, limit, artifacts) = (target.name, opts.hang_limit, opts.clone());
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let Ok(c) = current.lock() else { return };
                if c.done {
                    return;
                }
                if c.since.elapsed() > limit {
                    let saved = save(&artifacts, name, "hang", &c.input);
                    eprintln!(
                        "margay-fuzz {name}: one input ran for more than {limit:?}; saved to {}",
                        saved.display()
                    );
                    std::process::exit(70);
                }
            }
        })
    };
    let mut rng = Rng::new(opts.seed);
    let mut classes = HashSet::new();
    let mut iterations = 0u64;
    let finish = |current: &Arc<Mutex<Current>>| {
        if let Ok(mut c) = current.lock() {
            c.done = true;
        }
    };
    let result = loop {
        let (input, is_seed) = if (iterations as usize) < seeds {
            (corpus[iterations as usize].clone(), true)
        } else if start.elapsed() >= opts.time || iterations >= opts.max_iterations {
            break Ok(());
        } else {
            let a = &corpus[rng.below(corpus.len())];
            let b = &corpus[rng.below(corpus.len())];
            (
                mutate(&mut rng, a, b, target.dictionary, target.max_len),
                false,
            )
        };
        if let Ok(mut c) = current.lock() {
            c.input.clone_from(&input);
            c.since = Instant::now();
        }
        match run_one(target, &input, opts.memory_limit) {
            Ok(class) => {
                // A new kind of outcome: worth mutating further.
                if classes.insert(class) && !is_seed && corpus.len() < 8192 {
                    corpus.push(input);
                }
            }
            Err(what) => {
                let kind = if what.starts_with("panic") {
                    "crash"
                } else {
                    "memory"
                };
                break Err(Finding {
                    what,
                    saved: save(opts, target.name, kind, &input),
                    seed: opts.seed,
                    iteration: iterations,
                });
            }
        }
        iterations += 1;
    };
    finish(&current);
    let _ = watchdog.join();
    result.map(|()| Report {
        seeds,
        iterations,
        classes: classes.len(),
        corpus: corpus.len(),
        elapsed: start.elapsed(),
    })
}

/// A seed that differs per run unless MARGAY_FUZZ_SEED fixes it.
pub fn seed_from_env() -> u64 {
    std::env::var("MARGAY_FUZZ_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default(),
            );
            h.finish()
        })
}

/// The `fuzz/` directory of this checkout.
pub fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_stay_within_the_length_limit_and_are_reproducible() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..2000 {
            let x = mutate(
                &mut a,
                b"selector: a == 'b'",
                b"[1,2]",
                &[b"has(", b"&&"],
                64,
            );
            let y = mutate(
                &mut b,
                b"selector: a == 'b'",
                b"[1,2]",
                &[b"has(", b"&&"],
                64,
            );
            assert_eq!(x, y);
            assert!(x.len() <= 64);
        }
    }

    fn explodes(input: &[u8]) -> u64 {
        assert!(!input.starts_with(b"boom"), "found the bomb");
        input.len() as u64
    }

    #[test]
    fn a_panic_is_found_and_saved() {
        let dir = std::env::temp_dir().join(format!("margay-fuzz-selftest-{}", std::process::id()));
        let mut opts = Options::new(&dir, Duration::from_secs(20), 1);
        opts.corpus = dir.join("corpus");
        std::fs::create_dir_all(opts.corpus.join("self")).unwrap_or_default();
        std::fs::write(opts.corpus.join("self/seed"), b"bo").unwrap_or_default();
        let target = Target {
            name: "self",
            run: explodes,
            dictionary: &[b"boom", b"om"],
            max_len: 16,
        };
        let r = fuzz(&target, &opts);
        let _ = std::fs::remove_dir_all(&dir);
        match r {
            Err(f) => assert!(f.what.contains("found the bomb"), "{f}"),
            Ok(r) => panic!("nothing found: {r}"),
        }
    }
}
