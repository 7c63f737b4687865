//! Behaviour of the typed [`Config`]: defaults, cross-field validation, changes between two
//! configurations, and the derived values the rest of Felix asks for.

use std::fmt;
use std::sync::OnceLock;

use regex::Regex;
use serde::Serialize;

use crate::table::{Config, PARAMS, ParamId};
use crate::value::RouteTableRange;

/// Felix's exit code when a configuration change needs a restart (the supervisor restarts it;
/// Calico uses the same code, SIGHUP's).
pub const RESTART_EXIT_CODE: i32 = 129;

/// One parameter whose value differs between two configurations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    #[serde(skip)]
    pub id: ParamId,
    pub name: &'static str,
    pub old: String,
    pub new: String,
    /// Whether Felix applies the change without restarting.
    pub live: bool,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} changed from {:?} to {:?}",
            self.name, self.old, self.new
        )?;
        if self.live {
            f.write_str(" (applied live)")
        } else {
            f.write_str(" (needs a restart)")
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config::defaults().clone()
    }
}

impl Config {
    /// Every parameter at its default (FelixHostname empty: its default is the host's name,
    /// which only the loader knows).
    pub fn defaults() -> &'static Config {
        static DEFAULTS: OnceLock<Config> = OnceLock::new();
        DEFAULTS.get_or_init(|| {
            let mut c = Config::zeroed();
            for p in PARAMS {
                c.set(p.id, p.default_value());
            }
            c
        })
    }

    /// The parameters whose values differ from `other`'s (`self` is the old configuration).
    pub fn changed_params(&self, other: &Config) -> Vec<Change> {
        PARAMS
            .iter()
            .filter_map(|p| {
                let old = self.get(p.id);
                let new = other.get(p.id);
                (old != new).then(|| Change {
                    id: p.id,
                    name: p.name,
                    old: old.to_string(),
                    new: new.to_string(),
                    live: p.live(),
                })
            })
            .collect()
    }

    /// The changes to `other` that Felix cannot apply live. If any, Felix logs them and exits
    /// with [`RESTART_EXIT_CODE`].
    pub fn restart_required(&self, other: &Config) -> Vec<Change> {
        self.changed_params(other)
            .into_iter()
            .filter(|c| !c.live)
            .collect()
    }

    /// Cross-field checks (Calico's `Validate`): a hostname, an etcd address for etcdv3, and
    /// Typha TLS settings that are all given or all absent.
    pub fn validate(&self) -> Result<(), String> {
        let mut errors = Vec::new();
        if self.felix_hostname.is_empty() {
            errors.push("failed to determine the hostname (set FelixHostname)".to_string());
        }
        if self.datastore_type == "etcdv3" && self.etcd_endpoints.is_empty() {
            if self.etcd_scheme.is_empty() {
                errors.push("both EtcdEndpoints and EtcdScheme are missing".into());
            }
            if self.etcd_addr.is_empty() {
                errors.push("both EtcdEndpoints and EtcdAddr are missing".into());
            }
        }
        let any_tls = [
            &self.typha_ca_file,
            &self.typha_cert_file,
            &self.typha_key_file,
            &self.typha_cn,
            &self.typha_uri_san,
        ]
        .iter()
        .any(|s| !s.is_empty());
        if any_tls {
            let mut missing: Vec<&str> = [
                ("TyphaKeyFile", &self.typha_key_file),
                ("TyphaCertFile", &self.typha_cert_file),
                ("TyphaCAFile", &self.typha_ca_file),
            ]
            .iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(n, _)| *n)
            .collect();
            if self.typha_cn.is_empty() && self.typha_uri_san.is_empty() {
                missing.push("TyphaCN or TyphaURISAN");
            }
            if !missing.is_empty() {
                errors.push(format!(
                    "if any Felix-Typha TLS parameter is set, TyphaKeyFile, TyphaCertFile, \
                     TyphaCAFile and one of TyphaCN or TyphaURISAN must all be set; missing: {} \
                     (a file parameter whose file does not exist counts as missing)",
                    missing.join(", ")
                ));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// The workload interface prefixes (`InterfacePrefix` is a comma-separated list).
    pub fn interface_prefixes(&self) -> Vec<&str> {
        self.interface_prefix.split(',').collect()
    }

    /// `InterfaceExclude` compiled (names are anchored, `/regex/` entries are not).
    pub fn interface_exclude_regexes(&self) -> Vec<Regex> {
        self.interface_exclude
            .iter()
            .filter_map(|p| Regex::new(p).ok())
            .collect()
    }

    /// The routing tables Felix may use: `RouteTableRanges` if set, else the deprecated
    /// `RouteTableRange` if set, else 1-250; without Linux's reserved tables 253-255 (which
    /// Calico's allocator skips too).
    pub fn route_table_indices(&self) -> Vec<RouteTableRange> {
        let ranges = if !self.route_table_ranges.is_empty() {
            self.route_table_ranges.clone()
        } else if let Some(r) = self.route_table_range {
            vec![r]
        } else {
            vec![RouteTableRange { min: 1, max: 250 }]
        };
        let mut out = Vec::new();
        for r in ranges {
            if r.min < 253 {
                out.push(RouteTableRange {
                    min: r.min,
                    max: r.max.min(252),
                });
            }
            if r.max > 255 {
                out.push(RouteTableRange {
                    min: r.min.max(256),
                    max: r.max,
                });
            }
        }
        out
    }
}

/// Whether margay acts on a parameter under a given configuration (what `margay felix config`
/// marks and what Felix warns about at start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActedOn {
    Yes,
    /// Never: margay accepts the parameter and behaves as if it had the value given.
    No {
        behaves_as: String,
    },
    /// Not with this configuration: the reason names what is used instead.
    NotNow {
        reason: String,
    },
}

impl ActedOn {
    pub fn yes(&self) -> bool {
        matches!(self, ActedOn::Yes)
    }
}

/// The parameters that exist once per rule dataplane: Calico uses the nftables ones in
/// nftables mode and the iptables ones otherwise; margay, whose policy is always nftables,
/// takes the same one Calico would (so a cluster's existing settings keep their meaning).
const MODE_PAIRS: &[(ParamId, ParamId)] = &[
    (
        ParamId::IptablesFilterAllowAction,
        ParamId::NftablesFilterAllowAction,
    ),
    (
        ParamId::IptablesFilterDenyAction,
        ParamId::NftablesFilterDenyAction,
    ),
    (ParamId::IptablesMarkMask, ParamId::NftablesMarkMask),
    (
        ParamId::IptablesRefreshInterval,
        ParamId::NftablesRefreshInterval,
    ),
];

impl Config {
    /// NFTablesMode is `Enabled`: Calico is in nftables mode and reads the `Nftables*`
    /// variants of the verdict, mark and refresh parameters. With `Auto` (which in Calico
    /// follows kube-proxy, iptables without it) or `Disabled` it reads the `Iptables*` ones.
    pub fn nftables_mode(&self) -> bool {
        self.nftables_mode.eq_ignore_ascii_case("Enabled")
    }

    /// The verdict for traffic policy allows: `ACCEPT` or `RETURN` (IptablesFilterAllowAction,
    /// or NftablesFilterAllowAction in nftables mode).
    pub fn filter_allow_action(&self) -> &str {
        if self.nftables_mode() {
            &self.nftables_filter_allow_action
        } else {
            &self.iptables_filter_allow_action
        }
    }

    /// The verdict for traffic policy denies: `DROP` or `REJECT` (IptablesFilterDenyAction,
    /// or NftablesFilterDenyAction in nftables mode).
    pub fn filter_deny_action(&self) -> &str {
        if self.nftables_mode() {
            &self.nftables_filter_deny_action
        } else {
            &self.iptables_filter_deny_action
        }
    }

    /// The packet-mark bits margay may use (IptablesMarkMask, or NftablesMarkMask in
    /// nftables mode).
    pub fn mark_mask(&self) -> u32 {
        if self.nftables_mode() {
            self.nftables_mark_mask
        } else {
            self.iptables_mark_mask
        }
    }

    /// How often the policy table is read back to repair drift (IptablesRefreshInterval, or
    /// NftablesRefreshInterval in nftables mode).
    pub fn policy_refresh_interval(&self) -> std::time::Duration {
        if self.nftables_mode() {
            self.nftables_refresh_interval
        } else {
            self.iptables_refresh_interval
        }
    }

    /// Whether margay acts on `id` with this configuration.
    pub fn acted_on(&self, id: ParamId) -> ActedOn {
        let meta = id.meta();
        for (ipt, nft) in MODE_PAIRS {
            let (used, other) = if self.nftables_mode() {
                (*nft, *ipt)
            } else {
                (*ipt, *nft)
            };
            if id == other {
                return ActedOn::NotNow {
                    reason: format!(
                        "NFTablesMode is {}, so (as in Calico) {} is used instead",
                        self.nftables_mode,
                        used.name()
                    ),
                };
            }
        }
        if meta.supported {
            return ActedOn::Yes;
        }
        // What margay does instead, where that is not the parameter's default.
        let behaves_as = match id {
            // No status reports to the datastore: as if reporting were off.
            ParamId::ReportingIntervalSecs => "0s".to_string(),
            _ => Config::defaults().get(id).to_string(),
        };
        ActedOn::No { behaves_as }
    }
}
