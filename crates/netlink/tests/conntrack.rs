//! The conntrack dump from a real kernel (root): a TCP connection across a veth pair in a
//! namespace of the test's own, with accounting on, shows up with both tuples, its TCP state
//! and counters that grow with the data sent.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::io::{Read, Write};
use std::time::Duration;

use margay_netlink::conntrack::{CtEntry, dump};
use margay_testkit::netns::is_root;

mod common;

#[test]
fn a_connection_is_dumped_with_its_counters() {
    if !is_root() {
        eprintln!("NOT RUN: needs root (network namespaces, nftables)");
        return;
    }
    let (node, pod) = common::node_and_pod("ct", "10.9.1.1", "10.9.1.2");
    // Connection tracking runs in a namespace once a rule asks for it.
    common::nft(
        &node,
        "table inet mgy_ct_test {\n  chain input {\n    type filter hook input priority 0; policy accept;\n    ct state established,related accept\n  }\n}\n",
    );
    node.sysctl("net.netfilter.nf_conntrack_acct", "1").unwrap();

    let (ns_file, pod_file) = (common::file(&node), common::file(&pod));
    let listener =
        margay_netlink::netns::run_in(&ns_file, || std::net::TcpListener::bind("10.9.1.1:7070"))
            .unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 65536];
        let mut total = 0;
        while total < 100_000 {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            total += n;
        }
        s.write_all(b"ok").unwrap();
        total
    });
    let mut client = margay_netlink::netns::run_in(&pod_file, || {
        std::net::TcpStream::connect_timeout(
            &"10.9.1.1:7070".parse().unwrap(),
            Duration::from_secs(5),
        )
    })
    .unwrap();
    client.write_all(&vec![7u8; 100_000]).unwrap();
    let mut ok = [0u8; 2];
    client.read_exact(&mut ok).unwrap();
    assert_eq!(server.join().unwrap(), 100_000);

    let mut found: Vec<CtEntry> = Vec::new();
    let stats = margay_netlink::netns::run_in(&ns_file, || {
        dump(10_000, Duration::from_secs(5), |e| {
            if e.orig.dst_port == 7070 {
                found.push(e.clone());
            }
        })
    })
    .unwrap();
    assert!(!stats.truncated, "{stats:?}");
    assert_eq!(found.len(), 1, "{found:?}");
    let e = &found[0];
    assert_eq!(e.orig.src.to_string(), "10.9.1.2");
    assert_eq!(e.orig.dst.to_string(), "10.9.1.1");
    assert_eq!(e.orig.proto, 6);
    assert_eq!(e.reply.src, e.orig.dst);
    assert_eq!(e.reply.dst_port, e.orig.src_port);
    // Established, or closing since the server has closed its side; not ended.
    assert!(
        matches!(e.tcp_state, Some(3..=6)) && !e.tcp_ended(),
        "{e:?}"
    );
    let orig = e.orig_counters.unwrap();
    let reply = e.reply_counters.unwrap();
    assert!(orig.bytes > 100_000, "{orig:?}");
    assert!(orig.packets >= 3, "{orig:?}");
    assert!(reply.packets >= 2 && reply.bytes > 0, "{reply:?}");

    // A bound cuts the dump short and says so.
    let stats = margay_netlink::netns::run_in(&ns_file, || dump(0, Duration::from_secs(5), |_| {}))
        .unwrap();
    assert!(stats.truncated && stats.entries == 0, "{stats:?}");
    drop(client);
}
