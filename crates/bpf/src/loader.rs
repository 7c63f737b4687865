//! Loading the policy object, pinning its maps, attaching its programs, writing map entries.
//!
//! Every call that names an interface works in the calling thread's network namespace: Felix
//! runs inside the node's namespace; tests call from a thread that joined theirs. Nothing
//! here ever attaches in a namespace the caller did not choose.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap, MapData, MapError};
use aya::programs::tc::{NlOptions, SchedClassifierLinkId, TcAttachOptions};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};

use crate::layout::*;
use crate::sync::Kernel;

/// The bpffs magic number (statfs f_type).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "cannot mount a BPF filesystem on {dir}: {reason} (Felix needs CAP_SYS_ADMIN for the \
         eBPF dataplane, or mount one first: mount -t bpf bpf {dir})"
    )]
    Mount { dir: String, reason: String },
    #[error("cannot create the pin directory {dir}: {reason}")]
    PinDir { dir: String, reason: String },
    #[error(
        "loading the eBPF object failed: {0} (a kernel without BPF, BTF or bpf_loop (5.17+), or \
         missing CAP_BPF/CAP_NET_ADMIN)"
    )]
    Object(String),
    #[error("the kernel's verifier refused program {prog}: {reason}")]
    Verifier { prog: &'static str, reason: String },
    #[error("the object has no map or program {0} (a build mismatch; rebuild margay)")]
    Missing(&'static str),
    #[error("map {map}: {reason}")]
    Map { map: &'static str, reason: String },
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{map} map: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error(
        "attaching to {iface} failed with TCX ({tcx}) and with tc clsact ({tc}); the interface \
         keeps no policy program and its endpoint is retried"
    )]
    Attach {
        iface: String,
        tcx: String,
        tc: String,
    },
}

/// Is `dir` (or the filesystem it is on) a BPF filesystem?
pub fn is_bpffs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .map(|s| s.filesystem_type().0 == BPF_FS_MAGIC)
        .unwrap_or(false)
}

/// Mounts a BPF filesystem on `mountpoint` unless one is there. Each bpffs mount is its own
/// instance, so this never changes what other mounts show. Returns true when it mounted.
pub fn ensure_bpffs(mountpoint: &Path) -> Result<bool, LoadError> {
    if is_bpffs(mountpoint) {
        return Ok(false);
    }
    let e = |reason: String| LoadError::Mount {
        dir: mountpoint.display().to_string(),
        reason,
    };
    std::fs::create_dir_all(mountpoint).map_err(|x| e(x.to_string()))?;
    nix::mount::mount(
        Some("bpf"),
        mountpoint,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|x| e(x.to_string()))?;
    Ok(true)
}

/// Where a Felix instance pins its maps: `<root>/<node>`, unique per node so that several
/// Felix processes on one machine (the lab) never share maps.
pub fn pin_dir_for(root: &Path, node: &str) -> PathBuf {
    let clean: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    root.join(if clean.is_empty() { "_" } else { &clean })
}

/// How a program got attached to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    Tcx,
    TcClsact,
}

struct Attached {
    ifindex: u32,
    links: [SchedClassifierLinkId; 2],
    mode: AttachMode,
}

const PROGS: [&str; 2] = ["mgy_from_wl", "mgy_to_wl"];
const HOOKS: [TcAttachType; 2] = [TcAttachType::Ingress, TcAttachType::Egress];

/// The loaded object: programs verified, maps pinned.
pub struct BpfMaps {
    ebpf: Ebpf,
    eps: HashMap<MapData, [u8; 4], [u8; ENDPOINT_SIZE]>,
    rules: HashMap<MapData, [u8; RULE_KEY_SIZE], [u8; RULE_SIZE]>,
    sets: LpmTrie<MapData, [u8; IPSET_DATA_SIZE], u32>,
    attached: BTreeMap<String, Attached>,
    pin_dir: PathBuf,
}

fn map_err(map: &'static str) -> impl FnOnce(MapError) -> KernelError {
    move |source| KernelError::Map { map, source }
}

/// Not-found on delete is success: the entry is gone either way.
fn gone_ok(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) | Err(MapError::ElementNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(2) => Ok(()),
        other => other,
    }
}

impl BpfMaps {
    /// Loads the object with its maps pinned in `pin_dir` (created; must be on a bpffs),
    /// loads both programs through the verifier, and clears the endpoint, rule and set maps
    /// left by an earlier run (restoring them is later work; conntrack is kept).
    pub fn load(pin_dir: &Path) -> Result<BpfMaps, LoadError> {
        std::fs::create_dir_all(pin_dir).map_err(|e| LoadError::PinDir {
            dir: pin_dir.display().to_string(),
            reason: e.to_string(),
        })?;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(pin_dir)
            .load(crate::POLICY_OBJ)
            .map_err(|e| LoadError::Object(format!("{e:#}")))?;
        for prog in PROGS {
            let p: &mut SchedClassifier = ebpf
                .program_mut(prog)
                .ok_or(LoadError::Missing(prog))?
                .try_into()
                .map_err(|e| LoadError::Object(format!("{prog}: {e}")))?;
            p.load().map_err(|e| LoadError::Verifier {
                prog,
                reason: verifier_text(&e),
            })?;
        }
        let take = |ebpf: &mut Ebpf, name: &'static str| {
            ebpf.take_map(name).ok_or(LoadError::Missing(name))
        };
        let bad = |map: &'static str| {
            move |e: MapError| LoadError::Map {
                map,
                reason: e.to_string(),
            }
        };
        let mut eps: HashMap<MapData, [u8; 4], [u8; ENDPOINT_SIZE]> =
            HashMap::try_from(take(&mut ebpf, "mgy_eps")?).map_err(bad("mgy_eps"))?;
        let mut rules: HashMap<MapData, [u8; RULE_KEY_SIZE], [u8; RULE_SIZE]> =
            HashMap::try_from(take(&mut ebpf, "mgy_rules")?).map_err(bad("mgy_rules"))?;
        let mut sets: LpmTrie<MapData, [u8; IPSET_DATA_SIZE], u32> =
            LpmTrie::try_from(take(&mut ebpf, "mgy_ipsets")?).map_err(bad("mgy_ipsets"))?;
        // Leftovers of an earlier run. Keys are collected first: deleting while iterating
        // a hash map can skip entries.
        let ks: Vec<_> = eps.keys().filter_map(Result::ok).collect();
        for k in ks {
            gone_ok(eps.remove(&k)).map_err(bad("mgy_eps"))?;
        }
        let ks: Vec<_> = rules.keys().filter_map(Result::ok).collect();
        for k in ks {
            gone_ok(rules.remove(&k)).map_err(bad("mgy_rules"))?;
        }
        let ks: Vec<_> = sets.keys().filter_map(Result::ok).collect();
        for k in ks {
            gone_ok(sets.remove(&k)).map_err(bad("mgy_ipsets"))?;
        }
        Ok(BpfMaps {
            ebpf,
            eps,
            rules,
            sets,
            attached: BTreeMap::new(),
            pin_dir: pin_dir.to_path_buf(),
        })
    }

    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Interfaces with programs attached, and how.
    pub fn attached(&self) -> impl Iterator<Item = (&String, u32, AttachMode)> {
        self.attached.iter().map(|(n, a)| (n, a.ifindex, a.mode))
    }

    fn prog(&mut self, hook: usize) -> Option<&mut SchedClassifier> {
        self.ebpf
            .program_mut(PROGS[hook])
            .and_then(|p| p.try_into().ok())
    }

    fn attach_one(
        &mut self,
        iface: &str,
        hook: usize,
        mode: AttachMode,
    ) -> Result<SchedClassifierLinkId, String> {
        let prog = self.prog(hook).ok_or("program missing")?;
        let opts = match mode {
            AttachMode::Tcx => TcAttachOptions::TcxOrder(LinkOrder::default()),
            AttachMode::TcClsact => TcAttachOptions::Netlink(NlOptions::default()),
        };
        prog.attach_with_options(iface, HOOKS[hook], opts)
            .map_err(|e| format!("{e:#}"))
    }

    fn detach_links(&mut self, a: Attached) {
        for (hook, link) in a.links.into_iter().enumerate() {
            if let Some(p) = self.prog(hook) {
                // The interface may be gone, taking the attachment with it.
                let _ = p.detach(link);
            }
        }
    }

    fn try_attach(
        &mut self,
        iface: &str,
        mode: AttachMode,
    ) -> Result<[SchedClassifierLinkId; 2], String> {
        let first = self.attach_one(iface, 0, mode)?;
        match self.attach_one(iface, 1, mode) {
            Ok(second) => Ok([first, second]),
            Err(e) => {
                if let Some(p) = self.prog(0) {
                    let _ = p.detach(first);
                }
                Err(e)
            }
        }
    }
}

/// The verifier's log is long; its last lines say why.
fn verifier_text(e: &aya::programs::ProgramError) -> String {
    let full = format!("{e:#}");
    let lines: Vec<&str> = full.lines().collect();
    let tail = lines.len().saturating_sub(20);
    lines[tail..].join("\n")
}

impl Kernel for BpfMaps {
    type Error = KernelError;

    fn ifindex(&self, iface: &str) -> Option<u32> {
        nix::net::if_::if_nametoindex(iface).ok()
    }

    fn interfaces(&self) -> Vec<(String, u32)> {
        nix::net::if_::if_nameindex()
            .map(|l| {
                l.iter()
                    .map(|i| (i.name().to_string_lossy().into_owned(), i.index()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn attach(&mut self, iface: &str, ifindex: u32) -> Result<(), KernelError> {
        if self
            .attached
            .get(iface)
            .is_some_and(|a| a.ifindex == ifindex)
        {
            return Ok(());
        }
        if let Some(old) = self.attached.remove(iface) {
            self.detach_links(old);
        }
        let (links, mode) = match self.try_attach(iface, AttachMode::Tcx) {
            Ok(l) => (l, AttachMode::Tcx),
            Err(tcx) => {
                // Older kernels: the clsact qdisc (it may exist already).
                let _ = aya::programs::tc::qdisc_add_clsact(iface);
                match self.try_attach(iface, AttachMode::TcClsact) {
                    Ok(l) => {
                        tracing::info!(%iface, "TCX attach failed ({tcx}); attached with tc clsact");
                        (l, AttachMode::TcClsact)
                    }
                    Err(tc) => {
                        return Err(KernelError::Attach {
                            iface: iface.to_string(),
                            tcx,
                            tc,
                        });
                    }
                }
            }
        };
        self.attached.insert(
            iface.to_string(),
            Attached {
                ifindex,
                links,
                mode,
            },
        );
        Ok(())
    }

    fn detach(&mut self, iface: &str) {
        if let Some(a) = self.attached.remove(iface) {
            self.detach_links(a);
        }
    }

    fn put_rule(&mut self, slot: u32, idx: u32, rule: &Rule) -> Result<(), KernelError> {
        self.rules
            .insert(rule_key(slot, idx), rule.encode(), 0)
            .map_err(map_err("mgy_rules"))
    }

    fn del_rule(&mut self, slot: u32, idx: u32) -> Result<(), KernelError> {
        gone_ok(self.rules.remove(&rule_key(slot, idx))).map_err(map_err("mgy_rules"))
    }

    fn put_endpoint(&mut self, ifindex: u32, ep: &Endpoint) -> Result<(), KernelError> {
        self.eps
            .insert(ifindex.to_ne_bytes(), ep.encode(), 0)
            .map_err(map_err("mgy_eps"))
    }

    fn del_endpoint(&mut self, ifindex: u32) -> Result<(), KernelError> {
        gone_ok(self.eps.remove(&ifindex.to_ne_bytes())).map_err(map_err("mgy_eps"))
    }

    fn put_set_entry(&mut self, e: &IpSetEntry) -> Result<(), KernelError> {
        let (plen, data) = e.key();
        self.sets
            .insert(&Key::new(plen, data), 1, 0)
            .map_err(map_err("mgy_ipsets"))
    }

    fn del_set_entry(&mut self, e: &IpSetEntry) -> Result<(), KernelError> {
        let (plen, data) = e.key();
        gone_ok(self.sets.remove(&Key::new(plen, data))).map_err(map_err("mgy_ipsets"))
    }
}

impl Drop for BpfMaps {
    fn drop(&mut self) {
        // Links are not pinned in this milestone: dropping the object detaches everything.
        let names: Vec<String> = self.attached.keys().cloned().collect();
        for n in names {
            self.detach(&n);
        }
    }
}
