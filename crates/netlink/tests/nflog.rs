//! NFLOG from a real kernel (root): an nftables rule logs a ping with a prefix to a group; the
//! reader bound to that group in the namespace gets the prefix and the packet's headers.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::process::Command;
use std::time::{Duration, Instant};

use margay_netlink::nflog::Nflog;
use margay_testkit::netns::is_root;

mod common;

#[test]
fn a_logged_packet_arrives_with_its_rules_prefix() {
    if !is_root() {
        eprintln!("NOT RUN: needs root (network namespaces, nftables)");
        return;
    }
    let (node, pod) = common::node_and_pod("nflog", "10.9.0.1", "10.9.0.2");
    let rules = "table inet mgy_nflog_test {\n  chain input {\n    type filter hook input priority 0; policy accept;\n    ip saddr 10.9.0.2 icmp type echo-request log prefix \"API0|gnp/allow-ping\" group 7 snaplen 80 accept\n  }\n}\n";
    common::nft(&node, rules);
    let ns_file = common::file(&node);
    let pod_name = pod.name().to_string();
    let packets = margay_netlink::netns::run_in(&ns_file, move || {
        let mut log = Nflog::bind(7, 80)?;
        // A second reader of the same group is refused, not silently starved.
        let second = Nflog::bind(7, 80);
        assert!(second.is_err(), "two readers bound one group");
        let ping = Command::new("ip")
            .args([
                "netns", "exec", &pod_name, "ping", "-c", "3", "-i", "0.2", "-W", "1", "10.9.0.1",
            ])
            .output()?;
        assert!(ping.status.success(), "ping: {ping:?}");
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 3 && Instant::now() < deadline {
            got.extend(log.recv(Duration::from_millis(200))?);
        }
        Ok(got)
    })
    .unwrap();
    assert_eq!(packets.len(), 3, "{packets:?}");
    for p in &packets {
        assert_eq!(p.group, 7);
        assert_eq!(p.prefix, "API0|gnp/allow-ping");
        assert_eq!(p.hw_protocol, Some(0x0800));
        assert!(p.indev.is_some());
        // The IPv4 header: version 4, protocol ICMP, source 10.9.0.2, within the snaplen.
        assert!(
            p.payload.len() >= 28 && p.payload.len() <= 80,
            "{}",
            p.payload.len()
        );
        assert_eq!(p.payload[0] >> 4, 4);
        assert_eq!(p.payload[9], 1);
        assert_eq!(&p.payload[12..16], &[10, 9, 0, 2]);
    }
}
