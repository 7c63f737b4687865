//! The confd loop: inputs in, BIRD configuration out (I/O behind two small traits).
//!
//! - Nothing is rendered before the inputs are in sync (a partial view would drop peers).
//! - Bursts are coalesced: the first change after a render starts a debounce window, and one
//!   render covers everything that arrived in it.
//! - A file is written only when its text changed, only after BIRD accepted it, and
//!   atomically; BIRD is told to reconfigure only for a file that was written (or whose
//!   earlier reload failed). A rejected render keeps the old file and is reported.
//! - A periodic resync re-reads the password files and retries what failed.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use margay_api::net::Cidr;
use margay_datastore::Update;
use margay_ipam::block::AffinityState;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::model::{BirdInputs, SecretRef};
use crate::render::{RenderedConfig, render};

/// The two configurations, one per BIRD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    pub fn file_name(self) -> &'static str {
        match self {
            Family::V4 => "bird.cfg",
            Family::V6 => "bird6.cfg",
        }
    }

    fn index(self) -> usize {
        match self {
            Family::V4 => 0,
            Family::V6 => 1,
        }
    }
}

/// Checks and installs a configuration file.
pub trait ConfigSink {
    /// Validates `text` with BIRD and, if accepted, replaces the family's file atomically.
    /// `secret`: the text holds a password. The error says what BIRD objected to.
    fn install(&mut self, family: Family, text: &str, secret: bool) -> Result<(), String>;
}

/// Tells a BIRD to load its configuration again.
pub trait Reloader {
    fn reload(&mut self, family: Family) -> Result<(), String>;
}

/// Reads the password files the inputs refer to.
pub trait SecretSource {
    fn read(
        &mut self,
        refs: &BTreeSet<SecretRef>,
    ) -> (std::collections::BTreeMap<SecretRef, String>, Vec<String>);
}

/// What the daemon has done: logged after every render and written where health checks
/// can read it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Status {
    pub node: String,
    pub in_sync: bool,
    pub renders: u64,
    pub writes: u64,
    pub reloads: u64,
    pub render_errors: u64,
    pub validation_failures: u64,
    pub reload_failures: u64,
    /// The last render's problem (None: the last render was installed).
    pub last_error: Option<String>,
    pub warnings: Vec<String>,
    pub peers_v4: usize,
    pub peers_v6: usize,
    /// Reloads still owed (a reload failed; retried on the next change or resync).
    pub reload_pending: Vec<Family>,
}

impl Status {
    pub fn healthy(&self) -> bool {
        self.in_sync && self.last_error.is_none() && self.reload_pending.is_empty()
    }
}

/// The outcome of one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    pub written: Vec<Family>,
    pub reloaded: Vec<Family>,
    pub error: Option<String>,
}

/// Renders and installs; remembers what it installed so unchanged text does nothing.
pub struct Confd<S, R, P> {
    sink: S,
    reloader: Option<R>,
    secrets: P,
    installed: [Option<String>; 2],
    reload_owed: [bool; 2],
    pub status: Arc<Mutex<Status>>,
}

impl<S: ConfigSink, R: Reloader, P: SecretSource> Confd<S, R, P> {
    /// `reloader` None: never reconfigure BIRD (`--no-reload`).
    pub fn new(node: &str, sink: S, reloader: Option<R>, secrets: P) -> Self {
        let status = Status {
            node: node.to_string(),
            ..Status::default()
        };
        Confd {
            sink,
            reloader,
            secrets,
            installed: [None, None],
            reload_owed: [false, false],
            status: Arc::new(Mutex::new(status)),
        }
    }

    fn with_status(&self, f: impl FnOnce(&mut Status)) {
        match self.status.lock() {
            Ok(mut s) => f(&mut s),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    pub fn status(&self) -> Status {
        match self.status.lock() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub fn set_in_sync(&self) {
        self.with_status(|s| s.in_sync = true);
    }

    /// One pass: read passwords, render, install what changed, reload what was installed.
    pub fn pass(&mut self, inputs: &mut BirdInputs) -> Pass {
        let (found, problems) = self.secrets.read(&inputs.secret_refs());
        inputs.secrets = found;
        for p in &problems {
            tracing::warn!("BGP password: {p}");
        }
        self.with_status(|s| s.renders += 1);
        let cfg: RenderedConfig = match render(inputs) {
            Ok(c) => c,
            Err(e) => {
                let msg = format!("cannot render the BIRD configuration: {e}");
                tracing::error!("{msg}; keeping the current files");
                self.with_status(|s| {
                    s.render_errors += 1;
                    s.last_error = Some(msg.clone());
                });
                return Pass {
                    error: Some(msg),
                    ..Pass::default()
                };
            }
        };
        for w in &cfg.warnings {
            tracing::warn!("{w}");
        }
        let mut pass = Pass::default();
        let mut errors = Vec::new();
        for fam in Family::BOTH {
            let text = match fam {
                Family::V4 => &cfg.bird,
                Family::V6 => &cfg.bird6,
            };
            let i = fam.index();
            if self.installed[i].as_deref() != Some(text.as_str()) {
                match self.sink.install(fam, text, cfg.has_password) {
                    Ok(()) => {
                        self.installed[i] = Some(text.clone());
                        self.reload_owed[i] = true;
                        pass.written.push(fam);
                    }
                    Err(e) => {
                        let msg = format!(
                            "BIRD rejects the new {}: {e}; keeping the current file",
                            fam.file_name()
                        );
                        tracing::error!("{msg}");
                        self.with_status(|s| s.validation_failures += 1);
                        errors.push(msg);
                        continue;
                    }
                }
            }
            if !self.reload_owed[i] {
                continue;
            }
            let Some(r) = self.reloader.as_mut() else {
                self.reload_owed[i] = false;
                continue;
            };
            match r.reload(fam) {
                Ok(()) => {
                    self.reload_owed[i] = false;
                    pass.reloaded.push(fam);
                }
                Err(e) => {
                    let msg = format!(
                        "BIRD did not reconfigure from {}: {e}; retrying on the next change",
                        fam.file_name()
                    );
                    tracing::warn!("{msg}");
                    self.with_status(|s| s.reload_failures += 1);
                }
            }
        }
        pass.error = (!errors.is_empty()).then(|| errors.join("; "));
        let owed: Vec<Family> = Family::BOTH
            .into_iter()
            .filter(|f| self.reload_owed[f.index()])
            .collect();
        self.with_status(|s| {
            s.writes += pass.written.len() as u64;
            s.reloads += pass.reloaded.len() as u64;
            s.last_error = pass.error.clone();
            s.warnings = cfg.warnings.clone();
            s.peers_v4 = cfg.peers_v4;
            s.peers_v6 = cfg.peers_v6;
            s.reload_pending = owed;
        });
        let st = self.status();
        tracing::info!(
            peers_v4 = st.peers_v4,
            peers_v6 = st.peers_v6,
            written = ?pass.written,
            reloaded = ?pass.reloaded,
            warnings = st.warnings.len(),
            ok = pass.error.is_none(),
            "BIRD configuration rendered"
        );
        pass
    }
}

/// One input for the loop.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// v3 resource changes (syncer or Typha).
    Updates(Vec<Update>),
    /// This node's affinity for a block (None: gone).
    Affinity(Cidr, Option<AffinityState>),
    /// Everything has been listed once.
    InSync,
}

/// Loop settings.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Coalescing window after the first change.
    pub debounce: Duration,
    /// Re-read passwords and retry failures this often.
    pub resync: Duration,
    /// Render once in sync, then return.
    pub once: bool,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            debounce: Duration::from_millis(100),
            resync: Duration::from_secs(30),
            once: false,
        }
    }
}

/// Applies inputs; Some(true) when they changed what the renderer sees.
fn absorb(inputs: &mut BirdInputs, input: Input) -> bool {
    match input {
        Input::Updates(us) => {
            let mut changed = false;
            for u in us {
                changed |= inputs.apply(u.key.kind, &u.key.name, u.value);
            }
            changed
        }
        Input::Affinity(c, s) => inputs.set_affinity(c, s),
        Input::InSync => false,
    }
}

/// Runs until `rx` closes (returns the last pass) or, with `once`, after the first pass in
/// sync. `after_pass` sees the status after every pass (the edge writes the status file).
pub async fn run<S: ConfigSink, R: Reloader, P: SecretSource>(
    confd: &mut Confd<S, R, P>,
    mut inputs: BirdInputs,
    mut rx: mpsc::Receiver<Input>,
    opts: &LoopOptions,
    mut after_pass: impl FnMut(&Status),
) -> Option<Pass> {
    let mut in_sync = false;
    let mut dirty = true;
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut resync = tokio::time::interval(opts.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    resync.tick().await;
    let mut last = None;
    loop {
        let sleep_until = deadline.unwrap_or_else(|| tokio::time::Instant::now() + opts.resync);
        tokio::select! {
            msg = rx.recv() => {
                let Some(msg) = msg else { return last };
                if msg == Input::InSync && !in_sync {
                    in_sync = true;
                    confd.set_in_sync();
                    tracing::info!("in sync with the datastore");
                    // The first render comes at once: nothing is left to coalesce.
                    deadline = Some(tokio::time::Instant::now());
                    continue;
                }
                if absorb(&mut inputs, msg) {
                    dirty = true;
                    if in_sync && deadline.is_none() {
                        deadline = Some(tokio::time::Instant::now() + opts.debounce);
                    }
                }
            }
            _ = tokio::time::sleep_until(sleep_until), if deadline.is_some() => {
                deadline = None;
                if in_sync && dirty {
                    dirty = false;
                    let p = confd.pass(&mut inputs);
                    after_pass(&confd.status());
                    if opts.once {
                        return Some(p);
                    }
                    last = Some(p);
                }
            }
            _ = resync.tick() => {
                if in_sync {
                    // Passwords may have changed on disk; failures are retried.
                    let p = confd.pass(&mut inputs);
                    after_pass(&confd.status());
                    last = Some(p);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use margay_api::{Kind, Resource, ResourceKey};
    use margay_datastore::UpdateType;
    use std::collections::BTreeMap;

    #[derive(Default, Clone)]
    struct Record(Arc<Mutex<Vec<String>>>);
    impl Record {
        fn push(&self, s: String) {
            self.0.lock().expect("lock").push(s);
        }
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().expect("lock"))
        }
    }

    /// Installs into memory; rejects everything while `reject` is set.
    struct FakeSink {
        files: Arc<Mutex<BTreeMap<&'static str, String>>>,
        log: Record,
        reject: Arc<Mutex<bool>>,
    }
    impl ConfigSink for FakeSink {
        fn install(&mut self, f: Family, text: &str, _secret: bool) -> Result<(), String> {
            self.log.push(format!("install {}", f.file_name()));
            if *self.reject.lock().expect("lock") {
                return Err("syntax error, line 3".into());
            }
            self.files
                .lock()
                .expect("lock")
                .insert(f.file_name(), text.to_string());
            Ok(())
        }
    }
    struct FakeReload {
        log: Record,
        fail: Arc<Mutex<bool>>,
    }
    impl Reloader for FakeReload {
        fn reload(&mut self, f: Family) -> Result<(), String> {
            if *self.fail.lock().expect("lock") {
                return Err("connection refused".into());
            }
            self.log.push(format!("reload {}", f.file_name()));
            Ok(())
        }
    }
    struct NoSecrets;
    impl SecretSource for NoSecrets {
        fn read(&mut self, _: &BTreeSet<SecretRef>) -> (BTreeMap<SecretRef, String>, Vec<String>) {
            (BTreeMap::new(), Vec::new())
        }
    }

    struct Harness {
        confd: Confd<FakeSink, FakeReload, NoSecrets>,
        files: Arc<Mutex<BTreeMap<&'static str, String>>>,
        log: Record,
        fail_reload: Arc<Mutex<bool>>,
        reject: Arc<Mutex<bool>>,
    }

    fn harness() -> Harness {
        let log = Record::default();
        let files = Arc::new(Mutex::new(BTreeMap::new()));
        let fail_reload = Arc::new(Mutex::new(false));
        let reject = Arc::new(Mutex::new(false));
        let confd = Confd::new(
            "node1",
            FakeSink {
                files: files.clone(),
                log: log.clone(),
                reject: reject.clone(),
            },
            Some(FakeReload {
                log: log.clone(),
                fail: fail_reload.clone(),
            }),
            NoSecrets,
        );
        confd.set_in_sync();
        Harness {
            confd,
            files,
            log,
            fail_reload,
            reject,
        }
    }

    fn node(name: &str, ip: &str) -> Update {
        let yaml = format!(
            "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata:\n  name: {name}\nspec:\n  bgp:\n    ipv4Address: {ip}/24\n"
        );
        let r: Resource = margay_api::decode_one(&yaml).expect("node");
        Update {
            key: ResourceKey {
                kind: Kind::Node,
                namespace: String::new(),
                name: name.into(),
            },
            value: Some(r),
            revision: 1,
            update_type: UpdateType::New,
        }
    }

    fn cluster() -> BirdInputs {
        let mut inp = BirdInputs::new("node1");
        for (n, ip) in [("node1", "10.0.0.1"), ("node2", "10.0.0.2")] {
            absorb(&mut inp, Input::Updates(vec![node(n, ip)]));
        }
        inp
    }

    #[test]
    fn unchanged_render_writes_and_reloads_nothing() {
        let mut h = harness();
        let mut inp = cluster();
        let p = h.confd.pass(&mut inp);
        assert_eq!(p.written, vec![Family::V4, Family::V6]);
        assert_eq!(p.reloaded, vec![Family::V4, Family::V6]);
        h.log.take();
        let p = h.confd.pass(&mut inp);
        assert_eq!(p, Pass::default());
        assert!(h.log.take().is_empty(), "nothing installed or reloaded");
        // A change to the IPv4 sessions touches only bird.cfg.
        absorb(&mut inp, Input::Updates(vec![node("node3", "10.0.0.3")]));
        let p = h.confd.pass(&mut inp);
        assert_eq!(p.written, vec![Family::V4]);
        assert_eq!(h.log.take(), vec!["install bird.cfg", "reload bird.cfg"]);
        assert!(h.confd.status().healthy());
    }

    #[test]
    fn rejected_render_keeps_the_old_file_and_is_reported() {
        let mut h = harness();
        let mut inp = cluster();
        h.confd.pass(&mut inp);
        let good = h.files.lock().expect("lock").get("bird.cfg").cloned();
        *h.reject.lock().expect("lock") = true;
        absorb(&mut inp, Input::Updates(vec![node("node9", "10.0.0.9")]));
        h.log.take();
        let p = h.confd.pass(&mut inp);
        assert!(p.written.is_empty());
        assert!(
            p.error
                .as_deref()
                .is_some_and(|e| e.contains("syntax error"))
        );
        assert_eq!(h.files.lock().expect("lock").get("bird.cfg").cloned(), good);
        assert_eq!(
            h.log.take(),
            vec!["install bird.cfg"],
            "no reload of a rejected file"
        );
        let st = h.confd.status();
        assert_eq!(st.validation_failures, 1);
        assert!(!st.healthy());
        assert!(
            st.last_error
                .is_some_and(|e| e.contains("keeping the current file"))
        );
    }

    #[test]
    fn failed_reload_is_retried_until_it_works() {
        let mut h = harness();
        let mut inp = cluster();
        *h.fail_reload.lock().expect("lock") = true;
        let p = h.confd.pass(&mut inp);
        assert!(p.reloaded.is_empty());
        assert_eq!(
            h.confd.status().reload_pending,
            vec![Family::V4, Family::V6]
        );
        *h.fail_reload.lock().expect("lock") = false;
        let p = h.confd.pass(&mut inp);
        assert!(p.written.is_empty(), "the text did not change");
        assert_eq!(p.reloaded, vec![Family::V4, Family::V6]);
        assert!(h.confd.status().healthy());
    }

    #[test]
    fn render_error_keeps_files() {
        let mut h = harness();
        let mut inp = BirdInputs::new("absent");
        let p = h.confd.pass(&mut inp);
        assert!(p.error.is_some_and(|e| e.contains("no Node resource")));
        assert!(h.log.take().is_empty());
        assert_eq!(h.confd.status().render_errors, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_yields_one_render() {
        let mut h = harness();
        let (tx, rx) = mpsc::channel(1024);
        tx.send(Input::Updates(vec![node("node1", "10.0.0.1")]))
            .await
            .expect("send");
        tx.send(Input::InSync).await.expect("send");
        // A burst of 200 changes arriving together, after the first render.
        let feeder = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            for i in 2..202 {
                tx.send(Input::Updates(vec![node(
                    &format!("node{i}"),
                    &format!("10.0.{}.{}", i / 250, i % 250 + 1),
                )]))
                .await
                .expect("send");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        });
        let opts = LoopOptions::default();
        let mut statuses = Vec::new();
        let inputs = BirdInputs::new("node1");
        run(&mut h.confd, inputs, rx, &opts, |s| {
            statuses.push(s.clone())
        })
        .await;
        feeder.await.expect("feeder");
        let st = h.confd.status();
        // One render at in-sync, one for the whole burst.
        assert_eq!(st.renders, 2, "renders: {}", st.renders);
        assert_eq!(statuses.len(), 2);
        assert_eq!(statuses[0].peers_v4, 0);
        assert_eq!(st.peers_v4, 200, "the last render saw the whole burst");
    }

    #[tokio::test(start_paused = true)]
    async fn once_renders_after_in_sync_and_returns() {
        let mut h = harness();
        let (tx, rx) = mpsc::channel(16);
        for (n, ip) in [("node1", "10.0.0.1"), ("node2", "10.0.0.2")] {
            tx.send(Input::Updates(vec![node(n, ip)]))
                .await
                .expect("send");
        }
        tx.send(Input::InSync).await.expect("send");
        let opts = LoopOptions {
            once: true,
            ..LoopOptions::default()
        };
        let p = run(&mut h.confd, BirdInputs::new("node1"), rx, &opts, |_| {})
            .await
            .expect("a pass");
        assert_eq!(p.written, vec![Family::V4, Family::V6]);
        assert_eq!(h.confd.status().renders, 1);
        drop(tx);
    }
}
