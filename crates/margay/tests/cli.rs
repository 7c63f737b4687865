//! The `margay ctl` commands, run as the real binary.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::path::PathBuf;

use assert_cmd::Command;
use serde_json::Value;

fn margay() -> Command {
    Command::cargo_bin("margay").expect("margay binary")
}

fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn conformance() -> Value {
    let path = repo_file("crates/selector/tests/data/calico-selector-cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("conformance data")).expect("json")
}

fn label_args(labels: &Value) -> Vec<String> {
    labels
        .as_object()
        .expect("label map")
        .iter()
        .flat_map(|(k, v)| {
            [
                "--label".to_string(),
                format!("{k}={}", v.as_str().expect("string")),
            ]
        })
        .collect()
}

#[test]
fn selector_check_agrees_with_every_calico_match_case() {
    let data = conformance();
    let mut checks = 0;
    for case in data["match_tests"].as_array().expect("match_tests") {
        let sel = case["selector"].as_str().expect("selector");
        for (key, want) in [("matches", "true\n"), ("non_matches", "false\n")] {
            for labels in case[key].as_array().expect("label sets") {
                margay()
                    .args(["ctl", "selector", "check", sel])
                    .args(label_args(labels))
                    .assert()
                    .success()
                    .stdout(want.to_string());
                checks += 1;
            }
        }
    }
    assert!(checks >= 98, "only {checks} checks ran");
}

#[test]
fn selector_canonical_agrees_with_every_calico_case() {
    let data = conformance();
    let cases = data["canonicalisation"].as_array().expect("cases");
    assert!(cases.len() >= 17);
    for case in cases {
        let input = case["input"].as_str().expect("input");
        let canonical = case["canonical"].as_str().expect("canonical");
        // Calico's table gives the UniqueID for some inputs only.
        let uid = case["uid"].as_str().unwrap_or_default();
        let out = margay()
            .args(["ctl", "selector", "canonical", input])
            .assert()
            .success()
            .get_output()
            .clone();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 2, "{input:?}: {stdout}");
        assert_eq!(lines[0], canonical, "{input:?}");
        assert!(
            lines[1].starts_with("s:") && lines[1].len() == 40,
            "{input:?}: {}",
            lines[1]
        );
        if !uid.is_empty() {
            assert_eq!(lines[1], uid, "{input:?}");
        }
    }
}

#[test]
fn invalid_selectors_exit_2_with_position_and_expectation() {
    let data = conformance();
    for bad in data["bad_selectors"].as_array().expect("bad") {
        let sel = bad.as_str().expect("string");
        for cmd in [
            &["ctl", "selector", "check", sel][..],
            &["ctl", "selector", "canonical", sel][..],
        ] {
            let out = margay().args(cmd).assert().code(2).get_output().clone();
            assert!(out.stdout.is_empty(), "{sel:?}: nothing on stdout");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("at position") && err.contains("expected"),
                "{sel:?}: {err}"
            );
        }
    }
}

#[test]
fn selector_label_must_be_key_value() {
    margay()
        .args(["ctl", "selector", "check", "a == 'b'", "--label", "novalue"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("KEY=VALUE"));
}

#[test]
fn validate_accepts_valid_files_and_stdin() {
    margay()
        .args(["ctl", "validate", "-f"])
        .arg(repo_file("examples/cluster.yaml"))
        .assert()
        .success()
        .stdout("4 documents are valid\n");
    let json = r#"{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"p"},"spec":{"cidr":"10.1.0.0/16"}}"#;
    margay()
        .args(["ctl", "validate", "-f", "-"])
        .write_stdin(json)
        .assert()
        .success()
        .stdout("1 documents are valid\n");
}

#[test]
fn validate_names_every_problem_and_exits_1() {
    let out = margay()
        .args(["ctl", "validate", "-f"])
        .arg(repo_file("examples/broken.yaml"))
        .assert()
        .code(1)
        .get_output()
        .clone();
    let stdout = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "[document 1] IPPool/pods-v4: spec.cidr: \"10.244.0.0/33\" is not a valid CIDR",
        "[document 1] IPPool/pods-v4: spec.vxlanMode: ipipMode and vxlanMode cannot both be enabled",
        "[document 2] IPPool/typo: spec.natOutgong: unknown field \"natOutgong\" (did you mean \"natOutgoing\"?)",
        "[document 3] GlobalNetworkPolicy/Allow_Ping: metadata.name:",
        "[document 3] GlobalNetworkPolicy/Allow_Ping: spec.selector: invalid selector",
        "[document 3] GlobalNetworkPolicy/Allow_Ping: spec.ingress[0].icmp: icmp requires protocol ICMP or ICMPv6",
        "[document 3] GlobalNetworkPolicy/Allow_Ping: spec.ingress[0].source.nets[0]:",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    assert_eq!(stdout.lines().count(), 7, "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("3 of 3 documents are invalid"));
}

#[test]
fn validate_reports_unreadable_files_with_exit_2() {
    margay()
        .args(["ctl", "validate", "-f", "/nonexistent/margay.yaml"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "cannot read /nonexistent/margay.yaml",
        ));
}

#[test]
fn validate_reports_syntax_errors_and_unknown_kinds() {
    margay()
        .args(["ctl", "validate", "-f", "-"])
        .write_stdin("apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: [unclosed\n")
        .assert()
        .code(1)
        .stdout(predicates::str::contains("invalid YAML"));
    margay()
        .args(["ctl", "validate", "-f", "-"])
        .write_stdin("apiVersion: projectcalico.org/v3\nkind: IPPol\nmetadata: {name: x}\n")
        .assert()
        .code(1)
        .stdout(predicates::str::contains(
            "unknown kind \"IPPol\" (did you mean \"IPPool\"?)",
        ));
}

#[cfg(unix)]
#[test]
fn calicoctl_link_behaves_as_margay_ctl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let link = dir.path().join("calicoctl");
    std::os::unix::fs::symlink(assert_cmd::cargo::cargo_bin("margay"), &link).expect("symlink");
    Command::new(&link)
        .args(["selector", "canonical", ""])
        .assert()
        .success()
        .stdout("all()\ns:5y5I3VdRZfDU01O--xXAPx2yxCQQqMf0M6IWug\n");
}

#[test]
fn log_level_takes_calico_names_and_refuses_unknown_ones() {
    // `warning` (logrus's name) must show warnings, not turn logging off: credentials over
    // plain http:// are warned about before the (refused) connection fails.
    for level in ["warning", "Warning", "WARN", "info"] {
        let out = margay()
            .args(["--log-level", level, "ctl", "get", "nodes"])
            .env("DATASTORE_TYPE", "etcdv3")
            .env("ETCD_ENDPOINTS", "http://127.0.0.1:1")
            .env("ETCD_USERNAME", "u")
            .env("ETCD_PASSWORD", "p")
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("WARN"), "--log-level {level}: {stderr}");
    }
    let out = margay()
        .args(["--log-level", "error", "ctl", "get", "nodes"])
        .env("DATASTORE_TYPE", "etcdv3")
        .env("ETCD_ENDPOINTS", "http://127.0.0.1:1")
        .env("ETCD_USERNAME", "u")
        .env("ETCD_PASSWORD", "p")
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("WARN"));
    margay()
        .args([
            "--log-level",
            "warnings",
            "ctl",
            "selector",
            "check",
            "all()",
        ])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "invalid --log-level (or MARGAY_LOG_LEVEL) \"warnings\"",
        ));
    margay()
        .env("MARGAY_LOG_LEVEL", "loud")
        .args(["ctl", "selector", "check", "all()"])
        .assert()
        .code(2);
}

#[test]
fn completion_scripts_cover_every_role() {
    for (shell, marker) in [
        ("bash", "_margay()"),
        ("zsh", "#compdef margay"),
        ("fish", "complete -c margay"),
    ] {
        let out = margay().args(["completion", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell}");
        for role in ["ctl", "felix", "typha", "confd", "kube-controllers", "lab"] {
            assert!(script.contains(role), "{shell} completion lacks {role}");
        }
    }
    margay().args(["completion", "tcsh"]).assert().code(2);
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let out = margay().arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.starts_with(&format!("margay {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    // Built from a git checkout (as CI is): the very commit, and its date.
    if let Ok(head) = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        && head.status.success()
    {
        let head = String::from_utf8_lossy(&head.stdout);
        assert!(version.contains(head.trim()), "{version} vs HEAD {head}");
    }
    // Every role answers the same.
    let felix = margay().args(["felix", "--version"]).output().unwrap();
    assert!(String::from_utf8_lossy(&felix.stdout).contains("(commit "));
}

#[test]
fn validate_reports_every_problem_of_every_file_under_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sub")).unwrap();
    std::fs::write(
        dir.path().join("pool.yaml"),
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p}\nspec:\n  cidr: 10.0.0.0/16\n  blockSize: many\n  natOutgoing: perhaps\n---\napiVersion: projectcalico.org/v3\nkind: Tier\nmetadata: {name: ok}\nspec: {order: 10}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("sub/gnp.json"),
        r#"{"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkPolicy","metadata":{"name":"g"},"spec":{"ingress":[{"action":"Allow","protocol":"TCP","destination":{"ports":[80,true,443,[1]]}}]}}"#,
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a resource").unwrap();
    // Without -R: the directory's own files only.
    let out = margay()
        .args(["ctl", "validate", "-f"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("spec.blockSize"), "{report}");
    assert!(report.contains("spec.natOutgoing"), "{report}");
    assert!(!report.contains("gnp.json"), "{report}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 of 2 documents are invalid"),
        "{out:?}"
    );
    // With -R: the subdirectory too, every problem of each document.
    let out = margay()
        .args(["ctl", "validate", "-R", "-f"])
        .arg(dir.path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("destination.ports[1]"), "{report}");
    assert!(report.contains("destination.ports[3]"), "{report}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2 of 3 documents are invalid"),
        "{out:?}"
    );
    // An empty directory is a clear problem, not a silent success.
    let empty = tempfile::tempdir().unwrap();
    let out = margay()
        .args(["ctl", "validate", "-f"])
        .arg(empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no resources specified in directory"));
}
