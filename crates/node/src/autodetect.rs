//! Node address autodetection, as calico-node's start-up does it (`IP_AUTODETECTION_METHOD`,
//! `IP6_AUTODETECTION_METHOD`).
//!
//! This module is the pure selection logic: it looks at the host through a [`NetView`], so it can
//! be tested with a fake one. [`crate::system_net::SystemNet`] is the real view (netlink).
//!
//! Calico's behaviour, reproduced here:
//!
//! - Methods: `first-found` (also the empty string), `interface=REGEX[,REGEX…]`,
//!   `skip-interface=REGEX[,REGEX…]`, `cidr=CIDR[,CIDR…]`, `can-reach=ADDRESS|HOSTNAME`,
//!   `kubernetes-internal-ip` (anything starting with that word). Lists are split on commas with
//!   any whitespace next to a comma dropped; nothing else is trimmed, and an empty item (as in
//!   `interface=`) is an empty regex, which matches every name.
//! - Interface regexes are *unanchored* searches (Go's `MatchString`): `interface=eth0` also
//!   matches `veth0abc`; write `^eth0$` to mean exactly `eth0`.
//! - `first-found` skips interfaces whose name matches [`DEFAULT_INTERFACES_TO_EXCLUDE`];
//!   `skip-interface=` skips those *and* the given regexes. `interface=` and `cidr=` do **not**
//!   apply the exclusion list (`cidr=172.17.0.0/16` can pick `docker0`).
//! - Interfaces are examined from the highest interface index down (Calico walks the kernel's
//!   list, which is in index order, backwards), so on a host with `eth0` and `eth1` first-found
//!   picks `eth1`. Addresses of one interface are taken in the kernel's order.
//! - Only "global unicast" addresses are chosen by first-found / interface= / skip-interface= /
//!   cidr=: loopback, link-local (169.254/16, fe80::/10), multicast, unspecified and
//!   255.255.255.255 are passed over. Private and ULA addresses are fine.
//! - Down interfaces are **not** skipped (Calico never looks at the link state); a decision notes
//!   when the chosen interface is down.
//! - `can-reach=` asks the kernel which source address it would use towards the destination
//!   (UDP `connect`, no packet sent), then returns that address with the prefix length of the
//!   interface holding it, searching all interfaces (no exclusion list, any address kind).
//! - `kubernetes-internal-ip` takes the Kubernetes Node's first InternalIP of the family (the
//!   caller passes them: the Node's addresses of type InternalIP, which only the Kubernetes
//!   datastore has) with the prefix length of the interface holding it, searching all
//!   interfaces; an InternalIP on no interface is an error.
//!
//! One deliberate difference: `can-reach=` with nothing after `=` is rejected (Calico would dial
//! the local host and pick a loopback address).

use std::collections::HashSet;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};

use margay_api::net::Cidr;
use regex::Regex;

/// Address family to detect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// 4 or 6.
    pub fn version(self) -> u8 {
        match self {
            Family::V4 => 4,
            Family::V6 => 6,
        }
    }

    pub fn of(addr: IpAddr) -> Family {
        if addr.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    pub fn matches(self, addr: IpAddr) -> bool {
        Family::of(addr) == self
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IPv{}", self.version())
    }
}

/// One network interface of the host, with its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceInfo {
    pub name: String,
    /// Kernel interface index.
    pub index: u32,
    /// Administratively up (IFF_UP). Informational: Calico does not skip down interfaces.
    pub up: bool,
    /// Addresses with their prefix length as configured (`10.0.0.5/24`, not `10.0.0.0/24`),
    /// both families, in the kernel's order.
    pub addrs: Vec<Cidr>,
}

/// Interface-name regexes that `first-found` and `skip-interface=` always skip (Calico's
/// `DEFAULT_INTERFACES_TO_EXCLUDE` on Linux). Note `^lo` skips every name starting with `lo`.
pub const DEFAULT_INTERFACES_TO_EXCLUDE: &[&str] = &[
    "^docker.*",
    "^cbr.*",
    "^dummy.*",
    "^podman.*",
    "^virbr.*",
    "^lxcbr.*",
    "^veth.*",
    "^lo",
    "^br-.*",
    "^cali.*",
    "^tunl.*",
    "^flannel.*",
    "^kube-ipvs.*",
    "^cni.*",
    "^vxlan\\.calico.*",
    "^vxlan-v6\\.calico.*",
    "^wireguard\\.cali.*",
    "^wg-v6\\.cali.*",
    "^nodelocaldns.*",
];

fn default_exclusions() -> &'static [(&'static str, Regex)] {
    static RES: std::sync::OnceLock<Vec<(&'static str, Regex)>> = std::sync::OnceLock::new();
    RES.get_or_init(|| {
        DEFAULT_INTERFACES_TO_EXCLUDE
            .iter()
            .filter_map(|r| match Regex::new(r) {
                Ok(re) => Some((*r, re)),
                // Constant patterns; the unit tests check they all compile.
                Err(e) => {
                    tracing::error!("bad built-in exclusion regex {r}: {e}");
                    None
                }
            })
            .collect()
    })
}

/// The [`DEFAULT_INTERFACES_TO_EXCLUDE`] pattern `name` matches, if any.
pub fn default_exclusion_match(name: &str) -> Option<&'static str> {
    default_exclusions()
        .iter()
        .find(|(_, re)| re.is_match(name))
        .map(|(p, _)| *p)
}

/// True when `name` matches Calico's default exclusion list (what first-found skips, and what
/// Calico leaves out of the Node's `spec.interfaces`).
pub fn excluded_by_default(name: &str) -> bool {
    default_exclusion_match(name).is_some()
}

/// The valid methods, as listed in the unknown-method error.
pub const VALID_METHODS: &str = "first-found, interface=REGEX[,REGEX...], \
     skip-interface=REGEX[,REGEX...], cidr=CIDR[,CIDR...], can-reach=ADDRESS_OR_HOSTNAME, \
     kubernetes-internal-ip";

/// An autodetection method, as written in `IP_AUTODETECTION_METHOD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    FirstFound,
    /// Regexes (unanchored) an interface name must match (any of them).
    Interface(Vec<String>),
    /// Regexes (unanchored) naming interfaces to skip, on top of the default exclusions.
    SkipInterface(Vec<String>),
    /// The address must be inside one of these networks.
    Cidr(Vec<Cidr>),
    /// Destination address or hostname.
    CanReach(String),
    KubernetesInternalIp,
}

const FIRST_FOUND: &str = "first-found";
const INTERFACE: &str = "interface=";
const SKIP_INTERFACE: &str = "skip-interface=";
const CIDR: &str = "cidr=";
const CAN_REACH: &str = "can-reach=";
const K8S_INTERNAL_IP: &str = "kubernetes-internal-ip";

impl Method {
    /// Parses Calico's syntax. The empty string is `first-found`. Regexes and CIDRs are checked
    /// here, so an error names the bad item.
    pub fn parse(s: &str) -> Result<Method, AutodetectError> {
        if s.is_empty() || s == FIRST_FOUND {
            Ok(Method::FirstFound)
        } else if let Some(rest) = s.strip_prefix(INTERFACE) {
            let regexes = split_list(rest);
            compile_all(&regexes, s)?;
            Ok(Method::Interface(regexes))
        } else if let Some(rest) = s.strip_prefix(CIDR) {
            let cidrs = split_list(rest)
                .into_iter()
                .map(|c| {
                    Cidr::parse(&c).map_err(|reason| AutodetectError::InvalidCidr {
                        method: s.to_string(),
                        cidr: c.clone(),
                        reason,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Method::Cidr(cidrs))
        } else if let Some(rest) = s.strip_prefix(CAN_REACH) {
            if rest.is_empty() {
                return Err(AutodetectError::MissingDestination);
            }
            Ok(Method::CanReach(rest.to_string()))
        } else if let Some(rest) = s.strip_prefix(SKIP_INTERFACE) {
            let regexes = split_list(rest);
            compile_all(&regexes, s)?;
            Ok(Method::SkipInterface(regexes))
        } else if s.starts_with(K8S_INTERNAL_IP) {
            Ok(Method::KubernetesInternalIp)
        } else {
            Err(AutodetectError::UnknownMethod {
                method: s.to_string(),
            })
        }
    }
}

impl fmt::Display for Method {
    /// Back in Calico's syntax.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Method::FirstFound => f.write_str(FIRST_FOUND),
            Method::Interface(r) => write!(f, "{INTERFACE}{}", r.join(",")),
            Method::SkipInterface(r) => write!(f, "{SKIP_INTERFACE}{}", r.join(",")),
            Method::Cidr(c) => {
                let c: Vec<String> = c.iter().map(Cidr::to_string).collect();
                write!(f, "{CIDR}{}", c.join(","))
            }
            Method::CanReach(d) => write!(f, "{CAN_REACH}{d}"),
            Method::KubernetesInternalIp => f.write_str(K8S_INTERNAL_IP),
        }
    }
}

/// Splits `a , b,c` into `["a", "b", "c"]`: commas with surrounding whitespace separate items
/// (Go's `regexp.MustCompile(`\s*,\s*`).Split`); whitespace elsewhere is kept.
fn split_list(s: &str) -> Vec<String> {
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c');
    let parts: Vec<&str> = s.split(',').collect();
    let last = parts.len() - 1;
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut p = *p;
            if i > 0 {
                p = p.trim_start_matches(is_space);
            }
            if i < last {
                p = p.trim_end_matches(is_space);
            }
            p.to_string()
        })
        .collect()
}

fn compile_all(regexes: &[String], method: &str) -> Result<Vec<Regex>, AutodetectError> {
    regexes
        .iter()
        .map(|r| {
            Regex::new(r).map_err(|e| AutodetectError::InvalidRegex {
                method: method.to_string(),
                regex: r.clone(),
                reason: e.to_string(),
            })
        })
        .collect()
}

/// What autodetection needs to know about the host.
pub trait NetView: Send + Sync {
    /// All interfaces with their addresses (both families), in interface-index order.
    fn interfaces(&self) -> io::Result<Vec<InterfaceInfo>>;
    /// The local address the kernel would use as source to reach `dest` (no packet is sent).
    fn route_source(&self, dest: IpAddr) -> io::Result<IpAddr>;
}

/// The result of autodetection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detection {
    /// The chosen address with the prefix length of its interface, e.g. `10.0.0.5/24`.
    pub address: Cidr,
    pub interface: String,
    /// Plain-words account of every interface considered and why it was skipped or chosen.
    pub decisions: Vec<String>,
}

/// Why autodetection could not produce an address. Each message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum AutodetectError {
    #[error(
        "unknown IP autodetection method {method:?}; valid methods are: {}",
        VALID_METHODS
    )]
    UnknownMethod { method: String },
    #[error("invalid interface regex {regex:?} in autodetection method {method:?}: {reason}")]
    InvalidRegex {
        method: String,
        regex: String,
        reason: String,
    },
    #[error(
        "invalid CIDR {cidr:?} in autodetection method {method:?}: {reason} \
         (expected e.g. cidr=10.0.0.0/16,192.168.1.0/24)"
    )]
    InvalidCidr {
        method: String,
        cidr: String,
        reason: String,
    },
    #[error(
        "autodetection method can-reach= needs a destination address or hostname, \
         e.g. can-reach=8.8.8.8"
    )]
    MissingDestination,
    #[error(
        "{family} autodetection (kubernetes-internal-ip): the Node has no {family} InternalIP \
         (it has: {}); the method reads the Kubernetes Node's status.addresses, so it needs the \
         Kubernetes datastore (DATASTORE_TYPE=kubernetes) and a Node the kubelet gave an \
         InternalIP of this family; use another method or set the address explicitly (IP= / IP6=)",
        list_ips(have)
    )]
    NoInternalIp { family: Family, have: Vec<IpAddr> },
    #[error(
        "{family} autodetection (kubernetes-internal-ip): the Kubernetes Node's InternalIP {ip} \
         is on none of this host's interfaces (interfaces seen: {}); check the kubelet's \
         --node-ip, or use another method",
        list_or_none(seen)
    )]
    InternalIpNotLocal {
        family: Family,
        ip: IpAddr,
        seen: Vec<String>,
    },
    #[error("cannot list the host's network interfaces: {0}")]
    Interfaces(#[source] io::Error),
    #[error(
        "{family} autodetection ({method}): no interface is eligible (interfaces seen: {}); {}",
        list_or_none(seen),
        no_interface_hint(method)
    )]
    NoInterface {
        method: Method,
        family: Family,
        seen: Vec<String>,
        decisions: Vec<String>,
    },
    #[error(
        "{family} autodetection ({method}): no usable {family} address on interfaces {} \
         (loopback, link-local and multicast addresses are never chosen){}; choose another \
         method or set the address explicitly",
        list_or_none(considered),
        cidr_hint(method)
    )]
    NoAddress {
        method: Method,
        family: Family,
        considered: Vec<String>,
        decisions: Vec<String>,
    },
    #[error("{family} autodetection (can-reach={dest}): cannot resolve {dest:?}: {source}")]
    Resolve {
        dest: String,
        family: Family,
        #[source]
        source: io::Error,
    },
    #[error(
        "{family} autodetection (can-reach={dest}): {}; give a destination of the family being \
         detected",
        wrong_family(dest, *family, resolved)
    )]
    NoAddressOfFamily {
        dest: String,
        family: Family,
        resolved: Vec<IpAddr>,
    },
    #[error(
        "{family} autodetection (can-reach={dest}): the host has no route to {}: {source}",
        list_ips(tried)
    )]
    NoRoute {
        dest: String,
        family: Family,
        tried: Vec<IpAddr>,
        #[source]
        source: io::Error,
    },
    #[error(
        "{family} autodetection (can-reach={dest}): the kernel would send from {local}, which \
         is not an address of any interface (interfaces seen: {})",
        list_or_none(seen)
    )]
    SourceNotLocal {
        dest: String,
        family: Family,
        local: IpAddr,
        seen: Vec<String>,
    },
}

impl AutodetectError {
    /// The decisions taken before failing (empty for errors found before looking at the host).
    pub fn decisions(&self) -> &[String] {
        match self {
            AutodetectError::NoInterface { decisions, .. }
            | AutodetectError::NoAddress { decisions, .. } => decisions,
            _ => &[],
        }
    }
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

fn list_ips(ips: &[IpAddr]) -> String {
    let v: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
    list_or_none(&v)
}

fn wrong_family(dest: &str, family: Family, resolved: &[IpAddr]) -> String {
    match dest.parse::<IpAddr>() {
        Ok(ip) => format!("{ip} is an {} address", Family::of(ip)),
        Err(_) => format!(
            "{dest:?} has no {family} address (it resolves to: {})",
            list_ips(resolved)
        ),
    }
}

fn no_interface_hint(method: &Method) -> &'static str {
    match method {
        Method::Interface(_) => {
            "interface= regexes are unanchored searches on the interface name (e.g. ^eth0$ \
             for exactly eth0)"
        }
        Method::SkipInterface(_) => {
            "every interface was skipped by Calico's default exclusion list or the \
             skip-interface= regexes"
        }
        _ => "every interface was skipped by Calico's default exclusion list",
    }
}

fn cidr_hint(method: &Method) -> String {
    match method {
        Method::Cidr(c) => {
            let c: Vec<String> = c.iter().map(Cidr::to_string).collect();
            format!(" inside {}", c.join(", "))
        }
        _ => String::new(),
    }
}

/// Why `ip` is not a "global unicast" address in Go's sense (what Calico requires), if it isn't.
fn not_global_unicast(ip: IpAddr) -> Option<&'static str> {
    fn v4(a: Ipv4Addr) -> Option<&'static str> {
        if a.is_unspecified() {
            Some("unspecified address")
        } else if a.is_loopback() {
            Some("loopback address")
        } else if a.is_multicast() {
            Some("multicast address")
        } else if a.is_link_local() {
            Some("link-local address")
        } else if a.is_broadcast() {
            Some("broadcast address")
        } else {
            None
        }
    }
    match ip {
        IpAddr::V4(a) => v4(a),
        IpAddr::V6(a) => {
            if let Some(m) = a.to_ipv4_mapped() {
                v4(m)
            } else if a.is_unspecified() {
                Some("unspecified address")
            } else if a.is_loopback() {
                Some("loopback address")
            } else if a.is_multicast() {
                Some("multicast address")
            } else if a.is_unicast_link_local() {
                Some("link-local address")
            } else {
                None
            }
        }
    }
}

/// Interfaces in the order Calico examines them: highest index first.
fn calico_order(mut ifaces: Vec<InterfaceInfo>) -> Vec<InterfaceInfo> {
    ifaces.sort_by_key(|i| std::cmp::Reverse(i.index));
    ifaces
}

fn label(i: &InterfaceInfo) -> String {
    format!("interface {} (index {})", i.name, i.index)
}

/// Collects decisions and logs each one.
#[derive(Default)]
struct Decisions(Vec<String>);

impl Decisions {
    fn detail(&mut self, msg: String) {
        tracing::debug!("autodetection: {msg}");
        self.0.push(msg);
    }
    fn info(&mut self, msg: String) {
        tracing::info!("autodetection: {msg}");
        self.0.push(msg);
    }
}

/// Runs `method` for `family` against the host seen through `net`. `internal_ips` are the
/// InternalIP addresses of the Kubernetes Node (in the Kubernetes datastore, the Node's
/// `spec.addresses` of type InternalIP), which only `kubernetes-internal-ip` reads.
pub fn autodetect(
    method: &Method,
    family: Family,
    net: &dyn NetView,
    internal_ips: &[IpAddr],
) -> Result<Detection, AutodetectError> {
    let default_excl = || -> Vec<(String, Regex, bool)> {
        default_exclusions()
            .iter()
            .map(|(p, re)| ((*p).to_string(), re.clone(), true))
            .collect()
    };
    match method {
        Method::FirstFound => filtered(method, family, net, &[], &default_excl(), &[]),
        Method::Interface(regexes) => {
            let incl = compile_all(regexes, &method.to_string())?;
            let incl: Vec<(String, Regex)> = regexes.iter().cloned().zip(incl).collect();
            filtered(method, family, net, &incl, &[], &[])
        }
        Method::SkipInterface(regexes) => {
            let mut excl = default_excl();
            let user = compile_all(regexes, &method.to_string())?;
            excl.extend(
                regexes
                    .iter()
                    .cloned()
                    .zip(user)
                    .map(|(s, re)| (s, re, false)),
            );
            filtered(method, family, net, &[], &excl, &[])
        }
        Method::Cidr(cidrs) => filtered(method, family, net, &[], &[], cidrs),
        Method::CanReach(dest) => can_reach(dest, family, net),
        Method::KubernetesInternalIp => kubernetes_internal_ip(family, internal_ips, net),
    }
}

/// kubernetes-internal-ip, as Calico does it: the Node's first InternalIP of the family, with
/// the prefix length of the interface holding it (every interface is searched, none excluded);
/// an InternalIP no interface holds is an error.
fn kubernetes_internal_ip(
    family: Family,
    internal_ips: &[IpAddr],
    net: &dyn NetView,
) -> Result<Detection, AutodetectError> {
    let Some(ip) = internal_ips.iter().copied().find(|ip| family.matches(*ip)) else {
        return Err(AutodetectError::NoInternalIp {
            family,
            have: internal_ips.to_vec(),
        });
    };
    let ifaces = calico_order(net.interfaces().map_err(AutodetectError::Interfaces)?);
    let Some((iface, cidr)) = find_holder(ip, &ifaces) else {
        return Err(AutodetectError::InternalIpNotLocal {
            family,
            ip,
            seen: ifaces.iter().map(|i| i.name.clone()).collect(),
        });
    };
    let mut d = Decisions::default();
    d.info(format!(
        "{family} autodetection with method kubernetes-internal-ip: the Kubernetes Node's \
         InternalIP {ip} is on {} as {cidr}",
        label(iface)
    ));
    Ok(Detection {
        address: cidr,
        interface: iface.name.clone(),
        decisions: d.0,
    })
}

/// first-found, interface=, skip-interface= and cidr=: filter interfaces by name, then take the
/// first global unicast address of the family (inside `cidrs` when given).
fn filtered(
    method: &Method,
    family: Family,
    net: &dyn NetView,
    incl: &[(String, Regex)],
    excl: &[(String, Regex, bool)],
    cidrs: &[Cidr],
) -> Result<Detection, AutodetectError> {
    let mut d = Decisions::default();
    let ifaces = calico_order(net.interfaces().map_err(AutodetectError::Interfaces)?);
    let seen: Vec<String> = ifaces.iter().map(|i| i.name.clone()).collect();
    d.detail(format!(
        "{family} autodetection with method {method}: examining interfaces from the highest \
         index down, as Calico does: {}",
        list_or_none(&seen)
    ));

    let mut eligible = Vec::new();
    for i in &ifaces {
        if !incl.is_empty() && !incl.iter().any(|(_, re)| re.is_match(&i.name)) {
            let list: Vec<&str> = incl.iter().map(|(s, _)| s.as_str()).collect();
            d.detail(format!(
                "{}: skipped: name does not match any interface= regex ({})",
                label(i),
                list.join(", ")
            ));
            continue;
        }
        if let Some((pat, _, default)) = excl.iter().find(|(_, re, _)| re.is_match(&i.name)) {
            if *default {
                d.detail(format!(
                    "{}: skipped: name matches {pat} in Calico's default exclusion list",
                    label(i)
                ));
            } else {
                d.detail(format!(
                    "{}: skipped: name matches skip-interface= regex {pat}",
                    label(i)
                ));
            }
            continue;
        }
        eligible.push(i);
    }
    if eligible.is_empty() {
        return Err(AutodetectError::NoInterface {
            method: method.clone(),
            family,
            seen,
            decisions: d.0,
        });
    }

    for (pos, i) in eligible.iter().enumerate() {
        let addrs: Vec<&Cidr> = i
            .addrs
            .iter()
            .filter(|c| family.matches(c.addr()))
            .collect();
        if addrs.is_empty() {
            d.detail(format!("{}: skipped: no {family} address", label(i)));
            continue;
        }
        for c in addrs {
            if let Some(why) = not_global_unicast(c.addr()) {
                d.detail(format!("{}: passed over {c}: {why}", label(i)));
                continue;
            }
            if !cidrs.is_empty() && !cidrs.iter().any(|n| n.contains(c.addr())) {
                let list: Vec<String> = cidrs.iter().map(Cidr::to_string).collect();
                d.detail(format!(
                    "{}: passed over {c}: not inside any of {}",
                    label(i),
                    list.join(", ")
                ));
                continue;
            }
            let why = if cidrs.is_empty() {
                format!("the first global unicast {family} address on the first eligible interface")
            } else {
                format!("the first global unicast {family} address inside the given CIDRs")
            };
            d.info(format!("{}: chose {c}: {why}", label(i)));
            if !i.up {
                d.info(format!(
                    "{}: note: the interface is down (Calico does not skip down interfaces)",
                    label(i)
                ));
            }
            let rest: Vec<String> = eligible[pos + 1..].iter().map(|i| i.name.clone()).collect();
            if !rest.is_empty() {
                d.detail(format!(
                    "not examined, an address was already chosen: {}",
                    rest.join(", ")
                ));
            }
            return Ok(Detection {
                address: *c,
                interface: i.name.clone(),
                decisions: d.0,
            });
        }
    }
    Err(AutodetectError::NoAddress {
        method: method.clone(),
        family,
        considered: eligible.iter().map(|i| i.name.clone()).collect(),
        decisions: d.0,
    })
}

/// How many resolved addresses can-reach tries before giving up.
const MAX_REACH_CANDIDATES: usize = 16;

fn can_reach(dest: &str, family: Family, net: &dyn NetView) -> Result<Detection, AutodetectError> {
    let mut d = Decisions::default();
    let resolved: Vec<IpAddr> = match dest.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => {
            let addrs =
                (dest, 80u16)
                    .to_socket_addrs()
                    .map_err(|source| AutodetectError::Resolve {
                        dest: dest.to_string(),
                        family,
                        source,
                    })?;
            let mut seen = HashSet::new();
            let v: Vec<IpAddr> = addrs
                .map(|a| a.ip())
                .filter(|ip| seen.insert(*ip))
                .collect();
            d.detail(format!("can-reach: {dest} resolves to {}", list_ips(&v)));
            v
        }
    };
    let candidates: Vec<IpAddr> = resolved
        .iter()
        .copied()
        .filter(|ip| family.matches(*ip))
        .take(MAX_REACH_CANDIDATES)
        .collect();
    if candidates.is_empty() {
        return Err(AutodetectError::NoAddressOfFamily {
            dest: dest.to_string(),
            family,
            resolved,
        });
    }

    let mut local = None;
    let mut last_err = None;
    for ip in &candidates {
        match net.route_source(*ip) {
            Ok(src) => {
                d.detail(format!(
                    "can-reach: the kernel would send to {ip} from {src}"
                ));
                local = Some(src);
                break;
            }
            Err(e) => {
                d.detail(format!("can-reach: no route to {ip}: {e}"));
                last_err = Some(e);
            }
        }
    }
    let Some(local) = local else {
        return Err(AutodetectError::NoRoute {
            dest: dest.to_string(),
            family,
            tried: candidates,
            source: last_err.unwrap_or_else(|| io::Error::other("no route")),
        });
    };

    let ifaces = calico_order(net.interfaces().map_err(AutodetectError::Interfaces)?);
    match find_holder(local, &ifaces) {
        Some((i, c)) => {
            d.info(format!(
                "{}: chose {c}: it holds {local}, the source address the kernel uses to reach \
                 {dest}",
                label(i)
            ));
            Ok(Detection {
                address: c,
                interface: i.name.clone(),
                decisions: d.0,
            })
        }
        None => Err(AutodetectError::SourceNotLocal {
            dest: dest.to_string(),
            family,
            local,
            seen: ifaces.iter().map(|i| i.name.clone()).collect(),
        }),
    }
}

/// The first interface (Calico order) holding exactly `addr`, with the address's prefix length.
fn find_holder(addr: IpAddr, ifaces: &[InterfaceInfo]) -> Option<(&InterfaceInfo, Cidr)> {
    ifaces
        .iter()
        .find_map(|i| i.addrs.iter().find(|c| c.addr() == addr).map(|c| (i, *c)))
}

/// The interface holding `addr` and the address with that interface's prefix length: how a bare
/// `IP=10.0.0.5` gets its `/24` (Calico's `GetLocalCIDR`; all interfaces are searched, highest
/// index first). `None` when no interface holds it (Calico then keeps the bare address).
pub fn interface_holding(addr: IpAddr, net: &dyn NetView) -> io::Result<Option<(String, Cidr)>> {
    let ifaces = calico_order(net.interfaces()?);
    let found = find_holder(addr, &ifaces).map(|(i, c)| (i.name.clone(), c));
    match &found {
        Some((name, c)) => tracing::info!("{addr} is on interface {name} as {c}"),
        None => tracing::warn!("no host interface holds {addr}"),
    }
    Ok(found)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
