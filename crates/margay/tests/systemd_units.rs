//! The installs without Kubernetes (`deploy/systemd`): each unit passes `systemd-analyze
//! verify`, the man pages its Documentation= names are generated, and the units' own command
//! lines and environment files bring up a host against a real (TLS) etcd — start-up, Felix,
//! Typha and confd, run as systemd would run them (ExecStartPre/ExecStart, EnvironmentFile=,
//! Environment=). A test machine differs from a host in the few settings `host_overrides`
//! lists (ports, paths under a temp directory, certificates, a recording dataplane); nothing
//! else is changed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use margay_testkit::etcd::{EtcdServer, TestPki};
use margay_testkit::free_port;
use margay_testkit::roles::{Node, Role};

fn margay() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_margay"))
}

fn systemd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd")
}

fn unit_files() -> Vec<PathBuf> {
    let mut units: Vec<PathBuf> = std::fs::read_dir(systemd_dir())
        .expect("deploy/systemd")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "service"))
        .collect();
    units.sort();
    units
}

/// A unit file as systemd reads it: `[Section]` then `Key=Value` lines, repeated keys kept in
/// order.
struct Unit {
    name: String,
    entries: Vec<(String, String, String)>,
}

impl Unit {
    fn load(path: &Path) -> Unit {
        let text = std::fs::read_to_string(path).expect("unit file");
        let mut section = String::new();
        let mut entries = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = s.to_string();
            } else if let Some((k, v)) = line.split_once('=') {
                entries.push((section.clone(), k.trim().to_string(), v.trim().to_string()));
            }
        }
        Unit {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            entries,
        }
    }

    fn all(&self, section: &str, key: &str) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(s, k, _)| s == section && k == key)
            .map(|(_, _, v)| v.as_str())
            .collect()
    }

    fn one(&self, section: &str, key: &str) -> &str {
        let all = self.all(section, key);
        assert_eq!(all.len(), 1, "{}: one {section}.{key}", self.name);
        all[0]
    }
}

/// KEY=VALUE lines of an environment file (comments and blank lines skipped, surrounding
/// quotes removed), as systemd's EnvironmentFile= reads them.
fn read_env_file(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).expect("environment file");
    let mut env = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let (k, v) = line.split_once('=').expect("KEY=VALUE");
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        env.insert(k.trim().to_string(), v.to_string());
    }
    env
}

/// The unit's environment: its EnvironmentFile= files (from deploy/systemd, by base name;
/// `-` marks an optional one) and Environment= lines, then the test machine's overrides.
fn unit_env(unit: &Unit, overrides: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for file in unit.all("Service", "EnvironmentFile") {
        let optional = file.starts_with('-');
        let base = Path::new(file.trim_start_matches('-'))
            .file_name()
            .expect("file name")
            .to_owned();
        let local = systemd_dir().join(base);
        if optional && !local.exists() {
            continue;
        }
        env.extend(read_env_file(&local));
    }
    for line in unit.all("Service", "Environment") {
        let (k, v) = line.split_once('=').expect("Environment=KEY=VALUE");
        env.insert(k.to_string(), v.to_string());
    }
    env.extend(overrides.clone());
    env
}

/// One Exec line as a command: the installed binary path becomes the one under test; `args`
/// are appended (only where a host path must move under the test's directory).
fn exec_command(node: &Node, line: &str, env: &BTreeMap<String, String>, args: &[&str]) -> Command {
    let mut words = line.split_whitespace();
    let program = words.next().expect("Exec line");
    let program = match program {
        "/usr/local/bin/margay" => margay(),
        other => PathBuf::from(other),
    };
    let mut cmd = node.command(&program);
    cmd.args(words).args(args);
    cmd.env_clear();
    cmd.env("PATH", std::env::var_os("PATH").unwrap_or_default());
    cmd.envs(env);
    cmd
}

#[test]
fn units_pass_systemd_analyze_verify_and_their_man_pages_exist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let units = unit_files();
    assert!(units.len() >= 5, "deploy/systemd has {} units", units.len());
    // Man pages, generated by the binary itself.
    let man = dir.path().join("man");
    let out = Command::new(margay())
        .args(["man", "--dir"])
        .arg(&man)
        .output()
        .expect("margay man");
    assert!(out.status.success(), "{out:?}");
    for unit_path in &units {
        let unit = Unit::load(unit_path);
        for doc in unit.all("Unit", "Documentation") {
            for page in doc.split_whitespace() {
                let Some(page) = page.strip_prefix("man:margay") else {
                    continue;
                };
                // man:margay-felix(8) → margay-felix.8
                let (name, section) = page.trim_end_matches(')').split_once('(').expect("(n)");
                let file = man.join(format!("margay{name}.{section}"));
                assert!(
                    file.exists(),
                    "{}: no man page {}",
                    unit.name,
                    file.display()
                );
            }
        }
        // The installed binary's path becomes the one under test; everything else is as shipped.
        let text = std::fs::read_to_string(unit_path)
            .expect("unit")
            .replace("/usr/local/bin/margay", &margay().to_string_lossy());
        std::fs::write(dir.path().join(&unit.name), text).expect("write unit");
    }
    let names: Vec<PathBuf> = units
        .iter()
        .map(|u| dir.path().join(u.file_name().expect("name")))
        .collect();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&names)
        .output()
        .expect("systemd-analyze (install systemd: scripts/setup)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

#[test]
fn the_environment_files_name_only_settings_margay_reads() {
    for file in ["margay.env", "typha.env"] {
        for key in read_env_file(&systemd_dir().join(file)).keys() {
            let known = match key.strip_prefix("FELIX_") {
                Some(param) => margay_felix_config::ParamId::from_name(param).is_some(),
                None => key.starts_with("TYPHA_") || STARTUP_AND_DATASTORE.contains(&key.as_str()),
            };
            assert!(known, "{file}: {key} is not a setting margay reads");
        }
    }
}

/// The non-FELIX_/TYPHA_ variables the environment files may use (start-up's and the
/// datastore's, as `margay node startup --help` lists them).
const STARTUP_AND_DATASTORE: &[&str] = &[
    "DATASTORE_TYPE",
    "ETCD_ENDPOINTS",
    "ETCD_CA_CERT_FILE",
    "ETCD_CERT_FILE",
    "ETCD_KEY_FILE",
    "NODENAME",
    "IP",
    "IP_AUTODETECTION_METHOD",
    "AS",
    "CALICO_NETWORKING_BACKEND",
    "CALICO_IPV4POOL_CIDR",
    "CALICO_IPV4POOL_IPIP",
    "CALICO_IPV4POOL_VXLAN",
    "CALICO_IPV4POOL_NAT_OUTGOING",
    "WAIT_FOR_DATASTORE",
];

/// What a test machine must change: the datastore and certificates it made, free ports,
/// paths under the test's directory, no kernel changes from Felix.
struct Host {
    node: Node,
    _pki_dir: tempfile::TempDir,
    pki: TestPki,
    etcd: EtcdServer,
    name: String,
}

impl Host {
    fn new() -> Host {
        let pki_dir = tempfile::tempdir().expect("tempdir");
        let pki = TestPki::generate(pki_dir.path()).expect("test PKI");
        let etcd = EtcdServer::start_tls(&pki).expect("etcd");
        let node = Node::new("systemd").expect("node dir");
        let name = format!("sd-host-{}", std::process::id());
        Host {
            node,
            _pki_dir: pki_dir,
            pki,
            etcd,
            name,
        }
    }

    fn host_overrides(&self, extra: &[(&str, String)]) -> BTreeMap<String, String> {
        let p = |p: &Path| p.to_string_lossy().into_owned();
        let mut o: BTreeMap<String, String> = [
            ("ETCD_ENDPOINTS", self.etcd.endpoint()),
            ("ETCD_CA_CERT_FILE", p(&self.pki.ca)),
            ("ETCD_CERT_FILE", p(&self.pki.client_cert)),
            ("ETCD_KEY_FILE", p(&self.pki.client_key)),
            ("NODENAME", self.name.clone()),
            // The address autodetection reads the machine's interfaces; registering a fixed
            // one keeps the test independent of them.
            ("IP", "192.0.2.10/24".into()),
            (
                "CALICO_NODENAME_FILE",
                p(&self.node.file("var/lib/calico/nodename")),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        o.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        o
    }

    fn unit(&self, name: &str) -> Unit {
        Unit::load(&systemd_dir().join(name))
    }

    /// Runs each ExecStartPre line to completion, then spawns ExecStart.
    fn start(&self, unit_name: &str, overrides: &BTreeMap<String, String>, args: &[&str]) -> Role {
        let unit = self.unit(unit_name);
        let env = unit_env(&unit, overrides);
        for (i, pre) in unit.all("Service", "ExecStartPre").into_iter().enumerate() {
            if pre.starts_with("/usr/bin/mkdir") {
                continue; // host directories; the test's live under its own directory
            }
            let cmd = exec_command(&self.node, pre, &env, &[]);
            self.node
                .run_ok(&format!("{unit_name}-pre{i}"), cmd, Duration::from_secs(60));
        }
        let cmd = exec_command(&self.node, unit.one("Service", "ExecStart"), &env, args);
        self.node.spawn(unit_name, cmd)
    }
}

#[test]
fn the_units_bring_up_a_host_against_etcd() {
    let host = Host::new();
    let root = host.node.path().to_string_lossy().into_owned();

    // margay-node.service: Type=oneshot, must exit 0 and register the node.
    let startup = host.unit("margay-node.service");
    assert_eq!(startup.one("Service", "Type"), "oneshot");
    let env = unit_env(&startup, &host.host_overrides(&[]));
    let cmd = exec_command(
        &host.node,
        startup.one("Service", "ExecStart"),
        &env,
        &["--root", &root],
    );
    host.node
        .run_ok("margay-node.service", cmd, Duration::from_secs(90));
    let nodename = std::fs::read_to_string(host.node.file("var/lib/calico/nodename"))
        .expect("start-up wrote the node name file");
    assert_eq!(nodename.trim(), host.name);
    let env = unit_env(&startup, &host.host_overrides(&[]));
    let mut get = Command::new(margay());
    get.args(["ctl", "get", "nodes", "-o", "wide"])
        .env_clear()
        .envs(&env);
    let out = get.output().expect("margay ctl get nodes");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && table.contains(&host.name) && table.contains("192.0.2.10"),
        "ctl get nodes: {out:?}"
    );
    let out = Command::new(margay())
        .args(["ctl", "get", "ippools", "-o", "yaml"])
        .env_clear()
        .envs(&env)
        .output()
        .expect("ctl get ippools");
    let pools = String::from_utf8_lossy(&out.stdout);
    assert!(
        pools.contains("192.168.0.0/16") && pools.contains("natOutgoing: true"),
        "the env file's default pool: {pools}"
    );

    // margay-felix.service: ready with the shipped environment.
    let felix_health = free_port().expect("port");
    let felix_overrides = host.host_overrides(&[
        ("MARGAY_DATAPLANE", "recording".into()),
        ("FELIX_HEALTHPORT", felix_health.to_string()),
        (
            "MARGAY_FELIX_STATUS_SOCKET",
            host.node.file("felix.sock").to_string_lossy().into_owned(),
        ),
    ]);
    let mut felix = host.start("margay-felix.service", &felix_overrides, &[]);

    // margay-typha.service: TLS with the test's certificates in place of /etc/margay/pki.
    let typha_port = free_port().expect("port");
    let typha_health = free_port().expect("port");
    let p = |p: &Path| p.to_string_lossy().into_owned();
    let typha_overrides = host.host_overrides(&[
        ("TYPHA_SERVERPORT", typha_port.to_string()),
        ("TYPHA_HEALTHPORT", typha_health.to_string()),
        ("TYPHA_SERVERCERTFILE", p(&host.pki.server_cert)),
        ("TYPHA_SERVERKEYFILE", p(&host.pki.server_key)),
        ("TYPHA_CAFILE", p(&host.pki.ca)),
        ("TYPHA_CLIENTCN", "margay-test-client".into()),
    ]);
    let mut typha = host.start("margay-typha.service", &typha_overrides, &[]);

    // margay-bird.service's ExecStartPre: confd renders a configuration BIRD accepts.
    let confd_dir = host.node.file("confd");
    let confd_overrides = host.host_overrides(&[
        ("MARGAY_CONFD_CONFIG_DIR", p(&confd_dir)),
        ("MARGAY_BGP_SECRETS_DIR", p(&host.node.file("bgp-secrets"))),
    ]);
    let bird = host.unit("margay-bird.service");
    let env = unit_env(&bird, &confd_overrides);
    let render = bird
        .all("Service", "ExecStartPre")
        .into_iter()
        .find(|l| l.contains("margay confd"))
        .expect("bird unit renders with confd first");
    host.node.run_ok(
        "margay-bird.service-pre",
        exec_command(&host.node, render, &env, &[]),
        Duration::from_secs(60),
    );
    let bird_cfg = std::fs::read_to_string(confd_dir.join("bird.cfg")).expect("bird.cfg");
    assert!(
        bird_cfg.contains("router id 192.0.2.10"),
        "bird.cfg for this host:\n{bird_cfg}"
    );

    felix.wait_http_ok(felix_health, "/readiness", Duration::from_secs(60));
    typha.wait_http_ok(typha_health, "/readiness", Duration::from_secs(60));
    felix.assert_running();
    typha.assert_running();
}
