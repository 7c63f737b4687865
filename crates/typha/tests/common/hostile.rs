#![allow(dead_code)]
//! Hostile Typha clients, one kind per finding of issue 17 (shared by `tests/hostile.rs` and
//! `examples/soak.rs`). Each connection is a task that behaves badly until the server closes
//! it or the task is dropped; none of them sends anything but to loopback.

use std::net::SocketAddr;
use std::time::Duration;

use margay_typha::proto::{self, ClientHello, Message, MsgType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostile {
    /// Connects and sends nothing.
    Idle,
    /// Declares a 1 MiB frame before its hello and sends nothing more.
    BigHeader,
    /// Sends a valid hello one byte every 300 ms.
    Trickle,
    /// Sends a valid hello and never reads (a 4 KiB receive buffer).
    NeverReads,
    /// Reads one small chunk every 100 ms: each write call progresses, the snapshot never
    /// completes.
    SlowReader,
    /// Sends 4 KiB of garbage.
    Garbage,
    /// A hello whose hostname holds a newline (a forged log line), then reads normally.
    ForgedHost,
}

impl Hostile {
    pub const ALL: [Hostile; 7] = [
        Hostile::Idle,
        Hostile::BigHeader,
        Hostile::Trickle,
        Hostile::NeverReads,
        Hostile::SlowReader,
        Hostile::Garbage,
        Hostile::ForgedHost,
    ];
}

/// The line a forged hostname tries to inject.
pub const FORGED: &str = "FORGED level=ERROR msg=\"typha compromised\"";

pub fn hello(host: &str) -> Vec<u8> {
    proto::encode(
        &Message::ClientHello(ClientHello {
            min_version: proto::MIN_PROTOCOL_VERSION,
            max_version: proto::PROTOCOL_VERSION,
            hostname: host.into(),
            info: "hostile".into(),
            syncer_type: "felix".into(),
            compression: vec![],
            capabilities: vec![],
        }),
        false,
    )
    .to_vec()
}

/// Reads until the server closes, at most `bound`.
async fn drain(s: &mut TcpStream, chunk: usize, pause: Duration, bound: Duration) {
    let mut buf = vec![0u8; chunk];
    let _ = tokio::time::timeout(bound, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
    })
    .await;
}

/// Runs one hostile connection of `kind` against `addr` for at most `hold`.
pub async fn run(kind: Hostile, addr: SocketAddr, i: usize, hold: Duration) {
    let sock = match TcpSocket::new_v4() {
        Ok(s) => s,
        Err(_) => return,
    };
    if matches!(kind, Hostile::NeverReads | Hostile::SlowReader) {
        let _ = sock.set_recv_buffer_size(4096);
    }
    let Ok(mut s) = sock.connect(addr).await else {
        return;
    };
    let _ = tokio::time::timeout(hold, async {
        match kind {
            Hostile::Idle => drain(&mut s, 64, Duration::ZERO, hold).await,
            Hostile::BigHeader => {
                let mut h = ((1u32 << 20) + 2).to_be_bytes().to_vec();
                h.extend_from_slice(&[MsgType::ClientHello as u8, 0]);
                let _ = s.write_all(&h).await;
                drain(&mut s, 64, Duration::ZERO, hold).await;
            }
            Hostile::Trickle => {
                for b in hello(&format!("trickle-{i}")) {
                    if s.write_all(&[b]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                drain(&mut s, 4096, Duration::ZERO, hold).await;
            }
            Hostile::NeverReads => {
                let _ = s.write_all(&hello(&format!("never-reads-{i}"))).await;
                tokio::time::sleep(hold).await;
            }
            Hostile::SlowReader => {
                let _ = s.write_all(&hello(&format!("slow-reader-{i}"))).await;
                drain(&mut s, 512, Duration::from_millis(100), hold).await;
            }
            Hostile::Garbage => {
                let junk: Vec<u8> = (0..4096u32)
                    .map(|n| (n.wrapping_mul(2_654_435_761) >> 13) as u8)
                    .collect();
                let _ = s.write_all(&junk).await;
                drain(&mut s, 64, Duration::ZERO, hold).await;
            }
            Hostile::ForgedHost => {
                let _ = s.write_all(&hello(&format!("host-{i}\n{FORGED}"))).await;
                drain(&mut s, 4096, Duration::ZERO, hold).await;
            }
        }
    })
    .await;
}
