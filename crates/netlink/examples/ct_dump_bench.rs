//! How long one conntrack read takes (Felix's flow logs read conntrack every 5 s for the
//! traffic of allowed connections): fills the table of a namespace of its own with N UDP
//! flows over loopback and times `conntrack::dump` over them. Root only.
//!
//! `cargo run --release -p margay-netlink --example ct_dump_bench [-- 100000]`
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::time::{Duration, Instant};

use margay_netlink::conntrack::dump;
use margay_testkit::netns::{Netns, is_root};

fn main() {
    if !is_root() {
        eprintln!("needs root (a network namespace, nftables)");
        std::process::exit(2);
    }
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let ns = Netns::new("ctb").unwrap();
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    let rules = "table inet ctb {\n  chain out {\n    type filter hook output priority 0; policy accept;\n    ct state new accept\n  }\n}\n";
    let mut nft = ns
        .exec("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    nft.stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    assert!(nft.wait().unwrap().success());
    ns.sysctl("net.netfilter.nf_conntrack_acct", "1").unwrap();
    ns.sysctl(
        "net.netfilter.nf_conntrack_max",
        &(2 * n).max(65536).to_string(),
    )
    .unwrap();
    let file = std::fs::File::open(format!("/var/run/netns/{}", ns.name())).unwrap();
    let rounds: Vec<(Duration, usize)> = margay_netlink::netns::run_in(&file, || {
        // N flows: one socket, a datagram to each of N (address, port) pairs.
        let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
        for i in 0..n {
            let port = 1024 + (i % 60_000) as u16;
            let host = 1 + (i / 60_000) as u8;
            let _ = sock.send_to(b"x", (std::net::Ipv4Addr::new(127, 0, 1, host), port));
        }
        let mut out = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let mut seen = 0usize;
            let stats = dump(2_000_000, Duration::from_secs(10), |e| {
                if e.orig_counters.is_some() {
                    seen += 1;
                }
            })?;
            out.push((t.elapsed(), stats.entries.min(seen)));
        }
        Ok(out)
    })
    .unwrap();
    let mut times: Vec<Duration> = rounds.iter().map(|r| r.0).collect();
    times.sort();
    println!(
        "conntrack read of {} entries (asked {n}): min {:?}, median {:?}, max {:?} over {} rounds ({:.0} ns/entry at the median)",
        rounds[0].1,
        times[0],
        times[times.len() / 2],
        times[times.len() - 1],
        times.len(),
        times[times.len() / 2].as_nanos() as f64 / rounds[0].1.max(1) as f64
    );
}
