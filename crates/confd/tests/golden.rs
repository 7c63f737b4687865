//! Golden files: each directory under `tests/golden/` holds `input.yaml` (a header document,
//! then projectcalico.org/v3 resources) and the expected `bird.cfg` / `bird6.cfg`. Every
//! rendered file is also checked by BIRD itself (`bird -p -c`), so BIRD must be installed
//! (scripts/setup installs bird2); a missing `bird` fails the test.
//!
//! The header (first document):
//!
//! ```yaml
//! node: node1                  # the node confd runs for
//! affinities:                  # blocks affine to it: confirmed | pending | pendingDeletion
//!   10.65.0.0/26: confirmed
//! secrets:                     # written as <secrets dir>/<name>/<key>, then read back
//!   bgp-passwords/mesh: "s3cret"
//! routerID: hash               # CALICO_ROUTER_ID (optional)
//! ```
//!
//! `UPDATE_GOLDEN=1 cargo test -p margay-confd --test golden` rewrites the expected files.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use margay_api::net::Cidr;
use margay_confd::secrets::read_secrets;
use margay_confd::{BirdInputs, render};
use margay_ipam::block::AffinityState;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Header {
    node: String,
    #[serde(default)]
    affinities: BTreeMap<String, AffinityState>,
    #[serde(default)]
    secrets: BTreeMap<String, String>,
    #[serde(default, rename = "routerID")]
    router_id: Option<String>,
}

/// Builds the inputs exactly as the daemon does: resources through `apply`, affinities
/// through `set_affinity`, passwords read from files.
fn inputs(case: &Path, secrets_dir: &Path) -> BirdInputs {
    let text = std::fs::read_to_string(case.join("input.yaml")).unwrap();
    let (head, rest) = text
        .split_once("\n---\n")
        .unwrap_or_else(|| panic!("{}: no header document", case.display()));
    let header: Header =
        serde_norway::from_str(head).unwrap_or_else(|e| panic!("{}: header: {e}", case.display()));
    let mut inp = BirdInputs::new(&header.node);
    inp.router_id = header.router_id;
    for d in margay_api::decode_documents(rest).unwrap() {
        let label = d.label();
        let r = d
            .result
            .unwrap_or_else(|e| panic!("{}: {label}: {e}", case.display()));
        if let Err(e) = r.validate() {
            panic!("{}: {label} is not valid: {e}", case.display());
        }
        let name = r.metadata().name.clone();
        assert!(inp.apply(r.kind(), &name, Some(r)));
    }
    for (cidr, state) in header.affinities {
        inp.set_affinity(Cidr::parse(&cidr).unwrap(), Some(state));
    }
    for (path, pw) in &header.secrets {
        let file = secrets_dir.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, format!("{pw}\n")).unwrap();
    }
    let (found, _) = read_secrets(secrets_dir, &inp.secret_refs());
    inp.secrets = found;
    inp
}

pub fn bird_parse(path: &Path) -> Result<(), String> {
    let out = Command::new("bird")
        .arg("-p")
        .arg("-c")
        .arg(path)
        .output()
        .map_err(|e| {
            format!("cannot run `bird -p -c` ({e}): install BIRD 2 (scripts/setup installs bird2)")
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("input.yaml").exists())
        .collect();
    out.sort();
    out
}

#[test]
fn golden_files() {
    let update = std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1");
    let cases = cases();
    assert!(cases.len() >= 10, "golden cases missing: {cases:?}");
    let mut failures = Vec::new();
    for case in cases {
        let secrets = tempfile::tempdir().unwrap();
        let inp = inputs(&case, secrets.path());
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let cfg = match render(&inp) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{name}: render failed: {e}"));
                continue;
            }
        };
        let mut warnings = cfg.warnings.join("\n");
        if !warnings.is_empty() {
            warnings.push('\n');
        }
        for (file, text) in [
            ("expected-bird.cfg", &cfg.bird),
            ("expected-bird6.cfg", &cfg.bird6),
            ("expected-warnings.txt", &warnings),
        ] {
            let path = case.join(file);
            if update {
                if text.is_empty() {
                    let _ = std::fs::remove_file(&path);
                } else {
                    std::fs::write(&path, text).unwrap();
                }
            } else {
                let want = std::fs::read_to_string(&path).unwrap_or_default();
                if want != *text {
                    failures.push(format!(
                        "{name}/{file} differs (UPDATE_GOLDEN=1 regenerates):\n{}",
                        first_difference(&want, text)
                    ));
                }
            }
        }
        for (file, text) in [("bird.cfg", &cfg.bird), ("bird6.cfg", &cfg.bird6)] {
            let tmp = secrets.path().join(file);
            std::fs::write(&tmp, text).unwrap();
            if let Err(e) = bird_parse(&tmp) {
                failures.push(format!("{name}/{file}: BIRD rejects it: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn first_difference(want: &str, got: &str) -> String {
    for (i, (w, g)) in want.lines().zip(got.lines()).enumerate() {
        if w != g {
            return format!("line {}:\n  expected: {w}\n  rendered: {g}", i + 1);
        }
    }
    format!(
        "lengths differ: expected {} lines, rendered {}",
        want.lines().count(),
        got.lines().count()
    )
}
