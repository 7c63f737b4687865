//! Service address allocation as kube-apiserver does it (pure): ClusterIPs from the service
//! CIDR (`--service-cluster-ip-range`, kubeadm's 10.96.0.0/12) and NodePorts from
//! `--service-node-port-range` (30000-32767) for NodePort and LoadBalancer services. A given
//! address or port that is taken or out of range is refused with kube-apiserver's 422
//! message; `clusterIP: None` (headless) and ExternalName services get no address.
//!
//! What is allocated follows the stored objects: every committed Service write releases the
//! old object's addresses and takes the new one's ([`Allocator::on_commit`]), so deletes,
//! updates and patches keep the books without code of their own.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use serde_json::{Value, json};

use crate::status::Cause;

/// kube-apiserver's default `--service-node-port-range`.
pub const DEFAULT_NODE_PORTS: (u16, u16) = (30000, 32767);
/// kubeadm's default `--service-cidr`.
pub const DEFAULT_SERVICE_CIDR: &str = "10.96.0.0/12";

/// The store key of Services.
pub const SERVICES_KEY: &str = "/services";

#[derive(Debug, Clone)]
pub struct Allocator {
    base: u32,
    prefix: u8,
    next_ip: u32,
    ips: HashSet<u32>,
    ports: (u16, u16),
    next_port: u16,
    /// (protocol, port).
    node_ports: HashSet<(String, u16)>,
}

/// Parses `a.b.c.d/n` (IPv4; the double serves single-stack IPv4 clusters).
pub fn parse_cidr(s: &str) -> Result<(u32, u8), String> {
    let (a, p) = s
        .split_once('/')
        .ok_or_else(|| format!("service CIDR {s:?}: expected address/prefix"))?;
    let addr: Ipv4Addr = a
        .parse()
        .map_err(|_| format!("service CIDR {s:?}: {a:?} is not an IPv4 address"))?;
    let prefix: u8 = p
        .parse()
        .ok()
        .filter(|p| (8..=30).contains(p))
        .ok_or_else(|| format!("service CIDR {s:?}: the prefix must be 8-30"))?;
    let mask = u32::MAX << (32 - prefix);
    Ok((u32::from(addr) & mask, prefix))
}

fn cluster_ip_of(obj: &Value) -> Option<u32> {
    let spec = obj.get("spec")?;
    let s = spec
        .get("clusterIPs")
        .and_then(|v| v.get(0))
        .or_else(|| spec.get("clusterIP"))?
        .as_str()?;
    s.parse::<Ipv4Addr>().ok().map(u32::from)
}

fn node_ports_of(obj: &Value) -> Vec<(String, u16)> {
    let ports = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    ports
        .iter()
        .filter_map(|p| {
            let n = u16::try_from(p.get("nodePort")?.as_u64()?).ok()?;
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            Some((proto.to_string(), n))
        })
        .collect()
}

fn ip_text(ip: u32) -> String {
    Ipv4Addr::from(ip).to_string()
}

impl Allocator {
    pub fn new(cidr: (u32, u8), ports: (u16, u16)) -> Allocator {
        Allocator {
            base: cidr.0,
            prefix: cidr.1,
            next_ip: 1,
            ips: HashSet::new(),
            ports,
            next_port: ports.0,
            node_ports: HashSet::new(),
        }
    }

    fn size(&self) -> u32 {
        1u32 << (32 - self.prefix)
    }

    fn cidr_text(&self) -> String {
        format!("{}/{}", ip_text(self.base), self.prefix)
    }

    fn in_range(&self, ip: u32) -> bool {
        // The network and broadcast addresses are never handed out.
        ip > self.base && ip < self.base.wrapping_add(self.size() - 1)
    }

    /// A committed write: `old` is what was stored, `new` what is stored now.
    pub fn on_commit(&mut self, old: Option<&Value>, new: Option<&Value>) {
        if let Some(o) = old {
            if let Some(ip) = cluster_ip_of(o) {
                self.ips.remove(&ip);
            }
            for np in node_ports_of(o) {
                self.node_ports.remove(&np);
            }
        }
        if let Some(n) = new {
            if let Some(ip) = cluster_ip_of(n).filter(|ip| self.in_range(*ip)) {
                self.ips.insert(ip);
            }
            self.node_ports.extend(node_ports_of(n));
        }
    }

    /// Fills in a new Service's ClusterIP(s) and NodePorts, or says what is wrong.
    pub fn allocate(&mut self, obj: &mut Value) -> Result<(), Vec<Cause>> {
        let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
            return Ok(());
        };
        let ty = spec
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP")
            .to_string();
        if ty == "ExternalName" {
            return Ok(());
        }
        let mut causes = Vec::new();
        let given = spec
            .get("clusterIPs")
            .and_then(|v| v.get(0))
            .or_else(|| spec.get("clusterIP"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if given == "None" {
            spec.insert("clusterIP".into(), json!("None"));
            spec.insert("clusterIPs".into(), json!(["None"]));
        } else if given.is_empty() {
            match self.free_ip() {
                Some(ip) => {
                    let s = ip_text(ip);
                    spec.insert("clusterIP".into(), json!(s));
                    spec.insert("clusterIPs".into(), json!([s]));
                }
                None => causes.push(Cause {
                    reason: "FieldValueInvalid",
                    field: "spec.clusterIPs".into(),
                    message: format!(
                        "Internal error: failed to allocate a serviceIP: range is full ({})",
                        self.cidr_text()
                    ),
                }),
            }
        } else {
            let value = format!("[]string{{\"{given}\"}}");
            let fail = |detail: String| Cause {
                reason: "FieldValueInvalid",
                field: "spec.clusterIPs".into(),
                message: format!("Invalid value: {value}: failed to allocate IP {given}: {detail}"),
            };
            match given.parse::<Ipv4Addr>().map(u32::from) {
                Err(_) => causes.push(Cause {
                    reason: "FieldValueInvalid",
                    field: "spec.clusterIPs[0]".into(),
                    message: format!(
                        "Invalid value: \"{given}\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
                    ),
                }),
                Ok(ip) if !self.in_range(ip) => causes.push(fail(format!(
                    "the provided IP ({given}) is not in the valid range. The range of valid IPs is {}",
                    self.cidr_text()
                ))),
                Ok(ip) if self.ips.contains(&ip) => {
                    causes.push(fail("provided IP is already allocated".into()))
                }
                Ok(_) => {
                    spec.insert("clusterIP".into(), json!(given));
                    spec.insert("clusterIPs".into(), json!([given]));
                }
            }
        }
        let node_ports = matches!(ty.as_str(), "NodePort" | "LoadBalancer");
        let mut taken: HashSet<(String, u16)> = HashSet::new();
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            // Ports asked for first, then the rest allocated around them (kube-apiserver's
            // order), so an automatic port never takes one the same object names.
            for pass in [true, false] {
                for (i, p) in ports.iter_mut().enumerate() {
                    let Some(pm) = p.as_object_mut() else {
                        continue;
                    };
                    let proto = pm
                        .get("protocol")
                        .and_then(Value::as_str)
                        .unwrap_or("TCP")
                        .to_string();
                    let field = format!("spec.ports[{i}].nodePort");
                    let asked = pm
                        .get("nodePort")
                        .and_then(Value::as_i64)
                        .filter(|n| *n != 0);
                    match (pass, asked) {
                        (true, Some(_)) if !node_ports => causes.push(Cause {
                            reason: "FieldValueForbidden",
                            field,
                            message: format!("Forbidden: may not be used when `type` is '{ty}'"),
                        }),
                        (true, Some(n)) => {
                            let in_range = u16::try_from(n)
                                .ok()
                                .filter(|n| (self.ports.0..=self.ports.1).contains(n));
                            match in_range {
                                None => causes.push(Cause {
                                    reason: "FieldValueInvalid",
                                    field,
                                    message: format!(
                                        "Invalid value: {n}: provided port is not in the valid range. The range of valid ports is {}-{}",
                                        self.ports.0, self.ports.1
                                    ),
                                }),
                                Some(n)
                                    if self.node_ports.contains(&(proto.clone(), n))
                                        || !taken.insert((proto.clone(), n)) =>
                                {
                                    causes.push(Cause {
                                        reason: "FieldValueInvalid",
                                        field,
                                        message: format!(
                                            "Invalid value: {n}: provided port is already allocated"
                                        ),
                                    })
                                }
                                Some(_) => {}
                            }
                        }
                        (false, None) if node_ports => match self.free_port(&proto, &taken) {
                            Some(n) => {
                                taken.insert((proto.clone(), n));
                                pm.insert("nodePort".into(), json!(n));
                            }
                            None => causes.push(Cause {
                                reason: "FieldValueInvalid",
                                field,
                                message:
                                    "Internal error: failed to allocate a nodePort: range is full"
                                        .into(),
                            }),
                        },
                        _ => {}
                    }
                }
            }
        }
        if node_ports && !spec.contains_key("externalTrafficPolicy") {
            spec.insert("externalTrafficPolicy".into(), json!("Cluster"));
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(causes)
        }
    }

    /// The next free address after the last one handed out (a fresh cluster's order:
    /// `kubernetes` gets .1), wrapping once around the range.
    fn free_ip(&mut self) -> Option<u32> {
        let usable = self.size().saturating_sub(2);
        for _ in 0..usable {
            let candidate = self.base + 1 + (self.next_ip.wrapping_sub(1) % usable);
            self.next_ip = self.next_ip % usable + 1;
            if !self.ips.contains(&candidate) {
                return Some(candidate);
            }
        }
        None
    }

    fn free_port(&mut self, proto: &str, taken: &HashSet<(String, u16)>) -> Option<u16> {
        let (lo, hi) = self.ports;
        let span = u32::from(hi - lo) + 1;
        for _ in 0..span {
            let n = self.next_port;
            self.next_port = if n >= hi { lo } else { n + 1 };
            let key = (proto.to_string(), n);
            if !self.node_ports.contains(&key) && !taken.contains(&key) {
                return Some(n);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc() -> Allocator {
        Allocator::new(parse_cidr("10.96.0.0/12").unwrap(), (30000, 32767))
    }

    fn svc(spec: Value) -> Value {
        json!({"metadata": {"name": "s"}, "spec": spec})
    }

    #[test]
    fn allocates_in_order_and_refuses_duplicates_and_strangers() {
        let mut a = alloc();
        let mut s1 = svc(json!({"ports": [{"port": 80}]}));
        a.allocate(&mut s1).unwrap();
        assert_eq!(s1["spec"]["clusterIPs"], json!(["10.96.0.1"]));
        a.on_commit(None, Some(&s1));
        let mut s2 = svc(json!({"clusterIP": "10.96.0.1"}));
        let c = a.allocate(&mut s2).unwrap_err();
        assert_eq!(c[0].field, "spec.clusterIPs");
        assert_eq!(
            c[0].message,
            "Invalid value: []string{\"10.96.0.1\"}: failed to allocate IP 10.96.0.1: provided IP is already allocated"
        );
        let c = a
            .allocate(&mut svc(json!({"clusterIP": "10.0.0.1"})))
            .unwrap_err();
        assert!(
            c[0].message
                .ends_with("The range of valid IPs is 10.96.0.0/12"),
            "{}",
            c[0].message
        );
        // Released on delete: the address can be asked for again.
        a.on_commit(Some(&s1), None);
        a.allocate(&mut svc(json!({"clusterIP": "10.96.0.1"})))
            .unwrap();
        // The next automatic one moves on.
        let mut s3 = svc(json!({}));
        a.allocate(&mut s3).unwrap();
        assert_eq!(s3["spec"]["clusterIP"], "10.96.0.2");
    }

    #[test]
    fn headless_and_external_name_get_no_address() {
        let mut a = alloc();
        let mut h = svc(json!({"clusterIP": "None"}));
        a.allocate(&mut h).unwrap();
        assert_eq!(h["spec"]["clusterIPs"], json!(["None"]));
        let mut e = svc(json!({"type": "ExternalName", "externalName": "example.com"}));
        a.allocate(&mut e).unwrap();
        assert!(e["spec"].get("clusterIP").is_none());
    }

    #[test]
    fn node_ports() {
        let mut a = alloc();
        let mut s = svc(
            json!({"type": "NodePort", "ports": [{"port": 80}, {"port": 81, "nodePort": 30000}]}),
        );
        a.allocate(&mut s).unwrap();
        // The automatic one skips the port the same object asks for.
        assert_eq!(s["spec"]["ports"][0]["nodePort"], 30001);
        assert_eq!(s["spec"]["externalTrafficPolicy"], "Cluster");
        a.on_commit(None, Some(&s));
        let c = a
            .allocate(&mut svc(
                json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30001}]}),
            ))
            .unwrap_err();
        assert_eq!(c[0].field, "spec.ports[0].nodePort");
        assert_eq!(
            c[0].message,
            "Invalid value: 30001: provided port is already allocated"
        );
        // Another protocol may share the number.
        a.allocate(&mut svc(json!({"type": "NodePort", "ports": [{"port": 53, "protocol": "UDP", "nodePort": 30001}]})))
            .unwrap();
        let c = a
            .allocate(&mut svc(
                json!({"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 80}]}),
            ))
            .unwrap_err();
        assert!(
            c[0].message
                .contains("The range of valid ports is 30000-32767")
        );
        let c = a
            .allocate(&mut svc(
                json!({"ports": [{"port": 80, "nodePort": 30500}]}),
            ))
            .unwrap_err();
        assert_eq!(c[0].reason, "FieldValueForbidden");
    }

    #[test]
    fn a_full_range_is_an_error_not_a_loop() {
        let mut a = Allocator::new(parse_cidr("10.96.0.0/30").unwrap(), (30000, 30000));
        for _ in 0..2 {
            let mut s = svc(json!({"type": "NodePort", "ports": [{"port": 80}]}));
            let r = a.allocate(&mut s);
            if r.is_ok() {
                a.on_commit(None, Some(&s));
            }
        }
        let mut s = svc(json!({}));
        assert!(a.allocate(&mut s).is_ok(), "two usable addresses in a /30");
        a.on_commit(None, Some(&s));
        let e = a.allocate(&mut svc(json!({}))).unwrap_err();
        assert!(e[0].message.contains("range is full"));
        assert!(parse_cidr("10.96.0.0/31").is_err());
        assert!(parse_cidr("nonsense").is_err());
    }
}
