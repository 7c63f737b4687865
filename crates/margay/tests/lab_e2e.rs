//! End-to-end policy suite on `margay lab`: the default topology (namespaces x, y, z; pods a,
//! b, c; two nodes, VXLAN between them), one scenario after the other, each asserting the full
//! reachability matrix. The Kubernetes-modelled scenarios are written as Kubernetes
//! NetworkPolicies (`networking.k8s.io/v1`, converted the way Calico converts them); the
//! Calico-only ones (GlobalNetworkPolicy, tiers and Pass, Deny, order, NetworkSets, Log) as
//! projectcalico.org/v3. Root only; the lab is removed even when a scenario fails.
#![allow(clippy::unwrap_used)]

mod lab_common;

use std::time::{Duration, Instant};

use lab_common::{Expect, Lab, diff, run_scenarios};
use margay_testkit::netns::is_root;

#[test]
fn policy_scenarios_on_the_lab() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let lab = Lab::up();
    let ips = lab.ips();
    let (mut failures, slowest) =
        run_scenarios(&lab, &|s| lab.apply(s.yaml), &|s| lab.delete(s.yaml));
    // Policy update in place, then delete: the matrix follows each step.
    let first = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: moving, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {ns: 'y'}";
    let second = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: moving, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {ns: z}";
    let steps: [(&str, Option<&str>, Expect); 3] = [
        ("update: x from y", Some(first), |f, _, t, _| {
            t != "x" || f == "y"
        }),
        (
            "update: x from z (same policy)",
            Some(second),
            |f, _, t, _| t != "x" || f == "z",
        ),
        ("delete", None, |_, _, _, _| true),
    ];
    for (name, yaml, expect) in steps {
        match yaml {
            Some(y) => lab.apply(y),
            None => lab.delete(second),
        }
        let t = Instant::now();
        let mut last = Vec::new();
        while t.elapsed() < Duration::from_secs(10) {
            last = diff(&lab.matrix(80, "tcp"), expect);
            if last.is_empty() {
                break;
            }
        }
        eprintln!(
            "{} {name:<70} {:?}",
            if last.is_empty() { "ok  " } else { "FAIL" },
            t.elapsed()
        );
        if !last.is_empty() {
            failures.push(format!("{name}: {last:?}"));
        }
    }
    // `lab flows --follow` shows a connection made while it runs, from whichever node saw it.
    let follower = lab
        .cmd(&[
            "flows",
            "--follow",
            "--until-seconds",
            "5",
            "--last",
            "0",
            "-o",
            "json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(lab.probe("x/a", "y/b", 2000), "x/a could not reach y/b");
    let followed = follower.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&followed.stdout);
    let to_b = &ips["y/b"];
    let seen = text.lines().any(|l| {
        serde_json::from_str::<serde_json::Value>(l).is_ok_and(|f| {
            f["tuple"]["dst"].as_str() == Some(to_b.as_str())
                && f["tuple"]["dst_port"] == 80
                && f["action"] == "allow"
        })
    });
    if !seen {
        failures.push(format!(
            "lab flows --follow did not show x/a -> y/b:80 allowed:\n{text}"
        ));
    }
    eprintln!("slowest convergence (matrix runs included): {slowest:?}");
    assert!(
        failures.is_empty(),
        "scenarios failed:\n{}",
        failures.join("\n")
    );
}
