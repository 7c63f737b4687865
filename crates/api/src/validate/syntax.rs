//! Syntax rules for names, labels, interfaces and MAC addresses (Kubernetes' and Calico's).

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 63 {
        return Err(format!("must be at most 63 characters (is {})", s.len()));
    }
    let b = s.as_bytes();
    let inner_ok = b
        .iter()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
    let ends_ok = b[0] != b'-' && b[b.len() - 1] != b'-';
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err(format!(
            "{s:?} must consist of lower case letters, digits and '-', and start and end with a letter or digit"
        ))
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` of any length.
pub fn label_chars_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// DNS-1123 labels joined by '.', at most 253 characters.
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 253 {
        return Err(format!("must be at most 253 characters (is {})", s.len()));
    }
    // Kubernetes' subdomain rule limits only the total length, not each label.
    if s.split('.').all(label_chars_ok) {
        Ok(())
    } else {
        Err(format!(
            "{s:?} must consist of lower case letters, digits, '-' and '.', and each '.'-separated part must start and end with a letter or digit"
        ))
    }
}

/// Kubernetes label key syntax: `[prefix/]name`, prefix a DNS-1123 subdomain, name at most
/// 63 characters of `[A-Za-z0-9._-]` starting and ending alphanumeric.
pub fn qualified_name(s: &str) -> Result<(), String> {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err("prefix before '/' must not be empty".into());
        }
        dns1123_subdomain(p).map_err(|e| format!("prefix: {e}"))?;
    }
    if name.is_empty() {
        return Err("name part must not be empty".into());
    }
    if name.len() > 63 {
        return Err(format!(
            "name part must be at most 63 characters (is {})",
            name.len()
        ));
    }
    if !alnum_with_inner_punct(name) {
        return Err(
            "must consist of letters, digits, '-', '_' or '.', and start and end with a letter or digit".into(),
        );
    }
    Ok(())
}

/// Kubernetes label value syntax: empty, or at most 63 characters like a qualified name's name.
pub fn label_value(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    if s.len() > 63 {
        return Err(format!("must be at most 63 characters (is {})", s.len()));
    }
    if !alnum_with_inner_punct(s) {
        return Err(
            "must consist of letters, digits, '-', '_' or '.', and start and end with a letter or digit".into(),
        );
    }
    Ok(())
}

fn alnum_with_inner_punct(s: &str) -> bool {
    let b = s.as_bytes();
    let first = b.first().is_some_and(u8::is_ascii_alphanumeric);
    let last = b.last().is_some_and(u8::is_ascii_alphanumeric);
    first
        && last
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Linux interface name as Calico accepts it: 1-15 of `[a-zA-Z0-9_.-]`.
pub fn is_interface_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

pub fn interface_name_message(s: &str) -> String {
    format!(
        "{s:?} is not a valid interface name (1-15 characters of letters, digits, '_', '.', '-')"
    )
}

/// IANA service name, as Kubernetes requires for port names: 1-15 lower case letters, digits
/// and '-', at least one letter, no leading, trailing or double '-'.
pub fn port_name(s: &str) -> Result<(), String> {
    let msg = || {
        format!(
            "{s:?} is not a valid port name (1-15 lower case letters, digits and '-', with at least one letter, not starting or ending with '-' and no '--')"
        )
    };
    let b = s.as_bytes();
    if b.is_empty() || b.len() > 15 {
        return Err(msg());
    }
    if !b
        .iter()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    {
        return Err(msg());
    }
    if !b.iter().any(u8::is_ascii_lowercase)
        || b[0] == b'-'
        || b[b.len() - 1] == b'-'
        || s.contains("--")
    {
        return Err(msg());
    }
    Ok(())
}

/// A named port in a rule: 1-128 of `[a-zA-Z0-9_.-]`.
pub fn rule_port_name(s: &str) -> Result<(), String> {
    if !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
    {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not a valid port: expected a number 1-65535, a range \"min:max\", or a port name of 1-128 letters, digits, '_', '.', '-'"
        ))
    }
}

/// A MAC address in any form Go's net.ParseMAC accepts: 6, 8 or 20 octets written as
/// `aa:bb:..`, `aa-bb-..` or `aabb.ccdd...`.
pub fn is_mac(s: &str) -> bool {
    let octets_ok = |n: usize| n == 6 || n == 8 || n == 20;
    if let Some(sep) = [':', '-'].into_iter().find(|c| s.contains(*c)) {
        let parts: Vec<&str> = s.split(sep).collect();
        return octets_ok(parts.len())
            && parts
                .iter()
                .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    if s.contains('.') {
        let parts: Vec<&str> = s.split('.').collect();
        return octets_ok(parts.len() * 2)
            && parts
                .iter()
                .all(|p| p.len() == 4 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    false
}

/// Container IDs: `[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?`.
pub fn is_container_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(dns1123_label("a-b1").is_ok());
        assert!(dns1123_label("-a").is_err());
        assert!(dns1123_label("A").is_err());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
        assert!(dns1123_subdomain("a.b-c.d").is_ok());
        assert!(dns1123_subdomain("a..b").is_err());
        assert!(dns1123_subdomain(&"a.".repeat(127)).is_err());
        assert!(dns1123_subdomain(&"a".repeat(200)).is_ok());
    }

    #[test]
    fn labels() {
        assert!(qualified_name("app").is_ok());
        assert!(qualified_name("example.com/app_v1.2").is_ok());
        assert!(qualified_name("/app").is_err());
        assert!(qualified_name("Example.com/app").is_err());
        assert!(qualified_name("bad key!").is_err());
        assert!(label_value("").is_ok());
        assert!(label_value("Web_1").is_ok());
        assert!(label_value("-x").is_err());
    }

    #[test]
    fn ports_and_macs() {
        assert!(port_name("http").is_ok());
        assert!(port_name("h2-c").is_ok());
        assert!(port_name("123").is_err());
        assert!(port_name("a--b").is_err());
        assert!(port_name("HTTP").is_err());
        assert!(rule_port_name("My_Port.1").is_ok());
        assert!(rule_port_name("a:b").is_err());
        assert!(is_mac("ee:ee:ee:ee:ee:ee"));
        assert!(is_mac("01-23-45-67-89-ab"));
        assert!(is_mac("0123.4567.89ab"));
        assert!(!is_mac("ee:ee:ee:ee:ee"));
        assert!(!is_mac("gg:ee:ee:ee:ee:ee"));
        assert!(is_container_id("abc-123"));
        assert!(!is_container_id("abc_123"));
    }
}
