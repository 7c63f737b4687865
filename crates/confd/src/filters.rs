//! BGPFilter resources as BIRD functions (pure).
//!
//! Each BGPFilter with rules for a family becomes `'bgp_<name>_importFilterV4'()` /
//! `'bgp_<name>_exportFilterV4'()` (V6 for IPv6), taking `bool is_same_as` when a rule
//! matches on peerType. Peers call them from their import/export filters. Names longer than
//! BIRD's 64-character symbol limit are truncated and suffixed with a hash, as Calico does,
//! so a config mixing margay and Calico nodes names them the same.

use std::fmt::Write as _;

use margay_api::BGPFilter;
use margay_api::bgp::{
    BgpFilterAction, BgpFilterRule, BgpFilterSource, BgpPeerType, MatchOperator,
};
use margay_api::net::Cidr;
use sha2::{Digest, Sha256};

use crate::render::RenderError;

/// BIRD's longest symbol.
const MAX_SYMBOL: usize = 64;
/// 2^31-1: priorities (lower is better) and bgp_local_pref (higher is better) convert as
/// `x = MAX - y`, Calico's convention, so mixed clusters agree on preferences.
pub const BIRD_INT_MAX: i64 = 2_147_483_647;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Import,
    Export,
}

impl Direction {
    fn word(self) -> &'static str {
        match self {
            Direction::Import => "import",
            Direction::Export => "export",
        }
    }
}

/// The rules of `filter` for a direction and family.
pub fn rules(filter: &BGPFilter, dir: Direction, v6: bool) -> &[BgpFilterRule] {
    let s = &filter.spec;
    match (dir, v6) {
        (Direction::Import, false) => &s.import_v4,
        (Direction::Import, true) => &s.import_v6,
        (Direction::Export, false) => &s.export_v4,
        (Direction::Export, true) => &s.export_v6,
    }
}

pub fn has_peer_type(rules: &[BgpFilterRule]) -> bool {
    rules.iter().any(|r| r.peer_type.is_some())
}

/// `'bgp_<name>_importFilterV4'`, quoted (filter names may hold `-` and `.`).
pub fn function_name(filter: &str, dir: Direction, v6: bool) -> String {
    let version = if v6 { "6" } else { "4" };
    let overhead = "bgp_".len() + "_".len() + dir.word().len() + "FilterV".len() + 1;
    let name = truncate_and_hash(filter, MAX_SYMBOL - overhead);
    format!("'bgp_{name}_{}FilterV{version}'", dir.word())
}

/// Calico's TruncateAndHashName: names over `max` keep their first `max - 17` characters,
/// then `_` and the first 16 upper-case hex digits of the name's SHA-256.
fn truncate_and_hash(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_string();
    }
    let digest = Sha256::digest(name.as_bytes());
    let mut hex = String::with_capacity(16);
    for b in digest.iter().take(8) {
        let _ = write!(hex, "{b:02X}");
    }
    let mut keep = max.saturating_sub(17);
    // Resource names are ASCII; stay on a character boundary regardless.
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}_{hex}", &name[..keep])
}

/// The BIRD functions of every BGPFilter for one family, in name order.
pub fn functions<'a>(
    filters: impl Iterator<Item = (&'a String, &'a BGPFilter)>,
    v6: bool,
    out: &mut String,
) -> Result<(), RenderError> {
    let version = if v6 { 6 } else { 4 };
    let mut any = false;
    for (name, filter) in filters {
        let dirs: Vec<(Direction, &[BgpFilterRule])> = [Direction::Import, Direction::Export]
            .into_iter()
            .map(|d| (d, rules(filter, d, v6)))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        if dirs.is_empty() {
            continue;
        }
        any = true;
        writeln!(out, "# v{version} BGPFilter {name}")?;
        for (dir, rules) in dirs {
            let fname = function_name(name, dir, v6);
            if has_peer_type(rules) {
                writeln!(out, "function {fname}(bool is_same_as) {{")?;
            } else {
                writeln!(out, "function {fname}() {{")?;
            }
            for (i, rule) in rules.iter().enumerate() {
                let stmt = statement(rule).map_err(|why| RenderError::Filter {
                    filter: name.clone(),
                    rule: format!("{}V{version}[{i}]", dir.word()),
                    why,
                })?;
                let stmt = match rule.peer_type {
                    Some(BgpPeerType::Ibgp) => format!("if (is_same_as) then {{ {stmt} }}"),
                    Some(BgpPeerType::Ebgp) => format!("if (!is_same_as) then {{ {stmt} }}"),
                    None => stmt,
                };
                writeln!(out, "  {stmt}")?;
            }
            writeln!(out, "}}")?;
        }
    }
    if !any {
        writeln!(out, "# No v{version} BGPFilters configured")?;
    }
    Ok(())
}

/// One rule: `if (<conditions>) then { <operations> <action>; }`, or just the body when the
/// rule matches everything.
pub fn statement(rule: &BgpFilterRule) -> Result<String, String> {
    let mut conds = Vec::new();
    if !rule.cidr.is_empty() {
        let op = match rule.match_operator {
            Some(MatchOperator::Equal) => "=",
            Some(MatchOperator::NotEqual) => "!=",
            Some(MatchOperator::In) => "~",
            Some(MatchOperator::NotIn) => "!~",
            None => return Err("a cidr needs a matchOperator".into()),
        };
        let cidr = Cidr::parse(rule.cidr.trim())
            .map_err(|e| format!("cidr {:?}: {e}", rule.cidr))?
            .network();
        let target = match &rule.prefix_length {
            Some(pl) => {
                let max_len = if cidr.is_ipv4() { 32 } else { 128 };
                let lo = pl.min.map_or(i64::from(cidr.prefix()), |m| {
                    m.max(i64::from(cidr.prefix()))
                });
                let hi = pl.max.map_or(max_len, |m| m.min(max_len));
                format!("[ {cidr}{{{lo},{hi}}} ]")
            }
            None => cidr.to_string(),
        };
        conds.push(format!("(net {op} {target})"));
    }
    if let Some(BgpFilterSource::RemotePeers) = rule.source {
        conds.push("((defined(source))&&(source ~ [ RTS_BGP ]))".into());
    }
    if !rule.interface.is_empty() {
        conds.push(format!(
            "((defined(ifname))&&(ifname ~ \"{}\"))",
            bird_string(&rule.interface)?
        ));
    }
    if let Some(c) = &rule.communities {
        let v = c
            .values
            .first()
            .ok_or_else(|| "communities has no value".to_string())?;
        let parts = community(v)?;
        match parts.len() {
            2 => conds.push(format!("(({}, {}) ~ bgp_community)", parts[0], parts[1])),
            _ => conds.push(format!(
                "(({}, {}, {}) ~ bgp_large_community)",
                parts[0], parts[1], parts[2]
            )),
        }
    }
    if !rule.as_path_prefix.is_empty() {
        let asns: Vec<String> = rule
            .as_path_prefix
            .iter()
            .map(|a| a.0.to_string())
            .collect();
        conds.push(format!("(bgp_path ~ [= {} * =])", asns.join(" ")));
    }
    if let Some(p) = rule.priority {
        conds.push(format!(
            "(defined(bgp_local_pref)&&(bgp_local_pref = {}))",
            BIRD_INT_MAX - p
        ));
    }
    let mut body: Vec<String> = Vec::new();
    for op in &rule.operations {
        if let Some(add) = &op.add_community {
            let v = add
                .value
                .as_deref()
                .ok_or_else(|| "addCommunity has no value".to_string())?;
            body.push(community_add(&community(v)?));
        } else if let Some(pp) = &op.prepend_as_path {
            // BIRD prepends one AS at a time: the last prepended ends up first.
            for a in pp.prefix.iter().rev() {
                body.push(format!("bgp_path.prepend({});", a.0));
            }
        } else if let Some(sp) = &op.set_priority {
            let v = sp
                .value
                .ok_or_else(|| "setPriority has no value".to_string())?;
            body.push(format!("bgp_local_pref = {};", BIRD_INT_MAX - v));
        } else {
            return Err("an operation sets nothing".into());
        }
    }
    body.push(match rule.action {
        BgpFilterAction::Accept => "accept;".into(),
        BgpFilterAction::Reject => "reject;".into(),
    });
    let body = body.join(" ");
    if conds.is_empty() {
        Ok(body)
    } else {
        Ok(format!("if ({}) then {{ {body} }}", conds.join("&&")))
    }
}

/// `aa:nn` or `aa:nn:mm` with numbers only (anything else could inject BIRD syntax).
pub fn community(v: &str) -> Result<Vec<&str>, String> {
    let parts: Vec<&str> = v.trim().split(':').collect();
    let numeric = parts
        .iter()
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 10);
    if (parts.len() == 2 || parts.len() == 3) && numeric {
        Ok(parts)
    } else {
        Err(format!(
            "{v:?} is not a community (aa:nn or aa:nn:mm, numbers)"
        ))
    }
}

/// `bgp_community.add((aa, nn));` or the large-community form.
pub fn community_add(parts: &[&str]) -> String {
    if parts.len() == 2 {
        format!("bgp_community.add(({}, {}));", parts[0], parts[1])
    } else {
        format!(
            "bgp_large_community.add(({}, {}, {}));",
            parts[0],
            parts.get(1).copied().unwrap_or("0"),
            parts.get(2).copied().unwrap_or("0")
        )
    }
}

/// Text that can sit between BIRD's double quotes, which have no escapes.
pub fn bird_string(s: &str) -> Result<&str, String> {
    if s.contains(['"', '\n', '\r', '\\']) {
        Err(format!(
            "{s:?} cannot be written in a BIRD string (no quotes, backslashes or line breaks)"
        ))
    } else {
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_truncated_as_calico_does() {
        assert_eq!(
            function_name("my-filter", Direction::Import, false),
            "'bgp_my-filter_importFilterV4'"
        );
        let long = "a".repeat(60);
        let n = function_name(&long, Direction::Export, true);
        // Quotes aside, exactly BIRD's limit.
        assert_eq!(n.len() - 2, MAX_SYMBOL);
        assert!(n.starts_with(&format!("'bgp_{}_", "a".repeat(28))));
    }

    #[test]
    fn communities_must_be_numbers() {
        assert!(community("65000:100").is_ok());
        assert!(community("65000:1:2").is_ok());
        assert!(community("65000:x").is_err());
        assert!(community("1:2); reject; (").is_err());
    }
}
