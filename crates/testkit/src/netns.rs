//! Throw-away network namespaces for tests (needs root and iproute2's `ip`).
//!
//! Every namespace is named `mgy-<prefix>-<pid>-<n>`, so leftovers are easy to spot and
//! remove: `ip netns list | grep '^mgy-'`, then `ip netns delete NAME`. A leftover can only come
//! from a process killed before its [`Netns`] was dropped (SIGKILL); a panicking test still
//! drops it. Deleting a namespace destroys the interfaces inside it (the veth pairs made by
//! [`Netns::add_veth`] have both ends inside), so nothing outside the namespace is touched.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let ns = margay_testkit::netns::Netns::new("autodetect")?;
//! ns.add_veth("eth0", "veth-eth0", &["10.0.0.5/24", "2001:db8::5/64"])?;
//! let out = ns.exec("ip").args(["-o", "addr"]).output()?;
//! # let _ = out; Ok(()) }
//! ```

use std::ffi::OsStr;
use std::io;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Every namespace name starts with this.
pub const NAME_PREFIX: &str = "mgy-";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace that is deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `mgy-<prefix>-<pid>-<n>` with `ip netns add` and brings its `lo` up. `prefix`
    /// is reduced to ASCII letters, digits, `-` and `_` (a leading `mgy-` is not repeated).
    pub fn new(prefix: &str) -> io::Result<Netns> {
        let prefix = prefix.strip_prefix(NAME_PREFIX).unwrap_or(prefix);
        let clean: String = prefix
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(40)
            .collect();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = if clean.is_empty() {
            format!("{NAME_PREFIX}{}-{n}", std::process::id())
        } else {
            format!("{NAME_PREFIX}{clean}-{}-{n}", std::process::id())
        };
        run(Command::new("ip").args(["netns", "add", &name]))?;
        // From here on, Drop removes it even if the rest fails.
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n <ns> ARGS…`; returns its stdout, or an error carrying the command and its
    /// stderr.
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// A command running `program` inside the namespace (`ip netns exec <ns> program`); add
    /// arguments and environment to it as usual. The environment is passed through.
    pub fn exec(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Creates a veth pair `name` <-> `peer` with both ends inside the namespace, assigns
    /// `addrs` (CIDRs, e.g. `10.0.0.5/24`; IPv6 ones with `nodad`, so they are usable at once)
    /// to `name`, and brings both ends up. Interface names are at most 15 bytes.
    pub fn add_veth(&self, name: &str, peer: &str, addrs: &[&str]) -> io::Result<()> {
        self.ip(&["link", "add", name, "type", "veth", "peer", "name", peer])?;
        for a in addrs {
            self.add_addr(name, a)?;
        }
        self.set_up(peer)?;
        self.set_up(name)
    }

    /// Adds an address (CIDR) to an interface; IPv6 ones with `nodad`.
    pub fn add_addr(&self, dev: &str, cidr: &str) -> io::Result<()> {
        if cidr.contains(':') {
            self.ip(&["addr", "add", cidr, "dev", dev, "nodad"])?;
        } else {
            self.ip(&["addr", "add", cidr, "dev", dev])?;
        }
        Ok(())
    }

    /// Creates a veth pair with `name` here and `peer_name` inside `peer` (another test
    /// namespace), both down; the caller configures and raises them.
    pub fn link_to(&self, name: &str, peer: &Netns, peer_name: &str) -> io::Result<()> {
        self.ip(&[
            "link", "add", name, "type", "veth", "peer", "name", peer_name, "netns", &peer.name,
        ])
        .map(drop)
    }

    /// Sets a sysctl inside the namespace (`net.*` sysctls are per namespace).
    pub fn sysctl(&self, key: &str, value: &str) -> io::Result<()> {
        run(self
            .exec("sysctl")
            .args(["-q", "-w", &format!("{key}={value}")]))
        .map(drop)
    }

    pub fn set_up(&self, dev: &str) -> io::Result<()> {
        self.ip(&["link", "set", dev, "up"]).map(drop)
    }

    pub fn set_down(&self, dev: &str) -> io::Result<()> {
        self.ip(&["link", "set", dev, "down"]).map(drop)
    }

    /// Makes a pod namespace (name from `prefix`) wired to this node namespace the way the
    /// CNI plugin wires a workload: `eth0` in the pod with `ip`/32, routes to 169.254.1.1 and a
    /// default through it; `host_iface` here with proxy ARP (answering at once) and a
    /// scope-link route to the pod.
    pub fn add_pod(&self, prefix: &str, ip: &str, host_iface: &str) -> io::Result<Netns> {
        let pod = Netns::new(prefix)?;
        self.link_to(host_iface, &pod, "eth0")?;
        pod.add_addr("eth0", &format!("{ip}/32"))?;
        pod.set_up("eth0")?;
        pod.ip(&[
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ])?;
        pod.ip(&[
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ])?;
        self.set_up(host_iface)?;
        self.sysctl(&format!("net.ipv4.conf.{host_iface}.proxy_arp"), "1")?;
        self.sysctl(&format!("net.ipv4.neigh.{host_iface}.proxy_delay"), "0")?;
        self.ip(&[
            "route",
            "add",
            &format!("{ip}/32"),
            "dev",
            host_iface,
            "scope",
            "link",
        ])?;
        Ok(pod)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = run(Command::new("ip").args(["netns", "delete", &self.name])) {
            eprintln!(
                "margay-testkit: could not delete network namespace {}: {e} \
                 (remove it with `ip netns delete {}`)",
                self.name, self.name
            );
        }
    }
}

fn run(cmd: &mut Command) -> io::Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run {shown}: {e} (is iproute2 installed?)"),
        )
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(io::Error::other(format!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Moves the calling thread into the network namespace `name` (made by [`Netns`]), checking
/// that it took effect. Only this thread moves: run it on a thread of its own.
pub fn enter(name: &str) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let path = format!("/run/netns/{name}");
    let file = std::fs::File::open(&path)?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| io::Error::other(format!("entering {path}: {e}")))?;
    let want = std::fs::metadata(&path)?.ino();
    let have = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
    if want != have {
        return Err(io::Error::other(format!(
            "setns into {path} did not take effect"
        )));
    }
    Ok(())
}

/// TCP servers inside network namespaces, each answering every connection on `port` with
/// its name and closing it; stopped and joined on drop.
#[derive(Debug)]
pub struct NameServers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl NameServers {
    /// One server per (namespace, name); returns once all listen.
    pub fn start(pods: &[(String, String)], port: u16) -> io::Result<NameServers> {
        use std::io::Write;
        use std::sync::atomic::AtomicBool;
        use std::time::Duration;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let mut servers = NameServers {
            stop: stop.clone(),
            threads: Vec::new(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        for (ns, name) in pods {
            let (ns, name, stop, tx) = (ns.clone(), name.clone(), stop.clone(), tx.clone());
            servers.threads.push(std::thread::spawn(move || {
                let listener = enter(&ns).and_then(|()| {
                    let l = std::net::TcpListener::bind(("0.0.0.0", port))?;
                    l.set_nonblocking(true)?;
                    Ok(l)
                });
                let l = match listener {
                    Ok(l) => {
                        let _ = tx.send(Ok(()));
                        l
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                while !stop.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((mut s, _)) => {
                            let _ = s.set_nonblocking(false);
                            let _ = s.write_all(name.as_bytes());
                        }
                        Err(_) => std::thread::sleep(Duration::from_micros(200)),
                    }
                }
            }));
        }
        for _ in pods {
            rx.recv_timeout(Duration::from_secs(10))
                .map_err(|_| io::Error::other("a name server did not start within 10 s"))??;
        }
        Ok(servers)
    }
}

impl Drop for NameServers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// True when running as root (uid 0), read from /proc/self/status.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn skip() -> bool {
        if is_root() {
            return false;
        }
        if std::env::var("MARGAY_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
            eprintln!("skipped: needs root (MARGAY_SKIP_ROOT_TESTS=1)");
            return true;
        }
        panic!("this test needs root (network namespaces); set MARGAY_SKIP_ROOT_TESTS=1 to skip");
    }

    fn listed(name: &str) -> bool {
        let out = run(Command::new("ip").args(["netns", "list"])).unwrap();
        out.lines()
            .any(|l| l.split_whitespace().next() == Some(name))
    }

    #[test]
    fn create_use_and_delete() {
        if skip() {
            return;
        }
        let name;
        {
            let ns = Netns::new("testkit").unwrap();
            name = ns.name().to_string();
            assert!(name.starts_with("mgy-testkit-"), "{name}");
            assert!(listed(&name));
            ns.add_veth("eth0", "veth-eth0", &["10.0.0.5/24", "2001:db8::5/64"])
                .unwrap();
            let addrs = ns.ip(&["-o", "addr", "show", "dev", "eth0"]).unwrap();
            assert!(addrs.contains("10.0.0.5/24"), "{addrs}");
            assert!(addrs.contains("2001:db8::5/64"), "{addrs}");
            let out = ns.exec("ip").args(["-o", "link"]).output().unwrap();
            let links = String::from_utf8_lossy(&out.stdout);
            assert!(links.contains("veth-eth0"), "{links}");
            ns.set_down("eth0").unwrap();
            let e = ns.ip(&["link", "set", "nosuchdev", "up"]).unwrap_err();
            assert!(e.to_string().contains("nosuchdev"), "{e}");
        }
        assert!(!listed(&name), "{name} left behind");
    }

    #[test]
    fn dropped_on_panic() {
        if skip() {
            return;
        }
        let name = std::sync::Mutex::new(String::new());
        let r = std::panic::catch_unwind(|| {
            let ns = Netns::new("panic").unwrap();
            *name.lock().unwrap() = ns.name().to_string();
            panic!("boom");
        });
        assert!(r.is_err());
        let name = name.lock().unwrap().clone();
        assert!(!name.is_empty());
        assert!(!listed(&name), "{name} left behind");
    }
}
