//! The CNI protocol (spec 0.3.0 – 1.1.0): versions, error codes, results (pure).
//!
//! A plugin reads its network configuration on stdin and its arguments from `CNI_*` variables,
//! and answers on stdout with a result (ADD), nothing (DEL, CHECK, STATUS, GC), a version
//! listing (VERSION) or an error object `{cniVersion, code, msg, details}` with a non-zero exit.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The versions margay speaks, oldest first. Results are written in the requested one's
/// format.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest supported version (used when the input names none we can trust).
pub const LATEST: Version = Version(1, 1, 0);

/// Well-known error codes (CNI spec, "Error" section) and margay's own (100+).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve ADD requests.
    pub const NOT_AVAILABLE: u32 = 50;
    /// Anything else that went wrong in margay (Calico uses 100 for everything).
    pub const PLUGIN: u32 = 100;
    /// The datastore answered with an error that retrying will not fix.
    pub const DATASTORE: u32 = 101;
    /// No address could be assigned: no usable pool, or the pools are full.
    pub const NO_ADDRESS: u32 = 102;
    /// The requested address cannot be had (in use, reserved, outside every pool).
    pub const ADDRESS_REFUSED: u32 = 103;
    /// Setting up or removing the interfaces, addresses, routes or sysctls failed.
    pub const DATAPLANE: u32 = 104;
    /// CHECK found the container's networking different from what ADD set up.
    pub const CHECK_FAILED: u32 = 105;
    /// The node name is unknown (margay node has not started), or disagrees with the node the
    /// Kubernetes pod is scheduled on.
    pub const NODENAME: u32 = 106;
    /// The Kubernetes pod cannot be wired as it is: one of Calico's `cni.projectcalico.org/*`
    /// annotations (on the pod or its namespace) is invalid or asks for a feature the network
    /// configuration does not enable.
    pub const POD: u32 = 107;
}

/// A CNI version `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u8, pub u8, pub u8);

impl Version {
    /// Parses `1.0.0`; `1.0` is accepted as `1.0.0`.
    pub fn parse(s: &str) -> Option<Version> {
        let mut parts = s.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = match parts.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(Version(major, minor, patch))
    }

    pub fn is_supported(self) -> bool {
        SUPPORTED_VERSIONS
            .iter()
            .any(|v| Version::parse(v) == Some(self))
    }

    /// Results before 1.0.0 carry `"version": "4"|"6"` on each IP.
    pub fn ips_carry_version(self) -> bool {
        self < Version(1, 0, 0)
    }

    /// CHECK exists from 0.4.0 on.
    pub fn has_check(self) -> bool {
        self >= Version(0, 4, 0)
    }

    /// STATUS and GC exist from 1.1.0 on.
    pub fn has_status_and_gc(self) -> bool {
        self >= Version(1, 1, 0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// A CNI error: printed on stdout as `{cniVersion, code, msg, details}`; the plugin exits 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
pub struct CniError {
    pub code: u32,
    /// What is wrong and what to do, in one sentence.
    pub msg: String,
    /// More context (the underlying error), possibly empty.
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl fmt::Display) -> CniError {
        self.details = details.to_string();
        self
    }

    pub fn to_json(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
    }
}

/// An interface in a result (`sandbox` set for the container side).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
}

/// An address in a result, with the index of its interface in `interfaces`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    pub ip: IpAddr,
    pub prefix: u8,
    pub gateway: Option<IpAddr>,
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: String,
    pub gw: Option<IpAddr>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// An ADD result, independent of the version it will be written in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

impl CniResult {
    /// The result in `version`'s format.
    pub fn to_json(&self, version: Version) -> Value {
        let mut out = Map::new();
        out.insert("cniVersion".into(), json!(version.to_string()));
        if !self.interfaces.is_empty() {
            let ifaces: Vec<Value> = self
                .interfaces
                .iter()
                .map(|i| {
                    let mut i = i.clone();
                    if version < Version(1, 1, 0) {
                        i.mtu = None;
                    }
                    serde_json::to_value(i).unwrap_or(Value::Null)
                })
                .collect();
            out.insert("interfaces".into(), Value::Array(ifaces));
        }
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut o = Map::new();
                if version.ips_carry_version() {
                    let v = if ip.ip.is_ipv4() { "4" } else { "6" };
                    o.insert("version".into(), json!(v));
                }
                o.insert("address".into(), json!(format!("{}/{}", ip.ip, ip.prefix)));
                if let Some(gw) = ip.gateway {
                    o.insert("gateway".into(), json!(gw.to_string()));
                }
                if let Some(i) = ip.interface {
                    o.insert("interface".into(), json!(i));
                }
                Value::Object(o)
            })
            .collect();
        out.insert("ips".into(), Value::Array(ips));
        if !self.routes.is_empty() {
            let routes: Vec<Value> = self
                .routes
                .iter()
                .map(|r| match r.gw {
                    Some(gw) => json!({"dst": r.dst, "gw": gw.to_string()}),
                    None => json!({"dst": r.dst}),
                })
                .collect();
            out.insert("routes".into(), Value::Array(routes));
        }
        out.insert(
            "dns".into(),
            serde_json::to_value(&self.dns).unwrap_or(Value::Null),
        );
        Value::Object(out)
    }

    /// Reads a result of any supported version (a `prevResult`, or another plugin's answer).
    pub fn from_json(v: &Value) -> Result<CniResult, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| "a result must be a JSON object".to_string())?;
        let mut result = CniResult::default();
        if let Some(ifaces) = obj.get("interfaces").filter(|v| !v.is_null()) {
            result.interfaces =
                serde_json::from_value(ifaces.clone()).map_err(|e| format!("interfaces: {e}"))?;
        }
        if let Some(ips) = obj.get("ips").filter(|v| !v.is_null()) {
            let ips = ips
                .as_array()
                .ok_or_else(|| "ips: expected an array".to_string())?;
            for (n, ip) in ips.iter().enumerate() {
                let address = ip
                    .get("address")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("ips[{n}].address: missing"))?;
                let (addr, prefix) = parse_cidr(address)
                    .ok_or_else(|| format!("ips[{n}].address: {address:?} is not a CIDR"))?;
                let gateway = match ip.get("gateway").and_then(Value::as_str) {
                    Some(g) => Some(
                        g.parse()
                            .map_err(|_| format!("ips[{n}].gateway: {g:?} is not an IP"))?,
                    ),
                    None => None,
                };
                let interface = ip
                    .get("interface")
                    .and_then(Value::as_u64)
                    .and_then(|i| usize::try_from(i).ok());
                result.ips.push(IpConfig {
                    ip: addr,
                    prefix,
                    gateway,
                    interface,
                });
            }
        }
        if let Some(routes) = obj.get("routes").and_then(Value::as_array) {
            for (n, r) in routes.iter().enumerate() {
                let dst = r
                    .get("dst")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("routes[{n}].dst: missing"))?;
                let gw = match r.get("gw").and_then(Value::as_str) {
                    Some(g) => Some(
                        g.parse()
                            .map_err(|_| format!("routes[{n}].gw: {g:?} is not an IP"))?,
                    ),
                    None => None,
                };
                result.routes.push(Route {
                    dst: dst.to_string(),
                    gw,
                });
            }
        }
        if let Some(dns) = obj.get("dns").filter(|v| !v.is_null()) {
            result.dns = serde_json::from_value(dns.clone()).map_err(|e| format!("dns: {e}"))?;
        }
        Ok(result)
    }
}

/// `10.0.0.1/32` → (address, prefix length).
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (a, p) = s.split_once('/')?;
    let addr: IpAddr = a.parse().ok()?;
    let prefix: u8 = p.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((addr, prefix))
}

/// The VERSION answer.
pub fn version_info(version: &str) -> Value {
    json!({
        "cniVersion": version,
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "cali1234".into(),
                    ..Interface::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: "aa:bb:cc:dd:ee:ff".into(),
                    mtu: Some(1450),
                    sandbox: "/run/netns/x".into(),
                },
            ],
            ips: vec![
                IpConfig {
                    ip: "10.0.0.5".parse().unwrap(),
                    prefix: 32,
                    gateway: None,
                    interface: Some(1),
                },
                IpConfig {
                    ip: "fd00::5".parse().unwrap(),
                    prefix: 128,
                    gateway: None,
                    interface: Some(1),
                },
            ],
            routes: vec![],
            dns: Dns::default(),
        }
    }

    #[test]
    fn versions() {
        assert_eq!(Version::parse("1.0.0"), Some(Version(1, 0, 0)));
        assert_eq!(Version::parse("0.4"), Some(Version(0, 4, 0)));
        assert_eq!(Version::parse("1.0.0.0"), None);
        assert_eq!(Version::parse("banana"), None);
        assert!(Version(0, 3, 1).is_supported());
        assert!(!Version(0, 2, 0).is_supported());
        assert!(!Version(2, 0, 0).is_supported());
        assert!(Version(0, 3, 1).ips_carry_version());
        assert!(!Version(1, 0, 0).ips_carry_version());
        assert!(!Version(0, 3, 1).has_check());
        assert!(Version(0, 4, 0).has_check());
        assert!(Version(1, 1, 0).has_status_and_gc());
    }

    #[test]
    fn results_follow_the_requested_version() {
        let r = sample();
        let old = r.to_json(Version(0, 3, 1));
        assert_eq!(old["cniVersion"], "0.3.1");
        assert_eq!(old["ips"][0]["version"], "4");
        assert_eq!(old["ips"][1]["version"], "6");
        assert!(old["interfaces"][1].get("mtu").is_none());
        let new = r.to_json(Version(1, 0, 0));
        assert!(new["ips"][0].get("version").is_none());
        assert_eq!(new["ips"][0]["address"], "10.0.0.5/32");
        assert_eq!(new["ips"][0]["interface"], 1);
        let latest = r.to_json(LATEST);
        assert_eq!(latest["interfaces"][1]["mtu"], 1450);
        assert_eq!(latest["interfaces"][1]["sandbox"], "/run/netns/x");
        assert!(latest["interfaces"][0].get("sandbox").is_none());
    }

    #[test]
    fn results_round_trip_through_every_version() {
        for v in SUPPORTED_VERSIONS {
            let v = Version::parse(v).unwrap();
            let mut expected = sample();
            if v < Version(1, 1, 0) {
                expected.interfaces[1].mtu = None;
            }
            let back = CniResult::from_json(&sample().to_json(v)).unwrap();
            assert_eq!(back, expected, "{v}");
        }
    }

    #[test]
    fn bad_results_name_the_field() {
        let e = CniResult::from_json(&json!({"ips": [{"address": "10.0.0.1"}]})).unwrap_err();
        assert!(e.contains("ips[0].address"), "{e}");
        let e = CniResult::from_json(&json!([])).unwrap_err();
        assert!(e.contains("object"), "{e}");
    }

    #[test]
    fn errors_print_as_cni_error_objects() {
        let e = CniError::new(code::INVALID_CONFIG, "bad").with_details("why");
        assert_eq!(
            e.to_json("1.0.0"),
            json!({"cniVersion": "1.0.0", "code": 7, "msg": "bad", "details": "why"})
        );
        assert_eq!(e.to_string(), "bad: why");
    }
}
