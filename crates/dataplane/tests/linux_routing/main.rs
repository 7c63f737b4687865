#![allow(clippy::unwrap_used)]
//! The route and VXLAN managers against the real kernel, inside throw-away network namespaces.
//!
//! Needs root (CI runs as root); MARGAY_SKIP_ROOT_TESTS=1 skips these tests elsewhere.
//!
//! Network safety: every interface, address, route and neighbour is made inside namespaces
//! the test creates (`mgy-` prefix, deleted on drop, pass or fail). The managers run on a
//! thread that has joined the test namespace (`setns`) and checked that it did before doing
//! anything, so their netlink sockets can only see and change that namespace. Every wait is
//! bounded.

use std::os::unix::fs::MetadataExt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use margay_api::net::Cidr;
use margay_api::{Resource, decode_one};
use margay_calc::{CalcConfig, CalcGraph, Message, RouteSource, Vtep, vxlan_mac_for_node};
use margay_dataplane::linux::routes::{KernelRoute, RouteKey, RouteManager, RouteTarget};
use margay_dataplane::linux::routing::{Routing, RoutingConfig, RoutingReport};
use margay_dataplane::linux::vxlan::{DeviceChange, VxlanConfig, VxlanManager};
use margay_testkit::netns::{Netns, is_root};

/// How long one piece of work inside a namespace may take.
const IN_NS_TIMEOUT: Duration = Duration::from_secs(60);

fn root() -> bool {
    if is_root() {
        return true;
    }
    if std::env::var("MARGAY_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
        eprintln!("skipped: needs root (MARGAY_SKIP_ROOT_TESTS=1)");
        return false;
    }
    panic!("needs root (creates network namespaces); run as root or set MARGAY_SKIP_ROOT_TESTS=1");
}

/// Runs `f` on a fresh thread inside `ns`'s network namespace and returns its result; a panic
/// in `f` is re-raised here. The thread checks it really is in `ns` before calling `f`.
fn in_ns<R: Send + 'static>(ns: &Netns, f: impl FnOnce() -> R + Send + 'static) -> R {
    let path = format!("/run/netns/{}", ns.name());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = catch_unwind(AssertUnwindSafe(|| {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            // Never run the managers anywhere but in the test namespace.
            let want = std::fs::metadata(&path).unwrap().ino();
            let have = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
            assert_eq!(want, have, "setns into {path} did not take effect");
            f()
        }));
        let _ = tx.send(result);
    });
    match rx.recv_timeout(IN_NS_TIMEOUT) {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => resume_unwind(panic),
        Err(_) => panic!(
            "work inside {} did not finish in {IN_NS_TIMEOUT:?}",
            ns.name()
        ),
    }
}

fn sh(ns: &Netns, program: &str, args: &[&str]) -> String {
    let out = ns.exec(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} in {}: {}",
        ns.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn c(s: &str) -> Cidr {
    Cidr::parse(s).unwrap()
}

fn dev(dst: &str, ifname: &str, priority: u32) -> KernelRoute {
    KernelRoute {
        dst: c(dst),
        target: RouteTarget::Interface {
            ifname: ifname.into(),
        },
        priority,
        src: None,
    }
}

fn via(dst: &str, ifname: &str, gw: &str) -> KernelRoute {
    KernelRoute {
        dst: c(dst),
        target: RouteTarget::Gateway {
            ifname: ifname.into(),
            gateway: gw.parse().unwrap(),
            onlink: true,
        },
        priority: 0,
        src: None,
    }
}

fn has_line(text: &str, want: &str) -> bool {
    text.lines().any(|l| l.trim() == want)
}

fn vtep(node: &str, tunnel: &str, parent: &str) -> Vtep {
    Vtep {
        node: node.into(),
        mac: vxlan_mac_for_node(node),
        ipv4_addr: Some(tunnel.parse().unwrap()),
        parent_device_ip: Some(parent.parse().unwrap()),
        mac_v6: String::new(),
        ipv6_addr: None,
        parent_device_ipv6: None,
    }
}

fn res(yaml: &str) -> Resource {
    let r = decode_one(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r.validate().unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r
}

mod routes;
mod takeover;
mod two_nodes;
mod vxlan;
