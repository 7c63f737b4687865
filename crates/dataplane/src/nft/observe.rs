//! Reading the kernel's copy of the table back (`nft -j list table inet <t>`) into a
//! [`Fingerprint`], and running nft.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::nft::diff::Fingerprint;

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("cannot run {program}: {reason} (is the nftables package installed?)")]
    Spawn { program: String, reason: String },
    #[error("nft rejected the transaction: {stderr}")]
    Rejected { stderr: String, script_lines: usize },
    #[error("nft output is not what margay expects: {0}")]
    Unreadable(String),
}

/// One nft call (a transaction, or reading a table back) ends within this: 10k rules take
/// about 0.3 s, so only a wedged nft (or kernel lock) gets near it.
const NFT_TIMEOUT: Duration = Duration::from_secs(60);
/// The most output accepted from nft (a table of 10k rules reads back as a few MB of JSON).
const NFT_MAX_OUTPUT: usize = 512 << 20;

/// Runs `nft`, optionally inside a named network namespace (tests).
#[derive(Debug, Clone)]
pub struct NftRunner {
    pub program: PathBuf,
    pub netns: Option<String>,
}

impl Default for NftRunner {
    fn default() -> Self {
        NftRunner {
            program: PathBuf::from("nft"),
            netns: None,
        }
    }
}

impl NftRunner {
    fn command(&self) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        }
    }

    /// Applies a script as one atomic transaction.
    pub fn apply(&self, script: &str) -> Result<(), NftError> {
        let out = crate::exec::run(
            self.command().args(["-f", "-"]),
            script.as_bytes(),
            NFT_TIMEOUT,
            NFT_MAX_OUTPUT,
        )
        .map_err(|e| self.failed(e))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(NftError::Rejected {
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                script_lines: script.lines().count(),
            })
        }
    }

    fn failed(&self, e: crate::exec::ExecError) -> NftError {
        NftError::Spawn {
            program: self.program.display().to_string(),
            reason: e.to_string(),
        }
    }

    /// Writes set and map elements over nfnetlink, in this runner's namespace.
    pub fn apply_elements(
        &self,
        table: &str,
        changes: &[crate::nft::elements::ElementChange],
    ) -> Result<(), crate::nft::elements::ElementError> {
        use crate::nft::elements::{ElementError, apply};
        if changes
            .iter()
            .all(|c| c.add.is_empty() && c.delete.is_empty())
        {
            return Ok(());
        }
        let Some(ns) = &self.netns else {
            return apply(table, changes);
        };
        // A thread of our own enters the namespace (setns changes only the calling thread).
        let path = format!("/run/netns/{ns}");
        let table = table.to_string();
        let changes = changes.to_vec();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let file = std::fs::File::open(&path)
                        .map_err(|e| ElementError::Io(format!("{path}: {e}")))?;
                    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| ElementError::Io(format!("entering {path}: {e}")))?;
                    apply(&table, &changes)
                })
                .join()
                .unwrap_or_else(|_| Err(ElementError::Io("element writer panicked".into())))
        })
    }

    /// The table as JSON, or None when it does not exist.
    pub fn list_table(&self, table: &str) -> Result<Option<Value>, NftError> {
        let out = crate::exec::run(
            self.command().args(["-j", "list", "table", "inet", table]),
            b"",
            NFT_TIMEOUT,
            NFT_MAX_OUTPUT,
        )
        .map_err(|e| self.failed(e))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("No such file or directory") {
                return Ok(None);
            }
            return Err(NftError::Unreadable(err.trim().to_string()));
        }
        serde_json::from_slice(&out.stdout)
            .map(Some)
            .map_err(|e| NftError::Unreadable(e.to_string()))
    }
}

fn element_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Object(o) => {
            if let Some(p) = o.get("prefix") {
                let addr = p.get("addr")?.as_str()?;
                let len = p.get("len")?.as_u64()?;
                return Some(format!("{addr}/{len}"));
            }
            if let Some(c) = o.get("concat") {
                let parts: Option<Vec<String>> = c.as_array()?.iter().map(element_string).collect();
                return Some(parts?.join(" . "));
            }
            if let Some(r) = o.get("range") {
                let r = r.as_array()?;
                return Some(format!(
                    "{}-{}",
                    element_string(r.first()?)?,
                    element_string(r.get(1)?)?
                ));
            }
            if let Some(e) = o.get("elem") {
                return element_string(e.get("val")?);
            }
            None
        }
        _ => None,
    }
}

fn verdict_string(v: &Value) -> Option<String> {
    let o = v.as_object()?;
    for kind in ["jump", "goto"] {
        if let Some(t) = o.get(kind) {
            return Some(format!("{kind} {}", t.get("target")?.as_str()?));
        }
    }
    for kind in ["accept", "drop", "return", "continue"] {
        if o.contains_key(kind) {
            return Some(kind.to_string());
        }
    }
    None
}

/// What the kernel's table holds. Anything unreadable is recorded so it compares unequal to
/// the desired state (and gets rewritten).
pub fn fingerprint(json: &Value) -> Result<Fingerprint, NftError> {
    let items = json
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| NftError::Unreadable("no \"nftables\" array".into()))?;
    let mut fp = Fingerprint {
        table_exists: true,
        ..Fingerprint::default()
    };
    for item in items {
        if let Some(set) = item.get("set") {
            let Some(name) = set.get("name").and_then(Value::as_str) else {
                continue;
            };
            // String-typed elements are written quoted; read them back the same way.
            let quoted = set.get("type").and_then(Value::as_str) == Some("ifname");
            let mut elems = BTreeSet::new();
            for e in set
                .get("elem")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let text = element_string(e).unwrap_or_else(|| format!("?{e}"));
                elems.insert(if quoted { format!("\"{text}\"") } else { text });
            }
            fp.sets.insert(name.to_string(), (None, elems));
        } else if let Some(map) = item.get("map") {
            let Some(name) = map.get("name").and_then(Value::as_str) else {
                continue;
            };
            // Interface names are rendered quoted; concatenations (services) are not.
            let quoted = map.get("type").and_then(Value::as_str) == Some("ifname");
            let mut elems = BTreeMap::new();
            for e in map
                .get("elem")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let pair = e.as_array();
                let key = pair.and_then(|p| p.first()).and_then(element_string);
                // Verdict maps hold verdicts; the services' backend maps hold `address . port`.
                let verdict = pair
                    .and_then(|p| p.get(1))
                    .and_then(|v| verdict_string(v).or_else(|| element_string(v)));
                if let (Some(k), Some(v)) = (key, verdict) {
                    elems.insert(if quoted { format!("\"{k}\"") } else { k }, v);
                } else {
                    elems.insert(format!("?{e}"), String::new());
                }
            }
            fp.maps.insert(name.to_string(), elems);
        } else if let Some(chain) = item.get("chain") {
            let Some(name) = chain.get("name").and_then(Value::as_str) else {
                continue;
            };
            // Base chains: compare hook and policy as a declaration string.
            let base = chain.get("hook").map(|hook| {
                format!(
                    "{}|{}|{}|{}",
                    chain.get("type").and_then(Value::as_str).unwrap_or(""),
                    hook.as_str().unwrap_or(""),
                    chain.get("prio").map(|p| p.to_string()).unwrap_or_default(),
                    chain.get("policy").and_then(Value::as_str).unwrap_or("")
                )
            });
            fp.chains.insert(name.to_string(), (base, Vec::new()));
        } else if let Some(rule) = item.get("rule") {
            let Some(chain) = rule.get("chain").and_then(Value::as_str) else {
                continue;
            };
            let hash = rule
                .get("comment")
                .and_then(Value::as_str)
                .and_then(|c| c.split_whitespace().next())
                .unwrap_or("?")
                .to_string();
            fp.chains
                .entry(chain.to_string())
                .or_insert((None, Vec::new()))
                .1
                .push(hash);
        }
    }
    Ok(fp)
}

/// Base chains read back carry the kernel's rendering of their declaration; this maps the
/// desired declaration to the same form so the two compare.
pub fn base_key(decl: &str) -> String {
    let word_after = |kw: &str| -> String {
        decl.split_whitespace()
            .skip_while(|w| *w != kw)
            .nth(1)
            .unwrap_or("")
            .trim_end_matches(';')
            .to_string()
    };
    let prio = match word_after("priority").as_str() {
        "filter" => "0".to_string(),
        "srcnat" => "100".to_string(),
        "dstnat" => "-100".to_string(),
        "raw" => "-300".to_string(),
        "mangle" => "-150".to_string(),
        other => other.to_string(),
    };
    format!(
        "{}|{}|{}|{}",
        word_after("type"),
        word_after("hook"),
        prio,
        word_after("policy")
    )
}
