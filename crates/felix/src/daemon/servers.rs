//! Felix's servers: the health server (moved or stopped as configuration changes), the
//! Prometheus metrics server, the status socket, and the "Felix is ready" summary.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use margay_felix_config::Config;
use tokio::sync::watch;

use super::{RETRY, Shared, StartError, lock};
use crate::health::HealthAggregator;
use crate::metrics::Metrics;
use margay_daemon_http::{Health, Limits, Router};

/// Starts the health server, moves it, or stops it, as configuration says (Calico's
/// `ServeHTTP(enabled, host, port)`).
#[derive(Default)]
pub(super) struct HealthServer {
    running: Option<(String, u16, watch::Sender<bool>)>,
}

impl HealthServer {
    pub(super) fn ensure(
        &mut self,
        enabled: bool,
        host: &str,
        port: u16,
        health: &HealthAggregator,
    ) {
        if let Some((h, p, _)) = &self.running {
            if enabled && h == host && *p == port {
                return;
            }
            tracing::info!("Health server settings changed; stopping the old server");
            if let Some((_, _, stop)) = self.running.take() {
                let _ = stop.send(true);
            }
        }
        if !enabled {
            return;
        }
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let handler = Router::new()
            .health(Arc::new(FelixHealth(health.clone())))
            .into_handler();
        let host_s = host.to_string();
        tokio::spawn(async move {
            loop {
                match margay_daemon_http::bind(&host_s, port).await {
                    Ok(l) => {
                        tracing::info!(host = %host_s, port, "Health enabled. Starting server.");
                        margay_daemon_http::serve(l, handler, None, Limits::default(), stop_rx)
                            .await;
                        return;
                    }
                    Err(e) => {
                        tracing::error!(host = %host_s, port, error = %e, "Health endpoint failed, trying to restart it...");
                        tokio::select! {
                            _ = tokio::time::sleep(RETRY) => {}
                            _ = stop_rx.changed() => return,
                        }
                    }
                }
            }
        });
        self.running = Some((host.to_string(), port, stop_tx));
    }
}

/// Starts the metrics server (when enabled), the status socket (when asked for) and the
/// task that logs the start-up summary once Felix is ready; the sender stops them all.
pub(super) async fn start(
    config: &Config,
    metrics: &Arc<Metrics>,
    shared: &Arc<Shared>,
    health: &HealthAggregator,
) -> Result<(Vec<tokio::task::JoinHandle<()>>, watch::Sender<bool>), StartError> {
    // Metrics, the status socket, and the start-up summary once ready.
    let (stop_servers, stop_rx) = watch::channel(false);
    let mut servers = Vec::new();
    metrics
        .process_metrics
        .store(config.prometheus_process_metrics_enabled, Ordering::Relaxed);
    if config.prometheus_metrics_enabled {
        let host = config.prometheus_metrics_host.clone();
        let port = config.prometheus_metrics_port;
        let tls = crate::metrics_tls::MetricsTls::from_config(config)
            .map_err(|e| StartError::Fatal(format!("Prometheus metrics: {e}")))?;
        if let Some(t) = &tls {
            // Catch unusable files at start; they are read again per connection.
            t.server_config()
                .map_err(|e| StartError::Fatal(format!("Prometheus metrics over TLS: {e}")))?;
        }
        match margay_daemon_http::bind(&host, port).await {
            Ok(l) => {
                tracing::info!(host = %host, port, tls = tls.is_some(), "Prometheus metrics enabled. Starting metrics http server.");
                let handler = Router::new().metrics(metrics.clone()).into_handler();
                let tls = tls.map(|t| Arc::new(t) as Arc<dyn margay_daemon_http::TlsSource>);
                servers.push(tokio::spawn(margay_daemon_http::serve(
                    l,
                    handler,
                    tls,
                    Limits::default(),
                    stop_rx.clone(),
                )));
            }
            Err(e) => {
                return Err(StartError::Fatal(format!(
                    "cannot serve Prometheus metrics on {host:?} port {port}: {e} (free the port or \
                     set PrometheusMetricsPort / PrometheusMetricsHost)"
                )));
            }
        }
    }
    {
        let shared = shared.clone();
        let mut ready = health.watch_ready();
        let mut stop = stop_rx;
        servers.push(tokio::spawn(async move {
            loop {
                if *ready.borrow_and_update() && shared.dp_in_sync.load(Ordering::SeqCst) {
                    shared.mark("ready");
                    let b = lock(&shared.bootstrap).clone();
                    tracing::info!(
                        "Felix is ready {:.3}s after start: {}",
                        b.ready_after().unwrap_or_default(),
                        b.summary_line()
                    );
                    return;
                }
                tokio::select! {
                    r = ready.changed() => if r.is_err() { return },
                    _ = stop.changed() => return,
                    // Readiness can also follow the dataplane flag alone.
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        }));
    }
    Ok((servers, stop_servers))
}

/// Felix's health for the shared server: the aggregator's summary, as Calico's health
/// endpoints answer (200 good, 204 good with nothing to say, 503 not).
struct FelixHealth(HealthAggregator);

impl Health for FelixHealth {
    fn liveness(&self) -> (u16, String) {
        self.0.summary().response(false)
    }
    fn readiness(&self) -> (u16, String) {
        self.0.summary().response(true)
    }
}
