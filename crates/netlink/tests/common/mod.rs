//! What the kernel tests of this crate share: a "node" namespace with a veth to a "pod"
//! namespace, and an nftables ruleset loaded in the node.
#![allow(clippy::unwrap_used, dead_code)]

use std::io::Write;

use margay_testkit::netns::Netns;

/// `node` (`node_addr` on veth-a) and `pod` (`pod_addr` on veth-b), both /30, linked.
pub fn node_and_pod(prefix: &str, node_addr: &str, pod_addr: &str) -> (Netns, Netns) {
    let node = Netns::new(&format!("{prefix}-node")).unwrap();
    node.add_veth("veth-a", "veth-b", &[&format!("{node_addr}/30")])
        .unwrap();
    let pod = Netns::new(&format!("{prefix}-pod")).unwrap();
    node.ip(&["link", "set", "veth-b", "netns", pod.name()])
        .unwrap();
    pod.add_addr("veth-b", &format!("{pod_addr}/30")).unwrap();
    pod.set_up("veth-b").unwrap();
    (node, pod)
}

/// Loads `rules` with `nft -f -` in `ns`.
pub fn nft(ns: &Netns, rules: &str) {
    let out = ns
        .exec("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(rules.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "nft: {out:?}");
}

/// The namespace's file, for `margay_netlink::netns::run_in`.
pub fn file(ns: &Netns) -> std::fs::File {
    std::fs::File::open(format!("/var/run/netns/{}", ns.name())).unwrap()
}
