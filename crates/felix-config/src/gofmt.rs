//! Number and duration spellings as Calico's Go code reads and writes them.
//!
//! Felix parses integers with Go's base-prefix rules (`0x10`, `0o17`, `017`, `1_000`), seconds as
//! Go floats, and the v3 → v1 conversion writes seconds with Go's `%v` float formatting
//! (`90`, `0.5`, `1e+06`) and durations with Go's `Duration.String` (`1m30s`). Matching those
//! spellings keeps raw values byte-identical to what Calico shows for the same resource.

/// Parses a signed integer the way Go's `strconv.ParseInt(s, 0, bits)` does.
pub(crate) fn parse_int(s: &str, bits: u32) -> Result<i64, String> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let magnitude = parse_uint_body(body, s)?;
    let limit: u128 = 1u128 << (bits - 1);
    let value = u128::from(magnitude);
    if neg {
        if value > limit {
            return Err(format!("{s:?} is out of range"));
        }
        let v = i128::try_from(value).map_err(|_| format!("{s:?} is out of range"))?;
        i64::try_from(-v).map_err(|_| format!("{s:?} is out of range"))
    } else {
        if value >= limit {
            return Err(format!("{s:?} is out of range"));
        }
        i64::try_from(value).map_err(|_| format!("{s:?} is out of range"))
    }
}

/// Go's `strconv.Atoi`: decimal only, an optional sign, no underscores.
pub(crate) fn go_atoi(s: &str) -> Option<i64> {
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<i64>().ok()
}

/// Parses an unsigned integer the way Go's `strconv.ParseUint(s, 0, bits)` does (no sign).
pub(crate) fn parse_uint(s: &str, bits: u32) -> Result<u64, String> {
    let v = parse_uint_body(s, s)?;
    if bits < 64 && v >= (1u64 << bits) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v)
}

fn parse_uint_body(body: &str, whole: &str) -> Result<u64, String> {
    let invalid = || format!("{whole:?} is not a valid integer");
    if body.is_empty() {
        return Err(invalid());
    }
    let bytes = body.as_bytes();
    let (radix, digits) = if bytes.len() >= 2 && bytes[0] == b'0' {
        match bytes[1].to_ascii_lowercase() {
            b'x' => (16, &body[2..]),
            b'o' => (8, &body[2..]),
            b'b' => (2, &body[2..]),
            _ => (8, &body[1..]),
        }
    } else {
        (10, body)
    };
    if body.contains('_') && !underscores_ok(body) {
        return Err(invalid());
    }
    let cleaned: String = digits.chars().filter(|c| *c != '_').collect();
    if !cleaned.chars().all(|c| c.is_digit(radix)) {
        return Err(invalid());
    }
    if cleaned.is_empty() {
        // "0" alone is octal zero; "0x" with nothing after it is not a number.
        return if body == "0" { Ok(0) } else { Err(invalid()) };
    }
    u64::from_str_radix(&cleaned, radix).map_err(|e| {
        if matches!(e.kind(), std::num::IntErrorKind::PosOverflow) {
            format!("{whole:?} is out of range")
        } else {
            invalid()
        }
    })
}

/// Go's rule for `_` in number literals: only between digits (a base prefix counts as a digit).
fn underscores_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    let mut saw = b'^';
    let mut hex = false;
    if b.len() >= 2 && b[0] == b'0' && matches!(b[1].to_ascii_lowercase(), b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = b[1].eq_ignore_ascii_case(&b'x');
    }
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
        i += 1;
    }
    saw != b'_'
}

/// Parses a decimal float as Go's `strconv.ParseFloat(s, 64)` does for the forms operators use
/// (`1`, `1.5`, `.5`, `1e3`, `-2`). Infinities, NaN, hex floats and out-of-range values are
/// rejected: none of them is a meaningful number of seconds.
pub(crate) fn parse_float(s: &str) -> Result<f64, String> {
    let invalid = || format!("{s:?} is not a valid number");
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    let mut saw_digit = false;
    for c in body.chars() {
        match c {
            '0'..='9' => saw_digit = true,
            '.' | 'e' | 'E' | '+' | '-' | '_' => {}
            _ => return Err(invalid()),
        }
    }
    if !saw_digit {
        return Err(invalid());
    }
    if s.contains('_') && !underscores_ok(body) {
        return Err(invalid());
    }
    let cleaned: String = s.chars().filter(|c| *c != '_').collect();
    let v: f64 = cleaned.parse().map_err(|_| invalid())?;
    if !v.is_finite() {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v)
}

/// Formats a float as Go's `fmt.Sprintf("%v", f)` does: the shortest digits that round-trip,
/// in exponent form (`1e+06`, `1e-05`) when the decimal exponent is below -4 or at least 6.
pub(crate) fn format_float_v(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN".into()
        } else if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-tripping digits: "1.2345e3", "5e-1".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if !(-4..6).contains(&exp) {
        let mut out = String::from(sign);
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.unsigned_abs()));
        return out;
    }
    let mut out = String::from(sign);
    if exp >= 0 {
        let int_len = usize::try_from(exp).unwrap_or(0) + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            out.push_str(&"0".repeat(int_len - digits.len()));
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    } else {
        out.push_str("0.");
        out.push_str(&"0".repeat(usize::try_from(-exp - 1).unwrap_or(0)));
        out.push_str(&digits);
    }
    out
}

/// The seconds of a duration as Go's `Duration.Seconds()` computes them.
pub(crate) fn seconds_of(nanos: i64) -> f64 {
    let sec = nanos / 1_000_000_000;
    let nsec = nanos % 1_000_000_000;
    sec as f64 + nsec as f64 / 1e9
}

/// The milliseconds of a duration as Calico's v3 → v1 conversion computes them.
pub(crate) fn millis_of(nanos: i64) -> f64 {
    let ms = nanos / 1_000_000;
    let rem = nanos % 1_000_000;
    ms as f64 + rem as f64 / 1e6
}

/// Formats a duration as Go's `time.Duration.String` does: `0s`, `1.5s`, `1m30s`, `1h0m0s`,
/// `250ms`, `1.5µs`, `10ns`.
pub fn format_go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let neg = nanos < 0;
    let u = nanos.unsigned_abs();
    let mut out = String::new();
    if u < 1_000_000_000 {
        // Sub-second: one unit with a fraction.
        let (unit, scale) = if u < 1_000 {
            ("ns", 1u64)
        } else if u < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        out.push_str(&fraction(u, scale));
        out.push_str(unit);
    } else {
        let hours = u / 3_600_000_000_000;
        let rem = u % 3_600_000_000_000;
        let minutes = rem / 60_000_000_000;
        let secs = rem % 60_000_000_000;
        if hours > 0 {
            out.push_str(&format!("{hours}h"));
        }
        if hours > 0 || minutes > 0 {
            out.push_str(&format!("{minutes}m"));
        }
        out.push_str(&fraction(secs, 1_000_000_000));
        out.push('s');
    }
    if neg { format!("-{out}") } else { out }
}

/// `value / scale` written with the fraction's trailing zeros removed.
fn fraction(value: u64, scale: u64) -> String {
    let whole = value / scale;
    let frac = value % scale;
    if frac == 0 {
        return whole.to_string();
    }
    let width = scale.to_string().len() - 1;
    let frac = format!("{frac:0width$}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_follow_go_base_prefixes() {
        let cases: &[(&str, Option<i64>)] = &[
            ("0", Some(0)),
            ("42", Some(42)),
            ("-42", Some(-42)),
            ("+7", Some(7)),
            ("0x10", Some(16)),
            ("0X1f", Some(31)),
            ("017", Some(15)),
            ("0o17", Some(15)),
            ("0b101", Some(5)),
            ("1_000", Some(1000)),
            ("0x_1F", Some(31)),
            ("1__0", None),
            ("_1", None),
            ("1_", None),
            ("08", None),
            ("0x", None),
            ("", None),
            ("-", None),
            (" 1", None),
            ("1.0", None),
            ("++1", None),
            ("-+1", None),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("-9223372036854775808", Some(i64::MIN)),
        ];
        for (s, want) in cases {
            assert_eq!(parse_int(s, 64).ok(), *want, "parse_int({s:?})");
        }
        assert_eq!(parse_uint("0xffff0000", 32).ok(), Some(0xffff_0000));
        assert_eq!(parse_uint("0x1ffffffff", 32).ok(), None);
        assert_eq!(parse_uint("-1", 32).ok(), None);
        assert_eq!(parse_uint("+1", 32).ok(), None);
    }

    #[test]
    fn floats() {
        for (s, want) in [
            ("1", Some(1.0)),
            ("1.5", Some(1.5)),
            (".5", Some(0.5)),
            ("-2", Some(-2.0)),
            ("1e3", Some(1000.0)),
            ("1e+06", Some(1e6)),
            ("inf", None),
            ("NaN", None),
            ("1e400", None),
            ("abc", None),
            ("", None),
            ("1s", None),
        ] {
            assert_eq!(parse_float(s).ok(), want, "parse_float({s:?})");
        }
    }

    #[test]
    fn go_float_v_formatting() {
        for (f, want) in [
            (90.0, "90"),
            (0.5, "0.5"),
            (12.345, "12.345"),
            (0.1, "0.1"),
            (86400.0, "86400"),
            (999999.0, "999999"),
            (1e6, "1e+06"),
            (1_234_567.0, "1.234567e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.054321, "0.054321"),
            (-1.5, "-1.5"),
            (0.0, "0"),
        ] {
            assert_eq!(format_float_v(f), want, "format_float_v({f})");
        }
    }

    #[test]
    fn go_duration_formatting() {
        for (n, want) in [
            (0, "0s"),
            (1, "1ns"),
            (1_500, "1.5µs"),
            (250_000_000, "250ms"),
            (1_500_000_000, "1.5s"),
            (20_000_000_000, "20s"),
            (90_000_000_000, "1m30s"),
            (3_600_000_000_000, "1h0m0s"),
            (3_723_000_000_000, "1h2m3s"),
            (-90_000_000_000, "-1m30s"),
        ] {
            assert_eq!(format_go_duration(n), want, "format_go_duration({n})");
        }
    }
}
