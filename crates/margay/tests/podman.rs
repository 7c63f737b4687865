//! A real container runtime on a margay network: podman 4 with its CNI network backend (as
//! Debian ships it) executes the margay plugin, installed by `margay cni install`, for
//! containers on a node nobody prepared — forwarding off, no profile, no sysctl set by hand.
//! Felix runs in the node's namespace. Containers reach each other; a policy denies and its
//! deletion restores; `podman rm` (and a container's own exit) releases every address and
//! endpoint.
//!
//! Everything podman keeps lives in the test's directory (containers.conf and storage.conf
//! name it: storage, run root, temporary directory, network configs, plugin directory); podman
//! runs through `nsenter --net=` into the node's namespace (not `ip netns exec`, which
//! remounts /sys and hides the cgroup mounts) with runc and explicit ulimits; a busybox-static
//! root filesystem serves as the image. Root only; scripts/setup installs podman, runc and
//! busybox-static.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use margay_testkit::netns::{Netns, is_root};
use serde_json::Value;

const NODE: &str = "pm-node";
const NETWORK: &str = "margaynet";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_margay")
}

fn show(o: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The test's world; dropping it removes every container, stops Felix and deletes the
/// namespaces and the directory.
struct World {
    dir: tempfile::TempDir,
    node: Netns,
    _outside: Netns,
    felix: Option<Child>,
}

impl Drop for World {
    fn drop(&mut self) {
        // Every container of this podman root, whatever state it is in (their network
        // namespaces and CNI cache entries go with them).
        let _ = self
            .podman()
            .args(["rm", "--all", "--force", "--time", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(mut f) = self.felix.take() {
            let _ = f.kill();
            let _ = f.wait();
        }
    }
}

impl World {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn margay(&self) -> Command {
        let mut c = Command::new(bin());
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.path("ds.db"));
        c
    }

    fn ctl(&self, args: &[&str]) -> Output {
        self.margay().arg("ctl").args(args).output().unwrap()
    }

    fn ctl_ok(&self, args: &[&str]) -> String {
        let o = self.ctl(args);
        assert!(o.status.success(), "margay ctl {args:?}: {}", show(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// podman in the node's network namespace, with the test's own configuration.
    fn podman(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/var/run/netns/{}", self.node.name()))
            .arg("podman")
            .env("CONTAINERS_CONF", self.path("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.path("storage.conf"))
            // Felix's pod MTU, which the plugin reads (a real host: /var/lib/calico/mtu).
            .env("MARGAY_MTU_FILE", self.path("mtu"));
        c
    }

    fn podman_ok(&self, args: &[&str]) -> String {
        let o = self.podman().args(args).output().unwrap();
        assert!(
            o.status.success(),
            "podman {args:?}: {}\n--- cni.log\n{}",
            show(&o),
            std::fs::read_to_string(self.path("cni.log")).unwrap_or_default()
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// Starts a container on the margay network running `cmd`.
    fn run(&self, name: &str, cmd: &[&str]) {
        let rootfs = self.path("rootfs");
        let mut args = vec![
            "run",
            "--detach",
            "--name",
            name,
            "--network",
            NETWORK,
            "--ulimit",
            "nofile=1024:2048",
            "--ulimit",
            "nproc=1024:2048",
            "--rootfs",
            rootfs.to_str().unwrap(),
        ];
        args.extend_from_slice(cmd);
        self.podman_ok(&args);
    }

    fn ip_of(&self, name: &str) -> String {
        self.podman_ok(&[
            "inspect",
            name,
            "--format",
            &format!("{{{{.NetworkSettings.Networks.{NETWORK}.IPAddress}}}}"),
        ])
    }

    /// Whether `from` gets the server's answer from `ip:80` (busybox's nc, 2 s to connect).
    fn reaches(&self, from: &str, ip: &str) -> bool {
        let o = self
            .podman()
            .args(["exec", from, "nc", "-w", "2", ip, "80"])
            .output()
            .unwrap();
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("hi")
    }

    /// Polls until `from` reaches (or does not reach) `ip:80`; panics after `limit`.
    fn until_reaches(&self, from: &str, ip: &str, want: bool, limit: Duration) -> Duration {
        let t = Instant::now();
        loop {
            if self.reaches(from, ip) == want {
                return t.elapsed();
            }
            assert!(
                t.elapsed() < limit,
                "{from} -> {ip}:80 still {} after {limit:?}; felix log:\n{}",
                if want { "blocked" } else { "open" },
                std::fs::read_to_string(self.path("felix.log")).unwrap_or_default()
            );
        }
    }

    fn sysctl(&self, key: &str) -> String {
        let out = self
            .node
            .exec("cat")
            .arg(format!("/proc/sys/{}", key.replace('.', "/")))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Nothing of any container is left: no handle, no address, no endpoint, no interface.
    fn assert_released(&self) {
        let check = self.ctl(&["ipam", "check"]);
        let text = String::from_utf8_lossy(&check.stdout);
        assert!(check.status.success(), "{}", show(&check));
        assert!(text.contains("Found 0 handles."), "{text}");
        let weps = self.ctl_ok(&["get", "workloadendpoints", "-A", "-o", "name"]);
        assert!(weps.trim().is_empty(), "endpoints left: {weps}");
        let links = self.node.ip(&["-o", "link"]).unwrap();
        assert!(!links.contains("cali"), "interfaces left: {links}");
    }
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

/// A root filesystem of busybox-static: what the containers run.
fn rootfs(dir: &Path) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("busybox-static is missing: run scripts/setup");
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    for tool in ["sh", "nc", "echo", "sleep", "cat", "ip"] {
        std::os::unix::fs::symlink("busybox", bin.join(tool)).unwrap();
    }
}

fn setup() -> World {
    for tool in ["podman", "runc", "nsenter"] {
        assert!(which(tool), "{tool} is missing: run scripts/setup");
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The node: an uplink to an outside namespace and a default route, as a host has (proxy
    // ARP answers for 169.254.1.1 only when the host can route). Forwarding stays off.
    let node = Netns::new("pm-node").unwrap();
    let outside = Netns::new("pm-out").unwrap();
    node.link_to("eth0", &outside, "eth0").unwrap();
    node.add_addr("eth0", "192.0.2.1/24").unwrap();
    node.set_up("eth0").unwrap();
    node.ip(&["route", "add", "default", "via", "192.0.2.254"])
        .unwrap();
    outside.add_addr("eth0", "192.0.2.254/24").unwrap();
    outside.set_up("eth0").unwrap();
    // A host MTU the plugin's fallback (1500) is not: containers get it only through Felix.
    for ns in [&node, &outside] {
        ns.ip(&["link", "set", "eth0", "mtu", "1400"]).unwrap();
    }
    rootfs(&d.join("rootfs"));
    std::fs::write(
        d.join("containers.conf"),
        format!(
            "[engine]\ncgroup_manager = \"cgroupfs\"\nruntime = \"runc\"\nevents_logger = \"none\"\ntmp_dir = \"{tmp}\"\n\
             [network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [\"{bin}\"]\nnetwork_config_dir = \"{net}\"\n",
            tmp = d.join("tmp").display(),
            bin = d.join("cni-bin").display(),
            net = d.join("net.d").display(),
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("storage.conf"),
        format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            d.join("storage").display(),
            d.join("run").display()
        ),
    )
    .unwrap();
    let world = World {
        dir,
        node,
        _outside: outside,
        felix: None,
    };
    // The node registers as calico-node does, with a pool for the containers.
    let o = world
        .margay()
        .args(["node", "startup", "--root"])
        .arg(world.path("root"))
        .env("NODENAME", NODE)
        .env("IP", "192.0.2.1/24")
        .env("CALICO_IPV4POOL_CIDR", "10.78.0.0/16")
        .env("CALICO_IPV4POOL_VXLAN", "Never")
        .env("CALICO_IPV4POOL_IPIP", "Never")
        .output()
        .unwrap();
    assert!(o.status.success(), "node startup: {}", show(&o));
    // The plugins, installed as an operator installs them.
    let o = world
        .margay()
        .args(["cni", "install", "--dir"])
        .arg(world.path("cni-bin"))
        .output()
        .unwrap();
    assert!(o.status.success(), "cni install: {}", show(&o));
    // The network: the datastore and the node name file named in the conflist (podman's
    // clean-up after a container exits knows nothing else).
    std::fs::create_dir_all(world.path("net.d")).unwrap();
    let conflist = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": NETWORK,
        "plugins": [{
            "type": "margay",
            "datastore_type": "local",
            "datastore_path": world.path("ds.db"),
            "nodename_file": world.path("root/var/lib/calico/nodename"),
            "ipam": {"type": "margay-ipam"},
            "ipam_lock_file": world.path("ipam.lock"),
            "log_file_path": world.path("cni.log"),
            "log_level": "info",
        }],
    });
    std::fs::write(
        world.path(&format!("net.d/{NETWORK}.conflist")),
        conflist.to_string(),
    )
    .unwrap();
    world
}

#[test]
fn podman_containers_on_a_margay_network() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let started = Instant::now();
    let mut w = setup();
    assert_eq!(
        w.sysctl("net.ipv4.ip_forward"),
        "0",
        "a host nobody prepared"
    );

    // Felix in the node's namespace, at its defaults.
    let log = std::fs::File::create(w.path("felix.log")).unwrap();
    let felix = Command::new("ip")
        .args(["netns", "exec", w.node.name(), bin(), "felix", "run"])
        .arg("--status-socket")
        .arg(w.path("felix.sock"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATASTORE_TYPE", "local")
        .env("DATASTORE_PATH", w.path("ds.db"))
        .env("FELIX_FELIXHOSTNAME", NODE)
        .env("FELIX_LOGFILEPATH", "none")
        .env("FELIX_LOGSEVERITYSYS", "none")
        .env("MARGAY_DATAPLANE", "linux")
        .env("MARGAY_MTU_FILE", w.path("mtu"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    w.felix = Some(felix);
    let t = Instant::now();
    loop {
        let o = w
            .margay()
            .args(["felix", "status", "--json", "--socket"])
            .arg(w.path("felix.sock"))
            .output()
            .unwrap();
        if o.status.success()
            && serde_json::from_slice::<Value>(&o.stdout)
                .is_ok_and(|s| s["dataplane"]["in_sync"] == Value::Bool(true))
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "felix not in sync; log:\n{}",
            std::fs::read_to_string(w.path("felix.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        w.sysctl("net.ipv4.ip_forward"),
        "1",
        "Felix turns forwarding on"
    );

    // Two containers: a server and a client.
    w.run(
        "server",
        &["/bin/nc", "-ll", "-p", "80", "-e", "echo", "hi"],
    );
    w.run("client", &["/bin/sleep", "3600"]);
    let server = w.ip_of("server");
    let client = w.ip_of("client");
    assert!(server.starts_with("10.78.") && client.starts_with("10.78."));
    let took = w.until_reaches("client", &server, true, Duration::from_secs(10));
    eprintln!("client reached server {took:?} after it started");
    // No profile was made by hand: the plugin made the network's.
    let profile: Value =
        serde_json::from_str(&w.ctl_ok(&["get", "profile", NETWORK, "-o", "json"])).unwrap();
    assert_eq!(
        profile["spec"]["ingress"][0]["source"]["selector"],
        format!("has({NETWORK})")
    );
    // The containers got the pod MTU Felix detected.
    let mtu = std::fs::read_to_string(w.path("mtu")).unwrap();
    assert_eq!(mtu.trim(), "1400");
    assert_eq!(
        w.podman_ok(&["exec", "client", "cat", "/sys/class/net/eth0/mtu"]),
        mtu.trim()
    );

    // A policy denies; its deletion restores.
    let deny = w.path("deny.yaml");
    std::fs::write(
        &deny,
        format!(
            "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {{name: deny-80}}\nspec:\n  selector: has({NETWORK})\n  types: [Ingress]\n  ingress:\n  - action: Deny\n    protocol: TCP\n    destination: {{ports: [80]}}\n"
        ),
    )
    .unwrap();
    w.ctl_ok(&["apply", "-f", deny.to_str().unwrap()]);
    let took = w.until_reaches("client", &server, false, Duration::from_secs(10));
    eprintln!("policy denied {took:?} after the datastore write");
    w.ctl_ok(&["delete", "globalnetworkpolicy", "deny-80"]);
    let took = w.until_reaches("client", &server, true, Duration::from_secs(10));
    eprintln!("deletion restored the traffic {took:?} after the datastore write");

    // A container that exits by itself: podman's clean-up (run by conmon) releases it.
    w.run("brief", &["/bin/sleep", "1"]);
    let t = Instant::now();
    loop {
        // Mid-release the check may see the address without its endpoint (and fail): wait for
        // a clean check with the two running containers' handles.
        let check = w.ctl(&["ipam", "check"]);
        let handles = String::from_utf8_lossy(&check.stdout).into_owned();
        if check.status.success() && handles.contains("Found 2 handles.") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the exited container's address was not released:\n{handles}\n--- cni.log\n{}",
            std::fs::read_to_string(w.path("cni.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // podman rm releases everything.
    w.podman_ok(&["rm", "--force", "--time", "0", "server", "client", "brief"]);
    w.assert_released();
    eprintln!("podman scenario took {:?}", started.elapsed());
}
