//! Turning datastore resources into raw settings, the way Calico's update processors do.
//!
//! - ClusterInformation `default` → ClusterGUID, ClusterType, CalicoVersion, Variant (global);
//!   its `datastoreReady` is the ready flag, not a parameter.
//! - FelixConfiguration `default` → global; `node.<hostname>` → per-host; any other name with a
//!   `nodeSelector` matching the Node's labels → per-selector (only the oldest match is used).
//!   Each set spec field becomes the parameter it maps to, written as Calico writes it
//!   (durations as seconds or milliseconds, lists comma-separated, ...). Annotations
//!   `config.projectcalico.org/<Name>` add settings or replace the spec's, unvalidated.
//! - Node `<hostname>` → per-host tunnel addresses (IpInIpTunnelAddr, IPv4VXLANTunnelAddr,
//!   IPv6VXLANTunnelAddr, VXLANTunnelMACAddr, VXLANTunnelMACAddrV6); its labels are what
//!   selector-scoped configurations are matched against.

use margay_api::duration::parse_go_duration;
use margay_api::{ClusterInformation, FelixConfiguration, Node};
use margay_selector::Selector;
use serde_json::Value as Json;

use crate::gofmt::{format_float_v, format_go_duration, millis_of, seconds_of};
use crate::kinds::{Kind, parse_ip};
use crate::sources::RawSetting;
use crate::table::{PARAMS, ParamMeta};
use crate::warnings::ConfigWarning;

/// The annotation prefix that turns an annotation into a setting.
pub const ANNOTATION_PREFIX: &str = "config.projectcalico.org/";

/// Settings derived from the datastore resources, per source.
#[derive(Debug, Default)]
pub(crate) struct DatastoreSettings {
    pub global: Vec<RawSetting>,
    pub per_selector: Vec<RawSetting>,
    pub per_host: Vec<RawSetting>,
    pub warnings: Vec<ConfigWarning>,
    pub datastore_ready: Option<bool>,
    pub selector_winner: Option<String>,
}

/// What the loader passes in (a subset of `ConfigInputs`).
pub(crate) struct DatastoreInputs<'a> {
    pub cluster_info: Option<&'a ClusterInformation>,
    pub global: Option<&'a FelixConfiguration>,
    pub per_selector: &'a [FelixConfiguration],
    pub per_host: Option<&'a FelixConfiguration>,
    pub node: Option<&'a Node>,
}

pub(crate) fn datastore_settings(
    inputs: &DatastoreInputs<'_>,
    hostname: &str,
) -> DatastoreSettings {
    let mut out = DatastoreSettings::default();

    if let Some(ci) = inputs.cluster_info {
        let name = ci.metadata.name.as_str();
        if name == "default" || name.is_empty() {
            let label = "ClusterInformation \"default\"";
            for (param, field, value) in [
                ("ClusterGUID", "clusterGUID", &ci.spec.cluster_guid),
                ("ClusterType", "clusterType", &ci.spec.cluster_type),
                ("CalicoVersion", "calicoVersion", &ci.spec.calico_version),
                ("Variant", "variant", &ci.spec.variant),
            ] {
                if !value.is_empty() {
                    out.global.push(RawSetting::new(
                        param,
                        value.clone(),
                        format!("{label} spec.{field}"),
                    ));
                }
            }
            out.datastore_ready = Some(ci.spec.datastore_ready == Some(true));
        } else {
            out.warnings.push(ConfigWarning::IgnoredResource {
                resource: format!("ClusterInformation {name:?}"),
                reason: "only ClusterInformation \"default\" configures Felix".into(),
            });
        }
    }

    if let Some(fc) = inputs.global {
        let name = fc.metadata.name.as_str();
        if name == "default" || name.is_empty() {
            let settings = felix_configuration_settings(fc, &mut out.warnings);
            merge(&mut out.global, settings);
        } else {
            out.warnings.push(ConfigWarning::IgnoredResource {
                resource: format!("FelixConfiguration {name:?}"),
                reason: "the global FelixConfiguration is named \"default\"".into(),
            });
        }
    }

    // The Node of this host: its labels select per-selector configurations.
    let node = inputs.node.filter(|n| {
        let ok = n.metadata.name == hostname;
        if !ok {
            out.warnings.push(ConfigWarning::IgnoredResource {
                resource: format!("Node {:?}", n.metadata.name),
                reason: format!("this node is {hostname:?}"),
            });
        }
        ok
    });

    let mut matches: Vec<(Timestamp, &str, &FelixConfiguration)> = Vec::new();
    for fc in inputs.per_selector {
        let name = fc.metadata.name.as_str();
        if name == "default" || name.starts_with("node.") {
            continue;
        }
        let Some(sel) = fc.spec.node_selector.as_deref().filter(|s| !s.is_empty()) else {
            continue;
        };
        let sel = match Selector::parse(sel) {
            Ok(sel) => sel,
            Err(e) => {
                out.warnings.push(ConfigWarning::InvalidResourceValue {
                    resource: format!("FelixConfiguration {name:?}"),
                    field: "spec.nodeSelector".into(),
                    reason: e.to_string(),
                });
                continue;
            }
        };
        if let Some(node) = node
            && sel.matches(&node.metadata.labels)
        {
            let ts = fc
                .metadata
                .creation_timestamp
                .as_deref()
                .and_then(parse_rfc3339)
                .unwrap_or(Timestamp::ZERO);
            matches.push((ts, name, fc));
        }
    }
    matches.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    if let Some((_, winner, fc)) = matches.first() {
        if matches.len() > 1 {
            out.warnings.push(ConfigWarning::MultipleSelectorMatches {
                matching: matches.iter().map(|m| m.1.to_string()).collect(),
                winner: winner.to_string(),
            });
        }
        out.selector_winner = Some(winner.to_string());
        out.per_selector = felix_configuration_settings(fc, &mut out.warnings);
    }

    if let Some(fc) = inputs.per_host {
        let name = fc.metadata.name.as_str();
        if name == format!("node.{hostname}") {
            let settings = felix_configuration_settings(fc, &mut out.warnings);
            merge(&mut out.per_host, settings);
        } else {
            out.warnings.push(ConfigWarning::IgnoredResource {
                resource: format!("FelixConfiguration {name:?}"),
                reason: format!("this node's FelixConfiguration is \"node.{hostname}\""),
            });
        }
    }
    if let Some(node) = node {
        let settings = node_settings(node, &mut out.warnings);
        merge(&mut out.per_host, settings);
    }
    out
}

/// Adds settings to a source's map: a setting with exactly the same name replaces the
/// earlier one (the later resource wins, as when Calico fills one map from several).
fn merge(into: &mut Vec<RawSetting>, settings: Vec<RawSetting>) {
    for s in settings {
        into.retain(|e| e.name != s.name);
        into.push(s);
    }
}

/// The settings of one FelixConfiguration: its set spec fields, then its annotations.
pub(crate) fn felix_configuration_settings(
    fc: &FelixConfiguration,
    warnings: &mut Vec<ConfigWarning>,
) -> Vec<RawSetting> {
    let label = format!("FelixConfiguration {:?}", fc.metadata.name);
    let mut out = Vec::new();
    let spec = match serde_json::to_value(&*fc.spec) {
        Ok(Json::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    for (field, value) in &spec {
        if field == "nodeSelector" {
            continue;
        }
        let Some(meta) = PARAMS.iter().find(|p| p.v3_field == field.as_str()) else {
            warnings.push(ConfigWarning::InvalidResourceValue {
                resource: label.clone(),
                field: format!("spec.{field}"),
                reason: "not a Felix parameter".into(),
            });
            continue;
        };
        match v3_to_raw(meta, value) {
            Ok(Some(raw)) => out.push(RawSetting::new(
                meta.name,
                raw,
                format!("{label} spec.{field}"),
            )),
            Ok(None) => {}
            Err(reason) => warnings.push(ConfigWarning::InvalidResourceValue {
                resource: label.clone(),
                field: format!("spec.{field}"),
                reason,
            }),
        }
    }
    for (key, value) in &fc.metadata.annotations {
        if let Some(name) = key.strip_prefix(ANNOTATION_PREFIX) {
            out.retain(|s| s.name != name);
            out.push(RawSetting::new(
                name,
                value.clone(),
                format!("{label} annotation {key}"),
            ));
        }
    }
    out
}

/// One v3 field value in the string form Felix parses (`None` when the field counts as unset).
pub(crate) fn v3_to_raw(meta: &ParamMeta, value: &Json) -> Result<Option<String>, String> {
    let kind = meta.kind();
    let nonempty = |s: String| (!s.is_empty()).then_some(s);
    Ok(match value {
        Json::Null => None,
        Json::Bool(b) => Some(b.to_string()),
        Json::Number(n) => Some(n.to_string()),
        Json::String(s) if s.is_empty() => None,
        Json::String(s) if kind.is_duration() => {
            let nanos = parse_go_duration(s)?;
            Some(if kind.is_millis() {
                format_float_v(millis_of(nanos))
            } else {
                format_float_v(seconds_of(nanos))
            })
        }
        Json::String(s) => Some(s.clone()),
        Json::Array(items) => match kind {
            // An empty failsafe list means "no failsafe ports", not "unset".
            Kind::PortList if items.is_empty() => Some("none".into()),
            Kind::PortList => Some(
                items
                    .iter()
                    .map(proto_port_to_raw)
                    .collect::<Result<Vec<_>, _>>()?
                    .join(","),
            ),
            Kind::RouteTableRanges => nonempty(
                items
                    .iter()
                    .map(route_table_range_to_raw)
                    .collect::<Result<Vec<_>, _>>()?
                    .join(","),
            ),
            Kind::KeyDurationList => nonempty(
                items
                    .iter()
                    .map(|o| {
                        let name = o.get("name").and_then(Json::as_str).unwrap_or("");
                        let timeout = o.get("timeout").and_then(Json::as_str).unwrap_or("");
                        let nanos = parse_go_duration(timeout)?;
                        Ok(format!("{name}={}", format_go_duration(nanos)))
                    })
                    .collect::<Result<Vec<_>, String>>()?
                    .join(","),
            ),
            // Lists of strings, and kubeNodePortRanges: Calico formats the port list with
            // Go's `%v` ("[30000:32767 8080]"), which Felix then fails to parse and replaces
            // with the default; margay writes the comma-separated form Felix's parser takes,
            // so the setting works.
            _ => nonempty(
                items
                    .iter()
                    .map(scalar_to_string)
                    .collect::<Result<Vec<_>, _>>()?
                    .join(","),
            ),
        },
        Json::Object(map) => match kind {
            Kind::RouteTableRange => Some(route_table_range_to_raw(value)?),
            Kind::KeyValueList if meta.v3_field == "bpfConntrackTimeouts" => {
                // Calico writes the Go field names, in declaration order, of the set timers.
                const FIELDS: [(&str, &str); 8] = [
                    ("creationGracePeriod", "CreationGracePeriod"),
                    ("tcpSynSent", "TCPSynSent"),
                    ("tcpEstablished", "TCPEstablished"),
                    ("tcpFinsSeen", "TCPFinsSeen"),
                    ("tcpResetSeen", "TCPResetSeen"),
                    ("udpTimeout", "UDPTimeout"),
                    ("genericTimeout", "GenericTimeout"),
                    ("icmpTimeout", "ICMPTimeout"),
                ];
                let parts: Vec<String> = FIELDS
                    .iter()
                    .filter_map(|(json, go)| {
                        map.get(*json)
                            .and_then(Json::as_str)
                            .map(|v| format!("{go}={v}"))
                    })
                    .collect();
                nonempty(parts.join(","))
            }
            Kind::KeyValueList => {
                // Each pair followed by a comma, as Calico writes maps.
                let mut s = String::new();
                for (k, v) in map {
                    s.push_str(&format!("{k}={},", scalar_to_string(v)?));
                }
                nonempty(s)
            }
            _ => return Err(format!("unexpected object for {}", meta.name)),
        },
    })
}

fn scalar_to_string(v: &Json) -> Result<String, String> {
    match v {
        Json::String(s) => Ok(s.clone()),
        Json::Number(n) => Ok(n.to_string()),
        Json::Bool(b) => Ok(b.to_string()),
        other => Err(format!("unexpected value {other}")),
    }
}

fn proto_port_to_raw(v: &Json) -> Result<String, String> {
    let protocol = v
        .get("protocol")
        .and_then(Json::as_str)
        .unwrap_or("")
        .to_lowercase();
    let port = v
        .get("port")
        .and_then(Json::as_i64)
        .ok_or("failsafe entry without a port")?;
    let net = v.get("net").and_then(Json::as_str).unwrap_or("");
    Ok(if net.is_empty() {
        format!("{protocol}:{port}")
    } else if net.contains(':') {
        format!("{protocol}:[{net}]:{port}")
    } else {
        format!("{protocol}:{net}:{port}")
    })
}

fn route_table_range_to_raw(v: &Json) -> Result<String, String> {
    let min = v
        .get("min")
        .and_then(Json::as_i64)
        .ok_or("range without min")?;
    let max = v
        .get("max")
        .and_then(Json::as_i64)
        .ok_or("range without max")?;
    Ok(format!("{min}-{max}"))
}

/// The per-host settings Calico takes from the Node resource.
fn node_settings(node: &Node, warnings: &mut Vec<ConfigWarning>) -> Vec<RawSetting> {
    let label = format!("Node {:?}", node.metadata.name);
    let mut out = Vec::new();
    let ipip = node
        .spec
        .bgp
        .as_ref()
        .map(|b| b.ipv4_ipip_tunnel_addr.as_str())
        .unwrap_or("");
    let addrs = [
        ("IpInIpTunnelAddr", "spec.bgp.ipv4IPIPTunnelAddr", ipip),
        (
            "IPv4VXLANTunnelAddr",
            "spec.ipv4VXLANTunnelAddr",
            node.spec.ipv4_vxlan_tunnel_addr.as_str(),
        ),
        (
            "IPv6VXLANTunnelAddr",
            "spec.ipv6VXLANTunnelAddr",
            node.spec.ipv6_vxlan_tunnel_addr.as_str(),
        ),
    ];
    for (param, field, text) in addrs {
        if text.is_empty() {
            continue;
        }
        match parse_ip(text) {
            Some(ip) => out.push(RawSetting::new(
                param,
                ip.to_string(),
                format!("{label} {field}"),
            )),
            None => warnings.push(ConfigWarning::InvalidResourceValue {
                resource: label.clone(),
                field: field.into(),
                reason: format!("{text:?} is not an IP address"),
            }),
        }
    }
    for (param, field, text) in [
        (
            "VXLANTunnelMACAddr",
            "spec.vxlanTunnelMACAddr",
            node.spec.vxlan_tunnel_mac_addr.as_str(),
        ),
        (
            "VXLANTunnelMACAddrV6",
            "spec.vxlanTunnelMACAddrV6",
            node.spec.vxlan_tunnel_mac_addr_v6.as_str(),
        ),
    ] {
        if !text.is_empty() {
            out.push(RawSetting::new(param, text, format!("{label} {field}")));
        }
    }
    out
}

/// A point in time, comparable; `ZERO` sorts before every real timestamp (Go's zero time,
/// which is what a resource without a creation timestamp has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Timestamp {
    secs: i64,
    nanos: u32,
}

impl Timestamp {
    const ZERO: Timestamp = Timestamp {
        secs: i64::MIN,
        nanos: 0,
    };
}

/// Parses an RFC 3339 timestamp (`2024-05-01T10:00:00Z`, with optional fraction and offset).
pub(crate) fn parse_rfc3339(s: &str) -> Option<Timestamp> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())
            .flatten()
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let mut text = frac[..digits.min(9)].to_string();
        while text.len() < 9 {
            text.push('0');
        }
        nanos = text.parse().ok()?;
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = rest[1..].split_once(':')?;
            if h.len() != 2 || m.len() != 2 {
                return None;
            }
            sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    Some(Timestamp {
        secs: days * 86_400 + hour * 3600 + min * 60 + sec - offset,
        nanos,
    })
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_order() {
        let a = parse_rfc3339("2024-01-02T03:04:05Z").unwrap();
        let b = parse_rfc3339("2024-01-02T03:04:05.5Z").unwrap();
        let c = parse_rfc3339("2024-01-02T04:04:05+02:00").unwrap();
        assert!(a < b);
        assert!(c < a, "04:04+02:00 is 02:04Z");
        assert!(Timestamp::ZERO < c);
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z").unwrap().secs, 0);
        assert_eq!(
            parse_rfc3339("2000-03-01T00:00:00Z").unwrap().secs,
            951_868_800
        );
        for bad in [
            "",
            "2024-01-02",
            "2024-13-02T03:04:05Z",
            "2024-01-02T03:04:05",
            "x",
        ] {
            assert!(parse_rfc3339(bad).is_none(), "{bad}");
        }
    }
}
