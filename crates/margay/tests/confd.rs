//! `margay confd --once` as the real binary against the embedded store: resources applied
//! with `margay ctl`, an affinity written as IPAM writes it, then the rendered files checked
//! by BIRD (`bird -p -c`; BIRD must be installed — scripts/setup installs bird2) and BIRD's
//! control socket (a fake one here) asked to reconfigure.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use margay_datastore::KvBackend;

const RESOURCES: &str = r#"
apiVersion: projectcalico.org/v3
kind: Node
metadata:
  name: node1
spec:
  bgp:
    ipv4Address: 10.0.0.1/24
---
apiVersion: projectcalico.org/v3
kind: Node
metadata:
  name: node2
spec:
  bgp:
    ipv4Address: 10.0.0.2/24
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: pool
spec:
  cidr: 10.65.0.0/16
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata:
  name: tor
spec:
  peerIP: 10.0.0.254
  asNumber: 65000
  password:
    secretKeyRef:
      name: bgp
      key: tor
"#;

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn store(&self) -> PathBuf {
        self.dir.path().join("datastore.db")
    }
    fn config_dir(&self) -> PathBuf {
        self.dir.path().join("confd")
    }
    fn margay(&self, args: &[&str]) -> Output {
        Command::new(assert_cmd::cargo::cargo_bin("margay"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.store())
            .env("MARGAY_BGP_SECRETS_DIR", self.dir.path().join("secrets"))
            .output()
            .unwrap()
    }
}

fn setup() -> Env {
    let env = Env {
        dir: tempfile::tempdir().unwrap(),
    };
    let file = env.dir.path().join("resources.yaml");
    std::fs::write(&file, RESOURCES).unwrap();
    let out = env.margay(&["ctl", "apply", "-f", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::create_dir_all(env.dir.path().join("secrets/bgp")).unwrap();
    std::fs::write(env.dir.path().join("secrets/bgp/tor"), "t0r-pass\n").unwrap();
    // This node's block, as IPAM claims it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let kv = margay_datastore::local::LocalBackend::open(
            margay_datastore::local::LocalOptions::new(env.store()),
        )
        .unwrap();
        kv.create(
            "/calico/ipam/v2/host/node1/ipv4/block/10.65.0.0-26",
            br#"{"state":"confirmed","deleted":false}"#.to_vec(),
            None,
        )
        .await
        .unwrap();
    });
    env
}

fn bird_accepts(path: &Path) {
    let out = Command::new("bird")
        .arg("-p")
        .arg("-c")
        .arg(path)
        .output()
        .expect("`bird` must be installed (scripts/setup installs bird2)");
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn once_renders_valid_config_from_the_embedded_store() {
    let env = setup();
    let cfg = env.config_dir();
    let out = env.margay(&[
        "confd",
        "--once",
        "--nodename",
        "node1",
        "--config-dir",
        cfg.to_str().unwrap(),
        "--no-reload",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("t0r-pass"),
        "passwords never reach the log"
    );
    let bird = std::fs::read_to_string(cfg.join("bird.cfg")).unwrap();
    assert!(
        bird.contains("protocol bgp Mesh_10_0_0_2 from bgp_template"),
        "{bird}"
    );
    assert!(
        bird.contains("protocol bgp Global_10_0_0_254 from bgp_template"),
        "{bird}"
    );
    assert!(bird.contains("password \"t0r-pass\";"));
    assert!(bird.contains("route 10.65.0.0/26 blackhole;"));
    assert!(bird.contains("router id 10.0.0.1;"));
    bird_accepts(&cfg.join("bird.cfg"));
    bird_accepts(&cfg.join("bird6.cfg"));
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cfg.join("confd-status.json")).unwrap()).unwrap();
    assert_eq!(status["in_sync"], true);
    assert_eq!(status["peers_v4"], 2);
    assert_eq!(status["last_error"], serde_json::Value::Null);
}

#[test]
fn once_reconfigures_bird_through_its_socket() {
    let env = setup();
    let cfg = env.config_dir();
    let sock4 = env.dir.path().join("bird.ctl");
    let sock6 = env.dir.path().join("bird6.ctl");
    // Fake BIRDs: greet, expect `configure`, answer "Reconfigured".
    let serve = |path: &Path| {
        let listener = UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"0001 BIRD 2.0.12 ready.\n").unwrap();
            let mut line = String::new();
            BufReader::new(s.try_clone().unwrap())
                .read_line(&mut line)
                .unwrap();
            s.write_all(b"0003 Reconfigured\n").unwrap();
            line
        })
    };
    let (t4, t6) = (serve(&sock4), serve(&sock6));
    let out = env.margay(&[
        "confd",
        "--once",
        "--nodename",
        "node1",
        "--config-dir",
        cfg.to_str().unwrap(),
        "--bird-socket",
        sock4.to_str().unwrap(),
        "--bird6-socket",
        sock6.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(t4.join().unwrap(), "configure\n");
    assert_eq!(t6.join().unwrap(), "configure\n");
}

#[test]
fn once_fails_when_bird_cannot_be_reconfigured_or_the_node_is_unknown() {
    let env = setup();
    let cfg = env.config_dir();
    // No BIRD running at all: nothing is owed (BIRD reads the files when it starts).
    let missing = env.dir.path().join("no-such.ctl");
    let once = |sock4: &Path, sock6: &Path| {
        env.margay(&[
            "confd",
            "--once",
            "--nodename",
            "node1",
            "--config-dir",
            cfg.to_str().unwrap(),
            "--bird-socket",
            sock4.to_str().unwrap(),
            "--bird6-socket",
            sock6.to_str().unwrap(),
        ])
    };
    let out = once(&missing, &missing);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A BIRD that is there but hangs up without answering: the reload is owed, exit 1.
    let mute = env.dir.path().join("mute.ctl");
    let listener = UnixListener::bind(&mute).unwrap();
    let server = std::thread::spawn(move || drop(listener.accept().unwrap()));
    std::fs::remove_file(cfg.join("bird.cfg")).unwrap();
    let out = once(&mute, &missing);
    server.join().unwrap();
    assert_eq!(out.status.code(), Some(1));
    // The files are in place; only the reload is owed.
    assert!(cfg.join("bird.cfg").exists());
    let out = env.margay(&[
        "confd",
        "--once",
        "--nodename",
        "node9",
        "--config-dir",
        env.dir.path().join("other").to_str().unwrap(),
        "--no-reload",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no Node resource"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
