//! `/metrics` latency of the shared server over loopback, for a registry shaped like Felix's
//! (Calico-named counters and summaries, prometheus-client gauges and families, the process
//! collector), plus the time to render it alone. Prints numbers; asserts nothing.
//!
//! `cargo run --release -p margay-daemon-http --example metrics_latency [requests]`
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use margay_daemon_http::metrics::{Counter, CounterVec, Kind, ProcessCollector, Registry, Summary};
use margay_daemon_http::{Limits, Router, serve};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn felix_like() -> Registry {
    let mut r = Registry::new();
    for i in 0..2 {
        let s = Summary::default();
        for k in 0..2000 {
            s.observe(f64::from(k) * 1e-5);
        }
        r.register_calico(
            &format!("x_summary_{i}_seconds"),
            "A summary.",
            Kind::Summary,
            s,
        );
    }
    for i in 0..3 {
        let v = CounterVec::new("type");
        for k in 0..12 {
            v.add(&format!("Kind{k}"), k);
        }
        r.register_calico(&format!("x_by_type_{i}"), "By type.", Kind::Counter, v);
    }
    for i in 0..3 {
        let c = Counter::default();
        c.add(42);
        r.register_calico(&format!("x_counter_{i}"), "A counter.", Kind::Counter, c);
    }
    for i in 0..10 {
        let g: Gauge = Gauge::default();
        g.set(i);
        r.register(&format!("x_gauge_{i}"), "A gauge.", g);
    }
    let f: Family<[(&'static str, String); 1], Gauge> = Family::default();
    f.get_or_create(&[("ip_version", "4".into())]).set(5);
    f.get_or_create(&[("ip_version", "6".into())]).set(5);
    r.register("x_ipsets", "Per version.", f);
    r.register_collector(Box::new(ProcessCollector::new()));
    r
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let reg = Arc::new(felix_like());

    let t = Instant::now();
    let mut bytes = 0;
    for _ in 0..n {
        bytes = reg.render().len();
    }
    println!(
        "render: {:.1} µs per exposition ({bytes} bytes, {n} renders)",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );

    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let handler = Router::new().metrics(reg).into_handler();
    let server = tokio::spawn(serve(l, handler, None, Limits::default(), rx));
    let mut times = Vec::with_capacity(n);
    for i in 0..n + 100 {
        let t = Instant::now();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        // The first 100 warm up.
        if i >= 100 {
            times.push(t.elapsed());
        }
    }
    times.sort();
    println!(
        "GET /metrics over loopback (connect, request, full answer): p50 {:?}, p90 {:?}, p99 {:?} ({n} requests)",
        pct(&times, 0.5),
        pct(&times, 0.9),
        pct(&times, 0.99)
    );
    let _ = stop.send(true);
    let _ = server.await;
}
