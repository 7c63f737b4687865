//! The rule a logged packet names, as Calico's NFLOG prefix writes it:
//! `<action><origin><direction><rule index>|<id>` — action `A`llow, `D`eny or `P`ass; origin
//! `P`olicy or p`R`ofile; direction `I`ngress or `E`gress; the id `<kind>/<ns>/<name>`,
//! `<kind>/<name>` or the profile's name. The end of a tier is `DPI|<tier>` (`PPI|<tier>` when
//! it passes), no profile matching is `DRI`/`DRE`. The kernel keeps 63 bytes of a prefix, so a
//! longer one is shortened with a hash; the dataplane that rendered it keeps the full
//! [`RuleRef`] for each prefix it wrote ([`PrefixTable`]).

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// The longest prefix the kernel keeps (64 bytes with the NUL).
pub const MAX_PREFIX: usize = 63;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Deny,
    Pass,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Ingress,
    Egress,
}

/// What decided: a rule of a policy or profile, a tier's end, or no profile at all.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Origin {
    /// `kind` is Calico's short kind: `gnp`, `np`, `knp`, `kcnp`, ….
    Policy {
        kind: String,
        namespace: String,
        name: String,
    },
    Profile {
        name: String,
    },
    /// The tier's default action (no policy of the tier matched).
    EndOfTier {
        tier: String,
    },
    /// Nothing allowed it: no profile matched (the endpoint's default deny).
    NoProfile,
}

/// One rule that logs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RuleRef {
    pub action: Action,
    pub direction: Direction,
    pub origin: Origin,
    /// The rule's index in its policy or profile (None for a tier's end or no profile).
    pub rule_index: Option<u32>,
}

impl RuleRef {
    /// The prefix as Calico writes it (before shortening).
    pub fn full_prefix(&self) -> String {
        let a = match self.action {
            Action::Allow => 'A',
            Action::Deny => 'D',
            Action::Pass => 'P',
        };
        let d = match self.direction {
            Direction::Ingress => 'I',
            Direction::Egress => 'E',
        };
        let mut s = String::new();
        match &self.origin {
            Origin::Policy {
                kind,
                namespace,
                name,
            } => {
                let _ = write!(s, "{a}P{d}{}|{kind}/", self.rule_index.unwrap_or(0));
                if !namespace.is_empty() {
                    let _ = write!(s, "{namespace}/");
                }
                s.push_str(name);
            }
            Origin::Profile { name } => {
                let _ = write!(s, "{a}R{d}{}|{name}", self.rule_index.unwrap_or(0));
            }
            Origin::EndOfTier { tier } => {
                let _ = write!(s, "{a}P{d}|{tier}");
            }
            Origin::NoProfile => {
                let _ = write!(s, "DR{d}");
            }
        }
        s
    }

    /// The prefix to render: the full one, or (63 bytes or more) its first 10 bytes, a
    /// 42-character hash, `_` and its last 10 bytes — unique per rule, within the limit.
    pub fn prefix(&self) -> String {
        shorten(&self.full_prefix())
    }

    /// Calico's policy-hit string: `<index>|<tier>|<kind>:[<ns>/]<name>|<action>|<rule>`
    /// (`-1` for a tier's end; profiles in tier `__PROFILE__`).
    pub fn hit(&self, index: usize, tier: &str) -> String {
        let action = match self.action {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Pass => "pass",
        };
        let rule = self.rule_index.map_or("-1".to_string(), |r| r.to_string());
        match &self.origin {
            Origin::Policy {
                kind,
                namespace,
                name,
            } => {
                let ns = if namespace.is_empty() {
                    String::new()
                } else {
                    format!("{namespace}/")
                };
                format!("{index}|{tier}|{kind}:{ns}{name}|{action}|{rule}")
            }
            Origin::Profile { name } => format!("{index}|__PROFILE__|pro:{name}|{action}|{rule}"),
            Origin::EndOfTier { tier } => format!("{index}|{tier}|eot:{tier}|{action}|-1"),
            Origin::NoProfile => format!("{index}|__PROFILE__|pro:none|deny|-1"),
        }
    }

    /// A one-line description for people: `policy gnp/allow-ssh rule 0 (ingress, allow)`.
    pub fn describe(&self) -> String {
        let dir = match self.direction {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        };
        let action = match self.action {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Pass => "pass",
        };
        match &self.origin {
            Origin::Policy {
                kind,
                namespace,
                name,
            } => {
                let ns = if namespace.is_empty() {
                    String::new()
                } else {
                    format!("{namespace}/")
                };
                format!(
                    "policy {kind}/{ns}{name} rule {} ({dir}, {action})",
                    self.rule_index.unwrap_or(0)
                )
            }
            Origin::Profile { name } => format!(
                "profile {name} rule {} ({dir}, {action})",
                self.rule_index.unwrap_or(0)
            ),
            Origin::EndOfTier { tier } => format!("end of tier {tier} ({dir}, {action})"),
            Origin::NoProfile => format!("default deny: no policy or profile allowed it ({dir})"),
        }
    }
}

/// FNV-1a 64 over the bytes (a stable, dependency-free hash: only uniqueness matters).
fn fnv64(data: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn shorten(full: &str) -> String {
    if full.len() < MAX_PREFIX {
        return full.to_string();
    }
    let head_end = (0..=10)
        .rev()
        .find(|i| full.is_char_boundary(*i))
        .unwrap_or(0);
    let tail_start = (full.len() - 10..full.len())
        .find(|i| full.is_char_boundary(*i))
        .unwrap_or(full.len());
    // 42 hex characters from three seeded hashes (168 bits, 42 used).
    let mut hash = String::new();
    for seed in 0..3u64 {
        let _ = write!(hash, "{:016x}", fnv64(full.as_bytes(), seed));
    }
    hash.truncate(42);
    format!("{}{hash}_{}", &full[..head_end], &full[tail_start..])
}

/// The prefixes a dataplane rendered, and what each names (with the rule's tier).
#[derive(Debug, Clone, Default)]
pub struct PrefixTable {
    by_prefix: HashMap<String, (RuleRef, String)>,
}

impl PrefixTable {
    /// Records `rule` of `tier`; returns the prefix to render for it.
    pub fn insert(&mut self, rule: RuleRef, tier: &str) -> String {
        let p = rule.prefix();
        self.by_prefix.insert(p.clone(), (rule, tier.to_string()));
        p
    }

    /// What a logged prefix names and its tier: the recorded rule, else what a full
    /// (unshortened) prefix says by itself (the tier then known only for a tier's end).
    pub fn lookup(&self, prefix: &str) -> Option<(RuleRef, String)> {
        self.by_prefix.get(prefix).cloned().or_else(|| {
            let r = parse(prefix)?;
            let tier = match &r.origin {
                Origin::EndOfTier { tier } => tier.clone(),
                Origin::Profile { .. } | Origin::NoProfile => "__PROFILE__".to_string(),
                Origin::Policy { .. } => String::new(),
            };
            Some((r, tier))
        })
    }

    pub fn len(&self) -> usize {
        self.by_prefix.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_prefix.is_empty()
    }
}

/// Reads an unshortened prefix. Kinds are Calico's short names; a policy id of two parts is
/// global (`gnp/name`), of three namespaced (`np/ns/name`).
pub fn parse(prefix: &str) -> Option<RuleRef> {
    // Every prefix of the kernel's full length is a shortened one: only the table knows it.
    if prefix.len() >= MAX_PREFIX {
        return None;
    }
    let b = prefix.as_bytes();
    let action = match b.first()? {
        b'A' => Action::Allow,
        b'D' => Action::Deny,
        b'P' => Action::Pass,
        _ => return None,
    };
    let profile = match b.get(1)? {
        b'P' => false,
        b'R' => true,
        _ => return None,
    };
    let direction = match b.get(2)? {
        b'I' => Direction::Ingress,
        b'E' => Direction::Egress,
        _ => return None,
    };
    let rest = prefix.get(3..)?;
    let (index, id) = match rest.split_once('|') {
        Some((i, id)) => (i, Some(id)),
        None => (rest, None),
    };
    let rule_index = if index.is_empty() {
        None
    } else {
        Some(index.parse::<u32>().ok()?)
    };
    let origin = match (profile, id, rule_index) {
        (true, None, None) if action == Action::Deny => Origin::NoProfile,
        (true, Some(name), Some(_)) => Origin::Profile {
            name: name.to_string(),
        },
        (false, Some(tier), None) => Origin::EndOfTier {
            tier: tier.to_string(),
        },
        (false, Some(id), Some(_)) => {
            let parts: Vec<&str> = id.splitn(3, '/').collect();
            match parts.as_slice() {
                [kind, name] => Origin::Policy {
                    kind: kind.to_string(),
                    namespace: String::new(),
                    name: name.to_string(),
                },
                [kind, ns, name] => Origin::Policy {
                    kind: kind.to_string(),
                    namespace: ns.to_string(),
                    name: name.to_string(),
                },
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(RuleRef {
        action,
        direction,
        origin,
        rule_index,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(
        kind: &str,
        ns: &str,
        name: &str,
        idx: u32,
        action: Action,
        dir: Direction,
    ) -> RuleRef {
        RuleRef {
            action,
            direction: dir,
            origin: Origin::Policy {
                kind: kind.into(),
                namespace: ns.into(),
                name: name.into(),
            },
            rule_index: Some(idx),
        }
    }

    #[test]
    fn calicos_examples() {
        let r = policy("gnp", "", "allow-ssh", 0, Action::Allow, Direction::Ingress);
        assert_eq!(r.prefix(), "API0|gnp/allow-ssh");
        let r = policy("np", "ns1", "p", 3, Action::Deny, Direction::Egress);
        assert_eq!(r.prefix(), "DPE3|np/ns1/p");
        let eot = RuleRef {
            action: Action::Deny,
            direction: Direction::Ingress,
            origin: Origin::EndOfTier {
                tier: "default".into(),
            },
            rule_index: None,
        };
        assert_eq!(eot.prefix(), "DPI|default");
        let none = RuleRef {
            action: Action::Deny,
            direction: Direction::Egress,
            origin: Origin::NoProfile,
            rule_index: None,
        };
        assert_eq!(none.prefix(), "DRE");
        for r in [r, eot, none] {
            assert_eq!(parse(&r.prefix()), Some(r));
        }
        assert_eq!(
            policy(
                "np",
                "ns1",
                "allow-web",
                0,
                Action::Allow,
                Direction::Ingress
            )
            .hit(0, "default"),
            "0|default|np:ns1/allow-web|allow|0"
        );
        let pro = RuleRef {
            action: Action::Allow,
            direction: Direction::Ingress,
            origin: Origin::Profile {
                name: "kns.default".into(),
            },
            rule_index: Some(0),
        };
        assert_eq!(pro.hit(1, "x"), "1|__PROFILE__|pro:kns.default|allow|0");
        assert_eq!(pro.prefix(), "ARI0|kns.default");
    }

    #[test]
    fn long_prefixes_are_shortened_uniquely_and_found_in_the_table() {
        let long = "n".repeat(80);
        let a = policy("np", "team-a", &long, 1, Action::Allow, Direction::Ingress);
        let b = policy("np", "team-b", &long, 1, Action::Allow, Direction::Ingress);
        assert_eq!(a.prefix().len(), 63);
        assert_ne!(a.prefix(), b.prefix());
        assert_eq!(
            parse(&a.prefix()),
            None,
            "a shortened prefix cannot be read alone"
        );
        let mut t = PrefixTable::default();
        let pa = t.insert(a.clone(), "default");
        t.insert(b.clone(), "default");
        assert_eq!(t.lookup(&pa), Some((a, "default".to_string())));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn garbage_is_not_a_rule() {
        for p in [
            "",
            "X",
            "APQ0|x",
            "API",
            "APIx|gnp/a",
            "API0|a/b/c/d/e",
            "ARI|p",
            "APE0",
        ] {
            let got = parse(p);
            assert!(got.is_none() || p == "API0|a/b/c/d/e", "{p}: {got:?}");
        }
    }

    proptest! {
        #[test]
        fn every_rendered_prefix_fits_and_reads_back(
            kind in "(gnp|np|knp)",
            ns in "[a-z0-9-]{0,40}",
            name in "[a-z0-9.-]{1,80}",
            idx in 0u32..5000,
            allow in any::<bool>(),
            ingress in any::<bool>(),
        ) {
            let r = policy(
                &kind, &ns, &name, idx,
                if allow { Action::Allow } else { Action::Deny },
                if ingress { Direction::Ingress } else { Direction::Egress },
            );
            let p = r.prefix();
            prop_assert!(p.len() <= MAX_PREFIX);
            let mut t = PrefixTable::default();
            t.insert(r.clone(), "t1");
            prop_assert_eq!(t.lookup(&p), Some((r.clone(), "t1".to_string())));
            if p.len() < MAX_PREFIX {
                prop_assert_eq!(parse(&p), Some(r));
            }
        }
    }
}
