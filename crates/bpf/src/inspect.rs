//! Reading what a Felix left pinned (`margay bpf`, like `calico-node -bpf`): the maps and the
//! TCX links under its pin directory, opened read-only by path. Nothing here writes a map
//! or needs Felix to run; every read is bounded by the maps' sizes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{HashMap, Map, MapData, PerCpuHashMap};
use aya::programs::links::{FdLink, PinnedLink};

use crate::layout::*;

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(
        "pin directory {0} not found: is Felix running with BPFEnabled=true on this node? \
         (its maps are under <bpffs>/margay/<node>; give --pin-dir or --node, and run this \
         in Felix's mount namespace)"
    )]
    NoPinDir(String),
    #[error(
        "{path}: cannot open the pinned map: {reason} (a pin directory of another margay \
         version, or not a margay pin directory)"
    )]
    Map { path: String, reason: String },
}

/// Removes a pin directory margay made: its link pins first (nothing else holds a TCX link,
/// so the programs detach), then its map pins (the maps are freed once no program uses
/// them), then the directory. For switching the eBPF dataplane off (`BPFEnabled=false`,
/// `margay bpf cleanup`): otherwise the programs would go on enforcing the last rules.
/// Only names margay pins are removed; returns how many pins went. A missing directory is
/// nothing to do.
pub fn remove_pins(dir: &Path) -> std::io::Result<usize> {
    if !dir.is_dir() {
        return Ok(0);
    }
    let mut n = 0;
    let links = dir.join("links");
    if let Ok(entries) = std::fs::read_dir(&links) {
        for e in entries.filter_map(Result::ok) {
            std::fs::remove_file(e.path())?;
            n += 1;
        }
        std::fs::remove_dir(&links)?;
    }
    for e in std::fs::read_dir(dir)?.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("mgy_") {
            std::fs::remove_file(e.path())?;
            n += 1;
        }
    }
    // Left in place when something else lives there.
    let _ = std::fs::remove_dir(dir);
    Ok(n)
}

/// One hook's attachment, from its link pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkPin {
    pub iface: String,
    /// "from_wl" (tc ingress: the workload's egress policy) or "to_wl".
    pub hook: String,
    /// The kernel's ids, None when the pin cannot be read.
    pub link_id: Option<u32>,
    pub program_id: Option<u32>,
}

/// One step of an endpoint hook, with its block's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepView {
    pub step: StepEnc,
    /// The block's entry (None: a deny step, or a block missing: the program drops).
    pub block: Option<Block>,
    pub rules: Vec<Rule>,
}

/// The maps of one pin directory.
pub struct Pinned {
    dir: PathBuf,
    eps: HashMap<MapData, [u8; 4], [u8; ENDPOINT_SIZE]>,
    steps: HashMap<MapData, [u8; RULE_KEY_SIZE], [u8; STEP_SIZE]>,
    blocks: HashMap<MapData, [u8; 4], [u8; BLOCK_SIZE]>,
    rules: HashMap<MapData, [u8; RULE_KEY_SIZE], [u8; RULE_SIZE]>,
    sets: LpmTrie<MapData, [u8; IPSET_DATA_SIZE], u32>,
    ct: HashMap<MapData, [u8; CT_KEY_SIZE], [u8; CT_VAL_SIZE]>,
    counters: PerCpuHashMap<MapData, [u8; RULE_KEY_SIZE], [u8; COUNTER_SIZE]>,
}

/// One rule's counter, with where the rule is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleCounter {
    pub block: u32,
    pub index: u32,
    pub packets: u64,
    pub bytes: u64,
    pub rule: Rule,
}

fn open(dir: &Path, name: &str) -> Result<MapData, InspectError> {
    let path = dir.join(name);
    MapData::from_pin(&path).map_err(|e| InspectError::Map {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

fn typed<T, E: std::fmt::Display>(
    dir: &Path,
    name: &str,
    r: Result<T, E>,
) -> Result<T, InspectError> {
    r.map_err(|e| InspectError::Map {
        path: dir.join(name).display().to_string(),
        reason: e.to_string(),
    })
}

impl Pinned {
    pub fn open(dir: &Path) -> Result<Pinned, InspectError> {
        if !dir.is_dir() {
            return Err(InspectError::NoPinDir(dir.display().to_string()));
        }
        Ok(Pinned {
            dir: dir.to_path_buf(),
            eps: typed(
                dir,
                "mgy_eps",
                HashMap::try_from(Map::HashMap(open(dir, "mgy_eps")?)),
            )?,
            steps: typed(
                dir,
                "mgy_steps",
                HashMap::try_from(Map::HashMap(open(dir, "mgy_steps")?)),
            )?,
            blocks: typed(
                dir,
                "mgy_blocks",
                HashMap::try_from(Map::HashMap(open(dir, "mgy_blocks")?)),
            )?,
            rules: typed(
                dir,
                "mgy_rules",
                HashMap::try_from(Map::HashMap(open(dir, "mgy_rules")?)),
            )?,
            sets: typed(
                dir,
                "mgy_ipsets",
                LpmTrie::try_from(Map::LpmTrie(open(dir, "mgy_ipsets")?)),
            )?,
            ct: typed(
                dir,
                "mgy_ct",
                HashMap::try_from(Map::LruHashMap(open(dir, "mgy_ct")?)),
            )?,
            counters: typed(
                dir,
                "mgy_counters",
                PerCpuHashMap::try_from(Map::PerCpuHashMap(open(dir, "mgy_counters")?)),
            )?,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The link pins (one per interface and hook), sorted.
    pub fn programs(&self) -> Vec<LinkPin> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.dir.join("links")) else {
            return out;
        };
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((hook, iface)) = name.split_once('-') else {
                continue;
            };
            let info = PinnedLink::from_pin(e.path())
                .ok()
                .map(FdLink::from)
                .and_then(|l| l.info().ok());
            out.push(LinkPin {
                iface: iface.replace("%2e", ".").replace("%25", "%"),
                hook: hook.to_string(),
                link_id: info.as_ref().map(|i| i.id()),
                program_id: info.as_ref().map(|i| i.program_id()),
            });
        }
        out.sort_by(|a, b| (&a.iface, &a.hook).cmp(&(&b.iface, &b.hook)));
        out
    }

    /// Endpoint entries by ifindex.
    pub fn endpoints(&self) -> BTreeMap<u32, Endpoint> {
        self.eps
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (u32::from_ne_bytes(k), Endpoint::decode(&v)))
            .collect()
    }

    /// An endpoint's steps per hook ([`HOOK_FROM_WL`], [`HOOK_TO_WL`]) with their rules;
    /// None when the interface has no entry (its program drops everything).
    pub fn policy(&self, ifindex: u32) -> Option<[Vec<StepView>; 2]> {
        let ep = self
            .eps
            .get(&ifindex.to_ne_bytes(), 0)
            .ok()
            .map(|v| Endpoint::decode(&v))?;
        Some([0, 1].map(|h| {
            (0..ep.count[h].min(MAX_RULES as u32))
                .map(|i| {
                    let step = self
                        .steps
                        .get(&rule_key(ep.slot[h], i), 0)
                        .map(|v| StepEnc::decode(&v))
                        .unwrap_or(StepEnc {
                            kind: u32::MAX,
                            block: 0,
                            pass_to: 0,
                        });
                    let block = (step.kind == STEP_BLOCK)
                        .then(|| self.blocks.get(&step.block.to_ne_bytes(), 0).ok())
                        .flatten()
                        .map(|v| Block::decode(&v));
                    let rules = block
                        .map(|b| {
                            (0..b.count.min(MAX_RULES as u32))
                                .filter_map(|j| {
                                    self.rules
                                        .get(&rule_key(b.slot, j), 0)
                                        .ok()
                                        .map(|v| Rule::decode(&v))
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    StepView { step, block, rules }
                })
                .collect()
        }))
    }

    /// IP-set entries by set id.
    pub fn ipsets(&self) -> BTreeMap<u32, Vec<IpSetEntry>> {
        let mut out: BTreeMap<u32, Vec<IpSetEntry>> = BTreeMap::new();
        for k in self.sets.keys().filter_map(Result::ok) {
            if let Some(e) = IpSetEntry::decode(k.prefix_len(), &k.data()) {
                out.entry(e.set_id).or_default().push(e);
            }
        }
        out
    }

    /// Conntrack entries.
    pub fn conntrack(&self) -> Vec<(CtKey, CtVal)> {
        self.ct
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (CtKey::decode(&k), CtVal::decode(&v)))
            .collect()
    }

    /// Counters of the rules of every current block (rules that decided nothing yet show
    /// zero), by block id and rule index.
    pub fn counters(&self) -> Vec<RuleCounter> {
        let counts: BTreeMap<(u32, u32), (u64, u64)> = self
            .counters
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (decode_rule_key(&k), sum_counters(v.iter())))
            .collect();
        let mut blocks: Vec<(u32, Block)> = self
            .blocks
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (u32::from_ne_bytes(k), Block::decode(&v)))
            .collect();
        blocks.sort_unstable_by_key(|(id, _)| *id);
        let mut out = Vec::new();
        for (id, b) in blocks {
            for i in 0..b.count.min(MAX_RULES as u32) {
                let Ok(rule) = self.rules.get(&rule_key(b.slot, i), 0) else {
                    continue;
                };
                let (packets, bytes) = counts.get(&(b.slot, i)).copied().unwrap_or((0, 0));
                out.push(RuleCounter {
                    block: id,
                    index: i,
                    packets,
                    bytes,
                    rule: Rule::decode(&rule),
                });
            }
        }
        out
    }

    /// How many blocks and rules are stored.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.blocks.keys().filter_map(Result::ok).count(),
            self.rules.keys().filter_map(Result::ok).count(),
        )
    }
}
