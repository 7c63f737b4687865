//! `margay bpf` reads a pin directory on a private bpffs (root): maps written through the
//! loader, nothing attached anywhere (the endpoint entry names `lo`'s index only to have an
//! interface to look up; no program runs on it).
#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;

use assert_cmd::Command;
use margay_bpf::layout::*;
use margay_bpf::loader::{BpfMaps, ensure_bpffs};
use margay_bpf::sync::Kernel;
use margay_testkit::netns::is_root;

struct PrivateBpffs(tempfile::TempDir);

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

fn margay() -> Command {
    Command::cargo_bin("margay").unwrap()
}

#[test]
fn a_missing_pin_dir_says_what_to_check() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let out = margay()
        .args(["bpf", "--pin-dir", missing.to_str().unwrap(), "programs"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is Felix running with BPFEnabled=true") && err.contains("nope"),
        "{err}"
    );
}

#[test]
fn bad_filters_are_refused_by_the_parser() {
    let out = margay()
        .args(["bpf", "conntrack", "--proto", "tcpp"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown protocol"));
}

#[test]
fn a_populated_pin_dir_is_listed_as_tables_and_json() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let fs = PrivateBpffs(tempfile::tempdir().unwrap());
    ensure_bpffs(fs.0.path()).unwrap();
    let pin = fs.0.path().join("node1");
    let lo: u32 = std::fs::read_to_string("/sys/class/net/lo/ifindex")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    {
        let mut k = BpfMaps::load(&pin).unwrap();
        let member = IpSetEntry {
            set_id: 7,
            addr: Ipv4Addr::new(10, 1, 0, 0),
            prefix: Some(16),
            port: 0,
            proto: 0,
        };
        k.put_set_entry(&member).unwrap();
        let rule = Rule {
            action: ACT_ALLOW,
            flags: F_PROTO,
            proto: 6,
            src: Side {
                sets: vec![7],
                ..Side::default()
            },
            dst: Side {
                ports: vec![(80, 80)],
                ..Side::default()
            },
            ..Rule::default()
        };
        k.put_rule(3, 0, &rule).unwrap();
        k.put_block(5, &Block { slot: 3, count: 1 }).unwrap();
        k.put_step(
            4,
            0,
            &StepEnc {
                kind: STEP_BLOCK,
                block: 5,
                pass_to: 1,
            },
        )
        .unwrap();
        k.put_step(
            4,
            1,
            &StepEnc {
                kind: STEP_DENY,
                block: 0,
                pass_to: 0,
            },
        )
        .unwrap();
        k.put_endpoint(
            lo,
            &Endpoint {
                slot: [9, 4],
                count: [0, 2],
                flags: 0,
            },
        )
        .unwrap();
    }
    let run = |args: &[&str]| {
        let out = margay()
            .arg("bpf")
            .args(["--pin-dir", pin.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let policy = run(&["policy", "lo"]);
    assert!(
        policy.contains("step 0: block 5 (pass continues at step 1)")
            && policy.contains("0: allow proto tcp src in sets 7 dst ports 80")
            && policy.contains("step 1: deny (end of tier)"),
        "{policy}"
    );
    let v: serde_json::Value = serde_json::from_str(&run(&["policy", "lo", "-o", "json"])).unwrap();
    assert_eq!(v["to_wl"][0]["block"], 5);
    assert_eq!(v["to_wl"][1]["kind"], "deny");
    assert_eq!(v["from_wl"].as_array().unwrap().len(), 0);
    let sets = run(&["ipsets"]);
    assert!(sets.contains("set 7: 10.1.0.0/16"), "{sets}");
    let v: serde_json::Value = serde_json::from_str(&run(&["ipsets", "-o", "json"])).unwrap();
    assert_eq!(v["7"][0], "10.1.0.0/16");
    let progs = run(&["programs"]);
    assert!(
        progs.contains("0 links, 1 endpoint entries, 1 rule blocks, 1 rules"),
        "{progs}"
    );
    let ct = run(&["conntrack", "--proto", "tcp", "--dst", "10.0.0.1"]);
    assert!(ct.contains("0 entries"), "{ct}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&run(&["conntrack", "-o", "json"])).unwrap(),
        serde_json::json!([])
    );
    // Every rule of every block, with zero counts until traffic (tests/kernel.rs counts).
    let counters = run(&["counters"]);
    assert!(
        counters.lines().any(|l| l.contains("allow proto tcp")
            && l.split_whitespace().take(4).eq(["5", "0", "0", "0"])),
        "{counters}"
    );
    let v: serde_json::Value = serde_json::from_str(&run(&["counters", "-o", "json"])).unwrap();
    assert_eq!(v[0]["block"], 5);
    assert_eq!(v[0]["packets"], 0);
    // Switching off: every map pin goes (nothing was attached here: the policy, flow-event
    // and service maps), then the directory.
    let pins = std::fs::read_dir(&pin)
        .unwrap()
        .filter(|e| {
            let e = e.as_ref().unwrap();
            e.file_name().to_string_lossy().starts_with("mgy_")
        })
        .count();
    assert!(pins >= 10, "{pins} pins");
    let gone = run(&["cleanup"]);
    assert!(gone.starts_with(&format!("removed {pins} pins")), "{gone}");
    assert!(!pin.exists());
    let out = margay()
        .args(["bpf", "--pin-dir", pin.to_str().unwrap(), "cleanup"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "nothing to clean: said so");
}
