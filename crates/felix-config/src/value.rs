//! Parsed parameter values: the [`Value`] every kind parses to, the small value types of the
//! typed [`crate::Config`] fields, and the conversions between the two.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use margay_api::net::Cidr;

use crate::gofmt::format_go_duration;

/// One failsafe entry: `[protocol:][net:]port` (protocol defaults to `tcp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProtoPort {
    /// `tcp` or `udp`, lower case.
    pub protocol: Protocol,
    pub port: u16,
    /// The network the entry is restricted to (masked), if any.
    pub net: Option<Cidr>,
}

/// The protocols a failsafe entry may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

impl fmt::Display for ProtoPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.net {
            Some(net) if !net.is_ipv4() => {
                write!(f, "{}:[{}]:{}", self.protocol.as_str(), net, self.port)
            }
            Some(net) => write!(f, "{}:{}:{}", self.protocol.as_str(), net, self.port),
            None => write!(f, "{}:{}", self.protocol.as_str(), self.port),
        }
    }
}

/// An inclusive port range; `min == max` is a single port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    pub min: u16,
    pub max: u16,
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}:{}", self.min, self.max)
        }
    }
}

/// An inclusive range of Linux routing table indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteTableRange {
    pub min: u32,
    pub max: u32,
}

impl fmt::Display for RouteTableRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.min, self.max)
    }
}

/// A server address of a `server-list` parameter (port 53 unless given).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerPort {
    pub ip: String,
    pub port: u16,
}

impl fmt::Display for ServerPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ip.contains(':') {
            write!(f, "[{}]:{}", self.ip, self.port)
        } else {
            write!(f, "{}:{}", self.ip, self.port)
        }
    }
}

/// A parsed value of any parameter kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Bool(bool),
    OptBool(Option<bool>),
    Int(i64),
    /// A 32-bit mark mask.
    Mark(u32),
    Float(f64),
    Duration(Duration),
    Str(String),
    /// A regular expression; `None` when unset.
    Regex(Option<String>),
    StrList(Vec<String>),
    Ip(Option<IpAddr>),
    Cidrs(Vec<Cidr>),
    ProtoPorts(Vec<ProtoPort>),
    PortRange(Option<PortRange>),
    PortRanges(Vec<PortRange>),
    RouteTableRange(Option<RouteTableRange>),
    RouteTableRanges(Vec<RouteTableRange>),
    KeyValues(BTreeMap<String, String>),
    KeyDurations(BTreeMap<String, Duration>),
    Dscp(u8),
    Servers(Vec<ServerPort>),
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

const UNSET: &str = "<unset>";

impl fmt::Display for Value {
    /// The value in the form `margay felix config` prints: lists comma-separated, durations in
    /// Go's form (`1m30s`), masks in hex, and `<unset>` for optional values that are not set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Bool(b) => write!(f, "{b}"),
            Value::OptBool(Some(b)) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Mark(m) => write!(f, "{m:#010x}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Duration(d) => f.write_str(&format_duration(*d)),
            Value::Str(s) | Value::Regex(Some(s)) => f.write_str(s),
            Value::StrList(l) => f.write_str(&l.join(",")),
            Value::Ip(Some(ip)) => write!(f, "{ip}"),
            Value::Cidrs(l) => f.write_str(&join(l)),
            Value::ProtoPorts(l) => f.write_str(&join(l)),
            Value::PortRange(Some(r)) => write!(f, "{r}"),
            Value::PortRanges(l) => f.write_str(&join(l)),
            Value::RouteTableRange(Some(r)) => write!(f, "{r}"),
            Value::RouteTableRanges(l) => f.write_str(&join(l)),
            Value::KeyValues(m) => {
                let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                f.write_str(&parts.join(","))
            }
            Value::KeyDurations(m) => {
                let parts: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{k}={}", format_duration(*v)))
                    .collect();
                f.write_str(&parts.join(","))
            }
            Value::Dscp(d) => write!(f, "{d}"),
            Value::Servers(l) => f.write_str(&join(l)),
            Value::OptBool(None)
            | Value::Regex(None)
            | Value::Ip(None)
            | Value::PortRange(None)
            | Value::RouteTableRange(None) => f.write_str(UNSET),
        }
    }
}

/// A std duration in Go's `Duration.String` form.
pub fn format_duration(d: Duration) -> String {
    format_go_duration(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A Rust type that holds one parameter's value in [`crate::Config`].
pub trait ParamType: Sized {
    /// The field value for a parsed value, or `None` if the value is of another shape.
    fn from_value(v: Value) -> Option<Self>;
    /// The field as a [`Value`].
    fn to_value(&self) -> Value;
}

macro_rules! param_type {
    ($ty:ty, $variant:ident) => {
        impl ParamType for $ty {
            fn from_value(v: Value) -> Option<Self> {
                match v {
                    Value::$variant(x) => Some(x),
                    _ => None,
                }
            }
            fn to_value(&self) -> Value {
                Value::$variant(self.clone())
            }
        }
    };
}

param_type!(bool, Bool);
param_type!(Option<bool>, OptBool);
param_type!(i64, Int);
param_type!(u32, Mark);
param_type!(f64, Float);
param_type!(Duration, Duration);
param_type!(String, Str);
param_type!(Option<String>, Regex);
param_type!(Vec<String>, StrList);
param_type!(Option<IpAddr>, Ip);
param_type!(Vec<Cidr>, Cidrs);
param_type!(Vec<ProtoPort>, ProtoPorts);
param_type!(Option<PortRange>, PortRange);
param_type!(Vec<PortRange>, PortRanges);
param_type!(Option<RouteTableRange>, RouteTableRange);
param_type!(Vec<RouteTableRange>, RouteTableRanges);
param_type!(BTreeMap<String, String>, KeyValues);
param_type!(BTreeMap<String, Duration>, KeyDurations);
param_type!(u8, Dscp);
param_type!(Vec<ServerPort>, Servers);

/// Ports are integers restricted to 0-65535 by their kind.
impl ParamType for u16 {
    fn from_value(v: Value) -> Option<Self> {
        match v {
            Value::Int(i) => u16::try_from(i).ok(),
            _ => None,
        }
    }
    fn to_value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}
