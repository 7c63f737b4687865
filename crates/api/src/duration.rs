//! Durations written the way Kubernetes and Calico write them (Go's `time.ParseDuration`
//! syntax: `90s`, `1m30s`, `1.5h`, `300ms`, `0`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration as written in a resource. The text is kept exactly (so `90s` stays `90s` on a
/// round trip); [`Duration::nanos`] parses it. Validation rejects text that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Duration(String);

impl Duration {
    pub fn new(text: impl Into<String>) -> Self {
        Duration(text.into())
    }

    pub fn from_std(d: std::time::Duration) -> Self {
        let secs = d.as_secs();
        let nanos = d.subsec_nanos();
        if nanos == 0 {
            Duration(format!("{secs}s"))
        } else if nanos.is_multiple_of(1_000_000) {
            Duration(format!(
                "{}ms",
                u128::from(secs) * 1000 + u128::from(nanos / 1_000_000)
            ))
        } else {
            Duration(format!("{}ns", d.as_nanos()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The signed length in nanoseconds, or why the text is not a duration.
    pub fn nanos(&self) -> Result<i64, String> {
        parse_go_duration(&self.0)
    }

    /// The length as a std duration; negative durations are an error.
    pub fn to_std(&self) -> Result<std::time::Duration, String> {
        let n = self.nanos()?;
        u64::try_from(n)
            .map(std::time::Duration::from_nanos)
            .map_err(|_| format!("duration {:?} is negative", self.0))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Duration)
    }
}

const UNITS: [(&str, f64); 8] = [
    ("ns", 1.0),
    ("us", 1e3),
    ("µs", 1e3),
    ("μs", 1e3),
    ("ms", 1e6),
    ("s", 1e9),
    ("m", 60e9),
    ("h", 3600e9),
];

/// Parses Go duration syntax: an optional sign, then one or more `<number><unit>` pairs
/// (`1h2m3.5s`), where units are ns, us (µs), ms, s, m, h. A bare `0` is allowed.
pub fn parse_go_duration(text: &str) -> Result<i64, String> {
    let invalid = |why: &str| {
        format!(
            "{text:?} is not a valid duration ({why}; expected e.g. \"90s\", \"1m30s\", \"500ms\")"
        )
    };
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid("empty"));
    }
    let mut total = 0.0_f64;
    while !rest.is_empty() {
        let num_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let number = &rest[..num_len];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(invalid("missing number"));
        }
        let value: f64 = number.parse().map_err(|_| invalid("bad number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(rest.len(), |(i, _)| i);
        let unit = &rest[..unit_len];
        let scale = UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, s)| *s)
            .ok_or_else(|| {
                if unit.is_empty() {
                    invalid("missing unit")
                } else {
                    invalid(&format!("unknown unit {unit:?}"))
                }
            })?;
        total += value * scale;
        rest = &rest[unit_len..];
    }
    // i64 nanoseconds cover about 292 years, as in Go.
    if total > i64::MAX as f64 {
        return Err(invalid("too large"));
    }
    #[allow(clippy::cast_possible_truncation)]
    let nanos = total.round() as i64;
    Ok(if negative { -nanos } else { nanos })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_syntax() {
        assert_eq!(parse_go_duration("90s"), Ok(90_000_000_000));
        assert_eq!(parse_go_duration("1m30s"), Ok(90_000_000_000));
        assert_eq!(parse_go_duration("1.5h"), Ok(5_400_000_000_000));
        assert_eq!(parse_go_duration("300ms"), Ok(300_000_000));
        assert_eq!(parse_go_duration("10us"), Ok(10_000));
        assert_eq!(parse_go_duration("0"), Ok(0));
        assert_eq!(parse_go_duration("-5s"), Ok(-5_000_000_000));
        assert_eq!(parse_go_duration("1h0m0s"), Ok(3_600_000_000_000));
    }

    #[test]
    fn rejects_non_durations() {
        for bad in ["", "90", "s", "1x", "abc", "1.2.3s", "5 s", "-"] {
            assert!(
                parse_go_duration(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn std_conversion() {
        assert_eq!(
            Duration::new("2s").to_std(),
            Ok(std::time::Duration::from_secs(2))
        );
        assert!(Duration::new("-2s").to_std().is_err());
        assert_eq!(
            Duration::from_std(std::time::Duration::from_millis(1500)).as_str(),
            "1500ms"
        );
        assert_eq!(
            Duration::from_std(std::time::Duration::from_secs(90)).as_str(),
            "90s"
        );
    }
}
