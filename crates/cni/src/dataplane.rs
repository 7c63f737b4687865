//! The Linux dataplane of one workload interface: Calico's veth layout.
//!
//! Host side (the plugin's own namespace): `cali…` with MAC ee:ee:ee:ee:ee:ee, proxy ARP /
//! proxy NDP, forwarding, route_localnet, no router advertisements, and one scope-link route
//! per pod address. Container side (CNI_IFNAME): the pod's /32 and /128 addresses, a
//! scope-link route to 169.254.1.1 and the default route through it; for IPv6 the default
//! route goes through the host side's link-local address.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use margay_api::net::Cidr;
use margay_netlink::sysctl::ProcSys;
use margay_netlink::{Link, Netlink, Route, is_exists, netns};

use crate::workload::{GATEWAY_V4, HOST_MAC, mac_string};

/// Writes a setting under `/proc/sys` in the calling thread's namespace.
fn write_sysctl(path: &str, value: &str) -> io::Result<()> {
    ProcSys::default().write(path, value)
}

/// How long to wait for the host side's IPv6 link-local address.
const LINK_LOCAL_WAIT: Duration = Duration::from_secs(2);
/// How long to keep trying to give the host side its MAC.
const MAC_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// The container's namespace does not exist (or is not a network namespace).
    #[error("network namespace {path}: {source}")]
    Netns { path: String, source: io::Error },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    /// Something else owns what the pod needs.
    #[error("{0}")]
    Conflict(String),
}

impl DataplaneError {
    fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> DataplaneError {
        let what = what.into();
        move |source| DataplaneError::Io { what, source }
    }

    pub fn netns_missing(&self) -> bool {
        matches!(self, DataplaneError::Netns { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// What one workload interface looks like.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub host_veth: &'a str,
    pub ifname: &'a str,
    pub netns: &'a Path,
    pub mtu: u32,
    pub ips: &'a [IpAddr],
    pub allow_ip_forwarding: bool,
}

impl Spec<'_> {
    fn has_v4(&self) -> bool {
        self.ips.iter().any(IpAddr::is_ipv4)
    }
    fn has_v6(&self) -> bool {
        self.ips.iter().any(IpAddr::is_ipv6)
    }
}

/// The result of a successful set-up.
#[derive(Debug, Clone)]
pub struct SetUp {
    pub host_index: u32,
    pub container_mac: String,
    pub container_index: u32,
    /// The IPv6 next hop in the container (the host side's link-local address).
    pub gateway_v6: Option<Ipv6Addr>,
}

fn host_len(ip: &IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

fn open_netns(path: &Path) -> Result<File, DataplaneError> {
    netns::open(path).map_err(|source| DataplaneError::Netns {
        path: path.display().to_string(),
        source,
    })
}

/// Creates and configures the interface pair. On failure nothing is left behind (the pair is
/// deleted again).
pub fn set_up(spec: &Spec<'_>) -> Result<SetUp, DataplaneError> {
    let mut host = Netlink::open().map_err(DataplaneError::io("opening netlink"))?;
    // A leftover from an earlier attempt for the same workload is replaced (as Calico does).
    if host
        .delete_link_named(spec.host_veth)
        .map_err(DataplaneError::io(format!(
            "deleting old {}",
            spec.host_veth
        )))?
    {
        tracing::info!(iface = spec.host_veth, "deleted an old host-side interface");
    }
    let ns = open_netns(spec.netns)?;
    host.create_veth(
        spec.host_veth,
        spec.ifname,
        ns.as_raw_fd(),
        spec.mtu,
        &HOST_MAC,
    )
    .map_err(|e| {
        if is_exists(&e) {
            DataplaneError::Conflict(format!(
                "cannot create the veth pair {} / {}: an interface named {} already exists in the container's namespace (is another network attached with the same CNI_IFNAME?)",
                spec.host_veth, spec.ifname, spec.ifname
            ))
        } else {
            DataplaneError::Io {
                what: format!("creating the veth pair {} / {}", spec.host_veth, spec.ifname),
                source: e,
            }
        }
    })?;
    match configure(spec, &mut host, &ns) {
        Ok(done) => Ok(done),
        Err(e) => {
            if let Err(de) = host.delete_link_named(spec.host_veth) {
                tracing::warn!(
                    iface = spec.host_veth,
                    "removing the half-configured interface: {de}"
                );
            }
            Err(e)
        }
    }
}

fn configure(spec: &Spec<'_>, host: &mut Netlink, ns: &File) -> Result<SetUp, DataplaneError> {
    let (v4, v6) = (spec.has_v4(), spec.has_v6());
    // Container side, first part: a socket there, and sysctls that must precede "up".
    let ifname = spec.ifname.to_string();
    let forwarding = if spec.allow_ip_forwarding { "1" } else { "0" };
    let mut cont = netns::run_in(ns, || {
        let nl = Netlink::open()?;
        if v6 {
            write_sysctl("net/ipv6/conf/all/disable_ipv6", "0")?;
            write_sysctl("net/ipv6/conf/default/disable_ipv6", "0")?;
            write_sysctl("net/ipv6/conf/lo/disable_ipv6", "0")?;
            write_sysctl(&format!("net/ipv6/conf/{ifname}/accept_dad"), "0")?;
            write_sysctl("net/ipv6/conf/all/forwarding", forwarding)?;
        }
        if v4 {
            write_sysctl("net/ipv4/ip_forward", forwarding)?;
        }
        Ok(nl)
    })
    .map_err(DataplaneError::io("configuring the container's namespace"))?;

    // Host side sysctls.
    host_sysctls(spec.host_veth, v4, v6)?;

    // Host side MAC (the kernel does not always honour the one given at creation).
    let host_link = host_mac(host, spec.host_veth)?;
    host.set_up(host_link.index)
        .map_err(DataplaneError::io(format!("setting {} up", spec.host_veth)))?;

    let cont_link = cont
        .link(spec.ifname)
        .map_err(DataplaneError::io(format!("reading {}", spec.ifname)))?
        .ok_or_else(|| {
            DataplaneError::Conflict(format!(
                "{} vanished from the container's namespace during set-up",
                spec.ifname
            ))
        })?;
    cont.set_up(cont_link.index)
        .map_err(DataplaneError::io(format!("setting {} up", spec.ifname)))?;

    if v4 {
        let gw = IpAddr::V4(GATEWAY_V4);
        add_route_idempotent(&mut cont, &Route::new(gw, 32, cont_link.index, None)).map_err(
            DataplaneError::io("adding the route to 169.254.1.1 in the container"),
        )?;
        add_route_idempotent(
            &mut cont,
            &Route::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                0,
                cont_link.index,
                Some(gw),
            ),
        )
        .map_err(DataplaneError::io(
            "adding the IPv4 default route in the container",
        ))?;
    }
    let mut gateway_v6 = None;
    if v6 {
        let ll = wait_link_local(host, host_link.index, spec.host_veth)?;
        gateway_v6 = Some(ll);
        add_route_idempotent(
            &mut cont,
            &Route::new(
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                0,
                cont_link.index,
                Some(IpAddr::V6(ll)),
            ),
        )
        .map_err(DataplaneError::io(
            "adding the IPv6 default route in the container",
        ))?;
    }
    for ip in spec.ips {
        let cidr = Cidr::new(*ip, host_len(ip)).map_err(|e| {
            DataplaneError::Conflict(format!("the pod address {ip} is not usable: {e}"))
        })?;
        match cont.add_address(cont_link.index, cidr) {
            Ok(()) => {}
            Err(e) if is_exists(&e) => {}
            Err(e) => {
                return Err(DataplaneError::Io {
                    what: format!("adding {ip} to {} in the container", spec.ifname),
                    source: e,
                });
            }
        }
    }
    // Host routes to the pod.
    for ip in spec.ips {
        host_route(host, *ip, host_link.index, spec.host_veth)?;
    }
    Ok(SetUp {
        host_index: host_link.index,
        container_mac: mac_string(&cont_link.mac),
        container_index: cont_link.index,
        gateway_v6,
    })
}

fn add_route_idempotent(nl: &mut Netlink, r: &Route) -> io::Result<()> {
    match nl.add_route(r) {
        Err(e) if is_exists(&e) => Ok(()),
        other => other,
    }
}

fn host_sysctls(veth: &str, v4: bool, v6: bool) -> Result<(), DataplaneError> {
    let set = |path: String, value: &str| {
        write_sysctl(&path, value).map_err(DataplaneError::io("host-side sysctl"))
    };
    if v4 {
        set(format!("net/ipv4/conf/{veth}/route_localnet"), "1")?;
        if let Err(e) = write_sysctl(&format!("net/ipv4/neigh/{veth}/proxy_delay"), "0") {
            tracing::warn!("{e}");
        }
        set(format!("net/ipv4/conf/{veth}/proxy_arp"), "1")?;
        set(format!("net/ipv4/conf/{veth}/forwarding"), "1")?;
    }
    if v6 {
        set(format!("net/ipv6/conf/{veth}/accept_dad"), "0")?;
        set(format!("net/ipv6/conf/{veth}/disable_ipv6"), "0")?;
        set(format!("net/ipv6/conf/{veth}/proxy_ndp"), "1")?;
        set(format!("net/ipv6/conf/{veth}/forwarding"), "1")?;
    }
    if let Err(e) = write_sysctl(&format!("net/ipv6/conf/{veth}/accept_ra"), "0") {
        tracing::warn!("{e}");
    }
    Ok(())
}

fn host_mac(host: &mut Netlink, name: &str) -> Result<Link, DataplaneError> {
    let deadline = Instant::now() + MAC_WAIT;
    loop {
        let link = host
            .link(name)
            .map_err(DataplaneError::io(format!("reading {name}")))?
            .ok_or_else(|| {
                DataplaneError::Conflict(format!("{name} vanished from the host during set-up"))
            })?;
        if link.mac == HOST_MAC {
            return Ok(link);
        }
        if Instant::now() >= deadline {
            return Err(DataplaneError::Conflict(format!(
                "{name} did not accept the MAC {} (it has {})",
                mac_string(&HOST_MAC),
                mac_string(&link.mac)
            )));
        }
        tracing::warn!(iface = name, mac = %mac_string(&link.mac), "host-side MAC not set yet; setting it again");
        host.set_mac(link.index, &HOST_MAC)
            .map_err(DataplaneError::io(format!("setting the MAC of {name}")))?;
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_link_local(host: &mut Netlink, index: u32, name: &str) -> Result<Ipv6Addr, DataplaneError> {
    let deadline = Instant::now() + LINK_LOCAL_WAIT;
    loop {
        let addrs = host
            .addresses_of(index)
            .map_err(DataplaneError::io(format!(
                "reading the addresses of {name}"
            )))?;
        if let Some(ll) = addrs.iter().find_map(|a| match a.cidr.addr() {
            IpAddr::V6(v6) if a.link_scope && !a.tentative => Some(v6),
            _ => None,
        }) {
            return Ok(ll);
        }
        if Instant::now() >= deadline {
            return Err(DataplaneError::Conflict(format!(
                "{name} got no IPv6 link-local address within {LINK_LOCAL_WAIT:?}: is IPv6 disabled on the host (net.ipv6.conf.{name}.disable_ipv6)?"
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn host_route(
    host: &mut Netlink,
    ip: IpAddr,
    index: u32,
    veth: &str,
) -> Result<(), DataplaneError> {
    let route = Route::new(ip, host_len(&ip), index, None);
    match host.add_route(&route) {
        Ok(()) => Ok(()),
        Err(e) if is_exists(&e) => {
            let routes = host
                .main_routes(ip.is_ipv6())
                .map_err(DataplaneError::io("listing host routes"))?;
            let existing = routes
                .iter()
                .find(|r| r.dst == ip && r.prefix == host_len(&ip));
            match existing {
                Some(r) if r.oif == Some(index) => Ok(()),
                Some(r) => {
                    let other = r
                        .oif
                        .and_then(|i| host.link_by_index(i).ok().flatten().map(|l| l.name))
                        .unwrap_or_else(|| "another interface".to_string());
                    Err(DataplaneError::Conflict(format!(
                        "a route to {ip} already exists through {other}, not {veth}: another workload may still hold this address"
                    )))
                }
                None => Err(DataplaneError::Io {
                    what: format!("adding the route to {ip} via {veth}"),
                    source: e,
                }),
            }
        }
        Err(e) => Err(DataplaneError::Io {
            what: format!("adding the route to {ip} via {veth}"),
            source: e,
        }),
    }
}

/// Removes the container side (which removes the pair). Ok(false) when the namespace or the
/// interface is already gone.
pub fn tear_down(netns_path: &Path, ifname: &str) -> Result<bool, DataplaneError> {
    let ns = match open_netns(netns_path) {
        Ok(ns) => ns,
        Err(e) if e.netns_missing() => return Ok(false),
        Err(e) => return Err(e),
    };
    let name = ifname.to_string();
    netns::run_in(&ns, || Netlink::open()?.delete_link_named(&name)).map_err(DataplaneError::io(
        format!("deleting {ifname} in the container"),
    ))
}

/// Removes the host side by name; Ok(false) if it is not there.
pub fn delete_host_link(name: &str) -> Result<bool, DataplaneError> {
    Netlink::open()
        .and_then(|mut nl| nl.delete_link_named(name))
        .map_err(DataplaneError::io(format!("deleting {name}")))
}

/// Compares the interfaces with `spec`; returns every difference found.
pub fn check(spec: &Spec<'_>) -> Result<Vec<String>, DataplaneError> {
    let mut problems = Vec::new();
    let mut host = Netlink::open().map_err(DataplaneError::io("opening netlink"))?;
    match host
        .link(spec.host_veth)
        .map_err(DataplaneError::io(format!("reading {}", spec.host_veth)))?
    {
        None => problems.push(format!(
            "host-side interface {} does not exist",
            spec.host_veth
        )),
        Some(l) => {
            if l.mac != HOST_MAC {
                problems.push(format!(
                    "host-side interface {} has MAC {}, expected {}",
                    spec.host_veth,
                    mac_string(&l.mac),
                    mac_string(&HOST_MAC)
                ));
            }
            if !l.up {
                problems.push(format!("host-side interface {} is down", spec.host_veth));
            }
            for v6 in [false, true] {
                if !spec.ips.iter().any(|ip| ip.is_ipv6() == v6) {
                    continue;
                }
                let routes = host
                    .main_routes(v6)
                    .map_err(DataplaneError::io("listing host routes"))?;
                for ip in spec.ips.iter().filter(|ip| ip.is_ipv6() == v6) {
                    let ok = routes.iter().any(|r| {
                        r.dst == *ip
                            && r.prefix == host_len(ip)
                            && r.oif == Some(l.index)
                            && r.gateway.is_none()
                    });
                    if !ok {
                        problems.push(format!(
                            "no host route to {ip}/{} via {}",
                            host_len(ip),
                            spec.host_veth
                        ));
                    }
                }
            }
        }
    }
    let ns = open_netns(spec.netns)?;
    let ifname = spec.ifname.to_string();
    let ips = spec.ips.to_vec();
    let cont_problems = netns::run_in(&ns, move || {
        let mut problems = Vec::new();
        let mut nl = Netlink::open()?;
        let Some(l) = nl.link(&ifname)? else {
            problems.push(format!("container interface {ifname} does not exist"));
            return Ok(problems);
        };
        if !l.up {
            problems.push(format!("container interface {ifname} is down"));
        }
        let addrs = nl.addresses_of(l.index)?;
        for ip in &ips {
            if !addrs.iter().any(|a| a.cidr.addr() == *ip && a.cidr.prefix() == host_len(ip)) {
                problems.push(format!(
                    "container interface {ifname} lacks the address {ip}/{}",
                    host_len(ip)
                ));
            }
        }
        if ips.iter().any(IpAddr::is_ipv4) {
            let routes = nl.main_routes(false)?;
            let gw = IpAddr::V4(GATEWAY_V4);
            if !routes
                .iter()
                .any(|r| r.dst == gw && r.prefix == 32 && r.oif == Some(l.index))
            {
                problems.push(format!("container has no route to 169.254.1.1 via {ifname}"));
            }
            if !routes
                .iter()
                .any(|r| r.prefix == 0 && r.gateway == Some(gw) && r.oif == Some(l.index))
            {
                problems.push(format!(
                    "container has no IPv4 default route via 169.254.1.1 dev {ifname}"
                ));
            }
        }
        if ips.iter().any(IpAddr::is_ipv6) {
            let routes = nl.main_routes(true)?;
            if !routes.iter().any(|r| {
                r.prefix == 0
                    && r.oif == Some(l.index)
                    && matches!(r.gateway, Some(IpAddr::V6(g)) if g.is_unicast_link_local())
            }) {
                problems.push(format!(
                    "container has no IPv6 default route via the host's link-local address dev {ifname}"
                ));
            }
        }
        Ok(problems)
    })
    .map_err(DataplaneError::io("inspecting the container's namespace"))?;
    problems.extend(cont_problems);
    Ok(problems)
}
