//! The unix-socket adapter: connect, read the greeting, send one command at a time and read
//! its whole reply, every wait bounded.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::BirdError;
use crate::protocols::{Protocol, ProtocolDetail};
use crate::reply::{Assembler, Reply};
use crate::status::Status;

/// How long one read may wait (Calico's BIRD timeout).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// A reply larger than this is not one of the small answers margay asks for.
const MAX_REPLY_BYTES: usize = 16 << 20;

/// Calico's socket (`/var/run/calico/bird.ctl`, `bird6.ctl`), else where a packaged BIRD
/// puts it (`/var/run/bird/bird.ctl`) when Calico's does not exist — Calico's own fallback.
pub fn default_socket(ipv6: bool) -> PathBuf {
    let file = if ipv6 { "bird6.ctl" } else { "bird.ctl" };
    let calico = Path::new("/var/run/calico").join(file);
    if calico.exists() {
        return calico;
    }
    let packaged = Path::new("/var/run/bird").join(file);
    if packaged.exists() { packaged } else { calico }
}

/// One connection to BIRD's control socket.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    timeout: Duration,
    /// BIRD's greeting (`BIRD 2.0.12 ready.`).
    greeting: String,
}

impl Client {
    /// Connects and reads BIRD's greeting.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Client, BirdError> {
        let stream = UnixStream::connect(path).map_err(|source| BirdError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(|source| BirdError::Io {
                path: path.to_path_buf(),
                what: "setting timeouts".into(),
                source,
            })?;
        let mut c = Client {
            path: path.to_path_buf(),
            reader: BufReader::new(stream),
            timeout,
            greeting: String::new(),
        };
        let hello = c.read_reply("(greeting)")?;
        if hello.code() != 1 {
            return Err(BirdError::Greeting {
                path: path.to_path_buf(),
                line: hello.final_text().to_string(),
            });
        }
        c.greeting = hello.final_text().to_string();
        Ok(c)
    }

    pub fn greeting(&self) -> &str {
        &self.greeting
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends one command and returns BIRD's whole reply; an 8xxx/9xxx answer is an error.
    pub fn command(&mut self, command: &str) -> Result<Reply, BirdError> {
        self.send(command)?;
        self.read_reply(command)?.ok_for(command)
    }

    /// Like [`Client::command`], but BIRD's error answers are returned as replies.
    pub fn command_raw(&mut self, command: &str) -> Result<Reply, BirdError> {
        self.send(command)?;
        self.read_reply(command)
    }

    fn send(&mut self, command: &str) -> Result<(), BirdError> {
        let stream = self.reader.get_mut();
        stream
            .write_all(format!("{command}\n").as_bytes())
            .map_err(|source| BirdError::Io {
                path: self.path.clone(),
                what: format!("sending {command:?}"),
                source,
            })
    }

    fn read_reply(&mut self, command: &str) -> Result<Reply, BirdError> {
        // Each read waits at most `timeout`; the whole reply at most a few of them.
        let deadline = Instant::now() + self.timeout * 4;
        let mut asm = Assembler::default();
        let mut total = 0usize;
        let mut line = String::new();
        loop {
            if Instant::now() > deadline || total > MAX_REPLY_BYTES {
                return Err(self.timeout_error(command));
            }
            line.clear();
            let n = match (&mut self.reader)
                .take((MAX_REPLY_BYTES - total + 1) as u64)
                .read_line(&mut line)
            {
                Ok(n) => n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(self.timeout_error(command));
                }
                Err(source) => {
                    return Err(BirdError::Io {
                        path: self.path.clone(),
                        what: format!("reading the answer to {command:?}"),
                        source,
                    });
                }
            };
            if n == 0 {
                return Err(BirdError::Closed {
                    path: self.path.clone(),
                    command: command.to_string(),
                });
            }
            total += n;
            let text = line.strip_suffix('\n').unwrap_or(&line);
            if let Some(reply) = asm.push(text)? {
                return Ok(reply);
            }
        }
    }

    fn timeout_error(&self, command: &str) -> BirdError {
        BirdError::Timeout {
            path: self.path.clone(),
            command: command.to_string(),
            timeout: self.timeout,
        }
    }

    /// `show protocols`.
    pub fn show_protocols(&mut self) -> Result<Vec<Protocol>, BirdError> {
        let r = self.command("show protocols")?;
        Protocol::parse_table(&r)
    }

    /// `show protocols all "<name>"`; `None` when BIRD has no such protocol.
    pub fn show_protocol_all(&mut self, name: &str) -> Result<Option<ProtocolDetail>, BirdError> {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(BirdError::BadName(name.to_string()));
        }
        // Quoted, so an unknown name is "8003 No protocols match", not a syntax error.
        let command = format!("show protocols all \"{name}\"");
        let r = self.command_raw(&command)?;
        if r.code() == 8003 {
            return Ok(None);
        }
        ProtocolDetail::parse(&r.ok_for(&command)?)
    }

    /// `show status`.
    pub fn show_status(&mut self) -> Result<Status, BirdError> {
        let r = self.command("show status")?;
        Ok(Status::parse(&r))
    }

    /// `configure`: BIRD re-reads its configuration file.
    pub fn configure(&mut self) -> Result<Reply, BirdError> {
        self.command("configure")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    /// A fake BIRD: greets, then answers each command line with the next canned reply.
    fn fake_bird(dir: &Path, greeting: &'static str, answers: Vec<&'static str>) -> PathBuf {
        let path = dir.join("bird.ctl");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let Ok((mut s, _)) = l.accept() else { return };
            let _ = s.write_all(greeting.as_bytes());
            let mut buf = [0u8; 256];
            for a in answers {
                let mut got = Vec::new();
                while !got.ends_with(b"\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(a.as_bytes());
            }
            // Hold the connection open (a silent BIRD) until the client goes.
            while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
        });
        path
    }

    fn after_greeting(capture: &'static str) -> &'static str {
        capture.split_once('\n').unwrap().1
    }

    #[test]
    fn asks_and_parses_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = fake_bird(
            dir.path(),
            "0001 BIRD 2.0.12 ready.\n",
            vec![
                after_greeting(include_str!("../tests/replies/show_protocols.txt")),
                after_greeting(include_str!(
                    "../tests/replies/show_protocols_all_active.txt"
                )),
                "8003 No protocols match\n",
                after_greeting(include_str!("../tests/replies/show_status.txt")),
            ],
        );
        let mut c = Client::connect(&path, Duration::from_secs(2)).unwrap();
        assert_eq!(c.greeting(), "BIRD 2.0.12 ready.");
        assert_eq!(c.show_protocols().unwrap().len(), 9);
        let d = c.show_protocol_all("Node_172_31_9_77").unwrap().unwrap();
        assert_eq!(d.last_error(), Some("Socket: No route to host"));
        assert!(c.show_protocol_all("Mesh_1_2_3_4").unwrap().is_none());
        assert!(c.show_status().unwrap().up);
        assert!(matches!(
            c.show_protocol_all("x\"; down"),
            Err(BirdError::BadName(_))
        ));
    }

    #[test]
    fn a_silent_bird_times_out_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = fake_bird(dir.path(), "0001 BIRD 2.0.12 ready.\n", vec![]);
        let mut c = Client::connect(&path, Duration::from_millis(200)).unwrap();
        let started = Instant::now();
        let e = c.show_protocols().unwrap_err();
        assert!(matches!(e, BirdError::Timeout { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2));

        let missing = dir.path().join("nothing.ctl");
        let e = Client::connect(&missing, DEFAULT_TIMEOUT)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("nothing.ctl") && e.contains("--bird-socket"),
            "{e}"
        );
    }

    #[test]
    fn something_that_is_not_bird_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = fake_bird(dir.path(), "0013 hello\n", vec![]);
        let e = Client::connect(&path, Duration::from_millis(500)).unwrap_err();
        assert!(matches!(e, BirdError::Greeting { .. }), "{e}");
    }
}
