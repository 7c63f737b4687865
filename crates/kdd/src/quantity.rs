//! Kubernetes quantities (`resource.Quantity`: `1k`, `1.5Mi`, `4Gi`, `1e3`), as far as
//! Calico's QoS annotations need them: the integer value, rounded up (`Quantity.Value()`).

/// Values at or beyond this are all "too large" for every QoS limit (the largest is 1.01P);
/// they are reported as this value rather than computed exactly.
const SATURATED: i128 = 1_000_000_000_000_000_000_000_000_000;

/// The value of a Kubernetes quantity, rounded up to an integer; None when `s` is not a
/// quantity (Kubernetes' grammar: sign, digits with an optional fraction, and a suffix: one
/// of `m k M G T P E`, `Ki Mi Gi Ti Pi Ei`, or an exponent `e<n>`/`E<n>`). Magnitudes beyond
/// 10³⁰ saturate.
pub(crate) fn parse_value(s: &str) -> Option<i128> {
    let (negative, rest) = match s.as_bytes().first()? {
        b'+' => (false, &s[1..]),
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (int_part, rest) = rest.split_at(int_len);
    let (frac_part, suffix) = match rest.strip_prefix('.') {
        Some(r) => {
            let n = r.bytes().take_while(u8::is_ascii_digit).count();
            r.split_at(n)
        }
        None => ("", rest),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let (binary_exp, decimal_exp) = suffix_exponents(suffix)?;

    // digits × 10^exp10 × 2^binary_exp, digits without leading or trailing zeros.
    let mut digits: String = format!("{int_part}{frac_part}")
        .trim_start_matches('0')
        .to_string();
    let frac_len = i32::try_from(frac_part.len()).ok()?;
    let mut exp10 = decimal_exp.checked_sub(frac_len)?;
    while digits.ends_with('0') {
        digits.pop();
        exp10 = exp10.checked_add(1)?;
    }
    if digits.is_empty() {
        return Some(0);
    }
    // Beyond 19 significant digits only the magnitude matters (see SATURATED); keep 19 and
    // remember that something non-zero was dropped, for the rounding up.
    let mut inexact = false;
    if digits.len() > 19 {
        let dropped = digits.len() - 19;
        inexact = true;
        digits.truncate(19);
        exp10 = exp10.checked_add(i32::try_from(dropped).ok()?)?;
    }
    let n: u128 = digits.parse().ok()?;
    let scaled = n << binary_exp; // < 2^64 × 2^60: fits.
    let magnitude: i128 = if exp10 >= 0 {
        10u128
            .checked_pow(exp10.unsigned_abs())
            .and_then(|p| scaled.checked_mul(p))
            .and_then(|v| i128::try_from(v).ok())
            .map_or(SATURATED, |v| v.min(SATURATED))
    } else {
        let d = exp10.unsigned_abs();
        match 10u128.checked_pow(d) {
            // scaled < 2^124 < 10^38 ≤ 10^d: a value in (0, 1), rounded up.
            None => 1,
            Some(p) => {
                let q = scaled / p;
                let round_up = !scaled.is_multiple_of(p) || inexact;
                i128::try_from(q).map_or(SATURATED, |q| (q + i128::from(round_up)).min(SATURATED))
            }
        }
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// (power of 2, power of 10) of a quantity suffix.
fn suffix_exponents(suffix: &str) -> Option<(u32, i32)> {
    Some(match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        _ => {
            let exp = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (0, exp.parse().ok()?)
        }
    })
}

/// Calico's `parseAndValidateQty`: the quantity's value clamped to `[min, max]`; 0 (unset)
/// when it is not a quantity. The flag says whether the value was used as given.
pub(crate) fn clamped(s: &str, min: i64, max: i64) -> (i64, bool) {
    match parse_value(s) {
        None => (0, false),
        Some(v) if v < i128::from(min) => (min, false),
        Some(v) if v > i128::from(max) => (max, false),
        // Within [min, max], so within i64.
        Some(v) => (i64::try_from(v).unwrap_or(max), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        for (s, want) in [
            ("0", Some(0)),
            ("1", Some(1)),
            ("+5", Some(5)),
            ("-3", Some(-3)),
            ("1k", Some(1000)),
            ("1.01k", Some(1010)),
            ("1M", Some(1_000_000)),
            ("13M", Some(13_000_000)),
            ("1P", Some(1_000_000_000_000_000)),
            ("1.01P", Some(1_010_000_000_000_000)),
            ("4Gi", Some(4 << 30)),
            ("1.5Ki", Some(1536)),
            ("8Gi", Some(8 << 30)),
            ("100M", Some(100_000_000)),
            ("1e3", Some(1000)),
            ("1E3", Some(1000)),
            ("1e-3", Some(1)),
            ("1500m", Some(2)),
            ("1000m", Some(1)),
            ("0.1", Some(1)),
            (".5", Some(1)),
            ("5.", Some(5)),
            ("1E", Some(1_000_000_000_000_000_000)),
            ("34359738360", Some(34_359_738_360)),
            ("1.0000000000000000000001", Some(2)),
            ("99999999999999999999999999999999999", Some(SATURATED)),
            ("1e400", Some(SATURATED)),
            ("1e-400", Some(1)),
            ("1e99999999999", None),
            ("", None),
            ("k", None),
            ("1 k", None),
            ("1kb", None),
            ("1x", None),
            ("1e", None),
            ("--1", None),
            ("1.2.3", None),
        ] {
            assert_eq!(parse_value(s), want, "{s:?}");
        }
    }

    #[test]
    fn clamping() {
        assert_eq!(clamped("1", 1000, 10), (1000, false));
        assert_eq!(
            clamped("20P", 0, 1_000_000_000_000_000),
            (1_000_000_000_000_000, false)
        );
        assert_eq!(clamped("2k", 1, 10_000), (2000, true));
        assert_eq!(clamped("bogus", 1, 10), (0, false));
    }
}
