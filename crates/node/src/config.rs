//! calico-node's start-up settings, read from the same environment variables. Parsing is
//! pure: a lookup function in, a `StartupConfig` out, and an error that names the variable.

use std::path::PathBuf;

use margay_api::ippool::EncapMode;
use margay_api::net::Cidr;
use margay_api::numorstring::AsNumber;

/// The default pool CIDRs and sizes (Calico's).
pub const DEFAULT_IPV4_POOL_CIDR: &str = "192.168.0.0/16";
pub const DEFAULT_IPV4_POOL_NAME: &str = "default-ipv4-ippool";
pub const DEFAULT_IPV6_POOL_NAME: &str = "default-ipv6-ippool";
pub const DEFAULT_IPV4_BLOCK_SIZE: i64 = 26;
pub const DEFAULT_IPV6_BLOCK_SIZE: i64 = 122;
pub const DEFAULT_NODENAME_FILE: &str = "/var/lib/calico/nodename";

/// A start-up setting is unusable; the message names the variable and what would be valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {problem}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub problem: String,
}

fn bad(var: &'static str, value: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        var,
        value: value.to_string(),
        problem: problem.into(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkingBackend {
    Bird,
    Vxlan,
    None,
}

/// What IP (or IP6) asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressSetting {
    /// Unset: autodetect unless the Node already has an address (IPv4); IPv6 stays off.
    Unset,
    Autodetect,
    /// `none`: this family is not used (an address already on the Node is kept).
    Disabled,
    /// An address, with or without prefix length (`10.0.0.5` or `10.0.0.5/24`).
    Given(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum PoolSetting {
    /// `none`: no default pool of this family.
    Disabled,
    /// Create this pool if no pool of the family exists. `cidr` None = Calico's default
    /// (IPv4: 192.168.0.0/16 unless it overlaps a host address; IPv6: a random ULA /48).
    Create(PoolParams),
}

#[derive(Debug, Clone, PartialEq)]
pub struct PoolParams {
    pub cidr: Option<Cidr>,
    pub block_size: i64,
    pub ipip: EncapMode,
    pub vxlan: EncapMode,
    pub nat_outgoing: bool,
    pub node_selector: String,
    pub disable_bgp_export: bool,
}

/// Everything start-up reads from the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct StartupConfig {
    pub backend: NetworkingBackend,
    pub ipv4: AddressSetting,
    pub ipv6: AddressSetting,
    pub ipv4_method: String,
    pub ipv6_method: String,
    pub disable_node_ip_check: bool,
    pub as_number: Option<AsNumber>,
    pub k8s_node_ref: Option<String>,
    pub wait_for_datastore: bool,
    /// None when NO_DEFAULT_POOLS=true.
    pub ipv4_pool: Option<PoolSetting>,
    pub ipv6_pool: Option<PoolSetting>,
    pub cluster_type: String,
    pub disable_file_logging: bool,
    /// FELIX_IPV6SUPPORT (default true): without it no IPv6 pool is created.
    pub ipv6_support: bool,
    pub nodename_file: PathBuf,
}

impl StartupConfig {
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<StartupConfig, ConfigError> {
        let raw = |k: &str| get(k);
        let backend = match raw("CALICO_NETWORKING_BACKEND")
            .unwrap_or_default()
            .to_ascii_lowercase()
            .as_str()
        {
            "" | "bird" => NetworkingBackend::Bird,
            "vxlan" => NetworkingBackend::Vxlan,
            "none" => NetworkingBackend::None,
            other => {
                return Err(bad(
                    "CALICO_NETWORKING_BACKEND",
                    other,
                    "must be bird (the default), vxlan or none",
                ));
            }
        };
        let address = |var: &str| match raw(var).as_deref().map(str::trim) {
            None | Some("") => AddressSetting::Unset,
            Some("autodetect") => AddressSetting::Autodetect,
            Some("none") => AddressSetting::Disabled,
            Some(v) => AddressSetting::Given(v.to_string()),
        };
        let as_number = match raw("AS").filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(v) => Some(AsNumber::parse(v.trim()).map_err(|e| bad("AS", &v, e))?),
        };
        let ipv4_pool_cidr = raw("CALICO_IPV4POOL_CIDR").unwrap_or_default();
        let ipv6_pool_cidr = raw("CALICO_IPV6POOL_CIDR").unwrap_or_default();
        let no_default_pools =
            raw("NO_DEFAULT_POOLS").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let (ipv4_pool, ipv6_pool) = if no_default_pools {
            if !ipv4_pool_cidr.is_empty() || !ipv6_pool_cidr.is_empty() {
                let (var, value) = if ipv4_pool_cidr.is_empty() {
                    ("CALICO_IPV6POOL_CIDR", ipv6_pool_cidr.as_str())
                } else {
                    ("CALICO_IPV4POOL_CIDR", ipv4_pool_cidr.as_str())
                };
                return Err(bad(
                    var,
                    value,
                    "cannot be combined with NO_DEFAULT_POOLS=true (unset one of them)",
                ));
            }
            (None, None)
        } else {
            (
                Some(pool_setting(get, 4, &ipv4_pool_cidr)?),
                Some(pool_setting(get, 6, &ipv6_pool_cidr)?),
            )
        };
        Ok(StartupConfig {
            backend,
            ipv4: address("IP"),
            ipv6: address("IP6"),
            ipv4_method: raw("IP_AUTODETECTION_METHOD").unwrap_or_default(),
            ipv6_method: raw("IP6_AUTODETECTION_METHOD").unwrap_or_default(),
            disable_node_ip_check: raw("DISABLE_NODE_IP_CHECK").is_some_and(|v| v == "true"),
            as_number,
            k8s_node_ref: raw("CALICO_K8S_NODE_REF").filter(|v| !v.is_empty()),
            wait_for_datastore: raw("WAIT_FOR_DATASTORE").is_some_and(|v| v == "true"),
            ipv4_pool,
            ipv6_pool,
            cluster_type: raw("CLUSTER_TYPE").unwrap_or_default(),
            disable_file_logging: raw("CALICO_DISABLE_FILE_LOGGING")
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
            ipv6_support: env_bool(raw("FELIX_IPV6SUPPORT"), true),
            nodename_file: raw("CALICO_NODENAME_FILE")
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(DEFAULT_NODENAME_FILE), PathBuf::from),
        })
    }
}

/// Calico's boolean environment values: false, 0, no, n, f (any case) are false; anything
/// else set is true.
fn env_bool(value: Option<String>, default: bool) -> bool {
    match value {
        None => default,
        Some(v) => !matches!(
            v.to_ascii_lowercase().as_str(),
            "false" | "0" | "no" | "n" | "f"
        ),
    }
}

fn pool_setting(
    get: &dyn Fn(&str) -> Option<String>,
    version: u8,
    cidr: &str,
) -> Result<PoolSetting, ConfigError> {
    let (
        cidr_var,
        size_var,
        ipip_var,
        vxlan_var,
        nat_var,
        sel_var,
        export_var,
        default_size,
        default_nat,
    ) = if version == 4 {
        (
            "CALICO_IPV4POOL_CIDR",
            "CALICO_IPV4POOL_BLOCK_SIZE",
            Some("CALICO_IPV4POOL_IPIP"),
            "CALICO_IPV4POOL_VXLAN",
            "CALICO_IPV4POOL_NAT_OUTGOING",
            "CALICO_IPV4POOL_NODE_SELECTOR",
            "CALICO_IPV4POOL_DISABLE_BGP_EXPORT",
            DEFAULT_IPV4_BLOCK_SIZE,
            true,
        )
    } else {
        (
            "CALICO_IPV6POOL_CIDR",
            "CALICO_IPV6POOL_BLOCK_SIZE",
            None,
            "CALICO_IPV6POOL_VXLAN",
            "CALICO_IPV6POOL_NAT_OUTGOING",
            "CALICO_IPV6POOL_NODE_SELECTOR",
            "CALICO_IPV6POOL_DISABLE_BGP_EXPORT",
            DEFAULT_IPV6_BLOCK_SIZE,
            false,
        )
    };
    if cidr == "none" {
        return Ok(PoolSetting::Disabled);
    }
    let block_size = match get(size_var).filter(|v| !v.is_empty()) {
        None => default_size,
        Some(v) => v
            .trim()
            .parse::<i64>()
            .map_err(|_| bad(size_var, &v, "must be a number"))?,
    };
    let (lo, hi) = if version == 4 { (20, 32) } else { (116, 128) };
    if !(lo..=hi).contains(&block_size) {
        return Err(bad(
            size_var,
            &block_size.to_string(),
            format!("IPv{version} block sizes are {lo}-{hi}"),
        ));
    }
    let node_selector = get(sel_var).unwrap_or_default();
    if let Err(e) = margay_selector::Selector::parse(&node_selector) {
        return Err(bad(sel_var, &node_selector, e.to_string()));
    }
    let cidr = if cidr.is_empty() {
        None
    } else {
        let c = Cidr::parse(cidr.trim()).map_err(|e| bad(cidr_var, cidr, e))?;
        if c.version() != version {
            return Err(bad(cidr_var, cidr, format!("is not an IPv{version} CIDR")));
        }
        Some(c)
    };
    let mode = |var: &'static str| -> Result<EncapMode, ConfigError> {
        let v = get(var).unwrap_or_default();
        match v.to_ascii_lowercase().as_str() {
            "" | "off" | "never" => Ok(EncapMode::Never),
            "always" => Ok(EncapMode::Always),
            "crosssubnet" | "cross-subnet" => Ok(EncapMode::CrossSubnet),
            _ => Err(bad(
                var,
                &v,
                "must be Never (or off), Always, or CrossSubnet",
            )),
        }
    };
    let ipip = match ipip_var {
        Some(var) => mode(var)?,
        None => EncapMode::Never,
    };
    Ok(PoolSetting::Create(PoolParams {
        cidr,
        block_size,
        ipip,
        vxlan: mode(vxlan_var)?,
        nat_outgoing: env_bool(get(nat_var), default_nat),
        node_selector,
        disable_bgp_export: env_bool(get(export_var), false),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn parse(vars: &[(&str, &str)]) -> Result<StartupConfig, ConfigError> {
        StartupConfig::from_lookup(&|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    fn v4(c: &StartupConfig) -> PoolParams {
        match &c.ipv4_pool {
            Some(PoolSetting::Create(p)) => p.clone(),
            other => panic!("{other:?}"),
        }
    }

    fn v6(c: &StartupConfig) -> PoolParams {
        match &c.ipv6_pool {
            Some(PoolSetting::Create(p)) => p.clone(),
            other => panic!("{other:?}"),
        }
    }

    /// Calico's start-up pool table: (environment, expected IPv4 pool, expected IPv6 pool).
    #[test]
    #[allow(clippy::type_complexity)] // a table of (name, env, check)
    fn pool_environment_table() {
        type Check = fn(&PoolParams, &PoolParams) -> bool;
        let cases: &[(&str, &[(&str, &str)], Check)] = &[
            ("no variables", &[], |a, b| {
                a.cidr.is_none()
                    && a.block_size == 26
                    && a.nat_outgoing
                    && a.ipip == EncapMode::Never
                    && b.cidr.is_none()
                    && b.block_size == 122
                    && !b.nat_outgoing
            }),
            (
                "ipv4 cidr",
                &[("CALICO_IPV4POOL_CIDR", "172.16.0.0/24")],
                |a, _| a.cidr.map(|c| c.to_string()) == Some("172.16.0.0/24".into()),
            ),
            (
                "ipv6 cidr",
                &[("CALICO_IPV6POOL_CIDR", "fdff:ffff:ffff:ffff:ffff::/80")],
                |_, b| {
                    b.cidr.map(|c| c.to_string()) == Some("fdff:ffff:ffff:ffff:ffff::/80".into())
                },
            ),
            ("ipip off", &[("CALICO_IPV4POOL_IPIP", "off")], |a, _| {
                a.ipip == EncapMode::Never
            }),
            ("ipip Off", &[("CALICO_IPV4POOL_IPIP", "Off")], |a, _| {
                a.ipip == EncapMode::Never
            }),
            (
                "ipip Never",
                &[("CALICO_IPV4POOL_IPIP", "Never")],
                |a, _| a.ipip == EncapMode::Never,
            ),
            ("ipip empty", &[("CALICO_IPV4POOL_IPIP", "")], |a, _| {
                a.ipip == EncapMode::Never
            }),
            (
                "ipip always",
                &[("CALICO_IPV4POOL_IPIP", "always")],
                |a, _| a.ipip == EncapMode::Always,
            ),
            (
                "ipip Always",
                &[("CALICO_IPV4POOL_IPIP", "Always")],
                |a, _| a.ipip == EncapMode::Always,
            ),
            (
                "ipip cross-subnet",
                &[("CALICO_IPV4POOL_IPIP", "cross-subnet")],
                |a, _| a.ipip == EncapMode::CrossSubnet,
            ),
            (
                "ipip CrossSubnet",
                &[("CALICO_IPV4POOL_IPIP", "CrossSubnet")],
                |a, _| a.ipip == EncapMode::CrossSubnet,
            ),
            (
                "v4 block 27",
                &[("CALICO_IPV4POOL_BLOCK_SIZE", "27")],
                |a, _| a.block_size == 27,
            ),
            (
                "v6 block 123",
                &[("CALICO_IPV6POOL_BLOCK_SIZE", "123")],
                |_, b| b.block_size == 123,
            ),
            (
                "v6 nat on",
                &[("CALICO_IPV6POOL_NAT_OUTGOING", "true")],
                |a, b| a.nat_outgoing && b.nat_outgoing,
            ),
            (
                "v6 nat off",
                &[("CALICO_IPV6POOL_NAT_OUTGOING", "false")],
                |_, b| !b.nat_outgoing,
            ),
            (
                "v4 nat off",
                &[("CALICO_IPV4POOL_NAT_OUTGOING", "false")],
                |a, _| !a.nat_outgoing,
            ),
            (
                "v4 nat 0",
                &[("CALICO_IPV4POOL_NAT_OUTGOING", "0")],
                |a, _| !a.nat_outgoing,
            ),
            (
                "v4 nat no",
                &[("CALICO_IPV4POOL_NAT_OUTGOING", "No")],
                |a, _| !a.nat_outgoing,
            ),
            (
                "both nat",
                &[
                    ("CALICO_IPV4POOL_NAT_OUTGOING", "false"),
                    ("CALICO_IPV6POOL_NAT_OUTGOING", "true"),
                ],
                |a, b| !a.nat_outgoing && b.nat_outgoing,
            ),
            (
                "v4 selector all()",
                &[("CALICO_IPV4POOL_NODE_SELECTOR", "all()")],
                |a, _| a.node_selector == "all()",
            ),
            (
                "v4 selector key",
                &[("CALICO_IPV4POOL_NODE_SELECTOR", "key == 'something'")],
                |a, _| a.node_selector == "key == 'something'",
            ),
            (
                "v6 selector has()",
                &[("CALICO_IPV6POOL_NODE_SELECTOR", "has(something)")],
                |_, b| b.node_selector == "has(something)",
            ),
            ("vxlan off", &[("CALICO_IPV4POOL_VXLAN", "off")], |a, _| {
                a.vxlan == EncapMode::Never
            }),
            (
                "vxlan Always",
                &[("CALICO_IPV4POOL_VXLAN", "Always")],
                |a, _| a.vxlan == EncapMode::Always,
            ),
            (
                "vxlan cross-subnet",
                &[("CALICO_IPV4POOL_VXLAN", "cross-subnet")],
                |a, _| a.vxlan == EncapMode::CrossSubnet,
            ),
            (
                "v6 vxlan always",
                &[("CALICO_IPV6POOL_VXLAN", "always")],
                |_, b| b.vxlan == EncapMode::Always,
            ),
            (
                "v6 vxlan CrossSubnet",
                &[("CALICO_IPV6POOL_VXLAN", "CrossSubnet")],
                |_, b| b.vxlan == EncapMode::CrossSubnet,
            ),
            (
                "both vxlan",
                &[
                    ("CALICO_IPV4POOL_VXLAN", "CrossSubnet"),
                    ("CALICO_IPV6POOL_VXLAN", "Always"),
                ],
                |a, b| a.vxlan == EncapMode::CrossSubnet && b.vxlan == EncapMode::Always,
            ),
            (
                "v4 no export",
                &[("CALICO_IPV4POOL_DISABLE_BGP_EXPORT", "true")],
                |a, b| a.disable_bgp_export && !b.disable_bgp_export,
            ),
            (
                "v6 no export",
                &[("CALICO_IPV6POOL_DISABLE_BGP_EXPORT", "true")],
                |a, b| !a.disable_bgp_export && b.disable_bgp_export,
            ),
            (
                "both export false",
                &[
                    ("CALICO_IPV4POOL_DISABLE_BGP_EXPORT", "false"),
                    ("CALICO_IPV6POOL_DISABLE_BGP_EXPORT", "false"),
                ],
                |a, b| !a.disable_bgp_export && !b.disable_bgp_export,
            ),
        ];
        for (name, vars, check) in cases {
            let c = parse(vars).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                check(&v4(&c), &v6(&c)),
                "{name}: {:?} / {:?}",
                v4(&c),
                v6(&c)
            );
        }
    }

    #[test]
    fn disabled_pools() {
        let c = parse(&[("CALICO_IPV4POOL_CIDR", "none")]).unwrap();
        assert_eq!(c.ipv4_pool, Some(PoolSetting::Disabled));
        assert!(matches!(c.ipv6_pool, Some(PoolSetting::Create(_))));
        let c = parse(&[
            ("CALICO_IPV4POOL_CIDR", "none"),
            ("CALICO_IPV6POOL_CIDR", "none"),
        ])
        .unwrap();
        assert_eq!(c.ipv6_pool, Some(PoolSetting::Disabled));
        let c = parse(&[("NO_DEFAULT_POOLS", "true")]).unwrap();
        assert_eq!((c.ipv4_pool, c.ipv6_pool), (None, None));
    }

    /// Calico's table of settings start-up must refuse; each error names the variable.
    #[test]
    fn invalid_environment_table() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("CALICO_IPV4POOL_CIDR", "172.16.0.0a/24")],
                "CALICO_IPV4POOL_CIDR",
            ),
            (
                &[("CALICO_IPV4POOL_CIDR", "fd00::/64")],
                "CALICO_IPV4POOL_CIDR",
            ),
            (
                &[("CALICO_IPV6POOL_CIDR", "10.0.0.0/16")],
                "CALICO_IPV6POOL_CIDR",
            ),
            (
                &[
                    ("NO_DEFAULT_POOLS", "true"),
                    ("CALICO_IPV4POOL_CIDR", "10.0.0.0/16"),
                ],
                "CALICO_IPV4POOL_CIDR",
            ),
            (
                &[
                    ("NO_DEFAULT_POOLS", "TRUE"),
                    ("CALICO_IPV6POOL_CIDR", "fd00::/64"),
                ],
                "CALICO_IPV6POOL_CIDR",
            ),
            (
                &[("CALICO_IPV4POOL_IPIP", "badVal")],
                "CALICO_IPV4POOL_IPIP",
            ),
            (
                &[("CALICO_IPV4POOL_VXLAN", "sometimes")],
                "CALICO_IPV4POOL_VXLAN",
            ),
            (&[("CALICO_IPV6POOL_VXLAN", "yes")], "CALICO_IPV6POOL_VXLAN"),
            (
                &[("CALICO_IPV4POOL_NODE_SELECTOR", "all(")],
                "CALICO_IPV4POOL_NODE_SELECTOR",
            ),
            (
                &[("CALICO_IPV6POOL_NODE_SELECTOR", "a ==")],
                "CALICO_IPV6POOL_NODE_SELECTOR",
            ),
            (
                &[("CALICO_IPV4POOL_BLOCK_SIZE", "19")],
                "CALICO_IPV4POOL_BLOCK_SIZE",
            ),
            (
                &[("CALICO_IPV4POOL_BLOCK_SIZE", "33")],
                "CALICO_IPV4POOL_BLOCK_SIZE",
            ),
            (
                &[("CALICO_IPV4POOL_BLOCK_SIZE", "big")],
                "CALICO_IPV4POOL_BLOCK_SIZE",
            ),
            (
                &[("CALICO_IPV6POOL_BLOCK_SIZE", "115")],
                "CALICO_IPV6POOL_BLOCK_SIZE",
            ),
            (
                &[("CALICO_IPV6POOL_BLOCK_SIZE", "129")],
                "CALICO_IPV6POOL_BLOCK_SIZE",
            ),
            (&[("AS", "1.2.3")], "AS"),
            (&[("AS", "65536.1")], "AS"),
            (&[("AS", "x")], "AS"),
            (
                &[("CALICO_NETWORKING_BACKEND", "ipip")],
                "CALICO_NETWORKING_BACKEND",
            ),
        ];
        for (vars, var) in cases {
            let e = parse(vars).expect_err(&format!("{vars:?} should fail"));
            assert_eq!(e.var, *var, "{vars:?}: {e}");
            assert!(e.to_string().starts_with(var), "{e}");
        }
    }

    #[test]
    fn addresses_as_and_flags() {
        let c = parse(&[]).unwrap();
        assert_eq!(
            (c.ipv4.clone(), c.ipv6.clone()),
            (AddressSetting::Unset, AddressSetting::Unset)
        );
        assert_eq!(c.backend, NetworkingBackend::Bird);
        let c = parse(&[
            ("IP", "autodetect"),
            ("IP6", "fd00::5/64"),
            ("AS", "1.10"),
            ("CALICO_NETWORKING_BACKEND", "VXLAN"),
            ("DISABLE_NODE_IP_CHECK", "true"),
            ("CALICO_K8S_NODE_REF", "k8s-node-1"),
            ("WAIT_FOR_DATASTORE", "true"),
            ("FELIX_IPV6SUPPORT", "false"),
        ])
        .unwrap();
        assert_eq!(c.ipv4, AddressSetting::Autodetect);
        assert_eq!(c.ipv6, AddressSetting::Given("fd00::5/64".into()));
        assert_eq!(c.as_number, Some(AsNumber(65536 + 10)));
        assert_eq!(c.backend, NetworkingBackend::Vxlan);
        assert!(c.disable_node_ip_check && c.wait_for_datastore && !c.ipv6_support);
        assert_eq!(c.k8s_node_ref.as_deref(), Some("k8s-node-1"));
        assert_eq!(
            parse(&[("IP", "none")]).unwrap().ipv4,
            AddressSetting::Disabled
        );
        assert_eq!(
            parse(&[("AS", "64512")]).unwrap().as_number,
            Some(AsNumber(64512))
        );
    }
}
