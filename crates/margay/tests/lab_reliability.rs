//! Reliability on `margay lab`: Felix restarted under continuous probing, the datastore
//! (etcd) killed and restarted, and `lab down` after the lab itself was killed mid-build.
//! Root only; every lab is removed even when a test fails.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lab_common::{Lab, Matrix, bin};
use margay_testkit::netns::is_root;

mod lab_common;

impl Lab {
    /// Processes whose command line names this lab's directory.
    fn processes(&self) -> Vec<(u32, String)> {
        let needle = self.dir.display().to_string();
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmd.contains(&needle) && pid != std::process::id() {
                out.push((pid, cmd));
            }
        }
        out
    }

    fn namespaces(&self) -> Vec<String> {
        let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(&format!("mgy-{}-", self.name)))
            .map(str::to_string)
            .collect()
    }
}

const Y_FROM_X: &str = "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: from-x, namespace: y}
spec:
  selector: all()
  ingress:
  - action: Allow
    source: {namespaceSelector: ns == 'x'}";

fn expected_y_from_x(from: &str, to: &str) -> bool {
    from == to || !to.starts_with("y/") || from.starts_with("x/")
}

fn wrong(m: &Matrix, expect: fn(&str, &str) -> bool) -> Vec<String> {
    let mut out = Vec::new();
    for (from, row) in m {
        for (to, ok) in row {
            if *ok != expect(from, to) {
                out.push(format!("{from}->{to}={ok}"));
            }
        }
    }
    out
}

fn wait_matrix(lab: &Lab, expect: fn(&str, &str) -> bool, limit: Duration) {
    let t = Instant::now();
    loop {
        let w = wrong(
            &lab.matrix_with(&["--port", "80", "--timeout-ms", "400"]),
            expect,
        );
        if w.is_empty() {
            return;
        }
        assert!(
            t.elapsed() < limit,
            "matrix not as expected after {limit:?}: {w:?}"
        );
    }
}

#[test]
fn felix_restart_under_continuous_probing() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let lab = Lab::new("fr");
    lab.build(&[]);
    lab.apply_raw(Y_FROM_X);
    wait_matrix(&lab, expected_y_from_x, Duration::from_secs(10));
    // Kill Felix on node1 (its supervisor restarts it) and keep probing meanwhile.
    let felix: Vec<u32> = lab
        .processes()
        .into_iter()
        .filter(|(_, c)| {
            c.contains(" felix run ") && c.contains("nodes/node1/") && !c.contains(" supervise ")
        })
        .map(|(p, _)| p)
        .collect();
    assert_eq!(felix.len(), 1, "one felix on node1: {:?}", lab.processes());
    let status = Command::new("kill")
        .args(["-9", &felix[0].to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let t = Instant::now();
    let mut rounds = 0;
    while t.elapsed() < Duration::from_secs(6) {
        let w = wrong(
            &lab.matrix_with(&["--port", "80", "--timeout-ms", "400"]),
            expected_y_from_x,
        );
        assert!(w.is_empty(), "during the restart: {w:?}");
        rounds += 1;
    }
    // It came back.
    let back = lab.processes().into_iter().any(|(p, c)| {
        c.contains(" felix run ")
            && c.contains("nodes/node1/")
            && !c.contains(" supervise ")
            && p != felix[0]
    });
    assert!(back, "felix was not restarted by its supervisor");
    eprintln!("{rounds} full matrices probed during the restart, all as expected");
}

#[test]
fn etcd_killed_and_restarted() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let lab = Lab::new("ed");
    lab.build(&["--datastore", "etcd"]);
    lab.apply_raw(Y_FROM_X);
    wait_matrix(&lab, expected_y_from_x, Duration::from_secs(10));
    let etcd: Vec<u32> = lab
        .processes()
        .into_iter()
        .filter(|(_, c)| c.contains("etcd --name lab") && !c.contains(" supervise "))
        .map(|(p, _)| p)
        .collect();
    assert_eq!(etcd.len(), 1, "{:?}", lab.processes());
    Command::new("kill")
        .args(["-9", &etcd[0].to_string()])
        .status()
        .unwrap();
    // Enforcement does not depend on the datastore.
    let w = wrong(
        &lab.matrix_with(&["--port", "80", "--timeout-ms", "400"]),
        expected_y_from_x,
    );
    assert!(w.is_empty(), "with etcd down: {w:?}");
    // Its supervisor restarts it; a change made afterwards is applied.
    let t = Instant::now();
    loop {
        let f = lab.dir.join("policy.yaml");
        std::fs::write(
            &f,
            "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: from-x, namespace: y}
spec:
  selector: all()
  ingress:
  - action: Allow
    source: {namespaceSelector: \"ns in {'x', 'z'}\"}",
        )
        .unwrap();
        let ok = Command::new(bin())
            .args(["lab", "ctl", "--name", &lab.name, "--state-dir"])
            .arg(&lab.dir)
            .args(["--", "apply", "-f"])
            .arg(&f)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        if ok {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "could not apply a change within 30 s of killing etcd (it should have restarted)"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    wait_matrix(
        &lab,
        |from, to| from == to || !to.starts_with("y/") || !from.starts_with("y/"),
        Duration::from_secs(20),
    );
}

#[test]
fn down_after_the_lab_was_killed_leaves_nothing() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let lab = Lab::new("kd");
    let mut up = lab
        .cmd(&["up"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it somewhere in the middle of building.
    let t = Instant::now();
    while lab.namespaces().len() < 4 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    up.kill().unwrap();
    up.wait().unwrap();
    assert!(
        !lab.namespaces().is_empty(),
        "the lab should have started building"
    );
    let out = lab.cmd(&["down"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        lab.namespaces().is_empty(),
        "namespaces left: {:?}",
        lab.namespaces()
    );
    assert!(
        lab.processes().is_empty(),
        "processes left: {:?}",
        lab.processes()
    );
    assert!(!lab.dir.exists(), "state directory left");
}
