//! Rules of IPPool, IPReservation, IPAMConfiguration, ClusterInformation and
//! KubeControllersConfiguration.

use crate::ippool::{
    AllowedUse, ClusterInformationSpec, EncapMode, IPAMConfigurationSpec, IPPoolSpec,
    IPReservationSpec,
};
use crate::kubecontrollers::{KubeControllersConfigurationSpec, ReconcilerConfig};
use crate::net::Cidr;

use super::{Path, Validator};

pub(super) fn ip_pool(v: &mut Validator, p: Path<'_>, s: &IPPoolSpec) {
    let cp = p.field("cidr");
    if s.cidr.is_empty() {
        v.err(cp, "required: the pool's CIDR, e.g. 10.65.0.0/16");
    }
    let cidr = if s.cidr.is_empty() {
        None
    } else {
        match Cidr::parse(&s.cidr) {
            Ok(c) => Some(c),
            Err(e) => {
                v.err(cp, e);
                None
            }
        }
    };
    if let Some(c) = cidr {
        if !c.is_masked() {
            v.err(
                cp,
                format!(
                    "{:?} is not strictly masked (did you mean {}?)",
                    s.cidr,
                    c.network()
                ),
            );
        }
        let link_local = if c.is_ipv4() {
            "169.254.0.0/16"
        } else {
            "fe80::/10"
        };
        if let Ok(ll) = Cidr::parse(link_local)
            && ll.overlaps(&c)
        {
            v.err(
                cp,
                format!("{:?} overlaps the link-local range {link_local}", s.cidr),
            );
        }
        let (lo, hi, default) = if c.is_ipv4() {
            (20, 32, i64::from(IPPoolSpec::DEFAULT_BLOCK_SIZE_V4))
        } else {
            (116, 128, i64::from(IPPoolSpec::DEFAULT_BLOCK_SIZE_V6))
        };
        let bp = p.field("blockSize");
        match s.block_size {
            Some(b) if b != 0 && !(lo..=hi).contains(&b) => v.err(
                bp,
                format!(
                    "{b} is out of range for an IPv{} pool (must be {lo}-{hi})",
                    c.version()
                ),
            ),
            _ => {}
        }
        let block = s.block_size.filter(|b| *b != 0).unwrap_or(default);
        if !s.disabled && i64::from(c.prefix()) > block {
            // Point at blockSize when the operator chose it, else at the pool's CIDR.
            let at = if s.block_size.is_some_and(|b| b != 0) {
                bp
            } else {
                cp
            };
            v.err(
                at,
                format!(
                    "pool /{} is smaller than one IPAM block (/{block}): use a pool of /{block} or larger, or a longer blockSize",
                    c.prefix()
                ),
            );
        }
        if !c.is_ipv4() && s.ipip().is_enabled() {
            v.err(
                p.field("ipipMode"),
                "IPIP is not supported on IPv6 pools (use vxlanMode)",
            );
        }
    }
    if s.ipip().is_enabled() && s.vxlan().is_enabled() {
        v.err(
            p.field("vxlanMode"),
            "ipipMode and vxlanMode cannot both be enabled on one pool",
        );
    }
    v.selector_without_global(
        &s.node_selector,
        p.field("nodeSelector"),
        "an IPPool nodeSelector",
    );
    v.selector_without_global(
        &s.namespace_selector,
        p.field("namespaceSelector"),
        "an IPPool namespaceSelector",
    );

    let up = p.field("allowedUses");
    if s.allowed_uses.len() > 10 {
        v.err(up, "at most 10 entries");
    }
    let uses = |u: AllowedUse| s.allowed_uses.contains(&u);
    if uses(AllowedUse::LoadBalancer) {
        if uses(AllowedUse::Workload) || uses(AllowedUse::Tunnel) {
            v.err(
                up,
                "LoadBalancer cannot be combined with Workload or Tunnel",
            );
        }
        for (field, mode) in [("ipipMode", s.ipip()), ("vxlanMode", s.vxlan())] {
            if mode != EncapMode::Never {
                v.err(
                    p.field(field),
                    "a LoadBalancer pool cannot use IPIP or VXLAN encapsulation",
                );
            }
        }
        if s.disable_bgp_export {
            v.err(
                p.field("disableBGPExport"),
                "a LoadBalancer pool cannot disable BGP export",
            );
        }
        // An empty nodeSelector defaults to all().
        if !s.node_selector.is_empty() && s.node_selector.trim() != "all()" {
            v.err(
                p.field("nodeSelector"),
                "a LoadBalancer pool must have nodeSelector \"all()\"",
            );
        }
    }
    if uses(AllowedUse::Tunnel) && !s.namespace_selector.is_empty() {
        v.err(
            p.field("namespaceSelector"),
            "a pool allowed for Tunnel use cannot have a namespaceSelector",
        );
    }
}

pub(super) fn ip_reservation(v: &mut Validator, p: Path<'_>, s: &IPReservationSpec) {
    let rp = p.field("reservedCIDRs");
    for (i, c) in s.reserved_cidrs.iter().enumerate() {
        if let Err(e) = Cidr::parse_cidr_or_ip(c) {
            v.err(rp.index(i), e);
        }
    }
}

pub(super) fn ipam_configuration(v: &mut Validator, p: Path<'_>, s: &IPAMConfigurationSpec) {
    v.range(
        s.max_blocks_per_host,
        p.field("maxBlocksPerHost"),
        0,
        1_000_000,
    );
    v.range(s.ip_cooldown_seconds, p.field("ipCooldownSeconds"), 0, 1200);
}

pub(super) fn cluster_information(v: &mut Validator, p: Path<'_>, s: &ClusterInformationSpec) {
    if !s.cluster_guid.is_empty()
        && !s
            .cluster_guid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        v.err(
            p.field("clusterGUID"),
            format!(
                "{:?} is not a valid cluster GUID (letters, digits and '-')",
                s.cluster_guid
            ),
        );
    }
}

pub(super) fn kube_controllers_configuration(
    v: &mut Validator,
    p: Path<'_>,
    s: &KubeControllersConfigurationSpec,
) {
    v.one_of(
        (!s.log_severity_screen.is_empty()).then_some(s.log_severity_screen.as_str()),
        p.field("logSeverityScreen"),
        &[
            "None", "Debug", "Info", "Warning", "Error", "Fatal", "Panic",
        ],
    );
    v.duration(
        &s.etcd_v3_compaction_period,
        p.field("etcdV3CompactionPeriod"),
    );
    v.range(
        s.prometheus_metrics_port,
        p.field("prometheusMetricsPort"),
        0,
        65535,
    );
    v.range(s.debug_profile_port, p.field("debugProfilePort"), 0, 65535);
    let cp = p.field("controllers");
    let c = &s.controllers;
    if let Some(node) = &c.node {
        let np = cp.field("node");
        v.duration(&node.reconciler_period, np.field("reconcilerPeriod"));
        v.duration(&node.leak_grace_period, np.field("leakGracePeriod"));
        if let Some(hep) = &node.host_endpoint {
            let hp = np.field("hostEndpoint");
            let tp = hp.field("templates");
            for (i, t) in hep.templates.iter().enumerate() {
                let ip = tp.index(i);
                if !t.generate_name.is_empty() {
                    v.dns_name(&t.generate_name, ip.field("generateName"));
                }
                v.cidr_list(Some(&t.interface_cidrs), ip.field("interfaceCIDRs"));
                if !t.interface_pattern.is_empty() {
                    v.regex(Some(&t.interface_pattern), ip.field("interfacePattern"));
                }
                v.labels(&t.labels, ip.field("labels"));
                super::meta::annotations(v, ip.field("annotations"), &t.annotations);
                v.selector(&t.node_selector, ip.field("nodeSelector"));
            }
        }
    }
    let reconcilers: [(&str, &Option<ReconcilerConfig>); 4] = [
        ("policy", &c.policy),
        ("workloadEndpoint", &c.workload_endpoint),
        ("serviceAccount", &c.service_account),
        ("namespace", &c.namespace),
    ];
    for (name, rc) in reconcilers {
        if let Some(rc) = rc {
            v.duration(
                &rc.reconciler_period,
                cp.field(name).field("reconcilerPeriod"),
            );
        }
    }
}
