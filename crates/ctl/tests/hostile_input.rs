//! `margay ctl` fed hostile or careless input: every case ends with a clear error, in bounded
//! memory and time. Memory is what this thread allocates (a counting global allocator);
//! `validate` runs on the calling thread.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::io::Read;
use std::time::{Duration, Instant};

use clap::Parser;
use margay_ctl::CtlArgs;
use margay_testkit::alloc::{Counting, peak_since, reset_peak};

#[global_allocator]
static GLOBAL: Counting = Counting;

#[derive(Parser)]
#[command(name = "ctl")]
struct Cli {
    #[command(flatten)]
    ctl: CtlArgs,
}

struct Run {
    code: u8,
    out: String,
    err: String,
    /// Most bytes this thread held at once during the command, above what it held before.
    peak: usize,
    took: Duration,
}

fn ctl(args: &[&str], stdin: &mut dyn Read) -> Run {
    let cli = Cli::try_parse_from(std::iter::once("ctl").chain(args.iter().copied())).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let base = reset_peak();
    let start = Instant::now();
    let code = margay_ctl::run(cli.ctl, stdin, &mut out, &mut err);
    let took = start.elapsed();
    let peak = peak_since(base);
    Run {
        code,
        out: String::from_utf8_lossy(&out).into_owned(),
        err: String::from_utf8_lossy(&err).into_owned(),
        peak,
        took,
    }
}

fn validate_text(text: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.yaml");
    std::fs::write(&path, text).unwrap();
    ctl(
        &["validate", "-f", path.to_str().unwrap()],
        &mut std::io::empty(),
    )
}

const MIB: usize = 1 << 20;

#[test]
fn aliases_that_expand_a_small_file_enormously_are_refused_in_bounded_memory() {
    // 3,000 scalars under one anchor, referenced 3,000 times: ~20 KB of YAML that libyaml's
    // own repetition limit lets through and that expands to 9 million values (~300 MB).
    let wide = vec!["1"; 3000].join(",");
    let refs = vec!["*a"; 3000].join(",");
    let text = format!(
        "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkSet\nmetadata:\n  name: bomb\n  \
         annotations: {{x: &a [{wide}]}}\nspec:\n  nets: [{refs}]\n"
    );
    let r = validate_text(&text);
    eprintln!("alias storm: peak {} KiB, {:?}", r.peak >> 10, r.took);
    assert!(r.peak < 64 * MIB, "peak {} MiB", r.peak / MIB);
    assert_eq!(r.code, 1, "{}{}", r.out, r.err);
    assert!(r.out.contains("aliases"), "{}", r.out);
}

#[test]
fn ordinary_aliases_still_work() {
    let text = "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkSet\nmetadata:\n  name: ok\n  \
                labels: &l {app: web}\n  annotations: *l\nspec:\n  nets: [10.0.0.0/8]\n";
    let r = validate_text(text);
    assert_eq!(r.code, 0, "{}{}", r.out, r.err);
    assert!(r.out.contains("1 documents are valid"), "{}", r.out);
}

#[test]
fn deep_nesting_is_refused_before_parsing_in_linear_time() {
    for text in [
        format!("a: {}", "[".repeat(100_000)),
        format!("a: {}", "{b: ".repeat(100_000)),
        "- ".repeat(100_000) + "x\n",
        // JSON (serde_json has its own limit).
        "[".repeat(100_000),
    ] {
        let r = validate_text(&text);
        eprintln!("deep nesting ({} bytes): {:?}", text.len(), r.took);
        // Before: 40 s for 100k flow levels (libyaml is quadratic in flow depth).
        assert!(r.took < Duration::from_secs(10), "took {:?}", r.took);
        assert_eq!(r.code, 1, "{}{}", r.out, r.err);
        assert!(
            r.out.contains("levels deep") || r.out.contains("invalid JSON: recursion limit"),
            "{}",
            r.out
        );
    }
}

#[test]
fn an_oversized_file_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(17 * MIB as u64).unwrap();
    let r = ctl(
        &["validate", "-f", path.to_str().unwrap()],
        &mut std::io::empty(),
    );
    assert_eq!(r.code, 2, "{}{}", r.out, r.err);
    assert!(r.err.contains("larger than 16 MiB"), "{}", r.err);
    assert!(r.peak < MIB, "peak {} bytes", r.peak);
}

#[test]
fn endless_standard_input_is_refused_in_bounded_memory() {
    // Before: read until memory ran out.
    let r = ctl(&["validate", "-f", "-"], &mut std::io::repeat(b'a'));
    assert_eq!(r.code, 2, "{}{}", r.out, r.err);
    assert!(r.err.contains("larger than 16 MiB"), "{}", r.err);
    assert!(r.peak < 40 * MIB, "peak {} MiB", r.peak / MIB);
}

#[test]
fn errors_quote_at_most_a_few_hundred_characters_of_input() {
    let huge = "K".repeat(MIB);
    let cases = [
        // An unknown kind, echoed in the label and the message.
        format!("apiVersion: projectcalico.org/v3\nkind: {huge}\nmetadata:\n  name: x\n"),
        // A selector that does not parse.
        format!(
            "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata:\n  name: x\n\
             spec:\n  selector: \"{huge} ==\"\n"
        ),
        // A field of the wrong type holding a long string.
        format!(
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: x\n\
             spec:\n  cidr: 10.0.0.0/8\n  blockSize: \"{huge}\"\n"
        ),
        // A JSON syntax error after a long string.
        format!("{{\"kind\": \"{huge}\" x}}"),
    ];
    for text in cases {
        let r = validate_text(&text);
        assert_eq!(r.code, 1, "{}", &r.out[..r.out.len().min(2000)]);
        let shown = r.out.len() + r.err.len();
        assert!(shown < 2000, "{shown} bytes of messages");
        // Before: 11 s for the unknown kind (edit distances to a megabyte-long name).
        assert!(r.took < Duration::from_secs(5), "took {:?}", r.took);
    }
}
