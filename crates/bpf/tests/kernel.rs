//! The programs in the kernel (root): verifier acceptance with the largest policy the limits
//! allow, fail-closed interfaces, allow/deny, conntrack for replies and an atomic policy
//! flip, with real probes between pod namespaces behind a node namespace the test creates.
//! Maps are pinned in a private bpffs mounted on a temporary directory (unmounted on drop);
//! programs are attached only inside the test's node namespace.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use margay_bpf::layout::*;
use margay_bpf::loader::{AttachMode, BpfMaps, ensure_bpffs};
use margay_bpf::sync::Kernel;
use margay_testkit::netns::{Netns, is_root};

/// A bpffs instance of the test's own, unmounted on drop.
struct PrivateBpffs(tempfile::TempDir);

impl PrivateBpffs {
    fn new() -> PrivateBpffs {
        let d = tempfile::tempdir().unwrap();
        assert!(ensure_bpffs(d.path()).unwrap(), "mounted a fresh bpffs");
        PrivateBpffs(d)
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

/// Runs `f` on a thread that joined `ns` (checked): every attach happens there.
fn in_ns<R: Send>(ns: &Netns, f: impl FnOnce() -> R + Send) -> R {
    use std::os::unix::fs::MetadataExt;
    let path = format!("/run/netns/{}", ns.name());
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let want = std::fs::metadata(&path).unwrap().ino();
            let have = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
            assert_eq!(want, have, "setns into {path} did not take effect");
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

struct Listeners(Vec<Child>);

impl Drop for Listeners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Topo {
    node: Netns,
    pods: Vec<(Netns, &'static str)>,
    _l: Listeners,
}

const PODS: [(&str, &str); 2] = [("10.66.0.1", "calia0"), ("10.66.0.2", "calib0")];

fn topo(prefix: &str) -> Topo {
    let node = Netns::new(&format!("{prefix}-node")).unwrap();
    node.sysctl("net.ipv4.ip_forward", "1").unwrap();
    node.add_veth("uplink0", "uplink1", &["192.0.2.1/24"])
        .unwrap();
    node.ip(&[
        "route",
        "add",
        "default",
        "via",
        "192.0.2.254",
        "dev",
        "uplink0",
    ])
    .unwrap();
    let mut pods = Vec::new();
    let mut l = Vec::new();
    for (i, (ip, iface)) in PODS.iter().enumerate() {
        let pod = node.add_pod(&format!("{prefix}-p{i}"), ip, iface).unwrap();
        for port in ["80", "81"] {
            l.push(
                pod.exec("nc")
                    .args(["-l", "-k", "-p", port])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        pods.push((pod, *ip));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (pod, _) in &pods {
        loop {
            let out = pod.exec("ss").args(["-ltn"]).output().unwrap();
            let t = String::from_utf8_lossy(&out.stdout).into_owned();
            if t.contains(":80 ") && t.contains(":81 ") {
                break;
            }
            assert!(Instant::now() < deadline, "listeners did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Topo {
        node,
        pods,
        _l: Listeners(l),
    }
}

fn tcp(t: &Topo, from: usize, to: usize, port: u16) -> bool {
    t.pods[from]
        .0
        .exec("timeout")
        .args([
            "0.7",
            "nc",
            "-z",
            "-w",
            "1",
            t.pods[to].1,
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn allow_all() -> Vec<Rule> {
    vec![Rule {
        action: ACT_ALLOW,
        ..Rule::default()
    }]
}

fn allow_tcp_port(port: u16) -> Vec<Rule> {
    vec![Rule {
        action: ACT_ALLOW,
        flags: F_PROTO,
        proto: 6,
        dst: Side {
            ports: vec![(port, port)],
            ..Side::default()
        },
        ..Rule::default()
    }]
}

/// Writes `rules` per hook as a block (id and rule slot `slot_base + hook`) and a one-step
/// list (step slot `slot_base + 2 + hook`; no step for no rules: deny), then points the
/// interface's entry at the step lists.
fn program(k: &mut BpfMaps, iface: &str, slot_base: u32, hooks: [Vec<Rule>; 2]) {
    let ifindex = k.ifindex(iface).unwrap();
    k.attach(iface, ifindex).unwrap();
    let mut count = [0u32; 2];
    for (h, rules) in hooks.iter().enumerate() {
        let slot = slot_base + h as u32;
        for (i, r) in rules.iter().enumerate() {
            k.put_rule(slot, i as u32, r).unwrap();
        }
        if rules.is_empty() {
            continue;
        }
        k.put_block(
            slot,
            &Block {
                slot,
                count: rules.len() as u32,
            },
        )
        .unwrap();
        let step = StepEnc {
            kind: STEP_BLOCK,
            block: slot,
            pass_to: 1,
        };
        k.put_step(slot_base + 2 + h as u32, 0, &step).unwrap();
        count[h] = 1;
    }
    k.put_endpoint(
        ifindex,
        &Endpoint {
            slot: [slot_base + 2, slot_base + 3],
            count,
            flags: 0,
        },
    )
    .unwrap();
}

#[test]
fn programs_enforce_fail_closed_ports_replies_and_an_atomic_flip() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let fs = PrivateBpffs::new();
    let t = topo("bpfk");
    // Both directions work before any program.
    assert!(tcp(&t, 0, 1, 80));
    in_ns(&t.node, || {
        let mut k = BpfMaps::load(&fs.path().join("nodea")).unwrap();
        assert!(
            fs.path().join("nodea/mgy_eps").exists(),
            "maps pinned per node"
        );
        // b gets programs but no endpoint entry: fail closed, both ways.
        let ib = k.ifindex("calib0").unwrap();
        k.attach("calib0", ib).unwrap();
        assert!(k.attached().all(|(_, _, m)| m == AttachMode::Tcx));
        assert!(
            !tcp(&t, 0, 1, 80),
            "an interface without an endpoint entry drops"
        );
        // b: ingress allows tcp/80 only; egress allows everything. The reply to a's
        // connection passes b's egress hook by conntrack too.
        program(&mut k, "calib0", 10, [allow_all(), allow_tcp_port(80)]);
        assert!(tcp(&t, 0, 1, 80));
        assert!(!tcp(&t, 0, 1, 81));
        // b's egress now denies everything new: a -> b:80 still works (replies are
        // established), b -> a does not.
        program(&mut k, "calib0", 20, [vec![], allow_tcp_port(80)]);
        assert!(tcp(&t, 0, 1, 80), "replies pass without policy");
        assert!(!tcp(&t, 1, 0, 80), "new flows from b are denied");
        // Per-rule counters: the Allow rule of b's ingress block (slot 21, rule 0) counted
        // the new flows it decided; the established flows' later packets are not counted.
        let (p, bytes) = k.counters().get(&(21, 0)).copied().unwrap_or_default();
        assert!(p >= 1 && bytes >= 40 * p, "{p} packets, {bytes} bytes");
        assert_eq!(
            k.counters().get(&(11, 0)).map(|c| c.0),
            Some(1),
            "slot 11 (port 80 at base 10) allowed a's one connection: one SYN judged"
        );
        // The flip: port 81 instead of 80, in one endpoint write.
        program(&mut k, "calib0", 30, [allow_all(), allow_tcp_port(81)]);
        assert!(tcp(&t, 0, 1, 81));
        assert!(!tcp(&t, 0, 1, 80));
        drop(k);
    });
    // The loader is gone (a killed Felix): the pinned links and maps go on enforcing.
    assert!(tcp(&t, 0, 1, 81));
    assert!(!tcp(&t, 0, 1, 80), "still enforced with nobody running");
    in_ns(&t.node, || {
        // A new loader whose programs "changed": the links are kept, their programs
        // replaced in place, and the maps' contents come back.
        let mut k = BpfMaps::load_with(&fs.path().join("nodea"), true).unwrap();
        let r = k.link_restore().clone();
        assert_eq!((r.interfaces, r.programs_replaced), (1, 2), "{r:?}");
        let restored = k.take_restored();
        assert_eq!(restored.endpoints.len(), 1);
        // program() never deletes: the three programmings left 5 rules (2 live).
        assert_eq!(restored.rules.len(), 5);
        assert_eq!((restored.blocks.len(), restored.steps.len()), (5, 5));
        assert!(tcp(&t, 0, 1, 81));
        assert!(
            !tcp(&t, 0, 1, 80),
            "the replaced programs enforce the same maps"
        );
        // Sweeping what nobody claims detaches it; nothing is left pinned.
        assert_eq!(k.sweep(&BTreeSet::new()), 1);
        assert_eq!(
            std::fs::read_dir(fs.path().join("nodea/links"))
                .unwrap()
                .count(),
            0
        );
        drop(k);
    });
    assert!(tcp(&t, 0, 1, 80), "swept: traffic flows again");
    // Switching the dataplane off: removing the pins detaches the programs.
    in_ns(&t.node, || {
        let mut k = BpfMaps::load(&fs.path().join("nodea")).unwrap();
        program(&mut k, "calib0", 40, [allow_all(), allow_tcp_port(81)]);
    });
    assert!(
        !tcp(&t, 0, 1, 80),
        "the pinned programs enforce with nobody running"
    );
    let n = margay_bpf::inspect::remove_pins(&fs.path().join("nodea")).unwrap();
    assert!(n >= 2 + 7, "two link pins and the maps: {n}");
    assert!(!fs.path().join("nodea").exists());
    assert!(tcp(&t, 0, 1, 80), "no program left: traffic flows");
}

/// The per-hook index in the kernel: a packet walks only the blocks its (protocol,
/// destination port) can match, merged with the default range by step index, Pass skipping
/// the refs below its target. Proven by a hole only the linear walk meets.
#[test]
fn an_indexed_hook_walks_only_the_blocks_for_the_packets_port() {
    use margay_bpf::index::{DEFAULT_IDX, build, summary};
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let fs = PrivateBpffs::new();
    let t = topo("bpfi");
    in_ns(&t.node, || {
        let mut k = BpfMaps::load(&fs.path().join("nodei")).unwrap();
        let ib = k.ifindex("calib0").unwrap();
        k.attach("calib0", ib).unwrap();
        let mut pass80 = allow_tcp_port(80);
        pass80[0].action = ACT_PASS;
        let deny81 = {
            let mut r = allow_tcp_port(81);
            r[0].action = ACT_DENY;
            r
        };
        // Blocks 1: pass tcp/80, 2: allow tcp/80, 4: allow all (b's egress); block 3 is
        // never written (a hole: the program fails closed on it).
        for (id, slot, rules) in [(1, 100, &pass80), (2, 101, &allow_tcp_port(80))] {
            k.put_rule(slot, 0, &rules[0]).unwrap();
            k.put_block(id, &Block { slot, count: 1 }).unwrap();
        }
        k.put_rule(102, 0, &allow_all()[0]).unwrap();
        k.put_block(
            4,
            &Block {
                slot: 102,
                count: 1,
            },
        )
        .unwrap();
        let block = |block, pass_to| StepEnc {
            kind: STEP_BLOCK,
            block,
            pass_to,
        };
        k.put_step(110, 0, &block(4, 1)).unwrap();
        // b's ingress: 0 the hole (keyed 81), 1 pass tcp/80 (to 3), 2 the tier's deny,
        // 3 allow tcp/80.
        let steps = [
            block(3, 3),
            block(1, 3),
            StepEnc {
                kind: STEP_DENY,
                block: 0,
                pass_to: 0,
            },
            block(2, 4),
        ];
        for (i, st) in steps.iter().enumerate() {
            k.put_step(111, i as u32, st).unwrap();
        }
        let sums = [
            summary(&deny81),
            summary(&pass80),
            summary(&allow_tcp_port(80)),
        ];
        let index = build(&[Some(&sums[0]), Some(&sums[1]), None, Some(&sums[2])]);
        assert!(!index.is_empty());
        for (idx, st) in &index {
            k.put_step(111, *idx, st).unwrap();
        }
        k.put_endpoint(
            ib,
            &Endpoint {
                slot: [110, 111],
                count: [1, 4],
                flags: 0,
            },
        )
        .unwrap();
        // Port 80: the hole is not on its walk; the Pass jumps over the tier's deny.
        assert!(tcp(&t, 0, 1, 80), "the indexed walk allows tcp/80");
        // Port 81: its one keyed step is the hole: fail closed.
        assert!(!tcp(&t, 0, 1, 81));
        // Without the index (its default entry deleted) the linear walk meets the hole.
        k.del_step(111, DEFAULT_IDX).unwrap();
        assert!(!tcp(&t, 0, 1, 80), "the linear walk fails closed at step 0");
        drop(k);
    });
    margay_bpf::inspect::remove_pins(&fs.path().join("nodei")).unwrap();
}

/// The largest rule the limits allow, `MAX_RULES` times; the packet matches none until the
/// last, so the loop runs to its bound.
#[test]
fn the_largest_policy_loads_passes_the_verifier_and_is_evaluated_to_the_end() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let fs = PrivateBpffs::new();
    let t = topo("bpfbig");
    in_ns(&t.node, || {
        let mut k = BpfMaps::load(&fs.path().join("big")).unwrap();
        // Set 1 holds a's address; sets 2..=8 hold nothing relevant.
        let mut sets: BTreeMap<u32, BTreeSet<IpSetEntry>> = BTreeMap::new();
        let e = IpSetEntry {
            set_id: 1,
            addr: ip(PODS[0].0),
            prefix: Some(32),
            port: 0,
            proto: 0,
        };
        sets.entry(1).or_default().insert(e);
        k.put_set_entry(&e).unwrap();
        let full_side = |pos: u32| Side {
            sets: vec![pos; MAX_SETS],
            not_sets: vec![2; MAX_SETS],
            named: vec![3; MAX_NAMED],
            not_named: vec![4; MAX_NAMED],
            // Port 80 only in the last range: every range is compared.
            ports: (0..MAX_PORTS as u16)
                .map(|i| {
                    if i == MAX_PORTS as u16 - 1 {
                        (80, 80)
                    } else {
                        (1000 + i, 1000 + i)
                    }
                })
                .collect(),
            not_ports: vec![(7, 7); MAX_PORTS],
        };
        let miss = Rule {
            action: ACT_ALLOW,
            flags: F_PROTO | F_NOT_PROTO,
            proto: 6,
            not_proto: 17,
            src: Side {
                // Set 5 is empty: the source never matches, after every other test ran.
                ..full_side(5)
            },
            dst: full_side(5),
            ..Rule::default()
        };
        let hit = Rule {
            src: Side {
                sets: vec![1],
                ..Side::default()
            },
            dst: Side {
                ports: vec![(80, 80)],
                ..Side::default()
            },
            ..miss.clone()
        };
        // One step enters the block: MAX_RULES - 1 rules fill the loop's bound.
        let mut rules = vec![miss; MAX_RULES - 2];
        rules.push(hit);
        let started = Instant::now();
        program(&mut k, "calib0", 0, [allow_all(), rules]);
        eprintln!(
            "wrote {} rules of {} bytes in {:?}",
            MAX_RULES - 1,
            RULE_SIZE,
            started.elapsed()
        );
        assert!(tcp(&t, 0, 1, 80), "the last rule allows");
        assert!(!tcp(&t, 0, 1, 81), "no rule allows");
    });
}

/// TCP states and the garbage collector: many short connections (the server closes first,
/// so the client's ports are free again at once) leave entries with both FINs seen, which
/// a pass at "now + 31 s" deletes (reset ones at "now + 41 s"), while an established
/// connection's entry stays and the connection keeps working; a new connection always gets
/// through.
#[test]
fn conntrack_tracks_tcp_state_and_gc_deletes_closed_flows_only() {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    // More than the client has even ephemeral ports for one destination (connect() takes
    // those first): ports get reused, so a SYN meets a closed flow's entry and must be
    // judged and recorded afresh.
    const SHORT: usize = 15_000;
    let fs = PrivateBpffs::new();
    let t = topo("bpfct");
    let mut k = in_ns(&t.node, || {
        let mut k = BpfMaps::load(&fs.path().join("nodea")).unwrap();
        // b accepts tcp/82 only.
        program(&mut k, "calib0", 10, [allow_all(), allow_tcp_port(82)]);
        k
    });
    // A server in b: echoes one byte on the first connection (kept open), closes every
    // other at once.
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = {
        let stop = stop.clone();
        let path = format!("/run/netns/{}", t.pods[1].0.name());
        std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let l = TcpListener::bind("10.66.0.2:82").unwrap();
            l.set_nonblocking(true).unwrap();
            let _ = ready_tx.send(());
            let mut kept: Option<TcpStream> = None;
            let end = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                match l.accept() {
                    Ok((c, _)) if kept.is_none() => kept = Some(c),
                    Ok((c, _)) => drop(c),
                    Err(_) => std::thread::sleep(Duration::from_micros(200)),
                }
                if let Some(c) = &mut kept {
                    c.set_nonblocking(true).unwrap();
                    let mut b = [0u8; 1];
                    if let Ok(1) = c.read(&mut b) {
                        let _ = c.write_all(&b);
                    }
                }
            }
        })
    };
    struct Stop(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
            if let Some(h) = self.1.take() {
                let _ = h.join();
            }
        }
    }
    let _server = Stop(stop, Some(server));
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the server started");
    let addr: SocketAddr = "10.66.0.2:82".parse().unwrap();
    let a = t.pods[0].0.name().to_string();
    let (mut kept, short_secs) = in_ns(&t.pods[0].0, move || {
        let _ = a;
        let mut kept = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        kept.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        kept.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        kept.read_exact(&mut b).unwrap();
        let started = Instant::now();
        for i in 0..SHORT {
            let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                .unwrap_or_else(|e| panic!("short connection {i} failed: {e}"));
            // Wait for the server's FIN, then close: both FINs pass the programs.
            c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = c.read(&mut b);
        }
        (kept, started.elapsed().as_secs_f64())
    });
    // Let the last FIN/ACKs pass.
    std::thread::sleep(Duration::from_millis(200));
    let entries = k.ct_entries();
    let tcp82: Vec<_> = entries.iter().filter(|(key, _)| key.dport == 82).collect();
    let closed = tcp82
        .iter()
        .filter(|(_, v)| v.flags & (CT_FIN_FWD | CT_FIN_REV) == CT_FIN_FWD | CT_FIN_REV)
        .count();
    let established = tcp82
        .iter()
        .filter(|(_, v)| v.flags == CT_REPLY_SEEN)
        .count();
    eprintln!(
        "{SHORT} short connections in {short_secs:.1} s; {} entries for tcp/82: {closed} closed, {established} established",
        tcp82.len()
    );
    assert_eq!(established, 1, "the kept connection");
    assert_eq!(
        closed + 1,
        tcp82.len(),
        "every short flow's entry saw both FINs"
    );
    assert!(
        tcp82.len() > 5_000,
        "one entry per client port: {}",
        tcp82.len()
    );
    // Now: nothing has expired yet.
    let now = margay_bpf::loader::monotonic_ns();
    assert_eq!(k.ct_gc(Some(now)).deleted, 0);
    // 31 s later the closed flows have expired (41 s: also the few a late RST ended, whose
    // timeout is 40 s), the established one has not.
    let gc = k.ct_gc(Some(now + 31_000_000_000));
    let reset = tcp82.iter().filter(|(_, v)| v.flags & CT_RST != 0).count();
    assert_eq!(gc.deleted + reset, closed, "{gc:?}, {reset} reset");
    let gc = k.ct_gc(Some(now + 41_000_000_000));
    eprintln!("gc: {gc:?}");
    assert_eq!(gc.deleted, reset, "{gc:?}");
    let left: Vec<_> = k
        .ct_entries()
        .into_iter()
        .filter(|(key, _)| key.dport == 82)
        .collect();
    assert_eq!(left.len(), 1, "only the established flow is left: {left:?}");
    // The established connection still works, and so does a new one.
    kept.write_all(b"y").unwrap();
    let mut b = [0u8; 1];
    kept.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"y");
    in_ns(&t.pods[0].0, || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("a new connection");
    });
    in_ns(&t.node, || k.remove_all());
}

/// Flow events (flow logs): one per new flow judged by policy, naming the rule (slot, index,
/// the rule's index in its policy), the tier's end or the end of the list; none for packets
/// conntrack passes; none while no reader has turned them on.
#[test]
fn new_flows_emit_one_event_naming_what_decided_and_established_packets_none() {
    use margay_bpf::flows::FlowReader;
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let fs = PrivateBpffs::new();
    let t = topo("bpfev");
    let pins = fs.path().join("nodef");
    in_ns(&t.node, || {
        let mut k = BpfMaps::load(&pins).unwrap();
        // b's ingress (hook TO_WL): block 11 = [deny tcp/81 (policy rule 3), allow tcp/80
        // (policy rule 5)], then a tier's default deny (step 1); egress allows everything.
        let ib = k.ifindex("calib0").unwrap();
        k.attach("calib0", ib).unwrap();
        let mut deny81 = allow_tcp_port(81).remove(0);
        deny81.action = ACT_DENY;
        deny81.rule_index = 3;
        let mut allow80 = allow_tcp_port(80).remove(0);
        allow80.rule_index = 5;
        for (i, r) in [deny81, allow80].iter().enumerate() {
            k.put_rule(11, i as u32, r).unwrap();
        }
        k.put_block(11, &Block { slot: 11, count: 2 }).unwrap();
        k.put_rule(10, 0, &allow_all()[0]).unwrap();
        k.put_block(10, &Block { slot: 10, count: 1 }).unwrap();
        let block = |b| StepEnc {
            kind: STEP_BLOCK,
            block: b,
            pass_to: 1,
        };
        k.put_step(12, 0, &block(10)).unwrap();
        k.put_step(13, 0, &block(11)).unwrap();
        let deny = StepEnc {
            kind: STEP_DENY,
            block: 0,
            pass_to: 0,
        };
        k.put_step(13, 1, &deny).unwrap();
        k.put_endpoint(
            ib,
            &Endpoint {
                slot: [12, 13],
                count: [1, 2],
                flags: 0,
            },
        )
        .unwrap();

        // Off (nobody reads): nothing is queued.
        assert!(tcp(&t, 0, 1, 80));
        let mut look = FlowReader::open_with(&pins, false).unwrap();
        let mut seen = Vec::new();
        look.poll(Duration::from_millis(50), 100, |e| seen.push(e));
        assert!(seen.is_empty(), "events while off: {seen:?}");
        drop(look);

        let mut r = FlowReader::open(&pins).unwrap();
        assert!(tcp(&t, 0, 1, 80), "allowed by rule 5");
        assert!(!tcp(&t, 0, 1, 81), "denied by rule 3");
        assert!(!tcp(&t, 0, 1, 82), "denied by the tier's end");
        let mut ev = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && !ev.iter().any(|e: &FlowEvent| e.dport == 82) {
            r.poll(Duration::from_millis(100), 1000, |e| ev.push(e));
        }
        // Late retransmissions of the denied SYNs, if any.
        r.poll(Duration::from_millis(100), 1000, |e| ev.push(e));
        let a = ip(PODS[0].0);
        let b = ip(PODS[1].0);
        assert!(ev.iter().all(|e| e.src == a && e.dst == b), "{ev:?}");
        let to = |port: u16| ev.iter().filter(|e| e.dport == port).collect::<Vec<_>>();
        let allowed = to(80);
        assert_eq!(
            allowed.len(),
            1,
            "one event for the allowed connection (its SYN), none for its established packets or replies: {ev:?}"
        );
        let e = allowed[0];
        assert_eq!((e.kind, e.action), (EV_RULE, ACT_ALLOW));
        assert_eq!((e.slot, e.idx, e.rule_index), (11, 1, 5));
        assert_eq!((e.hook, e.ifindex, e.proto), (HOOK_TO_WL as u8, ib, 6));
        assert!(e.len >= 40 && e.sport > 0, "{e:?}");
        let denied = to(81);
        assert!(!denied.is_empty(), "{ev:?}");
        for e in &denied {
            assert_eq!((e.kind, e.action), (EV_RULE, ACT_DENY));
            assert_eq!((e.slot, e.idx, e.rule_index), (11, 0, 3));
        }
        let end = to(82);
        assert!(!end.is_empty(), "{ev:?}");
        for e in &end {
            assert_eq!((e.kind, e.action, e.step), (EV_TIER_END, ACT_DENY, 1));
        }
        assert_eq!(ev.len(), 1 + denied.len() + end.len(), "{ev:?}");
        assert_eq!(r.drops(), 0);
        assert_eq!(r.malformed, 0);
        // The reader gone, events are off again.
        drop(r);
        assert!(tcp(&t, 0, 1, 80));
        let mut look = FlowReader::open_with(&pins, false).unwrap();
        let mut after = Vec::new();
        look.poll(Duration::from_millis(50), 100, |e| after.push(e));
        assert!(after.is_empty(), "events after the reader left: {after:?}");
    });
}
