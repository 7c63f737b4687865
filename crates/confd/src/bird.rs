//! The edges that touch BIRD: checking and installing configuration files (`bird -p -c`,
//! temporary file + rename), and asking a running BIRD to reconfigure through its control
//! socket.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::daemon::{ConfigSink, Family, Reloader, SecretSource};
use crate::model::SecretRef;

/// Installs files into the config directory after BIRD accepted them.
pub struct FileInstaller {
    pub dir: PathBuf,
    /// The `bird` binary used for `bird -p -c` (found through PATH by default).
    pub bird: PathBuf,
}

impl FileInstaller {
    pub fn path(&self, family: Family) -> PathBuf {
        self.dir.join(family.file_name())
    }
}

/// How long `bird -p -c` may take: it parses a file of a few KB, so only a wedged BIRD (or
/// filesystem) gets near this.
pub const BIRD_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `bird -p -c <file>`: Ok when BIRD accepts the configuration, else its complaint.
pub fn bird_parse(bird: &Path, file: &Path) -> Result<(), String> {
    bird_parse_within(bird, file, BIRD_CHECK_TIMEOUT)
}

/// [`bird_parse`] with its deadline: a check that does not finish in time is killed and is an
/// error (confd keeps the old file and retries on the next pass).
pub fn bird_parse_within(bird: &Path, file: &Path, timeout: Duration) -> Result<(), String> {
    use std::io::Read;
    use std::process::Stdio;
    let cannot = |e: std::io::Error| {
        format!(
            "cannot run {} -p -c to check the configuration: {e} (install BIRD 2, or point --bird-binary at it)",
            bird.display()
        )
    };
    let mut child = Command::new(bird)
        .arg("-p")
        .arg("-c")
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(cannot)?;
    // Both pipes are drained on their own threads (at most 1 MiB each is kept) so a chatty
    // BIRD cannot block on a full pipe while we wait for it.
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Vec<u8>)>();
    let pipes: [Option<Box<dyn Read + Send>>; 2] = [
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ];
    for (i, pipe) in pipes.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(p) = pipe {
                let _ = p.take(1 << 20).read_to_end(&mut v);
            }
            let _ = tx.send((i, v));
        });
    }
    drop(tx);
    let deadline = std::time::Instant::now() + timeout;
    let timed_out = || {
        format!(
            "{} -p -c did not finish within {timeout:?}; the old configuration is kept",
            bird.display()
        )
    };
    let status = loop {
        match child.try_wait().map_err(cannot)? {
            Some(s) => break s,
            None if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(timed_out());
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    if status.success() {
        return Ok(());
    }
    // stderr first, then stdout, as BIRD's complaint reads.
    let mut parts = [String::new(), String::new()];
    for _ in 0..2 {
        match rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok((i, v)) => parts[i] = String::from_utf8_lossy(&v).into_owned(),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Err(timed_out()),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    Err(parts.concat().trim().replace('\n', "; "))
}

/// Writes `bytes` to a new temporary file in `dir` (so the rename that installs it is
/// atomic) and returns its path. The file is created with its final `mode` (never readable
/// by others, not even for a moment), with `create_new` (an existing file or symlink of that
/// name is never written through) and an unpredictable name ending in .tmp (so nothing takes
/// it for a configuration). On failure nothing is left behind.
pub fn write_temp(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<PathBuf> {
    use std::hash::{BuildHasher, Hasher};
    use std::os::unix::fs::OpenOptionsExt;
    let mut last = None;
    for attempt in 0..8u32 {
        // RandomState is seeded from the OS's random source.
        let mut h = std::hash::RandomState::new().build_hasher();
        h.write_u32(attempt);
        let tmp = dir.join(format!(
            ".{name}.{}.{:016x}.tmp",
            std::process::id(),
            h.finish()
        ));
        let mut f = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let written = (|| {
            // The umask may have narrowed `mode` at creation; widen to exactly `mode`.
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.write_all(bytes)?;
            f.sync_all()
        })();
        return match written {
            Ok(()) => Ok(tmp),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        };
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temporary name")))
}

impl ConfigSink for FileInstaller {
    fn install(&mut self, family: Family, text: &str, secret: bool) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let target = self.path(family);
        // A password may be inside: only root and BIRD's group may read it.
        let mode = if secret { 0o640 } else { 0o644 };
        let tmp =
            write_temp(&self.dir, family.file_name(), text.as_bytes(), mode).map_err(|e| {
                format!(
                    "cannot write a new {} in {}: {e}",
                    family.file_name(),
                    self.dir.display()
                )
            })?;
        if let Err(e) = bird_parse(&self.bird, &tmp) {
            let _ = std::fs::remove_file(&tmp);
            // BIRD names the temporary file; name the real one instead.
            return Err(e.replace(&tmp.display().to_string(), &target.display().to_string()));
        }
        std::fs::rename(&tmp, &target).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot move the new file to {}: {e}", target.display())
        })
    }
}

/// Reconfigures BIRD through its control socket (what `birdc -s <socket> configure` does).
/// A BIRD that finds an error in the file keeps running its old configuration and says so
/// (8xxx), which is reported as a failed reload.
pub struct SocketReloader {
    pub v4: PathBuf,
    pub v6: PathBuf,
    pub timeout: Duration,
}

impl Reloader for SocketReloader {
    fn reload(&mut self, family: Family) -> Result<(), String> {
        let path = match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        };
        // No BIRD listening (no socket, or a dead one's socket left behind): nothing is owed —
        // BIRD reads the current file when it starts. Without this, a node running no BIRD6
        // would report a reload owed forever.
        let mut client = match margay_bird::Client::connect(path, self.timeout) {
            Ok(c) => c,
            Err(margay_bird::BirdError::Connect { source, .. })
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                tracing::debug!(
                    socket = %path.display(),
                    "no BIRD is listening; it will read {} when it starts",
                    family.file_name()
                );
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        };
        // margay-bird's client: greeting, `configure`, BIRD's 8xxx/9xxx answers as errors.
        client.configure().map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Passwords from `<dir>/<secret>/<key>` files.
pub struct FileSecrets {
    pub dir: PathBuf,
}

impl SecretSource for FileSecrets {
    fn read(&mut self, refs: &BTreeSet<SecretRef>) -> (BTreeMap<SecretRef, String>, Vec<String>) {
        crate::secrets::read_secrets(&self.dir, refs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;

    #[test]
    fn a_config_with_secrets_is_never_written_through_a_planted_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").expect("victim");
        // Before: the temporary file's name was predictable and opened with File::create,
        // which follows a symlink someone left there (and created it world-readable until the
        // chmod).
        let conf = dir.path().join("conf");
        std::fs::create_dir(&conf).expect("conf dir");
        let predictable = conf.join(format!(".bird.cfg.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &predictable).expect("plant");
        let mut installer = FileInstaller {
            dir: conf.clone(),
            bird: PathBuf::from("true"),
        };
        installer
            .install(Family::V4, "password \"s3cret\";\n", true)
            .expect("install");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "untouched");
        let installed = conf.join(Family::V4.file_name());
        assert_eq!(
            std::fs::read_to_string(&installed).expect("read"),
            "password \"s3cret\";\n"
        );
        let mode = std::fs::metadata(&installed)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        // Nothing but the planted link and the installed file.
        let names: Vec<_> = std::fs::read_dir(&conf)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn a_bird_check_that_hangs_meets_its_deadline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("bird.cfg");
        std::fs::write(&conf, "router id 1.2.3.4;\n").expect("conf");
        // `sleep -p -c FILE` fails at once; a script that ignores its arguments hangs.
        let fake = dir.path().join("bird");
        std::fs::write(&fake, "#!/bin/sh\nexec sleep 30\n").expect("fake");
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let start = std::time::Instant::now();
        // Another test's fork may briefly hold the new script open for writing.
        let mut r = bird_parse_within(&fake, &conf, Duration::from_millis(300));
        for _ in 0..20 {
            if !r.as_ref().is_err_and(|e| e.contains("busy")) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            r = bird_parse_within(&fake, &conf, Duration::from_millis(300));
        }
        // Before: output() waited as long as BIRD did.
        let e = r.expect_err("a hung check is an error");
        assert!(e.contains("did not finish"), "{e}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        // A complaint is returned as BIRD wrote it.
        let complain = dir.path().join("complain");
        std::fs::write(
            &complain,
            "#!/bin/sh\necho 'bird: /x:1:1 syntax error' >&2\nexit 1\n",
        )
        .expect("fake");
        std::fs::set_permissions(&complain, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut r = bird_parse(&complain, &conf);
        for _ in 0..20 {
            if !r.as_ref().is_err_and(|e| e.contains("busy")) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            r = bird_parse(&complain, &conf);
        }
        assert_eq!(r, Err("bird: /x:1:1 syntax error".to_string()));
    }

    #[test]
    fn temporary_files_get_their_final_mode_whatever_the_umask_allows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = write_temp(dir.path(), "x", b"1", 0o640).expect("a");
        let b = write_temp(dir.path(), "x", b"2", 0o644).expect("b");
        assert_ne!(a, b);
        for (p, mode) in [(a, 0o640), (b, 0o644)] {
            let m = std::fs::metadata(&p).expect("meta").permissions().mode();
            assert_eq!(m & 0o777, mode, "{}", p.display());
            assert!(
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(".tmp"))
            );
        }
    }

    /// A fake BIRD on a socket: greets, expects `configure`, answers.
    #[test]
    fn configure_over_a_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("bird.ctl");
        let listener = UnixListener::bind(&sock).expect("bind");
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            s.write_all(b"0001 BIRD 2.0.12 ready.\n").expect("greet");
            let mut line = String::new();
            BufReader::new(s.try_clone().expect("clone"))
                .read_line(&mut line)
                .expect("read");
            assert_eq!(line, "configure\n");
            s.write_all(b"0002-Reading configuration from /etc/bird.cfg\n0003 Reconfigured\n")
                .expect("answer");
        });
        let mut r = SocketReloader {
            v4: sock,
            v6: dir.path().join("absent.ctl"),
            timeout: Duration::from_secs(5),
        };
        r.reload(Family::V4).expect("configured");
        server.join().expect("server");
        // No BIRD6 at all: nothing owed, it reads the file when it starts.
        r.reload(Family::V6)
            .expect("no BIRD6 running is not a failure");
        // A dead BIRD's socket left behind: the same.
        let stale = dir.path().join("stale.ctl");
        drop(UnixListener::bind(&stale).expect("bind"));
        r.v6 = stale;
        r.reload(Family::V6)
            .expect("a dead BIRD's socket is not a failure");
        // A BIRD that is there but does not answer properly is a failure to retry.
        let mute = dir.path().join("mute.ctl");
        let listener = UnixListener::bind(&mute).expect("bind");
        let server = std::thread::spawn(move || drop(listener.accept().expect("accept")));
        r.v6 = mute;
        let err = r.reload(Family::V6).expect_err("no greeting");
        server.join().expect("server");
        assert!(err.contains("mute.ctl"), "{err}");
    }

    #[test]
    fn installer_keeps_the_old_file_when_bird_rejects() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut inst = FileInstaller {
            dir: dir.path().to_path_buf(),
            bird: PathBuf::from("bird"),
        };
        let good = "router id 10.0.0.1;\nprotocol device { }\n";
        inst.install(Family::V4, good, false)
            .expect("bird accepts it");
        let err = inst
            .install(
                Family::V4,
                "router id 10.0.0.1;\nprotocol nonsense { }\n",
                false,
            )
            .expect_err("bird rejects it");
        assert!(err.contains("bird.cfg"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("bird.cfg")).expect("read"),
            good
        );
        // No temporary files left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("bird.cfg")]);
    }
}
