//! `get`'s table output: calicoctl's columns per kind (narrow, `-o wide`, and every column
//! `-o custom-columns=` may name), laid out as calicoctl's tab writer does it.

use margay_api::{Kind, Resource};
use serde_json::Value;

/// Values the table needs from outside the resource itself.
#[derive(Debug, Clone, Default)]
pub(crate) struct TableContext {
    /// The cluster's default AS number (BGPConfiguration `default`, else 64512), shown in
    /// parentheses for nodes that do not set their own.
    pub default_asn: Option<String>,
}

/// calicoctl's default columns for a kind: narrow or wide.
pub(crate) fn default_headings(kind: Kind, wide: bool) -> &'static [&'static str] {
    let (narrow, wide_cols): (&[&str], &[&str]) = match kind {
        Kind::BGPConfiguration => (
            &["NAME", "LOGSEVERITY", "MESHENABLED", "ASNUMBER"],
            &["NAME", "LOGSEVERITY", "MESHENABLED", "ASNUMBER"],
        ),
        Kind::BGPFilter => (
            &[
                "NAME",
                "NUMEXPORTV4",
                "NUMIMPORTV4",
                "NUMEXPORTV6",
                "NUMIMPORTV6",
            ],
            &[
                "NAME",
                "NUMEXPORTV4",
                "NUMIMPORTV4",
                "NUMEXPORTV6",
                "NUMIMPORTV6",
            ],
        ),
        Kind::BGPPeer => (
            &["NAME", "PEERIP", "NODE", "ASN"],
            &["NAME", "PEERIP", "NODE", "ASN"],
        ),
        Kind::ClusterInformation => (
            &[
                "NAME",
                "CLUSTERGUID",
                "CLUSTERTYPE",
                "CALICOVERSION",
                "DATASTOREREADY",
            ],
            &[
                "NAME",
                "CLUSTERGUID",
                "CLUSTERTYPE",
                "CALICOVERSION",
                "DATASTOREREADY",
            ],
        ),
        Kind::FelixConfiguration | Kind::KubeControllersConfiguration => (&["NAME"], &["NAME"]),
        Kind::GlobalNetworkPolicy | Kind::NetworkPolicy => {
            (&["NAME", "TIER"], &["NAME", "TIER", "ORDER", "SELECTOR"])
        }
        Kind::GlobalNetworkSet | Kind::NetworkSet => (&["NAME"], &["NAME", "NETS"]),
        Kind::HostEndpoint => (
            &["NAME", "NODE"],
            &["NAME", "NODE", "INTERFACE", "IPS", "PROFILES"],
        ),
        Kind::IPAMConfiguration => (
            &["NAME", "STRICTAFFINITY", "AUTOALLOCATEBLOCKS"],
            &[
                "NAME",
                "STRICTAFFINITY",
                "AUTOALLOCATEBLOCKS",
                "MAXBLOCKSPERHOST",
            ],
        ),
        Kind::IPPool => (
            &["NAME", "CIDR", "SELECTOR"],
            &[
                "NAME",
                "CIDR",
                "NAT",
                "IPIPMODE",
                "VXLANMODE",
                "DISABLED",
                "DISABLEBGPEXPORT",
                "SELECTOR",
                "ASSIGNMENTMODE",
            ],
        ),
        Kind::IPReservation => (&["NAME"], &["NAME", "CIDRS"]),
        Kind::Node => (&["NAME"], &["NAME", "ASN", "IPV4", "IPV6"]),
        Kind::Profile => (&["NAME"], &["NAME", "LABELS"]),
        Kind::Tier => (&["NAME", "ORDER"], &["NAME", "ORDER"]),
        Kind::WorkloadEndpoint => (
            &["WORKLOAD", "NODE", "NETWORKS", "INTERFACE"],
            &[
                "NAME",
                "WORKLOAD",
                "NODE",
                "NETWORKS",
                "INTERFACE",
                "PROFILES",
                "NATS",
            ],
        ),
    };
    if wide { wide_cols } else { narrow }
}

/// Every column a kind has (what `-o custom-columns=` accepts).
pub(crate) fn all_headings(kind: Kind) -> Vec<&'static str> {
    let mut all: Vec<&'static str> = default_headings(kind, true).to_vec();
    if kind.is_namespaced() {
        all.insert(0, "NAMESPACE");
    }
    if kind == Kind::WorkloadEndpoint {
        all.push("ORCHESTRATOR");
    }
    all
}

/// Checks custom column names against the kind's.
pub(crate) fn check_headings(kind: Kind, headings: &[String]) -> Result<(), String> {
    let all = all_headings(kind);
    match headings.iter().find(|h| !all.contains(&h.as_str())) {
        Some(h) => Err(format!(
            "unknown heading {h}, valid values are: {}",
            all.join(", ")
        )),
        None => Ok(()),
    }
}

/// The full table: headings (NAMESPACE first when `print_namespace` and the kind is
/// namespaced), one row per resource, then an empty line, as calicoctl prints it.
pub(crate) fn render(
    kind: Kind,
    headings: &[String],
    print_namespace: bool,
    resources: &[Resource],
    ctx: &TableContext,
) -> String {
    let mut headings: Vec<String> = headings.to_vec();
    if print_namespace && kind.is_namespaced() && !headings.iter().any(|h| h == "NAMESPACE") {
        headings.insert(0, "NAMESPACE".to_string());
    }
    let mut lines = vec![headings.clone()];
    for r in resources {
        let v = serde_json::to_value(r).unwrap_or(Value::Null);
        lines.push(headings.iter().map(|h| cell(kind, h, &v, ctx)).collect());
    }
    let mut out = tabwrite(&lines);
    out.push('\n');
    out
}

/// Lays out cells like Go's tabwriter with calicoctl's settings (minimum width 5, padding
/// 3, every cell tab-terminated): each column is as wide as its widest cell plus 3.
fn tabwrite(lines: &[Vec<String>]) -> String {
    let columns = lines.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            let widest = lines
                .iter()
                .filter_map(|l| l.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0);
            (widest + 3).max(5)
        })
        .collect();
    let mut out = String::new();
    for line in lines {
        for (cell, width) in line.iter().zip(&widths) {
            out.push_str(cell);
            for _ in cell.chars().count()..*width {
                out.push(' ');
            }
        }
        out.push('\n');
    }
    out
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn text(v: &Value, path: &[&str]) -> String {
    at(v, path).map(go_value).unwrap_or_default()
}

fn flag(v: &Value, path: &[&str], default: bool) -> String {
    at(v, path)
        .and_then(Value::as_bool)
        .unwrap_or(default)
        .to_string()
}

fn or(s: String, default: &str) -> String {
    if s.is_empty() { default.to_string() } else { s }
}

fn count(v: &Value, path: &[&str]) -> String {
    at(v, path)
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
        .to_string()
}

fn join(v: &Value, path: &[&str]) -> String {
    join_truncated(v, path, 0)
}

/// calicoctl's `joinAndTruncate`: items joined with commas, cut to `max` bytes with `...`.
fn join_truncated(v: &Value, path: &[&str], max: usize) -> String {
    let items: Vec<String> = match at(v, path) {
        Some(Value::Array(a)) => a.iter().map(go_value).collect(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| format!("{k}={}", go_value(v)))
            .collect(),
        Some(other) => vec![go_value(other)],
        None => Vec::new(),
    };
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(item);
        if max > 0 && out.len() > max {
            let mut cut = max.saturating_sub(3);
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
            out.push_str("...");
            break;
        }
    }
    out
}

/// A value as Go's `fmt` prints it in a template.
fn go_value(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => go_float(f),
            _ => n.to_string(),
        },
        Value::Array(a) => format!("[{}]", a.iter().map(go_value).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => format!(
            "{{{}}}",
            m.values().map(go_value).collect::<Vec<_>>().join(" ")
        ),
    }
}

/// A float as Go's `%v` prints it: the shortest representation, in exponent form when the
/// decimal exponent is below -4 or 6 and up (`1e+06`, `1.5e-05`).
pub(crate) fn go_float(f: f64) -> String {
    if f == 0.0 {
        return "0".to_string();
    }
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits and the decimal exponent.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        format!("{f}")
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
    }
}

fn cell(kind: Kind, heading: &str, v: &Value, ctx: &TableContext) -> String {
    fn spec<'a>(p: &[&'a str]) -> Vec<&'a str> {
        let mut path = vec!["spec"];
        path.extend_from_slice(p);
        path
    }
    match heading {
        "NAME" => return text(v, &["metadata", "name"]),
        "NAMESPACE" => return text(v, &["metadata", "namespace"]),
        _ => {}
    }
    match (kind, heading) {
        (Kind::BGPConfiguration, "LOGSEVERITY") => text(v, &spec(&["logSeverityScreen"])),
        (Kind::BGPConfiguration, "MESHENABLED") => {
            or(text(v, &spec(&["nodeToNodeMeshEnabled"])), "-")
        }
        (Kind::BGPConfiguration, "ASNUMBER") => or(text(v, &spec(&["asNumber"])), "-"),
        (Kind::BGPFilter, "NUMEXPORTV4") => count(v, &spec(&["exportV4"])),
        (Kind::BGPFilter, "NUMIMPORTV4") => count(v, &spec(&["importV4"])),
        (Kind::BGPFilter, "NUMEXPORTV6") => count(v, &spec(&["exportV6"])),
        (Kind::BGPFilter, "NUMIMPORTV6") => count(v, &spec(&["importV6"])),
        (Kind::BGPPeer, "PEERIP") => text(v, &spec(&["peerIP"])),
        (Kind::BGPPeer, "NODE") => {
            let node = text(v, &spec(&["node"]));
            let selector = text(v, &spec(&["nodeSelector"]));
            match (node.is_empty(), selector.is_empty()) {
                (false, _) => node,
                (true, false) => selector,
                (true, true) => "(global)".to_string(),
            }
        }
        (Kind::BGPPeer, "ASN") => or(text(v, &spec(&["asNumber"])), "0"),
        (Kind::ClusterInformation, "CLUSTERGUID") => text(v, &spec(&["clusterGUID"])),
        (Kind::ClusterInformation, "CLUSTERTYPE") => text(v, &spec(&["clusterType"])),
        (Kind::ClusterInformation, "CALICOVERSION") => text(v, &spec(&["calicoVersion"])),
        (Kind::ClusterInformation, "DATASTOREREADY") => text(v, &spec(&["datastoreReady"])),
        (Kind::GlobalNetworkPolicy | Kind::NetworkPolicy, "TIER") => {
            or(text(v, &spec(&["tier"])), "default")
        }
        // A float64 in Calico's types, so Go prints 1000000 as 1e+06.
        (Kind::GlobalNetworkPolicy | Kind::NetworkPolicy | Kind::Tier, "ORDER") => {
            at(v, &spec(&["order"]))
                .and_then(Value::as_f64)
                .map(go_float)
                .unwrap_or_default()
        }
        (Kind::GlobalNetworkPolicy | Kind::NetworkPolicy, "SELECTOR") => {
            text(v, &spec(&["selector"]))
        }
        (Kind::GlobalNetworkSet | Kind::NetworkSet, "NETS") => {
            join_truncated(v, &spec(&["nets"]), 80)
        }
        (Kind::HostEndpoint, "NODE") => text(v, &spec(&["node"])),
        (Kind::HostEndpoint, "INTERFACE") => text(v, &spec(&["interfaceName"])),
        (Kind::HostEndpoint, "IPS") => join(v, &spec(&["expectedIPs"])),
        (Kind::HostEndpoint | Kind::WorkloadEndpoint, "PROFILES") => join(v, &spec(&["profiles"])),
        (Kind::IPAMConfiguration, "STRICTAFFINITY") => flag(v, &spec(&["strictAffinity"]), false),
        (Kind::IPAMConfiguration, "AUTOALLOCATEBLOCKS") => {
            flag(v, &spec(&["autoAllocateBlocks"]), true)
        }
        (Kind::IPAMConfiguration, "MAXBLOCKSPERHOST") => {
            or(text(v, &spec(&["maxBlocksPerHost"])), "0")
        }
        (Kind::IPPool, "CIDR") => text(v, &spec(&["cidr"])),
        (Kind::IPPool, "NAT") => flag(v, &spec(&["natOutgoing"]), false),
        (Kind::IPPool, "IPIPMODE") => or(text(v, &spec(&["ipipMode"])), "Never"),
        (Kind::IPPool, "VXLANMODE") => or(text(v, &spec(&["vxlanMode"])), "Never"),
        (Kind::IPPool, "DISABLED") => flag(v, &spec(&["disabled"]), false),
        (Kind::IPPool, "DISABLEBGPEXPORT") => flag(v, &spec(&["disableBGPExport"]), false),
        (Kind::IPPool, "SELECTOR") => text(v, &spec(&["nodeSelector"])),
        (Kind::IPPool, "ASSIGNMENTMODE") => or(text(v, &spec(&["assignmentMode"])), "Automatic"),
        (Kind::IPReservation, "CIDRS") => join_truncated(v, &spec(&["reservedCIDRs"]), 80),
        (Kind::Node, "ASN") => match at(v, &["spec", "bgp"]) {
            Some(bgp) if !bgp.is_null() => match bgp.get("asNumber") {
                Some(asn) if !asn.is_null() => go_value(asn),
                _ => format!(
                    "({})",
                    ctx.default_asn.clone().unwrap_or_else(|| "64512".into())
                ),
            },
            _ => String::new(),
        },
        (Kind::Node, "IPV4") => text(v, &spec(&["bgp", "ipv4Address"])),
        (Kind::Node, "IPV6") => text(v, &spec(&["bgp", "ipv6Address"])),
        (Kind::Profile, "LABELS") => join(v, &spec(&["labelsToApply"])),
        (Kind::WorkloadEndpoint, "WORKLOAD") => {
            or(text(v, &spec(&["workload"])), &text(v, &spec(&["pod"])))
        }
        (Kind::WorkloadEndpoint, "NODE") => text(v, &spec(&["node"])),
        (Kind::WorkloadEndpoint, "NETWORKS") => join(v, &spec(&["ipNetworks"])),
        (Kind::WorkloadEndpoint, "INTERFACE") => text(v, &spec(&["interfaceName"])),
        (Kind::WorkloadEndpoint, "ORCHESTRATOR") => text(v, &spec(&["orchestrator"])),
        (Kind::WorkloadEndpoint, "NATS") => at(v, &["spec", "ipNATs"])
            .and_then(Value::as_array)
            .map(|nats| {
                nats.iter()
                    .map(|n| {
                        format!(
                            "{{{} {}}}",
                            text(n, &["internalIP"]),
                            text(n, &["externalIP"])
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default(),
        _ => String::new(),
    }
}
