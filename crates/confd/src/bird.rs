//! The edges that touch BIRD: checking and installing configuration files (`bird -p -c`,
//! temporary file + rename), and asking a running BIRD to reconfigure through its control
//! socket.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
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

/// Runs `bird -p -c <file>`: Ok when BIRD accepts the configuration, else its complaint.
pub fn bird_parse(bird: &Path, file: &Path) -> Result<(), String> {
    let out = Command::new(bird)
        .arg("-p")
        .arg("-c")
        .arg(file)
        .output()
        .map_err(|e| {
            format!(
                "cannot run {} -p -c to check the configuration: {e} (install BIRD 2, or point --bird-binary at it)",
                bird.display()
            )
        })?;
    if out.status.success() {
        return Ok(());
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    Err(text.trim().replace('\n', "; "))
}

impl ConfigSink for FileInstaller {
    fn install(&mut self, family: Family, text: &str, secret: bool) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let target = self.path(family);
        // Same directory, so the rename is atomic; the name ends in .tmp so nothing takes
        // it for a configuration.
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            family.file_name(),
            std::process::id()
        ));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            // A password may be inside: only root and BIRD's group may read it.
            let mode = if secret { 0o640 } else { 0o644 };
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.write_all(text.as_bytes())?;
            f.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("cannot write {}: {e}", tmp.display()));
        }
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
        configure(path, self.timeout)
            .map(|_| ())
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Speaks BIRD's control protocol: a greeting (`0001 …`), then `configure`, then reply lines
/// `NNNN-text` (more follow) or `NNNN text` (last) — codes 0xxx are success (0003
/// "Reconfigured", 0004 "Reconfiguration in progress", 0018/0019/0020 …), 8xxx/9xxx are
/// errors. A continuation line starting with a space belongs to the previous code.
pub fn configure(socket: &Path, timeout: Duration) -> Result<String, String> {
    let stream = UnixStream::connect(socket).map_err(|e| format!("cannot connect: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let greeting = read_reply(&mut reader)?;
    if !greeting.0.starts_with('0') {
        return Err(format!("unexpected greeting: {}", greeting.1));
    }
    (&stream)
        .write_all(b"configure\n")
        .map_err(|e| format!("cannot send configure: {e}"))?;
    let (code, text) = read_reply(&mut reader)?;
    if code.starts_with('0') {
        Ok(text)
    } else {
        Err(format!("BIRD answered {code}: {text}"))
    }
}

/// Reads one complete reply; returns the final line's code and all its text.
fn read_reply(r: &mut impl BufRead) -> Result<(String, String), String> {
    let mut text = Vec::new();
    loop {
        let mut line = String::new();
        let n = r
            .read_line(&mut line)
            .map_err(|e| format!("reading BIRD's reply: {e}"))?;
        if n == 0 {
            return Err("BIRD closed the connection".into());
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if let Some(rest) = line.strip_prefix(' ') {
            text.push(rest.to_string());
            continue;
        }
        let (c, sep, rest) = match (line.get(..4), line.get(4..5), line.get(5..)) {
            (Some(c), Some(s), rest) if c.bytes().all(|b| b.is_ascii_digit()) => {
                (c, s, rest.unwrap_or(""))
            }
            _ => return Err(format!("unexpected line from BIRD: {line:?}")),
        };
        text.push(rest.to_string());
        if sep == " " {
            return Ok((c.to_string(), text.join("\n")));
        }
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
    use std::os::unix::net::UnixListener;

    #[test]
    fn reply_parsing() {
        let mut r = BufReader::new(&b"0001 BIRD 2.0.12 ready.\n"[..]);
        assert_eq!(
            read_reply(&mut r),
            Ok(("0001".into(), "BIRD 2.0.12 ready.".into()))
        );
        let mut r = BufReader::new(&b"0002-Reading configuration from /x\n0003 Reconfigured\n"[..]);
        assert_eq!(read_reply(&mut r).map(|x| x.0), Ok("0003".into()));
        let mut r = BufReader::new(&b"8002 /x:3:1 syntax error\n"[..]);
        assert_eq!(read_reply(&mut r).map(|x| x.0), Ok("8002".into()));
        let mut r = BufReader::new(&b"garbage\n"[..]);
        assert!(read_reply(&mut r).is_err());
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
        let out = configure(&sock, Duration::from_secs(5)).expect("configured");
        assert!(out.contains("Reconfigured"));
        server.join().expect("server");
        assert!(configure(&dir.path().join("absent.ctl"), Duration::from_secs(1)).is_err());
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
