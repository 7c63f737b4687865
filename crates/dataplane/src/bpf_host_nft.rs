//! What the eBPF driver still leaves to nftables in this milestone: a small table,
//! `inet margay-bpf`, with
//! - traffic from workloads to the host itself (after their egress policy, which the BPF
//!   program applied): DefaultEndpointToHostAction, established flows first;
//! - natOutgoing: the same masquerade rules as the nftables dataplane
//!   ([`crate::nft::render::nat_outgoing_rules`]) over sets of pools and hosts.
//!
//! The table is replaced whole in one `nft -f -` transaction, and only when its text changes.

use std::process::Command;
use std::time::Duration;

use margay_api::net::Cidr;
use margay_calc::DataplaneModel;

use crate::nft::render::{nat_outgoing_rules, normalize_cidrs};
use crate::nft::{EndpointToHostAction, NatOutgoing};

pub const TABLE: &str = "margay-bpf";

/// What the table says, from Felix's configuration.
#[derive(Debug, Clone)]
pub struct HostNftConfig {
    /// Interface name prefixes of workloads (InterfacePrefix), e.g. `cali`.
    pub workload_prefixes: Vec<String>,
    pub endpoint_to_host: EndpointToHostAction,
    pub nat: NatOutgoing,
}

fn set(name: &str, cidrs: Vec<Cidr>) -> String {
    let elems: Vec<String> = normalize_cidrs(cidrs)
        .iter()
        .filter(|c| c.is_ipv4())
        .map(|c| c.to_string())
        .collect();
    if elems.is_empty() {
        format!("  set {name} {{ type ipv4_addr; flags interval; }}\n")
    } else {
        format!(
            "  set {name} {{ type ipv4_addr; flags interval; elements = {{ {} }} }}\n",
            elems.join(", ")
        )
    }
}

/// The table's text (without the replace preamble).
pub fn render(cfg: &HostNftConfig, model: &DataplaneModel) -> String {
    let pools: Vec<Cidr> = model.pools.values().map(|p| p.cidr).collect();
    let masq: Vec<Cidr> = model
        .pools
        .values()
        .filter(|p| p.masquerade)
        .map(|p| p.cidr)
        .collect();
    let hosts: Vec<Cidr> = model
        .hosts
        .values()
        .filter_map(|(v4, _)| *v4)
        .map(|c| Cidr::host(c.addr()))
        .collect();
    let mut t = format!("table inet {TABLE} {{\n");
    t.push_str(&set("all-pools-4", pools));
    t.push_str(&set("masq-pools-4", masq));
    t.push_str(&set("all-hosts-4", hosts));
    t.push_str("  chain input {\n    type filter hook input priority filter; policy accept;\n");
    let verdict = match cfg.endpoint_to_host {
        EndpointToHostAction::Drop => Some("drop comment \"DefaultEndpointToHostAction\""),
        EndpointToHostAction::Accept => Some("accept"),
        EndpointToHostAction::Return => None,
    };
    for p in &cfg.workload_prefixes {
        let p = p.replace('"', "");
        t.push_str(&format!(
            "    iifname \"{p}*\" ct state established,related accept\n"
        ));
        if let Some(v) = verdict {
            t.push_str(&format!("    iifname \"{p}*\" {v}\n"));
        }
    }
    t.push_str("  }\n");
    t.push_str(
        "  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n",
    );
    for r in nat_outgoing_rules(&cfg.nat, 4) {
        t.push_str(&format!("    {r}\n"));
    }
    t.push_str("  }\n}\n");
    t
}

#[derive(Debug, thiserror::Error)]
#[error("writing nftables table inet {TABLE}: {0}")]
pub struct HostNftError(String);

/// Keeps the table equal to [`render`]'s text, in the calling thread's network namespace.
#[derive(Debug)]
pub struct HostNft {
    cfg: HostNftConfig,
    written: Option<String>,
}

impl HostNft {
    pub fn new(cfg: HostNftConfig) -> HostNft {
        HostNft { cfg, written: None }
    }

    pub fn sync(&mut self, model: &DataplaneModel) -> Result<(), HostNftError> {
        let text = render(&self.cfg, model);
        if self.written.as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        // Create-then-delete makes the replace work whether or not the table exists.
        let script = format!("table inet {TABLE} {{}}\ndelete table inet {TABLE}\n{text}");
        let done = crate::exec::run(
            Command::new("nft").args(["-f", "-"]),
            script.as_bytes(),
            Duration::from_secs(30),
            1 << 20,
        )
        .map_err(|e| HostNftError(format!("{e} (is nftables installed?)")))?;
        if !done.status.success() {
            return Err(HostNftError(
                String::from_utf8_lossy(&done.stderr).trim().to_string(),
            ));
        }
        self.written = Some(text);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_endpoint_to_host_and_nat_outgoing_for_masquerading_pools() {
        let mut model = DataplaneModel::default();
        for (id, cidr, masq) in [("a", "10.65.0.0/16", true), ("b", "10.66.0.0/16", false)] {
            model.pools.insert(
                id.into(),
                margay_calc::PoolData {
                    cidr: Cidr::parse(cidr).expect("cidr"),
                    masquerade: masq,
                    ipip: margay_calc::EncapMode::Never,
                    vxlan: margay_calc::EncapMode::Never,
                    disabled: false,
                },
            );
        }
        let cfg = HostNftConfig {
            workload_prefixes: vec!["cali".into()],
            endpoint_to_host: EndpointToHostAction::Drop,
            nat: NatOutgoing::default(),
        };
        let t = render(&cfg, &model);
        assert!(
            t.contains(
                "set masq-pools-4 { type ipv4_addr; flags interval; elements = { 10.65.0.0/16 } }"
            ),
            "{t}"
        );
        assert!(
            t.contains("elements = { 10.65.0.0/16, 10.66.0.0/16 }"),
            "{t}"
        );
        assert!(
            t.contains(
                "iifname \"cali*\" ct state established,related accept\n    iifname \"cali*\" drop"
            ),
            "{t}"
        );
        assert!(
            t.contains("ip saddr @masq-pools-4 ip daddr != @all-pools-4 masquerade"),
            "{t}"
        );
        let ret = render(
            &HostNftConfig {
                endpoint_to_host: EndpointToHostAction::Return,
                ..cfg
            },
            &model,
        );
        assert!(!ret.contains("drop"), "{ret}");
    }
}
