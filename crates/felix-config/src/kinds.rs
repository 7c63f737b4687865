//! Parameter kinds: how each kind of parameter turns its raw string into a [`Value`].
//!
//! A kind is written as in Calico's tags, `kind(params)`: `int(0:65535)`, `oneof(DROP,ACCEPT)`,
//! `file(must-exist)`. The accepted syntax of every kind follows Calico's parser; the comments
//! say where the rules are surprising.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::Duration;

use margay_api::duration::parse_go_duration;
use margay_api::net::Cidr;
use margay_api::numorstring::Dscp;
use regex::Regex;

use crate::gofmt::{go_atoi, parse_float, parse_int, parse_uint};
use crate::value::{PortRange, ProtoPort, Protocol, RouteTableRange, ServerPort, Value};

/// Answers the questions about the host that some parameter kinds ask (Calico stats files
/// for `file(must-exist)` and searches for executables). The caller does the I/O; this crate
/// stays pure.
pub trait HostProbe {
    /// Whether the file exists and is accessible.
    fn file_exists(&self, path: &str) -> bool;
    /// The path of an executable: `name` looked up next to the running binary, then on `PATH`.
    fn find_executable(&self, name: &str) -> Option<String>;
}

/// A probe that reports every file as present and every executable as found under its own
/// name: for loading configuration without touching the host (tests, `margay felix config`
/// on another machine's inputs).
#[derive(Debug, Clone, Copy, Default)]
pub struct AssumeFilesExist;

impl HostProbe for AssumeFilesExist {
    fn file_exists(&self, _path: &str) -> bool {
        true
    }
    fn find_executable(&self, name: &str) -> Option<String> {
        Some(name.to_string())
    }
}

/// The kind of a parameter, with its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Bool,
    /// `*bool`: true, false or unset.
    OptBool,
    /// Integer; valid if inside any of the ranges (inclusive).
    Int {
        ranges: Vec<(i64, i64)>,
    },
    Int32,
    MarkBitmask,
    Float,
    Seconds {
        min: i64,
        max: i64,
    },
    Millis,
    IfaceList,
    IfaceListRegexp,
    LogRate,
    Regexp {
        nil_on_empty: bool,
    },
    IfaceParam,
    File {
        must_exist: bool,
        executable: bool,
    },
    Authority,
    /// margay: one or more comma-separated `host:port` (TyphaAddr: several Typhas).
    AuthorityList,
    Ipv4,
    Ipv6,
    EndpointList,
    PortList,
    PortRange,
    PortRangeList,
    Hostname,
    HostAddress,
    Region,
    OneOf(Vec<&'static str>),
    Str,
    CidrList,
    ServerList,
    StringSlice,
    InterfaceNameSlice,
    IfaceFilterSlice,
    RouteTableRange,
    RouteTableRanges,
    KeyValueList,
    KeyDurationList,
    Dscp,
}

/// A successfully parsed value, with a remark when the value was adjusted or is only partly
/// honoured (e.g. a negative duration taken as zero).
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub value: Value,
    pub note: Option<String>,
}

impl From<Value> for Parsed {
    fn from(value: Value) -> Parsed {
        Parsed { value, note: None }
    }
}

impl Kind {
    /// Parses a kind as written in the table, e.g. `int(0:65535)` or `oneof(a,b)`.
    pub fn from_spec(spec: &'static str) -> Result<Kind, String> {
        let (name, p): (&str, &'static str) = match spec.find('(') {
            Some(open) => {
                if !spec.ends_with(')') || spec.len() < open + 2 {
                    return Err(format!("kind {spec:?}: unbalanced parentheses"));
                }
                (&spec[..open], &spec[open + 1..spec.len() - 1])
            }
            None => (spec, ""),
        };
        let kind = match name {
            "bool" => Kind::Bool,
            "*bool" => Kind::OptBool,
            "int" => {
                let mut ranges = Vec::new();
                for r in p.split(',') {
                    let (lo, hi) = match r.split_once(':') {
                        Some((lo, hi)) => (lo, Some(hi)),
                        None => (r, None),
                    };
                    let lo = optional_int(lo, i64::MIN, spec)?;
                    let hi = match hi {
                        Some(hi) => optional_int(hi, i64::MAX, spec)?,
                        None => i64::MAX,
                    };
                    ranges.push((lo, hi));
                }
                Kind::Int { ranges }
            }
            "int32" => Kind::Int32,
            "mark-bitmask" => Kind::MarkBitmask,
            "float" => Kind::Float,
            "seconds" => {
                if p.is_empty() {
                    Kind::Seconds {
                        min: i64::MIN,
                        max: i64::MAX,
                    }
                } else {
                    let (lo, hi) = p
                        .split_once(':')
                        .ok_or_else(|| format!("kind {spec:?}: expected seconds(min:max)"))?;
                    let parse = |s: &str| {
                        s.parse::<i64>()
                            .map_err(|_| format!("kind {spec:?}: bad bound {s:?}"))
                    };
                    Kind::Seconds {
                        min: parse(lo)?,
                        max: parse(hi)?,
                    }
                }
            }
            "millis" => Kind::Millis,
            "iface-list" => Kind::IfaceList,
            "iface-list-regexp" => Kind::IfaceListRegexp,
            "log-rate" => Kind::LogRate,
            "regexp" => Kind::Regexp {
                nil_on_empty: p.split(',').any(|f| f == "nil-on-empty"),
            },
            "iface-param" => Kind::IfaceParam,
            "file" => Kind::File {
                must_exist: p.contains("must-exist"),
                executable: p.contains("executable"),
            },
            "authority" => Kind::Authority,
            "authority-list" => Kind::AuthorityList,
            "ipv4" => Kind::Ipv4,
            "ipv6" => Kind::Ipv6,
            "endpoint-list" => Kind::EndpointList,
            "port-list" => Kind::PortList,
            "portrange" => Kind::PortRange,
            "portrange-list" => Kind::PortRangeList,
            "hostname" => Kind::Hostname,
            "host-address" => Kind::HostAddress,
            "region" => Kind::Region,
            "oneof" => Kind::OneOf(p.split(',').collect()),
            "string" => Kind::Str,
            "cidr-list" => Kind::CidrList,
            "server-list" => Kind::ServerList,
            "string-slice" => Kind::StringSlice,
            "interface-name-slice" => Kind::InterfaceNameSlice,
            "iface-filter-slice" => Kind::IfaceFilterSlice,
            "route-table-range" => Kind::RouteTableRange,
            "route-table-ranges" => Kind::RouteTableRanges,
            "keyvaluelist" => Kind::KeyValueList,
            "keydurationlist" => Kind::KeyDurationList,
            "dscp" => Kind::Dscp,
            other => return Err(format!("unknown parameter kind {other:?}")),
        };
        Ok(kind)
    }

    /// The value `none` stands for: the zero value of the parameter's type, which often
    /// differs from the default (it usually means "off").
    pub fn zero(&self) -> Value {
        match self {
            Kind::Bool => Value::Bool(false),
            Kind::OptBool => Value::OptBool(None),
            Kind::Int { .. } | Kind::Int32 => Value::Int(0),
            Kind::MarkBitmask => Value::Mark(0),
            Kind::Float => Value::Float(0.0),
            Kind::Seconds { .. } | Kind::Millis => Value::Duration(Duration::ZERO),
            Kind::IfaceList
            | Kind::LogRate
            | Kind::IfaceParam
            | Kind::File { .. }
            | Kind::Authority
            | Kind::AuthorityList
            | Kind::Hostname
            | Kind::HostAddress
            | Kind::Region
            | Kind::OneOf(_)
            | Kind::Str => Value::Str(String::new()),
            Kind::IfaceListRegexp
            | Kind::EndpointList
            | Kind::StringSlice
            | Kind::InterfaceNameSlice
            | Kind::IfaceFilterSlice => Value::StrList(Vec::new()),
            Kind::Regexp { .. } => Value::Regex(None),
            Kind::Ipv4 | Kind::Ipv6 => Value::Ip(None),
            Kind::PortList => Value::ProtoPorts(Vec::new()),
            Kind::PortRange => Value::PortRange(None),
            Kind::PortRangeList => Value::PortRanges(Vec::new()),
            Kind::CidrList => Value::Cidrs(Vec::new()),
            Kind::ServerList => Value::Servers(Vec::new()),
            Kind::RouteTableRange => Value::RouteTableRange(None),
            Kind::RouteTableRanges => Value::RouteTableRanges(Vec::new()),
            Kind::KeyValueList => Value::KeyValues(BTreeMap::new()),
            Kind::KeyDurationList => Value::KeyDurations(BTreeMap::new()),
            Kind::Dscp => Value::Dscp(0),
        }
    }

    /// Whether the v3 → v1 conversion writes this kind's durations in milliseconds.
    pub fn is_millis(&self) -> bool {
        matches!(self, Kind::Millis)
    }

    /// Whether values of this kind are durations.
    pub fn is_duration(&self) -> bool {
        matches!(self, Kind::Seconds { .. } | Kind::Millis)
    }

    /// A short description of the accepted syntax.
    pub fn schema(&self) -> String {
        match self {
            Kind::Bool | Kind::OptBool => {
                "boolean: true, 1, yes, y, t / false, 0, no, n, f (any case)".into()
            }
            Kind::Int { ranges } => {
                let shown: Vec<String> = ranges
                    .iter()
                    .filter(|r| **r != (i64::MIN, i64::MAX))
                    .map(|(lo, hi)| match (*lo, *hi) {
                        (lo, i64::MAX) => format!(">= {lo}"),
                        (i64::MIN, hi) => format!("<= {hi}"),
                        (lo, hi) => format!("{lo}..={hi}"),
                    })
                    .collect();
                if shown.is_empty() {
                    "integer".into()
                } else {
                    format!("integer ({})", shown.join(" or "))
                }
            }
            Kind::Int32 => "32-bit integer".into(),
            Kind::MarkBitmask => "32-bit mask with at least 2 bits set, e.g. 0xffff0000".into(),
            Kind::Float => "number".into(),
            Kind::Seconds { .. } => "seconds (may have a fraction)".into(),
            Kind::Millis => "milliseconds (may have a fraction)".into(),
            Kind::IfaceList => "comma-separated interface name prefixes".into(),
            Kind::IfaceListRegexp => {
                "comma-separated interface names or /regular expressions/".into()
            }
            Kind::LogRate => "N/second, N/minute, N/hour or N/day (N in 1-9999)".into(),
            Kind::Regexp { .. } => "regular expression".into(),
            Kind::IfaceParam => "interface name (+ is a wildcard)".into(),
            Kind::File {
                executable: true, ..
            } => "executable name or path".into(),
            Kind::File { .. } => "file path".into(),
            Kind::Authority => "host:port".into(),
            Kind::AuthorityList => "host:port, or several separated by commas".into(),
            Kind::Ipv4 => "IPv4 address".into(),
            Kind::Ipv6 => "IPv6 address".into(),
            Kind::EndpointList => "comma-separated http(s)://host:port URLs".into(),
            Kind::PortList => {
                "comma-separated [tcp|udp:][cidr:]port ([v6-cidr] in brackets)".into()
            }
            Kind::PortRange => "port or range n:m".into(),
            Kind::PortRangeList => "comma-separated ports or ranges n:m".into(),
            Kind::Hostname => "host name".into(),
            Kind::HostAddress => "host name or IP address".into(),
            Kind::Region => "DNS label of at most 46 characters".into(),
            Kind::OneOf(options) => format!("one of {}", options.join(", ")),
            Kind::Str => "string".into(),
            Kind::CidrList => "comma-separated CIDRs or IP addresses".into(),
            Kind::ServerList => "comma-separated IP[:port] (port 53 by default)".into(),
            Kind::StringSlice => "comma-separated strings".into(),
            Kind::InterfaceNameSlice => "comma-separated interface names".into(),
            Kind::IfaceFilterSlice => "comma-separated interface names (+ is a wildcard)".into(),
            Kind::RouteTableRange => "range n-m within 1-250".into(),
            Kind::RouteTableRanges => {
                "comma-separated ranges n-m (n >= 1, at most 65535 tables)".into()
            }
            Kind::KeyValueList => "comma-separated key=value pairs".into(),
            Kind::KeyDurationList => "comma-separated key=duration pairs (e.g. a=1m30s)".into(),
            Kind::Dscp => "DSCP value 0-63 or name (EF, AF11, CS1, ...)".into(),
        }
    }

    /// Parses a raw value. `raw` is never empty here (empty raw values are dropped before
    /// parsing, and `none` is handled by the caller).
    pub fn parse(&self, raw: &str, probe: &dyn HostProbe) -> Result<Parsed, String> {
        let v = match self {
            Kind::Bool => Value::Bool(parse_bool(raw)?),
            Kind::OptBool => Value::OptBool(Some(parse_bool(raw)?)),
            Kind::Int { ranges } => Value::Int(parse_ranged_int(raw, ranges)?),
            Kind::Int32 => Value::Int(parse_int(raw, 32).map_err(|_| "invalid 32-bit int")?),
            Kind::MarkBitmask => {
                let m = parse_uint(raw, 32).map_err(|_| "invalid mark: should be 32-bit int")?;
                let m = u32::try_from(m).map_err(|_| "invalid mark: should be 32-bit int")?;
                if m.count_ones() < 2 {
                    return Err("invalid mark: needs to have 2 bits set".into());
                }
                Value::Mark(m)
            }
            Kind::Float => Value::Float(parse_float(raw).map_err(|_| "invalid float")?),
            Kind::Seconds { min, max } => {
                let secs = parse_float(raw).map_err(|_| "invalid number of seconds")?;
                let whole = secs.trunc();
                if whole < *min as f64 {
                    return Err(format!("value must be at least {min}"));
                }
                if whole > *max as f64 {
                    return Err(format!("value must be at most {max}"));
                }
                return duration_from_float(secs * 1e9);
            }
            Kind::Millis => {
                let ms = parse_float(raw).map_err(|_| "invalid number of milliseconds")?;
                return duration_from_float(ms * 1e6);
            }
            Kind::IfaceList => {
                if raw.split(',').all(|p| iface_name(p, false)) {
                    Value::Str(raw.to_string())
                } else {
                    return Err("invalid Linux interface name".into());
                }
            }
            Kind::IfaceListRegexp => Value::StrList(parse_iface_regexps(raw)?),
            Kind::LogRate => {
                if log_rate_ok(raw) {
                    Value::Str(raw.to_string())
                } else {
                    return Err("invalid log rate limit".into());
                }
            }
            Kind::Regexp { nil_on_empty } => {
                if raw.is_empty() && *nil_on_empty {
                    Value::Regex(None)
                } else {
                    Regex::new(raw).map_err(|_| "invalid regexp")?;
                    Value::Regex(Some(raw.to_string()))
                }
            }
            Kind::IfaceParam => {
                if iface_param(raw, 15) {
                    Value::Str(raw.to_string())
                } else {
                    return Err("invalid Linux interface parameter".into());
                }
            }
            Kind::File {
                must_exist,
                executable,
            } => {
                if *executable {
                    match probe.find_executable(raw) {
                        Some(path) => Value::Str(path),
                        None if *must_exist => return Err("missing file".into()),
                        None => Value::Str(String::new()),
                    }
                } else {
                    if *must_exist && !raw.is_empty() && !probe.file_exists(raw) {
                        return Err("failed to access file".into());
                    }
                    Value::Str(raw.to_string())
                }
            }
            Kind::AuthorityList => {
                if raw.split(',').all(|a| authority_ok(a.trim())) {
                    Value::Str(raw.to_string())
                } else {
                    return Err("invalid URL authority (expected host:port[,host:port...])".into());
                }
            }
            Kind::Authority => {
                if authority_ok(raw) {
                    Value::Str(raw.to_string())
                } else {
                    return Err("invalid URL authority".into());
                }
            }
            Kind::Ipv4 => match parse_ip(raw) {
                Some(IpAddr::V4(a)) => Value::Ip(Some(IpAddr::V4(a))),
                _ => return Err("not an IPv4 address".into()),
            },
            Kind::Ipv6 => match parse_ip(raw) {
                Some(IpAddr::V6(a)) => Value::Ip(Some(IpAddr::V6(a))),
                _ => return Err("not an IPv6 address".into()),
            },
            Kind::EndpointList => Value::StrList(parse_endpoints(raw)?),
            Kind::PortList => Value::ProtoPorts(parse_port_list(raw)?),
            Kind::PortRange => Value::PortRange(Some(
                parse_port_range(raw)
                    .map_err(|why| format!("{raw} is not a valid port range: {why}"))?,
            )),
            Kind::PortRangeList => {
                let mut out = Vec::new();
                // No trimming: Calico rejects "1, 2" (the second item is " 2").
                for item in raw.split(',') {
                    out.push(
                        parse_port_range(item)
                            .map_err(|why| format!("{item} is not a valid port range: {why}"))?,
                    );
                }
                Value::PortRanges(out)
            }
            Kind::Hostname => {
                if !raw.is_empty()
                    && raw
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
                {
                    Value::Str(raw.to_string())
                } else {
                    return Err("invalid hostname".into());
                }
            }
            Kind::HostAddress => {
                if iface_param(raw, 64) {
                    Value::Str(raw.to_string())
                } else {
                    return Err("invalid host address".into());
                }
            }
            Kind::Region => {
                if raw.len() > 46 {
                    return Err("the value of OpenstackRegion must be 46 chars or fewer".into());
                }
                if !dns1123_label(raw) {
                    return Err("the value of OpenstackRegion must be a valid DNS label".into());
                }
                Value::Str(raw.to_string())
            }
            Kind::OneOf(options) => {
                let lower = raw.to_lowercase();
                match options.iter().find(|o| o.to_lowercase() == lower) {
                    Some(canonical) => Value::Str((*canonical).to_string()),
                    None => return Err("unknown option".into()),
                }
            }
            Kind::Str => {
                // Calico validates strings with `^.*$`, and `.` does not match a newline.
                if raw.contains('\n') {
                    return Err("invalid string".into());
                }
                Value::Str(raw.to_string())
            }
            Kind::CidrList => {
                let mut out = Vec::new();
                for item in raw.split(',') {
                    let item = item.trim_matches(' ');
                    if item.is_empty() {
                        continue;
                    }
                    let cidr = Cidr::parse_cidr_or_ip(item)
                        .map_err(|_| format!("invalid CIDR or IP {item}"))?;
                    out.push(cidr.network());
                }
                Value::Cidrs(out)
            }
            Kind::ServerList => Value::Servers(parse_servers(raw)?),
            Kind::StringSlice => Value::StrList(parse_slice(raw, |_| true)?),
            Kind::InterfaceNameSlice => Value::StrList(parse_slice(raw, |s| iface_name(s, true))?),
            Kind::IfaceFilterSlice => Value::StrList(parse_slice(raw, |s| iface_param(s, 15))?),
            Kind::RouteTableRange => Value::RouteTableRange(Some(parse_route_table_range(raw)?)),
            Kind::RouteTableRanges => return parse_route_table_ranges(raw),
            Kind::KeyValueList => Value::KeyValues(parse_key_values(raw)?),
            Kind::KeyDurationList => {
                let mut out = BTreeMap::new();
                let mut note = None;
                for (k, v) in parse_key_values(raw)? {
                    let nanos = parse_go_duration(v.trim())?;
                    if nanos < 0 {
                        note = Some(format!("negative duration for {k} taken as 0s"));
                    }
                    out.insert(k, Duration::from_nanos(nanos.max(0).unsigned_abs()));
                }
                return Ok(Parsed {
                    value: Value::KeyDurations(out),
                    note,
                });
            }
            Kind::Dscp => Value::Dscp(parse_dscp(raw)?),
        };
        Ok(v.into())
    }
}

fn optional_int(s: &str, dflt: i64, spec: &str) -> Result<i64, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(dflt);
    }
    s.parse::<i64>()
        .map_err(|_| format!("kind {spec:?}: bad bound {s:?}"))
}

fn parse_bool(raw: &str) -> Result<bool, String> {
    match raw.to_lowercase().as_str() {
        "true" | "1" | "yes" | "y" | "t" => Ok(true),
        "false" | "0" | "no" | "n" | "f" => Ok(false),
        _ => Err("invalid boolean".into()),
    }
}

fn parse_ranged_int(raw: &str, ranges: &[(i64, i64)]) -> Result<i64, String> {
    let v = parse_int(raw, 64).map_err(|_| "invalid int".to_string())?;
    if let [(lo, hi)] = ranges {
        if v < *lo {
            return Err(format!("value must be at least {lo}"));
        }
        if v > *hi {
            return Err(format!("value must be at most {hi}"));
        }
        return Ok(v);
    }
    if ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&v)) {
        Ok(v)
    } else {
        let shown: Vec<String> = ranges
            .iter()
            .map(|(lo, hi)| {
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}-{hi}")
                }
            })
            .collect();
        Err(format!("value must be one of {}", shown.join(" ")))
    }
}

/// Nanoseconds (as Go computes them, truncating the float) to a duration. Negative values
/// are taken as zero, with a note: margay's durations are unsigned (Calico keeps the
/// negative duration).
fn duration_from_float(nanos: f64) -> Result<Parsed, String> {
    let nanos = nanos.trunc();
    if nanos.abs() >= 9.223_372_036_854_775e18 {
        return Err("duration out of range".into());
    }
    if nanos < 0.0 {
        return Ok(Parsed {
            value: Value::Duration(Duration::ZERO),
            note: Some("negative duration taken as 0s".into()),
        });
    }
    // In range and non-negative: the cast is exact for the integral value.
    let n = nanos as u64;
    Ok(Value::Duration(Duration::from_nanos(n)).into())
}

/// `[a-zA-Z0-9_-]{1,15}`, optionally also allowing `.` (interface-name-slice).
fn iface_name(s: &str, allow_dot: bool) -> bool {
    (1..=15).contains(&s.len())
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (allow_dot && b == b'.')
        })
}

/// `[a-zA-Z0-9:._+-]{1,max}`.
fn iface_param(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":._+-".contains(&b))
}

/// Go's `\s`: ASCII space, tab, newline, form feed, carriage return (not vertical tab).
fn go_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0c' | '\r')
}

fn parse_iface_regexps(raw: &str) -> Result<Vec<String>, String> {
    const MSG: &str = "list contains invalid Linux interface name or regex pattern";
    let mut out = Vec::new();
    for t in raw.split(',') {
        let is_regex =
            t.len() >= 3 && t.starts_with('/') && t.ends_with('/') && !t.chars().any(go_space);
        if is_regex {
            let inner = &t[1..t.len() - 1];
            Regex::new(inner).map_err(|_| MSG.to_string())?;
            out.push(inner.to_string());
        } else if iface_name(t, false) {
            out.push(format!("^{t}$"));
        } else {
            return Err(MSG.into());
        }
    }
    Ok(out)
}

fn log_rate_ok(raw: &str) -> bool {
    if raw.is_empty() {
        return true;
    }
    let Some((n, unit)) = raw.split_once('/') else {
        return false;
    };
    let b = n.as_bytes();
    (1..=4).contains(&b.len())
        && b[0] != b'0'
        && b.iter().all(u8::is_ascii_digit)
        && matches!(unit, "second" | "minute" | "hour" | "day")
}

/// `^[^:/]+:\d+$`.
fn authority_ok(raw: &str) -> bool {
    let Some((host, port)) = raw.split_once(':') else {
        return false;
    };
    !host.is_empty()
        && !host.contains('/')
        && !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
}

/// An IP address as Go's `net.ParseIP` reads it: an IPv4-mapped IPv6 address is IPv4.
pub(crate) fn parse_ip(raw: &str) -> Option<IpAddr> {
    match raw.parse::<IpAddr>().ok()? {
        IpAddr::V6(a) => Some(match a.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(a),
        }),
        v4 => Some(v4),
    }
}

fn dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && alnum(&b[0])
        && alnum(&b[b.len() - 1])
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// etcd endpoints: each `scheme://host[:port][/]`; the result always ends in `/`.
fn parse_endpoints(raw: &str) -> Result<Vec<String>, String> {
    const UNSUPPORTED: &str =
        "endpoint contained unsupported URL part; expected http(s)://hostname:port only.";
    let mut out = Vec::new();
    for ep in raw.split(',') {
        let ep = ep.trim_matches(' ');
        if ep.is_empty() {
            continue;
        }
        let Some((scheme, rest)) = ep.split_once("://") else {
            // Without "//" Go's URL parser sees an opaque part or a path, neither allowed.
            return Err(format!("{ep} is not a valid URL: {UNSUPPORTED}"));
        };
        let scheme_ok = scheme
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        if !scheme_ok {
            return Err(format!("{ep} is not a valid URL"));
        }
        let (host, path) = match rest.find(['/', '?', '#']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if host.contains('@') {
            return Err(UNSUPPORTED.into());
        }
        if !host_port_ok(host) {
            return Err(format!("{ep} is not a valid URL"));
        }
        if !(path.is_empty() || path == "/") {
            return Err(UNSUPPORTED.into());
        }
        out.push(format!("{}://{host}/", scheme.to_ascii_lowercase()));
    }
    Ok(out)
}

/// The host[:port] part of a URL as Go's parser accepts it: a bracketed IPv6 literal or a
/// name, and a numeric (possibly empty) port.
fn host_port_ok(host: &str) -> bool {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let Some(close) = rest.find(']') else {
            return false;
        };
        if rest[..close].parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match &rest[close + 1..] {
            "" => return true,
            p => match p.strip_prefix(':') {
                Some(port) => ("x", port),
                None => return false,
            },
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, port),
            None => (host, ""),
        }
    };
    !name.contains(['[', ']', ' ', ':']) && port.bytes().all(|b| b.is_ascii_digit())
}

fn parse_port_list(raw: &str) -> Result<Vec<ProtoPort>, String> {
    let mut out = Vec::new();
    for item in raw.split(',') {
        let mut item = item.trim_matches(' ').to_string();
        if item.is_empty() {
            continue;
        }
        let mut net_str = String::new();
        if item.contains('[') && item.contains(']') {
            let start = item.find('[').unwrap_or(0);
            let Some(end) = item.find("]:").filter(|e| *e > start) else {
                return Err(
                    "ports should be <protocol>:<net>:<number> or <protocol>:<number> or <number>"
                        .into(),
                );
            };
            net_str = item[start + 1..end].to_string();
            item = format!("{}{}", &item[..start], &item[end + 2..]);
        }
        let parts: Vec<&str> = item.split(':').collect();
        let (proto, port) = match parts.as_slice() {
            [port] => ("tcp".to_string(), *port),
            [proto, port] => (proto.to_lowercase(), *port),
            [proto, net, port] => {
                net_str = (*net).to_string();
                (proto.to_lowercase(), *port)
            }
            _ => {
                return Err(
                    "ports should be <protocol>:<net>:<number> or <protocol>:<number> or <number>"
                        .into(),
                );
            }
        };
        let protocol = match proto.as_str() {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            other => return Err(format!("unknown protocol: {other}")),
        };
        let port = go_atoi(port).ok_or_else(|| "ports should be integers".to_string())?;
        let port = u16::try_from(port).map_err(|_| "ports must be in range 0-65535")?;
        let net = if net_str.is_empty() {
            None
        } else {
            Some(
                Cidr::parse_cidr_or_ip(&net_str)
                    .map_err(|_| format!("invalid CIDR or IP {net_str}"))?
                    .network(),
            )
        };
        out.push(ProtoPort {
            protocol,
            port,
            net,
        });
    }
    Ok(out)
}

/// A port or `min:max` range as Calico's `PortFromString` reads it; a port name is an error
/// for configuration parameters.
fn parse_port_range(s: &str) -> Result<PortRange, String> {
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if digits(s) {
        let p = s
            .parse::<u16>()
            .map_err(|_| "invalid port format".to_string())?;
        return Ok(PortRange { min: p, max: p });
    }
    if let Some((lo, hi)) = s.split_once(':')
        && digits(lo)
        && digits(hi)
    {
        let lo = lo
            .parse::<u16>()
            .map_err(|_| "invalid minimum port".to_string())?;
        let hi = hi
            .parse::<u16>()
            .map_err(|_| "invalid maximum port".to_string())?;
        if lo > hi {
            return Err("minimum port number is greater than maximum port number".into());
        }
        return Ok(PortRange { min: lo, max: hi });
    }
    Err("port names are not allowed here".into())
}

fn parse_slice(raw: &str, ok: impl Fn(&str) -> bool) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in raw.split(',') {
        let item = item.trim_matches(' ');
        if item.is_empty() {
            continue;
        }
        if !ok(item) {
            return Err(format!("invalid entry {item:?}"));
        }
        out.push(item.to_string());
    }
    Ok(out)
}

/// Servers `ip`, `ip:port`, `[ipv6]:port`; `k8s-service:` entries need a Kubernetes lookup,
/// which is not this crate's business: they are skipped, as Calico skips entries whose
/// lookup fails.
fn parse_servers(raw: &str) -> Result<Vec<ServerPort>, String> {
    let mut out = Vec::new();
    for item in raw.split(',') {
        let mut val = item.trim();
        if val.is_empty() || val.starts_with("k8s-service:") {
            continue;
        }
        let mut port_str = "";
        if let Some(i) = val.find("]:") {
            port_str = &val[i + 2..];
            val = &val[1.min(i)..i];
        } else if val.matches(':').count() == 1
            && let Some((ip, port)) = val.split_once(':')
        {
            port_str = port;
            val = ip;
        }
        if val.parse::<IpAddr>().is_err() {
            return Err(format!("invalid server IP '{val}'"));
        }
        let port = if port_str.is_empty() {
            53
        } else {
            let p = go_atoi(port_str).ok_or_else(|| format!("invalid port '{port_str}'"))?;
            u16::try_from(p)
                .map_err(|_| format!("invalid port {p}: should be between 0 and 65535"))?
        };
        out.push(ServerPort {
            ip: val.to_string(),
            port,
        });
    }
    Ok(out)
}

/// Go's `strconv.Atoi` for the digit runs a regex found: too long a run is an error.
fn atoi_digits(s: &str) -> Option<i64> {
    go_atoi(s)
}

fn parse_route_table_range(raw: &str) -> Result<RouteTableRange, String> {
    const MSG: &str = "must be a range of route table indices within 1-250";
    let (lo, hi) = raw.split_once('-').ok_or(MSG)?;
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(lo) || !digits(hi) {
        return Err(MSG.into());
    }
    let lo = atoi_digits(lo).ok_or(MSG)?;
    let hi = atoi_digits(hi).ok_or(MSG)?;
    if lo >= 1 && hi >= lo && hi <= 250 {
        // Both are within 1..=250 here.
        Ok(RouteTableRange {
            min: u32::try_from(lo).map_err(|_| MSG)?,
            max: u32::try_from(hi).map_err(|_| MSG)?,
        })
    } else {
        Err(MSG.into())
    }
}

fn range_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new("([0-9]+)-([0-9]+)").unwrap_or_else(|_| unreachable!()))
}

fn key_value_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new("[\t\n\x0c\r ]*([0-9A-Za-z_]+)=(.*)").unwrap_or_else(|_| unreachable!())
    })
}

/// Route table ranges: every `n-m` found anywhere in the text (Calico searches, it does not
/// anchor). At most 65535 tables in total; tables 253-255 are reserved by Linux and skipped.
fn parse_route_table_ranges(raw: &str) -> Result<Parsed, String> {
    let mut out = Vec::new();
    let mut total: u64 = 0;
    let mut reserved = false;
    for caps in range_regex().captures_iter(raw) {
        let lo = atoi_digits(&caps[1])
            .filter(|v| *v > 0)
            .ok_or("min value is not a valid number")?;
        let hi = atoi_digits(&caps[2]).ok_or("max value is not a valid number")?;
        if lo > hi {
            return Err("min value is greater than max value".into());
        }
        if hi > i64::from(u32::MAX) {
            return Err("max value is too high".into());
        }
        total += (hi - lo + 1).unsigned_abs();
        if total > 0xffff {
            return Err("targets too many tables".into());
        }
        if lo <= 255 && hi >= 253 {
            reserved = true;
        }
        out.push(RouteTableRange {
            min: u32::try_from(lo).map_err(|_| "max value is too high")?,
            max: u32::try_from(hi).map_err(|_| "max value is too high")?,
        });
    }
    if out.is_empty() {
        return Err("must be a list of route-table ranges".into());
    }
    Ok(Parsed {
        value: Value::RouteTableRanges(out),
        note: reserved.then(|| {
            "the ranges include the reserved Linux tables 253-255, which are not used".to_string()
        }),
    })
}

/// `key=value` pairs separated by commas; empty items are skipped, keys are word characters.
/// Like Calico, the pattern is searched, not anchored: in `a-b=c` the key is `b`.
fn parse_key_values(raw: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    if raw.trim().is_empty() {
        return Ok(out);
    }
    let mut invalid = Vec::new();
    for item in raw.split(',') {
        if item.is_empty() {
            continue;
        }
        match key_value_regex().captures(item) {
            Some(c) => {
                out.insert(c[1].to_string(), c[2].to_string());
            }
            None => invalid.push(item.to_string()),
        }
    }
    if invalid.is_empty() {
        Ok(out)
    } else {
        Err(format!("invalid items {invalid:?}"))
    }
}

fn parse_dscp(raw: &str) -> Result<u8, String> {
    if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        return match raw.parse::<u8>() {
            Ok(n) if n <= 63 => Ok(n),
            _ => Err("DSCP must be between 0 and 63".into()),
        };
    }
    Dscp::Name(raw.to_string())
        .value()
        .ok_or_else(|| format!("{raw} is not a valid DSCP value"))
}
