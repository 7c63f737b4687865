//! Service programming benchmark (the kernel part needs root; it works inside a throw-away
//! namespace).
//!
//! `cargo run --release -p margay-dataplane --example svc_bench -- [--services 10000]
//!  [--endpoints 10] [--changes 100] [--bpf]`
//!
//! With `--bpf` the eBPF driver programs the same model into its service maps (a private
//! bpffs, inside the throw-away namespace): the object's load, the cold write and each
//! change → maps are timed.
//!
//! 1. Cold: `--services` ClusterIP services with `--endpoints` ready endpoints each, from
//!    Service and EndpointSlice objects through the calculation graph into an empty table:
//!    graph, render+diff and the kernel write timed separately.
//! 2. One endpoint change at a time (an EndpointSlice loses or regains an endpoint): slice →
//!    graph → render → diff → kernel, the latency distribution over `--changes` changes.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use margay_calc::services::{KubeEndpointSlice, KubeService};
use margay_calc::{CalcConfig, CalcGraph, DataplaneModel};
use margay_dataplane::nft::{NftConfig, NftRunner};
use margay_dataplane::nft_driver::{NftDriver, NftDriverConfig};
use margay_testkit::netns::{Netns, is_root};
use serde_json::json;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn service(i: usize) -> KubeService {
    let ip = format!("10.96.{}.{}", i / 250, 1 + i % 250);
    serde_json::from_value(json!({
        "metadata": {"name": format!("svc{i}"), "namespace": "default"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap()
}

fn slice(i: usize, endpoints: usize, skip: Option<usize>) -> KubeEndpointSlice {
    let eps: Vec<_> = (0..endpoints)
        .filter(|e| Some(*e) != skip)
        .map(|e| {
            let n = i * endpoints + e;
            json!({"addresses": [format!("10.{}.{}.{}", 64 + n / 65536, (n / 256) % 256, n % 256)],
                   "nodeName": format!("node{}", n % 50)})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("svc{i}-abc"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": format!("svc{i}")}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]
    }))
    .unwrap()
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

/// The same steps with the eBPF driver, on a thread inside the namespace (the driver
/// attaches its data-interface programs where it runs: never in the root namespace).
fn bpf_main(ns: &Netns, services: usize, endpoints: usize, changes: usize) {
    use margay_dataplane::DataplaneDriver;
    use margay_dataplane::bpf_driver::{BpfDriver, BpfDriverConfig};
    let name = ns.name().to_string();
    std::thread::spawn(move || {
        margay_testkit::netns::enter(&name).unwrap();
        let fs = tempfile::tempdir().unwrap();
        let t = Instant::now();
        let (mut driver, _) = BpfDriver::new(BpfDriverConfig {
            pin_dir: fs.path().join("node0"),
            bpffs_mount: Some(fs.path().to_path_buf()),
            compile: Default::default(),
            workload_prefixes: vec!["cali".into()],
            routing: None,
            route_refresh_interval: Duration::ZERO,
            status_prefix: None,
            global_sysctls: vec![],
            interfaces: None,
            host_nft: None,
        })
        .unwrap();
        println!("bpf: object loaded and verified in {:.2} s", t.elapsed().as_secs_f64());
        let mut graph = CalcGraph::new(CalcConfig {
            hostname: "node0".into(),
            ..CalcConfig::default()
        });
        let t = Instant::now();
        for i in 0..services {
            graph.on_kube_service("default", &format!("svc{i}"), Some(&service(i)));
            graph.on_endpoint_slice(
                "default",
                &format!("svc{i}-abc"),
                Some(&slice(i, endpoints, None)),
            );
        }
        graph.on_in_sync();
        let msgs = graph.flush();
        let graph_time = t.elapsed();
        let t = Instant::now();
        driver.apply(&msgs).unwrap();
        let write = t.elapsed();
        let r = driver.last_service_report().clone();
        println!(
            "bpf cold: {services} services x {endpoints} endpoints: graph {:.3} s, driver (model + maps) {:.3} s, total {:.3} s; {} frontends, {} backend slots written",
            graph_time.as_secs_f64(),
            write.as_secs_f64(),
            (graph_time + write).as_secs_f64(),
            r.frontends_written,
            r.backends_written
        );
        let mut lat = Vec::with_capacity(changes);
        let mut graph_lat = Vec::with_capacity(changes);
        let mut writes = 0;
        for c in 0..changes {
            let i = ((c / 2) * 7919) % services;
            let skip = (c % 2 == 0).then_some(c % endpoints);
            let t = Instant::now();
            graph.on_endpoint_slice(
                "default",
                &format!("svc{i}-abc"),
                Some(&slice(i, endpoints, skip)),
            );
            let msgs = graph.flush();
            graph_lat.push(t.elapsed());
            driver.apply(&msgs).unwrap();
            lat.push(t.elapsed());
            let r = driver.last_service_report();
            writes += r.backends_written + r.frontends_written + r.backends_deleted;
        }
        println!(
            "bpf endpoint change: graph p50 {:.2} ms, p99 {:.2} ms",
            pct(&mut graph_lat, 0.5).as_secs_f64() * 1e3,
            pct(&mut graph_lat, 0.99).as_secs_f64() * 1e3
        );
        println!(
            "bpf endpoint change -> maps: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {changes} changes ({:.1} map writes each)",
            pct(&mut lat, 0.5).as_secs_f64() * 1e3,
            pct(&mut lat, 0.99).as_secs_f64() * 1e3,
            pct(&mut lat, 1.0).as_secs_f64() * 1e3,
            writes as f64 / changes.max(1) as f64
        );
        drop(driver);
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(fs.path())
            .status();
    })
    .join()
    .unwrap();
}

fn main() {
    let services = arg("--services", 10_000);
    let endpoints = arg("--endpoints", 10);
    let changes = arg("--changes", 100);
    let root = is_root();
    if std::env::args().any(|a| a == "--bpf") {
        if !root {
            println!("--bpf needs root");
            return;
        }
        let ns = Netns::new("svc-bench").unwrap();
        bpf_main(&ns, services, endpoints, changes);
        return;
    }
    let ns = root.then(|| Netns::new("svc-bench").unwrap());
    let (mut driver, stats) = NftDriver::new(NftDriverConfig {
        nft: NftConfig {
            ipv6: false,
            ..NftConfig::default()
        },
        runner: NftRunner {
            netns: ns.as_ref().map(|n| n.name().to_string()),
            ..NftRunner::default()
        },
        refresh_interval: Duration::ZERO,
        flowtable_extra_devices: None,
    });
    let mut graph = CalcGraph::new(CalcConfig {
        hostname: "node0".into(),
        ..CalcConfig::default()
    });
    let mut model = DataplaneModel::default();

    let t = Instant::now();
    for i in 0..services {
        graph.on_kube_service("default", &format!("svc{i}"), Some(&service(i)));
        graph.on_endpoint_slice(
            "default",
            &format!("svc{i}-abc"),
            Some(&slice(i, endpoints, None)),
        );
    }
    graph.on_in_sync();
    let msgs = graph.flush();
    model.apply_all(&msgs).unwrap();
    let graph_time = t.elapsed();
    println!(
        "cold: {services} services x {endpoints} endpoints: graph {:.3} s ({} messages)",
        graph_time.as_secs_f64(),
        msgs.len()
    );
    if !root {
        println!("not root: kernel programming skipped");
        return;
    }
    driver.mark_dirty();
    let t = Instant::now();
    let tx = driver.sync(&model).unwrap();
    let kernel = t.elapsed();
    {
        let s = stats.lock();
        println!(
            "cold: render {:.3} s, diff {:.3} s, nft {:.3} s; total with graph {:.3} s; {} chains, {} rules, {} elements ({tx:?})",
            s.last_render_seconds,
            s.last_diff_seconds,
            s.last_nft_seconds,
            (graph_time + kernel).as_secs_f64(),
            s.chains,
            s.rules,
            s.elements
        );
    }

    let mut lat = Vec::with_capacity(changes);
    let mut graph_lat = Vec::with_capacity(changes);
    let mut driver_lat = Vec::with_capacity(changes);
    for c in 0..changes {
        let i = ((c / 2) * 7919) % services;
        // Odd changes restore what even ones removed.
        let skip = (c % 2 == 0).then_some(c % endpoints);
        let t = Instant::now();
        graph.on_endpoint_slice(
            "default",
            &format!("svc{i}-abc"),
            Some(&slice(i, endpoints, skip)),
        );
        let msgs = graph.flush();
        model.apply_all(&msgs).unwrap();
        let graphed = t.elapsed();
        driver.mark_dirty();
        driver.sync(&model).unwrap();
        lat.push(t.elapsed());
        graph_lat.push(graphed);
        driver_lat.push(t.elapsed() - graphed);
    }
    {
        let s = stats.lock();
        println!(
            "last change: render {:.1} ms, diff {:.1} ms, nft+netlink {:.1} ms",
            s.last_render_seconds * 1e3,
            s.last_diff_seconds * 1e3,
            s.last_nft_seconds * 1e3
        );
    }
    println!(
        "endpoint change: graph p50 {:.1} ms p99 {:.1} ms; driver (render, diff, write) p50 {:.1} ms p99 {:.1} ms",
        pct(&mut graph_lat, 0.5).as_secs_f64() * 1e3,
        pct(&mut graph_lat, 0.99).as_secs_f64() * 1e3,
        pct(&mut driver_lat, 0.5).as_secs_f64() * 1e3,
        pct(&mut driver_lat, 0.99).as_secs_f64() * 1e3,
    );
    println!(
        "endpoint change -> kernel: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {changes} changes",
        pct(&mut lat, 0.5).as_secs_f64() * 1e3,
        pct(&mut lat, 0.99).as_secs_f64() * 1e3,
        pct(&mut lat, 1.0).as_secs_f64() * 1e3
    );
}
