//! The dataplane driver Felix starts (Linux nftables, eBPF with BPFEnabled, or the recording
//! driver), the MTUs it
//! detects, and the encapsulation the IP pools call for.

use std::collections::BTreeMap;
use std::path::PathBuf;

use margay_api::Resource;
use margay_calc::{CalcConfig, CalcGraph, Message};
use margay_dataplane::{DataplaneDriver, Recording, RecordingDriver};
use margay_felix_config::Config;

use super::StartError;
use crate::dataplane_config::Encap;

/// A driver, the model it keeps, and its own state for `felix status`.
pub(super) type DriverParts = (Box<dyn DataplaneDriver>, Recording, Option<DriverStats>);

/// The driver's own state, shared with the status server.
#[derive(Debug, Clone)]
pub(super) enum DriverStats {
    /// The Linux driver's nftables counters.
    Nft(margay_dataplane::nft_driver::NftStatsHandle),
    /// The eBPF driver's state (programs, endpoints, blocks, conntrack).
    Bpf(margay_dataplane::bpf_driver::BpfStatusHandle),
}

impl DriverStats {
    pub(super) fn nft_json(&self) -> Option<serde_json::Value> {
        match self {
            DriverStats::Nft(h) => serde_json::to_value(&*h.lock()).ok(),
            DriverStats::Bpf(_) => None,
        }
    }

    pub(super) fn bpf_json(&self) -> Option<serde_json::Value> {
        match self {
            DriverStats::Bpf(h) => serde_json::to_value(h.get()).ok(),
            DriverStats::Nft(_) => None,
        }
    }
}

/// The dataplane driver: the Linux one (nftables) unless `MARGAY_DATAPLANE=recording` asks for
/// the recording driver (computes and records, programs nothing: tests and dry runs).
pub(super) fn make_driver(
    env: &BTreeMap<String, String>,
    config: &margay_felix_config::Config,
    hostname: &str,
    encap: Encap,
) -> Result<DriverParts, StartError> {
    use margay_dataplane::linux_driver::{LinuxDriver, LinuxDriverConfig};
    use margay_dataplane::nft::NftRunner;
    use margay_dataplane::nft_driver::NftDriverConfig;
    let mode = env
        .get("MARGAY_DATAPLANE")
        .map(|s| s.trim().to_ascii_lowercase())
        .unwrap_or_else(|| "linux".into());
    match mode.as_str() {
        "recording" => {
            let (driver, recording) = RecordingDriver::new(false);
            tracing::info!(
                driver = driver.name(),
                "Starting the recording dataplane driver (MARGAY_DATAPLANE=recording): it keeps \
                 what the calculation graph asks for (see margay felix status) and programs \
                 nothing in the kernel"
            );
            Ok((Box::new(driver), recording, None))
        }
        "linux" => {
            if !config.nftables_mode.eq_ignore_ascii_case("enabled")
                && !config.nftables_mode.eq_ignore_ascii_case("auto")
            {
                tracing::warn!(
                    mode = %config.nftables_mode,
                    "NFTablesMode is not Enabled/Auto, but margay programs policy with nftables only"
                );
            }
            let nft =
                crate::dataplane_config::nft_config(config, encap).map_err(StartError::Fatal)?;
            let mut routing = crate::dataplane_config::routing_config(config, hostname);
            let links = margay_dataplane::linux::netlink::Netlink::open()
                .and_then(|mut nl| nl.links())
                .map_err(|e| {
                    StartError::Fatal(format!(
                        "cannot list the host's interfaces: {e} (Felix needs CAP_NET_ADMIN in \
                         the node's network namespace)"
                    ))
                })?;
            let mtus = detect_mtus(env, config, encap, &links)?;
            let flowtable = crate::dataplane_config::flowtable_devices(config, &links)
                .map_err(StartError::Fatal)?;
            if let Some(r) = &mut routing {
                r.vxlan.mtu = mtus.vxlan;
                r.vxlan_v6.mtu = mtus.vxlan_v6;
            }
            if config.route_sync_disabled {
                tracing::info!(
                    "RouteSyncDisabled: Felix programs no routes and no VXLAN device (policy only)"
                );
            }
            // Calico reads the host's default reverse-path filter once, for the workload
            // interfaces (strict when it cannot be read).
            let sys = margay_dataplane::linux::sysctl::ProcSys::default();
            let default_rp_filter = sys.read("net/ipv4/conf/default/rp_filter").unwrap_or_else(
                |e| {
                    tracing::warn!(
                        "could not determine the default rp_filter setting ({e}); using strict (1)"
                    );
                    margay_dataplane::linux::sysctl::DEFAULT_RP_FILTER.to_string()
                },
            );
            let global_sysctls = margay_dataplane::linux::sysctl::global_sysctls(
                config.ip_forwarding.eq_ignore_ascii_case("Enabled"),
                config.ipv6_support,
            );
            let interfaces = margay_dataplane::linux::interfaces::InterfaceConfig {
                ipv6: config.ipv6_support,
                default_rp_filter,
                refresh_interval: config.interface_refresh_interval,
            };
            if !config.bpf_enabled {
                // A previous run with BPFEnabled=true left its programs pinned on the
                // workload interfaces: they would go on enforcing its last rules.
                let dir = match env.get(ENV_BPF_PIN_DIR) {
                    Some(d) => PathBuf::from(d),
                    None => margay_bpf::loader::pin_dir_for(
                        std::path::Path::new("/sys/fs/bpf/margay"),
                        hostname,
                    ),
                };
                match margay_bpf::inspect::remove_pins(&dir) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(
                        pin_dir = %dir.display(),
                        pins = n,
                        "BPFEnabled is false: removed the eBPF dataplane's programs and maps left by a previous run"
                    ),
                    Err(e) => tracing::warn!(
                        pin_dir = %dir.display(),
                        "BPFEnabled is false but the eBPF dataplane's pins could not be removed: {e} (remove them with margay bpf cleanup)"
                    ),
                }
            }
            if config.bpf_enabled {
                return make_bpf_driver(
                    env,
                    config,
                    hostname,
                    &nft,
                    routing,
                    global_sysctls,
                    interfaces,
                );
            }
            let (driver, recording, stats) = LinuxDriver::new(LinuxDriverConfig {
                nft: NftDriverConfig {
                    nft,
                    runner: NftRunner::default(),
                    refresh_interval: config.policy_refresh_interval(),
                    flowtable_extra_devices: flowtable,
                },
                routing,
                route_refresh_interval: config.route_refresh_interval,
                status_prefix: (!config.endpoint_status_path_prefix.is_empty())
                    .then(|| std::path::PathBuf::from(&config.endpoint_status_path_prefix)),
                global_sysctls,
                interfaces: Some(interfaces),
            });
            tracing::info!(
                driver = driver.name(),
                "Starting the Linux dataplane driver: nftables table inet margay (nothing is \
                 written before the datastore is in sync)"
            );
            Ok((Box::new(driver), recording, Some(DriverStats::Nft(stats))))
        }
        other => Err(StartError::Fatal(format!(
            "MARGAY_DATAPLANE={other:?} is not a dataplane driver: use linux (the default) or recording"
        ))),
    }
}

/// Overrides where the eBPF dataplane pins its maps (default `/sys/fs/bpf/margay/<node>`,
/// mounting a BPF filesystem on /sys/fs/bpf when there is none).
pub const ENV_BPF_PIN_DIR: &str = "MARGAY_BPF_PIN_DIR";

/// `BPFEnabled=true`: the eBPF driver, with the routing, sysctl and interface parts the Linux
/// driver would have used.
fn make_bpf_driver(
    env: &BTreeMap<String, String>,
    config: &Config,
    hostname: &str,
    nft: &margay_dataplane::nft::NftConfig,
    routing: Option<margay_dataplane::linux::routing::RoutingConfig>,
    global_sysctls: Vec<margay_dataplane::linux::sysctl::Sysctl>,
    interfaces: margay_dataplane::linux::interfaces::InterfaceConfig,
) -> Result<DriverParts, StartError> {
    use margay_dataplane::bpf_driver::{BpfDriver, BpfDriverConfig};
    let (pin_dir, bpffs_mount) = match env.get(ENV_BPF_PIN_DIR) {
        Some(d) => (PathBuf::from(d), None),
        None => (
            margay_bpf::loader::pin_dir_for(std::path::Path::new("/sys/fs/bpf/margay"), hostname),
            Some(PathBuf::from("/sys/fs/bpf")),
        ),
    };
    let (mut driver, recording) = BpfDriver::new(BpfDriverConfig {
        pin_dir: pin_dir.clone(),
        bpffs_mount,
        compile: margay_bpf::compile::CompileConfig {
            workload_vxlan_port: nft.workload_vxlan_port,
            drop_ipip_from_workloads: nft.drop_ipip_from_workloads,
        },
        routing,
        route_refresh_interval: config.route_refresh_interval,
        status_prefix: (!config.endpoint_status_path_prefix.is_empty())
            .then(|| PathBuf::from(&config.endpoint_status_path_prefix)),
        global_sysctls,
        interfaces: Some(interfaces),
        workload_prefixes: nft.workload_prefixes.clone(),
        host_nft: Some(margay_dataplane::bpf_host_nft::HostNftConfig {
            workload_prefixes: nft.workload_prefixes.clone(),
            endpoint_to_host: nft.endpoint_to_host,
            nat: nft.nat.clone(),
        }),
    })
    .map_err(|e| {
        StartError::Fatal(format!(
            "BPFEnabled is true but the eBPF dataplane cannot start: {e} (set BPFEnabled=false \
             to use nftables)"
        ))
    })?;
    // Services from outside (NodePorts) on the interfaces BPFDataIfacePattern names.
    if let Some(p) = &config.bpf_data_iface_pattern
        && let Err(e) = driver.set_data_interfaces(p)
    {
        tracing::warn!("BPFDataIfacePattern {p:?}: {e}; using Calico's default");
    }
    tracing::info!(
        driver = driver.name(),
        pin_dir = %pin_dir.display(),
        "Starting the eBPF dataplane driver (BPFEnabled): policy in BPF programs on the \
         workload interfaces (nothing is written before the datastore is in sync)"
    );
    let stats = DriverStats::Bpf(driver.status_handle());
    Ok((Box::new(driver), recording, Some(stats)))
}

/// Overrides where Felix writes the pod MTU (Calico's fixed `/var/lib/calico/mtu`): for tests
/// and for several nodes on one machine (the lab).
pub const ENV_MTU_FILE: &str = "MARGAY_MTU_FILE";

/// Calico's MTU auto-detection at start: the host MTU from the interfaces MTUIfacePattern
/// matches, the VXLAN MTUs, and the pod MTU written for the CNI plugin (a write failure stops
/// Felix with RequireMTUFile, else it is logged).
fn detect_mtus(
    env: &BTreeMap<String, String>,
    config: &Config,
    encap: Encap,
    links: &[margay_dataplane::linux::netlink::Link],
) -> Result<crate::dataplane_config::Mtus, StartError> {
    let (mtus, used) =
        crate::dataplane_config::mtus(config, encap, links).map_err(StartError::Fatal)?;
    if used.is_empty() {
        tracing::warn!(
            pattern = config.mtu_iface_pattern.as_deref().unwrap_or(""),
            host_mtu = mtus.host,
            "No up interface matches MTUIfacePattern; assuming the host MTU is 1460. To detect \
             it, set mtuIfacePattern to match your host's interfaces"
        );
    }
    tracing::info!(host_mtu = mtus.host, pod_mtu = mtus.pod, vxlan_mtu = mtus.vxlan, interfaces = ?used, "Determined MTUs");
    let file = env
        .get(ENV_MTU_FILE)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(margay_dataplane::linux::mtu::MTU_FILE));
    let written = file
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&file, mtus.pod.to_string()));
    match written {
        Ok(()) => tracing::debug!(file = %file.display(), mtu = mtus.pod, "wrote the pod MTU"),
        Err(e) if config.require_mtu_file => {
            return Err(StartError::Fatal(format!(
                "cannot write the MTU file {}: {e}, and RequireMTUFile is set (fix the \
                 directory's permissions or unset RequireMTUFile)",
                file.display()
            )));
        }
        Err(e) => tracing::error!(
            file = %file.display(),
            "cannot write the MTU file: {e}; pods may not get the right MTU"
        ),
    }
    Ok(mtus)
}

/// The encapsulation the pools call for, decided exactly as the calculation graph decides it
/// (by asking a scratch graph), so that start-up and run time never disagree.
pub(super) fn pool_encap(pools: &[Resource]) -> Encap {
    let mut g = CalcGraph::new(CalcConfig::default());
    for p in pools.iter().filter(|p| p.validate().is_ok()) {
        g.on_update(&p.key(), Some(p.clone()));
    }
    g.on_in_sync();
    g.flush()
        .into_iter()
        .find_map(|m| match m {
            Message::Encapsulation {
                ipip,
                vxlan,
                vxlan_v6,
            } => Some(Encap {
                ipip,
                vxlan,
                vxlan_v6,
            }),
            _ => None,
        })
        .unwrap_or(Encap {
            ipip: false,
            vxlan: false,
            vxlan_v6: false,
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::EncapPolicy;
    use super::*;

    fn pool(yaml_spec: &str) -> Resource {
        margay_api::decode_one(&format!(
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: p}}\nspec: {yaml_spec}"
        ))
        .unwrap()
    }

    #[test]
    fn encapsulation_follows_pools_unless_forced() {
        let none = pool_encap(&[]);
        assert_eq!(
            none,
            Encap {
                ipip: false,
                vxlan: false,
                vxlan_v6: false
            }
        );
        let vx = pool_encap(&[pool("{cidr: 10.0.0.0/16, vxlanMode: Always}")]);
        assert!(vx.vxlan && !vx.ipip);
        let ip = pool_encap(&[pool("{cidr: 10.0.0.0/16, ipipMode: CrossSubnet}")]);
        assert!(ip.ipip && !ip.vxlan);
        let p = EncapPolicy {
            ipip_override: Some(false),
            vxlan_override: None,
            startup: none,
        };
        assert_eq!(p.effective(ip), none);
        assert!(p.effective(vx).vxlan);
    }
}
