//! Values that Calico accepts either as a number or as a string: ports, protocols, AS numbers,
//! DSCP. Parsing here is structural (what shape the value has); whether the value is allowed
//! is decided by validation, so that every problem of a document can be reported at once.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A port in a rule or config: a single port, an inclusive range, or a named port.
///
/// Written as a number (`80`), a string range (`"8000:8080"`) or a name (`"http"`); a string of
/// digits is a single port (`"80"` serialises back as `80`, as in Calico).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Port {
    Single(u16),
    Range(u16, u16),
    Named(String),
}

impl Port {
    pub fn is_named(&self) -> bool {
        matches!(self, Port::Named(_))
    }

    /// Parses the string form. Digits that do not fit in 16 bits are an error; anything that is
    /// neither digits nor `digits:digits` is taken as a name (validation checks the name).
    pub fn parse(s: &str) -> Result<Port, String> {
        let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if all_digits(s) {
            return s
                .parse::<u16>()
                .map(Port::Single)
                .map_err(|_| format!("port {s:?} is out of range (1-65535)"));
        }
        if let Some((lo, hi)) = s.split_once(':')
            && all_digits(lo)
            && all_digits(hi)
        {
            let lo = lo
                .parse::<u16>()
                .map_err(|_| format!("port range {s:?}: {lo} is out of range (1-65535)"))?;
            let hi = hi
                .parse::<u16>()
                .map_err(|_| format!("port range {s:?}: {hi} is out of range (1-65535)"))?;
            // "80:80" is the single port 80, as in Calico (and it prints as 80).
            return Ok(if lo == hi {
                Port::Single(lo)
            } else {
                Port::Range(lo, hi)
            });
        }
        Ok(Port::Named(s.to_string()))
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::Single(p) => write!(f, "{p}"),
            Port::Range(lo, hi) if lo == hi => write!(f, "{lo}"),
            Port::Range(lo, hi) => write!(f, "{lo}:{hi}"),
            Port::Named(n) => f.write_str(n),
        }
    }
}

impl Serialize for Port {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Port::Single(p) => s.serialize_u16(*p),
            Port::Range(lo, hi) if lo == hi => s.serialize_u16(*lo),
            other => s.collect_str(other),
        }
    }
}

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Port;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number, a range \"min:max\" or a port name")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Port, E> {
                u16::try_from(v)
                    .map(Port::Single)
                    .map_err(|_| E::custom(format!("port {v} is out of range (1-65535)")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Port, E> {
                u16::try_from(v)
                    .map(Port::Single)
                    .map_err(|_| E::custom(format!("port {v} is out of range (1-65535)")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Port, E> {
                Port::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// The protocol names Calico accepts, in their canonical spelling.
pub const PROTOCOL_NAMES: [&str; 6] = ["TCP", "UDP", "ICMP", "ICMPv6", "SCTP", "UDPLite"];

/// An IP protocol, by name (`TCP`) or number (`6`). A string of digits is a number.
///
/// Names are kept as written: Calico accepts only the exact spellings in [`PROTOCOL_NAMES`]
/// (`tcp` is invalid), and validation reports anything else.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Protocol {
    Number(u8),
    Name(String),
}

impl Protocol {
    pub fn from_name(name: &str) -> Protocol {
        match name.parse::<u8>() {
            Ok(n) => Protocol::Number(n),
            Err(_) => Protocol::Name(name.to_string()),
        }
    }

    /// The canonical spelling of a name that differs only in case (`tcp` → `TCP`).
    pub fn canonical_spelling(name: &str) -> Option<&'static str> {
        PROTOCOL_NAMES
            .iter()
            .find(|p| p.eq_ignore_ascii_case(name))
            .copied()
    }

    /// The protocol number, when it is known.
    pub fn number(&self) -> Option<u8> {
        match self {
            Protocol::Number(n) => Some(*n),
            Protocol::Name(n) => match n.as_str() {
                "TCP" => Some(6),
                "UDP" => Some(17),
                "ICMP" => Some(1),
                "ICMPv6" => Some(58),
                "SCTP" => Some(132),
                "UDPLite" => Some(136),
                _ => None,
            },
        }
    }

    pub fn is_known(&self) -> bool {
        match self {
            Protocol::Number(n) => *n != 0,
            Protocol::Name(n) => PROTOCOL_NAMES.contains(&n.as_str()),
        }
    }

    /// TCP, UDP and SCTP carry ports.
    pub fn supports_ports(&self) -> bool {
        matches!(self.number(), Some(6 | 17 | 132))
    }

    pub fn is_icmp_v4(&self) -> bool {
        self.number() == Some(1)
    }

    pub fn is_icmp_v6(&self) -> bool {
        self.number() == Some(58)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Protocol::Number(n) => write!(f, "{n}"),
            Protocol::Name(n) => f.write_str(n),
        }
    }
}

impl Serialize for Protocol {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Protocol::Number(n) => s.serialize_u8(*n),
            Protocol::Name(n) => s.serialize_str(n),
        }
    }
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Protocol;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a protocol name (TCP, UDP, ICMP, ICMPv6, SCTP, UDPLite) or number 1-255",
                )
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Protocol, E> {
                u8::try_from(v)
                    .map(Protocol::Number)
                    .map_err(|_| E::custom(format!("protocol number {v} is out of range (1-255)")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Protocol, E> {
                u8::try_from(v)
                    .map(Protocol::Number)
                    .map_err(|_| E::custom(format!("protocol number {v} is out of range (1-255)")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Protocol, E> {
                Ok(Protocol::from_name(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A BGP AS number: a plain 32-bit number, or the dotted form `high.low` (asdot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct AsNumber(pub u32);

impl AsNumber {
    /// Parses `64512` or the dotted form `1.10` (= 1 × 65536 + 10).
    pub fn parse(s: &str) -> Result<AsNumber, String> {
        if let Ok(n) = s.parse::<u32>() {
            return Ok(AsNumber(n));
        }
        let bad = || {
            format!(
                "{s:?} is not a valid AS number (expected 0-4294967295 or dotted HIGH.LOW with each part 0-65535)"
            )
        };
        let (hi, lo) = s.split_once('.').ok_or_else(bad)?;
        let hi: u16 = hi.parse().map_err(|_| bad())?;
        let lo: u16 = lo.parse().map_err(|_| bad())?;
        Ok(AsNumber((u32::from(hi) << 16) + u32::from(lo)))
    }
}

impl fmt::Display for AsNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for AsNumber {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.0)
    }
}

impl<'de> Deserialize<'de> for AsNumber {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = AsNumber;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an AS number (0-4294967295) or dotted HIGH.LOW")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<AsNumber, E> {
                u32::try_from(v)
                    .map(AsNumber)
                    .map_err(|_| E::custom(format!("AS number {v} is out of range (0-4294967295)")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<AsNumber, E> {
                u32::try_from(v)
                    .map(AsNumber)
                    .map_err(|_| E::custom(format!("AS number {v} is out of range (0-4294967295)")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<AsNumber, E> {
                // YAML reads an unquoted dotted AS number such as 1.10 as a float; the text is
                // gone by then, so ask for quotes rather than guess (1.10 and 1.1 differ).
                Err(E::custom(format!(
                    "AS number {v} looks like a dotted AS number: quote it (\"HIGH.LOW\") so its digits are kept exactly"
                )))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<AsNumber, E> {
                AsNumber::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// The DSCP names Calico accepts and their values.
pub const DSCP_NAMES: [(&str, u8); 21] = [
    ("DF", 0),
    ("EF", 46),
    ("AF11", 10),
    ("AF12", 12),
    ("AF13", 14),
    ("AF21", 18),
    ("AF22", 20),
    ("AF23", 22),
    ("AF31", 26),
    ("AF32", 28),
    ("AF33", 30),
    ("AF41", 34),
    ("AF42", 36),
    ("AF43", 38),
    ("CS0", 0),
    ("CS1", 8),
    ("CS2", 16),
    ("CS3", 24),
    ("CS4", 32),
    ("CS5", 40),
    ("CS6", 48),
];

/// A DSCP value: a number 0-63 or a name such as `EF` or `AF11`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dscp {
    Number(u8),
    Name(String),
}

impl Dscp {
    /// The numeric value, when the number is in range or the name is known.
    pub fn value(&self) -> Option<u8> {
        match self {
            Dscp::Number(n) if *n <= 63 => Some(*n),
            Dscp::Number(_) => None,
            Dscp::Name(name) => DSCP_NAMES
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()))
                .map(|(_, v)| *v),
        }
    }
}

impl Serialize for Dscp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Dscp::Number(n) => s.serialize_u8(*n),
            Dscp::Name(n) => s.serialize_str(n),
        }
    }
}

impl<'de> Deserialize<'de> for Dscp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dscp;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a DSCP number 0-63 or a DSCP name such as EF or AF11")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Dscp, E> {
                u8::try_from(v)
                    .map(Dscp::Number)
                    .map_err(|_| E::custom(format!("DSCP {v} is out of range (0-63)")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Dscp, E> {
                u8::try_from(v)
                    .map(Dscp::Number)
                    .map_err(|_| E::custom(format!("DSCP {v} is out of range (0-63)")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dscp, E> {
                Ok(match v.parse::<u8>() {
                    Ok(n) => Dscp::Number(n),
                    Err(_) => Dscp::Name(v.to_string()),
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// Serialises an optional float the way Go's encoding/json does for whole numbers (`100`, not
/// `100.0`), so policy and tier `order` round-trips unchanged.
pub(crate) fn serialize_opt_f64<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
            // Exact: whole numbers below 2^53 convert to i64 without loss.
            #[allow(clippy::cast_possible_truncation)]
            s.serialize_i64(*f as i64)
        }
        Some(f) => s.serialize_f64(*f),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_forms() {
        assert_eq!(Port::parse("80"), Ok(Port::Single(80)));
        assert_eq!(Port::parse("80:90"), Ok(Port::Range(80, 90)));
        assert_eq!(Port::parse("http"), Ok(Port::Named("http".into())));
        assert!(Port::parse("70000").is_err());
        assert!(Port::parse("1:70000").is_err());
        // Not digits:digits, so kept as a (later invalid) name.
        assert_eq!(Port::parse("a:b"), Ok(Port::Named("a:b".into())));
        let p: Port = serde_json::from_str("\"8080\"").unwrap();
        assert_eq!(serde_json::to_string(&p).unwrap(), "8080");
        let p: Port = serde_json::from_str("\"1:2\"").unwrap();
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"1:2\"");
    }

    #[test]
    fn protocol_forms() {
        assert_eq!(Protocol::from_name("tcp"), Protocol::Name("tcp".into()));
        assert!(!Protocol::from_name("tcp").is_known());
        assert_eq!(Protocol::canonical_spelling("icmpv6"), Some("ICMPv6"));
        assert_eq!(Protocol::from_name("17"), Protocol::Number(17));
        assert!(Protocol::Number(6).supports_ports());
        assert!(!Protocol::from_name("ICMP").supports_ports());
        assert!(!Protocol::from_name("bogus").is_known());
        assert!(!Protocol::Number(0).is_known());
    }

    #[test]
    fn as_number_forms() {
        assert_eq!(AsNumber::parse("64512"), Ok(AsNumber(64512)));
        assert_eq!(AsNumber::parse("1.10"), Ok(AsNumber(65536 + 10)));
        assert!(AsNumber::parse("1.70000").is_err());
        assert!(AsNumber::parse("1.2.3").is_err());
        assert!(AsNumber::parse("x").is_err());
        let a: AsNumber = serde_json::from_str("\"2.5\"").unwrap();
        assert_eq!(serde_json::to_string(&a).unwrap(), "131077");
    }

    #[test]
    fn dscp_forms() {
        assert_eq!(Dscp::Name("ef".into()).value(), Some(46));
        assert_eq!(Dscp::Number(64).value(), None);
        assert_eq!(Dscp::Name("nope".into()).value(), None);
    }
}
