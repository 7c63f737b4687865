//! Private etcd servers for tests: each on its own loopback ports and temp data directory,
//! killed (SIGKILL) and removed on drop.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// How long a member may take to become healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Certificates for a TLS test: a CA, a server certificate for 127.0.0.1, and a client
/// certificate, all PEM files in one directory.
pub struct TestPki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TestPki {
    /// Generates a fresh CA and certificates with the `openssl` command.
    pub fn generate(dir: &std::path::Path) -> io::Result<TestPki> {
        let p = |n: &str| dir.join(n);
        let run = |args: &[&str]| -> io::Result<()> {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot run openssl ({e}); install it with scripts/setup"),
                    )
                })?;
            if out.status.success() {
                Ok(())
            } else {
                Err(io::Error::other(format!(
                    "openssl {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                )))
            }
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        run(&[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca-key.pem",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=margay-test-ca",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        ]
        .concat())?;
        for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
            std::fs::write(
                p(&format!("{name}.ext")),
                format!(
                    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                ),
            )?;
            let key = format!("{name}-key.pem");
            let csr = format!("{name}.csr");
            let cert = format!("{name}.pem");
            let ext = format!("{name}.ext");
            run(&[
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    &key,
                    "-out",
                    &csr,
                    "-subj",
                    &format!("/CN=margay-test-{name}"),
                ],
            ]
            .concat())?;
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-out",
                &cert,
                "-days",
                "2",
                "-extfile",
                &ext,
            ])?;
        }
        Ok(TestPki {
            dir: dir.to_path_buf(),
            ca: p("ca.pem"),
            server_cert: p("server.pem"),
            server_key: p("server-key.pem"),
            client_cert: p("client.pem"),
            client_key: p("client-key.pem"),
        })
    }
}

/// One etcd process.
pub struct EtcdServer {
    name: String,
    client_port: u16,
    /// Plain-HTTP port for /health when the client port speaks TLS.
    metrics_port: u16,
    /// Server certificate, key and the CA clients must be signed by.
    tls: Option<(PathBuf, PathBuf, PathBuf)>,
    peer_port: u16,
    initial_cluster: String,
    cluster_token: String,
    data_dir: PathBuf,
    child: Option<Child>,
    // Keeps the directory (data and log) alive as long as the server.
    _dir: tempfile::TempDir,
}

impl EtcdServer {
    /// Starts a single-member etcd and waits until it is healthy.
    pub fn start() -> io::Result<EtcdServer> {
        EtcdServer::start_single(None)
    }

    /// Starts a single-member etcd whose client port speaks TLS and requires client
    /// certificates signed by the test CA.
    pub fn start_tls(pki: &TestPki) -> io::Result<EtcdServer> {
        EtcdServer::start_single(Some((
            pki.server_cert.clone(),
            pki.server_key.clone(),
            pki.ca.clone(),
        )))
    }

    /// A free port is only free until someone else binds it: with tests running in parallel,
    /// another process may take one between `free_port` and etcd's bind. Such a start is
    /// retried on fresh ports (a few times); any other failure is reported at once.
    fn start_single(tls: Option<(PathBuf, PathBuf, PathBuf)>) -> io::Result<EtcdServer> {
        const ATTEMPTS: usize = 4;
        let mut last = None;
        for _ in 0..ATTEMPTS {
            let mut s = EtcdServer::prepare("m0", free_port()?, free_port()?, None, "margay-test")?;
            s.tls = tls.clone();
            s.spawn()?;
            match s.wait_healthy() {
                Ok(()) => return Ok(s),
                Err(e) if e.to_string().contains("address already in use") => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("etcd did not start")))
    }

    fn prepare(
        name: &str,
        client_port: u16,
        peer_port: u16,
        initial_cluster: Option<String>,
        token: &str,
    ) -> io::Result<EtcdServer> {
        // On tmpfs etcd's fsyncs are free, which keeps write-heavy tests fast; durability
        // across a process kill (what the tests exercise) is unaffected.
        let shm = std::path::Path::new("/dev/shm");
        let mut builder = tempfile::Builder::new();
        builder.prefix("margay-etcd-");
        let dir = if shm.is_dir() {
            builder.tempdir_in(shm).or_else(|_| builder.tempdir())?
        } else {
            builder.tempdir()?
        };
        Ok(EtcdServer {
            name: name.to_string(),
            client_port,
            metrics_port: free_port()?,
            tls: None,
            peer_port,
            initial_cluster: initial_cluster
                .unwrap_or_else(|| format!("{name}=http://127.0.0.1:{peer_port}")),
            cluster_token: token.to_string(),
            data_dir: dir.path().join("data"),
            child: None,
            _dir: dir,
        })
    }

    fn spawn(&mut self) -> io::Result<()> {
        let log = std::fs::File::create(self.log_path())?;
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let metrics = format!("http://127.0.0.1:{}", self.metrics_port);
        let mut cmd = Command::new("etcd");
        if let Some((cert, key, ca)) = &self.tls {
            cmd.arg("--cert-file").arg(cert).arg("--key-file").arg(key);
            cmd.arg("--trusted-ca-file")
                .arg(ca)
                .arg("--client-cert-auth");
        }
        let child = cmd
            .args(["--name", &self.name])
            .args(["--listen-metrics-urls", &metrics])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.cluster_token])
            // Short elections so leader-loss tests finish quickly.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot run etcd ({e}); install it with scripts/setup (Debian package etcd-server)"),
                )
            })?;
        self.child = Some(child);
        Ok(())
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the server's output goes (read it when a test fails).
    pub fn log_path(&self) -> PathBuf {
        self._dir.path().join("etcd.log")
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Kills the process with SIGKILL (no clean shutdown) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the process again on the same ports and data.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }

    /// Waits until `/health` reports healthy.
    pub fn wait_healthy(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if health(self.metrics_port) {
                return Ok(());
            }
            if !self.is_running() {
                return Err(io::Error::other(format!(
                    "etcd {} exited during start-up; see {}: {}",
                    self.name,
                    self.log_path().display(),
                    tail(&self.log_path())
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "etcd {} not healthy after {START_TIMEOUT:?}: {}",
                        self.name,
                        tail(&self.log_path())
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Several etcd members forming one cluster.
pub struct EtcdCluster {
    pub members: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Starts `size` members and waits until each is healthy. As with a single member, a
    /// port taken between `free_port` and a member's bind starts the whole cluster again on
    /// fresh ports (a few times).
    pub fn start(size: usize) -> io::Result<EtcdCluster> {
        const ATTEMPTS: usize = 4;
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            match EtcdCluster::start_once(size, attempt) {
                Ok(c) => return Ok(c),
                Err(e) if e.to_string().contains("address already in use") => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("etcd cluster did not start")))
    }

    fn start_once(size: usize, attempt: usize) -> io::Result<EtcdCluster> {
        let ports: Vec<(u16, u16)> = (0..size)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<io::Result<_>>()?;
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("margay-test-{}-{attempt}", std::process::id());
        let mut members = Vec::new();
        for (i, (c, p)) in ports.iter().enumerate() {
            let mut m =
                EtcdServer::prepare(&format!("m{i}"), *c, *p, Some(initial.clone()), &token)?;
            m.spawn()?;
            members.push(m);
        }
        // All members together: one that exits (its port was taken) is seen at once, not
        // after the others gave up waiting for a quorum. On an error the members started so
        // far are killed as `members` drops.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if members.iter().all(|m| health(m.metrics_port)) {
                return Ok(EtcdCluster { members });
            }
            for m in &mut members {
                if !m.is_running() {
                    return Err(io::Error::other(format!(
                        "etcd {} exited during start-up; see {}: {}",
                        m.name,
                        m.log_path().display(),
                        tail(&m.log_path())
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("etcd cluster of {size} not healthy after {START_TIMEOUT:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// All client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdServer::endpoint).collect()
    }

    /// The index of the current leader, from each member's /v2-free status endpoint.
    pub fn leader(&self) -> Option<usize> {
        // etcd's /metrics exposes etcd_server_is_leader 1 on the leader.
        self.members.iter().position(|m| {
            http_get(m.client_port, "/metrics")
                .is_some_and(|b| b.contains("etcd_server_is_leader 1"))
        })
    }
}

fn health(port: u16) -> bool {
    http_get(port, "/health").is_some_and(|b| b.contains("\"health\":\"true\""))
}

/// A minimal HTTP/1.0 GET on loopback, enough for etcd's health and metrics endpoints.
fn http_get(port: u16, path: &str) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

fn tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}
