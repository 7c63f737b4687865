//! Restarting the eBPF driver does not touch traffic (root; every namespace is the test's
//! own, on a private bpffs). A node namespace with a server pod, a client the policy allows
//! and one it denies; probes run every 20 ms from both for the whole restart: the driver is
//! dropped without cleanup (as a killed Felix leaves its pins), stays down, and a new driver
//! with a fresh calculation graph starts on the same pin directory and reaches in-sync.
//! Zero allowed probes may fail, zero denied ones may get through, and a TCP connection
//! established before the restart must carry data after it.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use margay_api::{Resource, decode_one};
use margay_bpf::compile::CompileConfig;
use margay_calc::{CalcConfig, CalcGraph, Message};
use margay_dataplane::DataplaneDriver;
use margay_dataplane::bpf_driver::{BpfDriver, BpfDriverConfig};
use margay_testkit::netns::{Netns, is_root};

const NODE: &str = "nodea";
const SERVER: &str = "10.65.0.1:80";

/// Runs `f` on a thread that joined the namespace at `/run/netns/<name>`.
fn spawn_in_ns<R: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> std::thread::JoinHandle<R> {
    let path = format!("/run/netns/{name}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
}

fn in_ns<R: Send>(ns: &Netns, f: impl FnOnce() -> R + Send) -> R {
    let path = format!("/run/netns/{}", ns.name());
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A bpffs instance of the test's own, unmounted on drop (which releases the pinned links
/// and maps: nothing outlives the test).
struct PrivateBpffs(tempfile::TempDir);

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

/// Sets the stop flag and joins the threads on drop, so a failing assertion never leaves
/// a thread probing.
struct Threads {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Threads {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn res(yaml: &str) -> Resource {
    let r = decode_one(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r.validate().unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r
}

fn resources() -> Vec<Resource> {
    let mut out = vec![res("apiVersion: projectcalico.org/v3
kind: Profile
metadata: {name: kns.prod}
spec:
  ingress: []
  egress: [{action: Allow}]")];
    for (pod, ip, iface, app) in [
        ("web", "10.65.0.1", "caliweb0", "web"),
        ("client", "10.65.0.3", "calicli0", "client"),
        ("bad", "10.65.0.4", "calibad0", "bad"),
    ] {
        out.push(res(&format!(
            "apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: {NODE}-k8s-{pod}-eth0
  namespace: prod
  labels: {{app: {app}}}
spec:
  orchestrator: k8s
  node: {NODE}
  pod: {pod}
  endpoint: eth0
  interfaceName: {iface}
  ipNetworks: [{ip}/32]
  profiles: [kns.prod]"
        )));
    }
    out.push(res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: web-from-client, namespace: prod}
spec:
  selector: app == 'web'
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: app == 'client'}
    destination: {ports: [80]}"));
    out
}

/// What a starting Felix sends its driver: the whole datastore, then in-sync.
fn snapshot() -> Vec<Message> {
    let mut g = CalcGraph::new(CalcConfig {
        hostname: NODE.into(),
        ..CalcConfig::default()
    });
    for r in resources() {
        g.on_update(&r.key(), Some(r.clone()));
    }
    g.on_in_sync();
    g.flush()
}

fn config(fs: &PrivateBpffs) -> BpfDriverConfig {
    BpfDriverConfig {
        pin_dir: fs.0.path().join(NODE),
        bpffs_mount: Some(fs.0.path().to_path_buf()),
        compile: CompileConfig::default(),
        routing: None,
        route_refresh_interval: Duration::ZERO,
        status_prefix: None,
        global_sysctls: vec![],
        interfaces: None,
        workload_prefixes: vec!["cali".into()],
        host_nft: None,
    }
}

fn connect(timeout: Duration) -> Option<TcpStream> {
    let addr: SocketAddr = SERVER.parse().unwrap();
    TcpStream::connect_timeout(&addr, timeout).ok()
}

#[test]
fn a_restart_under_probing_drops_no_allowed_flow_admits_no_denied_one_and_keeps_connections() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let fs = PrivateBpffs(tempfile::tempdir().unwrap());
    let node = Netns::new("bpfr-node").unwrap();
    node.sysctl("net.ipv4.ip_forward", "1").unwrap();
    // Any default route: proxy ARP for 169.254.1.1 needs one.
    node.add_veth("uplink0", "uplink1", &["192.0.2.1/24"])
        .unwrap();
    node.ip(&["route", "add", "default", "via", "192.0.2.254"])
        .unwrap();
    let web = node.add_pod("bpfr-web", "10.65.0.1", "caliweb0").unwrap();
    let client = node
        .add_pod("bpfr-client", "10.65.0.3", "calicli0")
        .unwrap();
    let bad = node.add_pod("bpfr-bad", "10.65.0.4", "calibad0").unwrap();

    let server_stop = Arc::new(AtomicBool::new(false));
    let mut server = Threads {
        stop: server_stop.clone(),
        handles: vec![],
    };
    // An echo server in the web pod.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    {
        let stop = server_stop;
        server.handles.push(spawn_in_ns(web.name(), move || {
            let l = TcpListener::bind(SERVER).unwrap();
            l.set_nonblocking(true).unwrap();
            ready_tx.send(()).unwrap();
            let mut conns: Vec<TcpStream> = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                if let Ok((c, _)) = l.accept() {
                    c.set_nonblocking(true).unwrap();
                    conns.push(c);
                }
                conns.retain_mut(|c| {
                    let mut buf = [0u8; 64];
                    match c.read(&mut buf) {
                        Ok(0) => false,
                        Ok(n) => c.write_all(&buf[..n]).is_ok(),
                        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                    }
                });
                std::thread::sleep(Duration::from_millis(1));
            }
        }));
    }
    ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();

    let d1 = in_ns(&node, || {
        let (mut d, _) = BpfDriver::new(config(&fs)).unwrap();
        d.apply(&snapshot()).unwrap();
        d
    });
    assert_eq!(d1.attached().len(), 3);
    let pins = std::fs::read_dir(fs.0.path().join(NODE).join("links"))
        .unwrap()
        .count();
    assert_eq!(pins, 6, "both hooks' links pinned per interface");

    // Before the restart: the policy holds, and a connection is established.
    let established = in_ns(&client, || {
        let mut s = connect(Duration::from_secs(2)).expect("client -> web:80 is allowed");
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.write_all(b"before").unwrap();
        let mut buf = [0u8; 6];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"before");
        s
    });
    assert!(
        in_ns(&bad, || connect(Duration::from_millis(300))).is_none(),
        "bad -> web:80 is denied"
    );

    // Probing from both clients for the whole restart.
    let stop = Arc::new(AtomicBool::new(false));
    let mut probes = Threads {
        stop: stop.clone(),
        handles: vec![],
    };
    // Indexed by "connected": [failed, ok] and [refused, got through].
    let allowed = [0, 1].map(|_| Arc::new(AtomicUsize::new(0)));
    let denied = [0, 1].map(|_| Arc::new(AtomicUsize::new(0)));
    for (ns, counts, timeout) in [
        (client.name(), allowed.clone(), Duration::from_millis(500)),
        (bad.name(), denied.clone(), Duration::from_millis(100)),
    ] {
        let stop = stop.clone();
        probes.handles.push(spawn_in_ns(ns, move || {
            // Bounded: the stop flag, or a minute at most.
            let end = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                let i = usize::from(connect(timeout).is_some());
                counts[i].fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(300));

    // The kill: no cleanup runs; the pins keep the programs and maps.
    drop(d1);
    std::thread::sleep(Duration::from_millis(500));

    let started = Instant::now();
    let d2 = in_ns(&node, || {
        let (mut d, _) = BpfDriver::new(config(&fs)).unwrap();
        let loaded = started.elapsed();
        let (adopted, links) = d.restore_report().clone();
        assert_eq!(adopted.endpoints, 3, "{adopted:?}");
        assert_eq!(links.interfaces, 3, "{links:?}");
        assert_eq!(
            links.programs_replaced, 0,
            "same code: links kept as they are"
        );
        d.apply(&snapshot()).unwrap();
        eprintln!(
            "restart: loaded and adopted in {loaded:?}, in-sync in {:?}; first sync: {:?}",
            started.elapsed(),
            d.last_report()
        );
        d
    });
    std::thread::sleep(Duration::from_millis(500));
    drop(probes);

    let [failed, ok] = allowed.map(|c| c.load(Ordering::SeqCst));
    let [refused, through] = denied.map(|c| c.load(Ordering::SeqCst));
    eprintln!(
        "allowed probes: {ok} ok, {failed} failed; denied probes: {refused} refused, {through} through"
    );
    assert_eq!(failed, 0, "an allowed probe failed during the restart");
    assert_eq!(through, 0, "a denied probe got through during the restart");
    assert!(ok >= 20 && refused >= 5, "the probes ran: {ok} / {refused}");

    // The driver's status, and a conntrack sweep: the established flow's entry stays.
    let mut d2 = d2;
    let st = d2.status();
    assert_eq!(
        (st.interfaces_attached, st.endpoints, st.restored_interfaces),
        (3, 3, 3),
        "{st:?}"
    );
    let gc = d2.ct_gc();
    assert!(gc.live >= 1, "{gc:?}");
    assert_eq!(
        d2.status_handle().get().endpoints,
        3,
        "published after the apply"
    );
    // The connection established before the restart still carries data.
    in_ns(&client, move || {
        let mut s = established;
        s.write_all(b"after!").unwrap();
        let mut buf = [0u8; 6];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"after!");
    });
    drop(server);
    assert_eq!(d2.attached().len(), 3);
    drop(d2);
}
