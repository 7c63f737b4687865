//! Running a helper program (nft) with input on stdin: stdin is written while stdout and
//! stderr are read (a program that answers before reading all its input cannot deadlock us
//! on a full pipe), the output kept is bounded, and one deadline covers the whole call.

use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a finished program said.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Why running a program failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("cannot start it: {0}")]
    Spawn(String),
    #[error("it did not finish within {0:?} and was killed")]
    Timeout(Duration),
    #[error("it wrote more than {0} bytes to {1} and was killed")]
    TooMuchOutput(usize, &'static str),
    #[error("waiting for it failed: {0}")]
    Wait(String),
}

/// Runs `cmd` with `input` on stdin; at most `max_output` bytes of stdout and of stderr are
/// accepted, and everything (writing, running, reading) ends within `timeout`.
pub fn run(
    cmd: &mut Command,
    input: &[u8],
    timeout: Duration,
    max_output: usize,
) -> Result<Finished, ExecError> {
    let deadline = Instant::now() + timeout;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ExecError::Spawn(e.to_string()))?;
    // Threads, not the caller, touch the pipes, so none of them can block the deadline.
    let (tx, rx) = mpsc::channel::<(&'static str, Result<Vec<u8>, usize>)>();
    if let Some(mut stdin) = child.stdin.take() {
        let input = input.to_vec();
        std::thread::spawn(move || {
            // A program that exits without reading everything closes the pipe: its exit
            // status (or output) says what went wrong, not this write.
            let _ = stdin.write_all(&input);
        });
    }
    for (name, pipe) in [
        (
            "stdout",
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
        (
            "stderr",
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(p) = pipe {
                let _ = p.take(max_output as u64 + 1).read_to_end(&mut buf);
            }
            let result = if buf.len() > max_output {
                Err(max_output)
            } else {
                Ok(buf)
            };
            let _ = tx.send((name, result));
        });
    }
    drop(tx);
    let kill = |child: &mut std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
    };
    let (mut stdout, mut stderr) = (None, None);
    let mut pause = Duration::from_millis(1);
    let status = loop {
        // Output first: a reader that hit the limit means stop now.
        while let Ok((name, r)) = rx.try_recv() {
            match r {
                Ok(buf) if name == "stdout" => stdout = Some(buf),
                Ok(buf) => stderr = Some(buf),
                Err(max) => {
                    kill(&mut child);
                    return Err(ExecError::TooMuchOutput(max, name));
                }
            }
        }
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(e) => {
                kill(&mut child);
                return Err(ExecError::Wait(e.to_string()));
            }
        }
        let now = Instant::now();
        if now >= deadline {
            kill(&mut child);
            return Err(ExecError::Timeout(timeout));
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    };
    // The program is gone; its output ends once every process holding the pipes is (a
    // child it left running may hold them: the deadline still applies).
    while stdout.is_none() || stderr.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(("stdout", Ok(buf))) => stdout = Some(buf),
            Ok((_, Ok(buf))) => stderr = Some(buf),
            Ok((name, Err(max))) => return Err(ExecError::TooMuchOutput(max, name)),
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(ExecError::Timeout(timeout)),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    Ok(Finished {
        status,
        stdout: stdout.unwrap_or_default(),
        stderr: stderr.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn a_program_that_answers_before_reading_its_input_does_not_deadlock() {
        // Writes 1 MiB to stdout and stderr before reading 8 MiB of stdin: with stdin written
        // first, both sides wait on full pipes forever.
        let input = vec![b'x'; 8 << 20];
        let f = run(
            &mut sh("head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2; wc -c"),
            &input,
            Duration::from_secs(30),
            4 << 20,
        )
        .unwrap();
        assert!(f.status.success());
        assert_eq!(f.stderr.len(), 1 << 20);
        let tail = String::from_utf8_lossy(&f.stdout[1 << 20..])
            .trim()
            .to_string();
        assert_eq!(tail, (8 << 20).to_string());
    }

    #[test]
    fn one_deadline_covers_the_whole_call() {
        let start = Instant::now();
        // Never reads its input, never exits.
        let e = run(
            &mut sh("sleep 30"),
            &vec![b'x'; 4 << 20],
            Duration::from_millis(300),
            1024,
        )
        .unwrap_err();
        assert_eq!(e, ExecError::Timeout(Duration::from_millis(300)));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        // A child left holding the pipes after the program exits.
        let start = Instant::now();
        let e = run(
            &mut sh("sleep 5 & echo started"),
            b"",
            Duration::from_millis(300),
            1024,
        )
        .unwrap_err();
        assert_eq!(e, ExecError::Timeout(Duration::from_millis(300)));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn output_beyond_the_limit_stops_the_program() {
        let e = run(
            &mut sh("cat /dev/zero"),
            b"",
            Duration::from_secs(30),
            1 << 20,
        )
        .unwrap_err();
        assert_eq!(e, ExecError::TooMuchOutput(1 << 20, "stdout"));
    }
}
