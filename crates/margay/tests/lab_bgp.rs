#![allow(clippy::unwrap_used)]
//! BGP end to end on `margay lab --backend bird`, with the real BIRD 2 in every node's
//! namespace and `margay confd` writing its configuration:
//! - 3 nodes in Calico's node-to-node mesh route pod traffic across nodes without
//!   encapsulation (routes `proto bird`, no `vxlan.calico`); the time to a full mesh is
//!   measured and bounded (≤ 10 s);
//! - a BGPPeer change reaches BIRD (`show protocols` lists it) in ≤ 1 s;
//! - a Node naming an address the node does not have (the multi-NIC mistake) makes
//!   `margay node health --bird-ready` fail naming both addresses;
//! - a top-of-rack router (its own AS) learns every node's block and withdraws a node's
//!   block when that node's BIRD goes away;
//! - switching the mesh off for a route reflector (BGPConfiguration, routeReflectorClusterID,
//!   a BGPPeer selecting it) keeps traffic flowing.
//!
//! Root only (skipped otherwise), and needs bird2 (scripts/setup). Every lab has its own
//! name (`mgy-<name>-…`) and is removed on drop, pass or fail; every wait is bounded. The labs
//! run one at a time so the timings measure margay, not the two tests competing for 2 cores.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lab_common::{Lab, Matrix, bin};
use margay_testkit::netns::is_root;

mod lab_common;

static ONE_LAB_AT_A_TIME: Mutex<()> = Mutex::new(());

fn can_run() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return false;
    }
    if Command::new("bird").arg("--version").output().is_err() {
        eprintln!("skipped: bird is not installed (scripts/setup installs bird2)");
        return false;
    }
    true
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

impl Lab {
    /// `lab up` with BIRD on 3 nodes; returns its output and how long it took.
    fn up_bird(&self, extra: &[&str]) -> (String, Duration) {
        let mut args = vec!["--backend", "bird", "--nodes", "3"];
        args.extend_from_slice(extra);
        self.build(&args)
    }

    fn netns(&self, node: &str) -> String {
        format!("mgy-{}-{node}", self.name)
    }

    fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node)
    }

    fn ip(&self, node: &str, args: &[&str]) -> String {
        let out = Command::new("ip")
            .arg("-n")
            .arg(self.netns(node))
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The node's own blocks (the blackholes Felix installs for them).
    fn blocks(&self, node: &str) -> Vec<String> {
        self.ip(node, &["route", "show", "proto", "80", "type", "blackhole"])
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect()
    }

    fn bgp_matrix(&self) -> Matrix {
        self.matrix_with(&["--timeout-ms", "500"])
    }

    /// Every pod reaches every other pod (no policy in these labs), within `limit`.
    fn wait_full_matrix(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let blocked: Vec<String> = self
                .bgp_matrix()
                .iter()
                .flat_map(|(a, row)| {
                    row.iter()
                        .filter(|(_, ok)| !**ok)
                        .map(move |(b, _)| format!("{a}->{b}"))
                })
                .collect();
            if blocked.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "still blocked after {limit:?}: {blocked:?}\n{}",
                self.diagnose()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn diagnose(&self) -> String {
        let mut s = String::new();
        for n in ["node1", "node2", "node3"] {
            s.push_str(&format!("== {n} routes\n{}", self.ip(n, &["route"])));
        }
        let out = self.cmd(&["status"]).output().unwrap();
        s.push_str(&text(&out));
        s
    }

    /// Every node's BGP sessions: (node, peer address, BGP state).
    fn sessions(&self) -> Vec<(String, String, String)> {
        let st = self.status();
        let mut out = Vec::new();
        for n in st["nodes"].as_array().unwrap() {
            for p in n["bgp"].as_array().cloned().unwrap_or_default() {
                out.push((
                    n["name"].as_str().unwrap().to_string(),
                    p["peerAddress"].as_str().unwrap_or("").to_string(),
                    p["bgpState"].as_str().unwrap_or("").to_string(),
                ));
            }
        }
        out
    }

    /// Waits until `check` holds for the sessions (bounded).
    fn wait_sessions(
        &self,
        what: &str,
        limit: Duration,
        check: impl Fn(&[(String, String, String)]) -> bool,
    ) -> Duration {
        let started = Instant::now();
        loop {
            let s = self.sessions();
            if check(&s) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < limit,
                "{what}: not within {limit:?}: {s:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `margay node health` inside a node's namespace, pointed at the node's BIRD.
    fn health(&self, node: &str, args: &[&str]) -> Output {
        let dir = self.node_dir(node);
        Command::new("ip")
            .args(["netns", "exec", &self.netns(node), bin(), "node", "health"])
            .args(args)
            .arg("--bird-socket")
            .arg(dir.join("bird.ctl"))
            .arg("--root")
            .arg(dir.join("root"))
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.dir.join("store.db"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The BIRD protocol names a node's BIRD runs.
    fn bird_protocols(&self, node: &str) -> Vec<String> {
        let mut c = match margay_bird::Client::connect(
            &self.node_dir(node).join("bird.ctl"),
            Duration::from_secs(2),
        ) {
            Ok(c) => c,
            Err(_) => return Vec::new(),
        };
        c.show_protocols()
            .map(|p| p.into_iter().map(|p| p.name).collect())
            .unwrap_or_default()
    }

    /// Stops a node's BIRD for good: its supervisor first (so nothing restarts it), then
    /// BIRD itself with SIGTERM, so it closes its sessions properly.
    fn stop_bird(&self, node: &str) {
        let dir = self.node_dir(node);
        let sup = std::fs::read_to_string(dir.join("bird.pid")).unwrap();
        let bird = std::fs::read_to_string(dir.join("bird.pidfile")).unwrap();
        for (sig, pid) in [("-KILL", sup.trim()), ("-TERM", bird.trim())] {
            let ok = Command::new("kill")
                .args([sig, pid])
                .status()
                .unwrap()
                .success();
            assert!(ok, "kill {sig} {pid}");
        }
    }
}

fn all_established(s: &[(String, String, String)], per_node: usize) -> bool {
    ["node1", "node2", "node3"].iter().all(|n| {
        let mine: Vec<_> = s.iter().filter(|(node, _, _)| node == n).collect();
        mine.len() >= per_node && mine.iter().all(|(_, _, st)| st == "Established")
    })
}

#[test]
fn mesh_peer_changes_address_mismatch_and_tor() {
    if !can_run() {
        return;
    }
    let _one = ONE_LAB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::new("bgp");
    let (up, up_took) = lab.up_bird(&["--tor"]);

    // (1) The mesh: established (lab up waits for it and reports when), bounded.
    let line = up
        .lines()
        .find(|l| l.contains("sessions established"))
        .unwrap_or_else(|| panic!("no BGP timing in:\n{up}"));
    let secs: f64 = line
        .split(" established ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the time in {line:?}"));
    eprintln!(
        "measured: full mesh (3 nodes + ToR) established {secs:.2} s after BIRD started; lab up took {:.2} s",
        up_took.as_secs_f64()
    );
    assert!(secs <= 10.0, "mesh took {secs} s: {line}");
    assert!(all_established(&lab.sessions(), 3), "{:?}", lab.sessions());

    // Cross-node pod traffic, unencapsulated, on BIRD's routes.
    lab.wait_full_matrix(Duration::from_secs(20));
    let routes = lab.ip("node1", &["route", "show", "proto", "bird"]);
    for (node, ip) in [("node2", "172.30.0.12"), ("node3", "172.30.0.13")] {
        for block in lab.blocks(node) {
            let want = format!("{block} via {ip} dev eth0 proto bird");
            assert!(
                lab.ip("node1", &["route"])
                    .lines()
                    .any(|l| l.trim().starts_with(&want)),
                "{want:?} not in node1's table:\n{routes}"
            );
        }
    }
    assert!(
        !lab.ip("node1", &["route", "show", "proto", "80"])
            .contains("via 172.30.0.1"),
        "Felix programmed a no-encap route itself"
    );
    for n in ["node1", "node2", "node3"] {
        assert!(
            lab.ip(n, &["link", "show", "vxlan.calico"]).is_empty(),
            "{n} has a VXLAN device"
        );
    }

    // `margay node health` and `margay ctl node status` on a healthy node.
    let h = lab.health("node1", &["--bird-live", "--bird-ready"]);
    assert!(h.status.success(), "{}", text(&h));
    assert!(
        text(&h).contains("bird is ready (all 3 BGP peers established)"),
        "{}",
        text(&h)
    );
    let dir = lab.node_dir("node1");
    let st = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.netns("node1"),
            bin(),
            "ctl",
            "node",
            "status",
        ])
        .arg("--bird-socket")
        .arg(dir.join("bird.ctl"))
        .arg("--bird6-socket")
        .arg(dir.join("bird6.ctl"))
        .output()
        .unwrap();
    let st = text(&st);
    for want in [
        "| 172.30.0.12  | node-to-node mesh | up    |",
        "| 172.30.0.13  | node-to-node mesh | up    |",
        "| 172.30.0.2   | global            | up    |",
        "Established",
    ] {
        assert!(st.contains(want), "{want:?} in\n{st}");
    }

    // (5) A BGPPeer change reaches BIRD within a second.
    let before = Instant::now();
    lab.apply_raw(
        "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata: {name: extra}\nspec: {node: node1, peerIP: 172.30.0.250, asNumber: 65001}\n",
    );
    let applied = Instant::now();
    let deadline = applied + Duration::from_secs(10);
    while !lab
        .bird_protocols("node1")
        .iter()
        .any(|p| p == "Node_172_30_0_250")
    {
        assert!(Instant::now() < deadline, "the new peer never reached BIRD");
        std::thread::sleep(Duration::from_millis(10));
    }
    let latency = applied.elapsed();
    eprintln!(
        "measured: BGPPeer applied -> listed by BIRD's show protocols: {} ms ({} ms including `margay ctl apply`)",
        latency.as_millis(),
        before.elapsed().as_millis()
    );
    assert!(latency <= Duration::from_secs(1), "{latency:?}");
    lab.ctl(&["delete", "bgppeer", "extra"]);

    // (4) The multi-NIC mistake: node3's Node names an address it does not have.
    let node3 = lab.ctl(&["get", "node", "node3", "-o", "yaml"]);
    assert!(node3.contains("ipv4Address: 172.30.0.13/24"), "{node3}");
    let strip = |y: &str| {
        y.lines()
            .filter(|l| !l.trim_start().starts_with("resourceVersion"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    lab.apply_raw(&strip(&node3).replace("172.30.0.13/24", "172.30.0.99/24"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let msg = loop {
        let h = lab.health("node3", &["--bird-ready", "--threshold-time", "0s"]);
        let t = text(&h);
        if !h.status.success() && t.contains("address mismatch") {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "health never reported the mismatch: {t}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("node3 health with the wrong address: {msg}");
    assert!(
        msg.contains("BIRD is not ready: BGP not established with"),
        "{msg}"
    );
    assert!(
        msg.contains("172.30.0.99 (Node \"node3\" spec.bgp.ipv4Address)")
            && msg.contains("172.30.0.13 on eth0"),
        "{msg}"
    );
    // Put it right: the mesh comes back.
    lab.apply_raw(&strip(&node3));
    lab.wait_sessions("mesh back after the fix", Duration::from_secs(30), |s| {
        all_established(s, 3)
    });

    // (3) The ToR has every node's block in its routing table...
    let tor_routes = || lab.ip("tor", &["route", "show", "proto", "bird"]);
    let has_block =
        |routes: &str, b: &str| routes.lines().any(|l| l.starts_with(&format!("{b} via ")));
    let mut blocks = BTreeMap::new();
    for n in ["node1", "node2", "node3"] {
        let b = lab.blocks(n);
        assert!(!b.is_empty(), "{n} has no block");
        blocks.insert(n, b);
    }
    // Nothing but the blocks: a pod /32 at the ToR would mean a node exports a workload route
    // besides its block (the CNI plugin's metric-0 route, below NormalRoutePriority, left next
    // to Felix's: Felix takes over the routes through its workloads' interfaces).
    let extra = |routes: &str| -> Vec<String> {
        routes
            .lines()
            .filter(|l| !blocks.values().flatten().any(|b| has_block(l, b)))
            .map(String::from)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = tor_routes();
        if blocks.values().flatten().all(|b| has_block(&r, b)) && extra(&r).is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ToR should route exactly the blocks {blocks:?}; besides them: {:?}\n{r}",
            extra(&r)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The reason, on the nodes: each pod has one route through its interface, Felix's.
    for n in ["node1", "node2", "node3"] {
        let all = lab.ip(n, &["route", "show"]);
        let workload: Vec<&str> = all.lines().filter(|l| l.contains(" dev cali")).collect();
        assert!(!workload.is_empty(), "{n} has no workload routes:\n{all}");
        assert!(
            workload
                .iter()
                .all(|l| l.contains(" proto 80 ") && l.trim_end().ends_with(" metric 1024")),
            "{n} has workload routes besides Felix's:\n{all}"
        );
    }
    // ... and withdraws node3's when node3's BIRD goes away.
    lab.stop_bird("node3");
    let stopped = Instant::now();
    let deadline = stopped + Duration::from_secs(30);
    loop {
        let r = tor_routes();
        if !blocks["node3"].iter().any(|b| has_block(&r, b)) {
            for b in blocks["node1"].iter().chain(&blocks["node2"]) {
                assert!(has_block(&r, b), "{b} went too:\n{r}");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ToR still routes node3's blocks {:?}:\n{r}",
            blocks["node3"]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "measured: node3's BIRD stopped -> its block withdrawn at the ToR in {} ms",
        stopped.elapsed().as_millis()
    );
}

#[test]
fn mesh_off_and_a_route_reflector_keep_traffic_flowing() {
    if !can_run() {
        return;
    }
    let _one = ONE_LAB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::new("bgprr");
    lab.up_bird(&[]);
    lab.wait_full_matrix(Duration::from_secs(20));

    // node1 becomes the route reflector; everyone peers with it; the mesh goes.
    let node1 = lab.ctl(&["get", "node", "node1", "-o", "yaml"]);
    let node1: String = node1
        .lines()
        .filter(|l| !l.trim_start().starts_with("resourceVersion"))
        .map(|l| {
            if l.trim_start().starts_with("ipv4Address:") {
                format!("{l}\n    routeReflectorClusterID: 244.0.0.1")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(node1.contains("routeReflectorClusterID"), "{node1}");
    lab.apply_raw(&node1);
    lab.ctl(&["label", "nodes", "node1", "route-reflector=true"]);
    lab.apply_raw(
        "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata: {name: peer-with-rr}\nspec:\n  nodeSelector: all()\n  peerSelector: route-reflector == 'true'\n",
    );
    lab.apply_raw(
        "apiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata: {name: default}\nspec: {nodeToNodeMeshEnabled: false}\n",
    );
    let took = lab.wait_sessions("route-reflector sessions", Duration::from_secs(30), |s| {
        let of = |n: &str| -> Vec<&(String, String, String)> {
            s.iter().filter(|(node, _, _)| node == n).collect()
        };
        // node1 has its two clients; each client has node1 only; no mesh left.
        of("node1").len() == 2
            && ["node2", "node3"].iter().all(|n| {
                let m = of(n);
                m.len() == 1 && m[0].1 == "172.30.0.11"
            })
            && s.iter().all(|(_, _, st)| st == "Established")
    });
    eprintln!(
        "measured: mesh -> route reflector sessions established in {} ms",
        took.as_millis()
    );
    let st = lab.status();
    for n in st["nodes"].as_array().unwrap() {
        for p in n["bgp"].as_array().unwrap() {
            assert_ne!(p["peerType"], "node-to-node mesh", "{p}");
        }
    }
    // Traffic flows, still on BIRD's routes: node2 reaches node3's pods through the
    // reflected route (next hop node3 itself).
    lab.wait_full_matrix(Duration::from_secs(30));
    for b in lab.blocks("node3") {
        let r = lab.ip("node2", &["route"]);
        assert!(
            r.lines()
                .any(|l| l.starts_with(&format!("{b} via 172.30.0.13 dev eth0 proto bird"))),
            "{b} via node3 not in node2's table:\n{r}"
        );
    }
}
