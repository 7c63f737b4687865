//! Start-up: configuration from the environment, the config file and the datastore (or
//! Typha), retried until it loads and the datastore is ready; then the encapsulation, the
//! logging, the driver and the pipeline threads (Calico's `daemon.Run` up to
//! `monitorAndManageShutdown`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc as smpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use margay_api::Kind;
use margay_calc::{CalcConfig, CalcGraph, Message};
use margay_dataplane::DataplaneDriver;
use margay_datastore::{Client, SyncerEvent, SyncerOptions, WatcherSyncer};
use margay_felix_config::{Loaded, PARAMS, WarnOnce, load};
use tokio::sync::mpsc;

use super::driver::{make_driver, pool_encap};
use super::pipeline::{calc_loop, dataplane_loop};
use super::servers::HealthServer;
use super::services::{ServiceSource, service_source};
use super::typha::{Source, TyphaStart, run_typha_feed, typha_startup};
use super::validation::{ConfigWatch, validation_loop};
use super::{
    CalcInput, Control, DaemonOptions, EncapPolicy, FELIX_KINDS, RETRY, Shared, StartError,
    Started, lock,
};
use crate::calico_level;
use crate::dataplane_config::Encap;
use crate::health::{CALC_GRAPH_TIMEOUT, CALCULATION_GRAPH, FELIX_STARTUP, INTERNAL_DATAPLANE};
use crate::inputs::{LocalInputs, datastore_config, read_datastore_inputs};
use crate::metrics::Metrics;
use crate::typha_feed::{TYPHA_CONNECTION, TyphaFeed, TyphaTarget};

fn log_warnings(once: &mut WarnOnce, loaded: &Loaded) {
    for w in once.fresh(&loaded.warnings) {
        tracing::warn!("{w}");
    }
}

/// LogFilePath + LogSeverityFile, as Calico's Felix: no file when either is empty/`none`;
/// a file that cannot be opened stops Felix (the parameter is DieOnFail).
fn apply_log_file(
    set: &margay_logging::FileSetter,
    path: &str,
    severity: &str,
) -> Result<(), StartError> {
    let level = if severity.trim().is_empty() {
        "off"
    } else {
        calico_level(severity).unwrap_or("info")
    };
    let path = path.trim();
    if path.is_empty() || path.eq_ignore_ascii_case("none") || level == "off" {
        return set(None, "off").map_err(StartError::Fatal);
    }
    set(Some(std::path::Path::new(path)), level).map_err(|e| {
        StartError::Fatal(format!(
            "LogFilePath: {e}; fix the path or its permissions, or set LogFilePath=none \
             (FELIX_LOGFILEPATH=none) to log only to the screen"
        ))
    })?;
    tracing::info!(path, level = severity, "Logging to file");
    Ok(())
}

/// Everything up to the running pipeline (Calico's `daemon.Run` up to
/// `monitorAndManageShutdown`).
pub(super) async fn startup(
    opts: &DaemonOptions,
    control: &Control,
) -> Result<Started, StartError> {
    let health = &control.health;
    let mark = |phase: &str| {
        lock(&control.bootstrap).mark(phase, Instant::now());
    };
    let mut warn_once = WarnOnce::new();
    let mut health_server = HealthServer::default();
    let mut waiting_since: Option<(Instant, Instant)> = None;
    let mut said_no_file = false;

    tracing::info!("Loading configuration...");
    // Where Services come from (decided with the datastore; Typha carries them itself).
    let mut svc_source = ServiceSource::None;
    let (local, ds_desc, source, ds_inputs, loaded) = 'config: loop {
        health.report(FELIX_STARTUP, true, false);
        let local = match LocalInputs::read(
            opts.env.clone(),
            &opts.config_file,
            opts.kernel_hostname.clone(),
        ) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("{e}; retrying");
                control.waiting_for(format!("the configuration to be readable: {e}"));
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        if local.config_text.is_none() && !said_no_file {
            said_no_file = true;
            tracing::info!(path = %opts.config_file.display(), "No config file; using the environment and the datastore");
        }
        let local_loaded = match load(&local.config_inputs()) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "Failed to load configuration from the environment and config file; retrying in 1s");
                control.waiting_for(format!(
                    "a valid configuration (environment and config file): {e}"
                ));
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let c = &local_loaded.config;
        health_server.ensure(c.health_enabled, &c.health_host, c.health_port, health);
        if let Some(target) = crate::typha_feed::typha_target(c) {
            // Through Typha: everything, configuration included, comes from Typha's felix
            // syncer; Felix never connects to the datastore.
            let (addrs, discovered) = match target {
                TyphaTarget::Addrs(addrs) => (addrs, None),
                TyphaTarget::Kubernetes(service) => {
                    let d = crate::typha_feed::discovery(&opts.env, c, service)
                        .map_err(|e| StartError::Fatal(e.to_string()))?;
                    // Looked up on every retry of the loop, so a Typha that moved is found.
                    let mut rng = margay_typha::discovery::Rng::from_entropy();
                    match d.discover(&mut rng).await {
                        Ok(found) => {
                            tracing::info!(service = %found.service, typhas = %found.describe(), "Found Typha through Kubernetes (TyphaK8sServiceName)");
                            (found.addrs(), Some((d, found)))
                        }
                        Err(e) => {
                            tracing::error!("{e}; retrying in 1s");
                            control.waiting_for(format!("Typha: {e}"));
                            tokio::time::sleep(RETRY).await;
                            continue;
                        }
                    }
                }
            };
            let topts = crate::typha_feed::client_options(c, addrs)
                .map_err(|e| StartError::Fatal(e.to_string()))?;
            mark("config_load");
            let desc = match &discovered {
                None => {
                    let addrs = topts.addrs.join(",");
                    tracing::info!(typha = %addrs, "Syncing through Typha (TyphaAddr): Felix does not connect to the datastore");
                    format!("typha {addrs}")
                }
                Some((_, found)) => {
                    tracing::info!(service = %found.service, "Syncing through Typha (TyphaK8sServiceName): Felix does not connect to the datastore");
                    format!(
                        "typha {} (Kubernetes service {})",
                        found.describe(),
                        found.service
                    )
                }
            };
            health.register(TYPHA_CONNECTION, false, true, Duration::ZERO);
            health.report(TYPHA_CONNECTION, true, false);
            let mut feed = match discovered {
                None => TyphaFeed::start(topts),
                Some((d, found)) => TyphaFeed::start_discovered(topts, d, found),
            };
            let hostname = c.felix_hostname.clone();
            let started = typha_startup(&mut feed, &local, health, &hostname).await?;
            mark("datastore_connect");
            let TyphaStart {
                buffered,
                inputs,
                loaded,
                pools,
            } = started;
            break 'config (
                local,
                desc,
                Source::Typha {
                    feed,
                    buffered,
                    pools,
                },
                inputs,
                loaded,
            );
        }
        mark("config_load");

        let ds_cfg = datastore_config(&opts.env, &local_loaded)
            .map_err(|e| StartError::Fatal(e.to_string()))?;
        tracing::info!(datastore = %ds_cfg.describe(), "Connecting to datastore");
        control.waiting_for(format!("the datastore ({})", ds_cfg.describe()));
        let backend = match tokio::time::timeout(Duration::from_secs(10), ds_cfg.connect()).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                tracing::error!(datastore = %ds_cfg.describe(), error = %e, "Failed to create datastore client; retrying in 1s");
                control.waiting_for(format!("the datastore ({}): {e}", ds_cfg.describe()));
                tokio::time::sleep(RETRY).await;
                continue;
            }
            Err(_) => {
                tracing::error!(datastore = %ds_cfg.describe(), "Connecting to the datastore timed out after 10s; retrying");
                control.waiting_for(format!(
                    "the datastore ({}): connecting timed out after 10s",
                    ds_cfg.describe()
                ));
                continue;
            }
        };
        tracing::info!("Created datastore client");
        mark("datastore_connect");
        let client = Client::new(backend.clone());
        let hostname = local_loaded.config.felix_hostname.clone();
        loop {
            let ds = match read_datastore_inputs(&client, &hostname).await {
                Ok(ds) => ds,
                Err(e) => {
                    tracing::error!(error = %e, "Failed to get config from datastore; retrying in 1s");
                    control.waiting_for(format!("configuration from the datastore: {e}"));
                    tokio::time::sleep(RETRY).await;
                    continue 'config;
                }
            };
            let loaded = match load(&ds.config_inputs(&local, &hostname)) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "Failed to parse/validate configuration from datastore; retrying in 1s");
                    control.waiting_for(format!("valid configuration in the datastore: {e}"));
                    tokio::time::sleep(RETRY).await;
                    continue 'config;
                }
            };
            if loaded.datastore_ready != Some(true) {
                // Calico reports ready while it waits: a datastore being migrated must not
                // make every node unready.
                health.report(FELIX_STARTUP, true, true);
                control.waiting_for(
                    "the datastore to be initialized: ClusterInformation \"default\" does not have \
                     datastoreReady: true (margay node startup sets it)",
                );
                let now = Instant::now();
                match waiting_since {
                    None => {
                        waiting_since = Some((now, now));
                        tracing::warn!(
                            "Waiting for datastore to be initialized: ClusterInformation \"default\" \
                             does not have datastoreReady: true (margay node startup sets it)"
                        );
                    }
                    Some((first, last)) if now.duration_since(last) >= Duration::from_secs(30) => {
                        waiting_since = Some((first, now));
                        tracing::warn!(waited = ?now.duration_since(first), "Still waiting for the datastore to be initialized (ClusterInformation \"default\" datastoreReady)");
                    }
                    Some(_) => {}
                }
                tokio::time::sleep(RETRY).await;
                continue;
            }
            svc_source = service_source(&opts.env, &ds_cfg, &backend);
            break 'config (
                local,
                ds_cfg.describe(),
                Source::Datastore(backend),
                ds,
                loaded,
            );
        }
    };
    mark("datastore_config");
    control.waiting_for("the IP pools, the dataplane driver and the pipeline to start");
    let config = loaded.config.clone();
    let hostname = config.felix_hostname.clone();

    // The encapsulation the pools call for, unless configuration forces it.
    let pools = match &source {
        Source::Datastore(backend) => {
            let client = Client::new(backend.clone());
            loop {
                match client.list(Kind::IPPool, None, "").await {
                    Ok(l) => break l.items,
                    Err(e) => {
                        tracing::error!(error = %e, "Failed to list IP pools; retrying in 1s");
                        control.waiting_for(format!("the IP pools from the datastore: {e}"));
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        }
        Source::Typha { pools, .. } => pools.clone(),
    };
    let encap = EncapPolicy {
        ipip_override: config.ip_in_ip_enabled,
        vxlan_override: config.vxlan_enabled,
        startup: Encap {
            ipip: false,
            vxlan: false,
            vxlan_v6: false,
        },
    };
    let encap = EncapPolicy {
        startup: encap.effective(pool_encap(&pools)),
        ..encap
    };
    tracing::info!(
        ipip = encap.startup.ipip,
        vxlan = encap.startup.vxlan,
        vxlan_v6 = encap.startup.vxlan_v6,
        "Encapsulation (from the IP pools unless IpInIpEnabled/VXLANEnabled are set)"
    );

    // Logging as configured (unless --log-level decided it).
    if let Some(set) = &opts.log_level {
        match calico_level(&config.log_severity_screen) {
            Some(level) => {
                if let Err(e) = set(level) {
                    tracing::warn!(error = %e, "cannot apply LogSeverityScreen");
                }
            }
            None => {
                tracing::warn!(value = %config.log_severity_screen, "LogSeverityScreen is not a level; keeping the current one")
            }
        }
    }
    if let Some(set) = &opts.syslog_level {
        // Empty is how the parameter parses `none`.
        let sys = Some(config.log_severity_sys.as_str()).filter(|v| !v.trim().is_empty());
        match sys.map_or(Some("off"), calico_level) {
            Some(level) => {
                if let Err(e) = set(level) {
                    // Not fatal, as in Calico: syslog is often absent in containers.
                    tracing::error!(
                        error = %e,
                        "Failed to connect to syslog. To prevent this error, either set config \
                         parameter LogSeveritySys=none or configure a local syslog service."
                    );
                }
            }
            None => {
                tracing::warn!(value = %config.log_severity_sys, "LogSeveritySys is not a level; not logging to syslog")
            }
        }
    }
    if let Some(set) = &opts.log_file {
        apply_log_file(set, &config.log_file_path, &config.log_severity_file)?;
    }
    let set_count = loaded
        .sources()
        .filter(|(_, e)| e.source != margay_felix_config::Source::Default)
        .count();
    tracing::info!(
        hostname = %hostname,
        datastore = %ds_desc,
        parameters_set = set_count,
        selector_config = loaded.selector_config.as_deref().unwrap_or("-"),
        "Successfully loaded configuration (margay felix config shows every value and its source)"
    );
    log_warnings(&mut warn_once, &loaded);
    health.set_overrides(config.health_timeout_overrides.clone());
    health_server.ensure(
        config.health_enabled,
        &config.health_host,
        config.health_port,
        health,
    );

    let metrics = Arc::new(Metrics::new(&hostname, config.ipv6_support));
    *lock(&control.metrics) = Some(metrics.clone());
    for p in lock(&control.bootstrap).phases() {
        metrics.set_bootstrap_phase(&p.phase, p.seconds);
    }

    // The dataplane driver.
    let (driver, recording, nft_stats) = make_driver(&opts.env, &config, &hostname, encap.startup)?;
    let driver_name = driver.name();
    health.register(
        INTERNAL_DATAPLANE,
        true,
        true,
        config.dataplane_watchdog_timeout,
    );
    // Flow logs: nftables' NFLOG verdicts (the Linux driver) or the eBPF program's events.
    let file_sink = config
        .flow_logs_file_enabled
        .then(|| crate::flows::FileSink {
            path: std::path::Path::new(&config.flow_logs_file_directory).join("flows.log"),
            rotation: margay_logging::Rotation {
                max_bytes: u64::try_from(config.flow_logs_file_max_file_size_mb)
                    .unwrap_or(100)
                    .saturating_mul(1_000_000),
                keep: u32::try_from(config.flow_logs_file_max_files - 1).unwrap_or(4),
            },
            interval: config.flow_logs_flush_interval,
        });
    // The cluster's addresses for naming both ends of a flow: fed by the calculation thread
    // only while flow logs run.
    let mut peer_feed: Option<crate::flows::PeerFeed> = None;
    let flows = if config
        .flow_logs_local_reporter
        .eq_ignore_ascii_case("enabled")
        || file_sink.is_some()
    {
        let peers = crate::flows::PeerFeed::default();
        let started = match &nft_stats {
            Some(super::driver::DriverStats::Nft(_)) => Some(crate::flows::FlowLogs::start(
                &hostname,
                recording.clone(),
                file_sink,
                peers.clone(),
            )),
            Some(super::driver::DriverStats::Bpf(h)) => Some(crate::flows::FlowLogs::start_bpf(
                &hostname,
                recording.clone(),
                file_sink,
                peers.clone(),
                h.flow_source(),
            )),
            None => None,
        };
        if let Some(started) = started {
            match started {
                Ok(f) => {
                    tracing::info!(
                        "Flow logs on (FlowLogsLocalReporter / FlowLogsFileEnabled): `margay flows` reads them"
                    );
                    metrics.set_flow_logs(f.clone());
                    peer_feed = Some(peers);
                    Some(f)
                }
                Err(e) => {
                    tracing::error!(error = %e, "Cannot read flow logs (NFLOG groups 1 and 2, or the eBPF ring buffer); continuing without them");
                    None
                }
            }
        } else {
            tracing::warn!(
                driver = driver_name,
                "FlowLogsLocalReporter is Enabled but this dataplane driver does not log verdicts yet; no flow logs"
            );
            None
        }
    } else {
        None
    };
    let (reasons_tx, _) = (control.reasons.clone(), ());
    let shared = Arc::new(Shared {
        start: lock(&control.bootstrap).start(),
        hostname: hostname.clone(),
        health: health.clone(),
        metrics: metrics.clone(),
        bootstrap: control.bootstrap.clone(),
        invalid: Mutex::new(BTreeMap::new()),
        config_json: Mutex::new(loaded.to_json()),
        recording,
        nft_stats,
        flows,
        driver_name,
        datastore: ds_desc,
        dp_in_sync: AtomicBool::new(false),
        messages_applied: AtomicU64::new(0),
        calc_tx: Mutex::new(None),
        reasons: reasons_tx,
    });
    let (dp_tx, dp_rx) = smpsc::channel::<Vec<Message>>();
    // The driver's first message is its configuration (Calico's ConfigUpdate).
    let raw: BTreeMap<String, String> = PARAMS
        .iter()
        .map(|p| (p.name.to_string(), config.get(p.id).to_string()))
        .collect();
    let _ = dp_tx.send(vec![Message::ConfigUpdate { config: raw }]);
    {
        let shared = shared.clone();
        let driver: Box<dyn DataplaneDriver> = driver;
        std::thread::Builder::new()
            .name("felix-dataplane".into())
            .spawn(move || dataplane_loop(dp_rx, driver, shared))
            .map_err(|e| StartError::Fatal(format!("cannot start the dataplane thread: {e}")))?;
    }
    shared.mark("dataplane_start");
    health.report(FELIX_STARTUP, true, true);

    // The calculation graph.
    health.register(CALCULATION_GRAPH, true, true, CALC_GRAPH_TIMEOUT);
    let (calc_tx, calc_rx) = smpsc::channel::<CalcInput>();
    *lock(&shared.calc_tx) = Some(calc_tx.clone());
    // Through Typha the services arrive in its stream and are complete with it.
    let services_pending =
        matches!(source, Source::Typha { .. }) || !matches!(svc_source, ServiceSource::None);
    {
        let shared = shared.clone();
        let graph = CalcGraph::new(CalcConfig {
            hostname: hostname.clone(),
            route_source: if config.route_source.eq_ignore_ascii_case("WorkloadIPs") {
                margay_calc::RouteSource::WorkloadIps
            } else {
                margay_calc::RouteSource::CalicoIpam
            },
        });
        std::thread::Builder::new()
            .name("felix-calc".into())
            .spawn(move || {
                calc_loop(
                    calc_rx,
                    graph,
                    dp_tx,
                    shared,
                    encap,
                    services_pending,
                    peer_feed,
                )
            })
            .map_err(|e| StartError::Fatal(format!("cannot start the calculation thread: {e}")))?;
    }

    // The syncer (or Typha) and the validation filter.
    let (sync_tx, sync_rx) = mpsc::channel::<SyncerEvent>(16);
    let services_task = match source {
        Source::Typha { .. } => None,
        Source::Datastore(_) => super::services::start(svc_source, calc_tx.clone(), shared.clone()),
    };
    let (syncer_task, blocks_task) = match source {
        Source::Datastore(backend) => {
            let syncer =
                WatcherSyncer::new(backend.clone(), SyncerOptions::new(FELIX_KINDS.to_vec()));
            tracing::info!("Starting the datastore Syncer");
            let syncer_task = tokio::spawn(syncer.run(sync_tx));
            // IPAM blocks, for routes to remote blocks.
            let blocks_task = {
                let calc_tx = calc_tx.clone();
                tokio::spawn(async move {
                    let (block_tx, mut block_rx) = mpsc::channel(64);
                    let watcher = tokio::spawn(crate::blocks::run(backend, block_tx));
                    while let Some(ev) = block_rx.recv().await {
                        if calc_tx.send(CalcInput::Block(ev)).is_err() {
                            break;
                        }
                    }
                    watcher.abort();
                })
            };
            (syncer_task, blocks_task)
        }
        Source::Typha { feed, buffered, .. } => {
            tracing::info!("Feeding the pipeline from Typha");
            let task = tokio::spawn(run_typha_feed(
                feed,
                buffered,
                sync_tx,
                calc_tx.clone(),
                shared.clone(),
            ));
            (task, tokio::spawn(async {}))
        }
    };
    {
        let shared = shared.clone();
        let watch = ConfigWatch {
            local,
            inputs: ds_inputs,
            hostname: hostname.clone(),
            startup: config.clone(),
            current: config.clone(),
            in_sync: false,
            stopping: false,
            warn_once,
        };
        std::thread::Builder::new()
            .name("felix-validation".into())
            .spawn(move || validation_loop(sync_rx, calc_tx, shared, watch))
            .map_err(|e| StartError::Fatal(format!("cannot start the validation thread: {e}")))?;
    }
    tracing::info!("Started the processing graph");

    let (servers, stop_servers) = super::servers::start(&config, &metrics, &shared, health).await?;
    Ok(Started {
        shared,
        _health_server: health_server,
        servers,
        syncer: syncer_task,
        blocks: blocks_task,
        services: services_task,
        stop_servers,
    })
}
