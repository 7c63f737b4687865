//! Loading the policy object, pinning its maps, attaching its programs, writing map entries.
//!
//! Every call that names an interface works in the calling thread's network namespace: Felix
//! runs inside the node's namespace; tests call from a thread that joined theirs. Nothing
//! here ever attaches in a namespace the caller did not choose.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap, MapData, MapError, PerCpuHashMap};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::tc::{NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};

use crate::layout::*;
use crate::sync::{Kernel, Restored};

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
    /// tc clsact filters (not pinnable: they detach when the loader is dropped). TCX links
    /// are pinned under `<pin_dir>/links` and held by their pins only.
    tc: Option<[SchedClassifierLinkId; 2]>,
    mode: AttachMode,
}

const PROGS: [&str; 2] = ["mgy_from_wl", "mgy_to_wl"];
/// Services for traffic on the node's data interfaces (NodePorts, external IPs): tc ingress
/// (DNAT, replies) and egress (SNAT toward backends on other nodes).
const HOST_PROGS: [&str; 2] = ["mgy_host_in", "mgy_host_out"];
const HOOKS: [TcAttachType; 2] = [TcAttachType::Ingress, TcAttachType::Egress];
/// Link pins are `<pin_dir>/links/<hook>-<iface>` (bpffs refuses names with a dot: a dot in
/// the interface name is written `%2e`, a percent sign `%25`).
const HOOK_PINS: [&str; 2] = ["from_wl", "to_wl"];

/// What one conntrack garbage-collection pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtGc {
    pub scanned: usize,
    pub deleted: usize,
    pub live: usize,
}

/// CLOCK_MONOTONIC in ns: the clock of the program's `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| (t.tv_sec() as u64).saturating_mul(1_000_000_000) + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// What [`BpfMaps::load`] took over from a previous run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkRestore {
    /// Interfaces whose pinned links (both hooks) were live and are kept.
    pub interfaces: usize,
    /// Links whose program was replaced in place (its code changed) by a link update.
    pub programs_replaced: usize,
    /// Pins of gone interfaces or detached links, removed.
    pub stale_pins: usize,
}

/// The loaded object: programs verified, maps pinned.
pub struct BpfMaps {
    ebpf: Ebpf,
    eps: HashMap<MapData, [u8; 4], [u8; ENDPOINT_SIZE]>,
    rules: HashMap<MapData, [u8; RULE_KEY_SIZE], [u8; RULE_SIZE]>,
    steps: HashMap<MapData, [u8; RULE_KEY_SIZE], [u8; STEP_SIZE]>,
    blocks: HashMap<MapData, [u8; 4], [u8; BLOCK_SIZE]>,
    sets: LpmTrie<MapData, [u8; IPSET_DATA_SIZE], u32>,
    ct: HashMap<MapData, [u8; CT_KEY_SIZE], [u8; CT_VAL_SIZE]>,
    counters: PerCpuHashMap<MapData, [u8; RULE_KEY_SIZE], [u8; COUNTER_SIZE]>,
    attached: BTreeMap<String, Attached>,
    pin_dir: PathBuf,
    restored: Option<Restored>,
    link_restore: LinkRestore,
    /// The kernel's tags (instruction hashes) of the programs as loaded now.
    tags: [u64; 2],
    /// Data interfaces with the Services program (`mgy_host_in`, TCX ingress; not pinned:
    /// detached when the loader is dropped, attached again by the next run).
    host: BTreeMap<String, (u32, Vec<(usize, SchedClassifierLinkId)>)>,
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
    /// Loads the object with its maps pinned in `pin_dir` (created; must be on a bpffs)
    /// and both programs through the verifier, and takes over what a previous run left
    /// there: the maps keep their contents (see [`BpfMaps::take_restored`]) and live pinned
    /// links stay attached, their program replaced in place when its code changed.
    pub fn load(pin_dir: &Path) -> Result<BpfMaps, LoadError> {
        Self::load_with(pin_dir, false)
    }

    /// [`BpfMaps::load`]; `replace_programs` replaces the programs of adopted links even
    /// when their code is the same (tests exercise the upgrade path with it).
    pub fn load_with(pin_dir: &Path, replace_programs: bool) -> Result<BpfMaps, LoadError> {
        let links_dir = pin_dir.join("links");
        std::fs::create_dir_all(&links_dir).map_err(|e| LoadError::PinDir {
            dir: links_dir.display().to_string(),
            reason: e.to_string(),
        })?;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(pin_dir)
            .load(crate::POLICY_OBJ)
            .map_err(|e| LoadError::Object(format!("{e:#}")))?;
        let mut tags = [0u64; 2];
        for (hook, prog) in PROGS.into_iter().enumerate() {
            let p: &mut SchedClassifier = ebpf
                .program_mut(prog)
                .ok_or(LoadError::Missing(prog))?
                .try_into()
                .map_err(|e| LoadError::Object(format!("{prog}: {e}")))?;
            p.load().map_err(|e| LoadError::Verifier {
                prog,
                reason: verifier_text(&e),
            })?;
            tags[hook] = p
                .info()
                .map_err(|e| LoadError::Object(format!("{prog}: {e}")))?
                .tag();
        }
        // The Services programs for the node's data interfaces (svc.h).
        for prog in HOST_PROGS {
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
        let eps: HashMap<MapData, [u8; 4], [u8; ENDPOINT_SIZE]> =
            HashMap::try_from(take(&mut ebpf, "mgy_eps")?).map_err(bad("mgy_eps"))?;
        let rules: HashMap<MapData, [u8; RULE_KEY_SIZE], [u8; RULE_SIZE]> =
            HashMap::try_from(take(&mut ebpf, "mgy_rules")?).map_err(bad("mgy_rules"))?;
        let steps: HashMap<MapData, [u8; RULE_KEY_SIZE], [u8; STEP_SIZE]> =
            HashMap::try_from(take(&mut ebpf, "mgy_steps")?).map_err(bad("mgy_steps"))?;
        let blocks: HashMap<MapData, [u8; 4], [u8; BLOCK_SIZE]> =
            HashMap::try_from(take(&mut ebpf, "mgy_blocks")?).map_err(bad("mgy_blocks"))?;
        let sets: LpmTrie<MapData, [u8; IPSET_DATA_SIZE], u32> =
            LpmTrie::try_from(take(&mut ebpf, "mgy_ipsets")?).map_err(bad("mgy_ipsets"))?;
        let ct: HashMap<MapData, [u8; CT_KEY_SIZE], [u8; CT_VAL_SIZE]> =
            HashMap::try_from(take(&mut ebpf, "mgy_ct")?).map_err(bad("mgy_ct"))?;
        let counters: PerCpuHashMap<MapData, [u8; RULE_KEY_SIZE], [u8; COUNTER_SIZE]> =
            PerCpuHashMap::try_from(take(&mut ebpf, "mgy_counters")?)
                .map_err(bad("mgy_counters"))?;
        // Flow events stay off until a reader (Felix's flow logs) turns them on: a previous
        // run's reader is gone.
        let mut flow_cfg: aya::maps::Array<MapData, u32> =
            aya::maps::Array::try_from(take(&mut ebpf, "mgy_flow_cfg")?)
                .map_err(bad("mgy_flow_cfg"))?;
        flow_cfg.set(0, 0, 0).map_err(bad("mgy_flow_cfg"))?;
        // What the previous run wrote; the maps' sizes bound it.
        let mut restored = Restored::default();
        for (k, v) in eps.iter().filter_map(Result::ok) {
            restored
                .endpoints
                .insert(u32::from_ne_bytes(k), Endpoint::decode(&v));
        }
        for (k, v) in rules.iter().filter_map(Result::ok) {
            restored.rules.insert(decode_rule_key(&k), Rule::decode(&v));
        }
        for (k, v) in steps.iter().filter_map(Result::ok) {
            restored
                .steps
                .insert(decode_rule_key(&k), StepEnc::decode(&v));
        }
        for (k, v) in blocks.iter().filter_map(Result::ok) {
            restored
                .blocks
                .insert(u32::from_ne_bytes(k), Block::decode(&v));
        }
        for k in sets.keys().filter_map(Result::ok) {
            if let Some(e) = IpSetEntry::decode(k.prefix_len(), &k.data()) {
                restored.sets.push(e);
            }
        }
        let mut maps = BpfMaps {
            ebpf,
            eps,
            rules,
            steps,
            blocks,
            sets,
            ct,
            counters,
            attached: BTreeMap::new(),
            pin_dir: pin_dir.to_path_buf(),
            restored: Some(restored),
            link_restore: LinkRestore::default(),
            tags,
            host: BTreeMap::new(),
        };
        maps.adopt_links(replace_programs);
        Ok(maps)
    }

    /// Deletes the conntrack entries that are expired at `now_ns` (CLOCK_MONOTONIC, the
    /// program's clock; None: now): closed TCP flows 30 s after both FINs, reset ones after
    /// 40 s, idle ones after their state's timeout ([`ct_timeout`]). One pass reads every
    /// entry once (the map's size bounds the work) and deletes what it found expired.
    pub fn ct_gc(&mut self, now_ns: Option<u64>) -> CtGc {
        let now = now_ns.unwrap_or_else(monotonic_ns);
        let mut out = CtGc::default();
        let mut expired = Vec::new();
        for (k, v) in self.ct.iter().filter_map(Result::ok) {
            out.scanned += 1;
            if CtVal::decode(&v).expired(now) {
                expired.push(k);
            }
        }
        for k in expired {
            // An entry the program refreshed meanwhile is deleted too: its flow is judged
            // again (and recorded again) on its next packet, never let through unjudged.
            if gone_ok(self.ct.remove(&k)).is_ok() {
                out.deleted += 1;
            }
        }
        out.live = out.scanned - out.deleted;
        out
    }

    /// Per-rule counters: (rule slot, index) → (packets, bytes), summed over CPUs.
    pub fn counters(&self) -> BTreeMap<(u32, u32), (u64, u64)> {
        self.counters
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (decode_rule_key(&k), sum_counters(v.iter())))
            .collect()
    }

    /// Every conntrack entry (bounded by the map's size).
    pub fn ct_entries(&self) -> Vec<(CtKey, CtVal)> {
        self.ct
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (CtKey::decode(&k), CtVal::decode(&v)))
            .collect()
    }

    /// What the maps held at load, once (for [`crate::sync::Syncer::adopt`]).
    pub fn take_restored(&mut self) -> Restored {
        self.restored.take().unwrap_or_default()
    }

    /// What the load took over from the pinned links.
    pub fn link_restore(&self) -> &LinkRestore {
        &self.link_restore
    }

    fn link_pin(&self, iface: &str, hook: usize) -> PathBuf {
        let escaped = iface.replace('%', "%25").replace('.', "%2e");
        self.pin_dir
            .join("links")
            .join(format!("{}-{escaped}", HOOK_PINS[hook]))
    }

    /// Keeps the pinned TCX links that are still attached (so the old rules, in the kept
    /// maps, go on being enforced), replacing their program in place when its code
    /// changed; removes the pins of anything else.
    fn adopt_links(&mut self, replace_programs: bool) {
        let dir = self.pin_dir.join("links");
        let mut by_iface: BTreeMap<String, [Option<PathBuf>; 2]> = BTreeMap::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "cannot list pinned links: {e}");
                return;
            }
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let parsed = name.split_once('-').and_then(|(hook, iface)| {
                HOOK_PINS
                    .iter()
                    .position(|h| *h == hook)
                    .map(|h| (iface.replace("%2e", ".").replace("%25", "%"), h))
            });
            match parsed {
                Some((iface, h)) => by_iface.entry(iface).or_default()[h] = Some(path),
                None => {
                    // Only margay pins here; an unknown name is a leftover of another version.
                    let _ = std::fs::remove_file(&path);
                    self.link_restore.stale_pins += 1;
                }
            }
        }
        for (iface, pins) in by_iface {
            let ifindex = nix::net::if_::if_nametoindex(iface.as_str()).ok();
            let mut live: [Option<(FdLink, u64)>; 2] = [None, None];
            if ifindex.is_some() {
                for hook in 0..2 {
                    if let Some(p) = &pins[hook] {
                        live[hook] = live_link(&iface, hook, p);
                    }
                }
            }
            let (Some(ifindex), [Some(a), Some(b)]) = (ifindex, live) else {
                // Gone, recreated (the old link is not on it) or half attached: start over;
                // the first sync attaches again where an endpoint or guard wants programs.
                for p in pins.iter().flatten() {
                    let _ = std::fs::remove_file(p);
                    self.link_restore.stale_pins += 1;
                }
                continue;
            };
            for (hook, (link, tag)) in [a, b].into_iter().enumerate() {
                if !replace_programs && tag == self.tags[hook] {
                    continue;
                }
                // The program's code changed: a link update swaps it atomically.
                match self.replace_program(hook, link) {
                    Ok(()) => self.link_restore.programs_replaced += 1,
                    Err(e) => {
                        tracing::warn!(%iface, "replacing the program of a pinned link failed: {e}; the old program stays until the interface is attached again")
                    }
                }
            }
            self.attached.insert(
                iface,
                Attached {
                    ifindex,
                    tc: None,
                    mode: AttachMode::Tcx,
                },
            );
            self.link_restore.interfaces += 1;
        }
    }

    fn replace_program(&mut self, hook: usize, link: FdLink) -> Result<(), String> {
        let link = SchedClassifierLink::try_from(link).map_err(|e| e.to_string())?;
        let prog = self.prog(hook).ok_or("program missing")?;
        // The pin keeps the link; the id taken here only closes our descriptor on drop.
        prog.attach_to_link(link)
            .map(drop)
            .map_err(|e| format!("{e:#}"))
    }

    /// Detaches programs from every interface not in `keep` (what a previous run attached
    /// and no endpoint or guard claims any more). Returns how many.
    pub fn sweep(&mut self, keep: &std::collections::BTreeSet<String>) -> usize {
        let gone: Vec<String> = self
            .attached
            .keys()
            .filter(|n| !keep.contains(*n))
            .cloned()
            .collect();
        for n in &gone {
            tracing::info!(iface = %n, "eBPF: detaching programs left by a previous run");
            self.detach(n);
        }
        gone.len()
    }

    /// Detaches everything and unpins the links (switching the eBPF dataplane off; tests).
    /// The maps stay pinned.
    pub fn remove_all(mut self) {
        let names: Vec<String> = self.attached.keys().cloned().collect();
        for n in names {
            self.detach(&n);
        }
    }

    /// Attaches the Services programs to a data interface (TCX, else tc clsact); nothing
    /// when they are attached there already.
    pub fn attach_host(&mut self, iface: &str, ifindex: u32) -> Result<(), KernelError> {
        if self.host.get(iface).is_some_and(|(i, _)| *i == ifindex) {
            return Ok(());
        }
        self.detach_host(iface);
        let mut links = Vec::new();
        for (h, name) in HOST_PROGS.into_iter().enumerate() {
            let r = match self
                .ebpf
                .program_mut(name)
                .and_then(|p| TryInto::<&mut SchedClassifier>::try_into(p).ok())
            {
                Some(prog) => match prog.attach_with_options(
                    iface,
                    HOOKS[h],
                    TcAttachOptions::TcxOrder(LinkOrder::default()),
                ) {
                    Ok(id) => Ok(id),
                    Err(tcx) => {
                        let _ = aya::programs::tc::qdisc_add_clsact(iface);
                        prog.attach_with_options(
                            iface,
                            HOOKS[h],
                            TcAttachOptions::Netlink(NlOptions::default()),
                        )
                        .map_err(|tc| (format!("{tcx:#}"), format!("{tc:#}")))
                    }
                },
                None => Err(("program missing".into(), "program missing".into())),
            };
            match r {
                Ok(id) => links.push((h, id)),
                Err((tcx, tc)) => {
                    self.host.insert(iface.to_string(), (ifindex, links));
                    self.detach_host(iface);
                    return Err(KernelError::Attach {
                        iface: iface.to_string(),
                        tcx,
                        tc,
                    });
                }
            }
        }
        self.host.insert(iface.to_string(), (ifindex, links));
        Ok(())
    }

    /// Detaches the Services programs from a data interface (gone or no longer matching).
    pub fn detach_host(&mut self, iface: &str) {
        let Some((_, links)) = self.host.remove(iface) else {
            return;
        };
        for (h, id) in links {
            if let Some(p) = self
                .ebpf
                .program_mut(HOST_PROGS[h])
                .and_then(|p| TryInto::<&mut SchedClassifier>::try_into(p).ok())
            {
                // The interface may be gone, taking the attachment with it.
                let _ = p.detach(id);
            }
        }
    }

    /// Data interfaces with the Services programs.
    pub fn host_attached(&self) -> impl Iterator<Item = (&String, u32)> {
        self.host.iter().map(|(n, (i, _))| (n, *i))
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

    fn detach_links(&mut self, iface: &str, a: Attached) {
        match a.tc {
            Some(links) => {
                for (hook, link) in links.into_iter().enumerate() {
                    if let Some(p) = self.prog(hook) {
                        // The interface may be gone, taking the attachment with it.
                        let _ = p.detach(link);
                    }
                }
            }
            None => {
                // Nothing else holds a TCX link: removing its pin detaches it.
                for hook in 0..2 {
                    let _ = std::fs::remove_file(self.link_pin(iface, hook));
                }
            }
        }
    }

    /// Pins a fresh TCX link in place of whatever was pinned for (iface, hook). The new link
    /// is attached before the old pin goes, so the hook is never without a program.
    fn pin_link(
        &mut self,
        iface: &str,
        hook: usize,
        id: SchedClassifierLinkId,
    ) -> Result<(), String> {
        let path = self.link_pin(iface, hook);
        let prog = self.prog(hook).ok_or("program missing")?;
        let link = prog.take_link(id).map_err(|e| format!("{e:#}"))?;
        let fd = FdLink::try_from(link).map_err(|e| e.to_string())?;
        // (bpffs answers unlink of a missing name with EPERM, not ENOENT: look first.)
        if std::fs::symlink_metadata(&path).is_ok() {
            std::fs::remove_file(&path)
                .map_err(|e| format!("removing the old pin {}: {e}", path.display()))?;
        }
        fd.pin(&path)
            .map(drop)
            .map_err(|e| format!("pinning the link at {}: {e}", path.display()))
    }

    /// Attaches both hooks; TCX links are pinned (they then outlive the process), tc
    /// filters returned.
    fn try_attach(
        &mut self,
        iface: &str,
        mode: AttachMode,
    ) -> Result<Option<[SchedClassifierLinkId; 2]>, String> {
        let first = self.attach_one(iface, 0, mode)?;
        let second = match self.attach_one(iface, 1, mode) {
            Ok(second) => second,
            Err(e) => {
                if let Some(p) = self.prog(0) {
                    let _ = p.detach(first);
                }
                return Err(e);
            }
        };
        if mode == AttachMode::TcClsact {
            return Ok(Some([first, second]));
        }
        self.pin_link(iface, 0, first)?;
        self.pin_link(iface, 1, second)?;
        Ok(None)
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
        if let Some(old) = self.attached.remove(iface)
            && old.tc.is_some()
        {
            // A TCX link's pin is replaced by the new one below (no gap).
            self.detach_links(iface, old);
        }
        let (tc, mode) = match self.try_attach(iface, AttachMode::Tcx) {
            Ok(l) => (l, AttachMode::Tcx),
            Err(tcx) => {
                // Older kernels: the clsact qdisc (it may exist already).
                let _ = aya::programs::tc::qdisc_add_clsact(iface);
                match self.try_attach(iface, AttachMode::TcClsact) {
                    Ok(l) => {
                        tracing::warn!(%iface, "TCX attach failed ({tcx}); attached with tc clsact (not kept across restarts)");
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
        self.attached
            .insert(iface.to_string(), Attached { ifindex, tc, mode });
        Ok(())
    }

    fn detach(&mut self, iface: &str) {
        if let Some(a) = self.attached.remove(iface) {
            self.detach_links(iface, a);
        }
    }

    fn put_rule(&mut self, slot: u32, idx: u32, rule: &Rule) -> Result<(), KernelError> {
        self.rules
            .insert(rule_key(slot, idx), rule.encode(), 0)
            .map_err(map_err("mgy_rules"))
    }

    fn del_rule(&mut self, slot: u32, idx: u32) -> Result<(), KernelError> {
        gone_ok(self.rules.remove(&rule_key(slot, idx))).map_err(map_err("mgy_rules"))?;
        // Its counter goes with it (a reused slot counts afresh).
        gone_ok(self.counters.remove(&rule_key(slot, idx))).map_err(map_err("mgy_counters"))
    }

    fn put_step(&mut self, slot: u32, idx: u32, step: &StepEnc) -> Result<(), KernelError> {
        self.steps
            .insert(rule_key(slot, idx), step.encode(), 0)
            .map_err(map_err("mgy_steps"))
    }

    fn del_step(&mut self, slot: u32, idx: u32) -> Result<(), KernelError> {
        gone_ok(self.steps.remove(&rule_key(slot, idx))).map_err(map_err("mgy_steps"))
    }

    fn put_block(&mut self, id: u32, block: &Block) -> Result<(), KernelError> {
        self.blocks
            .insert(id.to_ne_bytes(), block.encode(), 0)
            .map_err(map_err("mgy_blocks"))
    }

    fn del_block(&mut self, id: u32) -> Result<(), KernelError> {
        gone_ok(self.blocks.remove(&id.to_ne_bytes())).map_err(map_err("mgy_blocks"))
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
        // TCX links stay pinned: the programs keep enforcing the maps' rules until the next
        // run adopts them (a Felix restart does not open the workloads). tc filters cannot
        // be adopted and are removed.
        let names: Vec<String> = self
            .attached
            .iter()
            .filter(|(_, a)| a.tc.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        for n in names {
            self.detach(&n);
        }
    }
}

/// The pinned link at `pin` if it is still attached to (iface, hook), with the tag of its
/// program. A link on a deleted interface, or one whose interface was recreated under the
/// same name, is not among the interface's attached programs.
fn live_link(iface: &str, hook: usize, pin: &Path) -> Option<(FdLink, u64)> {
    let link: FdLink = PinnedLink::from_pin(pin).ok()?.into();
    let prog_id = link.info().ok()?.program_id();
    let (_, progs) = SchedClassifier::query_tcx(iface, HOOKS[hook]).ok()?;
    let tag = progs.iter().find(|p| p.id() == prog_id)?.tag();
    Some((link, tag))
}
