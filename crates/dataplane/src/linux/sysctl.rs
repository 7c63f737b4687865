//! Host settings under `/proc/sys` that workloads need, as Calico's Felix makes them.
//!
//! Which settings, with which values, is decided here by pure functions:
//!
//! - [`global_sysctls`]: at start, with `IPForwarding: Enabled` (Calico's default), IPv4
//!   forwarding (`net.ipv4.ip_forward`) and, where IPv6 is on, IPv6 forwarding
//!   (`net.ipv6.conf.all.forwarding`); with `Disabled` nothing at all (the operator's own
//!   settings stand).
//! - [`workload_sysctls`]: on every local workload's host-side interface, what Calico's
//!   endpoint manager writes: `route_localnet=1` (NAT to the host's loopback), `proxy_delay=0`,
//!   `proxy_arp=1` (the host answers for 169.254.1.1), `forwarding=1`, `rp_filter` (the host's
//!   default, read from `net.ipv4.conf.default.rp_filter` at start, or 0 for an interface whose
//!   workload may send from other addresses), `accept_ra=0` (always, also without IPv6: a
//!   workload must not configure the host's routes) and, with IPv6, `proxy_ndp=1` and
//!   `forwarding=1`.
//!
//! [`ProcSys`] is the adapter: it reads each setting and writes only those that differ, so a
//! periodic re-check (InterfaceRefreshInterval) repairs drift without rewriting anything.
//! `/proc/sys/net` belongs to the network namespace of the thread that opens the file: call it
//! only on a thread in the node's namespace (Felix runs there; tests run it only inside
//! namespaces they made).

pub use margay_netlink::sysctl::{ProcSys, Sysctl, SysctlReport};

/// Calico's fallback when the host's default `rp_filter` cannot be read: strict.
pub const DEFAULT_RP_FILTER: &str = "1";

/// The global settings Felix makes at start. `ip_forwarding`: IPForwarding is `Enabled`;
/// `ipv6`: Ipv6Support.
pub fn global_sysctls(ip_forwarding: bool, ipv6: bool) -> Vec<Sysctl> {
    if !ip_forwarding {
        return Vec::new();
    }
    let mut out = vec![Sysctl::new("net/ipv4/ip_forward".into(), "1")];
    if ipv6 {
        out.push(Sysctl::new("net/ipv6/conf/all/forwarding".into(), "1"));
    }
    out
}

/// The settings of one workload's host-side interface. `rp_filter` is the value for its
/// IPv4 reverse-path filter (see [`workload_rp_filter`]).
pub fn workload_sysctls(iface: &str, ipv6: bool, rp_filter: &str) -> Vec<Sysctl> {
    let mut out = vec![
        // Even without IPv6, a workload must not be able to configure the host with router
        // advertisements.
        Sysctl::best_effort(format!("net/ipv6/conf/{iface}/accept_ra"), "0"),
        Sysctl::new(format!("net/ipv4/conf/{iface}/route_localnet"), "1"),
        Sysctl::best_effort(format!("net/ipv4/neigh/{iface}/proxy_delay"), "0"),
        Sysctl::new(format!("net/ipv4/conf/{iface}/proxy_arp"), "1"),
        Sysctl::new(format!("net/ipv4/conf/{iface}/forwarding"), "1"),
        Sysctl::new(format!("net/ipv4/conf/{iface}/rp_filter"), rp_filter),
    ];
    if ipv6 {
        out.push(Sysctl::new(format!("net/ipv6/conf/{iface}/proxy_ndp"), "1"));
        out.push(Sysctl::new(
            format!("net/ipv6/conf/{iface}/forwarding"),
            "1",
        ));
    }
    out
}

/// The reverse-path filter for a workload interface: off when the workload may send from
/// addresses that are not routed to it (allowed source prefixes, which only reach the
/// dataplane with WorkloadSourceSpoofing `Any`), else the host's default.
pub fn workload_rp_filter(may_spoof: bool, host_default: &str) -> String {
    if may_spoof {
        "0".into()
    } else {
        let d = host_default.trim();
        if d.is_empty() {
            DEFAULT_RP_FILTER.into()
        } else {
            d.to_string()
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn paths(v: &[Sysctl]) -> Vec<(&str, &str)> {
        v.iter()
            .map(|s| (s.path.as_str(), s.value.as_str()))
            .collect()
    }

    #[test]
    fn forwarding_follows_ip_forwarding_and_ipv6() {
        assert_eq!(
            paths(&global_sysctls(true, true)),
            vec![
                ("net/ipv4/ip_forward", "1"),
                ("net/ipv6/conf/all/forwarding", "1")
            ]
        );
        assert_eq!(
            paths(&global_sysctls(true, false)),
            vec![("net/ipv4/ip_forward", "1")]
        );
        // Disabled: the host's settings are left alone, whatever they are.
        assert!(global_sysctls(false, true).is_empty());
    }

    #[test]
    fn workload_interface_settings_are_calicos() {
        let v4 = workload_sysctls("cali123", false, "1");
        assert_eq!(
            paths(&v4),
            vec![
                ("net/ipv6/conf/cali123/accept_ra", "0"),
                ("net/ipv4/conf/cali123/route_localnet", "1"),
                ("net/ipv4/neigh/cali123/proxy_delay", "0"),
                ("net/ipv4/conf/cali123/proxy_arp", "1"),
                ("net/ipv4/conf/cali123/forwarding", "1"),
                ("net/ipv4/conf/cali123/rp_filter", "1"),
            ]
        );
        let best: Vec<&str> = v4
            .iter()
            .filter(|s| s.best_effort)
            .map(|s| s.path.as_str())
            .collect();
        assert_eq!(
            best,
            vec![
                "net/ipv6/conf/cali123/accept_ra",
                "net/ipv4/neigh/cali123/proxy_delay"
            ]
        );
        let v6 = workload_sysctls("cali123", true, "2");
        assert!(paths(&v6).contains(&("net/ipv6/conf/cali123/proxy_ndp", "1")));
        assert!(paths(&v6).contains(&("net/ipv6/conf/cali123/forwarding", "1")));
        assert!(paths(&v6).contains(&("net/ipv4/conf/cali123/rp_filter", "2")));
    }

    #[test]
    fn spoofing_workloads_get_no_reverse_path_filter() {
        assert_eq!(workload_rp_filter(true, "1"), "0");
        assert_eq!(workload_rp_filter(false, "2\n"), "2");
        assert_eq!(workload_rp_filter(false, ""), "1");
    }
}
