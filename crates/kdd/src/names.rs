//! Calico's naming rules in the Kubernetes datastore: object names made from CIDRs, hosts and
//! workload identities, the hostname-hash label, host-side interface names, and the UID
//! conversion that keeps derived objects' UIDs distinct from their sources'.
//!
//! Sources: `libcalico-go/lib/names/{cidr,workloadendpoint}.go`,
//! `lk8s/resources/ipam_affinity_v1.go` (affinity names), `libcalico-go/lib/backend/model/
//! block_affinity.go` (hostname hash), `lk8s/conversion/{workload_endpoint_default,conversion}.go`
//! (interface names, ConvertUID).

use std::fmt::Write as _;

use margay_api::net::Cidr;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use sha3::Sha3_256;

use crate::{KddError, Result};

/// Kubernetes' limit on object names (DNS subdomains).
const MAX_NAME_LEN: usize = 253;
/// How many hex digits of a hash Calico appends or uses.
const HASH_HEX_LEN: usize = 11;
/// The interface prefix when FELIX_INTERFACEPREFIX is unset.
pub const DEFAULT_INTERFACE_PREFIX: &str = "cali";

/// The object name of a CIDR (IPAMBlock names, and the tail of BlockAffinity names): the
/// masked CIDR with `.`, `:` and `/` turned into `-`: `10.244.1.0/26` → `10-244-1-0-26`,
/// `fd00:1234::/122` → `fd00-1234---122`.
///
/// A text that is not a CIDR is converted character by character (never fails), so a
/// malformed key still maps to some name rather than to a panic.
pub fn cidr_name(cidr: &str) -> String {
    let text = match Cidr::parse(cidr) {
        Ok(c) => c.network().to_string(),
        Err(_) => cidr.to_string(),
    };
    text.replace(['.', ':', '/'], "-")
}

/// The name of the BlockAffinity of `host` for the block `cidr`: `<host>-<cidr name>`; when
/// that is 253 characters or more, the host is cut to `252 − len(cidr name) − 13` characters
/// and the first 11 hex digits of SHA-256(`<host>+<cidr name>`) are appended, so the name fits
/// and distinct long hosts stay distinct: `<cut host>-<cidr name>-<hash>`.
pub fn block_affinity_name(host: &str, cidr: &str) -> String {
    let cidr_name = cidr_name(cidr);
    let name = format!("{host}-{cidr_name}");
    if name.len() < MAX_NAME_LEN {
        return name;
    }
    // 252 − len − 13: room for the two '-' and the 11-digit hash.
    let keep = (MAX_NAME_LEN - 1)
        .saturating_sub(cidr_name.len())
        .saturating_sub(2 + HASH_HEX_LEN);
    let cut = floor_char_boundary(host, keep);
    let digest = Sha256::digest(format!("{host}+{cidr_name}").as_bytes());
    format!(
        "{}-{cidr_name}-{}",
        &host[..cut],
        &hex(&digest)[..HASH_HEX_LEN]
    )
}

/// The value of the `projectcalico.org/hostname-hash` label of a host's BlockAffinities:
/// SHA3-256 of the host name in unpadded standard base32 (upper case, 52 characters), since
/// host names can be longer than the 63 characters a label value may have.
pub fn hostname_hash(host: &str) -> String {
    base32_nopad(&Sha3_256::digest(host.as_bytes()))
}

/// The name of a WorkloadEndpoint: `<node>-<orchestrator>-<workload>-<endpoint>` with every
/// `-` inside a part doubled, so the parts can be told apart (`ip-1`, `k8s`, `web-x`, `eth0` →
/// `ip--1-k8s-web--x-eth0`). For Kubernetes pods the workload part is the pod name and the
/// endpoint `eth0`. A part that is empty or starts or ends with `-` is an error naming it
/// (`node`, `orchestrator`, `workload`, `endpoint`), as in Calico.
pub fn workload_endpoint_name(
    node: &str,
    orchestrator: &str,
    workload: &str,
    endpoint: &str,
) -> Result<String> {
    let mut name = String::new();
    for (field, value) in [
        ("node", node),
        ("orchestrator", orchestrator),
        ("workload", workload),
        ("endpoint", endpoint),
    ] {
        if value.is_empty() {
            return Err(KddError::new(
                "WorkloadEndpoint name",
                field,
                "required: it is part of the endpoint's name",
            ));
        }
        if value.starts_with('-') || value.ends_with('-') {
            return Err(KddError::new(
                "WorkloadEndpoint name",
                field,
                format!("{value:?} must not start or end with '-'"),
            ));
        }
        if !name.is_empty() {
            name.push('-');
        }
        name.push_str(&value.replace('-', "--"));
    }
    Ok(name)
}

/// The inverse of [`workload_endpoint_name`]: `(node, orchestrator, workload, endpoint)`.
/// A `-` followed by another `-` is a literal dash (pairs are read left to right, as Calico
/// does), any other `-` separates parts. None unless there are exactly four parts, none empty
/// and none starting or ending with `-` (names no endpoint can have).
pub fn parse_workload_endpoint_name(name: &str) -> Option<(String, String, String, String)> {
    let mut parts: Vec<String> = vec![String::new()];
    let bytes = name.as_bytes();
    let mut i = 0;
    let mut start = 0;
    while i < bytes.len() {
        if bytes[i] != b'-' {
            i += 1;
            continue;
        }
        // Everything since the last dash belongs to the current part.
        parts.last_mut()?.push_str(&name[start..i]);
        if bytes.get(i + 1) == Some(&b'-') {
            parts.last_mut()?.push('-');
            i += 2;
        } else {
            parts.push(String::new());
            i += 1;
        }
        start = i;
    }
    parts.last_mut()?.push_str(&name[start..]);
    if parts.len() != 4
        || parts
            .iter()
            .any(|p| p.is_empty() || p.starts_with('-') || p.ends_with('-'))
    {
        return None;
    }
    let mut it = parts.into_iter();
    Some((it.next()?, it.next()?, it.next()?, it.next()?))
}

/// The interface prefix Calico's converters use: the first item of FELIX_INTERFACEPREFIX
/// (a comma-separated list), `cali` when it is empty.
pub fn interface_prefix(felix_interface_prefix: &str) -> &str {
    match felix_interface_prefix.split(',').next() {
        Some(first) if !felix_interface_prefix.is_empty() => first,
        _ => DEFAULT_INTERFACE_PREFIX,
    }
}

/// The host-side interface of a Kubernetes pod: `prefix` followed by the first 11 hex digits of
/// SHA-1(`<namespace>.<pod>`) (`default`, `podA` → `cali7f94ce7c295`). The CNI plugin names the
/// veth this way and Felix finds it by this name, so it must never change.
pub fn k8s_interface_name(prefix: &str, namespace: &str, pod: &str) -> String {
    let digest = Sha1::digest(format!("{namespace}.{pod}").as_bytes());
    format!("{prefix}{}", &hex(&digest)[..HASH_HEX_LEN])
}

/// Calico's UID conversion (ConvertUID): every byte of the UUID bit-reversed except bytes 6
/// and 8 (version and variant), written in the canonical lower-case form. It is its own
/// inverse, so a v3 object's UID and its custom resource's UID map to each other. Accepts the
/// forms Go's uuid.Parse does (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, with braces, with a
/// `urn:uuid:` prefix, or 32 bare hex digits); None when `uid` is not a UUID.
pub fn convert_uid(uid: &str) -> Option<String> {
    let bytes = parse_uuid(uid)?;
    let mut out = [0u8; 16];
    for (i, b) in bytes.iter().enumerate() {
        out[i] = if i == 6 || i == 8 {
            *b
        } else {
            b.reverse_bits()
        };
    }
    Some(format_uuid(&out))
}

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex_text: String = match s.len() {
        36 => dashed(s)?,
        38 => dashed(s.strip_prefix('{')?.strip_suffix('}')?)?,
        45 => {
            let (scheme, rest) = s.split_at_checked(9)?;
            if !scheme.eq_ignore_ascii_case("urn:uuid:") {
                return None;
            }
            dashed(rest)?
        }
        32 => s.to_string(),
        _ => return None,
    };
    let mut out = [0u8; 16];
    let digits = hex_text.as_bytes();
    if digits.len() != 32 {
        return None;
    }
    for (i, pair) in digits.chunks(2).enumerate() {
        out[i] = (hex_value(pair[0])? << 4) | hex_value(pair[1])?;
    }
    Some(out)
}

/// The 32 hex digits of `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, checking the dashes.
fn dashed(s: &str) -> Option<String> {
    let b = s.as_bytes();
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
        return None;
    }
    Some(s.chars().filter(|c| *c != '-').collect())
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn format_uuid(b: &[u8; 16]) -> String {
    let h = hex(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// RFC 4648 base32 (alphabet A–Z, 2–7) without padding, as Go's
/// `base32.StdEncoding.WithPadding(base32.NoPadding)`.
fn base32_nopad(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let mut buffer: u32 = 0;
    let mut bits = 0u32;
    for &b in bytes {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
        // Only the low `bits` bits are still needed.
        buffer &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

/// The largest index ≤ `i` that is on a character boundary of `s` (host names are ASCII, but
/// a slice must never panic on input).
fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn base32_matches_rfc4648_vectors() {
        // RFC 4648 §10, without the padding.
        for (input, want) in [
            ("", ""),
            ("f", "MY"),
            ("fo", "MZXQ"),
            ("foo", "MZXW6"),
            ("foob", "MZXW6YQ"),
            ("fooba", "MZXW6YTB"),
            ("foobar", "MZXW6YTBOI"),
        ] {
            assert_eq!(base32_nopad(input.as_bytes()), want, "{input:?}");
        }
    }

    #[test]
    fn uuid_forms() {
        let canon = "41cb1fde-57e7-42c1-a73b-0acaf38c7737";
        let bytes = parse_uuid(canon).unwrap();
        assert_eq!(format_uuid(&bytes), canon);
        assert_eq!(parse_uuid(&canon.to_uppercase()), Some(bytes));
        assert_eq!(parse_uuid(&format!("{{{canon}}}")), Some(bytes));
        assert_eq!(parse_uuid(&format!("URN:uuid:{canon}")), Some(bytes));
        assert_eq!(parse_uuid(&canon.replace('-', "")), Some(bytes));
        assert_eq!(parse_uuid("41cb1fde_57e7-42c1-a73b-0acaf38c7737"), None);
        assert_eq!(parse_uuid("41cb1fde-57e7-42c1-a73b-0acaf38c773g"), None);
        assert_eq!(parse_uuid("not-a-uid"), None);
        assert_eq!(parse_uuid("é1cb1fde-57e7-42c1-a73b-0acaf38c773"), None);
    }
}
